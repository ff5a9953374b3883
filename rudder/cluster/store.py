"""The run's torch.distributed rendezvous store: `python -m rudder.cluster.store`, started by
machine 0's supervisor (rudder.cluster.machine) with a socket it already bound and listens on
($RUDDER_STORE_FD: machine 0's address and port, loopback in a loopback run, never *:port).

torch's own env:// rendezvous would have rank 0 bind MASTER_PORT on every interface when it
starts, so a port checked free earlier could be taken meanwhile. Here the port is held from the
supervisor's bind to the end of the run, and the trainers join as clients of this store
(TORCHELASTIC_USE_AGENT_STORE=True: torch's path for a store hosted by a launcher agent).
Runs until SIGTERM (the supervisor stops it with the services once the trainers are done).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path


def main() -> int:
    fd = int(os.environ["RUDDER_STORE_FD"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: done.set())
    from torch.distributed import TCPStore

    store = TCPStore(host, port, None, True, timedelta(hours=24), wait_for_workers=False,
                     master_listen_fd=fd)
    ready = os.environ.get("RUDDER_READY_FILE")
    if ready:
        Path(ready).write_text(f"{host}:{port}\n")
    print(f"rendezvous store on {host}:{port}", flush=True)
    done.wait()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
