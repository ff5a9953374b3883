"""Typed messages between the agent and the trainer (pydantic; every field described).

Answer        what the model must emit (JSON, schema-constrained, validated; never parsed from text)
Decision      one decision as recorded (DECISION_FIELDS of rudder.records), fallbacks included
HistoryEntry  a past decision with its measured outcome, as shown to the model in later prompts
"""
from __future__ import annotations

import time
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rudder.records import DECISION_FIELDS

Direction = Literal["up", "down", "flat"]
# The window id of the start decision: judged before the first minibatch, on the initial buffer
# and the minibatches already sampled ahead (no metrics window has closed yet).
START_WINDOW = -1
Budget = Literal["small", "medium", "large"]
# Which rows a lookahead round admits: only the minibatch's misses (no extra network rows), or any
# node the sampled-ahead minibatches need (rows pulled ahead of use: link time now, misses saved
# later). The `judge` prompt variant lets the model choose it; the others leave it to the config.
Admit = Literal["misses", "any"]
ADMITS: tuple[str, ...] = get_args(Admit)  # a lookahead round's admission words
# Which slots a history-only (MassiveGNN) round counts stale: `stale` = not hit for
# prefetch.period minibatches (the mechanism's own), `half` = for half as long (more slots free).
# The `judge-history` prompt variant lets the model choose it per round (issue 18's "which
# slots"); the others leave it to prefetch.evict. Multiples: rudder.prefetch.policy.EVICT_PERIODS.
Evict = Literal["stale", "half"]
EVICT_WORDS = ("stale", "half")

# Share of buffer capacity one replacement round may change, per budget word. With lookahead and
# demand admission a round adds no network rows and costs about the same time whatever it swaps
# (benchmarks/bench_buffer.py), so the large budget lifts the cap: the round swaps all that Belady's
# rule on the sampled-ahead window wants. Trace replays (BENCHMARKS.md section 7) found per-round
# caps of 20% and below costing up to 2% more rows than no cap on the small graph. Without
# lookahead (or with admit=any) a round's rows are extra network rows: large = a full MassiveGNN
# round, as the fixed policy runs; small and medium bound what one wrong answer fetches.
BUDGET_SHARE: dict[str, float] = {"small": 0.05, "medium": 0.2, "large": 1.0}


def budget_text() -> str:
    """'small = 5%, medium = 20%, large = 100%' (the system message's line, from BUDGET_SHARE)."""
    return ", ".join(f"{k} = {100 * v:.0f}%" for k, v in BUDGET_SHARE.items())


# A short reason keeps latency low and the answer inside max_tokens (160 by default) even when a
# small model degenerates into one-character tokens ("1.1.1..." was seen with SmolLM2).
REASON_MAX_CHARS = 100
# The grammar allows this much text before the conclusion: the evidence form of the examples
# needs ~50 characters, and a degenerate small model fills whatever room it gets, one token per
# character, so more room would push its answer past max_tokens.
REASON_HEAD_CHARS = 70


def budget_rows(budget: str, capacity: int) -> int:
    """Rows a budget word allows in one replacement round (rudder.prefetch.policy.budget_rows of
    its share)."""
    from rudder.prefetch.policy import budget_rows as share_rows  # torch: not for every importer

    return share_rows(BUDGET_SHARE[budget], capacity)


class Expected(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hit_rate: Direction = Field(description="predicted change of the buffer hit rate next window")
    remote_rows: Direction = Field(description="predicted change of rows fetched over the network")


def conclusion(replace: bool, round_: tuple[str, str] | None = None) -> str:
    """How a reason must end: its conclusion, which the `replace` field then states as data.
    round_ (budget, evict): a replace that names its round, ": replace <budget>/<evict>"
    (answer_schema(name_round=True))."""
    if not replace:
        return ": keep"
    return f": replace {'/'.join(round_)}" if round_ else ": replace"


def name_the_round(answer: dict) -> dict:
    """The answer with a replace's conclusion naming its round (": replace large/half"): the
    examples of a variant whose grammar binds budget and evict to that conclusion."""
    if not answer["replace"]:
        return answer
    head = answer["reason"].removesuffix(conclusion(True))
    return {**answer, "reason": head + conclusion(True, (answer["budget"], answer["evict"]))}


class Answer(BaseModel):
    """The model's answer. The schema handed to llama.cpp is built from the same fields.
    The reason ends with its conclusion (": replace" / ": keep"), and `replace` must agree with
    it: a small model otherwise sometimes writes "much missing ahead: replace" and then
    "replace": false. The grammar makes the two agree as the model writes (answer_schema); this
    check catches a server that ignores the schema. A replace may name its round in the
    conclusion (": replace small/half"); then budget and evict must be that round."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(max_length=REASON_MAX_CHARS, description="one short sentence ending in its conclusion")
    replace: bool = Field(description="run a replacement round now")
    budget: Budget = Field(description="how many rows the round may change")
    admit: Admit | None = Field(None, description="rows a lookahead round admits (judge variant); "
                                "None = the config's prefetch.admit")
    evict: Evict | None = Field(None, description="which slots a history-only round counts stale "
                                "(judge-history variant); None = the config's prefetch.evict")
    expected: Expected

    @model_validator(mode="after")
    def _reason_concludes_the_decision(self) -> "Answer":
        named = conclusion(True, (self.budget, self.evict)) if self.replace and self.evict else None
        if not (self.reason.endswith(conclusion(self.replace)) or (named and self.reason.endswith(named))):
            raise ValueError(f"reason must end with {named or conclusion(self.replace)!r} when replace is "
                             f"{str(self.replace).lower()}" + (f", budget {self.budget} and evict {self.evict}"
                                                                if named else "") + f": {self.reason!r}")
        return self


# The evidence form the examples' reasons take (rudder.agent.signals.evidence), as a pattern:
# the hit-rate trend (or level in a first window), the mechanism, how much is missing ahead.
EVIDENCE_TREND = "(hit rate (rising|steady|falling|[0-9]{1,3}%), )?"
EVIDENCE_LOOKAHEAD = "lookahead (on(, (much|little) missing ahead)?|off)"
EVIDENCE_PATTERN = EVIDENCE_TREND + EVIDENCE_LOOKAHEAD


def answer_schema(reason_first: bool = True, evidence_reason: bool = False, measured: bool = True,
                  admission: bool = False, staleness: bool = False, name_round: bool = False) -> dict[str, Any]:
    """JSON schema of Answer, properties in generation order (llama.cpp's grammar follows it).
    reason_first lets the model write its reasoning before it commits to the decision.
    Two alternatives, one per decision: the reason's closing words fix `replace` (reason first),
    or `replace` fixes how the reason must end (decision first), so the two always agree.
    evidence_reason: the reason must take the evidence form itself (EVIDENCE_PATTERN), not only
    end with the conclusion: a small model then cannot drift into copying other prompt text.
    measured=False (the start decision: no window has closed): the evidence has no hit rate, so
    the model cannot state a trend it has not seen.
    admission: the answer also chooses `admit` (misses|any), after the budget.
    staleness: the answer also chooses `evict` (stale|half: which slots a history-only round
    may take), after the budget (and admit).
    name_round (with staleness): a replace's conclusion names its round (": replace small/half")
    and budget and evict are then that round: one alternative per round, as `replace` is bound
    to the conclusion. Without it a small model wrote "best round small/half saved 3.5%, a round
    pays: replace" and then "evict": "stale" (6-8 of 24-32 SmolLM2 replaces, BENCHMARKS 7zc)."""
    if name_round and not (staleness and reason_first):
        raise ValueError("name_round binds budget and evict to a reason written first: it needs "
                         "staleness and reason_first")
    direction = {"type": "string", "enum": ["up", "down", "flat"]}
    order = ["reason", "replace", "budget", "expected"]
    if not reason_first:
        order = ["replace", "budget", "expected", "reason"]
    if admission:
        order.insert(order.index("budget") + 1, "admit")
    if staleness:
        order.insert(order.index("expected"), "evict")
    # the evidence form, or any short text without quotes, backslashes or line breaks (nothing
    # JSON must escape); then the conclusion
    evidence = EVIDENCE_PATTERN if measured else EVIDENCE_LOOKAHEAD
    head = evidence if evidence_reason else f'[^"\\\\\\n\\r\\t]{{0,{REASON_HEAD_CHARS}}}'
    alternatives = []
    rounds = [(b, e) for b in BUDGET_SHARE for e in EVICT_WORDS] if name_round else [None]
    for replace, rnd in [(True, r) for r in rounds] + [(False, None)]:
        props: dict[str, Any] = {
            "reason": {"type": "string",
                       "pattern": f"^{head}{conclusion(replace, rnd)}$"},
            "replace": {"type": "boolean", "const": replace},
            "budget": {"type": "string", "enum": list(BUDGET_SHARE)},
            "admit": {"type": "string", "enum": ["misses", "any"]},
            "evict": {"type": "string", "enum": list(EVICT_WORDS)},
            "expected": {
                "type": "object",
                "properties": {"hit_rate": direction, "remote_rows": direction},
                "required": ["hit_rate", "remote_rows"],
                "additionalProperties": False,
            },
        }
        if rnd:
            props["budget"], props["evict"] = ({"type": "string", "const": w} for w in rnd)
        alternatives.append({
            "type": "object",
            "properties": {k: props[k] for k in order},
            "required": order,
            "additionalProperties": False,
        })
    return {"anyOf": alternatives}


class Decision(BaseModel):
    """One decision, from the model or a fallback. `to_record()` gives exactly DECISION_FIELDS."""

    decision: int = Field(0, description="sequence number within the trainer (agent#n)")
    window: int | None = Field(None, description="id of the window the decision judged")
    decided_step: int | None = Field(None, description="latest global step seen when the answer came")
    applied_step: int | None = Field(None, description="global step whose plan() picked it up")
    staleness: int | None = Field(None, description="applied_step - last step of the judged window")
    policy: str = "agent"
    model: str = ""
    backend: str = ""
    prompt_hash: str = ""
    raw: str = Field("", description="the model's raw text (cut to 2000 chars)")
    replace: bool = False
    budget: Budget | None = None
    admit: Admit | None = Field(None, description="the answer's admission (None: the config's)")
    evict: Evict | None = Field(None, description="the answer's stale threshold word (None: the config's)")
    expected_hit_rate: Direction | None = None
    expected_remote_rows: Direction | None = None
    reason: str = ""
    latency_s: float | None = None
    fallback: str | None = Field(None, description="policy that applied instead (bad/late answer)")
    outcome_hit_rate: Direction | None = Field(None, description="measured direction next window")
    outcome_remote_rows: Direction | None = Field(None, description="measured direction of fetched rows")
    outcome_hit_delta: float | None = Field(None, description="measured hit-rate change (0..1 units)")
    outcome_rows_delta: float | None = Field(
        None, description="measured relative change of fetched rows per minibatch")
    correct: bool | None = Field(None, description="both predicted directions came true")
    cf_rows_saved: int | None = Field(None, description="counterfactual: rows the alternative "
                                      "fetches minus rows this decision fetched (set after the run)")
    cf_replace_share: float | None = Field(None, description="counterfactual: rows replacing saves "
                                           "vs keeping, share of the horizon's remote rows")
    correct_cf: bool | None = Field(None, description="the action was right by the counterfactual")
    created_at: float = Field(default_factory=time.time)

    @classmethod
    def from_answer(cls, ans: Answer, **kw) -> "Decision":
        return cls(replace=ans.replace, budget=ans.budget, admit=ans.admit, evict=ans.evict,
                   expected_hit_rate=ans.expected.hit_rate,
                   expected_remote_rows=ans.expected.remote_rows, reason=ans.reason, **kw)

    def to_record(self) -> dict[str, Any]:
        d = self.model_dump()
        rec = {k: d[k] for k in DECISION_FIELDS}
        if self.admit is not None:  # not a column: the results store keeps it in `extra`
            rec["admit"] = self.admit
        if self.evict is not None:  # the same (DecisionRecord.evict, an extra)
            rec["evict"] = self.evict
        return rec

    def admission(self, default: str) -> str:
        """Which rows this decision's round admits: the answer's choice, else `default`."""
        return self.admit or default


class HistoryEntry(BaseModel):
    """A past decision and what happened after it (shown to the model; also eval input)."""

    model_config = ConfigDict(extra="ignore")
    decision: int = 0
    window: int | None = None
    replace: bool = False
    budget: Budget | None = None
    admit: Admit | None = None
    evict: Evict | None = None
    rows: int | None = Field(None, description="rows the budget allowed")
    expected_hit_rate: Direction | None = None
    expected_remote_rows: Direction | None = None
    fallback: str | None = None
    staleness: int | None = None
    hit_delta: float | None = Field(None, description="measured hit-rate change (0..1 units)")
    rows_delta: float | None = Field(None, description="measured relative change of fetched rows")
    outcome_hit_rate: Direction | None = None
    outcome_remote_rows: Direction | None = None
    correct: bool | None = None
    judged: dict[str, Any] | None = Field(None, description="the window the decision judged")
    asked: str | None = Field(None, description="the question's text as the trainer asked it, after "
                              "its opening (Prompt.asked): the `default` prompt's own example of this "
                              "window repeats it exactly, so the next prompt extends the last one")
