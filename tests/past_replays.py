"""Replays for the past counterfactual's tests (test_past_counterfactual, test_past_lookahead):
one replay of a trace under a policy that runs chosen rounds and asks for chosen past rounds."""
from __future__ import annotations

from rudder.prefetch.past import PastCounterfactual, settle
from rudder.prefetch.policy import ScriptedRounds
from rudder.sim.replay import BufferReplayer, PositionTrace, replay

W = 5  # minibatches per window


def run_rounds(trace, at, wants, past_windows=1, depth=0, background=False):
    """(the windows, the per-step counts) of `trace` replayed under ScriptedRounds(at, wants);
    `background`: the past counterfactual measured off the replay's thread (prefetch.past_thread),
    the windows settled after."""
    pt = PositionTrace(trace)
    pol = ScriptedRounds(at, wants, past_windows)
    rp = BufferReplayer(pt, pol, trace.capacity, alpha=0.1, period=6, depth=depth, window=W)
    if background:
        rp.past = PastCounterfactual.of(pol, background=True)
    rp.fill(trace.init_positions()[: trace.capacity])
    counts = replay(pt, rp)
    rp.past.shutdown()
    return [settle(w) for w in pol.windows], counts
