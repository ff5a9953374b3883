"""Each run against its features-free bound, measured (issue 17, "an honest bound"): the same
config run twice more with `train.features_free=true` (same sampling schedule, sampler processes,
compute and cores; no remote row pulled), in alternating order, so the epoch is set beside what
it would be if remote features were free on this very host, under this very contention. The
computed pipeline bound (rudder/bounds.py) stands beside it: with sampler processes its sample
time is their wall time on shared cores, which can lift it past what a free run takes.

  python benchmarks/bench_measured_bound.py --rounds 2 \\
      --set dataset.name=synth-medium --set cluster.bandwidth=100mbit --set train.epochs=3 \\
      --set prefetch.policy=lookahead --set dataset.feature_dtype=float16 \\
      --set prefetch.prefetch_fraction=0.5 --set prefetch.schedule_ahead=true \\
      --set prefetch.universe=remote --set train.samplers=1

Round r runs real then free for odd r, free then real for even r. Prints one Markdown row per run
(mean epoch over the run's epochs, slowest rank) and per round the ratios; --out also writes them.
Where the cores went, per run: the trainers' own CPU per epoch (their records' `cpu_s`) and the
whole run's CPU per role, user + sys and sys alone (the machine supervisors' status files: each
child's as it was reaped, a trainer with its sampler processes): what the pulls cost beside the
features-free twin on shared cores.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rudder.config import load_run_config
from rudder.records import read_jsonl
from rudder.run_cli import parse_overrides
from rudder.runner import execute_run
from rudder.run_summary import summarize_run


def run_once(args, free: bool, tag: str) -> dict:
    sets = {**parse_overrides(args.set), "train.features_free": free, "runs_dir": str(args.runs_dir)}
    cfg = load_run_config(args.config, sets)
    load = os.getloadavg()[0]
    t0 = time.time()
    res = execute_run(cfg, run_id=tag)
    if not res.ok:
        raise SystemExit(f"{tag} failed: {res.reason} ({res.run_dir})")
    s = summarize_run(res.run_dir)
    b = s["bounds"]
    eps = read_jsonl(res.run_dir / "epochs-r0.jsonl")
    per_epoch = [e["t_epoch_max"] for e in eps]  # the slowest rank's, as every rank records it
    # where the cores went: the trainers' own CPU per epoch, the whole run's per role
    cpu_s = s["cpu_epoch_s"] if s["cpu_epoch_s"] is not None else float("nan")
    return {"run": tag, "free": free, "load": load, "wall_s": time.time() - t0, "epoch_s": s["epoch_s"],
            "pipeline_s": b["pipeline_s"], "compute_s": b["compute_s"],
            "per_epoch": per_epoch, "cpu_s": cpu_s, "run_cpu": s["cpu_by_role"],
            "rows_over_remote": s["fetched_rows"] / max(s["remote_rows"], 1),
            "val_acc": eps[-1].get("val_acc"), "run_dir": str(res.run_dir)}


def _cpu(x: dict, role: str) -> str:
    total, sys_s = x["run_cpu"].get(role, (float("nan"), float("nan")))
    return f"{total:.1f} ({sys_s:.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/baseline.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="the run's config keys, as `rudder run --set` (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/measured-bound"))
    ap.add_argument("--prefix", default=time.strftime("mb-%H%M%S"), help="run ids: PREFIX-r<round>-{real,free}")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    lines = ["| round | run | load | wall s | epoch s (per epoch) | mean epoch s | pipeline bound s | "
             "epoch / pipeline bound | compute-only bound s | trainers' CPU s / epoch | "
             "run's CPU s (sys): trainers + samplers | servers | rows / remote | val acc |",
             "|" + "---|" * 14]
    ratios = []
    for r in range(1, a.rounds + 1):
        order = (False, True) if r % 2 else (True, False)
        got = {}
        for free in order:
            x = got[free] = run_once(a, free, f"{a.prefix}-r{r}-{'free' if free else 'real'}")
            acc = "n/a (features free)" if free else (f"{x['val_acc']:.4f}" if x["val_acc"] is not None else "n/a")
            lines.append(f"| {r} | {'free' if free else 'real'} | {x['load']:.2f} | {x['wall_s']:.0f} | "
                         f"{' / '.join(f'{t:.2f}' for t in x['per_epoch'])} | {x['epoch_s']:.2f} | "
                         f"{x['pipeline_s']:.2f} | {x['epoch_s'] / x['pipeline_s']:.2f} | {x['compute_s']:.2f} | "
                         f"{x['cpu_s']:.2f} | {_cpu(x, 'trainer')} | {_cpu(x, 'server')} | {x['rows_over_remote']:.3f} | {acc} |")
            print(lines[-1], flush=True)
        real, free = got[False], got[True]
        ratios.append(f"round {r}: real / free (measured bound) {real['epoch_s'] / free['epoch_s']:.2f}; "
                      f"real / its pipeline bound {real['epoch_s'] / real['pipeline_s']:.2f}; "
                      f"free / its pipeline bound {free['epoch_s'] / free['pipeline_s']:.2f}; "
                      f"real's pipeline bound / free's epoch {real['pipeline_s'] / free['epoch_s']:.2f}; "
                      f"trainers' CPU real / free {real['cpu_s'] / free['cpu_s']:.2f}")
        print(ratios[-1], flush=True)
    text = "\n".join(lines + [""] + ratios) + "\n"
    print("\n" + text)  # the whole table once more, to paste
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
