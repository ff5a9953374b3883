"""ProgressWatchdog: ends a run whose trainers stopped writing minibatch records.

A process that dies is caught at once by its supervisor; one that hangs is not: a SIGSTOPped
server, a link taken down inside a namespace or a deadlocked peer leave every process alive and
silent, and only `run_timeout_s` (30 min by default) would end the run, naming no culprit. The
watchdog reads how far each trainer got from its own record file (minibatches-r<R>.jsonl, one
flushed line per minibatch) and, when a trainer is silent for longer than its bound, gives the
reason that ends the run: which trainers are silent and, from /proc, the state of every process
of the cluster that is not plainly running (stopped 'T', blocked in which kernel function), and
any machine link that is not up.

The bound per trainer (seconds without a new record):
  before its first record  `first_s` (DGL connect, partition mapping, an agent's model load)
  afterwards              max(floor_s, factor x the median wall time per minibatch measured so far)
                          plus, after the last minibatch of an epoch, steps_per_epoch x that
                          median (the validation pass writes no minibatch records)
`timeout_s` > 0 fixes the bound between records to that many seconds (before the first record
the bound is the larger of it and `first_s`); 0 turns the watchdog off.

The cluster calls `check(statuses)` from its watch loop (about every 0.2 s; the watchdog reads
files at most once per `poll_s`); LocalCluster does not know what a record is.
"""
from __future__ import annotations

import json
import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("rudder.cluster")

FLOOR_S = 60.0  # no healthy minibatch loop is silent for a minute; catches a hang within ~1 min
FACTOR = 10.0  # x the median minibatch: a slow minibatch (GC, a busy host) is not a hang
FIRST_S = 180.0  # trainer start -> first record (DGL connect ~6-60 s on a busy 2-core host)
POLL_S = 1.0
INTERVALS_KEPT = 200

STATE_NAMES = {"R": "running", "S": "sleeping", "D": "in uninterruptible wait", "T": "stopped",
               "t": "stopped by a tracer", "Z": "zombie", "X": "dead", "I": "idle"}


def process_state(pid: int | None) -> dict | None:
    """{'state': 'T', 'wchan': 'do_signal_stop'} from /proc, or None when the process is gone."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state = stat[stat.rindex(")") + 2:].split()[0]  # the name (field 2) may hold spaces
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        wchan = ""
    return {"state": state, "wchan": "" if wchan == "0" else wchan}


def describe_state(st: dict | None) -> str:
    if st is None:
        return "gone"
    name = STATE_NAMES.get(st["state"], st["state"])
    if st["state"] in ("S", "D") and st["wchan"]:
        return f"{name} in {st['wchan']}"
    return f"{name} ({st['state']})"


def link_state(ifname: str) -> str:
    """operstate of a host interface ("up", "down", "lowerlayerdown", ... or "gone"). The host
    side of a machine's veth goes down with its peer inside the namespace."""
    try:
        return Path(f"/sys/class/net/{ifname}/operstate").read_text().strip()
    except OSError:
        return "gone"


@dataclass
class _Rank:
    path: Path
    started: float  # when the watchdog first saw the trainer running
    size: int = 0
    last_change: float = 0.0
    records: int = 0
    last: dict = field(default_factory=dict)  # the newest record (epoch, step)
    intervals: deque = field(default_factory=lambda: deque(maxlen=INTERVALS_KEPT))
    tail: bytes = b""  # an unfinished line (a record being written)


class ProgressWatchdog:
    def __init__(self, run_dir: str | Path, timeout_s: float | None = None,
                 floor_s: float = FLOOR_S, factor: float = FACTOR, first_s: float = FIRST_S,
                 poll_s: float = POLL_S, local: bool = True, links=None):
        if timeout_s is not None and timeout_s < 0:
            raise ValueError(f"progress timeout must be >= 0 (0 = off), got {timeout_s}")
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self.floor_s, self.factor, self.first_s, self.poll_s = floor_s, factor, first_s, poll_s
        self.local = local  # the processes run on this host: /proc describes them
        self.links = links  # {label: host-side interface} of the machines' links, checked too
        self._ranks: dict[int, _Rank] = {}
        self._steps: dict[int, int] = {}  # steps per epoch, from context-r<R>.json
        self._next = 0.0
        self._broken = False

    @property
    def enabled(self) -> bool:
        return self.timeout_s != 0

    # -- measuring -------------------------------------------------------------------------------

    def _update(self, rank: int, r: _Rank, now: float) -> None:
        try:
            size = r.path.stat().st_size
        except OSError:
            return
        if size <= r.size:
            return
        with open(r.path, "rb") as f:
            f.seek(r.size)
            new = r.tail + f.read(size - r.size)
        lines = new.split(b"\n")
        r.tail = lines.pop()  # b"" after a complete line
        if lines:
            try:
                r.last = json.loads(lines[-1])
            except ValueError:
                pass
            if r.records:  # the first record's interval holds the start-up: not a minibatch
                r.intervals.extend([(now - r.last_change) / len(lines)] * min(len(lines), 50))
            r.records += len(lines)
            r.last_change = now
        r.size = size

    def median_s(self, rank: int) -> float | None:
        r = self._ranks.get(rank)
        return statistics.median(r.intervals) if r and r.intervals else None

    def bound_s(self, rank: int) -> float:
        """Seconds trainer `rank` may stay silent now."""
        r = self._ranks[rank]
        if not r.records:  # start-up (imports, DGL connect, model load) is not a minibatch
            return max(self.first_s, self.timeout_s or 0.0)
        if self.timeout_s:
            return float(self.timeout_s)
        med = self.median_s(rank) or 0.0
        bound = max(self.floor_s, self.factor * med)
        steps = self._steps_per_epoch(rank)
        if steps and r.last.get("step") == steps - 1:  # validation (and the run's end) follow
            bound += steps * med
        return bound

    def _steps_per_epoch(self, rank: int) -> int | None:
        if rank not in self._steps:
            try:
                ctx = json.loads((self.run_dir / f"context-r{rank}.json").read_text())
                self._steps[rank] = int(ctx["steps_per_epoch"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
        return self._steps[rank]

    # -- the check -------------------------------------------------------------------------------

    def check(self, statuses: list[dict | None], now: float | None = None) -> str:
        """'' while every running trainer makes progress; else the reason to end the run.
        Never raises: a watchdog bug must not end (or hang) a healthy run."""
        if not self.enabled:
            return ""
        try:
            return self._check(statuses, now)
        except Exception as exc:  # noqa: BLE001 (logged, the run goes on under run_timeout_s)
            if not self._broken:
                log.exception("progress watchdog failed (%s); run_timeout_s still applies", exc)
                self._broken = True
            return ""

    def _check(self, statuses: list[dict | None], now: float | None) -> str:
        now = time.monotonic() if now is None else now
        if now < self._next:
            return ""
        self._next = now + self.poll_s
        procs = [p for s in statuses if s for p in s.get("procs", [])]
        silent = []
        for p in procs:
            if p.get("role") != "trainer" or p.get("rank") is None or not p.get("pid"):
                continue
            rank = int(p["rank"])
            r = self._ranks.get(rank)
            if r is None:
                r = self._ranks[rank] = _Rank(self.run_dir / f"minibatches-r{rank}.jsonl",
                                              started=now, last_change=now)
            if p.get("returncode") is not None:
                continue  # finished (or failed: the supervisor reports that)
            self._update(rank, r, now)
            quiet = now - r.last_change
            if quiet > self.bound_s(rank):
                silent.append((p, quiet))
        if not silent:
            return ""
        return self.reason(silent, procs)

    def reason(self, silent: list[tuple[dict, float]], procs: list[dict]) -> str:
        quiet = max(q for _, q in silent)
        rank0 = int(silent[0][0]["rank"])
        med = self.median_s(rank0)
        if not self._ranks[rank0].records:
            how = f"bound {self.bound_s(rank0):g} s before the first minibatch"
        elif self.timeout_s:
            how = f"bound {self.timeout_s:g} s"
        else:
            steps = self._steps_per_epoch(rank0)
            val = steps and med and self._ranks[rank0].last.get("step") == steps - 1
            per = f"median minibatch {med:.3f} s" if med else "no minibatch time measured yet"
            how = (f"bound {self.bound_s(rank0):.0f} s: max({self.floor_s:g} s, {self.factor:g} x "
                   f"{per})" + (f" + {steps} x it for validation" if val else ""))
        parts = []
        for p, _ in silent:
            r = self._ranks[int(p["rank"])]
            where = (f"after epoch {r.last.get('epoch')} step {r.last.get('step')}"
                     if r.records else "before its first minibatch")
            parts.append(f"{p['label']} (pid {p['pid']}, {self._state(p)}, {where})")
        text = f"no progress for {quiet:.0f} s ({how}): silent {'; '.join(parts)}"
        odd = [f"{p['label']} (pid {p['pid']}, {self._state(p)})" for p in procs
               if p.get("pid") and p.get("returncode") is None and p not in [s for s, _ in silent]
               and self._odd(p)]
        if odd:
            text += f"; not running: {'; '.join(odd)}"
        down = [f"{label} ({ifname} {state})" for label, ifname in (self.links or {}).items()
                if (state := link_state(ifname)) != "up"]
        if down:
            text += f"; links not up: {'; '.join(down)}"
        return text

    def _state(self, p: dict) -> str:
        return describe_state(process_state(p["pid"])) if self.local else "state unknown (remote)"

    def _odd(self, p: dict) -> bool:
        """A process worth naming: stopped, in uninterruptible wait, a zombie or gone."""
        if not self.local:
            return False
        st = process_state(p["pid"])
        return st is None or st["state"] in ("T", "t", "D", "Z", "X")
