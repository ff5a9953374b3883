"""Belady's optimum for collected runs, from the remote-access traces in their run directories.

Every trainer records `trace-r<R>.npz` (also under policy `none`: the oracle says what a buffer
would have saved). For each complete run whose directory is readable, Belady's demand-fetch
replacement (rudder.sim.oracle) is replayed on each rank's trace at the run's capacity,
starting from the run's initial fill: the most hits any demand-fetch policy could have had,
and the fewest rows any policy could have fetched. Runs whose directory is gone (or that
recorded no trace) are left out, and said to be.

    per_run, per_step, missing = belady_for_runs(store, study)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rudder.results.queries import runs_relation


def belady_for_runs(store, study: str | None = None
                    ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(per_run, per_step, missing):

    per_run: run_id, belady_hits, belady_fetched, belady_remote, trace_minibatches, ranks
      (summed over ranks, on the minibatches the run recorded);
    per_step: run_id, rank, global_step, belady_hits, remote_rows (one row per minibatch);
    missing: run ids without a readable trace.
    """
    from rudder.sim.oracle import belady
    from rudder.sim.trace import Trace, find_traces

    runs = store.query(f"SELECT run_id, run_dir FROM {runs_relation(study)} "
                       "WHERE status = 'complete' ORDER BY run_id")
    counts = store.query(f"""
        SELECT m.run_id, m.rank, count(*) AS n FROM minibatches m
        JOIN {runs_relation(study)} r USING (run_id) GROUP BY ALL""")
    recorded = {(r.run_id, int(r.rank)): int(r.n) for r in counts.itertuples()}
    rows, steps, missing = [], [], []
    for run in runs.itertuples():
        traces = find_traces(run.run_dir) if run.run_dir and Path(run.run_dir).is_dir() else {}
        if not traces:
            missing.append(run.run_id)
            continue
        tot = {"hits": 0, "fetched": 0, "remote": 0, "minibatches": 0}
        for rank, path in traces.items():
            trace = Trace.load(path)
            n = recorded.get((run.run_id, rank))
            if n is not None and n < trace.num_minibatches:  # a trace flushed past the records
                trace = trace.head(n)
            b = belady(trace)
            tot["hits"] += b.total_hits
            tot["fetched"] += b.misses
            tot["remote"] += b.total_remote
            tot["minibatches"] += trace.num_minibatches
            steps.append(pd.DataFrame({
                "run_id": run.run_id, "rank": rank,
                "global_step": np.arange(trace.num_minibatches, dtype=np.int64),
                "belady_hits": b.hits, "remote_rows": b.remote_rows}))
        rows.append({"run_id": run.run_id, "belady_hits": tot["hits"],
                     "belady_fetched": tot["fetched"], "belady_remote": tot["remote"],
                     "trace_minibatches": tot["minibatches"], "ranks": len(traces)})
    per_run = pd.DataFrame(rows, columns=["run_id", "belady_hits", "belady_fetched",
                                          "belady_remote", "trace_minibatches", "ranks"])
    per_step = (pd.concat(steps, ignore_index=True) if steps else
                pd.DataFrame(columns=["run_id", "rank", "global_step", "belady_hits",
                                      "remote_rows"]))
    return per_run, per_step, missing


def run_totals(store, study: str | None = None) -> pd.DataFrame:
    """Per complete run: dataset, machines, policy, hits, remote and fetched rows over all
    minibatch records (the same minibatches Belady is replayed on)."""
    return store.query(f"""
        SELECT r.run_id, r.dataset, r.machines, r.policy, r.simulated,
               sum(m.hits) AS hits, sum(m.remote_rows) AS remote_rows,
               sum(m.fetched_rows) AS fetched_rows
        FROM minibatches m JOIN {runs_relation(study)} r USING (run_id)
        WHERE r.status = 'complete'
        GROUP BY ALL ORDER BY r.run_id""")


def versus_belady(store, study: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(per_run, per_step, missing): run_totals joined with Belady's, plus
    hits_of_belady (run hits / Belady's hits) and fetched_over_belady (run fetched rows /
    Belady's fetched rows, >= 1 for every policy)."""
    per_run, per_step, missing = belady_for_runs(store, study)
    tot = run_totals(store, study)
    out = tot.merge(per_run, on="run_id", how="inner")
    out["hits_of_belady"] = out["hits"] / out["belady_hits"].where(out["belady_hits"] > 0)
    out["fetched_over_belady"] = (out["fetched_rows"]
                                  / out["belady_fetched"].where(out["belady_fetched"] > 0))
    return out, per_step, missing
