"""The windows a steering policy decides on: `WindowStats` aggregates one metrics window from the
per-minibatch records the policy observed (`WindowAccumulator`), so it does not depend on how the
trainer aggregates its window record. Classifier features, trajectory pre/post fields, the label
rule and the hand-written rule all read it."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WindowStats:
    """One metrics window, aggregated by the policy itself from the per-minibatch records it
    observed (so it does not depend on how the trainer aggregates its window record)."""

    window: int
    first_step: int
    last_step: int
    minibatches: int
    hit_rate: float  # sum(hits) / sum(remote_rows): the SPEC's %-hits over the window
    t_fetch: float  # mean seconds per minibatch
    fetched_rows: float  # mean per minibatch (misses + replaced rows)
    remote_rows: float  # mean per minibatch
    replaced_rows: float  # total in the window
    stale_slots: int = 0
    buffer_fill: int = 0


class WindowAccumulator:
    """Sums MINIBATCH_FIELDS records until the trainer closes a window."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.n = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.hits = self.remote = self.fetched = self.replaced = 0.0
        self.t_fetch = 0.0

    def add(self, m: dict) -> None:
        self.n += 1
        gs = int(m.get("global_step", self.n - 1))
        self.first_step = gs if self.first_step is None else self.first_step
        self.last_step = gs
        self.remote += float(m.get("remote_rows") or 0)
        self.hits += float(m.get("hits") or 0)
        self.fetched += float(m.get("fetched_rows") or 0)
        self.replaced += float(m.get("replaced_rows") or 0)
        self.t_fetch += float(m.get("t_fetch") or 0)

    def close(self, window: dict, index: int) -> WindowStats:
        if self.n == 0:  # no per-minibatch records seen: fall back on the trainer's aggregate
            mb = max(1, int(window.get("minibatches") or 1))
            stats = WindowStats(
                window=int(window.get("window", index)),
                first_step=int(window.get("first_step", 0)),
                last_step=int(window.get("last_step", 0)),
                minibatches=mb,
                hit_rate=float(window.get("hit_rate") or 0.0),
                t_fetch=float(window.get("t_fetch") or 0.0) / mb,
                fetched_rows=float(window.get("fetched_rows") or 0.0) / mb,
                remote_rows=float(window.get("remote_rows") or 0.0) / mb,
                replaced_rows=float(window.get("replaced_rows") or 0.0),
            )
        else:
            n = self.n
            stats = WindowStats(
                window=int(window.get("window", index)),
                first_step=int(self.first_step or 0),
                last_step=int(self.last_step or 0),
                minibatches=n,
                hit_rate=self.hits / self.remote if self.remote > 0 else 0.0,
                t_fetch=self.t_fetch / n,
                fetched_rows=self.fetched / n,
                remote_rows=self.remote / n,
                replaced_rows=self.replaced,
            )
        stats.stale_slots = int(window.get("stale_slots") or 0)
        stats.buffer_fill = int(window.get("buffer_fill") or 0)
        self._reset()
        return stats


@dataclass
class DecisionPoint:
    """What a decider sees when it is asked: a closed window, or the start of training.

    raw     the trainer's window record (WINDOW_FIELDS; `prev_hit_rate` added when the window
            before it had one); at the start: buffer_state and START_WINDOW
    stats   the same window aggregated from the minibatch records (None at the start)
    prev    the stats of the window before (None for the first)
    recent  the raw windows before it, oldest first (a few: the hit-rate trend)
    """

    raw: dict
    stats: WindowStats | None = None
    prev: WindowStats | None = None
    recent: list[dict] = field(default_factory=list)

    @property
    def index(self) -> int:
        return int(self.raw.get("window", self.stats.window if self.stats else 0))

    @property
    def last_step(self) -> int | None:
        """The window's last global step (-1 at the start)."""
        if self.raw.get("last_step") is not None:
            return int(self.raw["last_step"])
        return self.stats.last_step if self.stats is not None else None
