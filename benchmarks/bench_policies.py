"""Policies side by side on real emulated clusters: remote rows fetched and epoch time as
ratios to `none`, %-hits as a fraction of Belady's over all remote nodes on the same trace, buffer overhead share.

  python benchmarks/bench_policies.py --dataset synth-bench --machines 2 4 \
      --fractions 0.25 0.5 --bandwidth 1gbit --epochs 1 --max-steps 40

`--samplers 0 1` runs every cell with each number of DistDGL sampler processes per trainer
(train.samplers: 0 = sampling in the loader thread before the pull), side by side; each row
also shows the epoch against its pipeline and compute-only bounds (rudder.bounds).
`--pulls 1 2` runs every cell (with samplers >= 1) with each number of feature pulls in flight
(train.pulls_in_flight); the ratios are to `none` with the first of them.

Prints a Markdown table (paste into BENCHMARKS.md) and writes it to --out.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from rudder.config import RunConfig
from rudder.records import read_jsonl
from rudder.runner import execute_run


def bench_config(args, machines: int, bandwidth: str | None, **prefetch) -> RunConfig:
    """One benchmark run: `--max-steps` minibatches per epoch, no validation pass between epochs."""
    agent = {"model": {"name": getattr(args, "agent_model", "qwen2.5-coder-0.5b")},
             "backend": getattr(args, "agent_backend", "inproc")}
    return RunConfig.model_validate({
        "agent": agent,
        "dataset": {"name": args.dataset, "root": getattr(args, "data_root", "data"),
                    "feature_dtype": getattr(args, "feature_dtype", "float32")},
        "train": {"epochs": args.epochs, "batch_size": args.batch_size,
                  "max_steps_per_epoch": args.max_steps, "eval_every": 0,
                  "samplers": getattr(args, "samplers_now", 0),
                  "pulls_in_flight": getattr(args, "pulls_now", 1)},
        "prefetch": prefetch,
        "cluster": {"machines": machines, "bandwidth": None if bandwidth == "none" else bandwidth,
                    "run_timeout_s": 3600},
        "runs_dir": args.runs_dir,
    })


def summarize(run_dir: Path, ranks: int) -> dict:
    mbs = [m for r in range(ranks) for m in read_jsonl(run_dir / f"minibatches-r{r}.jsonl")]
    eps = [e for r in range(ranks) for e in read_jsonl(run_dir / f"epochs-r{r}.jsonl")]
    remote = sum(m["remote_rows"] for m in mbs)
    hits = sum(m["hits"] for m in mbs)
    t_mb = sum(m["t_sample"] + m["t_fetch"] + m["t_compute"] for m in mbs)
    out = {
        "epoch_s": float(np.mean([e["t_epoch"] for e in eps])),
        "fetched_rows_per_epoch": sum(m["fetched_rows"] for m in mbs) / max(1, len(eps) / ranks) / ranks,
        "remote_rows": remote,
        "hit_rate": hits / remote if remote else 0.0,
        "buffer_share": sum(m["t_buffer"] for m in mbs) / t_mb if t_mb else 0.0,
        "t_fetch_share": sum(m["t_fetch"] for m in mbs) / t_mb if t_mb else 0.0,
        "val_acc": float(np.mean([e["val_acc"] for e in eps if e.get("val_acc") is not None] or [0])),
        "hits": hits,
        # the policy's cost to the loader (plan + observe): for the agent, queue polls only
        "policy_share": sum(m.get("t_policy") or 0.0 for m in mbs) / t_mb if t_mb else 0.0,
        "policy_ms_max": 1e3 * max((m.get("t_policy") or 0.0 for m in mbs), default=0.0),
        "stall_share": sum(m["t_stall"] for m in mbs) / t_mb if t_mb else 0.0,
    }
    from rudder.bounds import run_bounds

    b = run_bounds({r: read_jsonl(run_dir / f"minibatches-r{r}.jsonl") for r in range(ranks)},
                   {r: read_jsonl(run_dir / f"epochs-r{r}.jsonl") for r in range(ranks)})
    out.update(slowest_epoch_s=b.epoch_s, pipeline_s=b.pipeline_s, compute_s=b.compute_s,
               over_pipeline=b.epoch_over_pipeline, over_compute=b.epoch_over_compute,
               # the loader's stages, ms per minibatch (mean over ranks and minibatches)
               **{f"{k}_ms": 1e3 * float(np.mean([m.get(k) or 0.0 for m in mbs]))
                  for k in ("t_sample", "t_sample_wait", "t_fetch", "t_assemble", "t_load", "t_compute")})
    decisions = [d for r in range(ranks) for d in read_jsonl(run_dir / f"decisions-r{r}.jsonl")]
    if decisions:
        out["decisions"] = len(decisions)
        out["applied"] = sum(d.get("applied_step") is not None for d in decisions)
    return out


def belady_hits(run_dir: Path, ranks: int) -> int:
    from rudder.sim.oracle import belady
    from rudder.trace import Trace

    total = 0
    for r in range(ranks):
        p = run_dir / f"trace-r{r}.npz"
        if p.exists():
            total += belady(Trace.load(p), universe="all").total_hits  # the yardstick (§11)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synth-bench")
    ap.add_argument("--machines", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5])
    ap.add_argument("--policies", nargs="+", default=["none", "static", "fixed", "lookahead"])
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--samplers", type=int, nargs="+", default=[0],
                    help="DistDGL sampler processes per trainer; several: each, side by side")
    ap.add_argument("--pulls", type=int, nargs="+", default=[1],
                    help="feature pulls in flight (train.pulls_in_flight; >1 needs --samplers >= 1)")
    ap.add_argument("--feature-dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                    help="features as stored by the servers and moved on the wire (dataset.feature_dtype)")
    ap.add_argument("--runs-dir", default="runs/bench")
    ap.add_argument("--data-root", default="data", help="where the datasets and their partitions are")
    ap.add_argument("--agent-model", default="qwen2.5-coder-0.5b", help="model of policy `agent`")
    ap.add_argument("--agent-backend", default="inproc", choices=["inproc", "http"])
    ap.add_argument("--out", default="benchmarks/results/policies.md")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    rows = []
    cells = [(m, f, p, s, k) for m in args.machines for f in args.fractions for p in args.policies
             for s in args.samplers for k in args.pulls]
    # (machines, samplers, pulls) -> `none`'s summary: one run serves every fraction; the
    # ratios' base is `none` with the first --pulls
    nones: dict = {}
    for machines, frac, policy, samplers, pulls in cells:
        base = nones.get((machines, samplers, args.pulls[0]))
        if policy == "none" and (machines, samplers, pulls) in nones:
            rows.append((machines, frac, policy, (samplers, pulls), nones[machines, samplers, pulls], base))
            continue
        args.samplers_now, args.pulls_now = samplers, pulls
        cfg = bench_config(args, machines, args.bandwidth, policy=policy, prefetch_fraction=frac)
        t0 = time.time()
        res = execute_run(cfg)
        if not res.ok:
            rows.append((machines, frac, policy, (samplers, pulls), f"FAILED: {res.reason}"))
            continue
        s = summarize(res.run_dir, machines)
        s["belady_hits"] = belady_hits(res.run_dir, machines) if policy != "none" else 0
        s["wall_s"] = time.time() - t0
        if policy == "none":
            nones[machines, samplers, pulls] = s
        rows.append((machines, frac, policy, (samplers, pulls), s,
                     nones.get((machines, samplers, args.pulls[0]))))
    lines = [
        f"dataset {args.dataset} ({args.feature_dtype}), bandwidth {args.bandwidth}, batch {args.batch_size}, "
        f"{args.epochs} epoch(s) x {args.max_steps} minibatches, 1 trainer/machine",
        "",
        "| machines | fraction | policy | samplers, pulls in flight | rows fetched / none | epoch time / none | %-hits "
        "| hits / Belady (all remote nodes) | buffer overhead | policy time (share, max ms) | stall share | val acc "
        "| epoch s (slowest rank) | pipeline bound s | epoch / pipeline | compute-only s "
        "| epoch / compute | loader ms/minibatch: sample, waited, pull, assemble, total | compute ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if isinstance(row[4], str):
            lines.append(f"| {row[0]} | {row[1]} | {row[2]} | {row[3][0]}, {row[3][1]} | {row[4]} |" + " |" * 14)
            continue
        m, f, p, (ns, npulls), s, base = row
        rr = s["fetched_rows_per_epoch"] / base["fetched_rows_per_epoch"] if base else float("nan")
        tr = s["epoch_s"] / base["epoch_s"] if base else float("nan")
        hb = s["hits"] / s["belady_hits"] if s["belady_hits"] else float("nan")
        label = f"{p} ({s['applied']}/{s['decisions']} decisions applied)" if "decisions" in s else p
        lines.append(f"| {m} | {f} | {label} | {ns}, {npulls} | {rr:.2f} | {tr:.2f} | {100 * s['hit_rate']:.1f} | {hb:.2f} | "
                     f"{100 * s['buffer_share']:.1f}% | {100 * s['policy_share']:.2f}%, {s['policy_ms_max']:.1f} | "
                     f"{100 * s['stall_share']:.1f}% | {s['val_acc']:.3f} | {s['slowest_epoch_s']:.2f} | "
                     f"{s['pipeline_s']:.2f} | {s['over_pipeline']:.2f} | {s['compute_s']:.2f} | "
                     f"{s['over_compute']:.2f} | {s['t_sample_ms']:.0f}, {s['t_sample_wait_ms']:.0f}, "
                     f"{s['t_fetch_ms']:.0f}, {s['t_assemble_ms']:.0f}, {s['t_load_ms']:.0f} | "
                     f"{s['t_compute_ms']:.0f} |")
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps([r[:5] for r in rows], default=str, indent=1))


if __name__ == "__main__":
    main()
