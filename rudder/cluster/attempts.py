"""A run directory's attempts and owner: each attempt starts clean (what an earlier one left moves
to runs/<id>/attempts/<n>/), run.json names the process that owns the run, and a run whose owner
is gone (SIGKILL, a crash, a reboot) is marked `failed: interrupted` by the next command that
meets it (`rudder run`, the study, `rudder collect`), which also removes the namespaces of
clusters whose owner is gone."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from rudder.cluster.netns import cleanup_stale, process_alive, process_start_time
from rudder.records import update_run_json

log = logging.getLogger("rudder.runner")


def owner_info() -> dict:
    return {"pid": os.getpid(), "start": process_start_time(os.getpid()),
            "host": socket.gethostname()}


# The study's files: its .lock (hidden) and block.log, the log of every attempt (one header each),
# open as this very process's stdout when the study runs it.
KEEP_IN_PLACE = frozenset({"block.log"})


def set_aside_attempt(run_dir: Path) -> list[dict]:
    """Moves what earlier attempts left in run_dir to run_dir/attempts/<n>/ (hidden files and
    KEEP_IN_PLACE stay). Returns [{attempt, status, reason}] of every earlier attempt."""
    attempts = run_dir / "attempts"
    entries = [p for p in run_dir.iterdir()
               if not p.name.startswith(".") and p != attempts and p.name not in KEEP_IN_PLACE]
    if entries:
        n = 1 + sum(1 for p in attempts.iterdir() if p.is_dir()) if attempts.is_dir() else 1
        dest = attempts / str(n)
        dest.mkdir(parents=True)
        for p in entries:
            shutil.move(str(p), dest / p.name)
        log.info("run dir %s: earlier attempt moved to %s", run_dir, dest)
    out = []
    for d in sorted((p for p in attempts.iterdir() if p.is_dir() and p.name.isdigit()),
                    key=lambda p: int(p.name)) if attempts.is_dir() else []:
        try:
            info = json.loads((d / "run.json").read_text())
        except (OSError, ValueError):
            info = {}
        out.append({"attempt": int(d.name), "status": info.get("status"),
                    "reason": info.get("reason")})
    return out


def _unfinished(run_dir: str | Path) -> tuple[dict, dict] | None:
    """(run.json, its owner) of a run left preparing/running by an owner on this host, else None
    (another host's owner cannot be checked from here)."""
    try:
        info = json.loads((Path(run_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return None
    owner = info.get("owner") or {}
    if info.get("status") not in ("preparing", "running") or not owner.get("pid") or \
            owner.get("host") not in (None, socket.gethostname()):
        return None
    return info, owner


def live_owner(run_dir: Path) -> int | None:
    """The pid of a live process that owns the unfinished run in run_dir, else None."""
    found = _unfinished(run_dir)
    if found and found[1]["pid"] != os.getpid() and \
            process_alive(int(found[1]["pid"]), found[1].get("start")):
        return int(found[1]["pid"])
    return None


def reconcile_run(run_dir: str | Path) -> str | None:
    """A run.json left `preparing`/`running` by an owner that is gone (SIGKILL, a crash, a reboot)
    becomes `failed: interrupted`, and the namespaces of clusters whose owner is gone are removed
    (only those). Returns the new status line, or None when nothing changed."""
    found = _unfinished(run_dir)
    if found is None or process_alive(int(found[1]["pid"]), found[1].get("start")):
        return None
    info, owner = found
    reason = f"interrupted (owner pid {owner['pid']} gone while {info['status']})"
    update_run_json(Path(run_dir), status="failed", reason=reason,
                    ended_at=info.get("ended_at") or time.time())
    log.warning("run %s: %s", Path(run_dir).name, reason)
    if os.geteuid() == 0:
        try:
            removed = cleanup_stale()
            if removed:
                log.info("removed what dead owners left: %s", ", ".join(removed))
        except Exception as exc:  # cleanup is a courtesy here; the next cluster retries it
            log.warning("stale cluster cleanup failed: %s", exc)
    return f"failed: {reason}"
