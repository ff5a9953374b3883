"""MetricsCollector: per-minibatch records and window aggregates. Always measured (the
reference hid hit rate behind an off-by-default flag, so its agent saw 0 and always evicted)."""
from __future__ import annotations

from typing import Callable

import torch

from rudder.records import WindowRecord, hit_rate  # noqa: F401 (hit_rate: re-exported)


class MetricsCollector:
    """Collects minibatch records; every `window` minibatches closes a window aggregate."""

    SUMS = ("remote_rows", "hits", "fetched_rows", "replaced_rows", "t_fetch", "t_stall")

    def __init__(self, window: int):
        self.window = window
        self.index = 0
        self._open: list[dict] = []

    def add(self, record: dict, buffer_state: Callable[[], dict] | None = None) -> dict | None:
        """Adds one minibatch record; returns the window record when this one closes it.
        `buffer_state` is called only then: it scans the sampled-ahead minibatches, which is
        too dear to do on every minibatch."""
        self._open.append(record)
        if len(self._open) < self.window:
            return None
        return self.close(buffer_state() if buffer_state is not None else None)

    def close(self, buffer_state: dict | None = None) -> dict | None:
        if not self._open:
            return None
        recs, self._open = self._open, []
        s = {k: sum(float(r.get(k, 0) or 0) for r in recs) for k in self.SUMS}
        t_mb = [r.get("t_sample", 0) + r.get("t_fetch", 0) + r.get("t_compute", 0) for r in recs]
        w = WindowRecord(
            window=self.index,
            first_step=recs[0]["global_step"],
            last_step=recs[-1]["global_step"],
            minibatches=len(recs),
            hit_rate=hit_rate(s["hits"], s["remote_rows"]),
            remote_rows=int(s["remote_rows"]),
            fetched_rows=int(s["fetched_rows"]),
            replaced_rows=int(s["replaced_rows"]),
            t_fetch=s["t_fetch"] / len(recs),
            t_stall=s["t_stall"] / len(recs),
            t_minibatch=sum(t_mb) / len(recs),
            **(buffer_state or {}),  # buffer_fill, stale_slots, lookahead_missing/rows
        )
        self.index += 1
        return w.to_dict()


def buffer_state(buf, future: list[torch.Tensor], roll: bool = False) -> dict:
    """Window fields from the buffer: fill, stale slots, and what the known future lacks
    (`lookahead_missing` halo nodes of the `lookahead_minibatches` sampled ahead not buffered;
    `lookahead_rows`: how many of them one round could admit, at most the capacity; these are
    extra network rows only under admit=any, while an admit=misses round takes them from rows
    the minibatch pulls anyway and adds none).
    roll (at a window's close, once per window): also the window's missed node set against the
    window before's (`HaloBuffer.roll_misses`: missed_nodes, missed_again, missed_union), and
    the next window's set starts empty."""
    if buf is None:
        return {}
    missing = buf.window_missing(future)
    out = {"buffer_fill": buf.size, "stale_slots": buf.stale_count(),
           # what an evict=half round at the next minibatch may take: slots stale at half the
           # period after that minibatch's decay, if not hit in it (rudder.prefetch.policy.
           # EVICT_PERIODS). Counted at the close (period/2 - 1) since a round applies after one
           # more decay: at a cold start's first window close (5 minibatches, period 10) no slot
           # is below (1-alpha)^5 yet, but every one not hit since the fill is when the round runs
           "stale_half": buf.stale_count(0.5 * buf.period - 1),
           "lookahead_missing": missing, "lookahead_rows": min(missing, buf.capacity)}
    if future:  # over how many minibatches; absent where nothing is sampled ahead (lookahead off)
        out["lookahead_minibatches"] = len(future)
    if roll:
        out.update(buf.roll_misses())
    return out
