"""The training path on a CUDA GPU: emulated machines on one GPU host (they spread over its
GPUs by rank, or share a single one), per policy: epoch time, remote rows fetched, stall share,
the halo buffer's device memory and the model's share of the epoch.

  make setup CUDA=1 && make models            # the CUDA torch; the agent's model
  python benchmarks/bench_gpu.py --dataset synth-bench --machines 2 4 \
      --policies none static lookahead agent --epochs 2 --max-steps 40

Where the model step goes in a trainer (BENCHMARKS.md §8: on an H100 it took 17x its isolated
time): `--samplers 1` moves sampling out of the trainer's process, `--omp-threads N` sets every
server's and trainer's threads; the table gives the last epoch alone beside the mean, with the
step's backward (where DDP's all-reduce waits for the slower rank) apart.

Every run asks for train.device=cuda, so a host without a usable GPU fails at once with the
reason. `--device cpu` runs the same table on the CPU (the same code path; a dry run of the
script). Prints a Markdown table (paste into BENCHMARKS.md) and writes it and JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_policies import bench_config, summarize  # noqa: E402

from rudder.device import DeviceError, resolve  # noqa: E402
from rudder.records import read_jsonl  # noqa: E402
from rudder.runner import execute_run  # noqa: E402


def last_epoch(run_dir: Path, ranks: int) -> dict:
    """The last epoch alone (the first carries CUDA's start-up), slowest rank: its time, and the
    medians over its minibatches of the model step and the in-process sampling (ms)."""
    last = {}
    for r in range(ranks):
        mbs = read_jsonl(run_dir / f"minibatches-r{r}.jsonl")
        e = max(m["epoch"] for m in mbs)
        mine = [m for m in mbs if m["epoch"] == e]
        t = max(x["t_epoch"] for x in read_jsonl(run_dir / f"epochs-r{r}.jsonl") if x["epoch"] == e)
        if t >= last.get("last_epoch_s", -1):
            last = {"last_epoch_s": t,
                    "last_compute_ms": 1e3 * statistics.median(m["t_compute"] for m in mine),
                    "last_backward_ms": 1e3 * statistics.median(m.get("t_backward") or 0.0 for m in mine),
                    "last_sample_ms": 1e3 * statistics.median(m["t_sample"] for m in mine)}
    return last


def device_figures(run_dir: Path, ranks: int) -> dict:
    """The device each rank trained on, its buffer's memory there, the model's share of the
    epochs (t_compute, synchronised on CUDA, over t_epoch)."""
    ctx = [json.loads((run_dir / f"context-r{r}.json").read_text())["extra"] for r in range(ranks)]
    eps = [e for r in range(ranks) for e in read_jsonl(run_dir / f"epochs-r{r}.jsonl")]
    dev = ctx[0].get("device") or {}
    return {
        "device": f"{dev.get('device')} {dev.get('name')}",
        "devices": sorted({c["device"]["device"] for c in ctx if c.get("device")}),
        "memory_gib": (dev.get("memory_bytes") or 0) / 2**30,
        "buffer_mib": statistics.fmean(c.get("buffer_bytes", 0) for c in ctx) / 2**20,
        "model_share": sum(e["t_compute"] for e in eps) / max(sum(e["t_epoch"] for e in eps), 1e-9),
        "torch": dev.get("torch"), "cuda": dev.get("cuda"), "threads": dev.get("threads"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synth-bench")
    ap.add_argument("--machines", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--policies", nargs="+", default=["none", "static", "lookahead", "agent"])
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu", "auto"])
    ap.add_argument("--bandwidth", default="1gbit", help="tbf rate per machine link; none = unshaped")
    ap.add_argument("--epochs", type=int, default=2, help="the first epoch includes warm-up")
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--runs-dir", default="runs/bench_gpu")
    ap.add_argument("--agent-model", default="qwen2.5-coder-0.5b", help="model of policy `agent`")
    ap.add_argument("--agent-backend", default="inproc", choices=["inproc", "http"])
    ap.add_argument("--samplers", type=int, default=0, help="train.samplers: DistDGL sampler processes "
                    "per trainer (0: the loader thread samples, beside the model step in one process)")
    ap.add_argument("--omp-threads", type=int, default=None, help="OMP_NUM_THREADS (torch and DGL threads) "
                    "of every server and trainer; default host cores / machines")
    ap.add_argument("--out", default="benchmarks/results/gpu.md")
    args = ap.parse_args()
    args.samplers_now = args.samplers
    if args.omp_threads:
        os.environ["OMP_NUM_THREADS"] = str(args.omp_threads)  # LocalCluster passes it on
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        resolve(args.device)
    except DeviceError as exc:
        sys.exit(f"bench_gpu: {exc}")
    rows = []
    for machines in args.machines:
        for policy in args.policies:
            cfg = bench_config(args, machines, args.bandwidth, policy=policy, prefetch_fraction=args.fraction)
            cfg.train.device = args.device
            t0 = time.time()
            res = execute_run(cfg)
            if not res.ok:
                rows.append({"machines": machines, "policy": policy, "failed": res.reason})
                continue
            s = summarize(res.run_dir, machines)
            rows.append({"machines": machines, "policy": policy, "run": res.run_id, "wall_s": time.time() - t0,
                         **s, **last_epoch(res.run_dir, machines), **device_figures(res.run_dir, machines)})
            write_table(args, rows)  # after every cell: a run cut short keeps what it measured
    print(write_table(args, rows))


def write_table(args, rows: list[dict]) -> str:
    """The Markdown table (and the rows as JSON) at --out; returns the table."""
    head = next((r for r in rows if "device" in r), {})
    lines = [
        f"dataset {args.dataset}, device {head.get('device', args.device)} "
        f"({head.get('memory_gib', 0):.0f} GiB; torch {head.get('torch')}, CUDA {head.get('cuda')}, "
        f"{head.get('threads')} thread(s)/trainer), bandwidth {args.bandwidth}, batch {args.batch_size}, "
        f"{args.epochs} epoch(s) x {args.max_steps} minibatches, fraction {args.fraction}, "
        f"samplers {args.samplers}, {time.strftime('%Y-%m-%d', time.gmtime())}",
        "",
        "| machines | policy | trainers on | epoch s | last epoch s | rows fetched / epoch / trainer | hit rate "
        "| stall share | buffer MiB on device | t_compute / epoch | step ms (last epoch) | of it backward + all-reduce "
        "| sample ms (last epoch) | val acc |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['machines']} | {r['policy']} | FAILED: {r['failed']} |" + " |" * 11)
            continue
        lines.append(f"| {r['machines']} | {r['policy']} | {', '.join(r['devices'])} | {r['epoch_s']:.2f} | "
                     f"{r['last_epoch_s']:.2f} | {r['fetched_rows_per_epoch']:.0f} | {r['hit_rate']:.3f} | "
                     f"{100 * r['stall_share']:.1f}% | {r['buffer_mib']:.1f} | {100 * r['model_share']:.1f}% | "
                     f"{r['last_compute_ms']:.1f} | {r['last_backward_ms']:.1f} | {r['last_sample_ms']:.1f} | "
                     f"{r['val_acc']:.3f} |")
    text = "\n".join(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, default=str, indent=1))
    return text


if __name__ == "__main__":
    main()
