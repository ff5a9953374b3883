"""Probe trainer for the LocalCluster tests: a DistDGL client that checks the emulated machines.

Run by LocalCluster with the trainer environment. It initialises DGL then gloo, opens the
DistGraph, pulls the features of nodes owned by the *other* partitions (so they cross machines),
compares them with the originals (--features: an .npy in partitioned node-id order), optionally
measures pull throughput, and writes <out>/rank<r>.json. Exit 0 when every row matched, 2 when
not. --fail-rank R makes rank R exit with --fail-code after --fail-after seconds while the other
ranks sleep (a trainer that dies while its peers wait forever).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

T_START = time.time()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph-name", required=True)
    ap.add_argument("--features", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--check-nodes", type=int, default=500)
    ap.add_argument("--pull-rounds", type=int, default=0)
    ap.add_argument("--fail-rank", type=int, default=None)
    ap.add_argument("--fail-code", type=int, default=3)
    ap.add_argument("--fail-after", type=float, default=0.5)
    args = ap.parse_args()

    import dgl
    import numpy as np
    import torch
    import torch.distributed as dist

    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    t_dgl = time.time()
    dist.init_process_group("gloo")  # env:// : MASTER_ADDR/PORT, RANK, WORLD_SIZE
    t_ddp = time.time()
    rank = dist.get_rank()

    if args.fail_rank is not None:
        if rank == args.fail_rank:
            time.sleep(args.fail_after)
            print(f"rank {rank}: failing on purpose with code {args.fail_code}", flush=True)
            with open(os.path.join(args.out, f"crash{rank}.json"), "w") as fh:
                json.dump({"rank": rank, "time": time.time()}, fh)
            os._exit(args.fail_code)
        time.sleep(3600)  # a peer that would wait forever

    g = dgl.distributed.DistGraph(args.graph_name)
    pb = g.get_partition_book()
    owner = pb.nid2partid(torch.arange(g.num_nodes()))
    remote = torch.nonzero(owner != pb.partid).squeeze(1)
    if len(remote) == 0:  # one machine: nothing is remote, check the local rows instead
        remote = torch.arange(g.num_nodes())
    original = np.load(args.features)
    gen = torch.Generator().manual_seed(rank)
    ids = remote[torch.randperm(len(remote), generator=gen)[: args.check_nodes]]
    pulled = g.ndata["feat"][ids].numpy()
    matched = bool(np.array_equal(pulled, original[ids.numpy()]))

    pull_s, pull_bytes = 0.0, 0
    if args.pull_rounds:
        dist.barrier()  # both machines pull at once, as in training
        t = time.perf_counter()
        for _ in range(args.pull_rounds):
            pull_bytes += g.ndata["feat"][remote].numel() * 4
        pull_s = time.perf_counter() - t

    dist.barrier()
    report = {
        "rank": rank, "machine": int(os.environ["RUDDER_MACHINE_ID"]), "partid": int(pb.partid),
        "addr": os.environ["RUDDER_MACHINE_ADDR"], "matched": matched, "checked": len(ids),
        "remote_nodes": len(remote), "t_start": T_START, "t_dgl": t_dgl, "t_ddp": t_ddp,
        "t_end": time.time(), "pull_s": pull_s, "pull_bytes": pull_bytes,
    }
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)
    print(json.dumps(report), flush=True)
    dist.destroy_process_group()
    dgl.distributed.exit_client()  # leaves DGL cleanly (it would run at exit otherwise)
    return 0 if matched else 2


if __name__ == "__main__":
    rc = main()
    # Skip interpreter finalization (seconds for torch + dgl + pandas); all is flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
