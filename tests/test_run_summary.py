"""The summary `rudder run` ends with, from a run directory alone."""
from __future__ import annotations

import json

from rudder.records import read_jsonl
from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py
from rudder.run_summary import _cpu_line, format_summary, summarize_run
from rudder.sim.simulate import simulate, write_sim_run
from rudder.sim.tracegen import random_trace


def test_summary_counts_rows_hits_and_decisions(tmp_path):
    d = write_synthetic_run(tmp_path, "a", policy="agent", epochs=2, steps=6, window=3)
    mbs = [m for p in d.glob("minibatches-r*.jsonl") for m in read_jsonl(p)]
    dec = [x for p in d.glob("decisions-r*.jsonl") for x in read_jsonl(p)]
    s = summarize_run(d)
    assert s["remote_rows"] == sum(m["remote_rows"] for m in mbs)
    assert s["fetched_rows"] == sum(m["fetched_rows"] for m in mbs) and s["hits"] == sum(m["hits"] for m in mbs)
    assert s["decisions"] == len(dec) > 0
    assert s["fallbacks"] == sum(1 for x in dec if x["fallback"])
    text = format_summary(s)
    assert f"rows fetched   {s['fetched_rows']:,} = " in text
    assert f"decisions      {len(dec)}: {s['applied']} applied" in text
    assert "feature check  not run" in text


def test_summary_says_when_the_agent_never_acted(tmp_path):
    d = write_synthetic_run(tmp_path, "a", policy="agent", epochs=2, steps=6, window=3)
    for p in d.glob("decisions-r*.jsonl"):
        recs = [{**x, "fallback": "static", "applied_step": None} for x in read_jsonl(p)]
        p.write_text("".join(json.dumps(x) + "\n" for x in recs))
    text = format_summary(summarize_run(d))
    assert "the agent never acted: every decision fell back" in text
    none_run = write_synthetic_run(tmp_path, "n", policy="none", epochs=1, steps=4)
    assert "never acted" not in format_summary(summarize_run(none_run))


def test_summary_against_none_and_belady_from_the_trace(tmp_path):
    t = random_trace(halo=300, minibatches=30, batch=90, capacity=0.2, epochs=2, seed=3)
    r = simulate(t, "static")
    d = write_sim_run(tmp_path, [r], {"name": "src", "path": "x"})
    t.save(d / "trace-r0.npz")
    s = summarize_run(d)
    assert s["none_rows"] == t.num_accesses == s["remote_rows"]
    assert s["belady_hits"] == simulate(t, "belady").total("hits") >= s["hits"]
    # the summary quotes the unrestricted optimum (>= the halo-only one)
    assert s["belady_all_hits"] >= s["belady_hits"]
    assert f"Belady on the same traces: {s['belady_all_hits']:,}" in format_summary(s)


def test_summary_sets_belady_over_all_remote_nodes_beside_the_halo_only_one(tmp_path):
    from rudder.sim.oracle import belady

    t = random_trace(halo=200, minibatches=30, batch=60, nonhalo=0.3, capacity=0.2, epochs=2, seed=7)
    d = write_sim_run(tmp_path, [simulate(t, "static")], {"name": "src", "path": "x"})
    t.save(d / "trace-r0.npz")
    s = summarize_run(d)
    assert s["belady_all_hits"] == belady(t, universe="all").total_hits >= s["belady_hits"]
    text = format_summary(s)
    assert s["belady_all_hits"] > s["belady_hits"]  # non-halo remote nodes: the two differ
    # the run is set beside the unrestricted optimum (issue 17's yardstick), the halo-only one beside it
    assert (f"Belady on the same traces: {s['belady_all_hits']:,} "
            f"(run/optimal {s['hits'] / s['belady_all_hits']:.3f})") in text
    assert (f"Belady         all remote nodes {s['belady_all_hits']:,} hits, halo only "
            f"{s['belady_hits']:,}") in text


def test_summary_shows_the_bounds_from_the_records(tmp_path):
    from rudder.bounds import run_bounds

    d = write_synthetic_run(tmp_path, "a", policy="static", epochs=2, steps=6)
    s = summarize_run(d)
    ranks = sorted(d.glob("minibatches-r*.jsonl"))
    b = run_bounds({i: read_jsonl(p) for i, p in enumerate(ranks)},
                   {i: read_jsonl(d / f"epochs-r{i}.jsonl") for i in range(len(ranks))})
    # the toy records: 6 steps x 0.05 s compute, sampling 0.02 s < compute
    assert s["bounds"]["compute_s"] == b.compute_s == s["bounds"]["pipeline_s"]
    assert abs(b.compute_s - 6 * 0.05) < 1e-9
    assert s["bounds"]["epoch_over_pipeline"] == s["epoch_s"] / b.pipeline_s
    assert (f"bounds         pipeline {b.pipeline_s:.2f} s (epoch {s['epoch_s'] / b.pipeline_s:.2f}x), "
            f"compute-only {b.compute_s:.2f} s") in format_summary(s)


def test_a_features_free_run_is_summarised_as_the_measured_bound(tmp_path):
    t = random_trace(halo=200, minibatches=20, batch=60, capacity=0.2, epochs=1, seed=5)
    d = write_sim_run(tmp_path, [simulate(t, "none")], {"name": "src", "path": "x"})
    t.save(d / "trace-r0.npz")
    run = json.loads((d / "run.json").read_text())
    run["config"].setdefault("train", {})["features_free"] = True
    (d / "run.json").write_text(json.dumps(run))
    s = summarize_run(d)
    assert s["policy"] == "free" and s["belady_hits"] == 0  # no buffer: no optimum beside it
    text = format_summary(s)
    assert text.startswith("features free  no remote row pulled") and "rows fetched" not in text


def test_summary_says_where_the_cores_went(tmp_path):
    d = write_synthetic_run(tmp_path, "a", policy="static", epochs=2, steps=6)

    def set_cpu(v):
        for p in sorted(d.glob("epochs-r*.jsonl")):
            p.write_text("".join(json.dumps({**e, "cpu_s": v}) + "\n" for e in read_jsonl(p)))

    set_cpu(None)
    assert _cpu_line(summarize_run(d)) is None  # records without cpu_s (a replay) and no status: no line
    set_cpu(0.25)  # each rank burned 0.25 CPU-s an epoch
    ranks = len(list(d.glob("epochs-r*.jsonl")))
    (d / "cluster").mkdir()
    (d / "cluster" / "machine0.status.json").write_text(json.dumps({"procs": [
        {"role": "server", "cpu_user_s": 3.0, "cpu_sys_s": 1.0},
        {"role": "trainer", "cpu_user_s": 8.0, "cpu_sys_s": 2.0},
        {"role": "trainer", "cpu_user_s": 6.0, "cpu_sys_s": 1.5},
        {"role": "service"}]}))  # still running when last written: no CPU yet
    s = summarize_run(d)
    assert s["cpu_epoch_s"] == 0.25 * ranks
    assert s["cpu_by_role"] == {"server": (4.0, 1.0), "trainer": (17.5, 3.5)}
    line = _cpu_line(s)
    assert line in format_summary(s).splitlines()
    assert line == (f"cpu            trainers {0.25 * ranks:.2f} CPU-s an epoch "
                    f"({0.25 * ranks / s['epoch_s']:.2f} cores over its {s['epoch_s']:.2f} s); "
                    "whole run: servers 4.0 s (sys 1.0), trainers with samplers 17.5 s (sys 3.5)")


def test_summary_says_how_many_pulls_were_in_flight(tmp_path):
    """train.pulls_in_flight 2: the trainers' done files say how many pulls were on the wire at
    once and over how many epoch ends; the summary says so (and nothing with one pull)."""
    d = write_synthetic_run(tmp_path, "a", policy="static", epochs=2, steps=6)
    assert summarize_run(d)["pulls"] is None and "\npulls " not in format_summary(summarize_run(d))
    for r, ends in ((0, 1), (1, 0)):
        (d / f"done-r{r}.json").write_text(json.dumps({"rank": r, "checked": False, "mismatched_rows": 0,
                                                         "most_pulls_in_flight": 2, "epoch_ends_in_flight": ends}))
    s = summarize_run(d)
    assert s["pulls"] == {"most_in_flight": 2, "epoch_ends": 1}
    assert ("\npulls          up to 2 in flight at once (train.pulls_in_flight); 1 epoch end(s) crossed "
            "with one on the wire") in format_summary(s)


def test_summary_quotes_the_runs_own_judgement(tmp_path):
    """run.json's `judge` (runner.judge_decisions) in the summary: the right share, or why none."""
    d = write_synthetic_run(tmp_path, "a", policy="agent", epochs=2, steps=6, window=3)
    meta = json.loads((d / "run.json").read_text())
    assert "judged " not in format_summary(summarize_run(d))  # an older run: nothing claimed
    (d / "run.json").write_text(json.dumps({**meta, "judge": {
        "horizon": 2, "judged": 9, "decisions": 12, "pass_at_1_cf": [6, 8], "s": 0.5}}))
    text = format_summary(summarize_run(d))
    assert ("judged         9 of 12 decisions against their counterfactual over 2 windows "
            "(not fallbacks, nor those in the last 2 windows): 6 of 8 clear calls right "
            "(Pass@1 0.75)") in text
    (d / "run.json").write_text(json.dumps({**meta, "judge": {
        "horizon": 2, "judged": 0, "decisions": 2, "pass_at_1_cf": [0, 0], "s": 0.1}}))
    assert ("judged         none of 2 decisions: each fell back, was never applied, or came in "
            "the run's last 2 windows") in format_summary(summarize_run(d))
    (d / "run.json").write_text(json.dumps({**meta, "judge": {"horizon": 2, "error": "no trace-r0.npz"}}))
    assert "judged         none: no trace-r0.npz" in format_summary(summarize_run(d))
