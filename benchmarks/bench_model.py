"""The pure-torch GraphSAGE (rudder.model) against DGL's SAGEConv model, one training step each
on the same sampled minibatch (forward, loss, backward, Adam), side by side, on one device.

  python benchmarks/bench_model.py --dataset synth-bench --steps 30 [--device cpu] [--threads 1]

Each step samples one minibatch (10,25 fanouts, 1000 seeds as in the study) and gives each model
its own copy of the blocks, holding only the sampler's COO: each model pays for the formats it
builds (DGL's SAGEConv builds them inside its kernels; rudder.model converts the blocks to
tensors on the device, timed apart as `convert`). The order alternates every step. Then the
mean aggregation alone (forward + backward on the first layer's block, formats built beforehand)
for DGL's kernel, rudder.model's embedding_bag sums and two plain-torch alternatives (index_add_,
a torch.sparse CSR product). Prints Markdown tables and writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import rudder  # noqa: F401  (sets DGLBACKEND)
from rudder.device import describe, resolve, synchronize
from rudder.model import SAGE, as_blocks
from rudder.model_dgl import DGLSAGE


def coo_copy(blocks):
    import dgl

    out = []
    for b in blocks:
        src, dst = b.edges()
        out.append(dgl.create_block((src, dst), num_src_nodes=b.num_src_nodes(),
                                    num_dst_nodes=b.num_dst_nodes()))
    return out


def bench_aggregation(blocks, dims, device, reps=5) -> dict:
    """Median ms of forward + backward of the first layer's mean aggregation, per method and dim."""
    import dgl.function as fn

    from rudder.model import Block, mean_aggregate

    def dgl_mean(b, h):
        with b.local_scope():
            b.srcdata["h"] = h
            b.update_all(fn.copy_u("h", "m"), fn.mean("m", "n"))
            return b.dstdata["n"]

    def index_add(tb, src, dst, h):
        out = h.new_zeros((tb.num_dst, h.shape[1])).index_add_(0, dst, h.index_select(0, src))
        return out / tb.deg

    out: dict = {}
    for dim in dims:
        res = {"dgl": [], "rudder (embedding_bag)": [], "index_add_": [], "torch.sparse CSR": []}
        for b in blocks:
            tb = Block.from_dgl(b, device)
            src, dst = (t.to(device) for t in b.edges())
            a = torch.sparse_csr_tensor(tb.in_ptr, tb.in_src, (1.0 / tb.deg).repeat_interleave(
                tb.in_ptr.diff()), size=(tb.num_dst, tb.num_src))
            h = torch.randn(b.num_src_nodes(), dim, requires_grad=True)
            hd = h.detach().to(device).requires_grad_()
            fns = {"dgl": lambda: dgl_mean(b, h), "rudder (embedding_bag)": lambda: mean_aggregate(tb, hd),
                   "index_add_": lambda: index_add(tb, src, dst, hd), "torch.sparse CSR": lambda: a @ hd}
            for name, f in fns.items():
                f().sum().backward()  # warm (DGL builds and caches its formats here)
                for _ in range(reps):
                    t0 = time.perf_counter()
                    f().sum().backward()
                    synchronize(device)
                    res[name].append(time.perf_counter() - t0)
        out[dim] = {k: 1e3 * statistics.median(v) for k, v in res.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synth-bench", help="a synthetic preset (generated in memory)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--fanouts", type=int, nargs="+", default=[10, 25])
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a trainer's RUDDER_THREADS)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto; DGL's model runs on the CPU only")
    ap.add_argument("--out", default="benchmarks/results/model_cpu.json")
    args = ap.parse_args()

    import dgl

    from rudder.data.synthetic import generate

    torch.set_num_threads(args.threads)
    device = resolve(args.device)
    t0 = time.perf_counter()
    g = generate(args.dataset)
    print(f"{args.dataset}: {g.num_nodes()} nodes, {g.num_edges()} edges, generated in "
          f"{time.perf_counter() - t0:.0f} s")
    feat, label = g.ndata["feat"], g.ndata["label"].long()
    classes = int(label.max()) + 1
    train_ids = torch.nonzero(g.ndata["train_mask"]).flatten()
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    torch.manual_seed(0)
    ref = DGLSAGE(feat.shape[1], args.hidden, classes, len(args.fanouts))
    mine = SAGE(feat.shape[1], args.hidden, classes, len(args.fanouts))
    mine.load_state_dict(ref.state_dict())
    mine.to(device)
    opts = {"dgl": torch.optim.Adam(ref.parameters(), lr=0.003),
            "torch": torch.optim.Adam(mine.parameters(), lr=0.003)}
    times: dict[str, list[float]] = {"dgl": [], "torch": [], "convert": []}
    losses: dict[str, float] = {}
    sizes, first_blocks = [], []
    for step in range(args.warmup + args.steps):
        seeds = train_ids[torch.randint(train_ids.numel(), (args.batch_size,))].unique()
        input_nodes, out_nodes, blocks = sampler.sample_blocks(g, seeds)
        sizes.append([(b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()) for b in blocks])
        x, y = feat[input_nodes], label[out_nodes]
        if len(first_blocks) < 5:
            first_blocks.append(coo_copy(blocks)[0])
        copies = {"dgl": coo_copy(blocks), "torch": coo_copy(blocks)}
        order = ("dgl", "torch") if step % 2 == 0 else ("torch", "dgl")
        for name in order:
            model, opt = (ref, opts["dgl"]) if name == "dgl" else (mine, opts["torch"])
            torch.manual_seed(step)  # the same dropout masks
            t0 = time.perf_counter()
            if name == "torch":
                bl = as_blocks(copies[name], device)
                xd, yd = x.to(device), y.to(device)
                synchronize(device)
                t_conv = time.perf_counter() - t0
            else:
                bl, xd, yd = copies[name], x, y
            loss = F.cross_entropy(model(bl, xd), yd)
            opt.zero_grad()
            loss.backward()
            opt.step()
            synchronize(device)
            dt = time.perf_counter() - t0
            losses[name] = loss.item()
            if step >= args.warmup:
                times[name].append(dt)
                if name == "torch":
                    times["convert"].append(t_conv)

    def ms(xs):
        return {"median_ms": 1e3 * statistics.median(xs), "mean_ms": 1e3 * statistics.fmean(xs)}

    res = {
        "dataset": args.dataset, "steps": args.steps, "batch_size": args.batch_size,
        "fanouts": args.fanouts, "hidden": args.hidden, "feat_dim": int(feat.shape[1]),
        "threads": args.threads, "device": describe(device), "host": dgl.__version__ and _host(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "block_sizes_median": [[int(statistics.median(s[i][k] for s in sizes)) for k in range(3)]
                               for i in range(len(args.fanouts))],
        "dgl": ms(times["dgl"]), "torch": ms(times["torch"]), "torch_convert": ms(times["convert"]),
        "ratio_median": statistics.median(times["torch"]) / statistics.median(times["dgl"]),
        "ratio_mean": statistics.fmean(times["torch"]) / statistics.fmean(times["dgl"]),
        "final_loss": losses,
    }
    agg_dims = sorted({args.hidden, int(feat.shape[1])})
    res["aggregation_ms"] = bench_aggregation(first_blocks, agg_dims, device)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print("| model | step median (ms) | step mean (ms) | of which block conversion (median ms) |")
    print("|---|---:|---:|---:|")
    print(f"| DGL SAGEConv (CPU) | {res['dgl']['median_ms']:.1f} | {res['dgl']['mean_ms']:.1f} | - |")
    print(f"| rudder.model ({device}) | {res['torch']['median_ms']:.1f} | {res['torch']['mean_ms']:.1f} | "
          f"{res['torch_convert']['median_ms']:.1f} |")
    print(f"ratio torch/DGL: median {res['ratio_median']:.2f}, mean {res['ratio_mean']:.2f}; "
          f"blocks (src, dst, edges) median {res['block_sizes_median']}; final loss {losses}")
    names = list(next(iter(res["aggregation_ms"].values())))
    print("\nmean aggregation, first layer, forward + backward (median ms):\n")
    print("| dim | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for dim, r in res["aggregation_ms"].items():
        print(f"| {dim} | " + " | ".join(f"{r[n]:.1f}" for n in names) + " |")


def _host() -> dict:
    import os
    import platform

    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None}


if __name__ == "__main__":
    main()
