"""What the user sees while a study runs: a live panel (rich) of pending / queued / running /
done / skipped / failed runs on a terminal, one log line per event otherwise, and a summary
table at the end. Each running run shows its progress, read from its record files as they are
written (rudder.workflow.progress): epoch and minibatch, %-hits, fetched rows against the `none`
run of the same dataset and machine count so far, the agent's answers; without a terminal that
line is logged every `progress_every_s` seconds while it changes."""
from __future__ import annotations

import time
from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rudder.workflow.dag import STATES, RunState, StudyDAG
from rudder.workflow.progress import RunProgress

STYLE = {"pending": "dim", "queued": "cyan", "running": "bold cyan", "done": "green",
         "skipped": "green dim", "failed": "bold red"}


def _fmt_s(x) -> str:
    return "-" if x is None else f"{float(x):.1f}"


class StudyView:
    """Callable as the DAG's `view(dag, event)`; use as a context manager around the watch."""

    def __init__(self, console: Console | None = None, live: bool | None = None,
                 progress_every_s: float = 10.0):
        self.console = console or Console()
        self.live_mode = self.console.is_terminal if live is None else live
        self.events: deque[str] = deque(maxlen=6)
        self._live: Live | None = None
        self._t0 = time.time()
        self.progress_every_s = progress_every_s
        self.progress: dict[str, RunProgress] = {}  # run id -> counters read so far
        self._printed: dict[str, tuple[float, str]] = {}  # run id -> (when, last line logged)

    def __enter__(self) -> "StudyView":
        if self.live_mode:
            self._live = Live(Text("starting..."), console=self.console, refresh_per_second=4,
                              transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def __call__(self, dag: StudyDAG, event: str) -> None:
        self._poll(dag)
        if not self.live_mode and event == "tick":
            self._log_progress(dag)
        if event not in ("tick", "start", "end"):
            stamp = time.strftime("%H:%M:%S")
            self.events.append(f"{stamp} {event}")
            if not self.live_mode:
                c = dag.counts()
                self.console.print(f"{stamp} {event}  [{self._counts_text(c)}]",
                                   highlight=False, markup=False)
        if self._live is not None:
            self._live.update(self.render(dag))

    # -- progress ----------------------------------------------------------------------------

    def _poll(self, dag: StudyDAG) -> None:
        """Reads what running runs appended (and a run's last lines when it settles)."""
        if dag.remote:  # run directories live on the endpoint's filesystem
            return
        for st in dag.states:
            rid = st.run.run_id
            if st.status == "running" or (st.settled and rid in self.progress):
                p = self.progress.get(rid)
                if p is None:
                    p = self.progress[rid] = RunProgress(dag._abs(st.run.run_dir(dag.runs_dir)))
                p.poll()

    def none_rows(self, dag: StudyDAG, st: RunState) -> float | None:
        """Fetched rows per minibatch of the `none` run at the same grid point, so far."""
        key = _baseline_key(st)
        for other in dag.states:
            if other.run.point.get("policy") == "none" and _baseline_key(other) == key:
                p = self.progress.get(other.run.run_id)
                if p is not None and p.fetched_per_minibatch:
                    return p.fetched_per_minibatch
        return None

    def progress_line(self, dag: StudyDAG, st: RunState) -> str:
        p = self.progress.get(st.run.run_id)
        if p is None:
            return ""
        base = None if st.run.point.get("policy") == "none" else self.none_rows(dag, st)
        return p.line(base)

    def _log_progress(self, dag: StudyDAG) -> None:
        now = time.time()
        for st in dag.states:
            if st.status != "running" or st.run.run_id not in self.progress:
                continue
            rid = st.run.run_id
            when, last = self._printed.get(rid, (0.0, ""))
            line = self.progress_line(dag, st)
            if now - when >= self.progress_every_s and line != last:
                self._printed[rid] = (now, line)
                self.console.print(f"{time.strftime('%H:%M:%S')} running {st.run.label()}: "
                                   f"{line}", highlight=False, markup=False)

    @staticmethod
    def _counts_text(c: dict[str, int]) -> str:
        return " ".join(f"{k} {c[k]}" for k in STATES if c[k])

    def render(self, dag: StudyDAG):
        c = dag.counts()
        total = len(dag.states)
        settled = c["done"] + c["skipped"] + c["failed"]
        elapsed = time.time() - self._t0
        head = Text(f"study {dag.study.name}: {settled}/{total} settled in {elapsed:.0f} s  ")
        for k in STATES:
            if c[k]:
                head.append(f"{k} {c[k]}  ", style=STYLE[k])
        table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        table.add_column("run")
        table.add_column("status")
        table.add_column("progress", overflow="fold")
        active = [s for s in dag.states if s.status in ("running", "queued")][:8]
        for s in active:
            table.add_row(s.run.label(), Text(s.status, style=STYLE[s.status]),
                          self.progress_line(dag, s))
        parts = [head]
        if active:
            parts.append(table)
        if self.events:
            parts.append(Text("\n".join(self.events), style="dim"))
        return Group(*parts)


def summary_table(dag: StudyDAG) -> Table:
    t = Table(title=f"study {dag.study.name}", show_lines=False)
    for col, kw in [("run id", {}), ("dataset", {}), ("M", {"justify": "right"}),
                    ("T", {"justify": "right"}), ("policy", {}), ("rep", {"justify": "right"}),
                    ("status", {}), ("wall s", {"justify": "right"}), ("collected", {}),
                    ("reason", {"overflow": "fold"})]:
        t.add_column(col, **kw)
    for s in dag.states:
        p = s.run.point
        t.add_row(s.run.run_id, str(p["dataset"]), str(p["machines"]), str(p["trainers"]),
                  str(p["policy"]), str(p["repeat"]), Text(s.status, style=STYLE[s.status]),
                  _fmt_s(s.wall_s), {True: "yes", False: "FAILED", None: "-"}[s.collected],
                  s.reason[:200])
    return t


def _baseline_key(st: RunState) -> tuple:
    """The grid point without the policy: the `none` run to compare with."""
    return tuple(sorted((k, str(v)) for k, v in st.run.point.items() if k != "policy"))
