"""`python -m rudder.workflow.block --run-id ID [--study NAME] < request.json`: one run in its
own process (the train_block app starts it; see rudder.workflow.tasks.run_block).

Reads `{"config": RunConfig, "launch": {type, ifname, srun_args}}` (JSON) on stdin — the launch
is the execution config's `launch:` as data (rudder.cluster.launch) — calls
rudder.runner.execute_run and exits 0 when the run is complete, 1 when it failed, 2 on a bad
config. It dies with its parent (PR_SET_PDEATHSIG), and a lock on the run directory keeps two
attempts (e.g. an orphan of a killed study and its rerun) from running the same run at once: the
second waits, then skips a run the first completed (unless --rerun). An attempt starts from an
empty record set: execute_run moves an earlier attempt's records to runs/<id>/attempts/<n>/.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rudder.workflow.block",
                                     description="one Rudder run, {config, launch} as JSON on stdin")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--study")
    parser.add_argument("--rerun", action="store_true",
                        help="run even if another attempt completed it meanwhile")
    parser.add_argument("--lock-timeout", type=float, default=None,
                        help="seconds to wait for another attempt of this run (default: its "
                        "cluster.run_timeout_s)")
    args = parser.parse_args(argv)
    _die_with_parent()
    parent = os.getppid()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("rudder.workflow.block")

    from rudder.config import ConfigError, RunConfig, format_validation_error
    from pydantic import ValidationError

    from rudder.cluster.launch import ClusterError, Launch

    try:
        request = json.loads(sys.stdin.read())
        if not isinstance(request, dict) or "config" not in request:
            raise ValueError('stdin: expected {"config": ..., "launch": ...}')
        cfg = RunConfig.model_validate(request["config"])
        launch = Launch.of(request.get("launch"))
    except (ValidationError, ValueError, ClusterError) as exc:
        msg = format_validation_error(exc, "stdin") if isinstance(exc, ValidationError) else str(exc)
        print(msg, file=sys.stderr)
        return 2
    if os.getppid() != parent:  # parent died between fork and prctl
        return 3

    from rudder.workflow.study import config_hash
    from rudder.workflow.tasks import is_complete

    run_dir = Path(cfg.runs_dir) / args.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_timeout = args.lock_timeout if args.lock_timeout is not None else cfg.cluster.run_timeout_s
    with open(run_dir / ".lock", "a+") as lock:
        deadline = time.monotonic() + lock_timeout
        waited = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    print(f"run {args.run_id}: another attempt still holds {run_dir}/.lock "
                          f"after {lock_timeout:.0f} s", file=sys.stderr)
                    return 1
                if not waited:
                    log.warning("run %s: another attempt is running; waiting for it", args.run_id)
                    waited = True
                time.sleep(1.0)
        if waited and not args.rerun and is_complete(run_dir, config_hash(cfg)):
            log.info("run %s: completed by the other attempt", args.run_id)
            return 0
        from rudder.runner import execute_run

        try:
            res = execute_run(cfg, run_id=args.run_id, study=args.study, launch=launch)
        except ConfigError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        log.info("run %s %s%s", res.run_id, "complete" if res.ok else "failed",
                 f": {res.reason}" if res.reason else "")
        return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
