"""Named queries: each checked against the same number computed here in plain Python from the
JSONL files the study wrote (no SQL)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

import pytest

from rudder.results import queries
from rudder.results.store import ResultsStore
from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py

# (run_id, dataset, machines, policy, status)
STUDY = [
    ("a-none-2-r0", "ds-a", 2, "none", "complete"),
    ("a-none-2-r1", "ds-a", 2, "none", "complete"),  # a repeat: groups average over runs
    ("a-static-2", "ds-a", 2, "static", "complete"),
    ("a-agent-2", "ds-a", 2, "agent", "complete"),
    ("a-none-4", "ds-a", 4, "none", "complete"),
    ("a-static-4", "ds-a", 4, "static", "complete"),
    ("a-agent-4", "ds-a", 4, "agent", "complete"),
    ("a-fixed-4", "ds-a", 4, "fixed", "failed"),  # left out of the performance summaries
    ("b-static-2", "ds-b", 2, "static", "complete"),  # no baseline for ds-b: ratio NULL
]


def recs(run_dir: Path, prefix: str) -> list[tuple[int, dict]]:
    out = []
    for f in sorted(run_dir.glob(f"{prefix}-r*.jsonl")):
        rank = int(f.stem.split("-r")[-1])
        out += [(rank, json.loads(x)) for x in f.read_text().splitlines()]
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    dirs = {}
    for run_id, ds, m, pol, status in STUDY:
        dirs[run_id] = write_synthetic_run(
            tmp / "runs", run_id, dataset=ds, machines=m, policy=pol, epochs=3, steps=10,
            window=5, status=status, study="q", epochs_done=3 if status == "complete" else 1,
            reason=None if status == "complete" else "server 1 died",
            model="tiny-llm" if m == 2 else "small-llm")
    db = tmp / "r.duckdb"
    with ResultsStore(db) as st:
        st.ingest_runs([tmp / "runs"])
    # a run of another study with a huge epoch time: --study must keep it out
    other = write_synthetic_run(tmp / "other", "x-none-2", dataset="ds-a", machines=2,
                                policy="none", study="other", epochs=1, steps=10)
    ep = other / "epochs-r0.jsonl"
    rec = json.loads(ep.read_text())
    rec["t_epoch"] = 1e6
    ep.write_text(json.dumps(rec) + "\n")
    with ResultsStore(db) as st:
        st.ingest_run(other)
    store = ResultsStore(db, read_only=True)
    yield store, dirs
    store.close()


def complete(dirs):
    return {rid: dirs[rid] for rid, *_, status in STUDY if status == "complete"}


def groups(key):
    out = defaultdict(list)
    for rid, ds, m, pol, status in STUDY:
        if status == "complete":
            out[key(ds, m, pol)].append(rid)
    return out


def run_epoch_time(d: Path) -> float:
    per_epoch = defaultdict(list)
    for _, r in recs(d, "epochs"):
        per_epoch[r["epoch"]].append(r["t_epoch"])
    return mean(max(v) for v in per_epoch.values())  # slowest rank, then mean over epochs


def test_speedup(study):
    store, dirs = study
    df = queries.run_named(store, "speedup", study="q")
    expected = {k: mean(run_epoch_time(dirs[r]) for r in rids)
                for k, rids in groups(lambda ds, m, p: (ds, m, p)).items()}
    got = {(r.dataset, r.machines, r.policy): r for r in df.itertuples()}
    assert set(got) == set(expected)
    for (ds, m, pol), t in expected.items():
        row = got[(ds, m, pol)]
        assert row.mean_epoch_s == pytest.approx(t)
        base = expected.get((ds, m, "none"))
        if base is None:
            assert row.ratio_to_none != row.ratio_to_none  # NaN: no baseline there
        else:
            assert row.ratio_to_none == pytest.approx(t / base)
            assert row.speedup == pytest.approx(base / t)
    assert got[("ds-a", 2, "none")].runs == 2
    assert got[("ds-a", 2, "static")].speedup > 1  # the toy model: a buffer saves time


def test_study_filter_matters(study):
    store, _ = study
    everything = queries.run_named(store, "speedup")
    row = everything[(everything.policy == "none") & (everything.machines == 2)].iloc[0]
    assert row.runs == 3 and row.mean_epoch_s > 1e5  # the other study's run is in


def test_remote_rows(study):
    store, dirs = study
    df = queries.run_named(store, "remote_rows", study="q")

    def per_epoch_fetched(d):
        per = defaultdict(int)
        for _, r in recs(d, "epochs"):
            per[r["epoch"]] += r["fetched_rows"]  # all ranks
        return mean(per.values())

    expected = {k: mean(per_epoch_fetched(dirs[r]) for r in rids)
                for k, rids in groups(lambda ds, m, p: (ds, m, p)).items()}
    got = {(r.dataset, r.machines, r.policy): r for r in df.itertuples()}
    assert set(got) == set(expected)
    for (ds, m, pol), v in expected.items():
        assert got[(ds, m, pol)].fetched_rows_per_epoch == pytest.approx(v)
        base = expected.get((ds, m, "none"))
        if base is not None:
            assert got[(ds, m, pol)].ratio_to_none == pytest.approx(v / base)
    # the initial fill is reported apart: once per rank
    ranks = 4
    assert got[("ds-a", 4, "static")].initial_fill_rows == 5000 * ranks
    assert got[("ds-a", 4, "none")].initial_fill_rows == 0


def test_hit_rate(study):
    store, dirs = study
    df = queries.run_named(store, "hit_rate", study="q")

    def run_hit_pct(d):
        e = [r for _, r in recs(d, "epochs")]
        return 100.0 * sum(r["hits"] for r in e) / sum(r["remote_rows"] for r in e)

    expected = {k: mean(run_hit_pct(dirs[r]) for r in rids)
                for k, rids in groups(lambda ds, m, p: (ds, p)).items()}
    got = {(r.dataset, r.policy): r.hit_pct for r in df.itertuples()}
    assert got == pytest.approx(expected)
    assert got[("ds-a", "none")] == 0


def test_pass_at_1_and_staleness(study):
    store, dirs = study
    decisions = [(rid, r) for rid, d in dirs.items() for _, r in recs(d, "decisions")]
    by_model = defaultdict(list)
    for _, r in decisions:
        by_model[r["model"]].append(r)
    assert set(by_model) == {"tiny-llm", "small-llm"}

    df = queries.run_named(store, "pass_at_1", study="q")
    got = {r.model: r for r in df.itertuples()}
    for model, rs in by_model.items():
        evaluated = [r for r in rs if r["correct"] is not None]
        row = got[model]
        assert row.decisions == len(rs) and row.evaluated == len(evaluated)
        assert row.pass_at_1 == pytest.approx(
            sum(r["correct"] for r in evaluated) / len(evaluated))
        assert row.fallbacks == sum(r["fallback"] for r in rs)

    st = queries.run_named(store, "staleness", study="q")
    got = {r.model: r for r in st.itertuples()}
    for model, rs in by_model.items():
        s = sorted(r["staleness"] for r in rs)
        assert got[model].staleness_p50 == pytest.approx(_quantile(s, 0.5))
        assert got[model].staleness_p95 == pytest.approx(_quantile(s, 0.95))
        assert got[model].staleness_max == max(s)


def _quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (quantile_cont)."""
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def test_failed_runs(study):
    store, _ = study
    df = queries.run_named(store, "failed_runs", study="q")
    assert list(df.run_id) == ["a-fixed-4"]
    assert df.status[0] == "failed" and df.reason[0] == "server 1 died"


def test_runs_overview(study):
    store, _ = study
    df = queries.run_named(store, "runs", study="q")
    assert len(df) == len(STUDY)
    assert df.set_index("run_id").loc["a-fixed-4", "epochs_done"] == 1


def test_unknown_named_query_lists_the_valid_ones():
    with pytest.raises(queries.UnknownQueryError, match="speedup.*remote_rows"):
        queries.render("sppedup")


def test_study_name_is_quoted():
    sql = queries.render("failed_runs", study="it's")
    assert "study = 'it''s'" in sql


def test_trace_replays_have_no_epoch_time(tmp_path):
    """A `rudder sim` replay records 0 s epochs: it counts rows and hits, never time, so it has
    no row in the epoch-time query (and no 0 s bar in the report) but keeps its hit rate."""
    from rudder.sim.simulate import simulate, write_sim_run
    from rudder.sim.tracegen import random_trace

    runs = tmp_path / "runs"
    write_synthetic_run(runs, "none-2", policy="none", simulated=False, epochs=2, steps=6)
    t = random_trace(halo=200, minibatches=12, batch=60, capacity=0.2, epochs=2, seed=1)
    write_sim_run(runs, [simulate(t, "lru")], {"name": "src", "path": "x"})
    with ResultsStore(tmp_path / "r.duckdb") as st:
        for d in sorted(runs.iterdir()):
            st.ingest_run(d)
        speed = st.query(queries.render("speedup"))
        hits = st.query(queries.render("hit_rate"))
    assert list(speed.policy) == ["none"]
    assert "lru" in set(hits.policy)
