"""The store's file lock: one writer (exclusive `fcntl.flock` on `<db>.lock`), many readers
(shared); a second collector waits for the first instead of failing on DuckDB's own lock."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("rudder.results.store")


class StoreLockedError(RuntimeError):
    """Another process holds the results database (a collector is writing, or readers are open
    while a collector waits) for longer than the lock timeout."""


def acquire(lock_path: Path, exclusive: bool, timeout_s: float):
    try:
        fh = open(lock_path, "a+")
    except OSError as exc:
        if exclusive:
            raise
        # A read-only directory: nobody can write there, so there is nothing to wait for.
        log.debug("no lock file for reading %s: %s", lock_path, exc)
        return None
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    waiting = False
    while True:
        try:
            fcntl.flock(fh.fileno(), op | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                fh.close()
                raise
            if time.monotonic() >= deadline:
                fh.close()
                raise StoreLockedError(
                    f"{lock_path.with_suffix('')} is in use by another process "
                    f"({'a collector or open readers' if exclusive else 'a collector'}); "
                    f"waited {timeout_s:.0f} s") from None
            if not waiting:
                waiting = True
                log.info("waiting for %s (held by another process; up to %.0f s)",
                         lock_path, timeout_s)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    if exclusive:  # who holds it, for whoever waits
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        fh.flush()
    return fh


def release(fh) -> None:
    """Drops a lock taken by `acquire` (None: there was none)."""
    if fh is not None:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        finally:
            fh.close()
