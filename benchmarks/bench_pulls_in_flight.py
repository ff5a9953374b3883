"""Would a second pull in flight help? (issue 17, must-have 1: "several pulls in flight where the
link allows").

  python benchmarks/bench_pulls_in_flight.py [--dataset synth-medium] [--bandwidth 100mbit none]
         [--rows 2000 10000 40000] [--pulls 20] [--rounds 2] [--out benchmarks/results/pulls_in_flight.md]

A real 2-machine DistDGL cluster (LocalCluster: a DGL server per emulated machine, the link of
each shaped to --bandwidth, or unshaped with `none`) and one DGL client per machine, both pulling
at once from the other's server, as two trainers do. Each client pulls the same --pulls batches
of --rows remote feature rows (random remote nodes, seeded) two ways, in alternating order, --rounds
times:
  one in flight   `feat[ids]` per batch, one after another (DGL's fast pull: what the loader does)
  two in flight   the next batch's request is sent before the last one's rows are received
                  (DGL's own PullRequest via rpc.send_request_to_machine / recv_response; one
                  remote server answers in order), so the server reads batch k+1 while batch k's
                  rows are on the wire
and checks that both give the same rows. Printed and written: rows/s of each, per link and size.
Only the pull is measured: no sampling, no buffer. With one thread per process the trainer's
loader could do the same between two minibatches' pulls only where nothing else uses DGL's RPC
in between (sampling in sampler processes); this measures whether that would pay.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def client(a: argparse.Namespace) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import dgl
    from dgl.distributed import rpc
    from dgl.distributed.kvstore import PullRequest, get_kvstore

    from rudder.train import pin_dgl_machine

    pin_dgl_machine()
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    g = dgl.distributed.DistGraph(a.graph)
    feat = g.ndata["feat"]
    kv = get_kvstore()
    name = feat.kvstore_key
    policy = kv._part_policy[name]
    me = kv._machine_id
    every = torch.arange(g.num_nodes())
    remote = every[policy.to_partid(every) != me]
    target = int(policy.to_partid(remote[:1])[0])
    rng = np.random.default_rng(1000 + me)

    def one_in_flight(batches):
        return [feat[b] for b in batches]

    def two_in_flight(batches):
        out = []
        rpc.send_request_to_machine(target, PullRequest(name, batches[0]))
        for k in range(len(batches)):
            if k + 1 < len(batches):
                rpc.send_request_to_machine(target, PullRequest(name, batches[k + 1]))
            out.append(rpc.recv_response().data_tensor)  # the server answers in request order
        return out

    results = []
    for rows in a.rows:
        batches = [remote[torch.from_numpy(rng.choice(remote.numel(), rows, replace=False))]
                   for _ in range(a.pulls)]
        one_in_flight(batches[:2])  # warm-up
        ref = one_in_flight(batches)
        got = two_in_flight(batches)
        same = all(torch.equal(x, y) for x, y in zip(ref, got))
        times = {"one": [], "two": []}
        for r in range(a.rounds):
            for way in (("one", "two") if r % 2 == 0 else ("two", "one")):
                g.barrier()  # both clients pull at once, as trainers do
                t0 = time.perf_counter()
                (one_in_flight if way == "one" else two_in_flight)(batches)
                times[way].append(time.perf_counter() - t0)
        results.append({"rows": rows, "pulls": a.pulls, "same_rows": same, **times})
    Path(os.environ["RUDDER_RUN_DIR"], f"pulls-m{me}.json").write_text(json.dumps(results))
    g.barrier()
    dgl.distributed.exit_client()


def drive(a: argparse.Namespace) -> None:
    import statistics

    from rudder.cluster import ClusterSpec, LocalCluster

    part = Path(a.part_config) if a.part_config else ROOT / "data" / a.dataset / "parts" / "2-metis" / f"{a.dataset}.json"
    if not part.exists():
        sys.exit(f"bench_pulls_in_flight: no 2-part partition at {part}; run `rudder data partition "
                 f"{a.dataset} --parts 2` first")
    graph = json.loads(part.read_text())["graph_name"]
    lines = [f"{graph}, 2 machines, both clients pulling at once, {a.pulls} pulls per way, "
             f"{a.rounds} round(s) in alternating order, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"load {os.getloadavg()[0]:.1f}", "",
             "| link | rows per pull | one in flight: rows/s (median of rounds, slower client) | two in flight | two / one | same rows |",
             "|---|---|---|---|---|---|"]
    for bw in a.bandwidth:
        run_dir = Path(a.runs_dir) / f"pulls-{bw}-{int(time.time())}"
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = ClusterSpec(machines=2, bandwidth=None if bw == "none" else bw, rendezvous=False,
                           start_timeout_s=180, run_timeout_s=900)
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", "--graph", graph,
                "--pulls", str(a.pulls), "--rounds", str(a.rounds), "--rows", *map(str, a.rows)]
        with LocalCluster(spec, run_dir) as cluster:
            res = cluster.run(str(part), argv)
        if not res.ok:
            sys.exit(f"bench_pulls_in_flight: the {bw} run failed: {res.summary()}")
        per_m = [json.loads((run_dir / f"pulls-m{m}.json").read_text()) for m in range(2)]
        for i, rows in enumerate(a.rows):
            cells = [m[i] for m in per_m]
            rate = {w: min(rows * a.pulls / statistics.median(c[w]) for c in cells) for w in ("one", "two")}
            lines.append(f"| {bw} | {rows} | {rate['one']:,.0f} | {rate['two']:,.0f} | "
                         f"{rate['two'] / rate['one']:.2f} | {all(c['same_rows'] for c in cells)} |")
        print("\n".join(lines), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"-> {a.out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synth-medium")
    ap.add_argument("--part-config", help="a 2-part partition's JSON (default: the dataset's 2-metis one)")
    ap.add_argument("--bandwidth", nargs="+", default=["100mbit", "none"], help="tbf rate per link; none = unshaped")
    ap.add_argument("--rows", type=int, nargs="+", default=[2000, 10000, 40000])
    ap.add_argument("--pulls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs-dir", default="runs/bench_pulls")
    ap.add_argument("--out", default="benchmarks/results/pulls_in_flight.md")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)  # run by the cluster
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    a = ap.parse_args()
    (client if a.client else drive)(a)


if __name__ == "__main__":
    main()
