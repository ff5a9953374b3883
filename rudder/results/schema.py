"""The results database's shape: tables, their columns and column kinds, the DDL.

The four record tables (minibatches, epochs, windows, decisions) take their columns from the
record dataclasses of rudder.records, in field order, with the kinds read from the field types
(rudder.records.column_kinds): one declaration, no second list to keep in step.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from rudder.config import stored_policy
from rudder.records import RECORDS, column_kinds

# v2: decisions.outcome_hit_rate/outcome_remote_rows are directions (VARCHAR), the numbers are
#     outcome_hit_delta/outcome_rows_delta (DOUBLE)
# v3: decisions.cf_rows_saved, cf_replace_share, correct_cf (the counterfactual judge)
# v4: the loader's stage times (minibatches and epochs: t_sample_wait, t_plan, t_assemble,
#     t_load, t_stall_max) and the epoch's bounds (epochs: t_epoch_max, bound_compute_s,
#     bound_pipeline_s, epoch_over_compute, epoch_over_pipeline); a v3 file is migrated in place
# v5: the windows' missed sets (missed_nodes, missed_again, missed_union)
# v6: epochs.cpu_s (the trainer process's CPU seconds in the epoch)
SCHEMA_VERSION = 6  # bump when a table changes shape; see MIGRATIONS for what an older file gets

# Kinds: int -> BIGINT, float -> DOUBLE, bool -> BOOLEAN, str -> VARCHAR, ts -> TIMESTAMP (UTC),
# json -> JSON; flag -> BOOLEAN where any other text counts as true (and is kept in `extra`).
# Every contract field has a kind; a field missing from a record is NULL.
FIELD_KINDS: dict[str, dict[str, str]] = {table: column_kinds(rec) for table, rec in RECORDS.items()}

# Per child table: the record field that identifies a row within (run_id, rank), and the file.
ROW_KEY = {"minibatches": "global_step", "epochs": "epoch", "windows": "window",
           "decisions": "decision"}
FILE_PREFIX = {"minibatches": "minibatches", "epochs": "epochs", "windows": "windows",
               "decisions": "decisions"}
CHILD_TABLES = tuple(FIELD_KINDS)
TABLES = ("studies", "runs") + CHILD_TABLES
# runs: flattened key config columns (name, kind, path into the resolved RunConfig dict).
CONFIG_COLUMNS: list[tuple[str, str, tuple[str, ...]]] = [
    ("dataset", "str", ("dataset", "name")),
    ("machines", "int", ("cluster", "machines")),
    ("trainers_per_machine", "int", ("cluster", "trainers_per_machine")),
    ("bandwidth", "str", ("cluster", "bandwidth")),
    ("policy", "str", ("prefetch", "policy")),
    ("prefetch_fraction", "float", ("prefetch", "prefetch_fraction")),
    ("model", "str", ("agent", "model", "name")),  # see _flatten_config: only agent/classifier
    ("batch_size", "int", ("train", "batch_size")),
    ("planned_epochs", "int", ("train", "epochs")),
]
RUN_COLUMNS: dict[str, str] = {
    "run_id": "str", "study": "str",
    **{name: kind for name, kind, _ in CONFIG_COLUMNS},
    "status": "str", "reason": "str", "simulated": "bool",
    "started_at": "ts", "ended_at": "ts", "wall_s": "float", "ranks": "int",
    "config": "json", "config_hash": "str", "timings": "json", "versions": "json",
    "host": "json", "seeds": "json", "run_dir": "str", "fingerprint": "str",
    "collected_at": "ts", "extra": "json",
}
RUN_JSON_KEYS = {"run_id", "study", "config", "config_hash", "status", "reason", "started_at",
                  "ended_at", "wall_s", "simulated", "versions", "host", "seeds", "timings"}

SQL_TYPE = {"int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN", "flag": "BOOLEAN",
             "str": "VARCHAR",
             "ts": "TIMESTAMP", "json": "JSON"}
ARROW_TYPE = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
               "flag": pa.bool_(), "str": pa.string(),
               "ts": pa.timestamp("us"), "json": pa.string()}


def ddl() -> list[str]:
    stmts = [
        "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
        """CREATE TABLE IF NOT EXISTS studies (
            study VARCHAR PRIMARY KEY, runs_root VARCHAR, runs BIGINT,
            first_collected_at TIMESTAMP, collected_at TIMESTAMP)""",
    ]
    cols = ",\n  ".join(f"{c} {SQL_TYPE[k]}" for c, k in RUN_COLUMNS.items())
    stmts.append(f"CREATE TABLE IF NOT EXISTS runs (\n  {cols},\n  PRIMARY KEY (run_id))")
    for table, kinds in FIELD_KINDS.items():
        # Key (run_id, rank, <ROW_KEY>) is made unique by ingest (last record wins), not by a
        # constraint: an index over millions of minibatch rows would cost more than it protects.
        cols = ",\n  ".join(f'"{c}" {SQL_TYPE[k]}' for c, k in kinds.items())
        stmts.append(f"CREATE TABLE IF NOT EXISTS {table} (\n  run_id VARCHAR NOT NULL,\n"
                     f"  rank INTEGER NOT NULL,\n  {cols},\n  extra JSON)")
    return stmts



# Versions a file can be brought from in place: from-version -> {table: columns added since}
# (added columns only: ingest inserts BY NAME, so their place at the table's end is harmless;
# rows collected before hold NULL there until re-collected). Other versions: collect anew.
_V4_STAGES = ["t_sample_wait", "t_plan", "t_assemble", "t_load", "t_stall_max"]
MIGRATIONS: dict[int, dict[str, list[str]]] = {
    3: {"minibatches": _V4_STAGES,
        "epochs": _V4_STAGES + ["t_epoch_max", "bound_compute_s", "bound_pipeline_s",
                                "epoch_over_compute", "epoch_over_pipeline"]},
    4: {"windows": ["missed_nodes", "missed_again", "missed_union"]},  # the misses' set drift (h18b)
    5: {"epochs": ["cpu_s"]},  # where the cores went
}


def migration(from_version: int) -> list[str] | None:
    """The statements that bring a file of `from_version` to SCHEMA_VERSION; None when it
    cannot be (collect into a new file)."""
    stmts: list[str] = []
    for v in range(from_version, SCHEMA_VERSION):
        if v not in MIGRATIONS:
            return None
        for table, cols in MIGRATIONS[v].items():
            stmts += [f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{c}" '
                      f'{SQL_TYPE[FIELD_KINDS[table][c]]}' for c in cols]
    return stmts


def dig(d: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def flatten_config(config: dict) -> dict[str, Any]:
    out = {name: dig(config, path) for name, _, path in CONFIG_COLUMNS}
    out["policy"] = stored_policy(config)  # `free`: a features-free run, never a baseline
    # `model` is the decision model: the agent's LLM, or a classifier's name. Every config
    # carries agent.model.name (a default), so for other policies it would only mislead.
    policy = out.get("policy") or ""
    if isinstance(policy, str) and policy.startswith("classifier:"):
        out["model"] = policy.split(":", 1)[1]
    elif policy != "agent":
        out["model"] = None
    return out
