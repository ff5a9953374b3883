"""The environment a child process needs to run this copy of Rudder: this interpreter's venv
scripts first on PATH (parsl's interchange.py and process_worker_pool.py, `rudder`) and the
folder holding `rudder/` and `apps/` first on PYTHONPATH (DGL servers and trainers import
`rudder`, Parsl workers import `apps` by name). Used by the emulated clusters for their
processes and by the workflow for Parsl's (rudder.cluster.local, rudder.workflow.execution)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

PKG_ROOT = str(Path(__file__).resolve().parents[1])  # the folder holding `rudder/`


def first_on(value: str | None, entry: str) -> str:
    """A PATH-like `value` with `entry` first and nowhere else (empty parts dropped)."""
    rest = [p for p in (value or "").split(os.pathsep) if p and p != entry]
    return os.pathsep.join([entry, *rest])


def with_this_rudder(env: Mapping[str, str], root: str | Path | None = None) -> dict[str, str]:
    """A copy of `env` whose PATH starts with this interpreter's bin folder and whose
    PYTHONPATH starts with `root` (default: this package's root), so a child runs this venv
    and this copy of the package, not another one earlier on either path."""
    out = dict(env)
    out["PATH"] = first_on(env.get("PATH") or "/usr/bin:/bin", str(Path(sys.executable).parent))
    out["PYTHONPATH"] = first_on(env.get("PYTHONPATH"), str(root or PKG_ROOT))
    return out
