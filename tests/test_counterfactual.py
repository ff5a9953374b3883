"""The counterfactual judge (issue 18): every decision of a replayed run against its alternative
(replace vs keep) played from the same buffer state. Traces built so the answer is known, an
independent recount from scratch (no fork), the store and the named query. Small traces, the
real buffer code, real DuckDB, no model."""
from __future__ import annotations

import numpy as np
import pytest

from rudder.agent.hindsight import (Branch, RecordedActions, _fallback_policy, _rows, _sim_inputs,
                                    collect_run, counterfactual_gains, judge_run, summarize)
from rudder.agent.judge import REPLACE_MARGIN, counterfactual
from rudder.prefetch.policy import Policy, mechanism_for
from rudder.records import read_jsonl
from rudder.results import queries
from rudder.results.store import ResultsStore
from rudder.sim.replay import BufferReplayer, PositionTrace, replay
from rudder.sim.tracegen import random_trace
from rudder.trace import Trace

A, B = list(range(10)), list(range(20, 30))  # two disjoint sets, each the buffer's capacity


def _built(d, after: list[list[int]]):
    """40 halo nodes, a 10-row buffer filled with A; four minibatches of A (so the first
    decisions see a buffer that serves everything), then `after`, then four of A."""
    mbs = [A] * 4 + after + [A] * 4
    t = Trace.from_minibatches(np.arange(40), [np.array(m) for m in mbs], init=np.arange(10),
                               capacity=10, epochs=np.zeros(len(mbs), dtype=np.int32), feat_bytes=8)
    return t.save(d / "trace-r0.npz")


def _at(run, step: int) -> dict:
    return next(d for d in read_jsonl(run / "decisions-r0.jsonl") if d["applied_step"] == step)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{(case, taken): run} for a drift (B from step 4 on: replacing at step 4 saves) and a
    one-off (B for two minibatches, then A again: replacing at step 4 evicts what comes back),
    each run once with every decision replace and once with every decision keep (window 2,
    lookahead depth 1, demand admission, decisions applied at each window close)."""
    d = tmp_path_factory.mktemp("cf-built")
    out = {}
    for case, after in (("drift", [B] * 4), ("oneoff", [B, B, A, A])):
        path = _built(d / case, after)
        for taken, p in (("replace", 1.0), ("keep", 0.0)):
            out[case, taken] = collect_run(path, d / case / taken, window=2, lookahead=1,
                                           p_replace=p, budget="large", study="cf")
    return out


def test_known_by_construction(built):
    """Drift: kept, the buffer misses all 10 rows of B on each of the 4 minibatches of the
    horizon (40 rows); replaced, the round admits B's misses at step 4 and the 3 later
    minibatches hit (10 rows): replacing saves 30 of 40 remote rows. One-off: kept, B misses
    twice (20 rows) and A hits; replaced, A was evicted for B and is pulled back: it costs."""
    rep, keep = _at(built["drift", "replace"], 4), _at(built["drift", "keep"], 4)
    assert rep["replace"] and not keep["replace"]
    assert rep["cf_rows_saved"] == 30 and keep["cf_rows_saved"] == -30
    assert rep["cf_replace_share"] == keep["cf_replace_share"] == pytest.approx(30 / 40)
    assert rep["correct_cf"] is True and keep["correct_cf"] is False

    rep, keep = _at(built["oneoff", "replace"], 4), _at(built["oneoff", "keep"], 4)
    assert rep["cf_rows_saved"] < 0 and keep["cf_rows_saved"] == -rep["cf_rows_saved"]
    assert rep["cf_replace_share"] < -REPLACE_MARGIN
    assert rep["correct_cf"] is False and keep["correct_cf"] is True
    # the steady windows before the change: nothing is missing, replacing changes nothing
    for taken in ("replace", "keep"):
        first = _at(built["drift", taken], 2)
        assert first["cf_rows_saved"] == 0 and first["correct_cf"] is (taken == "keep")


def test_the_judge_leaves_before_after_and_unjudgeable_decisions_alone(built):
    run = built["drift", "replace"]
    recs = read_jsonl(run / "decisions-r0.jsonl")
    assert all("correct" in d for d in recs)
    last = max(d["applied_step"] for d in recs if d["applied_step"] is not None)
    # a decision whose horizon (2 windows of 2) runs past the 12 minibatches is not judged
    assert all(d["correct_cf"] is None for d in recs
               if d["applied_step"] is None or d["applied_step"] + 4 > 12)
    assert last + 4 > 12
    # judging again gives the same records (the judge reads only the trace and the actions)
    assert judge_run(run, write=False)[0] == recs


class _Then(Policy):
    """The run's recorded actions up to minibatch `first`, then one branch."""

    def __init__(self, before: Policy, after: Policy, first: int):
        self.before, self.after, self.first = before, after, first

    def plan(self, step):
        return (self.after if step.global_step >= self.first else self.before).plan(step)


def _recount(run, d: dict, default_budget, horizon: int = 2) -> int:
    """cf_rows_saved recounted without a fork: the whole run replayed from its first minibatch
    once per branch, the rows each fetched over the horizon summed from its per-minibatch counts."""
    trace, pc, C, start, ctx, depth = _sim_inputs(run, 0)
    mech, W, a = mechanism_for(ctx.lookahead), pc.window, d["applied_step"]
    decisions = read_jsonl(run / "decisions-r0.jsonl")
    rows = _rows(d["budget"] or default_budget, C)
    fetched = {}
    for branch in (True, False):
        pt = PositionTrace(trace)
        pol = _Then(RecordedActions(decisions, mech, default_budget, C, pc.admit,
                                    _fallback_policy(run, ctx, pc), len(pt)),
                    Branch(branch, a, W, mech, rows, pc.admit), a)
        r = BufferReplayer(pt, pol, C, alpha=pc.alpha, period=pc.period, depth=depth, window=W,
                           records=False)
        r.fill(trace.init_positions()[:C])
        n = replay(pt, r)
        fetched[branch] = int(n["fetched_rows"][a:a + horizon * W].sum())
    return fetched[not d["replace"]] - fetched[d["replace"]]


@pytest.fixture(scope="module")
def random_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cf-random")
    t = random_trace(halo=500, minibatches=80, batch=100, capacity=0.2, skew=0.8, epochs=2, seed=5)
    path = t.save(d / "trace-r0.npz")
    return [collect_run(path, d / "runs", window=4, lookahead=la, seed=2, study="cf")
            for la in (3, 0)]


def test_independent_recount(random_runs):
    """Every judged decision of two random-collector runs (lookahead and history-only): the
    judge's cf_rows_saved equals the recount from scratch, and correct_cf follows the rule."""
    for run in random_runs:
        recs = read_jsonl(run / "decisions-r0.jsonl")
        judged = [d for d in recs if d["correct_cf"] is not None or d["cf_rows_saved"] is not None]
        assert len(judged) >= 12 and {d["replace"] for d in judged} == {True, False}
        default = next(d["budget"] for d in recs if d["replace"])
        for d in judged:
            assert d["cf_rows_saved"] == _recount(run, d, default), d
            assert d["correct_cf"] == counterfactual(d["replace"], d["fallback"], d["cf_replace_share"])
        # at window closes the judge agrees with the window-by-window counterfactual (the start
        # decision, applied at step 0, is judged too: recounted above)
        gains = counterfactual_gains(run, 0)
        for d in (d for d in judged if d["applied_step"] > 0):
            cf = gains[d["applied_step"] // 4 - 1]
            assert d["cf_replace_share"] == pytest.approx(cf["share"], abs=1e-6)
            assert d["cf_rows_saved"] == (cf["gain"] if d["replace"] else -cf["gain"])


def test_store_round_trip_and_named_query(tmp_path, random_runs, built):
    runs = [*random_runs, built["drift", "replace"]]  # distinct run ids
    with ResultsStore(tmp_path / "r.duckdb") as st:
        for r in runs:
            st.ingest_run(r, study="cf")
        for r in runs:
            rid = r.name
            got = st.query("SELECT decision, cf_rows_saved, cf_replace_share, correct_cf, correct "
                           "FROM decisions WHERE run_id = ? ORDER BY decision", [rid]).itertuples(index=False)
            want = sorted(read_jsonl(r / "decisions-r0.jsonl"), key=lambda d: d["decision"])
            for g, w in zip(got, want, strict=True):
                assert g.decision == w["decision"]
                assert _none(g.cf_rows_saved) == w["cf_rows_saved"]
                assert _none(g.cf_replace_share) == w["cf_replace_share"]
                assert _none(g.correct_cf) == w["correct_cf"] and _none(g.correct) == w["correct"]
        df = queries.run_named(st, "pass_at_1", study="cf")
    allrecs = [d for r in runs for d in read_jsonl(r / "decisions-r0.jsonl")]
    row = df[df.policy == "agent"].iloc[0]  # every run here is the agent policy (random collector)
    s = summarize(allrecs)
    assert (row.correct_cf, row.evaluated_cf) == s["pass_at_1_cf"]
    assert row.pass_at_1_cf == pytest.approx(s["pass_at_1_cf"][0] / s["pass_at_1_cf"][1])
    assert (row.correct, row.evaluated) == s["pass_at_1"]
    assert row.cf_rows_saved == sum(d["cf_rows_saved"] or 0 for d in allrecs)

    # the report's line: counterfactual Pass@1 beside before/after (write_report puts it under
    # the Pass@1 table)
    from rudder.results.report import _pass_line

    (c, n), (cc, cn) = s["pass_at_1"], s["pass_at_1_cf"]
    assert _pass_line(df) == (f"Pass@1 of all decisions: before/after {c / n:.2f} ({n} judged), "
                              f"counterfactual {cc / cn:.2f} ({cn} judged).")
    unjudged = df.assign(evaluated_cf=0, correct_cf=0)  # runs nobody judged: the line says how
    assert _pass_line(unjudged).endswith("counterfactual not judged (`rudder agent judge RUN_DIR` judges them).")


def _none(x):
    """A DuckDB NULL read through pandas (NaN / NA / NaT) as None; numpy scalars as Python."""
    import pandas as pd

    if x is None or x is pd.NA or (isinstance(x, float) and np.isnan(x)):
        return None
    return x.item() if hasattr(x, "item") else x


def test_a_run_with_its_own_trace_is_judged_as_a_replay_is(tmp_path, random_runs):
    """A live run keeps its trace (trace-r<R>.npz) but has no sim.source: the judge replays that
    trace (checking every recorded hit count) and gives what it gives for the simulated run."""
    import json
    import shutil

    from rudder.records import read_run

    sim = random_runs[0]
    live = tmp_path / "live"
    shutil.copytree(sim, live)
    meta = read_run(live)
    shutil.copy(meta["sim"]["source"], live / "trace-r0.npz")
    del meta["sim"]
    (live / "run.json").write_text(json.dumps(meta))
    assert judge_run(live, write=False)[0] == read_jsonl(sim / "decisions-r0.jsonl")
    (live / "trace-r0.npz").unlink()
    with pytest.raises(ValueError, match="no trace-r0.npz"):
        judge_run(live)


def test_cli_judges_and_prints_the_balance(built, capsys):
    from rudder.cli import main

    run = built["drift", "replace"]
    assert main(["agent", "judge", str(run)]) == 0
    out = capsys.readouterr().out
    s = summarize(read_jsonl(run / "decisions-r0.jsonl"))
    (c, n), (cc, cn) = s["pass_at_1"], s["pass_at_1_cf"]
    assert (f"{s['judged']} of {s['decisions']} decisions judged; replacing saves at {s['saves']}, "
            f"costs at {s['costs']}, neutral at {s['neutral']}; Pass@1 before/after {c}/{n}, "
            f"counterfactual {cc}/{cn}") in out
    assert s["saves"] >= 1 and s["judged"] == s["saves"] + s["costs"] + s["neutral"]
    assert main(["agent", "judge", str(run.parent / "nowhere")]) == 2  # a clear error, no traceback


def test_judging_again_records_the_new_horizon_in_run_json(built, tmp_path):
    """`rudder agent judge --horizon N` rewrites the verdicts and run.json's `judge` with them,
    so the run (and the report, which quotes it) never pairs one horizon's verdicts with
    another's summary; --dry-run leaves both alone."""
    import json
    import shutil

    from rudder.cli import main

    run = tmp_path / "run"
    shutil.copytree(built["drift", "replace"], run)
    before = (run / "run.json").read_text()
    assert main(["agent", "judge", "--horizon", "3", "--dry-run", str(run)]) == 0
    assert (run / "run.json").read_text() == before
    assert main(["agent", "judge", "--horizon", "3", str(run)]) == 0
    recs = read_jsonl(run / "decisions-r0.jsonl")
    assert recs == judge_run(run, horizon=3, write=False)[0]
    j, s = json.loads((run / "run.json").read_text())["judge"], summarize(recs)
    assert (j["horizon"], j["judged"], j["decisions"], tuple(j["pass_at_1_cf"])) == \
        (3, s["judged"], s["decisions"], s["pass_at_1_cf"])
    assert j["s"] >= 0


def test_a_complete_run_judges_its_own_decisions(tmp_path, random_runs):
    """runner.judge_decisions (called as a run completes): the decisions get the judge's fields
    and run.json a `judge` summary; without traces the reason is recorded and the decisions are
    left as they were; a run that decided nothing gets no `judge`."""
    import json
    import shutil

    from rudder.agent.hindsight import HORIZON
    from rudder.runner import judge_decisions

    src = random_runs[1]
    want = read_jsonl(src / "decisions-r0.jsonl")  # judged when collected
    run = tmp_path / "run"
    shutil.copytree(src, run)
    blank = [{**d, "cf_rows_saved": None, "cf_replace_share": None, "correct_cf": None} for d in want]
    (run / "decisions-r0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in blank))
    out = judge_decisions(run)
    assert read_jsonl(run / "decisions-r0.jsonl") == want
    s = summarize(want)
    assert out["judged"] == s["judged"] > 0 and tuple(out["pass_at_1_cf"]) == s["pass_at_1_cf"]
    assert json.loads((run / "run.json").read_text())["judge"] == {**out, "horizon": HORIZON}

    (run / "decisions-r0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in blank))
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "sim": None}))  # a live run without its trace
    out = judge_decisions(run)
    assert "the counterfactual needs the trace" in out["error"]
    assert read_jsonl(run / "decisions-r0.jsonl") == blank
    assert json.loads((run / "run.json").read_text())["judge"]["error"] == out["error"]

    (run / "decisions-r0.jsonl").write_text("")
    assert judge_decisions(run) is None
