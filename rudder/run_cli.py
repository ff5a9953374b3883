"""`rudder run --config FILE [--set key=value ...] [--check]`: one training run."""
from __future__ import annotations

import argparse

import yaml


def register(sub) -> None:
    p = sub.add_parser("run", help="run one training run from a YAML config",
                       description="Stage + partition the dataset, start an emulated cluster "
                       "(DGL servers, trainers, agent service) and train; records go to runs/<id>/.")
    p.add_argument("--config", default="configs/baseline.yaml", help="run config YAML (default: %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set prefetch.policy=fixed (repeatable)")
    p.add_argument("--run-id", help="run id (default: time-policy-random)")
    p.add_argument("--check", action="store_true", help="verify every assembled feature row")
    p.set_defaults(func=_run)


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def _run(args: argparse.Namespace) -> int:
    from rudder.config import load_run_config
    from rudder.runner import execute_run

    cfg = load_run_config(args.config, parse_overrides(args.set))
    res = execute_run(cfg, run_id=args.run_id, check=args.check)
    print(f"{'complete' if res.ok else 'FAILED'}: {res.run_dir}" + (f" ({res.reason})" if res.reason else ""))
    if res.ok:
        from rudder.run_summary import format_summary, summarize_run

        print(format_summary(summarize_run(res.run_dir)))
    return 0 if res.ok else 1
