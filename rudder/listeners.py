"""Which process listens on a TCP port, from /proc: readiness of a run's own server (machine
supervisor, agent service), not of whatever else listens on that port on a shared host."""
from __future__ import annotations

import os
from pathlib import Path


def listen_inodes(port: int) -> set[int]:
    """Socket inodes of the TCP listeners on `port` in this network namespace."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and \
                    int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(parts[9]))
    return inodes


def listens(pid: int, port: int) -> bool:
    """True when process `pid` itself holds a socket listening on `port`: readiness of this
    run's server, not of whatever else listens there."""
    inodes = listen_inodes(port)
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
            return True
    return False
