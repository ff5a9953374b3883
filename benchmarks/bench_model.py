"""The pure-torch GraphSAGE (rudder.model) against DGL's SAGEConv model, one training step each
on the same sampled minibatch (forward, loss, backward, Adam), side by side, on one device.

  python benchmarks/bench_model.py --dataset synth-bench --steps 30 [--device cpu] [--threads 1]

Each step samples one minibatch (10,25 fanouts, 1000 seeds as in the study) and gives each model
its own copy of the blocks, holding only the sampler's COO: each model pays for the formats it
builds (DGL's SAGEConv builds them inside its kernels; rudder.model converts the blocks to
tensors on the device, timed apart as `convert`). The order alternates every step. Prints a
Markdown table and writes JSON to --out.
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


class DGLSAGE(torch.nn.Module):
    """The model rudder.train used before: DGL's distributed GraphSAGE example."""

    def __init__(self, in_feats, hidden, classes, layers, dropout=0.5):
        super().__init__()
        from dgl.nn import SAGEConv

        dims = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.layers = torch.nn.ModuleList(SAGEConv(dims[i], dims[i + 1], "mean") for i in range(layers))
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


def coo_copy(blocks):
    import dgl

    out = []
    for b in blocks:
        src, dst = b.edges()
        out.append(dgl.create_block((src, dst), num_src_nodes=b.num_src_nodes(),
                                    num_dst_nodes=b.num_dst_nodes()))
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
    sizes = []
    for step in range(args.warmup + args.steps):
        seeds = train_ids[torch.randint(train_ids.numel(), (args.batch_size,))].unique()
        input_nodes, out_nodes, blocks = sampler.sample_blocks(g, seeds)
        sizes.append([(b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()) for b in blocks])
        x, y = feat[input_nodes], label[out_nodes]
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
            losses[name] = float(loss)
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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"| model | step median (ms) | step mean (ms) | of which block conversion (median ms) |")
    print("|---|---:|---:|---:|")
    print(f"| DGL SAGEConv (CPU) | {res['dgl']['median_ms']:.1f} | {res['dgl']['mean_ms']:.1f} | - |")
    print(f"| rudder.model ({device}) | {res['torch']['median_ms']:.1f} | {res['torch']['mean_ms']:.1f} | "
          f"{res['torch_convert']['median_ms']:.1f} |")
    print(f"ratio torch/DGL: median {res['ratio_median']:.2f}, mean {res['ratio_mean']:.2f}; "
          f"blocks (src, dst, edges) median {res['block_sizes_median']}; final loss {losses}")


def _host() -> dict:
    import os
    import platform

    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None}


if __name__ == "__main__":
    main()
