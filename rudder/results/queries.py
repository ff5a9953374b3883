"""Named example queries over the results store: the questions a scaling study asks.

Each is plain SQL over the tables defined in rudder/results/schema.py; `{runs}` stands for the
runs table, optionally restricted to one study. Conventions shared by the queries:

- Performance summaries (speedup, remote_rows, hit_rate) use complete runs only: a failed run's
  epochs are partial. Decision statistics use every decision recorded.
- An epoch of a run lasts as long as its slowest trainer (max over ranks: the ranks meet at the
  gradient all-reduce every step); a run's epoch time is the mean over its epochs; a group's is
  the mean over its runs (repeats weigh equally).
- Rows per epoch are summed over ranks (what the cluster pulled in that epoch), then averaged
  like times.
- Baseline ratios compare with policy 'none' (plain DistDGL, no buffer) at the same dataset,
  machines and simulated flag; NULL where the study ran no baseline there.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NamedQuery:
    name: str
    description: str
    sql: str  # `{runs}` is replaced by the (optionally study-filtered) runs table


_COMPLETE = "r AS (SELECT * FROM {runs} WHERE status = 'complete')"

_EPOCH_TIME = f"""
WITH {_COMPLETE},
epoch_time AS (  -- an epoch lasts as long as its slowest trainer
  SELECT e.run_id, e.epoch, max(e.t_epoch) AS t_epoch
  FROM epochs e JOIN r USING (run_id)
  WHERE e.t_epoch > 0  -- a trace replay (rudder sim) records no time (0 s): not an epoch time
  GROUP BY e.run_id, e.epoch),
run_time AS (
  SELECT run_id, avg(t_epoch) AS epoch_s, count(*) AS epochs FROM epoch_time GROUP BY run_id),
g AS (
  SELECT r.dataset, r.machines, r.simulated, r.policy, count(*) AS runs,
         sum(t.epochs)::BIGINT AS epochs, avg(t.epoch_s) AS mean_epoch_s,
         stddev_samp(t.epoch_s) AS std_epoch_s
  FROM run_time t JOIN r USING (run_id)
  GROUP BY r.dataset, r.machines, r.simulated, r.policy)
SELECT g.dataset, g.machines, g.policy, g.simulated, g.runs, g.epochs, g.mean_epoch_s,
       g.std_epoch_s, b.mean_epoch_s AS none_epoch_s,
       g.mean_epoch_s / b.mean_epoch_s AS ratio_to_none,
       b.mean_epoch_s / g.mean_epoch_s AS speedup
FROM g LEFT JOIN g b
  ON b.policy = 'none' AND b.dataset = g.dataset AND b.machines = g.machines
 AND b.simulated = g.simulated
ORDER BY g.dataset, g.simulated, g.machines, g.policy
"""

_REMOTE_ROWS = f"""
WITH {_COMPLETE},
per_epoch AS (  -- summed over ranks: what the cluster pulled in that epoch
  SELECT e.run_id, e.epoch, sum(e.remote_rows) AS remote_rows,
         sum(e.fetched_rows) AS fetched_rows, sum(e.fetched_bytes) AS fetched_bytes
  FROM epochs e JOIN r USING (run_id)
  GROUP BY e.run_id, e.epoch),
fill AS (  -- the initial buffer fill, reported apart (once per rank, whichever epoch holds it)
  SELECT run_id, sum(fill) AS initial_fill_rows FROM (
    SELECT e.run_id, e.rank, max(e.initial_fill_rows) AS fill
    FROM epochs e JOIN r USING (run_id) GROUP BY e.run_id, e.rank)
  GROUP BY run_id),
per_run AS (
  SELECT run_id, avg(remote_rows) AS remote_rows, avg(fetched_rows) AS fetched_rows,
         avg(fetched_bytes) AS fetched_bytes
  FROM per_epoch GROUP BY run_id),
g AS (
  SELECT r.dataset, r.machines, r.simulated, r.policy, count(*) AS runs,
         avg(p.remote_rows) AS remote_rows_per_epoch,
         avg(p.fetched_rows) AS fetched_rows_per_epoch,
         avg(p.fetched_bytes) AS fetched_bytes_per_epoch,
         avg(f.initial_fill_rows) AS initial_fill_rows
  FROM per_run p JOIN r USING (run_id) LEFT JOIN fill f USING (run_id)
  GROUP BY r.dataset, r.machines, r.simulated, r.policy)
SELECT g.dataset, g.machines, g.policy, g.simulated, g.runs, g.remote_rows_per_epoch,
       g.fetched_rows_per_epoch, g.fetched_bytes_per_epoch, g.initial_fill_rows,
       b.fetched_rows_per_epoch AS none_fetched_rows_per_epoch,
       g.fetched_rows_per_epoch / b.fetched_rows_per_epoch AS ratio_to_none
FROM g LEFT JOIN g b
  ON b.policy = 'none' AND b.dataset = g.dataset AND b.machines = g.machines
 AND b.simulated = g.simulated
ORDER BY g.dataset, g.simulated, g.machines, g.policy
"""

_HIT_RATE = f"""
WITH {_COMPLETE},
per_run AS (  -- %-hits of a run: buffer hits / all remote input rows, pooled over its epochs
  SELECT e.run_id, 100.0 * sum(e.hits) / nullif(sum(e.remote_rows), 0) AS hit_pct
  FROM epochs e JOIN r USING (run_id)
  GROUP BY e.run_id)
SELECT r.dataset, r.policy, count(*) AS runs, avg(p.hit_pct) AS hit_pct,
       min(p.hit_pct) AS min_hit_pct, max(p.hit_pct) AS max_hit_pct
FROM per_run p JOIN r USING (run_id)
GROUP BY r.dataset, r.policy
ORDER BY r.dataset, hit_pct DESC NULLS LAST, r.policy
"""

_VS_NONE = f"""
WITH {_COMPLETE},
epoch_time AS (  -- an epoch lasts as long as its slowest trainer
  SELECT e.run_id, e.epoch, max(e.t_epoch) AS t_epoch, sum(e.fetched_rows) AS fetched_rows,
         sum(e.hits) AS hits, sum(e.remote_rows) AS remote_rows
  FROM epochs e JOIN r USING (run_id)
  WHERE e.t_epoch IS NOT NULL
  GROUP BY e.run_id, e.epoch),
step_compute AS (  -- a rank's compute includes waiting at the gradient all-reduce for the
                   -- slowest rank (often one still fetching): the least over ranks is compute
  SELECT m.run_id, m.epoch, m.step, min(m.t_compute) AS t_compute
  FROM minibatches m JOIN r USING (run_id)
  GROUP BY m.run_id, m.epoch, m.step),
bound_rank AS (  -- features free: the loader samples while the trainer computes
  SELECT m.run_id, m.epoch, m.rank,
         sum(greatest(coalesce(m.t_sample, 0), coalesce(c.t_compute, 0))) AS bound_s
  FROM minibatches m JOIN r USING (run_id)
  JOIN step_compute c ON c.run_id = m.run_id AND c.epoch = m.epoch AND c.step = m.step
  GROUP BY m.run_id, m.epoch, m.rank),
bound_epoch AS (
  SELECT run_id, epoch, max(bound_s) AS bound_s FROM bound_rank GROUP BY run_id, epoch),
per_run AS (
  SELECT t.run_id, avg(t.t_epoch) AS epoch_s, avg(t.fetched_rows) AS fetched_rows,
         avg(b.bound_s) AS bound_s, sum(t.hits) AS hits, sum(t.remote_rows) AS remote_rows
  FROM epoch_time t LEFT JOIN bound_epoch b USING (run_id, epoch)
  GROUP BY t.run_id),
g AS (
  SELECT r.dataset, r.machines, r.simulated, r.policy, any_value(r.bandwidth) AS bandwidth,
         count(*) AS runs, avg(p.epoch_s) AS epoch_s, avg(p.fetched_rows) AS fetched_rows,
         avg(p.bound_s) AS bound_s, 100.0 * sum(p.hits) / nullif(sum(p.remote_rows), 0) AS hit_pct
  FROM per_run p JOIN r USING (run_id)
  GROUP BY r.dataset, r.machines, r.simulated, r.policy)
SELECT g.dataset, g.machines, g.policy, g.simulated, g.bandwidth, g.runs,
       g.fetched_rows AS fetched_rows_per_epoch,
       g.fetched_rows / nullif(b.fetched_rows, 0) AS rows_ratio,
       g.epoch_s, g.epoch_s / b.epoch_s AS epoch_ratio, b.epoch_s / g.epoch_s AS speedup,
       g.hit_pct, g.bound_s, g.epoch_s / nullif(g.bound_s, 0) AS epoch_over_bound
FROM g LEFT JOIN g b
  ON b.policy = 'none' AND b.dataset = g.dataset AND b.machines = g.machines
 AND b.simulated = g.simulated
ORDER BY g.dataset, g.simulated, g.machines, g.policy
"""

_AGENT_DECISIONS = """
SELECT d.run_id, r.dataset, r.machines, d.rank, d.decision, d."window", d.decided_step,
       d.applied_step, d.model, d.replace, d.budget, d.fallback, d.reason, d.latency_s,
       d.correct, d.correct_cf, d.cf_rows_saved,
       -- the windows the counterfactual judge replayed (run.json's `judge`, kept in runs.extra)
       try_cast(json_extract_string(r.extra, '$.judge.horizon') AS INTEGER) AS cf_horizon
FROM decisions d JOIN {runs} r USING (run_id)
WHERE r.policy = 'agent'
ORDER BY r.dataset, r.machines, d.run_id, d.rank, d.decision
"""

_PASS_AT_1 = """
SELECT d.policy, d.model, count(DISTINCT d.run_id) AS runs, count(*) AS decisions,
       count(d.correct) AS evaluated,  -- decisions whose outcome was measured
       count(*) FILTER (WHERE d.correct) AS correct,
       count(*) FILTER (WHERE d.correct) / nullif(count(d.correct), 0) AS pass_at_1,
       count(d.correct_cf) AS evaluated_cf,  -- judged against the counterfactual (rudder agent judge)
       count(*) FILTER (WHERE d.correct_cf) AS correct_cf,
       count(*) FILTER (WHERE d.correct_cf) / nullif(count(d.correct_cf), 0) AS pass_at_1_cf,
       sum(d.cf_rows_saved) AS cf_rows_saved,
       count(*) FILTER (WHERE d.fallback) AS fallbacks,
       count(*) FILTER (WHERE d.replace) AS replaced
FROM decisions d JOIN {runs} USING (run_id)
GROUP BY d.policy, d.model
ORDER BY d.policy, d.model
"""

_STALENESS = """
WITH d AS (
  SELECT d.policy, d.model, d.run_id, d.latency_s,
         coalesce(d.staleness, d.applied_step - d.decided_step) AS staleness
  FROM decisions d JOIN {runs} USING (run_id))
SELECT policy, model, count(DISTINCT run_id) AS runs, count(*) AS decisions,
       count(staleness) AS applied,
       quantile_cont(staleness, 0.5) AS staleness_p50,
       quantile_cont(staleness, 0.95) AS staleness_p95,
       max(staleness) AS staleness_max,
       quantile_cont(latency_s, 0.5) AS latency_p50_s,
       quantile_cont(latency_s, 0.95) AS latency_p95_s
FROM d
GROUP BY policy, model
ORDER BY policy, model
"""

_FAILED_RUNS = """
SELECT run_id, study, dataset, machines, policy, status, reason, started_at, wall_s, run_dir
FROM {runs}
WHERE status IS DISTINCT FROM 'complete'
ORDER BY started_at NULLS LAST, run_id
"""

_RUNS = """
SELECT r.run_id, r.study, r.dataset, r.machines, r.trainers_per_machine, r.policy,
       r.prefetch_fraction, r.model, r.simulated, r.status, r.wall_s,
       (SELECT count(DISTINCT epoch) FROM epochs e WHERE e.run_id = r.run_id) AS epochs_done,
       (SELECT count(*) FROM decisions d WHERE d.run_id = r.run_id) AS decisions
FROM {runs} r
ORDER BY r.study NULLS FIRST, r.dataset, r.machines, r.policy, r.run_id
"""

NAMED: dict[str, NamedQuery] = {q.name: q for q in [
    NamedQuery("speedup", "mean epoch time by dataset, machines, policy; ratio to and speedup "
               "over policy 'none' at the same dataset+machines (complete runs)", _EPOCH_TIME),
    NamedQuery("remote_rows", "remote rows fetched per epoch (all ranks) by dataset, machines, "
               "policy; ratio to policy 'none' (complete runs)", _REMOTE_ROWS),
    NamedQuery("hit_rate", "mean %-hits (buffer hits / remote input rows) by dataset and policy "
               "(complete runs)", _HIT_RATE),
    NamedQuery("vs_none", "per dataset, machines and policy: rows fetched and epoch time as "
               "ratios to policy 'none', %-hits, and the features-free pipeline bound (per "
               "minibatch the larger of sampling and compute time, compute being the least "
               "over ranks since the others wait at the all-reduce; summed per epoch, slowest "
               "rank) with epoch time over it (complete runs)", _VS_NONE),
    NamedQuery("agent_decisions", "every decision of the agent policy's runs: when it was "
               "judged and applied, replace/keep, budget, fallback, the model's reason",
               _AGENT_DECISIONS),
    NamedQuery("pass_at_1", "share of policy decisions whose predicted effect matched the "
               "outcome (correct=true among evaluated), by policy and model; pass_at_1_cf: the share whose "
               "action beat its alternative replayed from the same buffer (correct_cf), cf_rows_saved: "
               "rows the decisions saved against their alternatives", _PASS_AT_1),
    NamedQuery("staleness", "decision staleness (minibatches from decided to applied) p50/p95 "
               "and answer latency, by policy and model", _STALENESS),
    NamedQuery("failed_runs", "runs that did not complete (failed, or still running / killed), "
               "with their reason", _FAILED_RUNS),
    NamedQuery("runs", "every run with its key config, status and progress", _RUNS),
]}


class UnknownQueryError(ValueError):
    """A named query that does not exist; the message lists the valid names."""


def get(name: str) -> NamedQuery:
    try:
        return NAMED[name]
    except KeyError:
        raise UnknownQueryError(
            f"unknown named query {name!r}; valid: {', '.join(NAMED)}") from None


def render(name: str, study: str | None = None) -> str:
    """The SQL of a named query, with `{runs}` bound to the runs of `study` (None = all)."""
    return get(name).sql.replace("{runs}", runs_relation(study)).strip()


def runs_relation(study: str | None = None) -> str:
    """SQL for the runs table, or its rows of one study (a parenthesised subquery)."""
    if study is None:
        return "runs"
    quoted = study.replace("'", "''")
    return f"(SELECT * FROM runs WHERE study = '{quoted}')"


def run_named(store, name: str, study: str | None = None):
    """Runs a named query on an open ResultsStore; returns a pandas DataFrame."""
    return store.query(render(name, study))
