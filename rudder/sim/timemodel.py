"""A time model for replays: what a minibatch's rows cost on a link whose rate may change
during the run (cluster.bandwidth_schedule), so a replay measures time, not only rows.

Per minibatch g, at the model's clock t (seconds since the first minibatch, plus `t0_s`, the
schedule's clock at that moment; a live run's schedule counts from the launch of its machines):

    fetch_g = fetched_rows_g x row_bytes x 8 / rate(t) + latency_s      (rate: the schedule's)
    step_g  = max(compute_s, fetch_g)      stall_g = step_g - compute_s
    t      += step_g

The max is the training pipeline's overlap (rudder.pipeline): the loader pulls minibatch g+1's
rows while g computes, so a pull costs time only beyond the compute it hides behind. Rows pulled
ahead of use (`admit: any`) are therefore free while the link has slack (fetch < compute) and
cost time when it is saturated; pulled ahead of a drop in rate, they save misses later.

`TimedBranches` judges a window by that measure: from one replayer's state (the run's buffer
when the window closes, and the clock then), keep / replace (lookahead rounds admitting only
the minibatch's misses) / admit-any (lookahead rounds admitting any node of the sampled-ahead
window) are each replayed over the next `horizon` windows, and the fastest is right
(`time_label`: None when the two fastest lie within TIME_MARGIN of each other).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from rudder.bandwidth import check_schedule, rate_at
from rudder.prefetch.policy import Policy, Replace, StepInfo

TIME_MARGIN = 0.005  # a branch faster by less than 0.5% of the horizon's time: too close to call
BRANCHES = ("keep", "replace", "any")


@dataclass
class TimeModel:
    compute_s: float  # seconds of compute per minibatch (a live run's median t_compute)
    row_bytes: int  # bytes per feature row (the trace's feat_bytes)
    schedule: list | None = None  # cluster.bandwidth_schedule: [[t_s, rate], ...]
    bandwidth: str | None = None  # cluster.bandwidth: the rate before the first entry; None = unshaped
    latency_s: float = 0.0  # per pull (one pull per minibatch)
    t0_s: float = 0.0  # the schedule's clock at the first minibatch

    def __post_init__(self) -> None:
        if not self.compute_s >= 0 or self.row_bytes <= 0 or not self.latency_s >= 0:
            raise ValueError(f"time model: compute_s {self.compute_s!r} and latency_s {self.latency_s!r} "
                             f"must be >= 0 and row_bytes {self.row_bytes!r} > 0")
        self.schedule = check_schedule(self.schedule) if self.schedule else None
        self._times = [e[0] for e in self.schedule or []]

    @classmethod
    def from_config(cls, cfg, compute_s: float, row_bytes: int, **kw) -> "TimeModel":
        """From a RunConfig (or its dict): the cluster's bandwidth and schedule."""
        c = cfg.get("cluster", {}) if isinstance(cfg, dict) else cfg.cluster.model_dump()
        return cls(compute_s, row_bytes, c.get("bandwidth_schedule"), c.get("bandwidth"), **kw)

    def rate(self, t: float) -> float | None:
        """Bits per second at model time t (None: unshaped, rows cost only the latency)."""
        return rate_at(self.schedule, self.bandwidth, self.t0_s + t)

    def step(self, t: float, rows: int) -> tuple[float, float]:
        """(fetch seconds, step seconds) of a minibatch that pulls `rows` at model time t."""
        rate = self.rate(t)
        fetch = self.latency_s + (0.0 if rate is None else rows * self.row_bytes * 8 / rate)
        return fetch, max(self.compute_s, fetch)

    def clock(self, t: float = 0.0) -> "Clock":
        return Clock(self, t)

    def times(self, fetched_rows: np.ndarray, t: float = 0.0) -> dict[str, np.ndarray]:
        """Per-minibatch t_fetch, t_compute, t_stall, t_start for a replay's fetched rows."""
        clock = self.clock(t)
        out = {k: np.zeros(len(fetched_rows)) for k in ("t_fetch", "t_compute", "t_stall", "t_start")}
        for g, rows in enumerate(np.asarray(fetched_rows).tolist()):
            out["t_start"][g] = clock.t
            out["t_fetch"][g], out["t_stall"][g] = clock.step(rows)
            out["t_compute"][g] = self.compute_s
        return out


class Clock:
    """The model's time as a replay advances (copied with a forked replayer)."""

    def __init__(self, model: TimeModel, t: float = 0.0):
        self.model, self.t = model, t

    def step(self, rows: int) -> tuple[float, float]:
        """Advances past one minibatch pulling `rows`; returns (t_fetch, t_stall)."""
        fetch, step = self.model.step(self.t, rows)
        self.t += step
        return fetch, step - self.model.compute_s

    def slack(self, rows: int) -> float:
        """Seconds of compute left after pulling `rows` now (< 0: the link is saturated)."""
        return self.model.compute_s - self.model.step(self.t, rows)[0]


class TimedBranch(Policy):
    """One branch from a fork at minibatch `first`: `keep` (no round), `replace` (a lookahead
    round admitting misses on each minibatch of the next window, as a replace decision holds
    it) or `any` (the same rounds admitting any node of the sampled-ahead window); no round
    after that window."""

    def __init__(self, branch: str, first: int, window: int, rows: int):
        if branch not in BRANCHES:
            raise ValueError(f"unknown branch {branch!r}; valid: {', '.join(BRANCHES)}")
        self.branch, self.first, self.window, self.rows = branch, first, window, rows

    def plan(self, step: StepInfo) -> Replace | None:
        if self.branch == "keep" or step.global_step - self.first >= self.window:
            return None
        return Replace("lookahead", self.rows, f"counterfactual:{self.branch}",
                       "any" if self.branch == "any" else "misses")


def timed_branches(replayer, pt, model: TimeModel, t: float, window: int, horizon: int,
                   rows: int) -> dict[str, dict]:
    """{branch: {"time_s", "rows", "hits"}} over `horizon` windows from the replayer's cursor,
    each forked from its state with the clock at t. `replayer`: a rudder.sim.replay
    BufferReplayer (with lookahead depth > 0: the rounds need the sampled-ahead window)."""
    from rudder.sim.replay import replay

    first = replayer.g
    stop = min(len(pt), first + horizon * window)
    out = {}
    for b in BRANCHES:
        fork = replayer.fork(TimedBranch(b, first, window, rows))
        fork.records = False
        n = replay(pt, fork, stop=stop)
        span = slice(first, stop)
        tm = model.times(n["fetched_rows"][span], t)
        out[b] = {"time_s": float(tm["t_fetch"].size and (tm["t_stall"] + tm["t_compute"]).sum()),
                  "rows": int(n["fetched_rows"][span].sum()), "hits": int(n["hits"][span].sum())}
    return out


def time_label(branches: dict[str, dict], margin: float = TIME_MARGIN) -> str | None:
    """The fastest branch, or None when the runner-up is within `margin` of its time."""
    order = sorted(branches, key=lambda b: branches[b]["time_s"])
    best, second = branches[order[0]]["time_s"], branches[order[1]]["time_s"]
    return None if second - best <= margin * max(best, 1e-9) else order[0]


def copy_clock(clock: Clock | None) -> Clock | None:
    return None if clock is None else copy.copy(clock)
