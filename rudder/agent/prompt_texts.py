"""The texts of the prompt variants (rudder.agent.context builds the prompts from them): the
system messages, the answer formats, the run facts' template and the canned examples of the
`default` and `judge` families. The history-only variants' canned windows and example pool live in
rudder.agent.history_examples; a window's signals and their words in rudder.agent.signals.

Every prompt is pinned byte for byte (tests/test_step_contract.py): a change here changes the
prompts, and so the models' answers; re-pin only for an intended change.
"""
from __future__ import annotations

from typing import Any

from rudder.agent.messages import budget_text
from rudder.agent.signals import LOOKAHEAD_PAST_ORDER


# The system message and the canned examples are the same for every run, rank and window, so
# llama.cpp keeps their KV cache from call to call (and across the trainers sharing a node's
# server): only the last user message (run facts, history, window) is evaluated per decision.
# Prefill dominates latency on CPUs, so the text is kept short.
SYSTEM_TEMPLATE = f"""\
You steer the remote-feature buffer of one trainer in distributed GNN training.
Each minibatch pulls the features of its remote input nodes over the network unless the buffer holds them.
Metrics of a window of minibatches:
- hit_rate: remote input rows served by the buffer / all remote input rows (higher is better)
- fetched rows: rows pulled over the network per minibatch = misses + rows admitted by replacements
- stale slots: buffer slots not hit for a long time
- lookahead missing: remote nodes of the next minibatches (already sampled) that the buffer lacks
Action: replace or keep; it holds until your next decision (one per window).
- lookahead on: replace runs a round before EVERY minibatch until your next decision; a round puts nodes the next minibatches need, taken from rows that minibatch fetches anyway, into slots they do not need (at most the budget per round). It adds no network rows. keep runs none.
- lookahead off: replace runs one round now: stale slots get the most-missed nodes, fetched as extra rows (at most the budget).
Budget per round: {budget_text()} of capacity.
Rules of thumb:
- First check whether lookahead is on or off.
- lookahead on: replacing costs no rows and follows what is known to come: replace with the large budget when much is missing ahead (5% of capacity or more); keep when little is.
- lookahead off: minibatches are shuffled, so nodes missed in the past rarely come back soon and the extra rows seldom pay: keep.
- After a useful replacement expect hit_rate up and fetched rows down; after keeping, expect flat.
- If a past prediction failed, change course.
Answer with one JSON object; "remote_rows" in it means fetched rows:"""

# The facts every trainer of a run shares come first, then this trainer's: the trainers of a node
# take turns on one model server, whose KV cache then still holds the shared part from the other
# trainer's question (only the rest is read anew per answer).
RUN_TEMPLATE = """\
Run: graph {num_nodes:,} nodes, {num_parts} partitions; minibatch {batch_size} seeds, fanouts {fanouts}; {steps_per_epoch} minibatches per epoch, {epochs} epochs; window {window} minibatches; {lookahead_text}; rank {rank} of {num_trainers}, partition {part_id} ({partition_nodes:,} nodes, {halo_nodes:,} halo nodes); buffer capacity {capacity:,} rows ({cap_share} of halo); budgets: small {small:,} rows, medium {medium:,}, large {large:,}."""

ANSWER_REASON_FIRST = (
    '{"reason": "hit rate rising|steady|falling, lookahead on, much|little missing ahead | lookahead off: replace|keep", "replace": true|false, "budget": "small"|"medium"|"large", '
    '"expected": {"hit_rate": "up"|"down"|"flat", "remote_rows": "up"|"down"|"flat"}}'
)
ANSWER_DECISION_FIRST = (
    '{"replace": true|false, "budget": "small"|"medium"|"large", '
    '"expected": {"hit_rate": "up"|"down"|"flat", "remote_rows": "up"|"down"|"flat"}, "reason": "hit rate rising|steady|falling, lookahead on, much|little missing ahead | lookahead off"}'
)

# The run the canned examples pretend to come from (fixed, so their KV cache is reused).
CANNED_CONTEXT = dict(rank=0, num_trainers=4, part_id=0, num_parts=4, num_nodes=2_000_000,
                      partition_nodes=500_000, halo_nodes=40_000, capacity=10_000, batch_size=1000,
                      fanouts=[10, 25], steps_per_epoch=120, epochs=3, feat_dim=100, feat_bytes=400,
                      window=10, lookahead=3)

# Canned examples: simple windows, in a non-alternating order (a small model otherwise continues
# the alternation), two of them close to the 5% line between much and little missing ahead (8%:
# replace, 4%: keep; with only far-off "much" examples Qwen-0.5B kept at 10%). Their reasons are
# written by `evidence` (below), so the model learns to restate the current window's evidence
# before it commits to a decision.
CANNED: list[dict[str, Any]] = [
    {
        "window": {"window": 4, "first_step": 40, "last_step": 49, "minibatches": 10, "hit_rate": 0.31,
                   "remote_rows": 120000, "fetched_rows": 82800, "replaced_rows": 0, "stale_slots": 7200,
                   "buffer_fill": 10000, "lookahead_missing": 9000, "lookahead_rows": 1500},
        "recent": [0.45, 0.38],
        "answer": {"replace": True, "budget": "large",
                   "expected": {"hit_rate": "up", "remote_rows": "down"}},
    },
    {   # another run, lookahead off: a MassiveGNN round's extra rows rarely pay on shuffled minibatches
        "context": {"lookahead": 0, "rank": 1, "part_id": 1},
        "window": {"window": 7, "first_step": 70, "last_step": 79, "minibatches": 10, "hit_rate": 0.41,
                   "remote_rows": 120000, "fetched_rows": 70800, "replaced_rows": 0, "stale_slots": 6100,
                   "buffer_fill": 10000, "lookahead_missing": None, "lookahead_rows": None},
        "recent": [0.44, 0.43],
        "answer": {"replace": False, "budget": "small",
                   "expected": {"hit_rate": "flat", "remote_rows": "flat"}},
    },
    {
        "window": {"window": 9, "first_step": 90, "last_step": 99, "minibatches": 10, "hit_rate": 0.64,
                   "remote_rows": 120000, "fetched_rows": 43200, "replaced_rows": 0, "stale_slots": 800,
                   "buffer_fill": 10000, "lookahead_missing": 400, "lookahead_rows": 100},
        "recent": [0.58, 0.61],
        "answer": {"replace": False, "budget": "small",
                   "expected": {"hit_rate": "flat", "remote_rows": "flat"}},
    },
    {
        "window": {"window": 20, "first_step": 200, "last_step": 209, "minibatches": 10, "hit_rate": 0.22,
                   "remote_rows": 120000, "fetched_rows": 93600, "replaced_rows": 0, "stale_slots": 5500,
                   "buffer_fill": 10000, "lookahead_missing": 800, "lookahead_rows": 500},
        "recent": [0.30, 0.26],
        "answer": {"replace": True, "budget": "large",
                   "expected": {"hit_rate": "up", "remote_rows": "down"}},
    },
    {
        "window": {"window": 12, "first_step": 120, "last_step": 129, "minibatches": 10, "hit_rate": 0.55,
                   "remote_rows": 120000, "fetched_rows": 54500, "replaced_rows": 500, "stale_slots": 1200,
                   "buffer_fill": 10000, "lookahead_missing": 300, "lookahead_rows": 100},
        "recent": [0.55, 0.55],
        "answer": {"replace": False, "budget": "small",
                   "expected": {"hit_rate": "flat", "remote_rows": "flat"}},
    },
]


# ---- the judge variants (issue 18): signals, not a verdict ------------------------------------
JUDGE_SYSTEM = f"""\
You steer the remote-feature buffer of one trainer in distributed GNN training.
Each minibatch pulls the features of its remote input nodes over the network unless the buffer holds them. A minibatch's pull overlaps the previous minibatch's compute: it delays training only by the time it takes beyond the compute time.
Signals of a window of minibatches:
- hit rate: remote input rows served by the buffer / all remote input rows, and its trend in points per window
- fetched rows: rows pulled over the network per minibatch = misses + rows admitted ahead of use, and their trend in % per window
- remote input rows per minibatch and their change since the window before: the stream moving to other parts of the graph
- round cost (lookahead off): the extra rows one round may pull per budget, in minibatches' worth of fetched rows
- link: seconds a minibatch's pull took vs its compute; slack = compute - fetch (negative: the link is saturated and every row pulled delays training)
- stale slots: buffer slots not hit for a long time, share of capacity
- sampled ahead: nodes the next minibatches (already sampled) need that the buffer lacks, share of capacity, and its drift since the window before
Action (holds until your next decision, one per window):
- keep: no replacement round.
- replace: with lookahead on, a round before every minibatch: Belady's rule on the sampled-ahead minibatches puts the nodes needed soonest into slots needed latest; without lookahead, one round now: stale slots get the most-missed nodes, pulled as extra rows.
- budget: most slots one round may change: {budget_text()} of capacity.
- admit (lookahead rounds): misses = only nodes this minibatch pulls anyway (no extra rows); any = also nodes pulled ahead of their use (extra rows now, fewer misses later).
Predict the next window: hit rate and fetched rows up, down or flat.
Answer with one JSON object; "remote_rows" in it means fetched rows:"""

JUDGE_ANSWER = ('{"reason": "<the signals you weigh>: replace|keep", "replace": true|false, '
                '"budget": "small"|"medium"|"large", "admit": "misses"|"any", '
                '"expected": {"hit_rate": "up"|"down"|"flat", "remote_rows": "up"|"down"|"flat"}}')

JUDGE_CANNED: list[dict[str, Any]] = [
    {
        "window": {"window": 6, "first_step": 30, "last_step": 39, "minibatches": 10, "hit_rate": 0.36,
                   "remote_rows": 120000, "fetched_rows": 76800, "replaced_rows": 0, "stale_slots": 4100,
                   "buffer_fill": 10000, "lookahead_missing": 2600, "lookahead_rows": 2600,
                   "t_fetch": 0.91, "t_minibatch": 1.51},
        "recent": [{"hit_rate": 0.44, "lookahead_missing": 1500}, {"hit_rate": 0.40, "lookahead_missing": 1900}],
        "answer": {"reason": "hit rate falling, link saturated, 26% of capacity lacking ahead: replace",
                   "replace": True, "budget": "large", "admit": "misses",
                   "expected": {"hit_rate": "up", "remote_rows": "down"}},
    },
    {
        "window": {"window": 11, "first_step": 60, "last_step": 69, "minibatches": 10, "hit_rate": 0.61,
                   "remote_rows": 120000, "fetched_rows": 46800, "replaced_rows": 0, "stale_slots": 900,
                   "buffer_fill": 10000, "lookahead_missing": 300, "lookahead_rows": 300,
                   "t_fetch": 0.21, "t_minibatch": 0.81},
        "recent": [{"hit_rate": 0.60, "lookahead_missing": 320}, {"hit_rate": 0.61, "lookahead_missing": 310}],
        "answer": {"reason": "hit rate steady, few stale slots, 3% lacking ahead, no drift: keep",
                   "replace": False, "budget": "small", "admit": "misses",
                   "expected": {"hit_rate": "flat", "remote_rows": "flat"}},
    },
    {
        "window": {"window": 15, "first_step": 100, "last_step": 109, "minibatches": 10, "hit_rate": 0.48,
                   "remote_rows": 120000, "fetched_rows": 62400, "replaced_rows": 0, "stale_slots": 2500,
                   "buffer_fill": 10000, "lookahead_missing": 1800, "lookahead_rows": 1800,
                   "t_fetch": 0.18, "t_minibatch": 0.78},
        "recent": [{"hit_rate": 0.50, "lookahead_missing": 900}, {"hit_rate": 0.49, "lookahead_missing": 1200}],
        "answer": {"reason": "link slack 0.42 s, drift up, 18% lacking ahead: replace",
                   "replace": True, "budget": "medium", "admit": "any",
                   "expected": {"hit_rate": "up", "remote_rows": "up"}},
    },
]


# ---- judge-past: judge (lookahead on) with the lookahead rounds' past counterfactual ---------
# judge's windows plus one measured past fact, as judge-history-2b gives history-only runs: the
# window just closed, replayed from the buffer as it was at its start with a lookahead round
# before every minibatch (each budget and admit word) and without (rudder.prefetch.past; window
# fields past_keep_fetched, past_fetched_<budget>_<admit>). Under judge and default SmolLM2 kept at
# 7 and 12 of stationary's 12 windows where a round saves ~10% of rows (BENCHMARKS 7p). judge's
# three windows with that fact added; each reason quotes its best round first; no own history (as 2b).
JUDGE_PAST_SYSTEM = JUDGE_SYSTEM.replace(
    "Action (holds until",
    "- lookahead rounds, replayed: the window just closed played again from the buffer as it was at its start, "
    "with a round before every minibatch (each budget and admit word) and without: the share of the window's "
    "fetched rows those rounds would have saved, or cost. Measured on the past, not a forecast\n"
    "Action (holds until")
# judge's windows, keep first (small models copy the last example), each round replayed with
# either admission; `misses` is the best admission in all three, as it is in rows on the streams
# measured (BENCHMARKS 7q: with an example where `any` was best, SmolLM2 answered any everywhere)
JUDGE_PAST_CANNED: list[dict[str, Any]] = [
    {**ex, "window": {**ex["window"], "past_minibatches": 10, "past_keep_fetched": ex["window"]["fetched_rows"],
                      **{f"past_fetched_{b}_{a}": v for (b, a), v in zip(LOOKAHEAD_PAST_ORDER, rows)}},
     "answer": {**ex["answer"], **answer}}
    for ex, rows, answer in zip([JUDGE_CANNED[i] for i in (1, 2, 0)], [
        (46800, 46760, 46740, 47300, 47900, 48200),
        (61200, 58300, 57200, 61500, 59900, 60100),
        (74900, 70600, 68400, 75800, 74100, 78000),
    ], [
        {"reason": "best large/misses saved 0.1%, hit rate steady, 3% lacking ahead: keep", "admit": "misses"},
        {"reason": "best large/misses saved 8.3%, link slack 0.42 s, drift up: replace",
         "budget": "large", "admit": "misses"},
        {"reason": "best large/misses saved 10.9%, hit rate falling, link saturated: replace",
         "budget": "large", "admit": "misses"},
    ])
]


JUDGE_HISTORY_SYSTEM = f"""\
You steer the remote-feature buffer of one trainer in distributed GNN training.
Each minibatch pulls the features of its remote input nodes over the network unless the buffer holds them. Nothing is sampled ahead: only the past is known.
Signals of a window of minibatches:
- hit rate: remote input rows served by the buffer / all remote input rows, and its trend in points per window
- fetched rows: rows pulled over the network per minibatch = misses + rows a round pulls, and their trend in % per window
- remote input rows per minibatch and their change since the window before
- missed nodes: distinct halo nodes missed in the window, the share of them also missed in the window before, and the overlap (Jaccard) of the two windows' missed sets: high = the same nodes keep missing, low = the stream moved
- round cost: the extra rows one round may pull per budget, in minibatches' worth of fetched rows
- stale slots: buffer slots not hit for the run's period of minibatches (a round can only replace these), share of capacity; and the slots stale at half that period
- link (where measured): seconds a minibatch's pull took vs its compute; slack = compute - fetch
Action (holds until your next decision, one per window):
- replace: one round now: stale slots get the most-missed nodes, pulled as extra rows. It pays when those nodes are hit again before they go stale.
- keep: no round.
- budget: most slots the round may change: {budget_text()} of capacity.
- evict: which slots the round may take: stale = those not hit for the period; half = also those not hit for half the period (more slots free, the least hit first).
Predict the next window: hit rate and fetched rows up, down or flat.
Answer with one JSON object; "remote_rows" in it means fetched rows:"""

JUDGE_HISTORY_ANSWER = ('{"reason": "<the signals you weigh>: replace|keep", "replace": true|false, '
                        '"budget": "small"|"medium"|"large", "evict": "stale"|"half", '
                        '"expected": {"hit_rate": "up"|"down"|"flat", "remote_rows": "up"|"down"|"flat"}}')
# judge-history-2c: a replace names its round in the conclusion (answer_schema(name_round=True))
JUDGE_HISTORY_NAMED_ANSWER = JUDGE_HISTORY_ANSWER.replace(": replace|keep", ": replace <budget>/<evict>|keep")

# ---- judge-history-2 (h18d): the past counterfactual, measured ------------------------------
# judge-history's windows plus one measured past fact: the window just closed, replayed from the
# buffer as it was at its start with one round at its first minibatch (each budget x evict word)
# and without (rudder.sim.replay.BufferReplayer, Policy.past_rounds: window fields
# past_keep_fetched, past_fetched_<budget>_<evict>). With judge-history Qwen2.5-Coder-0.5B kept
# at every window and copied the last example's reason form (BENCHMARKS 7g); here the history
# shows actions only (no before/after "correct"/"wrong"), and the examples alternate
# keep, replace, keep, replace, each reason quoting the window's own past counterfactual.
PAST_SYSTEM = JUDGE_HISTORY_SYSTEM.replace(
    "- link (where measured)",
    "- a round at this window's start, replayed: the window just closed played again from the buffer as it was "
    "at its start, with one round at its first minibatch (each budget and evict word) and without: the share of "
    "the window's fetched rows that round would have saved, or cost. Measured on the past, not a forecast\n"
    "- link (where measured)")
