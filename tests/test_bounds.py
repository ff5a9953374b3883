"""rudder.bounds: the compute-only and pipeline bounds of a run, hand-computed."""
from __future__ import annotations

import pytest

from rudder.bounds import run_bounds


def mb(epoch, step, t_sample, t_compute):
    return {"epoch": epoch, "step": step, "t_sample": t_sample, "t_compute": t_compute}


def test_two_ranks_two_epochs():
    # step compute = least t_compute over the ranks (rank 0's includes waiting at the all-reduce)
    mbs = {
        0: [mb(0, 0, 0.1, 0.5), mb(0, 1, 0.1, 0.6), mb(1, 0, 0.2, 0.5), mb(1, 1, 0.2, 0.5)],
        1: [mb(0, 0, 0.4, 0.3), mb(0, 1, 0.1, 0.2), mb(1, 0, 0.9, 0.4), mb(1, 1, 0.1, 0.4)],
    }
    eps = {0: [{"epoch": 0, "t_epoch": 2.0}, {"epoch": 1, "t_epoch": 3.0}],
           1: [{"epoch": 0, "t_epoch": 2.5}, {"epoch": 1, "t_epoch": 2.0}]}
    b = run_bounds(mbs, eps)
    # epoch 0: compute 0.3 + 0.2 = 0.5; pipeline rank0 max(.1,.3)+max(.1,.2) = .5,
    #          rank1 max(.4,.3)+max(.1,.2) = .6 -> .6; epoch time max(2.0, 2.5) = 2.5
    # epoch 1: compute 0.4 + 0.4 = 0.8; pipeline rank0 .4+.4 = .8, rank1 .9+.4 = 1.3 -> 1.3; 3.0
    got = [v for p in b.per_epoch for v in (p["compute_s"], p["pipeline_s"], p["epoch_s"])]
    assert got == pytest.approx([0.5, 0.6, 2.5, 0.8, 1.3, 3.0])
    assert b.epochs == 2
    assert b.compute_s == pytest.approx(0.65) and b.pipeline_s == pytest.approx(0.95)
    assert b.epoch_s == pytest.approx(2.75)
    assert b.epoch_over_compute == pytest.approx(2.75 / 0.65)
    assert b.epoch_over_pipeline == pytest.approx(2.75 / 0.95)
    assert b.compute_s <= b.pipeline_s <= b.epoch_s


def test_missing_times_count_as_zero_and_no_epochs_no_ratio():
    b = run_bounds({0: [{"epoch": 0, "step": 0, "t_sample": None, "t_compute": 0.2},
                        {"epoch": 0, "step": 1, "t_compute": None, "t_sample": 0.3}]})
    assert (b.compute_s, b.pipeline_s) == pytest.approx((0.2, 0.5))
    assert b.epoch_s is None and b.epoch_over_pipeline is None and b.epoch_over_compute is None


def test_epochs_without_an_epoch_time_are_left_out_of_the_means():
    """A run killed mid-epoch: its last epoch has minibatches but no epoch record."""
    mbs = {0: [mb(0, 0, 0.1, 1.0), mb(1, 0, 0.1, 5.0)]}
    b = run_bounds(mbs, {0: [{"epoch": 0, "t_epoch": 2.0}]})
    assert (b.compute_s, b.pipeline_s, b.epoch_s) == pytest.approx((1.0, 1.0, 2.0))
    assert b.epochs == 2 and b.per_epoch[1]["epoch_s"] is None


def test_the_same_bound_as_the_results_store(tmp_path):
    """One definition: the store's vs_none query (SQL) and run_bounds agree on a run whose
    ranks differ in sampling and compute time step by step."""
    import json
    import random

    from rudder.records import read_jsonl
    from rudder.results import queries
    from rudder.results.store import ResultsStore
    from synthetic_runs import write_synthetic_run  # tests/synthetic_runs.py

    d = write_synthetic_run(tmp_path / "runs", "r", policy="static", machines=2, epochs=2, steps=7)
    rng = random.Random(1)
    mbs, eps = {}, {}
    for rank in (0, 1):
        p = d / f"minibatches-r{rank}.jsonl"
        recs = [{**m, "t_sample": rng.uniform(0.01, 0.2), "t_compute": rng.uniform(0.02, 0.15)}
                for m in read_jsonl(p)]
        p.write_text("".join(json.dumps(m) + "\n" for m in recs))
        mbs[rank], eps[rank] = recs, read_jsonl(d / f"epochs-r{rank}.jsonl")
    b = run_bounds(mbs, eps)
    db = tmp_path / "r.duckdb"
    with ResultsStore(db) as st:
        st.ingest_runs([tmp_path / "runs"])
    with ResultsStore(db, read_only=True) as st:
        row = queries.run_named(st, "vs_none").iloc[0]
    assert row.bound_s == pytest.approx(b.pipeline_s)
    assert row.epoch_s == pytest.approx(b.epoch_s)
    assert row.epoch_over_bound == pytest.approx(b.epoch_over_pipeline)
    assert b.compute_s < b.pipeline_s  # sampling is slower than compute on some steps here


def test_epoch_bounds_as_the_trainers_gather_them():
    """The EpochRecord's bounds (rudder.train.gather_bounds -> epoch_bounds) are run_bounds' of
    that one epoch: the same hand-computed figures as epoch 1 of test_two_ranks_two_epochs."""
    from rudder.bounds import epoch_bounds

    got = epoch_bounds(1, [([0.2, 0.2], [0.5, 0.5], 3.0), ([0.9, 0.1], [0.4, 0.4], 2.0)])
    assert got == pytest.approx({"t_epoch_max": 3.0, "bound_compute_s": 0.8, "bound_pipeline_s": 1.3,
                                 "epoch_over_compute": 3.0 / 0.8, "epoch_over_pipeline": 3.0 / 1.3})
