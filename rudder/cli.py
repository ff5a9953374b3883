"""`rudder` console script: one subcommand group per area, each registered by its own module.

Each area module exposes `register(subparsers)` that adds its parser(s) and sets `func` on them;
the function receives the parsed args and returns an exit code. Imports stay lazy inside those
functions so `rudder --help` is fast (torch/dgl are slow to import).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# (module, purpose) — a module listed here must define register(subparsers).
AREAS = [
    "rudder.doctor",
    "rudder.data.cli",
    "rudder.run_cli",
    "rudder.sim.oracle_cli",
    "rudder.agent.cli",
    "rudder.agent.classifiers_cli",
    "rudder.sim.cli",
    "rudder.results.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rudder",
        description="Rudder: LLM-steered halo-feature prefetching for distributed GNN training.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # area not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so a closed pipe is caught below and not at exit
        return code
    except BrokenPipeError:
        # the reader went away (`rudder query --csv | head`): not an error; no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, KeyError, OSError) as exc:
        # Bad input (a bad value, a missing file, a file where a folder is wanted, a path that
        # cannot be written, an unknown host): one clear line, no traceback (use -v for it).
        if args.verbose:
            raise
        print(f"rudder {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
