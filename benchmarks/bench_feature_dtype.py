"""Features moved as float32 vs float16 (or bfloat16): the same graph, link, policy and seed,
runs interleaved by dtype so the host's load falls on both alike. Per run: epoch time, rows and
bytes fetched per epoch, bytes per row (from the records), hits, validation accuracy at the end.

  python benchmarks/bench_feature_dtype.py --dataset synth-medium --machines 2 \\
      --bandwidth 100mbit --policies none lookahead --dtypes float32 float16 --repeats 2

Prints a Markdown table (paste into BENCHMARKS.md) and writes it to --out (and its .json).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_policies import bench_config, summarize  # noqa: E402

from rudder.records import read_jsonl  # noqa: E402
from rudder.runner import execute_run  # noqa: E402


def run_once(args, dtype: str, policy: str) -> dict:
    cfg = bench_config(args, args.machines, args.bandwidth, policy=policy,
                       prefetch_fraction=args.fraction)
    cfg.dataset.feature_dtype = dtype
    cfg.train.seed = args.seed
    t0 = time.time()
    res = execute_run(cfg)
    if not res.ok:
        return {"dtype": dtype, "policy": policy, "failed": res.reason}
    s = summarize(res.run_dir, args.machines)
    mbs = [m for r in range(args.machines) for m in read_jsonl(res.run_dir / f"minibatches-r{r}.jsonl")]
    rows, nbytes = sum(m["fetched_rows"] for m in mbs), sum(m["fetched_bytes"] for m in mbs)
    epochs = len(read_jsonl(res.run_dir / "epochs-r0.jsonl"))
    last = [read_jsonl(res.run_dir / f"epochs-r{r}.jsonl")[-1] for r in range(args.machines)]
    return {"dtype": dtype, "policy": policy, "run_id": res.run_id, "epoch_s": s["epoch_s"],
            "rows_per_epoch": rows / epochs, "bytes_per_epoch": nbytes / epochs,
            "bytes_per_row": nbytes / rows if rows else 0.0, "hit_rate": s["hit_rate"],
            "t_fetch_share": s["t_fetch_share"], "val_acc": last[0]["val_acc"],
            "train_acc": float(np.mean([e["train_acc"] for e in last])), "wall_s": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synth-medium")
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--policies", nargs="+", default=["none", "lookahead"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    ap.add_argument("--bandwidth", default="100mbit")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="the same training seed for every run")
    ap.add_argument("--runs-dir", default="runs/bench-dtype")
    ap.add_argument("--out", default="benchmarks/results/feature_dtype.md")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = []
    for rep in range(args.repeats):
        for policy in args.policies:
            for dtype in args.dtypes:  # interleaved: the host's load falls on each dtype alike
                r = run_once(args, dtype, policy)
                r["repeat"] = rep
                out.append(r)
                logging.info("%s", r)
    base = {(r["repeat"], r["policy"]): r for r in out
            if r["dtype"] == args.dtypes[0] and "failed" not in r}
    lines = [f"dataset {args.dataset}, {args.machines} machines, bandwidth {args.bandwidth}, "
             f"fraction {args.fraction}, batch {args.batch_size}, {args.epochs} epochs x "
             f"{args.max_steps} minibatches, seed {args.seed}; ratios against {args.dtypes[0]} "
             "of the same repeat and policy", "",
             "| repeat | policy | dtype | epoch s | epoch / base | rows per epoch | MB per epoch | "
             "bytes / base | bytes per row | %-hits | fetch share | train acc | val acc | val acc - base |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out:
        if "failed" in r:
            lines.append(f"| {r['repeat']} | {r['policy']} | {r['dtype']} | FAILED: {r['failed']} |"
                         + " |" * 10)
            continue
        b = base.get((r["repeat"], r["policy"]))
        ratio = lambda k: f"{r[k] / b[k]:.2f}" if b and b[k] else "–"  # noqa: E731
        dacc = f"{100 * (r['val_acc'] - b['val_acc']):+.1f} pt" if b and r["val_acc"] is not None \
            and b["val_acc"] is not None else "–"
        lines.append(
            f"| {r['repeat']} | {r['policy']} | {r['dtype']} | {r['epoch_s']:.2f} | {ratio('epoch_s')} | "
            f"{r['rows_per_epoch']:,.0f} | {r['bytes_per_epoch'] / 1e6:.1f} | {ratio('bytes_per_epoch')} | "
            f"{r['bytes_per_row']:.0f} | {100 * r['hit_rate']:.1f} | {100 * r['t_fetch_share']:.0f}% | "
            f"{r['train_acc']:.3f} | {r['val_acc']:.3f} | {dacc} |")
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
