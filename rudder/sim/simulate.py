"""Replays a remote-access trace against a policy, without training or a cluster.

Buffer policies (every name in the training registry: none, static, fixed, lookahead, agent,
classifier:<name>, ...) run through the very code training runs:
`rudder.prefetch.policies.make_policy` for the policy, `HaloBuffer` and
`begin_step`/`finish_step` for the mechanism, `MetricsCollector` for windows, with StepInfo,
records and windows built as `rudder.pipeline.MinibatchPipeline` builds them (lookahead within
the epoch, remaining_steps, buffer state at window close). Classic caches (lru, lfu, s3fifo,
sieve) run through `rudder.sim.caches`, the hindsight optimum (belady) through
`rudder.sim.oracle`. All of them replay through the one loop of `rudder.sim.replay` (each
behind its Replayer adapter).

Policy names take their knobs after colons, in the order each policy declares them
(`Policy.knobs`); a comma list is a grid:
  fixed[:PERIOD[:ALPHA[:EVICT]]]  fixed:10,25,50
  rule[:LOOKAHEAD:BUDGET:ADMIT:WINDOW]
  lookahead[:DEPTH[:BUDGET[:ADMIT]]]  lookahead:1,3:0.01,0.05:misses,any
                                  (DEPTH `epoch`: prefetch.schedule_ahead, what the loader sampled)
  classifier:NAME                 agent   none   static   lru   lfu   s3fifo   sieve   belady

Results are per-minibatch records with the MINIBATCH_FIELDS of training (timings 0, loss null,
plus `admitted_rows` as FetchStats), epoch and window records, the policy's decision records,
and a summary; `write_sim_run` puts them in a run directory marked `"simulated": true`, which
the results store ingests into the same tables as real runs.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rudder.config import sample_ahead, schedules_ahead
from rudder.records import (EpochTotals, JsonlWriter, MinibatchRecord, StepStats, host_info, read_json_object,
                            read_run, versions, write_json_atomic)
from rudder.sim.caches import CACHES, make_cache
from rudder.sim.replay import (COUNT_FIELDS, BeladyReplayer, BufferReplayer, CacheReplayer,  # noqa: F401
                               NoBufferReplayer, PositionBuffer, PositionTrace, position_ids, replay)
from rudder.trace import Trace, find_traces

log = logging.getLogger(__name__)

ORACLES = ("belady",)
DEFAULT_WINDOW = 10  # PrefetchConfig.window's default: windows of the non-buffer replays


def buffer_policies() -> list[str]:
    """Every policy of the training registry runs through the buffer (none included)."""
    from rudder.prefetch.policies import REGISTRY

    return list(REGISTRY)


def policy_names() -> list[str]:
    return [*buffer_policies(), *sorted(CACHES), *ORACLES]


# ---- policy specs -------------------------------------------------------------------------
def expand_grid(spec: str) -> list[str]:
    """A comma list of policies, each colon field of which may be a comma list (a grid):
    'static,fixed:10,25,lru' -> ['static', 'fixed:10', 'fixed:25', 'lru'];
    'lookahead:1,3:0.05' -> ['lookahead:1:0.05', 'lookahead:3:0.05']. A comma item that starts
    with a policy name starts a new policy; any other continues the previous one's field."""
    names = set(policy_names())
    groups: list[str] = []
    for tok in spec.split(","):
        if not groups or tok.split(":", 1)[0] in names:
            groups.append(tok)
        else:
            groups[-1] += "," + tok
    out = []
    for g in groups:
        fields = [f.split(",") for f in g.split(":")]
        out += [":".join(combo) for combo in itertools.product(*fields)]
    return out


@dataclass
class PolicySpec:
    spec: str  # as given, e.g. "fixed:25"
    base: str  # none | static | fixed | ... | lru | belady
    prefetch: Any = None  # PrefetchConfig for buffer policies
    extra: dict = field(default_factory=dict)  # make_policy kwargs

    @property
    def slug(self) -> str:
        return self.spec.replace(":", "_").replace(",", "-").replace("/", "-")


def parse_policy(spec: str, prefetch=None) -> PolicySpec:
    """`prefetch`: the PrefetchConfig the knobs start from (a source run's, or the defaults)."""
    from rudder.config import PrefetchConfig

    base, *args = spec.split(":")
    valid = policy_names()
    if base not in valid:
        raise ValueError(f"unknown policy {spec!r}; valid: {', '.join(valid)}")
    if base not in buffer_policies():
        if args:
            raise ValueError(f"policy {base!r} takes no arguments (got {spec!r})")
        return PolicySpec(spec, base)
    from pydantic import ValidationError

    from rudder.prefetch.policies import policy_class

    cls = policy_class(base)  # each policy declares its knobs (and whether it takes a name)
    usage = base + (":NAME" if cls.named else "") + "".join(f"[:{k.upper()}" for k in cls.knobs) + "]" * len(cls.knobs)
    upd: dict[str, Any] = {"policy": base}
    if cls.named:
        if not args or not args[0]:
            raise ValueError(f"bad policy {spec!r}: use {usage}")
        upd["policy"], args = f"{base}:{args[0]}", args[1:]
    if len(args) > len(cls.knobs):
        raise ValueError(f"bad policy {spec!r}: use {usage}" if cls.knobs or cls.named else
                         f"policy {base!r} takes no arguments (got {spec!r})")
    upd.update(zip(cls.knobs, args))
    if upd.get("lookahead") == "epoch":  # the whole epoch scheduled ahead (prefetch.schedule_ahead)
        del upd["lookahead"]
        upd["schedule_ahead"] = True
    pc = (prefetch or PrefetchConfig()).model_copy()
    try:
        pc = PrefetchConfig.model_validate({**pc.model_dump(), **upd})  # validates the knobs
    except ValidationError as exc:
        bad = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"bad policy {spec!r} (use {usage}): {bad}") from None
    return PolicySpec(spec, base, pc)


# ---- results ------------------------------------------------------------------------------


@dataclass
class SimResult:
    policy: str
    rank: int
    trace: Trace
    capacity: int
    initial_fill_rows: int
    counts: dict[str, np.ndarray]  # COUNT_FIELDS -> [S] int64
    seconds: float  # replay time (what throughput is measured on)
    windows: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    # with a time model (rudder.sim.timemodel): per-minibatch t_fetch, t_compute, t_stall, t_start
    timing: dict[str, np.ndarray] | None = None

    def total(self, key: str) -> int:
        return int(self.counts[key].sum())

    @property
    def accesses_per_s(self) -> float:
        return self.trace.num_accesses / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> dict:
        remote = self.total("remote_rows")
        hits, fetched = self.total("hits"), self.total("fetched_rows")
        return {
            "policy": self.policy, "rank": self.rank, "capacity": self.capacity,
            "halo_nodes": self.trace.num_halo, "minibatches": self.trace.num_minibatches,
            "remote_rows": remote, "hits": hits, "hit_rate": hits / remote if remote else 0.0,
            "misses": self.total("misses"), "replaced_rows": self.total("replaced_rows"),
            "admitted_rows": self.total("admitted_rows"), "fetched_rows": fetched,
            "fetched_frac": fetched / remote if remote else 0.0,  # of `none`'s rows
            "initial_fill_rows": self.initial_fill_rows,
            "decisions": len(self.decisions),
            "seconds": self.seconds, "accesses_per_s": self.accesses_per_s,
            **({} if self.timing is None else {  # the time model's run time (rudder.sim.timemodel)
                "time_s": float((self.timing["t_compute"] + self.timing["t_stall"]).sum()),
                "stall_s": float(self.timing["t_stall"].sum())}),
            **self.extra,
        }

    def records(self) -> list[dict]:
        """Minibatch records (MINIBATCH_FIELDS + admitted_rows), as training writes them."""
        return [r.to_dict() for r in self._records()]

    def _records(self) -> list[MinibatchRecord]:
        t = self.trace
        c = {k: v.tolist() for k, v in self.counts.items()}
        inp = t.input_rows.tolist()
        epochs, steps = t.epoch.tolist(), t.steps().tolist()
        if self.timing is None:
            return [MinibatchRecord.of_step(epochs[g], steps[g], g, StepStats.of_counts(
                        inp[g], c["hits"][g], c["misses"][g], c["replaced_rows"][g],
                        c["admitted_rows"][g], t.feat_bytes))
                    for g in range(t.num_minibatches)]
        tm = {k: v.tolist() for k, v in self.timing.items()}
        out = []
        for g in range(t.num_minibatches):
            stats = StepStats.of_counts(inp[g], c["hits"][g], c["misses"][g], c["replaced_rows"][g],
                                        c["admitted_rows"][g], t.feat_bytes)
            stats.t_fetch = tm["t_fetch"][g]
            out.append(MinibatchRecord.of_step(epochs[g], steps[g], g, stats, t_compute=tm["t_compute"][g],
                                               t_stall=tm["t_stall"][g]))
        return out

    def epoch_records(self) -> list[dict]:
        """The epoch totals of the minibatch records (timings 0; loss and accuracy unknown)."""
        totals: dict[int, EpochTotals] = {}
        for r in self._records():
            totals.setdefault(r.epoch, EpochTotals()).add(r)
        return [tot.record(e, t_epoch=0.0 if self.timing is None else tot.sums["t_compute"] + tot.sums["t_stall"],
                           initial_fill_rows=self.initial_fill_rows if i == 0 else 0).to_dict()
                for i, (e, tot) in enumerate(sorted(totals.items()))]


def _post_hoc_windows(result: SimResult, window: int) -> list[dict]:
    from rudder.prefetch.metrics import MetricsCollector

    col = MetricsCollector(window)
    return [w for rec in result.records() if (w := col.add(rec)) is not None]


# ---- context ------------------------------------------------------------------------------
def run_context(trace: Trace, prefetch, capacity: int, rank: int = 0, source: dict | None = None):
    """The RunContext a policy sees: the training run's own (context-r<R>.json) when the trace
    came from one, else what the trace and its metadata tell."""
    from rudder.prefetch.policy import RunContext

    source = source or {}
    saved = source.get("context") or {}
    cfg = source.get("config") or {}
    train = cfg.get("train", {})
    S = trace.num_minibatches
    epochs = int(np.unique(trace.epoch).size) if S else 0
    steps = int(np.bincount(trace.epoch - trace.epoch.min()).max()) if S else 0
    graph = source.get("graph", {})
    base = dict(
        rank=rank, num_trainers=int(graph.get("num_trainers", trace.num_parts)), part_id=trace.part_id,
        num_parts=trace.num_parts, num_nodes=int(graph.get("num_nodes", 0)),
        partition_nodes=int(graph.get("partition_nodes", 0)), halo_nodes=trace.num_halo,
        capacity=capacity, batch_size=int(train.get("batch_size", graph.get("batch_size", 0))),
        fanouts=list(train.get("fanouts", graph.get("fanouts", []))), steps_per_epoch=steps,
        epochs=epochs, feat_dim=trace.feat_bytes // 4, feat_bytes=trace.feat_bytes,
        window=prefetch.window, lookahead=prefetch.lookahead, run_dir=None,
        schedule_ahead=schedules_ahead(prefetch),
        extra={"dataset": cfg.get("dataset", {}).get("name", graph.get("dataset"))},
    )
    for k in ("num_trainers", "num_nodes", "partition_nodes", "batch_size", "fanouts", "feat_dim", "extra"):
        if k in saved and saved[k] is not None:
            base[k] = saved[k]
    return RunContext(**base)


# ---- the replay ---------------------------------------------------------------------------
def simulate(
    trace: Trace,
    policy: str | PolicySpec,
    *,
    capacity: int | None = None,
    start: str = "init",
    rank: int = 0,
    source: dict | None = None,
    extra: dict | None = None,
    agent_sync: bool = True,
    agent_wait_s: float = 60.0,
    verify: bool = False,
    time_model=None,
) -> SimResult:
    """Replays `trace` under `policy`. capacity: default the trace's; start: the trace's initial
    fill (`init`, as the run started; with a smaller capacity its first C ids) or `empty`.
    agent_sync: after each window closes, wait (up to agent_wait_s) for an asynchronous policy's
    answer, so it applies at the next minibatch as a zero-latency agent's would (a replay runs
    far faster than training; without waiting every answer would arrive after the trace ends).
    verify: check the mechanism's invariants after every minibatch (tests).
    time_model: a rudder.sim.timemodel.TimeModel: records carry the modelled t_fetch, t_compute
    and t_stall (a buffer policy's windows too, as it runs), the summary time_s and stall_s."""
    spec = policy if isinstance(policy, PolicySpec) else parse_policy(policy, _source_prefetch(source))
    if extra:
        spec.extra = {**spec.extra, **extra}
    C = trace.capacity if capacity is None else int(capacity)
    # a buffer whose universe is every remote id may hold more than the halo (up to its index's
    # max_nodes, which the buffer checks); every other policy's universe is the halo
    remote = spec.base in buffer_policies() and getattr(spec.prefetch, "universe", "halo") == "remote"
    if C < 0 or (C > trace.num_halo and not remote):
        raise ValueError(f"capacity {C} must be in [0, {trace.num_halo}] (the halo size; beyond it "
                         "only a buffer policy with prefetch.universe: remote)")
    if start not in ("init", "empty"):
        raise ValueError(f"unknown start {start!r}; valid: init, empty")
    init = trace.init_positions()[:C] if start == "init" else np.zeros(0, dtype=np.int64)
    if spec.base in buffer_policies():
        res = _simulate_buffer(trace, spec, C, init, rank, source, agent_sync, agent_wait_s, verify, time_model)
    elif spec.base in CACHES:
        res = _simulate_cache(trace, spec, C, init, rank, verify)
    else:
        res = _simulate_belady(trace, spec, C, start, rank)
    if time_model is not None:
        res.timing = time_model.times(res.counts["fetched_rows"])
        if res.windows and spec.base not in buffer_policies():  # post-hoc windows: with the times
            res.windows = _post_hoc_windows(res, DEFAULT_WINDOW)
    return res


def _source_prefetch(source: dict | None):
    from rudder.config import PrefetchConfig

    pf = ((source or {}).get("config") or {}).get("prefetch")
    if not pf:
        return None
    try:
        return PrefetchConfig.model_validate(pf)
    except Exception:  # a config from another version: start from defaults
        return None


def _simulate_buffer(trace, spec, C, init, rank, source, agent_sync, agent_wait_s, verify,
                     time_model=None) -> SimResult:
    from rudder.prefetch.policies import make_policy

    from rudder.config import universe_max_nodes

    pc = spec.prefetch
    pol = make_policy(pc, **spec.extra)
    pt = PositionTrace(trace, pc.universe, start_depth=pc.lookahead)
    if not pol.uses_buffer:  # plain DistDGL: every remote row pulled every time
        t0 = time.perf_counter()
        counts = replay(pt, NoBufferReplayer())
        res = SimResult(spec.spec, rank, trace, 0, 0, counts, time.perf_counter() - t0)
        if time_model is not None:
            res.timing = time_model.times(counts["fetched_rows"])
        res.windows = _post_hoc_windows(res, pc.window)
        return res
    # The replay runs in halo-position space (PositionTrace); the buffer, scores and
    # replacement rules are HaloBuffer's own, planned as the training pipeline plans them.
    wait = (lambda p: _wait_for_answer(p, agent_wait_s)) if agent_sync else None
    rp = BufferReplayer(pt, pol, C, alpha=pc.alpha, period=pc.period, depth=sample_ahead(pc),
                        window=pc.window, verify=verify, wait_for_answer=wait,
                        max_nodes=universe_max_nodes(pc, trace.num_halo, C))
    rp.fill(init)
    if time_model is not None:
        rp.clock = time_model.clock()
    pol.setup(run_context(trace, pc, C, rank, source))
    t0 = time.perf_counter()
    counts = replay(pt, rp)
    seconds = time.perf_counter() - t0 - rp.waited
    pol.close()  # (a trailing partial window is not closed: training does not close it either)
    res = SimResult(spec.spec, rank, trace, C, rp.initial_fill, counts, seconds, rp.windows,
                    [*rp.decisions, *pol.decisions()])
    # the same memory as a share of each universe (halo; every remote id the trace holds)
    res.extra.update(universe=pc.universe, capacity_frac_halo=C / max(trace.num_halo, 1),
                     capacity_frac_remote=C / max(int(trace.remote_nodes().size), 1))
    if pc.universe == "remote":
        res.extra.update(universe_max_nodes=rp.buf.index.max_nodes, universe_held=len(rp.buf.index))
    if rp.waited:
        res.extra["agent_wait_s"] = rp.waited
    if hasattr(pol, "pass_at_1"):
        res.extra["pass_at_1"] = pol.pass_at_1
    return res


def _wait_for_answer(pol, timeout_s: float) -> float:
    """Blocks until an asynchronous policy (AgentPolicy) has an answer queued for plan();
    returns the seconds waited (not replay time)."""
    wait = getattr(pol, "wait_for_decision", None)
    t0 = time.perf_counter()
    if wait is not None:
        wait(timeout_s)
    return time.perf_counter() - t0


def _simulate_cache(trace, spec, C, init, rank, verify) -> SimResult:
    rp = CacheReplayer(make_cache(spec.base, C, trace.num_halo), verify)
    rp.fill(init)
    pt = PositionTrace(trace)
    t0 = time.perf_counter()
    counts = replay(pt, rp)
    res = SimResult(spec.spec, rank, trace, C, rp.initial_fill, counts, time.perf_counter() - t0)
    res.extra["evictions"] = rp.cache.evictions
    res.windows = _post_hoc_windows(res, DEFAULT_WINDOW)
    return res


def _simulate_belady(trace, spec, C, start, rank) -> SimResult:
    pt = PositionTrace(trace)
    t0 = time.perf_counter()
    rp = BeladyReplayer(trace, C, start)  # the optimum is computed here, over the whole trace
    rp.fill(np.zeros(0, dtype=np.int64))
    counts = replay(pt, rp)
    res = SimResult(spec.spec, rank, trace, C, rp.initial_fill, counts, time.perf_counter() - t0)
    res.windows = _post_hoc_windows(res, DEFAULT_WINDOW)
    return res


# ---- sources and run directories ----------------------------------------------------------
def load_source(path: str | Path) -> tuple[dict[int, Trace], dict]:
    """A run directory (every trace-r<R>.npz in it) or one trace file. The dict holds what the
    directory tells: run.json's config and run_id, each rank's context-r<R>.json, tracegen's
    graph facts."""
    path = Path(path)
    if path.is_dir():
        paths = find_traces(path)
        if not paths:
            raise FileNotFoundError(f"no trace-r<R>.npz in {path} (was record_trace off?)")
        run_dir = path
    elif path.exists():
        stem = path.name
        rank = int(stem[len("trace-r") : -len(".npz")]) if stem.startswith("trace-r") and stem[7:-4].isdigit() else 0
        paths = {rank: path}
        run_dir = path.parent
    else:
        raise FileNotFoundError(f"no trace or run directory at {path}")
    source: dict[str, Any] = {"path": str(path.resolve()), "name": (run_dir if path.is_dir() else path).name}
    if (run_dir / "run.json").exists():
        meta = read_run(run_dir)
        source["config"] = meta.get("config") or {}
        source["run_id"] = meta.get("run_id") or run_dir.name
        source["graph"] = meta.get("graph") or {}
        source["name"] = source["run_id"] if path.is_dir() else source["name"]
    gen_path = run_dir / "trace.json"  # rudder tracegen's facts
    if gen_path.exists() and "graph" not in source:
        gen = read_json_object(gen_path)
        source["graph"] = gen.get("graph") or {}
        source["tracegen"] = gen.get("spec") or {}
    traces = {}
    for rank, p in paths.items():
        traces[rank] = Trace.load(p)
        ctx_path = run_dir / f"context-r{rank}.json"
        if ctx_path.exists():
            source.setdefault("contexts", {})[rank] = read_json_object(ctx_path)
    return traces, source


def rank_source(source: dict, rank: int) -> dict:
    s = dict(source)
    s["context"] = (source.get("contexts") or {}).get(rank)
    return s


def sim_run_id(source: dict, spec: str, capacity: int | None = None, start: str = "init") -> str:
    name = str(source.get("name", "trace")).removesuffix(".npz")
    slug = spec.replace(":", "_").replace(",", "-")
    tail = (f"-c{capacity}" if capacity is not None else "") + ("-empty" if start == "empty" else "")
    return f"sim-{name}-{slug}{tail}"


def write_sim_run(
    runs_dir: str | Path, results: list[SimResult], source: dict, *, run_id: str | None = None,
    study: str | None = None, start: str = "init", capacity: int | None = None,
) -> Path:
    """One policy's results (one per rank) as a run directory the results store ingests:
    run.json (simulated: true; the source's config with this policy), minibatches/epochs/
    windows/decisions-r<R>.jsonl. Rewriting the same run id replaces its files."""
    import rudder
    from rudder.config import RunConfig

    assert results, "nothing to write"
    spec = parse_policy(results[0].policy, _source_prefetch(source))
    if run_id is None:
        run_id = sim_run_id(source, spec.spec, capacity, start)
        if _replayed_elsewhere(Path(runs_dir) / run_id, source):  # another trace of the same name
            run_id += "-" + hashlib.sha256(str(source.get("path")).encode()).hexdigest()[:6]
    run_dir = Path(runs_dir) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("*-r*.jsonl"):
        old.unlink()
    cfg = dict(source.get("config") or {}) or RunConfig().model_dump(mode="json")
    cfg = json.loads(json.dumps(cfg))  # deep copy
    pf = cfg.setdefault("prefetch", {})
    if spec.prefetch is not None:
        pf.update(spec.prefetch.model_dump(mode="json"))
    pf["policy"] = spec.prefetch.policy if spec.prefetch is not None else spec.base
    r0 = results[0]
    if r0.trace.num_halo:
        pf["prefetch_fraction"] = r0.capacity / r0.trace.num_halo
    pf["init"] = pf.get("init", "degree") if start == "init" else "empty"
    if source.get("graph", {}).get("dataset"):
        cfg.setdefault("dataset", {})["name"] = source["graph"]["dataset"]
    for res in results:
        R = res.rank
        with _writer(run_dir / f"minibatches-r{R}.jsonl") as w:
            for rec in res.records():
                w.write(rec)
        with _writer(run_dir / f"epochs-r{R}.jsonl") as w:
            for rec in res.epoch_records():
                w.write(rec)
        with _writer(run_dir / f"windows-r{R}.jsonl") as w:
            for rec in res.windows:
                w.write(rec)
        if res.decisions:
            with _writer(run_dir / f"decisions-r{R}.jsonl") as w:
                for rec in res.decisions:
                    w.write(rec)
    now = time.time()
    meta = {
        "run_id": run_id, "study": study, "status": "complete", "reason": None, "simulated": True,
        "config": cfg, "started_at": now, "ended_at": now,
        "wall_s": sum(r.seconds for r in results),
        "versions": {"rudder": getattr(rudder, "__version__", "?"), **versions()}, "host": host_info(),
        "sim": {
            "policy": spec.spec, "source": source.get("path"), "source_run_id": source.get("run_id"),
            "start": start, "capacity": capacity,
            "summary": {str(r.rank): r.summary() for r in results},
        },
    }
    write_json_atomic(run_dir / "run.json", meta)
    return run_dir


def _replayed_elsewhere(run_dir: Path, source: dict) -> bool:
    """Whether run_dir holds the replay of another source (a trace of the same name in another
    folder, another run's trace-r0.npz), which a rewrite would silently replace."""
    try:
        prior = (read_run(run_dir, missing_ok=True).get("sim") or {}).get("source")
    except ValueError:  # a damaged run.json: nothing there worth keeping apart
        return False
    return prior is not None and prior != source.get("path")


class _writer:
    def __init__(self, path: Path):
        self.w = JsonlWriter(path)

    def __enter__(self) -> JsonlWriter:
        return self.w

    def __exit__(self, *exc) -> None:
        self.w.close()

