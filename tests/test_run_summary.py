"""The summary `rudder run` ends with, from a run directory alone."""
from __future__ import annotations

import json

from rudder.records import read_jsonl
from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py
from rudder.run_summary import format_summary, summarize_run
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
    assert f"Belady on the same traces: {s['belady_hits']:,}" in format_summary(s)
