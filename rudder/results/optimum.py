"""Belady's optimum for collected runs, from the remote-access traces in their run directories.

Every trainer records `trace-r<R>.npz` (also under policy `none`: the oracle says what a buffer
would have saved). For each complete run whose directory is readable, Belady's demand-fetch
replacement (rudder.sim.oracle) is replayed on each rank's trace at the run's capacity,
starting from the run's initial fill: the most hits any demand-fetch policy could have had,
and the fewest rows any policy could have fetched. Twice, each named for what it is (the same
buffer memory, capacity rows): "Belady, all remote nodes" (`belady_all_*`: any remote node the
trainer pulled may be kept, 2+ hops included: the yardstick) and "Belady, halo only"
(`belady_halo_*`: only 1-hop halo nodes, what today's buffer can hold). Runs whose directory is
gone (or that recorded no trace) are left out, and said to be.

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

    per_run: run_id, belady_all_hits, belady_all_fetched, belady_halo_hits,
      belady_halo_fetched, belady_remote, trace_minibatches, ranks (summed over ranks, on the
      minibatches the run recorded);
    per_step: run_id, rank, global_step, belady_all_hits, belady_halo_hits, remote_rows (one
      row per minibatch);
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
        tot = dict.fromkeys(("all_hits", "all_fetched", "halo_hits", "halo_fetched", "remote",
                             "minibatches"), 0)
        for rank, path in traces.items():
            trace = Trace.load(path)
            n = recorded.get((run.run_id, rank))
            if n is not None and n < trace.num_minibatches:  # a trace flushed past the records
                trace = trace.head(n)
            b, a = belady(trace), belady(trace, universe="all")
            tot["all_hits"] += a.total_hits
            tot["all_fetched"] += a.misses
            tot["halo_hits"] += b.total_hits
            tot["halo_fetched"] += b.misses
            tot["remote"] += b.total_remote
            tot["minibatches"] += trace.num_minibatches
            steps.append(pd.DataFrame({
                "run_id": run.run_id, "rank": rank,
                "global_step": np.arange(trace.num_minibatches, dtype=np.int64),
                "belady_all_hits": a.hits, "belady_halo_hits": b.hits,
                "remote_rows": b.remote_rows}))
        rows.append({"run_id": run.run_id, **{f"belady_{k}": v for k, v in tot.items()
                                              if k != "minibatches"},
                     "trace_minibatches": tot["minibatches"], "ranks": len(traces)})
    per_run = pd.DataFrame(rows, columns=PER_RUN)
    per_step = (pd.concat(steps, ignore_index=True) if steps else
                pd.DataFrame(columns=["run_id", "rank", "global_step", "belady_all_hits",
                                      "belady_halo_hits", "remote_rows"]))
    return per_run, per_step, missing


PER_RUN = ["run_id", "belady_all_hits", "belady_all_fetched", "belady_halo_hits",
           "belady_halo_fetched", "belady_remote", "trace_minibatches", "ranks"]


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
    """(per_run, per_step, missing): run_totals joined with both Belady's, plus per universe
    (all, halo) hits_of_belady_<u> (run hits / that Belady's hits) and fetched_over_belady_<u>
    (run fetched rows / that Belady's fetched rows: >= 1 for every policy against `all`, and
    against `halo` for every buffer that holds only halo nodes, as all of today's do)."""
    per_run, per_step, missing = belady_for_runs(store, study)
    tot = run_totals(store, study)
    out = tot.merge(per_run, on="run_id", how="inner")
    add_ratios(out)
    return out, per_step, missing


def add_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """hits_of_belady_<u> and fetched_over_belady_<u> for u in (all, halo), in place (NaN where
    that Belady has no hits / fetched nothing)."""
    for u in ("all", "halo"):
        h, f = df[f"belady_{u}_hits"], df[f"belady_{u}_fetched"]
        df[f"hits_of_belady_{u}"] = df["hits"] / h.where(h > 0)
        df[f"fetched_over_belady_{u}"] = df["fetched_rows"] / f.where(f > 0)
    return df
