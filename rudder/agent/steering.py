"""One steering skeleton for every policy that decides at window closes (agent, classifier,
random collector, hand-written rule); only the decider differs.

  observe(minibatch, window)   WINDOWS  aggregate the window, keep the few before it
                               JUDGE    the decisions this window is the outcome of
                               ASK      decider.submit(point): never blocks
  plan(step)                   APPLY    decider.poll(): the newest answer that arrived sets
                                        the REGIME; older ones are superseded, never applied

Deciders (each in its own module):
  LLMDecider         rudder.agent.policy       its own thread and queues; answers arrive later
  ClassifierDecider  rudder.agent.classifiers  an offline-trained model, at the window close
  RandomDecider      rudder.agent.trajectories the collector: seeded coin flips, trajectories
  RuleDecider        rudder.agent.rule         the hand-written adaptive rule

The regime: a decision, once applied, holds until the next one.
  replace, lookahead mechanism   a lookahead round on every minibatch until the next decision
  replace, massivegnn mechanism  one MassiveGNN round when the decision applies (a round swaps
                                 every stale slot at once: repeating it would only churn)
  keep (or a fallback)           no round until the next decision
A decider with a fallback policy (the LLM's) lets it steer until the first answer and after a
fallback answer (a bad or late one), until the next valid one.

`Steering._judge` is the one place a decision is judged, by one of two rules of rudder.agent.judge:
  prediction  (a decider that predicts, the LLM) its predicted directions came true (`reflect`)
  action      (the others) the action paid for itself within one window (`LabelRule`)
A decision is judged by the first window that closes after it was applied; its record
(DECISION_FIELDS) is handed out by decisions() then, or at close() without an outcome.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable

from rudder.agent.judge import LabelRule, reflect
from rudder.agent.windows import DecisionPoint, WindowAccumulator, WindowStats
from rudder.prefetch.policy import Policy, Replace, RunContext, StepInfo, budget_rows, mechanism_for, stale_after
from rudder.records import DecisionRecord, outcome_fields

log = logging.getLogger(__name__)

RECENT_WINDOWS = 3  # earlier windows kept for the hit-rate trend


def make_round(mechanism: str, rows: int | None, source: str, admit: str, evict: str | None,
               period: int) -> Replace:
    """A decision's round: the `evict` word sets a MassiveGNN round's stale threshold
    (rudder.prefetch.policy.EVICT_PERIODS x period); a lookahead round ignores it."""
    sa = stale_after(evict, period) if mechanism == "massivegnn" else None
    return Replace(mechanism, rows, source, admit, sa)


def past_rounds(capacity: int, cfg, mechanism: str = "massivegnn") -> dict[str, Replace]:
    """The rounds whose effect on the window just closed the past counterfactual measures
    (Policy.past_rounds), as a decision's round: MassiveGNN, every budget word x evict word,
    labelled "<budget>_<evict>"; lookahead, every budget word x admission, labelled
    "<budget>_<admit>" (the evict word means nothing there). The window fields:
    `past_fetched_<label>`."""
    from rudder.agent.messages import ADMITS, BUDGET_SHARE
    from rudder.agent.messages import budget_rows as word_rows
    from rudder.prefetch.policy import EVICT_PERIODS

    if mechanism == "lookahead":
        return {f"{b}_{a}": make_round("lookahead", word_rows(b, capacity), "past", a, None, cfg.period)
                for a in ADMITS for b in BUDGET_SHARE}
    return {f"{b}_{e}": make_round("massivegnn", word_rows(b, capacity), "past", cfg.admit, e, cfg.period)
            for e in EVICT_PERIODS for b in BUDGET_SHARE}


class Regime:
    """The standing plan between two decisions."""

    def __init__(self) -> None:
        self.standing: Replace | None = None

    def apply(self, replace: Replace | None) -> Replace | None:
        """A new decision takes over: `replace` (its round) or None (keep). Returns the plan
        for the minibatch it applies at; later minibatches get `standing`."""
        self.standing = replace if replace is not None and replace.mechanism == "lookahead" else None
        return replace

    def end(self) -> None:
        self.standing = None


@dataclass
class Verdict:
    """A decider's answer on one decision point, as the skeleton applies and judges it."""

    record: DecisionRecord  # what decisions-r<R>.jsonl gets (the skeleton fills applied/outcome)
    point: DecisionPoint  # the window it decided on (the judge's "before")
    rows: int = 0  # rows a replace round may change (0: no round)
    source: str = ""  # the Replace's source ("agent#3", "collect", ...)
    admit: str | None = None  # the round's admission; None: prefetch.admit
    memo: Any = None  # the decider's own (features, a history entry)
    evict: str | None = None  # which slots a history-only round counts stale; None: prefetch.evict


class Decider:
    """Answers "replace now?" at a decision point. A synchronous decider implements decide();
    an asynchronous one (the LLM) overrides submit/poll/wait and answers from its own thread.
    submit() and poll() never block: they run in the training and loader threads."""

    label = "decider"  # DecisionRecord.policy
    backend = ""
    model_label: str | None = None
    predicts = False  # True: judged on its predicted directions; False: on its action (LabelRule)
    fallback: Policy | None = None  # steers before the first answer and after fallback answers
    wants_past = False  # True: its windows carry the past counterfactual (history-only runs)

    def __init__(self, rule: LabelRule | None = None) -> None:
        self.rule = rule or LabelRule()
        self._out: deque[Verdict] = deque()
        self._count = 0

    def setup(self, steer: "Steering") -> None:
        self.steer = steer

    def start(self, state: Callable[[], dict]) -> bool:
        """A decision before the first minibatch (on the start state)? True: one will arrive."""
        return False

    def submit(self, point: DecisionPoint) -> None:
        self._out.append(self.decide(point))

    def poll(self) -> list[Verdict]:
        out = []
        while self._out:
            out.append(self._out.popleft())
        return out

    def wait(self, timeout_s: float) -> bool:
        """True when an answer waits for poll() (a replay calls this; training never does)."""
        return bool(self._out)

    def wait_ready(self, timeout_s: float) -> float:
        return 0.0

    def decide(self, point: DecisionPoint) -> Verdict:
        raise NotImplementedError

    def verdict(self, point: DecisionPoint, replace: bool, *, raw: str | None = None,
                reason: str | None = None, latency_s: float = 0.0, admit: str | None = None,
                memo: Any = None, evict: str | None = None) -> Verdict:
        """A synchronous decider's answer: a replace round of prefetch.budget."""
        s, budget = point.stats, self.steer.cfg.budget
        window, last = (s.window, s.last_step) if s is not None else (point.index, point.last_step)
        rec = DecisionRecord(
            decision=self._count, window=window, decided_step=last, policy=self.label,
            model=self.model_label, backend=self.backend, raw=raw, replace=bool(replace),
            budget=budget if replace else 0.0, reason=reason, latency_s=latency_s, admit=admit, evict=evict)
        self._count += 1
        return Verdict(rec, point, self.steer.max_rows if replace else 0, self.label, admit, memo, evict)

    def applied(self, v: Verdict) -> None:
        """Hook: `v` was applied at v.record.applied_step."""

    def judged(self, v: Verdict, post: DecisionPoint, hit: float | None, rows: float | None) -> None:
        """Hook: `v` was judged on `post` (v.record holds the outcome)."""

    def close(self) -> list[Verdict]:
        """Stops the decider; returns answers that were never applied."""
        return self.poll()


class Steering(Policy):
    """The skeleton (module docstring): windows, regime, apply, judge around a decider."""

    name = "steering"
    records_decisions = True

    def __init__(self, cfg, decider: Decider, *, decide_every: int = 1):
        if decide_every < 1:
            raise ValueError(f"decide_every must be >= 1, got {decide_every}")
        self.cfg = cfg
        self.decider = decider
        self.decide_every = decide_every
        self.last_step = -1  # the latest global step observed
        self._acc = WindowAccumulator()
        self._windows = 0
        self._prev: WindowStats | None = None
        self._recent: deque[dict] = deque(maxlen=RECENT_WINDOWS)
        self._regime = Regime()
        self._in_fallback = False
        self._open: list[Verdict] = []  # applied, awaiting the window that judges them
        self._done: list[dict] = []  # finished records not yet handed out
        self.judged_correct: list[bool] = []  # `correct` of every judged decision
        # plan() runs in the loader thread, observe() in the training loop's
        self._lock = threading.Lock()

    # ---- Policy interface -----------------------------------------------------------------
    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.mechanism = mechanism_for(ctx.depth)
        self.max_rows = budget_rows(self.cfg.budget, ctx.capacity) if ctx.capacity > 0 else 0
        self.decider.setup(self)
        self._in_fallback = self.decider.fallback is not None  # until the first answer

    def start(self, state: Callable[[], dict]) -> bool:
        return self.decider.start(state)

    def wait_ready(self, timeout_s: float) -> float:
        return self.decider.wait_ready(timeout_s)

    def past_rounds(self) -> dict[str, Replace] | None:
        if not self.decider.wants_past or self.ctx.capacity <= 0:
            return None
        return past_rounds(self.ctx.capacity, self.cfg, self.mechanism)

    @property
    def past_windows(self) -> int:
        """Windows the past counterfactual spans (prefetch.past_windows)."""
        return getattr(self.cfg, "past_windows", 1)

    def wait_for_decision(self, timeout_s: float) -> bool:
        """Blocks until an answer waits for plan() (or timeout). Training never calls this; a
        replay (rudder sim) does, to apply answers as a zero-latency decider would."""
        return self.decider.wait(timeout_s)

    def observe(self, metrics: dict, window: dict | None = None) -> None:
        if metrics:
            self._acc.add(metrics)
            if metrics.get("global_step") is not None:
                self.last_step = max(self.last_step, int(metrics["global_step"]))
        if window is None:
            return
        point = self._close_window(window)
        with self._lock:
            self._judge(point)
        if self._windows % self.decide_every == 0:
            self.decider.submit(point)

    def plan(self, step: StepInfo) -> Replace | None:
        arrived = self.decider.poll()
        if not arrived:
            return self._fallback_plan(step) if self._in_fallback else self._regime.standing
        for old in arrived[:-1]:
            old.record.reason = f"{old.record.reason} [superseded, never applied]"
            self.finish(old.record)
        v = arrived[-1]
        rec = v.record
        rec.applied_step = step.global_step
        if v.point.last_step is not None:
            rec.staleness = step.global_step - v.point.last_step
        self.decider.applied(v)
        self._regime.end()
        if rec.fallback:
            self._in_fallback = True
            self.finish(rec)  # no prediction to check
            return self._fallback_plan(step)
        self._in_fallback = False
        with self._lock:
            self._open.append(v)
        if not (rec.replace and v.rows > 0):
            return None
        return self._regime.apply(self.round(v.rows, v.source, v.admit, v.evict))

    def decisions(self) -> list[dict]:
        with self._lock:
            out, self._done = self._done, []
        return out

    def close(self) -> None:
        for v in self.decider.close():  # answers that were never applied
            self.finish(v.record)
        with self._lock:  # applied, but no window closed after them: no outcome
            for v in self._open:
                self._done.append(v.record.to_dict())
            self._open = []
        self._regime.end()

    def round(self, rows: int, source: str, admit: str | None, evict: str | None) -> Replace:
        """The round a replace decision runs: the run's mechanism, `rows` at most, admitting as
        `admit` (lookahead; None: prefetch.admit) and counting stale as `evict` (MassiveGNN;
        None: prefetch.evict). The hindsight replay (rudder.agent.hindsight) builds the same."""
        return make_round(self.mechanism, rows, source, admit or self.cfg.admit,
                          evict or self.cfg.evict, self.cfg.period)

    # ---- internals --------------------------------------------------------------------------
    def finish(self, rec: DecisionRecord) -> None:
        """A record is complete (judged, or never to be): decisions() hands it out."""
        with self._lock:
            self._done.append(rec.to_dict())

    def _close_window(self, window: dict) -> DecisionPoint:
        stats = self._acc.close(window, self._windows)
        raw = dict(window)
        recent = list(self._recent)
        if recent and recent[-1].get("hit_rate") is not None:
            raw["prev_hit_rate"] = recent[-1]["hit_rate"]  # the trend, for hindsight examples
        self._recent.append(raw)
        point = DecisionPoint(raw, stats, self._prev, recent)
        self._windows += 1
        self._prev = stats
        return point

    def _judge(self, post: DecisionPoint) -> None:
        """Where a decision is judged: every applied decision whose outcome window `post` is
        (the first window to close after the decision was applied)."""
        still = []
        for v in self._open:
            rec, pre = v.record, v.point
            if not (post.index > pre.index and (post.last_step or 0) >= (rec.applied_step or 0)):
                still.append(v)
                continue
            if self.decider.predicts:  # did the predicted directions come true?
                hit, rows = reflect(rec, pre.raw, post.raw)
            elif pre.stats is not None:  # did the action pay for itself within one window?
                a, b = pre.stats, post.stats
                hit = b.hit_rate - a.hit_rate
                rows = (b.fetched_rows - a.fetched_rows) / a.fetched_rows if a.fetched_rows > 0 else None
                for k, val in outcome_fields(hit, rows).items():
                    setattr(rec, k, val)
                rec.correct = self.decider.rule.correct(bool(rec.replace), asdict(a), asdict(b))
            else:  # the start decision: no window before it to compare with
                hit = rows = None
            self.decider.judged(v, post, hit, rows)
            if rec.correct is not None:
                self.judged_correct.append(rec.correct)
            self._done.append(rec.to_dict())
        self._open = still

    def _fallback_plan(self, step: StepInfo) -> Replace | None:
        fb = self.decider.fallback
        r = fb.plan(step) if fb is not None else None
        if r is not None:
            r = Replace(r.mechanism, r.max_rows, f"fallback:{fb.name}", stale_after=r.stale_after)
        return r
