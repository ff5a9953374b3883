"""Replays for the past counterfactual's tests (test_past_counterfactual, test_past_lookahead):
a policy that runs chosen rounds and asks for chosen past rounds, and one replay of a trace under it."""
from __future__ import annotations

from rudder.prefetch.past import PastCounterfactual, settle
from rudder.prefetch.policy import Policy, Replace
from rudder.sim.replay import BufferReplayer, PositionTrace, replay

W = 5  # minibatches per window


class Rounds(Policy):
    """A round before each chosen minibatch ({step: Replace}); wants the past counterfactual of `wants`."""

    def __init__(self, at: dict[int, Replace], wants: dict[str, Replace] | None, past_windows: int = 1):
        self.at, self.wants, self.windows, self.past_windows = at, wants, [], past_windows

    def past_rounds(self):
        return self.wants

    def observe(self, metrics, window=None):
        if window is not None:
            self.windows.append(dict(window))

    def plan(self, step):
        return self.at.get(step.global_step)


def run_rounds(trace, at, wants, past_windows=1, depth=0, background=False):
    """(the windows, the per-step counts) of `trace` replayed under Rounds(at, wants);
    `background`: the past counterfactual measured off the replay's thread (prefetch.past_thread),
    the windows settled after."""
    pt = PositionTrace(trace)
    pol = Rounds(at, wants, past_windows)
    rp = BufferReplayer(pt, pol, trace.capacity, alpha=0.1, period=6, depth=depth, window=W)
    if background:
        rp.past = PastCounterfactual.of(pol, background=True)
    rp.fill(trace.init_positions()[: trace.capacity])
    counts = replay(pt, rp)
    rp.past.shutdown()
    return [settle(w) for w in pol.windows], counts
