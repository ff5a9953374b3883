"""One DGL graph server: `python -m rudder.cluster.dist_server`.

Configured entirely by the environment LocalCluster (or any launcher) sets: DGL_ROLE=server,
DGL_SERVER_ID, DGL_IP_CONFIG, DGL_NUM_SERVER, DGL_NUM_CLIENT, DGL_CONF_PATH, DGL_GRAPH_FORMAT.
`dgl.distributed.initialize` loads this machine's partition into shared memory, listens on the
port of its ip_config line, serves until every client of the cluster has disconnected, and exits.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
import time

REQUIRED = ("DGL_SERVER_ID", "DGL_IP_CONFIG", "DGL_NUM_SERVER", "DGL_NUM_CLIENT", "DGL_CONF_PATH")


def main() -> int:
    faulthandler.enable()  # a native crash in DGL leaves a traceback in the log
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("rudder.cluster.dist_server")
    missing = [k for k in REQUIRED if not os.environ.get(k)]
    if os.environ.get("DGL_ROLE") != "server" or missing:
        print(f"dist_server: needs DGL_ROLE=server and {', '.join(missing or REQUIRED)} "
              "in the environment (LocalCluster sets them)", file=sys.stderr)
        return 2
    os.environ.setdefault("DGLBACKEND", "pytorch")
    t0 = time.perf_counter()
    import dgl.distributed  # noqa: E402  (slow: torch + dgl)

    log.info("server %s: dgl %s imported in %.1f s; loading %s", os.environ["DGL_SERVER_ID"],
             dgl.__version__, time.perf_counter() - t0, os.environ["DGL_CONF_PATH"])
    # Serves, then calls sys.exit() itself once all DGL_NUM_CLIENT clients have left.
    try:
        dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    else:
        code = 0
    log.info("server %s: done (%d)", os.environ["DGL_SERVER_ID"], code)
    return code


if __name__ == "__main__":
    rc = main()
    # Skip interpreter finalization: tearing down torch + dgl + pandas modules costs seconds
    # (measured 4-10 s on a busy 2-core host) and the server has nothing left to release.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
