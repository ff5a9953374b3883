"""ContextBuilder: static facts, window, history and prompt variants."""
import json
import re

import pytest

from rudder.agent.context import VARIANTS, ContextBuilder, direction, hindsight_example
from rudder.agent.messages import REASON_MAX_CHARS, Answer, HistoryEntry, answer_schema, budget_rows, conclusion
from rudder.prefetch.policy import RunContext


def ctx(**kw):
    base = dict(rank=1, num_trainers=4, part_id=1, num_parts=4, num_nodes=200_000, partition_nodes=50_000,
                halo_nodes=40_000, capacity=10_000, batch_size=1000, fanouts=[10, 25], steps_per_epoch=50,
                epochs=3, feat_dim=100, feat_bytes=400, window=10, lookahead=3)
    base.update(kw)
    return RunContext(**base)


WINDOW = {"window": 5, "first_step": 50, "last_step": 59, "minibatches": 10, "hit_rate": 0.31,
          "remote_rows": 120_000, "fetched_rows": 82_800, "replaced_rows": 0, "t_fetch": 0.4, "t_stall": 0.0,
          "t_minibatch": 0.1, "buffer_fill": 10_000, "stale_slots": 7_000, "lookahead_missing": 9_000,
          "lookahead_rows": 1_500}


def test_static_context_has_run_facts_and_budgets():
    b = ContextBuilder(ctx(), "reason-first")
    s = b.static_text()
    for needle in ["200,000 nodes", "4 partitions", "rank 1 of 4", "40,000 halo", "10,000 rows", "25% of halo",
                   "fanouts 10,25", "50 minibatches per epoch", "next 3 minibatches", "window 10"]:
        assert needle in s, needle
    assert f"small {budget_rows('small', 10_000):,} rows" in s and f"large {budget_rows('large', 10_000):,}." in s
    assert "Rules of thumb" in b.system and "hit_rate" in b.system
    p = b.build(WINDOW)
    assert p.messages[-1]["content"].startswith(s)
    # the system message is the same for every run: its KV cache is reused across calls/ranks
    assert ContextBuilder(ctx(capacity=7, rank=3), "reason-first").build(WINDOW).messages[0] == p.messages[0]


def test_window_lines_trend_and_lookahead():
    b = ContextBuilder(ctx(), "reason-first")
    text = b.render_window(WINDOW, [0.45, 0.38])
    assert "minibatches 50-59 (60 of 150 done)" in text
    assert "hit_rate 31.0%, falling (-7.0 pt" in text
    assert "fetched rows per minibatch 8,280 of 12,000" in text
    assert "stale slots 7,000 of 10,000 (70%)" in text
    assert "lookahead missing 9,000 nodes (90% of capacity: much)" in text
    # a lookahead round admits rows the minibatch fetches anyway: no "would fetch N rows" claim
    assert "would fetch" not in text
    no_la = ContextBuilder(ctx(lookahead=0), "reason-first")
    assert "lookahead:" not in no_la.render_window(WINDOW)
    assert "lookahead off" in no_la.static_text()


def test_variants_schema_order_and_examples():
    zs = ContextBuilder(ctx(), "zero-shot").build(WINDOW)
    for alt in zs.schema["anyOf"]:
        assert list(alt["properties"])[0] == "replace" and list(alt["properties"])[-1] == "reason"
    assert len(zs.messages) == 2  # system + user, no examples
    rf = ContextBuilder(ctx(), "reason-first").build(WINDOW)
    assert all(list(alt["properties"])[0] == "reason" for alt in rf.schema["anyOf"])
    d = ContextBuilder(ctx(), "default").build(WINDOW)
    assert [m["role"] for m in d.messages] == ["system"] + ["user", "assistant"] * 4 + ["user"]
    for m in d.messages[2:-1:2]:
        a = json.loads(m["content"])
        Answer.model_validate(a)
        assert list(a)[0] == "reason"
    labels = [json.loads(m["content"])["replace"] for m in d.messages[2:-1:2]]
    assert labels != [True, False, True, False] and set(labels) == {True, False}
    assert "signals:" in ContextBuilder(ctx(), "signals").build(WINDOW).messages[-1]["content"]
    with pytest.raises(ValueError, match="valid: zero-shot"):
        ContextBuilder(ctx(), "nope")


def test_prompt_hash_identifies_design_not_data():
    a = ContextBuilder(ctx(), "default").build(WINDOW)
    b = ContextBuilder(ctx(capacity=5), "default").build({**WINDOW, "hit_rate": 0.9})
    c = ContextBuilder(ctx(), "zero-shot").build(WINDOW)
    assert a.hash == b.hash != c.hash
    assert set(VARIANTS) >= {"zero-shot", "reason-first", "default"}


def test_history_rendered_with_outcomes_and_used_as_examples():
    judged = dict(WINDOW, window=3, hit_rate=0.30)
    h = [
        HistoryEntry(decision=1, window=3, replace=True, budget="medium", rows=500, expected_hit_rate="up",
                     expected_remote_rows="down", hit_delta=0.04, rows_delta=-0.08, outcome_hit_rate="up",
                     outcome_remote_rows="down", correct=True, judged=judged),
        HistoryEntry(decision=2, window=4, fallback="static"),
        HistoryEntry(decision=3, window=5, replace=False, budget="small", expected_hit_rate="flat",
                     expected_remote_rows="flat"),
    ]
    p = ContextBuilder(ctx(), "default", history=4).build(WINDOW, h, [0.4])
    user = p.messages[-1]["content"]
    assert "#1 window 3: replace medium (500 rows); predicted hit_rate up, rows down" in user
    assert "measured hit_rate +4.0 pt (up), rows -8% (down): correct" in user
    assert "#2 window 4: no valid answer, static applied" in user
    assert "#3 window 5: keep" in user and "outcome pending" in user
    # the judged window of #1 became an in-context example, labelled by hindsight (replace paid)
    ex_users = [m["content"] for m in p.messages[1:-1:2]]
    assert any("Window 3" in u for u in ex_users)
    assert len(p.messages) == 1 + 2 * (4 + 1) + 1  # the 4 canned examples and this run's one
    # history_k limits what is shown
    p1 = ContextBuilder(ctx(), "reason-first", history=1).build(WINDOW, h)
    assert "#1 window" not in p1.messages[-1]["content"] and "#3 window" in p1.messages[-1]["content"]


def test_hindsight_labels():
    base = dict(decision=1, window=1, judged=WINDOW, correct=False, outcome_remote_rows="up")
    assert hindsight_example(HistoryEntry(replace=True, budget="large", outcome_hit_rate="up", **base))["replace"]
    assert not hindsight_example(HistoryEntry(replace=True, outcome_hit_rate="flat", **base))["replace"]
    assert not hindsight_example(HistoryEntry(replace=False, outcome_hit_rate="up", **base))["replace"]
    assert hindsight_example(HistoryEntry(replace=False, outcome_hit_rate="down", **base)) is None


def test_hindsight_examples_only_where_one_branch_tells():
    """With lookahead a round adds no rows, so a replacement whose hit rate did not rise, or a
    kept window with much missing ahead, says nothing about the other branch: no example."""
    base = dict(decision=1, window=1, judged=WINDOW, correct=False, outcome_remote_rows="flat")
    cap = 10_000  # WINDOW misses 9,000 ahead: 90% of capacity
    up = HistoryEntry(replace=True, budget="large", outcome_hit_rate="up", **base)
    assert hindsight_example(up, cap, lookahead=True)["replace"]
    flat = HistoryEntry(replace=True, outcome_hit_rate="flat", **base)
    assert hindsight_example(flat, cap, lookahead=True) is None
    assert hindsight_example(flat, cap, lookahead=False)["replace"] is False  # extra rows bought nothing
    kept = HistoryEntry(replace=False, outcome_hit_rate="up", **base)
    assert hindsight_example(kept, cap, lookahead=True) is None
    assert hindsight_example(kept, cap, lookahead=False)["replace"] is False
    little = HistoryEntry(replace=False, outcome_hit_rate="flat",
                          **{**base, "judged": {**WINDOW, "lookahead_missing": 300}})
    assert hindsight_example(little, cap, lookahead=True)["replace"] is False


def test_reason_ends_with_the_deciding_facts():
    from rudder.agent.signals import evidence

    assert evidence(WINDOW, [0.38], 10_000, lookahead=True) == "hit rate falling, lookahead on, much missing ahead"
    assert evidence({**WINDOW, "lookahead_missing": 499}, [0.38], 10_000, lookahead=True).endswith("little missing ahead")
    assert evidence(WINDOW, [0.38], 10_000, lookahead=False) == "hit rate falling, lookahead off"
    system = ContextBuilder(ctx(), "default").system
    assert "lookahead on: replacing costs no rows" in system and "lookahead off" in system


def test_direction_tolerance():
    assert direction(0.009, 0.01) == "flat" and direction(0.011, 0.01) == "up"
    assert direction(-0.03, 0.02) == "down" and direction(None, 0.01) is None


def test_context_from_dict_fills_missing():
    b = ContextBuilder({"capacity": 100, "halo_nodes": 400, "lookahead": 2}, "default")
    assert "100 rows (25% of halo)" in b.static_text()
    assert all(alt["required"][0] == "reason" for alt in answer_schema(True)["anyOf"])


def test_answer_reason_and_decision_must_agree():
    """The reason ends with its conclusion and `replace` states the same: the schema's two
    alternatives make the grammar keep them together, and Answer rejects a disagreeing pair."""
    exp = {"hit_rate": "up", "remote_rows": "down"}
    Answer.model_validate({"reason": "much missing ahead: replace", "replace": True, "budget": "large", "expected": exp})
    Answer.model_validate({"reason": "little missing ahead: keep", "replace": False, "budget": "small", "expected": exp})
    for reason, replace in [("much missing ahead: replace", False), ("little missing ahead: keep", True),
                            ("no conclusion", True)]:
        with pytest.raises(ValueError, match="reason must end with"):
            Answer.model_validate({"reason": reason, "replace": replace, "budget": "small", "expected": exp})
    for reason_first in (True, False):
        alts = {alt["properties"]["replace"]["const"]: alt for alt in answer_schema(reason_first)["anyOf"]}
        assert set(alts) == {True, False}
        for replace, alt in alts.items():
            pat = re.compile(alt["properties"]["reason"]["pattern"])
            assert pat.match("hit rate falling, much missing ahead" + conclusion(replace))
            assert not pat.match("hit rate falling, much missing ahead" + conclusion(not replace))
            assert not pat.match('a "quoted" word' + conclusion(replace))  # nothing JSON must escape
            assert not pat.match("x" * REASON_MAX_CHARS + conclusion(replace))  # within maxLength


def test_a_named_round_binds_budget_and_evict():
    """judge-history-2c: a replace's conclusion names its round (": replace small/half") and the
    schema has one replace alternative per round whose budget and evict are that round, so the
    fields cannot name another round than the reason (under 2b SmolLM2 wrote "best round
    small/half ...: replace" and "evict": "stale"); Answer rejects a pair that disagrees, and
    every example the 2c prompt shows is one of its own alternatives."""
    from rudder.agent.history_examples import PAST_CANNED, PAST_CONTEXT
    from rudder.agent.messages import BUDGET_SHARE, EVICT_WORDS, name_the_round

    exp = {"hit_rate": "up", "remote_rows": "down"}
    reason = "best round small/half saved 3.5%, a round pays" + conclusion(True, ("small", "half"))
    assert reason.endswith(": replace small/half")
    Answer.model_validate({"reason": reason, "replace": True, "budget": "small", "evict": "half", "expected": exp})
    for budget, evict in [("small", "stale"), ("medium", "half")]:
        with pytest.raises(ValueError, match=f"budget {budget} and evict {evict}"):
            Answer.model_validate({"reason": reason, "replace": True, "budget": budget, "evict": evict,
                                   "expected": exp})
    with pytest.raises(ValueError, match="reason must end with"):  # a named round is a replace
        Answer.model_validate({"reason": reason, "replace": False, "budget": "small", "evict": "half",
                               "expected": exp})

    schema = answer_schema(True, False, staleness=True, name_round=True)
    rounds = [(b, e) for b in BUDGET_SHARE for e in EVICT_WORDS]
    replaces = [a["properties"] for a in schema["anyOf"] if a["properties"]["replace"]["const"]]
    assert len(schema["anyOf"]) == len(rounds) + 1
    assert sorted((p["budget"]["const"], p["evict"]["const"]) for p in replaces) == sorted(rounds)
    for p in replaces:
        pat = re.compile(p["reason"]["pattern"])
        for b, e in rounds:
            named = "a round pays" + conclusion(True, (b, e))
            assert bool(pat.match(named)) == ((b, e) == (p["budget"]["const"], p["evict"]["const"])), named
        assert not pat.match("a round pays" + conclusion(True))  # the round must be named
    with pytest.raises(ValueError, match="needs staleness"):
        answer_schema(True, False, admission=True, name_round=True)

    c = PAST_CANNED[1]
    p2c = ContextBuilder(PAST_CONTEXT, "judge-history-2c").build(c["window"], [], c["recent"])
    p2b = ContextBuilder(PAST_CONTEXT, "judge-history-2b").build(c["window"], [], c["recent"])
    shown = [json.loads(m["content"]) for m in p2c.messages if m["role"] == "assistant"]
    assert [a for a in shown if a["replace"]] and [a for a in shown if not a["replace"]]
    for a in shown:
        fits = [alt for alt in p2c.schema["anyOf"] if all(
            re.match(v["pattern"], a[k]) if k == "reason" else a[k] == v.get("const", a[k]) and
            a[k] in v.get("enum", [a[k]]) for k, v in alt["properties"].items() if k != "expected")]
        assert len(fits) == 1, a
        assert a["reason"].endswith(": keep" if not a["replace"] else f": replace {a['budget']}/{a['evict']}")
    assert shown == [name_the_round(json.loads(m["content"])) for m in p2b.messages if m["role"] == "assistant"]
    assert p2c.hash != p2b.hash and "replace <budget>/<evict>|keep" in p2c.messages[0]["content"]
    assert len(p2b.schema["anyOf"]) == 2  # 2b unchanged: the fields free after the reason


def test_default_variant_holds_reasons_to_the_examples_form():
    """Variant `default`: the grammar admits only the evidence form, and every example the
    prompt shows (canned and judged in hindsight) is itself in that form; `free-reason` does not."""
    hist = [HistoryEntry(decision=1, window=0, replace=True, budget="large", expected_hit_rate="up",
                         expected_remote_rows="down", outcome_hit_rate="up", outcome_remote_rows="down",
                         hit_delta=0.05, rows_delta=-0.1, correct=True, judged={**WINDOW, "window": 0})]
    p = ContextBuilder(ctx(), "default").build(WINDOW, hist, [0.3])
    alts = {a["properties"]["replace"]["const"]: re.compile(a["properties"]["reason"]["pattern"])
            for a in p.schema["anyOf"]}
    shown = [json.loads(m["content"]) for m in p.messages if m["role"] == "assistant"]
    assert len(shown) == 5 and any(a["replace"] for a in shown) and not all(a["replace"] for a in shown)
    for a in shown:
        assert alts[a["replace"]].match(a["reason"]), a["reason"]
    assert not alts[False].match("hit rate up, rows flat; measured hit_rate +0.6 pt: keep")  # copied prompt text
    assert alts[True].match("lookahead off: replace") and alts[False].match("hit rate 37%, lookahead on: keep")
    free = ContextBuilder(ctx(), "free-reason").build(WINDOW, hist, [0.3]).schema["anyOf"]
    assert all(re.match(a["properties"]["reason"]["pattern"], "any short text" + conclusion(a["properties"]["replace"]["const"]))
               for a in free)


def test_first_window_says_it_has_no_trend():
    b = ContextBuilder(ctx(), "default")
    assert "(first window: no trend yet)" in b.render_window(WINDOW)
    with_trend = b.render_window(WINDOW, [0.35])
    assert "no trend" not in with_trend and "falling (-4.0 pt)" in with_trend


def test_start_prompt_shows_no_measurements_and_its_grammar_no_trend():
    """The start decision (window START_WINDOW, before any minibatch): the prompt states that nothing
    is measured yet, and the grammar admits no hit-rate part in the reason (Qwen-0.5B otherwise
    wrote "hit rate falling" about a window that never ran); later windows keep the full form."""
    from rudder.agent.messages import START_WINDOW

    b = ContextBuilder(ctx(), "default")
    start = {"window": START_WINDOW, "first_step": None, "last_step": -1, "minibatches": 0,
             "buffer_fill": 1000, "stale_slots": 0, "lookahead_missing": 900, "lookahead_rows": 900}
    p = b.build(start)
    text = p.messages[-1]["content"]
    assert "Start of training: no minibatch has run yet" in text and "lookahead missing 900 nodes" in text
    assert "Window" not in text.split("Recent decisions")[1]
    later = b.build(WINDOW, [], [0.3])
    for prompt, trend_ok in ((p, False), (later, True)):
        pat = re.compile(next(a for a in prompt.schema["anyOf"]
                              if a["properties"]["replace"]["const"])["properties"]["reason"]["pattern"])
        assert pat.match("lookahead on, much missing ahead: replace")
        assert bool(pat.match("hit rate falling, lookahead on, much missing ahead: replace")) is trend_ok
    assert p.hash == later.hash  # one prompt design


def test_schedule_ahead_is_said_as_the_rest_of_the_epoch():
    """prefetch.schedule_ahead: the prompt says each epoch is sampled ahead (the first while it trains), not that
    `lookahead` minibatches are; with lookahead 0 the run still looks ahead (the lookahead
    mechanism, the 'lookahead missing' line). Without schedule_ahead the text is as before."""
    from rudder.agent.decision import resolve_fallback
    from rudder.config import WHOLE_EPOCH
    from rudder.prefetch.policy import mechanism_for

    for la in (3, 0):
        c = ctx(lookahead=la, schedule_ahead=True)
        assert c.depth == WHOLE_EPOCH and mechanism_for(c.depth) == "lookahead"
        assert resolve_fallback("auto", c.depth) == "lookahead"
        b = ContextBuilder(c, "reason-first")
        s = b.static_text()
        # h19a: the first epoch starts once 1 + lookahead are sampled; later ones sampled during the one before
        assert f"first epoch's while it trains (it starts once its first {1 + la} are sampled)" in s
        assert "each later epoch's whole while the epoch before trains" in s and "all sampled at its start" not in s
        assert "next 3 minibatches" not in s and "lookahead off" not in s
        assert "lookahead missing 9,000 nodes" in b.render_window(WINDOW, [0.45])
        j = ContextBuilder(c, "judge").render_window(WINDOW, [0.45])
        assert "sampled ahead: the rest of the epoch lacks 9,000 nodes" in j and "next 3" not in j
        # the record says how much of the epoch's rest is sampled so far (it grows in the first epoch)
        j = ContextBuilder(c, "judge").render_window({**WINDOW, "lookahead_minibatches": 12}, [0.45])
        assert "sampled ahead: the next 12 minibatches (all sampled so far, on into the next epoch) lack 9,000 nodes" in j
        # the design hash (templates, schema) is the run's, not the depth's: the KV cache holds
        assert b.hash == ContextBuilder(ctx(), "reason-first").hash
    plain = ContextBuilder(ctx(), "reason-first")
    assert ctx().depth == 3 and ctx(lookahead=0).depth == 0
    assert "next 3 minibatches are sampled ahead" in plain.static_text()
    assert "sampled ahead: the next 3 minibatches lack" in ContextBuilder(ctx(), "judge").render_window(WINDOW, [0.45])
    # eval records (dicts) without the key are runs without schedule_ahead
    from rudder.agent.context import as_context
    assert not as_context({"lookahead": 3}).schedule_ahead and as_context({"schedule_ahead": True}).depth == WHOLE_EPOCH


def test_the_run_context_of_a_replay_says_schedule_ahead():
    from rudder.sim.simulate import parse_policy, run_context
    from rudder.sim.tracegen import random_trace

    t = random_trace(halo=100, minibatches=20, batch=10, epochs=2, seed=1)
    assert run_context(t, parse_policy("lookahead:epoch").prefetch, 10).schedule_ahead
    assert not run_context(t, parse_policy("lookahead:8").prefetch, 10).schedule_ahead
    # a policy that does not sample ahead never schedules ahead, whatever the key says
    pc = parse_policy("static").prefetch.model_copy(update={"schedule_ahead": True})
    assert not run_context(t, pc, 10).schedule_ahead


def _measured(decision: int, window: int, hit: float) -> HistoryEntry:
    return HistoryEntry(decision=decision, window=window, replace=True, budget="large", rows=10_000,
                        expected_hit_rate="up", expected_remote_rows="down", hit_delta=0.05, rows_delta=-0.1,
                        outcome_hit_rate="up", outcome_remote_rows="down", correct=True,
                        judged={**WINDOW, "window": window, "hit_rate": hit, "prev_hit_rate": hit - 0.02})


def test_the_runs_facts_are_stated_once():
    """Issue 16: the model reads whatever follows the cached prefix anew per answer, and each of
    this run's own examples used to repeat the run's facts (~150 tokens). Now the first message
    of this run (its first own example, else the question) states them; the later ones open
    with "Same run." as the canned examples of one run do."""
    b = ContextBuilder(ctx(rank=3, part_id=3), "default")  # the canned examples are ranks 0 and 1
    facts = b.static_text()
    for hist in ([], [_measured(1, 3, 0.3)], [_measured(1, 3, 0.3), _measured(2, 4, 0.35)]):
        p = b.build(WINDOW, hist, [0.3])
        text = "".join(m["content"] for m in p.messages)
        assert text.count(facts) == 1 and text.count("rank 3 of 4") == 1
        users = [m["content"] for m in p.messages if m["role"] == "user"]
        own = users[4:-1]  # after the 4 canned examples
        assert len(own) == len(hist)
        assert (own or users[-1:])[0].startswith(facts)
        # (default: each own example is the question as it was asked, "Recent decisions" first)
        assert all(u.startswith("Same run.\nRecent decisions:") for u in own[1:])
        if own:
            assert users[-1].startswith("Same run.\nRecent decisions:")
    # variants without this run's examples keep the facts in the question
    p = ContextBuilder(ctx(), "few-shot").build(WINDOW, [_measured(1, 3, 0.3)], [0.3])
    assert p.messages[-1]["content"].startswith(ContextBuilder(ctx(), "few-shot").static_text())


def test_the_cached_prefix_is_the_same_for_every_question():
    """The canned examples stay whatever this run's history (its own examples follow them), so
    system text + canned examples are one prefix the node's server keeps cached; and two
    trainers of a run share the run-wide facts before their own (rank, partition, capacity)."""
    hists = [[], [_measured(1, 3, 0.3)], [_measured(1, 3, 0.3), _measured(2, 4, 0.35)]]
    prompts = [ContextBuilder(ctx(), "default").build(WINDOW, h, [0.3]).messages for h in hists]
    for msgs in prompts[1:]:
        assert msgs[:1 + 2 * 4] == prompts[0][:1 + 2 * 4]
    r0 = ContextBuilder(ctx(rank=0, part_id=0, capacity=9_000), "default").static_text()
    r1 = ContextBuilder(ctx(), "default").static_text()
    shared = r0[:next(i for i, (a, b) in enumerate(zip(r0, r1)) if a != b)]
    for fact in ["200,000 nodes", "4 partitions", "minibatch 1000 seeds", "fanouts 10,25",
                 "50 minibatches per epoch", "window 10 minibatches", "next 3 minibatches"]:
        assert fact in shared, fact
    assert shared.endswith("; rank ")


def test_tokens_read_per_question_stay_bounded():
    """What the node's server reads per answer (the prompt after the prefix it holds: the warm-up
    prompt's, or the other trainer's question it answered just before), counted with SmolLM2's
    real tokenizer for a study-like question: 2 trainers of synth-medium, this run's 2 own
    examples and 4 decisions of history. With the facts in every message of the run (and the
    canned examples cut to make room for its own) the two trainers read 1,159 and 1,145
    tokens; with the facts once, run-wide ones first, 863 and 787 (the facts: ~150 tokens)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from rudder.agent.decision import warm_prompt
    from rudder.agent.models import resolve

    tok = llama_cpp.Llama(model_path=str(resolve("smollm2-135m", verify=False)), vocab_only=True, verbose=False)

    def ids(messages):  # SmolLM2's template is ChatML, generation prompt last
        from llama_cpp.llama_chat_format import format_chatml

        return tok.tokenize(format_chatml(messages).prompt.encode(), add_bos=False, special=True)

    def shared(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    run = dict(num_trainers=2, num_parts=2, num_nodes=200_000, batch_size=500, fanouts=[10, 25],
               steps_per_epoch=25, epochs=2, feat_dim=64, feat_bytes=256, window=5, lookahead=8)
    ranks = [ContextBuilder(ctx(rank=r, part_id=r, partition_nodes=100_000 + 1_234 * r,
                                halo_nodes=50_604 - 777 * r, capacity=12_651 - 194 * r, **run), "default")
             for r in (0, 1)]
    hist = [_measured(1, 3, 0.40), _measured(2, 4, 0.45), _measured(3, 5, 0.47), _measured(4, 6, 0.50)]
    w = {**WINDOW, "window": 7, "first_step": 35, "last_step": 39, "minibatches": 5}
    warm = ids(warm_prompt("default").messages)
    q0, q1 = (ids(b.build(w, hist, [0.5]).messages) for b in ranks)
    read0 = len(q0) - shared(q0, warm)
    read1 = len(q1) - max(shared(q1, warm), shared(q1, q0))  # rank 1 asks right after rank 0
    facts = len(tok.tokenize(ranks[0].static_text().encode(), add_bos=False))
    assert 100 < facts < 200
    assert read0 < 950 and read1 < read0 - 50, (read0, read1)  # the run-wide facts came from the cache


def _trainer_prompts(builder, windows, outcome):
    """A trainer's questions in turn, as LLMDecider asks them: each answered (replace large),
    applied and judged before the next question (`outcome(i)`: the hit-rate direction measured,
    None: not measured), its exact question kept (HistoryEntry.asked)."""
    prompts, hist = [], []
    for i, w in enumerate(windows):
        p = builder.build(w, hist, [windows[i - 1]["hit_rate"]] if i else [])
        prompts.append(p)
        o = outcome(i)
        hist.append(HistoryEntry(
            decision=i + 1, window=w["window"], replace=True, budget="large", rows=10_000,
            expected_hit_rate="up", expected_remote_rows="down", asked=p.asked,
            judged={**w, **({"prev_hit_rate": windows[i - 1]["hit_rate"]} if i else {})},
            **({} if o is None else dict(hit_delta=0.02 if o == "up" else -0.02, rows_delta=-0.05,
                                          outcome_hit_rate=o, outcome_remote_rows="down", correct=o == "up"))))
    return prompts


def test_a_trainers_next_prompt_extends_its_last():
    """Issue 16 (prefix-stable prompts): the node's server keeps each trainer's last prompt and
    answer, so what it reads per question is what follows the prefix the next prompt shares with
    it. The run's own examples are the exact questions asked (their "Recent decisions" as they
    stood then), in blocks of OWN_BLOCK decisions: within a block a trainer's next prompt is its
    last prompt (through the question) plus the answer and the new question; a decision whose
    hindsight is unclear (here: replaced, hit rate fell, lookahead on) is left out without
    breaking that; at the first question of a block the older ones drop at once but for the
    newest (its window only), after the same system text and canned examples. The other
    history variants render their own examples anew, as before."""
    from rudder.agent.context import OWN_BLOCK

    b = ContextBuilder(ctx(), "default")
    windows = [{**WINDOW, "window": i, "first_step": 10 * i, "last_step": 10 * i + 9,
                "hit_rate": 0.30 + 0.01 * i} for i in range(11)]
    unclear = {3, 6}
    prompts = _trainer_prompts(b, windows, lambda i: "down" if i in unclear else "up")
    canned = 1 + 2 * 4
    for n, (last, nxt) in enumerate(zip(prompts, prompts[1:]), start=2):  # nxt asks decision n
        assert nxt.messages[:canned] == prompts[0].messages[:canned]
        if (n - 1) % OWN_BLOCK == 0:  # a block's first question: the newest older example only
            assert len(nxt.messages) == canned + 3
            newest = max(d for d in range(1, n) if d - 1 not in unclear)
            assert nxt.messages[canned]["content"] == (
                b.static_text() + "\n" + b.render_window(windows[newest - 1], [windows[newest - 2]["hit_rate"]]))
            assert nxt.messages[-1]["content"].startswith("Same run.\nRecent decisions:")
        elif n - 2 in unclear:  # its last question (decision n - 1) left out: the examples before it, then the new one
            assert nxt.messages[:-1] == last.messages[:-1]
        else:  # the last prompt through its question, then the answer, then the new question
            assert nxt.messages[:len(last.messages)] == last.messages, n
            assert nxt.messages[len(last.messages)]["role"] == "assistant"
            assert len(nxt.messages) == len(last.messages) + 2
            # the example repeats the exact question (its "Recent decisions" then, not now)
            assert last.messages[-1]["content"].endswith(last.asked)
        assert nxt.messages[-1]["content"].endswith(nxt.asked)
    # the facts once per prompt, whatever the block
    assert all("".join(m["content"] for m in p.messages).count(b.static_text()) == 1 for p in prompts)
    # free-reason keeps the newest max_examples // 2 own examples, rendered anew (no asked text)
    fr = _trainer_prompts(ContextBuilder(ctx(), "free-reason"), windows, lambda i: "up")
    assert all(len(p.messages) == canned + 1 + 2 * min(i, 2) for i, p in enumerate(fr))
    assert "Recent decisions" not in fr[-1].messages[-3]["content"]


def test_prefix_stable_prompts_read_one_question():
    """The tokens the server reads per question (SmolLM2's tokenizer; after the longest prefix
    shared with this trainer's last prompt and answer), over a trainer's 9 questions: within a
    block only the new question and the answer's tail (< 400 tokens each), at a block's first
    question also the one older example kept (its window: < 200 more); before, the run's own
    examples slid under each question and 600-750 were read (bench_prompt_tokens.py)."""
    from rudder.agent.context import OWN_BLOCK

    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp.llama_chat_format import format_chatml

    from rudder.agent.models import resolve

    tok = llama_cpp.Llama(model_path=str(resolve("smollm2-135m", verify=False)), vocab_only=True, verbose=False)

    def ids(text):
        return tok.tokenize(text.encode(), add_bos=False, special=True)

    b = ContextBuilder(ctx(), "default")
    windows = [{**WINDOW, "window": i, "first_step": 10 * i, "last_step": 10 * i + 9,
                "hit_rate": 0.30 + 0.01 * i} for i in range(9)]
    prompts = _trainer_prompts(b, windows, lambda i: "up")
    reads = []
    for last, nxt in zip(prompts, prompts[1:]):
        # the model's answer: the one hindsight then confirmed (its example's), as it was generated
        after = nxt.messages[len(last.messages)] if len(nxt.messages) > len(last.messages) else {}
        answer = after.get("content") if after.get("role") == "assistant" else json.dumps(
            {"reason": "hit rate rising, lookahead on, much missing ahead: replace", "replace": True,
             "budget": "large", "expected": {"hit_rate": "up", "remote_rows": "down"}})
        kept, q = ids(format_chatml(last.messages).prompt) + ids(answer), ids(format_chatml(nxt.messages).prompt)
        shared = next((i for i, (x, y) in enumerate(zip(kept, q)) if x != y), min(len(kept), len(q)))
        reads.append(len(q) - shared)
        assert len(q) < 3600  # the 4k context holds the prompt and the answer
    final = [len(ids(p.messages[-1]["content"])) for p in prompts[1:]]
    start = [(n - 1) % OWN_BLOCK == 0 for n in range(2, len(prompts) + 1)]  # a block's first question
    assert any(start) and not all(start)
    assert all(r < 400 for r, s in zip(reads, start) if not s), reads
    assert all(r <= f + 12 for r, f, s in zip(reads, final, start) if not s), (reads, final)
    assert all(r <= f + 200 for r, f, s in zip(reads, final, start) if s), (reads, final)
