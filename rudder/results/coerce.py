"""Record values into typed columns: what fits a column's kind goes there, anything else (and
every field beyond the contract) into the row's `extra` JSON, so nothing a run wrote is lost."""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any

import pyarrow as pa

from rudder.records import HIT_TOL, ROWS_TOL, direction
from rudder.results.schema import ARROW_TYPE

MISSING = object()
_TRUE = {"true", "yes", "y", "1", "t"}
_FALSE = {"false", "no", "n", "0", "f", "", "none", "null"}


class FlagText(str):
    """A `flag` value given as text: stored as True, the text kept in `extra`."""


def coerce(value: Any, kind: str) -> Any:
    """Value for a column of `kind`, or MISSING when it does not fit (kept in `extra`)."""
    if value is None:
        return None
    if kind == "int":
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value if -2**63 <= value < 2**63 else MISSING
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                return MISSING
        return MISSING
    if kind == "float":
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return MISSING
        return MISSING
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            low = value.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
        return MISSING
    if kind == "flag":
        b = coerce(value, "bool")
        return b if b is not MISSING else FlagText(value)
    if kind == "str":
        return value if isinstance(value, str) else json.dumps(value, default=str)
    if kind == "json":
        return json.dumps(value, default=str, sort_keys=True)
    if kind == "ts":
        try:
            if isinstance(value, (int, float)) and math.isfinite(value):
                return datetime.fromtimestamp(value, tz=timezone.utc).replace(tzinfo=None)
            if isinstance(value, str):
                dt = datetime.fromisoformat(value)
                if dt.tzinfo is not None:
                    dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
                return dt
        except (ValueError, OverflowError, OSError):
            pass
        return MISSING
    raise ValueError(f"unknown column kind {kind!r}")


def decision_outcomes(rec: dict) -> dict:
    """A decision record written before outcome_hit_delta/outcome_rows_delta existed carries
    numbers in outcome_hit_rate/outcome_remote_rows (classifier policies did): they become the
    deltas, and the direction columns get their directions (rudder.records.outcome_fields)."""
    hit, rows = rec.get("outcome_hit_rate"), rec.get("outcome_remote_rows")
    numeric = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in (hit, rows)]
    if not any(numeric) or "outcome_hit_delta" in rec or "outcome_rows_delta" in rec:
        return rec
    out = dict(rec)
    if numeric[0]:
        out["outcome_hit_rate"] = direction(float(hit), HIT_TOL)
        out["outcome_hit_delta"] = float(hit)
    if numeric[1]:
        out["outcome_remote_rows"] = direction(float(rows), ROWS_TOL)
        out["outcome_rows_delta"] = float(rows)
    return out


def records_table(run_id: str, rows: list[tuple[int, dict]], kinds: dict[str, str]) -> pa.Table:
    """(rank, record) pairs -> an Arrow table with the child table's columns."""
    n = len(rows)
    names = list(kinds)
    extras: list[dict | None] = [None] * n
    columns: dict[str, pa.Array] = {
        "run_id": pa.array([run_id] * n, pa.string()),
        "rank": pa.array([r for r, _ in rows], pa.int32()),
    }
    getter = itemgetter(*names)
    try:  # records usually carry every field: one C call per record
        tuples = [getter(rec) for _, rec in rows]
    except KeyError:
        tuples = [tuple(rec.get(k) for k in names) for _, rec in rows]
    by_column = list(zip(*tuples)) if tuples else [()] * len(names)
    for name, values in zip(names, by_column):
        kind = kinds[name]
        arr = _fast_array(list(values), kind)
        if arr is not None:
            columns[name] = arr
            continue
        out = []
        for i, v in enumerate(values):
            c = coerce(v, kind)
            if c is MISSING or isinstance(c, FlagText):
                extras[i] = extras[i] or {}
                extras[i][name] = v
                c = True if isinstance(c, FlagText) else None
            out.append(c)
        columns[name] = pa.array(out, ARROW_TYPE[kind])
    known = frozenset(names) | {"run_id", "rank"}
    all_keys = set().union(*(rec.keys() for _, rec in rows))
    beyond = not all_keys <= frozenset(names)  # usually False: nothing beyond the contract
    for i, (rank, rec) in enumerate(rows if beyond else ()):
        unknown = rec.keys() - known
        if "rank" in rec and rec["rank"] != rank:  # a record's own rank disagrees: keep it
            unknown.add("rank")
        if "run_id" in rec and rec["run_id"] != run_id:
            unknown.add("run_id")
        if unknown:
            extras[i] = extras[i] or {}
            extras[i].update((k, rec[k]) for k in sorted(unknown))
    columns["extra"] = pa.array(
        [None if e is None else json.dumps(e, default=str, sort_keys=True) for e in extras],
        pa.string())
    return pa.table(columns)


_FAST_OK = {  # inferred Arrow type -> fine as is for this kind (nulls are fine everywhere)
    "int": (pa.int64(),),
    "float": (pa.int64(), pa.float64()),
    "bool": (pa.bool_(),),
    "flag": (pa.bool_(),),
    "str": (pa.string(),),
}


def _fast_array(values: list, kind: str) -> pa.Array | None:
    """The column as Arrow when every value already has the column's type (type inferred in
    C), else None: the caller coerces value by value. (Not pa.array(values, type): pyarrow
    would silently truncate 1.5 to 1 in an int64 column.)"""
    if kind not in _FAST_OK:
        return None
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    if arr.type == pa.null():
        return pa.nulls(len(values), ARROW_TYPE[kind])
    if arr.type not in _FAST_OK[kind]:
        return None
    return arr.cast(ARROW_TYPE[kind]) if arr.type != ARROW_TYPE[kind] else arr
