"""Run directories on disk: finding them, reading their record files, fingerprinting their
content (an unchanged run is not collected again)."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from rudder.records import read_jsonl, read_run
from rudder.results.schema import CHILD_TABLES

INGEST_VERSION = 2  # bump when ingest logic changes; part of the fingerprint (forces re-ingest)
_RANK_FILE = re.compile(r"^(minibatches|epochs|windows|decisions)-r(\d+)\.jsonl$")


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories (those holding a run.json) at or below each path, sorted, no duplicates.

    A path may be one run directory or any directory above run directories (runs/, a study's
    folder). A run directory is not searched further (its logs/ holds no runs).
    """
    found: dict[Path, None] = {}
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"no such runs directory: {p}")
        if (p / "run.json").is_file():
            found[p.resolve()] = None
            continue
        if not p.is_dir():
            raise FileNotFoundError(f"not a run directory (no run.json) nor a folder: {p}")
        for root, dirs, files in os.walk(p):
            if "run.json" in files:
                found[Path(root).resolve()] = None
                dirs[:] = []
            else:
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found)


def read_records(path: Path) -> list:
    """records.read_jsonl, faster: the whole file parsed in one call when every line is a JSON
    object; otherwise (a torn or corrupt line) line by line through read_jsonl itself."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    try:
        recs = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        return read_jsonl(path)
    if len(recs) != len(lines) or not all(isinstance(r, dict) for r in recs):
        return read_jsonl(path)  # a line held more (or less) than one record
    return recs


def rank_files(run_dir: Path) -> dict[str, dict[int, Path]]:
    out: dict[str, dict[int, Path]] = {t: {} for t in CHILD_TABLES}
    for f in run_dir.iterdir():
        m = _RANK_FILE.match(f.name)
        if m and f.is_file():
            out[m.group(1)][int(m.group(2))] = f
    return out


def fingerprint(run_dir: Path, files: list[Path], study: str | None) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"ingest-v{INGEST_VERSION}|study={study}|".encode())
    for f in sorted(files):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def dedupe(records: list[dict], key: str) -> list[dict]:
    """Last record per key wins (a resumed writer may repeat one); records without key stay."""
    seen: dict[Any, int] = {}
    for i, r in enumerate(records):
        k = r.get(key)
        if k is not None:
            try:
                seen[k] = i
            except TypeError:  # unhashable key value: keep the record
                pass
    if len(seen) == sum(r.get(key) is not None for r in records):
        return records
    keep = set(seen.values())
    return [r for i, r in enumerate(records)
            if r.get(key) is None or i in keep or not _hashable(r.get(key))]


def _hashable(x: Any) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def run_json_study(run_dir: Path) -> str | None:
    try:
        meta = read_run(run_dir)
        return meta.get("study") if isinstance(meta, dict) else None
    except (OSError, json.JSONDecodeError):
        return None
