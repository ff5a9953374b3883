"""`rudder run [CONFIG | --config CONFIG] [--set key=value ...] [--check] [--dry-run]`: one training run."""
from __future__ import annotations

import argparse

import yaml


DEFAULT_CONFIG = "configs/baseline.yaml"


def register(sub) -> None:
    p = sub.add_parser("run", help="run one training run from a YAML config",
                       description="Stage + partition the dataset, start an emulated cluster "
                       "(DGL servers, trainers, agent service) and train; records go to runs/<id>/.")
    # Both spellings: `rudder run my.yaml` is what a newcomer types first.
    p.add_argument("config_file", nargs="?", metavar="CONFIG", help="run config YAML (same as --config)")
    p.add_argument("--config", help=f"run config YAML (default: {DEFAULT_CONFIG})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set prefetch.policy=fixed (repeatable)")
    p.add_argument("--run-id", help="run id (default: time-policy-random)")
    p.add_argument("--check", action="store_true", help="verify every assembled feature row")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config, dataset, model/classifier files and agent URL, print "
                        "the resolved config; start nothing")
    p.set_defaults(func=_run)


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        v = v.strip()
        if "," in v and not v.startswith(("[", "{", "'", '"')):
            v = f"[{v}]"  # 15,10 -> [15, 10]
        try:
            out[k.strip()] = yaml.safe_load(v)
        except yaml.YAMLError as exc:
            raise ValueError(f"--set {item!r}: not a YAML value ({exc.problem})") from None
    return out


def _run(args: argparse.Namespace) -> int:
    from rudder.config import load_run_config
    from rudder.runner import execute_run

    if args.config_file and args.config and args.config_file != args.config:
        raise ValueError(f"two configs given: {args.config_file} and --config {args.config}; give one")
    cfg = load_run_config(args.config_file or args.config or DEFAULT_CONFIG, parse_overrides(args.set))
    if args.dry_run:
        return dry_run(cfg, args.run_id)
    res = execute_run(cfg, run_id=args.run_id, check=args.check)
    print(f"{'complete' if res.ok else 'FAILED'}: {res.run_dir}" + (f" ({res.reason})" if res.reason else ""))
    if res.ok:
        from rudder.run_summary import format_summary, summarize_run

        print(format_summary(summarize_run(res.run_dir)))
    return 0 if res.ok else 1


def dry_run(cfg, run_id: str | None = None) -> int:
    """Everything `rudder run` checks before a cluster starts, and nothing else: problems go to
    stderr one per line (exit 2); else the resolved config (YAML) to stdout (exit 0)."""
    import sys

    from rudder.config import check_name
    from rudder.runner import preflight

    problems = []
    if run_id is not None:
        try:
            check_name(run_id, "run id")
        except ValueError as exc:
            problems.append(f"--run-id: {exc}")
    problems += preflight(cfg)
    for line in problems:
        print(f"rudder run: error: {line}", file=sys.stderr)
    if problems:
        return 2
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    print("# dry run: inputs valid; nothing started", file=sys.stderr)
    return 0
