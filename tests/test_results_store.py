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
from rudder.results.synthetic import write_synthetic_run

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
