"""Live progress of the runs of a study, read from their record files as they are written.

A trainer appends one JSON line per minibatch (`minibatches-r<R>.jsonl`) and per decision
(`decisions-r<R>.jsonl`), flushed per line; `RunProgress.poll()` reads only what was appended
since its last call (a byte offset per file; a torn last line waits for its end), so polling
twice a second costs a few small reads. Nothing here imports torch, dgl or duckdb.

    p = RunProgress(run_dir)
    p.poll()
    p.epoch, p.minibatches, p.hit_rate, p.fetched_per_minibatch, p.decisions
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

_RANK = re.compile(r"-r(\d+)\.jsonl$")


@dataclass
class _Tail:
    """Appended complete lines of one JSONL file since the last read."""

    path: Path
    offset: int = 0

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


@dataclass
class RunProgress:
    """Counters of one run so far, over all its ranks."""

    run_dir: Path
    epoch: int = 0  # highest epoch seen (0-based)
    step: int = 0  # highest step within that epoch seen (0-based)
    minibatches: int = 0  # minibatch records, all ranks
    ranks: int = 0
    remote_rows: int = 0
    hits: int = 0
    fetched_rows: int = 0
    decisions: int = 0  # decision records (answers, fallbacks included)
    answered: int = 0  # decisions that were the model's own answer (not a fallback)
    last_reason: str = ""
    _tails: dict[str, _Tail] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.remote_rows if self.remote_rows else None

    @property
    def fetched_per_minibatch(self) -> float | None:
        return self.fetched_rows / self.minibatches if self.minibatches else None

    def poll(self) -> bool:
        """Reads what was appended; True when anything new arrived."""
        if not self.run_dir.is_dir():
            return False
        new = False
        ranks = set()
        for path in sorted(self.run_dir.glob("minibatches-r*.jsonl")) + \
                sorted(self.run_dir.glob("decisions-r*.jsonl")):
            m = _RANK.search(path.name)
            if m and path.name.startswith("minibatches"):
                ranks.add(int(m.group(1)))
            tail = self._tails.setdefault(path.name, _Tail(path))
            recs = tail.read()
            if not recs:
                continue
            new = True
            if path.name.startswith("minibatches"):
                self._add_minibatches(recs)
            else:
                self._add_decisions(recs)
        self.ranks = max(self.ranks, len(ranks))
        return new

    def _add_minibatches(self, recs: list[dict]) -> None:
        for r in recs:
            self.minibatches += 1
            self.remote_rows += int(r.get("remote_rows") or 0)
            self.hits += int(r.get("hits") or 0)
            self.fetched_rows += int(r.get("fetched_rows") or 0)
            e, s = int(r.get("epoch") or 0), int(r.get("step") or 0)
            if (e, s) > (self.epoch, self.step):
                self.epoch, self.step = e, s

    def _add_decisions(self, recs: list[dict]) -> None:
        for r in recs:
            self.decisions += 1
            if not r.get("fallback"):
                self.answered += 1
                if r.get("reason"):
                    self.last_reason = str(r["reason"])

    def line(self, none_per_minibatch: float | None = None) -> str:
        """One line for a person: where the run is, its hits, rows vs `none` so far."""
        if not self.minibatches:
            return "starting (no minibatch yet)"
        parts = [f"epoch {self.epoch + 1} minibatch {self.step + 1}",
                 f"{self.minibatches} minibatches on {self.ranks} rank(s)"]
        hr = self.hit_rate
        parts.append("hits -" if hr is None else f"hits {100 * hr:.0f}%")
        per = self.fetched_per_minibatch
        if none_per_minibatch and per is not None:
            parts.append(f"rows {per / none_per_minibatch:.2f}x none")
        elif per is not None:
            parts.append(f"{per:,.0f} rows/minibatch")
        if self.decisions:
            parts.append(f"agent {self.answered} answer(s), {self.decisions - self.answered} "
                         "fallback(s)" + (f", last: {self.last_reason!r}" if self.last_reason
                                          else ""))
        return ", ".join(parts)
