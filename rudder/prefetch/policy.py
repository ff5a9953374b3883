"""The policy interface: a policy decides *when* the buffer replaces and *how much*; the
mechanism (HaloBuffer) decides nothing on its own. Policies run in the loader thread, between
two minibatches, so they never see the buffer change under them.

A policy is five small methods (and `close`), each saying when it runs:
  - `setup(ctx)`        once, after the buffer is built (ctx: static facts of the run)
  - `plan(step)`        before each minibatch's features are assembled: replace now? how?
  - `wait_ready(t)`     once, before training starts (a model loading); default: no wait
  - `start(state)`      once, before the first minibatch is planned; state() gives the buffer's
                        start state (buffer_state: fill, stale slots, what the minibatches
                        sampled ahead lack); returns True when a decision on it will arrive later
  - `observe(metrics)`  after each minibatch, with its measured metrics (and, every `window`
                        minibatches, the window aggregate)
and `close()` at the end. Adding a policy = one class + one registry line (policies.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch

from rudder.config import WHOLE_EPOCH

Mechanism = Literal["massivegnn", "lookahead"]


@dataclass(frozen=True)
class Replace:
    """A request to the mechanism: run one replacement round now.

    massivegnn: stale slots (score < (1-alpha)^period) get the most-missed halo nodes.
    lookahead:  Belady's rule on the minibatches sampled ahead, under `max_rows`.
    max_rows:   cap on slots changed this round (None = as many as the rule allows).
    admit:      lookahead only: "misses" admits only this minibatch's misses (no extra rows),
                "any" also pulls rows ahead of their use (HaloBuffer.plan_lookahead).
    stale_after: massivegnn only: this round counts a slot stale after that many minibatches
                without a hit (score < (1-alpha)^stale_after) instead of prefetch.period (None);
                the agent's `evict` answer sets it (rudder.agent.messages.EVICT_PERIODS).
    """

    mechanism: Mechanism = "massivegnn"
    max_rows: int | None = None
    source: str = ""  # who asked: "fixed", "agent#12", "fallback:static", ...
    admit: Literal["misses", "any"] = "misses"
    stale_after: float | None = None


# Which slots a MassiveGNN round may replace (the agent's `evict` answer, judge-history; the
# `fixed` policy's EVICT knob; prefetch.evict): a slot is stale after this multiple of
# prefetch.period minibatches without a hit. `stale` is the mechanism's own threshold;
# `half` frees the slots not hit for half as long too. Chosen from the counterfactual-greedy
# ceiling over 0, 0.25, 0.5, 1, 2 and 4 x period (BENCHMARKS 7g): only 0.5 moved it on both
# history-only scenarios; 2 and 4 were never the best answer, 0 (any slot missed since its fill)
# lost rows later.
EVICT_PERIODS: dict[str, float] = {"stale": 1.0, "half": 0.5}


def stale_after(evict: str | None, period: int) -> float | None:
    """Minibatches without a hit after which a round counts a slot stale, for an `evict` word
    (None or "stale": the mechanism's own period, as None)."""
    if evict is None or evict == "stale":
        return None
    if evict not in EVICT_PERIODS:
        raise ValueError(f"unknown evict {evict!r}; valid: {', '.join(EVICT_PERIODS)}")
    return EVICT_PERIODS[evict] * period


def mechanism_for(lookahead: int) -> Mechanism:
    """The replacement a windowed decision (agent, classifier, collect) runs: the lookahead round
    when the run samples ahead (lookahead > 0), else a MassiveGNN round."""
    return "lookahead" if lookahead > 0 else "massivegnn"


def budget_rows(share: float, capacity: int) -> int:
    """Rows a budget (a share of capacity) allows in one replacement round: at least one."""
    return max(1, int(round(share * capacity)))


@dataclass
class RunContext:
    """Static facts a policy (and the agent's prompt) may use."""

    rank: int
    num_trainers: int
    part_id: int
    num_parts: int
    num_nodes: int
    partition_nodes: int
    halo_nodes: int
    capacity: int
    batch_size: int
    fanouts: list[int]
    steps_per_epoch: int
    epochs: int
    feat_dim: int
    feat_bytes: int  # bytes per feature row
    window: int  # minibatches per metrics window
    lookahead: int  # minibatches sampled ahead of training (prefetch.lookahead)
    run_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # prefetch.schedule_ahead on a policy that samples ahead: each epoch's minibatches are all
    # sampled by its start (the first epoch's: 1 + lookahead of them, the rest during it), so the
    # round (and the prompt) see the rest of the epoch (as sampled so far) and then what of the
    # next epoch is sampled, not `lookahead` minibatches (config.sample_ahead)
    schedule_ahead: bool = False

    @property
    def depth(self) -> int:
        """Minibatches known ahead of the current one: `lookahead`, or with schedule_ahead the
        rest of the epoch and the next one's so far (config.WHOLE_EPOCH); > 0 means the
        lookahead mechanism."""
        return WHOLE_EPOCH if self.schedule_ahead else self.lookahead


@dataclass
class StepInfo:
    """What a policy knows just before minibatch `global_step` is assembled."""

    epoch: int
    step: int
    global_step: int
    remaining_steps: int
    # Remote input ids of the minibatches already sampled ahead (next first); empty if lookahead=0.
    future_remote: list[torch.Tensor] = field(default_factory=list)
    stale_slots: int = 0
    buffer_fill: int = 0


class Policy:
    """Base class: the `none`-like defaults. Subclasses override what they need."""

    name = "base"
    uses_buffer = True  # False: no buffer at all (plain DistDGL)
    records_decisions = False  # True: the trainer writes decisions-r<R>.jsonl
    # A policy's knobs: the PrefetchConfig fields a spec sets after colons, in order
    # (`fixed:PERIOD:ALPHA`, as `rudder sim` takes it); named: the first colon field names a model.
    knobs: tuple[str, ...] = ()
    named = False

    def setup(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def plan(self, step: StepInfo) -> Replace | None:
        return None

    def start(self, state: Callable[[], dict]) -> bool:
        """state(): rudder.prefetch.metrics.buffer_state over the first minibatch and those sampled
        ahead of it (a scan of the known future: called only by a policy that uses it). True: an
        asynchronous decision on it is coming (a replay may wait for it)."""
        return False

    def observe(self, metrics: dict, window: dict | None = None) -> None:
        """metrics: one MINIBATCH_FIELDS record; window: a WINDOW_FIELDS record when one closes."""

    def decisions(self) -> list[dict]:
        """Decision records (DECISION_FIELDS) completed since the last call."""
        return []

    def past_rounds(self) -> dict[str, Replace] | None:
        """The past counterfactual this policy wants measured (issue 18, h18d): {label: round}.
        At each window close, live (the loader thread) and in replays alike, each round is
        played from the buffer as it was at that window's start (no other round) over the
        window's own minibatches, and keep, and the fetched rows of each go in the window record
        (`past_keep_fetched`, `past_fetched_<label>`, its seconds `t_past_cf`;
        rudder.prefetch.past). None: not wanted."""
        return None

    def wait_ready(self, timeout_s: float) -> float:
        """Called once after setup, before the first minibatch: a policy with a slow start (the
        agent loading its model) may block here, at most `timeout_s`. Returns seconds waited.
        This is start-up, like DistDGL's own init; no minibatch ever waits on a policy."""
        return 0.0

    def close(self) -> None:
        pass


class ScriptedRounds(Policy):
    """Given rounds at given minibatches (`at`: {global step: Replace}); asks for the past
    counterfactual of `wants` over `past_windows` windows (None: not wanted) and keeps every
    window record it sees (`windows`). What the tests and benchmarks of the past counterfactual
    and of rounds run, live or in a replay."""

    name = "scripted"

    def __init__(self, at: dict[int, Replace], wants: dict[str, Replace] | None = None, past_windows: int = 1):
        self.at, self.wants, self.past_windows, self.windows = at, wants, past_windows, []

    def plan(self, step: StepInfo) -> Replace | None:
        return self.at.get(step.global_step)

    def past_rounds(self) -> dict[str, Replace] | None:
        return self.wants

    def observe(self, metrics: dict, window: dict | None = None) -> None:
        if window is not None:
            self.windows.append(dict(window))
