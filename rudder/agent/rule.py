"""`rule`: a hand-written adaptive rule, the baseline the LLM has to beat (issue 18). It answers
at each window close from that window alone, through the same steering skeleton as the agent
and the classifiers (rudder.agent.steering), so its rounds are theirs: with lookahead a replace
holds a lookahead round on every minibatch until the next decision; without, it is one
MassiveGNN round.

  lookahead on (the run samples ahead)
    when   always replace, from the first minibatch (a start decision): a round that admits
           only the minibatch's misses costs no rows, and replays found "replace" right at
           every window there (issue 18); so what the rule adapts is the admission
    admit  `any` (pull rows ahead of their use) while the link has slack: fetch < compute
           (the window's t_fetch < t_minibatch - t_fetch); `misses` (no extra rows) once it
           is saturated; the configured prefetch.admit where no time was measured (a replay,
           or the start)
  lookahead off (history only: the MassiveGNN mechanism)
    when   replace when the hit rate has fallen `drop` (2 points) or more below its best
           window since the reference was set, and there are stale slots to swap; replace
           again while each round lifts the hit rate by drop/2 or more and stale slots remain
           (the stream moved: catch up); else keep, and the level reached is the new reference
           (a round costs its rows, so it must buy back hits that were lost)
    go_on  (`rule` extra go_on=..., a run's `rule.go_on`) what "each round lifts the hit
           rate" means: `lift` (default) a lift of drop/2 or more; `payback` any lift whose rows
           saved over PAYBACK_WINDOWS windows (the lift x the window's remote rows) cover the
           rows the round replaced -- a small round (a low budget, few stale slots) cannot show
           a whole point, yet may pay (BENCHMARKS §7i: history_cold_small)
    probe  (off by default; `rule` extra probe=true, a run's `rule.probe: true`) the first window with stale slots runs a
           round although no hit rate fell -- a buffer that starts cold (a random initial fill)
           never shows a fall, so without a first round the rule never learns whether rounds
           pay; the catch-up above then goes on while they do
    evict  (`rule` extra evict=..., a run's `rule.evict`) which slots its rounds count stale: the config's
           prefetch.evict (None, the default), `stale` or `half` at every round, or `catchup`:
           half for the probe and for rounds that go on while each lifts the hit rate (the buffer
           still holds cold rows: free more of them), stale for a round after a fall

Judged as the classifiers are (the action paid for itself within one window: LabelRule).
"""
from __future__ import annotations

import json
from typing import Any, Callable, get_args

from rudder.agent.judge import LabelRule
from rudder.agent.messages import START_WINDOW
from rudder.agent.steering import Decider, Steering, Verdict
from rudder.agent.windows import DecisionPoint
from rudder.config import PrefetchConfig, RuleConfig

DROP = RuleConfig().drop  # hit-rate fall (fraction units) below the best since the last round: buy it back
EVICT_MODES = (None, "stale", "half", "catchup")  # the rule's `evict` extra (module docstring)
GO_ON_MODES = get_args(RuleConfig.model_fields["go_on"].annotation)  # the rule's `go_on` extra (module docstring)
PAYBACK_WINDOWS = 2  # the counterfactual judge's horizon: the two windows after a decision


def link_slack(window: dict) -> bool | None:
    """Whether fetching hides behind compute (fetch < compute) in this window; None when no
    time was measured (a replay)."""
    t_fetch, t_mb = float(window.get("t_fetch") or 0.0), float(window.get("t_minibatch") or 0.0)
    if t_mb <= 0.0:
        return None
    return t_fetch < t_mb - t_fetch


class RuleDecider(Decider):
    label = "rule"
    backend = "rule"

    def __init__(self, *, drop: float = DROP, rule: LabelRule | None = None, probe: bool = False,
                 evict: str | None = None, go_on: str = "lift"):
        if not 0 < drop <= 1:
            raise ValueError(f"rule: drop (a hit-rate fall, 0..1) must be in (0, 1], got {drop}")
        if evict not in EVICT_MODES:
            raise ValueError(f"rule: unknown evict {evict!r}; valid: {', '.join(map(str, EVICT_MODES))}")
        if go_on not in GO_ON_MODES:
            raise ValueError(f"rule: unknown go_on {go_on!r}; valid: {', '.join(GO_ON_MODES)}")
        super().__init__(rule)
        self.drop = drop
        self.go_on = go_on
        self.evict = evict
        self._probe = bool(probe)  # a first round not yet tried (history only)
        self._best: float | None = None  # best hit rate since the reference was set
        self._round_at: float | None = None  # hit rate when the last round was decided

    def start(self, state: Callable[[], dict]) -> bool:
        if self.steer.mechanism != "lookahead":
            return False  # history only: nothing is known before the first window
        start = DecisionPoint({"window": START_WINDOW, "first_step": None, "last_step": -1, "minibatches": 0})
        self.submit(start)
        return True

    def decide(self, point: DecisionPoint) -> Verdict:
        if self.steer.mechanism == "lookahead":
            replace, why, admit = self._lookahead(point)
            evict = None
        else:
            replace, why, admit, evict = self._history_only(point)
        raw = {"replace": replace, "admit": admit, **({"evict": evict} if evict else {})}
        return self.verdict(point, replace, reason=f"{why}: {'replace' if replace else 'keep'}",
                            raw=json.dumps(raw), admit=admit, evict=evict)

    def _lookahead(self, point: DecisionPoint) -> tuple[bool, str, str]:
        slack = link_slack(point.raw)
        admit = self.steer.cfg.admit if slack is None else ("any" if slack else "misses")
        link = {None: "untimed", True: "fetch < compute", False: "fetch >= compute"}[slack]
        return self.steer.max_rows > 0, f"lookahead on, {link}, admit {admit}", admit

    def _history_only(self, point: DecisionPoint) -> tuple[bool, str, None, str | None]:
        s = point.stats
        half = int(point.raw.get("stale_half") or 0)  # slots an evict=half round may take
        can = s.stale_slots > 0 and self.steer.max_rows > 0  # a round would swap something
        if self.evict in ("half", "catchup"):
            can = max(s.stale_slots, half) > 0 and self.steer.max_rows > 0
        catchup = False
        if self._round_at is not None:  # the window after a round: did it help?
            lift, self._round_at = s.hit_rate - self._round_at, None
            why = f"the last round lifted the hit rate {100 * lift:+.1f} pt, {s.stale_slots} stale"
            if self.go_on == "payback":  # the rows the lift saves against the rows the round took
                saved = lift * s.remote_rows * s.minibatches * PAYBACK_WINDOWS
                paid = lift > 0 and saved >= s.replaced_rows
                why += f", saving ~{max(saved, 0):,.0f} rows in {PAYBACK_WINDOWS} windows for {s.replaced_rows:,.0f}"
            else:
                paid = lift >= self.drop / 2
            replace = catchup = paid and can
            if not replace:
                self._best = s.hit_rate  # it did not: a new reference
        else:
            best = s.hit_rate if self._best is None else max(self._best, s.hit_rate)
            self._best, fell = best, best - s.hit_rate
            replace = fell >= self.drop and can
            why = (f"hit rate {100 * s.hit_rate:.1f}%, {100 * fell:.1f} pt below its best "
                   f"{100 * best:.1f}%, {s.stale_slots} stale")
            if self._probe and can and not replace:
                replace, catchup, why = True, True, why + ", a first round to try"
        if replace:
            self._probe = False
            self._round_at, self._best = s.hit_rate, None
        evict = self.evict
        if evict == "catchup":
            evict = "half" if catchup else "stale"
        if replace and evict:
            why += f", evict {evict}"
        return replace, why, None, evict if replace else None


class RulePolicy(Steering):
    """`rule`: the steering skeleton with the hand-written RuleDecider.

    knobs (`rudder sim` rule:LOOKAHEAD:BUDGET:ADMIT:WINDOW): lookahead 0 = history only.
    extra: drop (the rule's threshold), probe (a first round without a fall), evict (which
    slots its rounds count stale: None, stale, half, catchup), go_on (lift, payback), margin and cost (the LabelRule
    that fills `correct`);
    agent= and other keys are ignored."""

    name = "rule"
    knobs = ("lookahead", "budget", "admit", "window")

    def __init__(self, cfg: PrefetchConfig, *, drop: float = DROP, margin: float = 0.01,
                 cost: str = "time", probe: bool = False, evict: str | None = None, go_on: str = "lift",
                 **_ignored: Any):
        super().__init__(cfg, RuleDecider(drop=drop, rule=LabelRule(margin=margin, cost=cost), probe=probe,
                                          evict=evict, go_on=go_on))
