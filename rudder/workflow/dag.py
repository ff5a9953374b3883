"""The study as a Parsl DAG, watched until every run has settled.

    stage_dataset(d)                       once per dataset
      partition_graph(d, M)                once per (dataset, machines, partition method, ...)
        train_block(run)                   every run that is not already complete
          collect_metrics(run)             as each run settles, one at a time (single writer)
    report                                 after the last collect

Resume: a run is keyed by its config hash (the run id ends with it). A run whose run.json says
complete with that hash is skipped (its directory is collected again, idempotently); a failed
or half-finished one runs again. A run that fails (after Parsl's retries) is recorded and the
study goes on: a run only depends on its own partition, never on another run.

collect is submitted by the watch loop as runs settle, each collect depending on the previous
one, so the DuckDB file has one writer at a time whatever executor collects (the in-process
single thread locally, the endpoint through Globus Compute).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rudder.workflow.execution import COLLECTOR, ExecutionConfig
from rudder.workflow.study import PlannedRun, Study
from rudder.workflow.tasks import is_complete, read_run_json

log = logging.getLogger("rudder.workflow")

STATES = ("pending", "queued", "running", "done", "skipped", "failed")


@dataclass
class RunState:
    run: PlannedRun
    status: str = "pending"  # one of STATES
    reason: str = ""
    wall_s: float | None = None
    future: Any = None
    settled_at: float | None = None
    collected: bool | None = None  # None: not yet; False: collect failed
    attempts: int = 0

    @property
    def settled(self) -> bool:
        return self.status in ("done", "skipped", "failed")


def settled(fut: cf.Future) -> cf.Future:
    """A future that completes (with None) when `fut` completes, success or failure: a
    dependency that must wait for a task but not fail with it."""
    out: cf.Future = cf.Future()
    fut.add_done_callback(lambda _f: out.done() or out.set_result(None))
    return out


def short_reason(exc: BaseException) -> str:
    """One line for the summary from whatever Parsl raised (RunFailed, DependencyError, ...)."""
    from rudder.workflow.tasks import RunFailed

    if isinstance(exc, RunFailed):
        return exc.reason
    name = type(exc).__name__
    text = str(exc).strip().splitlines()
    msg = text[-1] if text else ""
    if name == "DependencyError":
        deps = getattr(exc, "dependent_exceptions_tids", None) or []
        first = deps[0][0] if deps else None
        inner = short_reason(first) if isinstance(first, BaseException) else msg
        return f"dependency failed: {inner}"
    return f"{name}: {msg}" if msg else name


class StudyDAG:
    """Builds and watches one study. `runs_dir` is where run directories go (the study's runs
    are under runs_dir/<study>), `db` the DuckDB file, `report_dir` the report folder."""

    def __init__(self, study: Study, ex: ExecutionConfig, runs_dir: str | Path, db: str | Path,
                 report_dir: str | Path | None, cwd: str | Path | None = None,
                 remote: bool = False, rerun: bool = False):
        self.study = study
        self.ex = ex
        self.runs_dir = Path(runs_dir)
        self.db = str(db)
        self.report_dir = str(report_dir) if report_dir else None
        self.cwd = Path(cwd or os.getcwd())
        self.remote = remote  # run directories are not visible from here (Globus Compute)
        self.rerun = rerun  # run complete runs again (the train task would skip them otherwise)
        # one agent model server per node for the block, recorded here; handed to each run in
        # its launch (local launches only: Slurm machines each start their own)
        self.agent_node_dir = (None if remote or ex.launch.type != "local" else
                               str(self._abs(self.runs_dir / study.name / "agent-node")))
        self.states = [RunState(r) for r in study.runs]
        self.started_at = time.time()
        self.stage_futs: dict[tuple, Any] = {}
        self.part_futs: dict[tuple, Any] = {}
        self.collect_chain: cf.Future | None = None
        self.collect_futs: list[Any] = []
        self.report_fut: Any = None
        self.report_error: str | None = None
        if not remote and not rerun:
            self._scan_complete()

    # -- planning -----------------------------------------------------------------------------

    def _scan_complete(self) -> None:
        for st in self.states:
            run_dir = self._abs(st.run.run_dir(self.runs_dir))
            if is_complete(run_dir, st.run.config_hash):
                info = read_run_json(run_dir)
                st.status, st.wall_s = "skipped", info.get("wall_s")
                st.reason = "complete in an earlier study run"

    def _abs(self, p: str | Path) -> Path:
        p = Path(p)
        return p if p.is_absolute() or self.remote else self.cwd / p

    @property
    def to_run(self) -> list[RunState]:
        return [s for s in self.states if s.status != "skipped"]

    def stages(self) -> dict[tuple, list[RunState]]:
        out: dict[tuple, list[RunState]] = {}
        for s in self.to_run:
            out.setdefault(s.run.stage_key, []).append(s)
        return out

    def partitions(self) -> dict[tuple, list[RunState]]:
        out: dict[tuple, list[RunState]] = {}
        for s in self.to_run:
            out.setdefault(s.run.part_key, []).append(s)
        return out

    def describe(self, execution_source: str = "") -> str:
        """The DAG as text (--dry-run)."""
        ex = self.ex
        skipped = [s for s in self.states if s.status == "skipped"]
        lines = [f"study {self.study.name} ({self.study.source}): {len(self.states)} runs, "
                 f"{len(self.to_run)} to run, {len(skipped)} complete (skipped)"]
        if execution_source:
            lines.append(f"execution {execution_source}: retries {ex.retries}, "
                         f"launch {ex.launch.type}")
        for label, m in ex.executors.items():
            lines.append(f"  executor {label}: {_describe_executor(m)}")
        if any(ex.route(a) == COLLECTOR for a in ("collect", "report")):
            lines.append(f"  executor {COLLECTOR}: in-process, 1 thread (the DuckDB writer)")
        r = {a: ex.route(a) for a in ("stage", "partition", "train", "collect", "report")}
        parts = self.partitions()
        for skey, sruns in self.stages().items():
            lines.append(f"stage_dataset {skey[0]} (root {skey[1]}) [{r['stage']}]")
            for pkey, pruns in parts.items():
                if pkey[:2] != skey:
                    continue
                lines.append(f"  partition_graph {pkey[0]} into {pkey[2]} ({pkey[3]}"
                             f"{', balance_train' if pkey[4] else ''}"
                             f"{', balance_edges' if pkey[5] else ''}"
                             f"{'' if pkey[6] == 'float32' else ', ' + pkey[6]}) [{r['partition']}]")
                for s in pruns:
                    lines.append(f"    train_block {s.run.run_id}  ({s.run.label()}) "
                                 f"[{r['train']}{self._spec_text(s.run)}]")
        for s in skipped:
            lines.append(f"skip {s.run.run_id}: complete")
        lines.append(f"collect_metrics after each run, one at a time [{r['collect']}] -> {self.db}")
        if self.report_dir:
            lines.append(f"report after the last collect [{r['report']}] -> {self.report_dir}")
        return "\n".join(lines)

    def _spec_text(self, run: PlannedRun) -> str:
        spec = self._resource_spec(run)
        return f", {spec['num_nodes']} node(s)" if spec.get("num_nodes") else ""

    def _resource_spec(self, run: PlannedRun) -> dict:
        return self._nodes_spec("train", run.config.cluster.machines)

    def _nodes_spec(self, app: str, nodes: int) -> dict:
        """MPI executors (and MPI endpoints) give each task whole nodes and require a spec:
        a run gets one node per machine, stage and partition one node. Through a templated
        endpoint the spec also carries the app's user endpoint config."""
        spec = {"num_nodes": nodes, "ranks_per_node": 1, "num_ranks": nodes} \
            if self.ex.is_mpi(self.ex.route(app)) else {}
        uec = self.ex.user_endpoint_config(app)  # a Globus Compute endpoint's template values
        return {**spec, "user_endpoint_config": uec} if uec else spec

    # -- submission ---------------------------------------------------------------------------

    def submit(self, apps) -> None:
        """Submits stage, partition and train apps (Parsl resolves their dependencies)."""
        launch = self.ex.launch.model_dump()
        if self.agent_node_dir:
            launch["agent_node_dir"] = self.agent_node_dir
        root = lambda r: r if self.remote else str(self._abs(r))  # noqa: E731
        for skey in self.stages():
            name, r = skey
            self.stage_futs[skey] = apps.stage(name, root(r), parsl_resource_specification=
                                               self._nodes_spec("stage", 1))
        for pkey in self.partitions():
            name, r, parts, method, bt, be, dtype = pkey
            self.part_futs[pkey] = apps.partition(
                name, parts, method, bt, be, root(r), feature_dtype=dtype,
                inputs=[self.stage_futs[(name, r)]],
                parsl_resource_specification=self._nodes_spec("partition", 1))
        for st in self.to_run:
            run = st.run
            cfg = run.config.model_dump(mode="json")
            if not self.remote:  # run dirs under this process's cwd, whatever the worker's cwd
                cfg["runs_dir"] = str(self._abs(cfg["runs_dir"]))
            timeout = run.config.cluster.run_timeout_s + self.ex.run_timeout_margin_s
            st.future = apps.train(cfg, run.run_id, run.study, launch=launch, timeout_s=timeout,
                                   cwd=None if self.remote else str(self.cwd), rerun=self.rerun,
                                   inputs=[self.part_futs[run.part_key]],
                                   parsl_resource_specification=self._resource_spec(run))

    # -- watching -----------------------------------------------------------------------------

    def _collect(self, apps, st: RunState) -> None:
        run_dir = st.run.run_dir(self.runs_dir)
        deps = [self.collect_chain] if self.collect_chain is not None else []
        fut = apps.collect(str(self._abs(run_dir)), self.db, inputs=deps,
                           parsl_resource_specification=self._nodes_spec("collect", 1))
        fut._rudder_state = st  # type: ignore[attr-defined]
        self.collect_futs.append(fut)
        self.collect_chain = settled(fut)

    def _settle(self, st: RunState) -> None:
        fut = st.future
        exc = fut.exception()
        st.settled_at = time.time()
        rec = getattr(fut, "task_record", None) or {}
        st.attempts = 1 + int(rec.get("fail_count", 0) or 0)
        if exc is None:
            res = fut.result() or {}
            st.status = "skipped" if res.get("skipped") else "done"
            st.wall_s = res.get("wall_s")
            if res.get("skipped"):
                st.reason = "complete in an earlier study run"
        else:
            st.status, st.reason = "failed", short_reason(exc)
            if not self.remote:
                st.wall_s = read_run_json(self._abs(st.run.run_dir(self.runs_dir))).get("wall_s")

    def _refresh_running(self) -> None:
        """Which unsettled runs are executing: their run.json (here) or Parsl's task state."""
        for st in self.states:
            if st.settled or st.future is None:
                continue
            state = ""
            rec = getattr(st.future, "task_record", None)
            if rec is not None:
                state = getattr(rec.get("status"), "name", "")
            if state in ("launched", "running", "running_ended"):
                st.status = "queued"
                if self.remote:
                    continue
                info = read_run_json(self._abs(st.run.run_dir(self.runs_dir)))
                if info.get("status") in ("preparing", "running") and \
                        info.get("updated_at", 0) >= self.started_at:
                    st.status = "running"
            elif state in ("pending", "unsched", "fail_retryable"):
                st.status = "pending"

    def watch(self, apps, view: Callable[["StudyDAG", str], None] | None = None,
              poll_s: float = 0.5) -> None:
        """Waits for every run, collecting each as it settles; then the report."""
        notify = view or (lambda dag, event: None)
        for st in self.states:  # complete from an earlier study run: collect again (idempotent)
            if st.status == "skipped":
                self._collect(apps, st)
        notify(self, "start")
        while True:
            waiting = [st.future for st in self.states if not st.settled and st.future is not None]
            pending_collects = [f for f in self.collect_futs if not f.done()]
            if not waiting and not pending_collects:
                break
            done, _ = cf.wait(waiting + pending_collects, timeout=poll_s,
                              return_when=cf.FIRST_COMPLETED)
            for st in self.states:
                if not st.settled and st.future is not None and st.future.done():
                    self._settle(st)
                    self._collect(apps, st)
                    notify(self, f"{st.status} {st.run.run_id}"
                           + (f": {st.reason}" if st.status == "failed" else ""))
            for f in list(self.collect_futs):
                if f.done() and getattr(f, "_rudder_seen", False) is False:
                    f._rudder_seen = True  # type: ignore[attr-defined]
                    st = f._rudder_state  # type: ignore[attr-defined]
                    exc = f.exception()
                    if exc is not None:
                        st.collected = False
                        log.warning("collect %s failed: %s", st.run.run_id, short_reason(exc))
                    else:  # None: nothing to collect (the run never started)
                        st.collected = True if (f.result() or {}).get("collected") else None
            self._refresh_running()
            notify(self, "tick")
        if self.report_dir:
            deps = [self.collect_chain] if self.collect_chain is not None else []
            self.report_fut = apps.report(self.db, self.report_dir, self.study.name, inputs=deps,
                                          parsl_resource_specification=self._nodes_spec("report", 1))
            try:
                self.report_fut.result()
            except Exception as exc:  # the runs are safe; only the report is missing
                self.report_error = short_reason(exc)
                log.warning("report failed: %s", self.report_error)
        notify(self, "end")

    # -- results ------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in STATES}
        for st in self.states:
            out[st.status] += 1
        return out

    @property
    def ok(self) -> bool:
        return all(st.status in ("done", "skipped") for st in self.states) and \
            all(st.collected is not False for st in self.states) and self.report_error is None

    def summary(self) -> list[dict]:
        return [{"run_id": st.run.run_id, **{k: st.run.point[k] for k in st.run.point},
                 "status": st.status, "wall_s": st.wall_s, "reason": st.reason,
                 "collected": st.collected, "config_hash": st.run.config_hash}
                for st in self.states]

    def write_summary(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"study": self.study.name, "source": self.study.source,
                "started_at": self.started_at, "ended_at": time.time(),
                "counts": self.counts(), "db": self.db, "report_dir": self.report_dir,
                "report_error": self.report_error, "runs": self.summary()}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, path)
        return path


def _describe_executor(m) -> str:
    t = m.type
    if t in ("HighThroughputExecutor", "MPIExecutor"):
        p = m.provider
        extra = ""
        if p.type == "SlurmProvider":
            extra = (f" (constraint {p.constraint}, qos {p.qos}, {p.nodes_per_block} node(s)/block,"
                     f" max {p.max_blocks} block(s), walltime {p.walltime})")
        drain = f", drain {m.drain_period} s" if m.drain_period else ""
        return f"{t} + {p.type}{extra}, {m.max_workers} worker(s){drain}"
    if t == "ThreadPoolExecutor":
        return f"{t}, {m.max_threads} thread(s)"
    return f"{t} endpoint {m.endpoint_id}{' (MPI)' if m.mpi else ''}"
