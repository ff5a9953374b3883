"""ContextBuilder: turns the run's static facts, the window that just closed and the last
decisions (with their measured outcomes) into chat messages for the decision maker.

Message layout. On CPUs the prompt's prefill dominates a decision's latency, and llama.cpp
reuses the KV cache of the longest prefix shared with the previous call, so everything that is
the same for every run, rank and window comes first:
  system     metric definitions, actions, rules of thumb, answer format (constant per variant)
  user/asst  canned in-context examples (constant: all of them, whatever the run's history),
             then examples judged in hindsight from this run's own history (variant `default`:
             each the exact question the trainer was asked, in blocks of OWN_BLOCK decisions,
             so a trainer's next prompt extends its last one and the node's server, which keeps
             each trainer's prompt state, reads only the answer's tail and the new question)
  user       the last decisions with outcomes, the current window
The static context of this run (graph and partition sizes, r/P, batch, minibatches, halo,
capacity, budgets in rows; the facts all trainers share first, then the trainer's own) is stated
once, by the run's first message: its first own example, else the question; its later messages
open with "Same run." (issue 16: each repetition, ~150 tokens, was read anew per answer).

Prompt variants (scored by `rudder agent eval`):
  zero-shot     decision first in the JSON (reason last), no examples
  reason-first  reason first, no examples
  few-shot      reason first + canned examples
  default       reason first + canned examples + the run's own (its questions as asked, with
                hindsight answers, in blocks: prefix-stable per trainer, issue 16);
                the grammar holds the reason to the examples' evidence form
                ("hit rate falling, lookahead on, much missing ahead: replace")
  free-reason   default with any short reason (ending in its conclusion)
  signals       free-reason + one line naming the signals (trend, stale share, lookahead share)
  judge         the signals to judge by, as numbers, and no conclusion drawn from them (issue 18):
                hit-rate trend (points per window), stale share, link slack (fetch vs compute
                time per minibatch), what the sampled-ahead minibatches lack and its drift; the
                rules of thumb and the "much/little missing ahead" verdict are gone, the answer
                also chooses admission (admit misses|any), and the grammar holds only the format
                (any short reason ending in its conclusion). `signals.window_signals` computes them;
                also the fetched-rows trend (% per window), the remote rows' drift (the stream
                moving where nothing is sampled ahead) and, lookahead off, what a round costs
                (its rows in minibatches' worth of fetched rows).
  judge-history the judge variant for runs without lookahead (history-only rounds, MassiveGNN's
                mechanism): its own system text (no lookahead signals) and canned examples
                taken from a history-only example run (JUDGE_HISTORY_CANNED: windows of a
                held-out trainer, answered as the counterfactual judge found right), plus the
                misses' set-level drift (the Jaccard overlap of this window's missed halo nodes
                with the window before's). `judge`'s canned windows all have lookahead on, and
                in history-only runs the models copied their words (BENCHMARKS 7f). Instead of
                admission it asks `evict` (stale|half: which slots the round counts stale, issue
                18's "which slots") and shows the slots stale at half the period (BENCHMARKS 7g).
  judge-history-2 judge-history plus the past counterfactual (h18d, BENCHMARKS 7h): what a
                round at the last window close would have done to the window just closed,
                replayed from the buffer as it was (window fields past_*, computed live and
                in replays alike: rudder.prefetch.past), as "saved / cost" shares per budget
                and evict word; its own canned windows (a held-out trainer's, keep and replace
                alternating, the reasons quoting the best round) and the run's history as its
                actions only. judge-history-2b: the same without the run's own decisions.
  judge-history-2c judge-history-2b whose replace names its round in the conclusion ("...: replace
                small/half") and whose grammar binds budget and evict to it (BENCHMARKS 7zc):
                under 2b up to a third of SmolLM2's replaces named one round in the reason and wrote
                another in the fields.
  judge-history-3 judge-history-2b whose examples are retrieved per window (h18e, BENCHMARKS
                7k): the RETRIEVE_K windows of a held-out labelled pool (history_pool.jsonl)
                nearest to the asked window by its signals (pool_features: the past
                counterfactual's best saving, stale shares, hit-rate trend), both answers shown
                where the pool has both, the nearest's answer last; reasons written from each pool
                window's own past counterfactual and its judged label (pool_reason; both in
                rudder.agent.history_examples).
  judge-past    judge (lookahead on) plus the past counterfactual of lookahead rounds: the
                window just closed replayed from the buffer as it was at its start with a round
                before every minibatch (each budget and admit word) and without, as
                "saved / cost" shares (BENCHMARKS 7q); judge's three windows with that fact
                added, keep first, each reason quoting it; no own history (as 2b).

Where the parts live: the signals of a window and the past counterfactual's figures, as numbers
and as the words prompts use, in rudder.agent.signals; the held-out example run of the
history-only variants (their canned windows and judge-history-3's pool) in
rudder.agent.history_examples; the system texts, answer formats and the other canned examples in
rudder.agent.prompt_texts; the variants and the builder here.

Window rows (remote_rows, fetched_rows, replaced_rows) are totals over the window's minibatches
and are shown per minibatch; stale_slots, buffer_fill, lookahead_* are snapshots at its close.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable

from rudder.agent.history_examples import (
    HISTORY_CONTEXT,
    JUDGE_HISTORY_CANNED,
    PAST_CANNED,
    PAST_CONTEXT,
    example_pool,
    pool_design,
)
from rudder.agent.messages import (
    BUDGET_SHARE,
    START_WINDOW,
    Answer,
    HistoryEntry,
    answer_schema,
    budget_rows,
    conclusion,
    name_the_round,
)
from rudder.agent.prompt_texts import (
    ANSWER_DECISION_FIRST,
    ANSWER_REASON_FIRST,
    CANNED,
    CANNED_CONTEXT,
    JUDGE_ANSWER,
    JUDGE_CANNED,
    JUDGE_HISTORY_ANSWER,
    JUDGE_HISTORY_NAMED_ANSWER,
    JUDGE_HISTORY_SYSTEM,
    JUDGE_PAST_CANNED,
    JUDGE_PAST_SYSTEM,
    JUDGE_SYSTEM,
    PAST_SYSTEM,
    RUN_TEMPLATE,
    SYSTEM_TEMPLATE,
)
from rudder.agent.signals import (
    LOOKAHEAD_SMALL,
    evidence,
    missing_word,
    num_text,
    past_line,
    pct_text,
    per_minibatch,
    trend_word,
    window_signals,
)
from rudder.prefetch.policy import RunContext
from rudder.records import HIT_TOL, ROWS_TOL, direction  # "flat" = |hit delta| < 1 pt, |rows delta| < 2%


# Own examples of the `default` variant come in blocks of this many decisions (by decision
# number): a question shows the newest example of the blocks before its own (short: the window
# only, as the other variants show theirs) and then those of its own block's earlier decisions
# (the exact questions), so within a block each prompt extends the one before; at a block's first
# question the older ones drop at once. Without that one older example, the first question of a
# block lost 4 of 28 eval windows to Qwen-0.5B (lookahead-off windows replaced; BENCHMARKS §6). 4:
# at most 4 own examples, the prompt under ~3.7k of the 4k context with the longest questions
# (SmolLM2's tokens: system and canned ~1.9k, an own example ~0.4k, the question ~0.35k).
OWN_BLOCK = 4


@dataclass(frozen=True)
class Variant:
    name: str
    reason_first: bool
    examples: str  # "none" | "canned" | "history"
    signals: bool = False
    max_examples: int = 4
    evidence_reason: bool = False  # the grammar holds the reason to the evidence form
    # prefix-stable own examples (issue 16): each is the exact question the trainer was asked
    # (HistoryEntry.asked) with its hindsight answer, kept in blocks of this many decisions
    # (0: the newest max_examples // 2, rendered anew, as before)
    own_block: int = 0
    # judge-history-2c: a replace's conclusion names its round (": replace small/half") and the
    # grammar binds budget and evict to it (messages.answer_schema(name_round=True))
    name_round: bool = False


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("zero-shot", reason_first=False, examples="none"),
        Variant("reason-first", reason_first=True, examples="none"),
        Variant("few-shot", reason_first=True, examples="canned"),
        Variant("default", reason_first=True, examples="history", evidence_reason=True, own_block=OWN_BLOCK),
        Variant("free-reason", reason_first=True, examples="history"),
        Variant("signals", reason_first=True, examples="history", signals=True),
        Variant("judge", reason_first=True, examples="canned", max_examples=3),
        Variant("judge-history", reason_first=True, examples="canned", max_examples=4),
        Variant("judge-history-2", reason_first=True, examples="canned", max_examples=4),
        Variant("judge-history-2b", reason_first=True, examples="canned", max_examples=4),
        Variant("judge-history-2c", reason_first=True, examples="canned", max_examples=4, name_round=True),
        Variant("judge-history-3", reason_first=True, examples="canned", max_examples=4),
        Variant("judge-past", reason_first=True, examples="canned", max_examples=3),
    ]
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown prompt variant {name!r}; valid: {', '.join(VARIANTS)}")
    return VARIANTS[name]


@dataclass
class Prompt:
    messages: list[dict[str, str]]
    schema: dict[str, Any]
    hash: str  # identifies the prompt design (variant, templates, schema, canned examples)
    variant: str
    asked: str = ""  # the question's text after its opening (facts or "Same run."): HistoryEntry.asked
    window: int | None = None  # the window asked about (a scripted backend answers by it)


def as_context(ctx: RunContext | dict) -> RunContext:
    """A RunContext from a RunContext or a dict (eval files); missing facts default to 0."""
    if isinstance(ctx, RunContext):
        return ctx
    names = {f.name for f in fields(RunContext)}
    base: dict[str, Any] = {n: 0 for n in names}
    base.update(fanouts=[], run_dir=None, extra={})
    base.update({k: v for k, v in ctx.items() if k in names})
    return RunContext(**base)


# ---- the judge variant (issue 18): signals, not a verdict --------------------------------------
HISTORY_VARIANTS = {"judge-history", "judge-history-2", "judge-history-2b", "judge-history-2c",
                    "judge-history-3"}  # history-only runs (no lookahead)
# the past counterfactual shown (h18d); judge-past: judge (lookahead on) with lookahead rounds replayed
PAST_VARIANTS = {"judge-history-2", "judge-history-2b", "judge-history-2c", "judge-history-3", "judge-past"}
RETRIEVE_VARIANTS = {"judge-history-3"}  # examples retrieved per window from the held-out pool (h18e)
# judge-history-2b: judge-history-2 without the run's own decisions ("Recent decisions: none."
# always): under judge-history-2 Qwen-0.5B wrote "saved 9.6%, a round pays: keep" for nine
# windows after its first keep, then "cost 1.7%, a round pays: replace" after its first replaces
NO_OWN_HISTORY = {"judge-history-2b", "judge-history-2c", "judge-history-3", "judge-past"}
JUDGE_VARIANTS = {"judge", "judge-past", *HISTORY_VARIANTS}


class ContextBuilder:
    """Builds the prompt for one decision. Holds only the run's static facts and the variant."""

    def __init__(self, ctx: RunContext | dict, variant: str = "default", history: int = 4):
        self.ctx = as_context(ctx)
        self.variant = get_variant(variant)
        self.history_k = 0 if variant in NO_OWN_HISTORY else history
        if self.variant.name in JUDGE_VARIANTS:
            self._init_judge()
            return
        self.schema = answer_schema(self.variant.reason_first, self.variant.evidence_reason)
        self.start_schema = answer_schema(self.variant.reason_first, self.variant.evidence_reason, measured=False)
        self.answer_text = ANSWER_REASON_FIRST if self.variant.reason_first else ANSWER_DECISION_FIRST
        self.system = SYSTEM_TEMPLATE + "\n" + self.answer_text  # constant per variant: cached
        variant = _design_fields(self.variant)
        design = {
            "variant": variant, "system": SYSTEM_TEMPLATE, "run": RUN_TEMPLATE,
            "schema": self.schema, "start_schema": self.start_schema, "answer": self.answer_text,
            "canned": [CANNED_CONTEXT, CANNED] if self.variant.examples != "none" else None,
        }
        if self.variant.examples == "history":  # the run's facts once, not per own example (issue 16)
            design["facts"] = "once"
        if self.variant.own_block:  # own examples = the exact questions asked, in blocks (issue 16)
            design["own_examples"] = "asked"
        self.hash = hashlib.sha256(json.dumps(design, sort_keys=True).encode()).hexdigest()[:16]

    def _init_judge(self) -> None:
        self.judge = True
        self.history_only = self.variant.name in HISTORY_VARIANTS
        self.past = self.variant.name in PAST_VARIANTS
        # judge: the lookahead round's admission; judge-history: the MassiveGNN round's stale
        # threshold (evict) instead -- admission means nothing without lookahead
        self.schema = (answer_schema(True, False, staleness=True, name_round=self.variant.name_round)
                       if self.history_only else answer_schema(True, False, admission=True))
        self.start_schema = self.schema
        self.answer_text = JUDGE_HISTORY_ANSWER if self.history_only else JUDGE_ANSWER
        if self.variant.name_round:
            self.answer_text = JUDGE_HISTORY_NAMED_ANSWER
        system, canned = ((JUDGE_HISTORY_SYSTEM, [HISTORY_CONTEXT, JUDGE_HISTORY_CANNED]) if self.history_only
                          else (JUDGE_SYSTEM, [CANNED_CONTEXT, JUDGE_CANNED]))
        if self.past:
            system, canned = ((PAST_SYSTEM, [PAST_CONTEXT, PAST_CANNED]) if self.history_only
                              else (JUDGE_PAST_SYSTEM, [CANNED_CONTEXT, JUDGE_PAST_CANNED]))
        self.retrieve = self.variant.name in RETRIEVE_VARIANTS
        if self.retrieve:  # judge-history-3: the examples are the pool's nearest windows per question
            canned = [PAST_CONTEXT, pool_design()]
        self.judge_canned = canned  # [the example run's facts, its windows]: _judge_examples
        self.system = system + "\n" + self.answer_text
        variant = {k: v for k, v in _design_fields(self.variant).items() if k != "own_block"}
        design = {"variant": variant, "system": system, "run": RUN_TEMPLATE,
                  "schema": self.schema, "answer": self.answer_text, "canned": canned}
        self.hash = hashlib.sha256(json.dumps(design, sort_keys=True).encode()).hexdigest()[:16]

    judge = False
    history_only = False  # judge-history: no lookahead lines, the misses' set drift shown
    past = False  # judge-history-2: the past counterfactual shown, the history as actions only
    retrieve = False  # judge-history-3: examples retrieved per window from the held-out pool

    # ---- static context -------------------------------------------------------------------
    def static_text(self) -> str:
        """The run's facts: graph and partition sizes, r/P, batch, minibatches, halo, capacity."""
        c = self.ctx
        if c.schedule_ahead:  # epochs sampled ahead (rudder.pipeline._sample_share), not `lookahead` minibatches
            la = ("each epoch's minibatches are sampled ahead: the first epoch's while it trains (it starts once its "
                  f"first {1 + c.lookahead} are sampled), each later epoch's whole while the epoch before trains, so what "
                  "is sampled is known ahead (lookahead on: replace = a round every minibatch, planned over the "
                  "rest of the epoch and the next epoch's minibatches sampled so far)")
        elif c.lookahead > 0:
            la = f"the next {c.lookahead} minibatches are sampled ahead (lookahead on: replace = a round every minibatch)"
        else:
            la = "lookahead off (replace = one round)"
        return RUN_TEMPLATE.format(
            num_nodes=c.num_nodes, num_parts=c.num_parts, rank=c.rank, num_trainers=c.num_trainers,
            part_id=c.part_id, partition_nodes=c.partition_nodes, halo_nodes=c.halo_nodes,
            capacity=c.capacity, cap_share=pct_text(c.capacity / c.halo_nodes, 0) if c.halo_nodes else "n/a",
            batch_size=c.batch_size, fanouts=",".join(map(str, c.fanouts)) or "n/a",
            steps_per_epoch=c.steps_per_epoch, epochs=c.epochs, window=c.window, lookahead_text=la,
            small=budget_rows("small", c.capacity), medium=budget_rows("medium", c.capacity),
            large=budget_rows("large", c.capacity),
        )

    # ---- dynamic context ------------------------------------------------------------------
    def render_window(self, w: dict, recent: Iterable[float | dict] = ()) -> str:
        """The window in a few lines; `recent`: earlier windows (dicts or hit rates), oldest first."""
        c = self.ctx
        if self.judge:
            return self._render_judge(w, list(recent))
        if w.get("window") == START_WINDOW:
            return self._render_start(w)
        prev = [r.get("hit_rate") if isinstance(r, dict) else r for r in recent]
        prev = [p for p in prev if p is not None]
        hr = w.get("hit_rate")
        total = c.steps_per_epoch * c.epochs
        first, last = w.get("first_step"), w.get("last_step")
        head = f"Window {w.get('window', '?')}"
        if first is not None and last is not None:
            head += f": minibatches {first}-{last}"
            if total:
                head += f" ({last + 1} of {total} done)"
        lines = [head]
        hr_line = f"hit_rate {pct_text(hr)}"
        if prev and hr is not None:
            d = hr - prev[-1]
            hr_line += f", {trend_word(d)} ({100 * d:+.1f} pt); earlier: " + ", ".join(pct_text(p) for p in prev[-3:])
        elif hr is not None:  # said outright: left unsaid, Qwen-0.5B wrote a trend of its own and kept
            hr_line += " (first window: no trend yet)"
        lines.append(hr_line)
        fetched, remote = per_minibatch(w, "fetched_rows"), per_minibatch(w, "remote_rows")
        lines.append(f"fetched rows per minibatch {num_text(fetched)} of {num_text(remote)} remote input rows; "
                     f"replaced rows in window {num_text(w.get('replaced_rows'))}")
        lines += self._buffer_lines(w)
        if self.variant.signals:
            lines.append("signals: " + self._signals(w, prev))
        return "\n".join(lines)

    def _buffer_lines(self, w: dict) -> list[str]:
        """Stale slots and fill; with lookahead, how much of the sampled-ahead future is missing."""
        cap = max(1, self.ctx.capacity)
        stale = w.get("stale_slots")
        fill = w.get("buffer_fill")
        fill_share = None if fill is None else (fill if fill <= 1 else fill / cap)
        lines = [f"stale slots {num_text(stale)} of {cap:,} ({pct_text(None if stale is None else stale / cap, 0)}); "
                 f"buffer fill {pct_text(fill_share, 0)}"]
        if self.ctx.depth > 0:
            miss = w.get("lookahead_missing")
            word = "" if miss is None else f": {missing_word(miss, cap)}"
            lines.append(f"lookahead missing {num_text(miss)} nodes ({pct_text(None if miss is None else miss / cap, 0)} of capacity{word})")
        return lines

    def _render_start(self, w: dict) -> str:
        """The start decision's 'window': no minibatch has run, so only the initial buffer and what
        the minibatches sampled ahead lack are known."""
        lines = ["Start of training: no minibatch has run yet, no hit rate yet; the buffer holds its initial fill"]
        return "\n".join(lines + self._buffer_lines(w))

    def _render_judge(self, w: dict, recent: list) -> str:
        """The window as the signals to judge by: numbers, no verdict."""
        c = self.ctx
        cap = max(1, c.capacity)
        sig = window_signals(w, recent, c.capacity, c.depth > 0)
        lines = []
        if w.get("window") == START_WINDOW:
            lines.append("Start of training: no minibatch has run yet; the buffer holds its initial fill")
        else:
            total = c.steps_per_epoch * c.epochs
            first, last = w.get("first_step"), w.get("last_step")
            head = f"Window {w.get('window', '?')}"
            if first is not None and last is not None:
                head += f": minibatches {first}-{last}" + (f" ({last + 1} of {total} done)" if total else "")
            lines.append(head)
            hr = f"hit rate {pct_text(sig['hit_rate'])}"
            if sig["hit_trend_pt"] is not None:
                hr += (f"; trend {sig['hit_trend_pt']:+.1f} pt per window over the last {sig['trend_windows']} "
                       "windows (" + ", ".join(pct_text(h) for h in sig["hit_rates"]) + ")")
            else:
                hr += "; no earlier window"
            lines.append(hr)
            fetched, remote = per_minibatch(w, "fetched_rows"), per_minibatch(w, "remote_rows")
            lines.append(f"fetched rows per minibatch {num_text(fetched)} of {num_text(remote)} remote input rows; "
                         f"replaced rows in window {num_text(w.get('replaced_rows'))}")
            moves = []
            if sig["rows_trend_pct"] is not None:
                moves.append(f"fetched rows trend {sig['rows_trend_pct']:+.1f}% per window")
            if sig["remote_drift_pct"] is not None:
                moves.append(f"remote input rows {sig['remote_drift_pct']:+.1f}% since the window before")
            if moves:
                lines.append("rows: " + "; ".join(moves))
            if self.history_only and sig["miss_overlap"] is not None:
                lines.append(f"missed nodes {num_text(sig['missed_nodes'])} distinct; "
                             f"{pct_text(sig['miss_again_share'], 0)} of them also missed in the window before; "
                             f"overlap of the two windows' missed sets {pct_text(sig['miss_overlap'], 0)}")
            if sig["round_rows"] is not None:
                rr, mb = sig["round_rows"], sig["round_mb"]
                cost = (f"a round pulls up to {' / '.join(f'{k} {num_text(v)}' for k, v in rr.items())} extra rows")
                if mb is not None:
                    cost += (" = " + " / ".join(f"{v:.1f}" for v in mb.values())
                             + " minibatches of this window's fetched rows")
                lines.append(cost)
            if sig["slack_s"] is None:
                if not self.history_only:  # (judge-history names no link signal)
                    lines.append("link: fetch and compute time not measured")
            else:
                state = (f"slack {sig['slack_s']:.2f} s ({pct_text(sig['slack_share'], 0)} of compute)"
                         if sig["slack_s"] >= 0 else f"fetch exceeds compute by {-sig['slack_s']:.2f} s")
                lines.append(f"link: fetch {sig['fetch_s']:.2f} s per minibatch, compute {sig['compute_s']:.2f} s: {state}")
        if sig["stale_share"] is not None:
            stale = f"stale slots {num_text(w.get('stale_slots'))} of {cap:,} ({pct_text(sig['stale_share'], 0)} of capacity)"
            if self.history_only and w.get("stale_half") is not None:  # what evict=half would free
                stale += f"; at half the period {num_text(w['stale_half'])} ({pct_text(w['stale_half'] / cap, 0)})"
            lines.append(stale)
        if self.past and w.get("window") != START_WINDOW:
            line = past_line(w)
            if line:
                lines.append(line)
        if c.depth > 0 and sig["missing_share"] is not None:
            n = w.get("lookahead_minibatches")  # schedule_ahead: how much is sampled so far
            if not c.schedule_ahead:
                ahead = f"the next {c.lookahead} minibatches lack"
            elif n is None:
                ahead = "the rest of the epoch lacks"
            else:
                ahead = f"the next {n} minibatches (all sampled so far, on into the next epoch) lack"
            s = (f"sampled ahead: {ahead} {num_text(w.get('lookahead_missing'))} "
                 f"nodes ({pct_text(sig['missing_share'], 0)} of capacity)")
            if sig["drift_pt"] is not None:
                s += f"; drift {sig['drift_pt']:+.1f} pt of capacity since the window before"
            lines.append(s)
        return "\n".join(lines)

    def _signals(self, w: dict, prev: list[float]) -> str:
        cap = max(1, self.ctx.capacity)
        hr = w.get("hit_rate")
        out = []
        if hr is not None and prev:
            out.append("hit rate " + trend_word(hr - prev[-1]))
        if w.get("stale_slots") is not None:
            out.append(f"stale share {'high' if w['stale_slots'] / cap >= 0.3 else 'low'}")
        if self.ctx.depth > 0 and w.get("lookahead_missing") is not None:
            out.append(f"lookahead missing {'large' if w['lookahead_missing'] / cap >= 0.2 else 'small'}")
        return ", ".join(out) or "none"

    def render_history(self, history: list[HistoryEntry]) -> str:
        shown = history[-self.history_k:] if self.history_k else []
        if not shown:
            return "Recent decisions: none."
        lines = ["Recent decisions:"]
        for h in shown:
            at = "at the start" if h.window == START_WINDOW else f"window {h.window}"
            if h.fallback:
                lines.append(f"- #{h.decision} {at}: no valid answer, {h.fallback} applied")
                continue
            act = f"replace {h.budget} ({h.rows} rows)" if h.replace else "keep"
            if self.judge and h.replace and h.admit:
                act = f"replace {h.budget}, admit {h.admit} ({h.rows} rows)"
            elif self.history_only and h.replace and h.evict:
                act = f"replace {h.budget}, evict {h.evict} ({h.rows} rows)"
            if self.past:  # the action only: no prediction graded before/after (h18d)
                lines.append(f"- #{h.decision} {at}: {act}")
                continue
            s = (f"- #{h.decision} {at}: {act}; predicted hit_rate {h.expected_hit_rate}, "
                 f"rows {h.expected_remote_rows}")
            if h.window == START_WINDOW:
                s += "; not measured (no window before it)"
            elif h.correct is None and h.outcome_hit_rate is None:
                s += "; outcome pending"
            else:
                s += (f"; measured hit_rate {100 * (h.hit_delta or 0):+.1f} pt ({h.outcome_hit_rate}), "
                      f"rows {100 * (h.rows_delta or 0):+.0f}% ({h.outcome_remote_rows}): "
                      f"{'correct' if h.correct else 'wrong'}")
            lines.append(s)
        return "\n".join(lines)

    def _examples(self, history: list[HistoryEntry]) -> tuple[list[tuple[str, dict]], int]:
        """(user text, answer) pairs: canned first (a constant prefix), then this run's own; and
        how many of them are this run's own (the last ones).
        The run's facts are stated once, by the first message of this run (its first own
        example, else the question); its later messages open with "Same run." as the canned
        examples of one run do: each repetition of the facts (~150 tokens) was read anew by
        the model per answer (BENCHMARKS.md section 5)."""
        v = self.variant
        if v.examples == "none":
            return [], 0
        if self.judge:
            return self._judge_examples(), 0
        own: list[tuple[str, dict]] = []
        if v.examples == "history" and v.own_block:
            own = self._asked_examples(history)
        elif v.examples == "history":
            for h in reversed(history):
                if len(own) >= v.max_examples // 2:
                    break
                ex = self._own_example(h)
                if ex is not None:
                    own.append(ex)
            own.reverse()
            own = [(self._head(i == 0) + text, ex) for i, (text, ex) in enumerate(own)]
        canned = []
        prev_ctx = None
        for e in CANNED:
            cctx = {**CANNED_CONTEXT, **e.get("context", {})}  # an example may come from another run
            cb = ContextBuilder.__new__(ContextBuilder)
            cb.ctx, cb.variant = as_context(cctx), v
            head = "Same run.\n" if cctx == prev_ctx else cb.static_text() + "\n"
            prev_ctx = cctx
            la = cctx["lookahead"] > 0
            # shaped like a real prompt, whose first one says "Recent decisions: none." (without
            # that line Qwen-0.5B kept at window 0 although it wrote "much missing ahead")
            canned.append((head + self.render_history([]) + "\n" + cb.render_window(e["window"], e["recent"]),
                           {"reason": evidence(e["window"], e["recent"], cctx["capacity"], la)
                            + conclusion(e["answer"]["replace"]), **e["answer"]}))
        # the canned ones all stay (both labels; a prefix the same for every question, which the
        # server keeps in its KV cache), this run's own after them
        return canned[: v.max_examples] + own, len(own)

    def _own_example(self, h: HistoryEntry) -> tuple[str, dict] | None:
        """(the judged window as rendered, the hindsight answer with its evidence reason) of a
        past decision, or None where hindsight does not tell (hindsight_example)."""
        ex = hindsight_example(h, self.ctx.capacity, self.ctx.depth > 0)
        if ex is None:
            return None
        judged = h.judged or {}
        prev = [judged["prev_hit_rate"]] if judged.get("prev_hit_rate") is not None else []
        ex["reason"] = evidence(judged, prev, self.ctx.capacity, self.ctx.depth > 0) + conclusion(ex["replace"])
        return self.render_window(judged, prev), ex

    def _asked_examples(self, history: list[HistoryEntry]) -> list[tuple[str, dict]]:
        """This run's own examples, prefix-stable (issue 16): each judged decision whose hindsight
        answer is clear, as the exact question the trainer was asked (HistoryEntry.asked: its
        "Recent decisions" as they stood then, the window) and that answer, oldest first; only
        those of the asked question's block (OWN_BLOCK decisions by decision number; the asked
        question's number: the newest decision's + 1), after the newest one of the blocks before
        (its window only, not the question: it is read once per block). A trainer's next prompt
        then extends its last one: the question it was asked comes back as an example where that
        question stood (the server kept it), and only the answer's tail and the new question are
        read. At the first question of a block the older examples drop at once (that question
        reads the one kept from before and itself). A decision is judged before the next question as
        a rule (the window that judges it closes during the other trainers' turns), so its
        example appears right after its question; an unclear one is left out, which breaks
        nothing (the next question follows the examples before it). The first example shown
        opens with the run's facts, as the question it was did."""
        v = self.variant
        eligible = []
        for i, h in enumerate(history):
            own = self._own_example(h)
            if own is None or not h.decision:
                continue
            window, ex = own
            asked = h.asked
            if asked is None:  # a record without it (eval windows): the question as it would have read
                asked = self.render_history(history[:i]) + "\n" + window
            eligible.append((h.decision, asked, ex, window))
        if not eligible:
            return []
        block = history[-1].decision // v.own_block  # the asked question's: (newest + 1 - 1) // K
        before = [(window, ex) for d, _, ex, window in eligible if (d - 1) // v.own_block < block]
        shown = before[-1:] + [(asked, ex) for d, asked, ex, _ in eligible if (d - 1) // v.own_block == block]
        return [(self._head(i == 0) + text, ex) for i, (text, ex) in enumerate(shown)]

    def _head(self, first: bool) -> str:
        """How a message of this run opens: the run's facts (first) or "Same run."."""
        return self.static_text() + "\n" if first else "Same run.\n"

    def _judge_examples(self, retrieved: list[dict] | None = None) -> list[tuple[str, dict]]:
        """Canned windows with answers of every kind (keep, replace admitting misses, replace
        admitting any), each reason naming the signals it rests on: they show the format and
        the signals' use, not a rule that settles every window. retrieved: judge-history-3's
        windows of the held-out pool, in place of the canned ones."""
        out, prev_ctx = [], None
        base, canned = self.judge_canned
        if retrieved is not None:
            canned = retrieved
        for e in canned[: self.variant.max_examples]:
            cctx = {**base, **e.get("context", {})}
            cb = ContextBuilder(cctx, self.variant.name, self.history_k)
            head = "Same run.\n" if cctx == prev_ctx else cb.static_text() + "\n"
            prev_ctx = cctx
            answer = name_the_round(e["answer"]) if self.variant.name_round else e["answer"]
            out.append((head + cb.render_history([]) + "\n" + cb.render_window(e["window"], e["recent"]), answer))
        return out

    def retrieved_examples(self, window: dict, recent: Iterable[float | dict] = ()) -> list[dict]:
        """judge-history-3: the held-out pool's windows nearest to `window` (ExamplePool.nearest),
        as canned examples, in ExamplePool.nearest's order."""
        pool = example_pool()
        return [pool.example(i) for i in pool.nearest(window, recent, self.ctx.capacity, self.variant.max_examples)]

    def build(self, window: dict, history: Iterable[HistoryEntry | dict] = (),
              recent: Iterable[float | dict] = ()) -> Prompt:
        hist = [h if isinstance(h, HistoryEntry) else HistoryEntry.model_validate(h) for h in history]
        msgs = [{"role": "system", "content": self.system}]
        recent = list(recent)
        if self.retrieve:
            examples, own = self._judge_examples(self.retrieved_examples(window, recent)), 0
        else:
            examples, own = self._examples(hist)
        for user, answer in examples:
            msgs.append({"role": "user", "content": user})
            msgs.append({"role": "assistant", "content": json.dumps(_ordered(answer, self.variant.reason_first))})
        # the facts once: here unless an example of this run's own stated them already
        asked = "\n".join([self.render_history(hist), self.render_window(window, recent)])
        msgs.append({"role": "user", "content": self._head(own == 0) + asked})
        schema = self.start_schema if window.get("window") == START_WINDOW else self.schema
        return Prompt(msgs, schema, self.hash, self.variant.name, asked, window.get("window"))


def _design_fields(variant: Variant) -> dict:
    """The variant's fields in its prompt hash, less the later ones it leaves off (own_block,
    name_round): the designs of the variants without them hash as before."""
    d = asdict(variant)
    for k in ("own_block", "name_round"):
        if not d[k]:
            del d[k]
    return d


def _ordered(answer: dict, reason_first: bool) -> dict:
    Answer.model_validate(answer)  # canned and hindsight examples must themselves be valid
    if "admit" in answer:  # the judge variant's order (answer_schema(admission=True))
        return {k: answer[k] for k in ["reason", "replace", "budget", "admit", "expected"]}
    if "evict" in answer:  # judge-history's (answer_schema(staleness=True))
        return {k: answer[k] for k in ["reason", "replace", "budget", "evict", "expected"]}
    keys = ["reason", "replace", "budget", "expected"]
    if not reason_first:
        keys = keys[1:] + keys[:1]
    return {k: answer[k] for k in keys}


def hindsight_example(h: HistoryEntry, capacity: int = 0, lookahead: bool = False) -> dict | None:
    """The answer that was right in hindsight for a past judged window, or None when the one
    branch the run took does not tell (the other branch was never played):
    replaced and hit rate went up -> replace;
    replaced and it did not -> keep, without lookahead (the round's extra rows bought nothing);
      with lookahead unclear (a round adds no rows; the hit rate may have moved for other reasons);
    kept and hit rate held or rose -> keep, without lookahead or when little was missing ahead
      (< 5% of capacity); with much missing ahead unclear (replacing might have done better);
    kept and it fell -> unclear."""
    if h.fallback or h.judged is None or h.outcome_hit_rate is None:
        return None
    if h.replace:
        good = h.outcome_hit_rate == "up"
        if not good and lookahead:
            return None
        return {
            "reason": "replacing here raised the hit rate" if good else "a replacement here did not raise the hit rate",
            "replace": good, "budget": (h.budget or "medium") if good else "small",
            "expected": {"hit_rate": "up" if good else "flat",
                         "remote_rows": (h.outcome_remote_rows or "down") if good else "flat"},
        }
    if h.outcome_hit_rate == "down":
        return None
    missing = (h.judged or {}).get("lookahead_missing")
    if lookahead and (missing is None or missing >= LOOKAHEAD_SMALL * max(1, capacity)):
        return None
    return {"reason": "keeping the buffer held the hit rate", "replace": False, "budget": "small",
            "expected": {"hit_rate": h.outcome_hit_rate, "remote_rows": h.outcome_remote_rows or "flat"}}


__all__ = ["ContextBuilder", "JUDGE_VARIANTS", "PAST_VARIANTS", "RETRIEVE_VARIANTS", "Prompt", "VARIANTS", "Variant",
           "get_variant", "hindsight_example", "as_context",
           # re-exported: the tolerances and budget shares prompts and the eval share
           "direction", "HIT_TOL", "ROWS_TOL", "BUDGET_SHARE"]
