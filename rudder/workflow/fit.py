"""Does the study fit where it is sent? Checked when the study is loaded, before anything is
submitted (a wrong walltime or block size otherwise shows as runs killed by Slurm, or as tasks
waiting forever for nodes, hours later):

- runs per block: on an MPI executor every run takes `machines` whole nodes of a block, so the
  largest run must fit nodes_per_block; where the study's own NodeGate does not admit the runs
  (a Globus Compute endpoint: `gated=False`) `max_workers` runs go at once, so max(machines) x
  max_workers must fit (Parsl's backlog would otherwise drop results: rudder.workflow.gate);
- walltime: a block takes runs until its drain period and must then still have time for the
  longest run (cluster.run_timeout_s, which counts from launch and so includes start-up, plus
  run_timeout_margin_s for the run's process): drain_period + that <= walltime. Unset, the
  drain period is set to walltime minus the longest run;
- the debug QOS allows 30 minutes;
- stage and partition (CPU work: METIS, feature I/O) never run on GPU blocks.

`fit_study(ex, study, gated)` returns the execution with drain periods filled, or raises ConfigError
naming the numbers.
"""
from __future__ import annotations

from rudder.config import ConfigError
from rudder.workflow.execution import ExecutionConfig, HtexModel, MpiModel, SlurmProviderModel

MIN_DRAIN_S = 60  # a block must take runs for at least this long to be of any use
QOS_MAX_S = {"debug": 30 * 60}  # NERSC: debug jobs run at most 30 minutes
CPU_APPS = ("stage", "partition")


def walltime_s(text: str) -> int:
    """Slurm's [D-]HH:MM:SS in seconds."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    h, m, s = (int(x) for x in text.split(":"))
    return days * 86400 + h * 3600 + m * 60 + s


def _is_gpu(provider) -> bool:
    return isinstance(provider, SlurmProviderModel) and bool(
        provider.gpus_per_node or "gpu" in (provider.constraint or "")
        or "gpu" in provider.scheduler_options)


def fit_study(ex: ExecutionConfig, study, gated: bool = False) -> ExecutionConfig:
    """The execution with each Slurm pool's drain_period set; ConfigError if the study cannot
    fit (see the module docstring)."""
    where = "execution.executors"
    runs = study.runs
    errors: list[str] = []
    for app in CPU_APPS:
        label = ex.route(app)
        m = ex.executors.get(label)
        if m is not None and _is_gpu(getattr(m, "provider", None)):
            errors.append(f"apps.{app} -> {label}: GPU nodes would idle while it runs on the "
                          "CPU; route it to a CPU executor (a `constraint: cpu` or shared-QOS "
                          "SlurmProvider, or a ThreadPoolExecutor in the study process)")
    train = ex.route("train")
    executors = dict(ex.executors)
    for label, m in ex.executors.items():
        if not isinstance(m, (HtexModel, MpiModel)) or \
                not isinstance(m.provider, SlurmProviderModel):
            continue
        p = m.provider
        wall = walltime_s(p.walltime)
        if p.qos in QOS_MAX_S and wall > QOS_MAX_S[p.qos]:
            errors.append(f"{where}.{label}.provider: qos {p.qos} allows at most "
                          f"{QOS_MAX_S[p.qos] // 60} min, walltime is {p.walltime}")
        if label != train:
            continue
        longest = max(runs, key=lambda r: r.config.cluster.run_timeout_s)
        need = longest.config.cluster.run_timeout_s + ex.run_timeout_margin_s
        drain = m.drain_period if m.drain_period is not None else int(wall - need)
        if drain < MIN_DRAIN_S or drain + need > wall:
            errors.append(
                f"{where}.{label}.provider.walltime {p.walltime} ({wall} s) is too short: a run "
                f"started at the drain period ({drain} s) needs up to {need:.0f} s "
                f"(cluster.run_timeout_s {longest.config.cluster.run_timeout_s:g} of "
                f"{longest.run_id} + run_timeout_margin_s {ex.run_timeout_margin_s:g}); "
                f"raise walltime to at least {_hms(need + max(MIN_DRAIN_S, m.drain_period or 0))}"
                " or lower cluster.run_timeout_s")
        elif m.drain_period is None:
            executors[label] = m.model_copy(update={"drain_period": drain})
        if isinstance(m, MpiModel):
            biggest = max(r.config.cluster.machines for r in runs)
            if biggest * (1 if gated else m.max_workers) > p.nodes_per_block:
                fits = p.nodes_per_block // biggest
                errors.append(
                    f"{where}.{label}: the largest run takes {biggest} node(s) and max_workers "
                    f"{m.max_workers} lets that many run at once: {biggest} x {m.max_workers} = "
                    f"{biggest * m.max_workers} nodes > provider.nodes_per_block "
                    f"{p.nodes_per_block}; set max_workers <= {fits} or nodes_per_block >= "
                    f"{biggest * m.max_workers}" if fits else
                    f"{where}.{label}: the largest run takes {biggest} node(s) > "
                    f"provider.nodes_per_block {p.nodes_per_block}")
    if errors:
        raise ConfigError(f"study {study.name} does not fit its execution:\n  "
                          + "\n  ".join(errors))
    return ex.model_copy(update={"executors": executors})


def _hms(seconds: float) -> str:
    s = int(seconds + 59) // 60 * 60  # whole minutes, rounded up
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:00"
