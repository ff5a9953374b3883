"""How a process ended, in words (shared by the supervisor and LocalCluster)."""
from __future__ import annotations

import signal


def describe_exit(code: int) -> str:
    """`exited with code 3` / `was killed by signal SIGKILL` (Popen's negative return codes)."""
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
