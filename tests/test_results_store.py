"""ResultsStore: ingest of schema-true run directories, idempotence, tolerance, locking."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from rudder.records import DECISION_FIELDS, EPOCH_FIELDS, MINIBATCH_FIELDS, WINDOW_FIELDS
from rudder.results.store import ResultsStore, StoreLockedError, find_run_dirs
from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py

REPO = Path(__file__).resolve().parents[1]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def file_rows(run_dir: Path, prefix: str) -> int:
    return sum(lines(f) for f in run_dir.glob(f"{prefix}-r*.jsonl"))


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    dirs = {
        "none-2": write_synthetic_run(root, "none-2", machines=2, policy="none", study="s1",
                                      epochs=2, steps=10),
        "static-4": write_synthetic_run(root, "static-4", machines=4, policy="static",
                                        study="s1", epochs=2, steps=10),
        "agent-2": write_synthetic_run(root, "agent-2", machines=2, policy="agent", study="s1",
                                       epochs=2, steps=10, window=5),
        "failed": write_synthetic_run(root, "failed", machines=2, policy="fixed", study="s1",
                                      epochs=2, steps=10, status="failed",
                                      reason="trainer 1 exited with code 137", epochs_done=1),
    }
    return root, dirs


def counts(db: Path) -> dict[str, int]:
    with ResultsStore(db, read_only=True) as st:
        return st.counts()


def test_synthetic_records_follow_the_contract(runs):
    _, dirs = runs
    d = dirs["agent-2"]
    for prefix, fields in (("minibatches", MINIBATCH_FIELDS), ("epochs", EPOCH_FIELDS),
                           ("windows", WINDOW_FIELDS), ("decisions", DECISION_FIELDS)):
        rec = json.loads((d / f"{prefix}-r0.jsonl").read_text().splitlines()[0])
        assert list(rec) == fields


def test_ingest_all_rows_and_typed_columns(tmp_path, runs):
    root, dirs = runs
    db = tmp_path / "r.duckdb"
    with ResultsStore(db) as st:
        summary = st.ingest_runs([root])
        assert summary.ingested == 4 and not summary.errors
        c = st.counts()
        types = dict(st.query("SELECT column_name, data_type FROM information_schema.columns "
                              "WHERE table_name = 'minibatches'")
                     .itertuples(index=False, name=None))
    for table in ("minibatches", "epochs", "windows", "decisions"):
        assert c[table] == sum(file_rows(d, table) for d in dirs.values()), table
    assert c["runs"] == 4 and c["studies"] == 1
    assert types["global_step"] == "BIGINT" and types["hit_rate"] == "DOUBLE"
    assert types["rank"] == "INTEGER" and types["extra"] == "JSON"
    with ResultsStore(db, read_only=True) as st:
        row = st.query("SELECT * FROM runs WHERE run_id = 'agent-2'").iloc[0]
        assert (row.dataset, row.machines, row.policy, row.model) == \
               ("synth-small", 2, "agent", "smollm2-135m")
        assert row.trainers_per_machine == 1 and row.batch_size == 1000
        assert row.prefetch_fraction == 0.25 and bool(row.simulated) and row.ranks == 2
        assert json.loads(row.config)["prefetch"]["policy"] == "agent"
        assert json.loads(row.timings)["start_s"] == 2.0
        assert json.loads(row.extra) == {"synthetic": True}
        # model is the decision model: none for policies that decide nothing
        assert st.query("SELECT model FROM runs WHERE run_id = 'none-2'").iloc[0, 0] is None


def test_reingest_is_idempotent_and_replaces_changed_values(tmp_path, runs):
    root, dirs = runs
    db = tmp_path / "r.duckdb"
    with ResultsStore(db) as st:
        st.ingest_runs([root])
    before = counts(db)
    with ResultsStore(db) as st:
        again = st.ingest_runs([root])
        assert again.skipped == 4 and again.ingested == 0  # unchanged: skipped
        forced = st.ingest_runs([root], force=True)
        assert forced.ingested == 4
    assert counts(db) == before  # no duplicates

    # the run changed on disk: one epoch dropped, one value changed, status changed
    d = dirs["none-2"]
    ep = d / "epochs-r0.jsonl"
    recs = [json.loads(x) for x in ep.read_text().splitlines()]
    recs[0]["t_epoch"] = 123.0
    ep.write_text("".join(json.dumps(r) + "\n" for r in recs[:1]))
    meta = json.loads((d / "run.json").read_text())
    meta.update(status="failed", reason="re-run died")
    (d / "run.json").write_text(json.dumps(meta))
    with ResultsStore(db) as st:
        res = st.ingest_run(d)
        assert not res.skipped and res.rows["epochs"] == file_rows(d, "epochs")
        got = st.query("SELECT rank, epoch, t_epoch FROM epochs WHERE run_id = 'none-2' "
                       "ORDER BY rank, epoch")
        run = st.query("SELECT status, reason FROM runs WHERE run_id = 'none-2'").iloc[0]
    assert list(got.itertuples(index=False, name=None))[0] == (0, 0, 123.0)
    assert len(got) == file_rows(d, "epochs")
    assert counts(db)["epochs"] == before["epochs"] - 1
    assert (run.status, run.reason) == ("failed", "re-run died")


def test_duplicate_records_in_a_file_keep_the_last(tmp_path, runs):
    _, dirs = runs
    d = dirs["static-4"]
    ep = d / "epochs-r1.jsonl"
    recs = [json.loads(x) for x in ep.read_text().splitlines()]
    dup = dict(recs[0], t_epoch=9.5)
    with ep.open("a") as f:  # a resumed writer repeating epoch 0
        f.write(json.dumps(dup) + "\n")
    with ResultsStore(tmp_path / "r.duckdb") as st:
        st.ingest_run(d)
        got = st.query("SELECT t_epoch FROM epochs WHERE run_id = 'static-4' AND rank = 1 "
                       "AND epoch = 0")
    assert list(got.t_epoch) == [9.5]


def test_torn_last_line_is_skipped(tmp_path, runs):
    _, dirs = runs
    d = dirs["failed"]
    complete = lines(d / "minibatches-r0.jsonl")
    with (d / "minibatches-r0.jsonl").open("a") as f:
        f.write('{"epoch": 1, "step": 0, "global_step": 10, "input_ro')  # killed mid-write
    with ResultsStore(tmp_path / "r.duckdb") as st:
        res = st.ingest_run(d)
        n = st.query("SELECT count(*) AS n FROM minibatches WHERE run_id = 'failed' "
                     "AND rank = 0").n[0]
    assert n == complete
    assert res.status == "failed"


def test_failed_run_keeps_status_and_reason(tmp_path, runs):
    root, _ = runs
    db = tmp_path / "r.duckdb"
    with ResultsStore(db) as st:
        st.ingest_runs([root])
        row = st.query("SELECT status, reason, wall_s, started_at, ended_at FROM runs "
                       "WHERE run_id = 'failed'").iloc[0]
        epochs = st.query("SELECT DISTINCT epoch FROM epochs WHERE run_id = 'failed'")
    assert row.status == "failed" and row.reason == "trainer 1 exited with code 137"
    assert row.wall_s > 0 and row.ended_at > row.started_at
    assert list(epochs.epoch) == [0]


def test_extra_fields_and_ill_typed_values_land_in_extra(tmp_path):
    d = write_synthetic_run(tmp_path / "runs", "odd", policy="agent", epochs=1, steps=5,
                            window=5)
    mb = d / "minibatches-r0.jsonl"
    recs = [json.loads(x) for x in mb.read_text().splitlines()]
    recs[0]["gpu_mem_mb"] = 512  # a field the contract does not know
    recs[1]["hits"] = "lots"  # does not fit BIGINT
    recs[2]["misses"] = 7.0  # integral float: fits
    del recs[3]["loss"]  # missing field -> NULL
    mb.write_text("".join(json.dumps(r) + "\n" for r in recs))
    dec = d / "decisions-r0.jsonl"
    drec = json.loads(dec.read_text().splitlines()[0])
    drec.update(fallback="timeout", correct="yes", expected_hit_rate=0.61)
    dec.write_text(json.dumps(drec) + "\n")
    with ResultsStore(tmp_path / "r.duckdb") as st:
        st.ingest_run(d)
        m = st.query("SELECT step, hits, misses, loss, extra FROM minibatches "
                     "WHERE rank = 0 ORDER BY step")
        dd = st.query("SELECT fallback, correct, expected_hit_rate, extra FROM decisions "
                      "WHERE rank = 0").iloc[0]
    assert json.loads(m.extra[0]) == {"gpu_mem_mb": 512}
    assert m.hits.isna()[1] and json.loads(m.extra[1]) == {"hits": "lots"}
    assert m.misses[2] == 7 and pd.isna(m.extra[2])
    assert m.loss.isna()[3]
    assert dd.fallback == True  # noqa: E712  (a fallback named by text counts as one)
    assert json.loads(dd.extra) == {"fallback": "timeout"}
    assert dd.correct == True and dd.expected_hit_rate == "0.61"  # noqa: E712


def test_run_with_only_run_json(tmp_path):
    d = tmp_path / "runs" / "early"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": "early", "status": "running",
                                            "config": {"dataset": {"name": "x"}}}))
    with ResultsStore(tmp_path / "r.duckdb") as st:
        res = st.ingest_run(d)
        c = st.counts()
    assert res.rows == {"minibatches": 0, "epochs": 0, "windows": 0, "decisions": 0}
    assert c["runs"] == 1 and c["minibatches"] == 0


def test_a_features_free_run_is_stored_as_policy_free(tmp_path):
    """train.features_free measures a bound: stored as `free`, never as its policy or as the
    `none` baseline the ratio queries join on."""
    root = tmp_path / "runs"
    for run_id, free in (("look", False), ("look-free", True)):
        d = write_synthetic_run(root, run_id, machines=2, policy="lookahead", epochs=1, steps=4)
        run = json.loads((d / "run.json").read_text())
        run["config"]["train"]["features_free"] = free
        (d / "run.json").write_text(json.dumps(run))
    with ResultsStore(tmp_path / "r.duckdb") as st:
        for d in sorted(root.iterdir()):
            st.ingest_run(d)
        got = dict(st.con.execute("SELECT run_id, policy FROM runs").fetchall())
    assert got == {"look": "lookahead", "look-free": "free"}


def test_unreadable_run_is_reported_not_fatal(tmp_path, runs):
    root, _ = runs
    bad = root / "broken"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    with ResultsStore(tmp_path / "r.duckdb") as st:
        summary = st.ingest_runs([root])
    assert summary.ingested == 4
    assert [p.name for p, _ in summary.errors] == ["broken"]


def test_find_run_dirs(tmp_path, runs):
    root, dirs = runs
    (dirs["none-2"] / "logs").mkdir()
    found = find_run_dirs([root, dirs["none-2"]])
    assert found == sorted(p.resolve() for p in dirs.values())
    with pytest.raises(FileNotFoundError):
        find_run_dirs([tmp_path / "nope"])


def test_study_tagging_and_ingest_study(tmp_path):
    root = tmp_path / "runs"
    write_synthetic_run(root, "a", study="s1", epochs=1, steps=2)
    write_synthetic_run(root, "b", study="s2", epochs=1, steps=2)
    write_synthetic_run(root, "c", study=None, epochs=1, steps=2)
    db = tmp_path / "r.duckdb"
    with ResultsStore(db) as st:
        summary = st.ingest_study("s1", root)
        assert sorted(r.run_id for r in summary.results) == ["a", "c"]
        runs = st.query("SELECT run_id, study FROM runs ORDER BY run_id")
        study = st.query("SELECT * FROM studies").iloc[0]
    assert list(runs.itertuples(index=False, name=None)) == [("a", "s1"), ("c", "s1")]
    assert study.study == "s1" and study.runs == 2 and study.runs_root == str(root.resolve())


def test_export_parquet(tmp_path, runs):
    root, _ = runs
    db = tmp_path / "r.duckdb"
    with ResultsStore(db) as st:
        st.ingest_runs([root])
    with ResultsStore(db, read_only=True) as st:
        paths = st.export_parquet(tmp_path / "pq")
        c = st.counts()
    assert set(paths) == {"studies", "runs", "epochs", "minibatches", "windows", "decisions"}
    for t, p in paths.items():
        assert pq.read_table(p).num_rows == c[t]


def test_read_only_store_needs_a_database(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results database"):
        ResultsStore(tmp_path / "missing.duckdb", read_only=True)
    with ResultsStore(tmp_path / "r.duckdb") as st:
        pass
    with ResultsStore(tmp_path / "r.duckdb", read_only=True) as st:
        with pytest.raises(ValueError, match="read-only"):
            st.ingest_run(tmp_path)
        assert st.relation("SELECT 42 AS x").fetchall() == [(42,)]


def test_one_writer_at_a_time_in_process(tmp_path):
    db = tmp_path / "r.duckdb"
    writer = ResultsStore(db)
    try:
        with pytest.raises(StoreLockedError):
            ResultsStore(db, lock_timeout_s=0.2)
        with pytest.raises(StoreLockedError):
            ResultsStore(db, read_only=True, lock_timeout_s=0.2)
    finally:
        writer.close()
    with ResultsStore(db, lock_timeout_s=0.2):
        pass


def test_second_collector_waits_for_the_first(tmp_path, runs):
    """Two processes: the second writer blocks on the lock until the first closes."""
    root, _ = runs
    db = tmp_path / "r.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from rudder.results.store import ResultsStore\n"
         f"st = ResultsStore({str(db)!r})\n"
         "print('locked', flush=True)\n"
         "time.sleep(1.5)\n"
         "st.ingest_run(sys.argv[1])\n"
         "st.close()\n", str(root / "none-2")],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with ResultsStore(db, lock_timeout_s=60) as st:
            waited = time.monotonic() - t0
            assert st.query("SELECT run_id FROM runs").run_id.tolist() == ["none-2"]
            st.ingest_runs([root])
            assert st.counts()["runs"] == 4
        assert waited > 0.5
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0


def test_batches_and_duplicate_run_ids(tmp_path, runs, monkeypatch):
    import rudder.results.store as store_mod

    root, dirs = runs
    copy = tmp_path / "copies" / "none-2-copy"  # same run_id as runs/none-2, other dir
    copy.mkdir(parents=True)
    for f in dirs["none-2"].iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    db = tmp_path / "r.duckdb"
    for batch_runs in (2, 64):  # the two copies in different batches, then in one batch
        monkeypatch.setattr(store_mod, "BATCH_RUNS", batch_runs)
        with ResultsStore(db) as st:
            summary = st.ingest_runs([root, tmp_path / "copies"], force=True)
            assert not summary.errors
            c = st.counts()
            where = st.scalar("SELECT run_dir FROM runs WHERE run_id = 'none-2'")
        assert c["runs"] == 4
        assert c["epochs"] == sum(file_rows(d, "epochs") for d in dirs.values())
        # directories are visited in sorted order; the last one wins, rows are not doubled
        assert where == str(dirs["none-2"].resolve())


# ---- decision outcomes: directions and numbers, from the agent and from a classifier ---------
def _agent_decisions() -> list[dict]:
    """Decision records of the real AgentPolicy (a scripted model stands in for the LLM)."""
    import time as _time

    from rudder.agent.decision import Completion, DecisionMaker
    from rudder.agent.policy import AgentPolicy
    from rudder.config import AgentConfig, PrefetchConfig
    from rudder.prefetch.policy import RunContext, StepInfo

    class Scripted:
        name = "fake"

        def complete(self, messages, schema, max_tokens, timeout_s, cancel=None):
            return Completion(json.dumps({"reason": "t: replace", "replace": True, "budget": "small",
                                          "expected": {"hit_rate": "up", "remote_rows": "down"}}), "stop")

        def close(self):
            pass

    ctx = RunContext(rank=0, num_trainers=1, part_id=0, num_parts=2, num_nodes=10_000,
                     partition_nodes=5_000, halo_nodes=4_000, capacity=1000, batch_size=100,
                     fanouts=[10, 25], steps_per_epoch=100, epochs=1, feat_dim=8, feat_bytes=32,
                     window=5, lookahead=3)
    pol = AgentPolicy(PrefetchConfig(policy="agent", window=5), agent=AgentConfig(),
                      decision_maker=DecisionMaker(Scripted(), "fake"))
    pol.setup(ctx)
    for i, (hit, fetched) in enumerate([(0.30, 800), (0.35, 700)]):
        pol.observe({"global_step": i * 5 + 4},
                    {"window": i, "first_step": i * 5, "last_step": i * 5 + 4, "minibatches": 5,
                     "hit_rate": hit, "remote_rows": 5000, "fetched_rows": fetched * 5})
        deadline = _time.monotonic() + 5
        while not pol.wait_for_decision(0.1):
            assert _time.monotonic() < deadline
        pol.plan(StepInfo(epoch=0, step=i * 5 + 5, global_step=i * 5 + 5, remaining_steps=10))
    pol.close()
    return sorted(pol.decisions(), key=lambda d: d["decision"])


def _classifier_decisions(tmp_path: Path) -> list[dict]:
    """Decision records of the real ClassifierPolicy with a saved (tiny) logistic regression."""
    import joblib
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from rudder.agent.classifiers import ClassifierPolicy
    from rudder.agent.trajectories import FEATURE_NAMES
    from rudder.config import PrefetchConfig
    from rudder.prefetch.policy import RunContext, StepInfo

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, len(FEATURE_NAMES)))
    y = (X[:, FEATURE_NAMES.index("pre_hit_rate")] < 0).astype(int)
    pipe = Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression())]).fit(X, y)
    path = tmp_path / "logreg.joblib"
    joblib.dump({"pipeline": pipe, "meta": {"kind": "logreg", "feature_names": FEATURE_NAMES}}, path)
    pol = ClassifierPolicy(PrefetchConfig(window=5, budget=0.05), model_path=str(path))
    pol.setup(RunContext(rank=0, num_trainers=1, part_id=0, num_parts=2, num_nodes=10_000,
                         partition_nodes=5_000, halo_nodes=4_000, capacity=1000, batch_size=100,
                         fanouts=[10, 25], steps_per_epoch=100, epochs=1, feat_dim=8,
                         feat_bytes=32, window=5, lookahead=3))
    g = 0
    for hit, fetched in [(0.30, 800), (0.36, 720), (0.365, 715)]:
        for _ in range(5):
            pol.plan(StepInfo(epoch=0, step=g, global_step=g, remaining_steps=100 - g))
            m = {"global_step": g, "remote_rows": 1000, "hits": int(1000 * hit),
                 "fetched_rows": fetched, "replaced_rows": 0, "t_fetch": 0.0}
            g += 1
            pol.observe(m, {"window": g // 5 - 1} if g % 5 == 0 else None)
    pol.close()
    return sorted(pol.decisions(), key=lambda d: d["decision"])


def _write_decision_run(root: Path, run_id: str, policy: str, decisions: list[dict]) -> Path:
    d = root / run_id
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "status": "complete",
                                            "config": {"prefetch": {"policy": policy}}}))
    (d / "decisions-r0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in decisions))
    return d


def test_decision_outcomes_typed_for_agent_and_classifier(tmp_path):
    """Both policies write the outcome as directions (VARCHAR) and as numbers (DOUBLE): one type
    per column, nothing pushed into `extra`."""
    agent = _agent_decisions()
    clf = _classifier_decisions(tmp_path)
    assert agent[0]["outcome_hit_rate"] == "up" and agent[0]["outcome_remote_rows"] == "down"
    assert agent[0]["outcome_hit_delta"] == pytest.approx(0.05)
    assert agent[0]["outcome_rows_delta"] == pytest.approx(-0.125)
    # classifier: +6 pt / -10% then +0.5 pt (flat) / -0.7% (flat); the last one never judged
    assert [(c["outcome_hit_rate"], c["outcome_remote_rows"]) for c in clf] == \
           [("up", "down"), ("flat", "flat"), (None, None)]
    assert clf[0]["outcome_hit_delta"] == pytest.approx(0.06)
    assert clf[0]["outcome_rows_delta"] == pytest.approx(-0.1)
    assert clf[2]["outcome_hit_delta"] is None and clf[2]["outcome_rows_delta"] is None
    for rec in agent + clf:
        assert list(rec) == DECISION_FIELDS or set(rec) == set(DECISION_FIELDS)

    root = tmp_path / "runs"
    _write_decision_run(root, "agent-run", "agent", agent)
    _write_decision_run(root, "clf-run", "classifier:logreg", clf)
    db = tmp_path / "r.duckdb"
    with ResultsStore(db) as st:
        assert not st.ingest_runs([root]).errors
        types = dict(st.query("SELECT column_name, data_type FROM information_schema.columns "
                              "WHERE table_name = 'decisions'").itertuples(index=False, name=None))
        got = st.query("SELECT run_id, decision, outcome_hit_rate, outcome_remote_rows, "
                       "outcome_hit_delta, outcome_rows_delta, extra FROM decisions "
                       "ORDER BY run_id, decision")
        agg = st.query("SELECT outcome_hit_rate, avg(outcome_hit_delta) AS d FROM decisions "
                       "WHERE outcome_hit_rate IS NOT NULL GROUP BY 1 ORDER BY 1")
    assert types["outcome_hit_rate"] == types["outcome_remote_rows"] == "VARCHAR"
    assert types["outcome_hit_delta"] == types["outcome_rows_delta"] == "DOUBLE"
    rows = {(r.run_id, r.decision): r for r in got.itertuples(index=False)}
    a = rows[("agent-run", 1)]
    assert (a.outcome_hit_rate, a.outcome_remote_rows) == ("up", "down")
    assert a.outcome_hit_delta == pytest.approx(0.05) and a.outcome_rows_delta == pytest.approx(-0.125)
    c0, c1 = rows[("clf-run", 0)], rows[("clf-run", 1)]
    assert (c0.outcome_hit_rate, c0.outcome_remote_rows) == ("up", "down")
    assert c0.outcome_hit_delta == pytest.approx(0.06) and c0.outcome_rows_delta == pytest.approx(-0.1)
    assert (c1.outcome_hit_rate, c1.outcome_remote_rows) == ("flat", "flat")
    for r in rows.values():  # no outcome value was ill-typed for its column
        assert not any(k.startswith("outcome") for k in json.loads(r.extra if isinstance(r.extra, str) else "{}")), r.extra
    # one query across both policies: directions group, numbers average
    assert dict(zip(agg.outcome_hit_rate, agg.d))["up"] == pytest.approx((0.05 + 0.06) / 2)


def test_legacy_numeric_outcomes_become_deltas(tmp_path):
    """A classifier record written before the delta fields (numbers in outcome_hit_rate/
    outcome_remote_rows) is read as deltas with their directions, not pushed into `extra`."""
    rec = {k: None for k in DECISION_FIELDS if k not in ("outcome_hit_delta", "outcome_rows_delta")}
    rec.update(decision=0, window=0, policy="classifier:rf", replace=True,
               outcome_hit_rate=-0.02, outcome_remote_rows=0.005, correct=False)
    _write_decision_run(tmp_path / "runs", "old", "classifier:rf", [rec])
    with ResultsStore(tmp_path / "r.duckdb") as st:
        st.ingest_runs([tmp_path / "runs"])
        r = st.query("SELECT * FROM decisions").iloc[0]
    assert (r.outcome_hit_rate, r.outcome_remote_rows) == ("down", "flat")
    assert r.outcome_hit_delta == pytest.approx(-0.02) and r.outcome_rows_delta == pytest.approx(0.005)
    assert not isinstance(r.extra, str)  # NULL: nothing left over


def test_a_v3_file_is_migrated_and_older_ones_refused(tmp_path, runs):
    """v4 added the loader's stage times and the epoch's bounds, v5 the windows' missed sets, v6
    the epochs' cpu_s: a v3 file (made here by taking
    those columns out of a fresh one) gets them added in place and collects v4 runs; a v2 file
    cannot be brought forward and the error says what to do."""
    import duckdb

    from rudder.results.schema import MIGRATIONS, SCHEMA_VERSION

    assert SCHEMA_VERSION == 6  # v6 added epochs.cpu_s
    root, _ = runs
    db = tmp_path / "old.duckdb"
    ResultsStore(db).close()
    con = duckdb.connect(str(db))
    for v in (3, 4, 5):
        for table, cols in MIGRATIONS[v].items():
            for c in cols:
                con.execute(f'ALTER TABLE {table} DROP COLUMN "{c}"')
    con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    con.close()
    with ResultsStore(db) as st:
        assert st.ingest_runs([root]).ingested == 4
        assert st.query("SELECT value FROM meta WHERE key = 'schema_version'").iloc[0, 0] == "6"
        assert st.query("SELECT count(*) FROM epochs WHERE cpu_s > 0").iloc[0, 0] > 0
        assert st.query("SELECT count(*) FROM windows WHERE missed_union IS NOT NULL").iloc[0, 0] > 0
        ep = st.query("SELECT bound_pipeline_s, epoch_over_pipeline, t_load FROM epochs "
                      "WHERE run_id = 'none-2'")
        assert ep.notna().all().all() and (ep.epoch_over_pipeline >= 1).all()
        assert st.query("SELECT count(t_stall_max) FROM minibatches").iloc[0, 0] > 0
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(ValueError, match="v2.*collect into a new file"):
        ResultsStore(db)
