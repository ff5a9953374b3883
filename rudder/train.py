"""One DistDGL trainer: `python -m rudder.train --run-dir runs/<id>` (started by the cluster).

Reads the resolved config from run.json, joins the DGL servers and the gloo DDP group, trains
GraphSAGE with the Rudder feature path, and writes its records (rudder/records.py) as it goes.
Loop: the pipeline thread samples + assembles minibatch i+1 while this thread computes i.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import rudder  # noqa: F401  (sets DGLBACKEND)

log = logging.getLogger("rudder.train")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--check", action="store_true", help="verify every assembled row against a direct pull")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import dgl
    import torch
    import torch.nn.functional as F

    from rudder.config import RunConfig
    from rudder.model import SAGE
    from rudder.pipeline import MinibatchPipeline
    from rudder.prefetch.buffer import HaloBuffer, choose_initial
    from rudder.prefetch.features import BufferedFeatures
    from rudder.prefetch.metrics import MetricsCollector
    from rudder.prefetch.policies import LOOKAHEAD_POLICIES, make_policy
    from rudder.prefetch.policy import RunContext
    from rudder.records import JsonlWriter

    run = json.loads((args.run_dir / "run.json").read_text())
    cfg = RunConfig.model_validate(run["config"])
    tc, pc = cfg.train, cfg.prefetch
    part_config = run["part_config"]
    graph_name = json.loads(Path(part_config).read_text())["graph_name"]

    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])  # before init_process_group (DGL)
    # One GPU per trainer on GPU nodes (the launcher sets CUDA_VISIBLE_DEVICES); else the CPU.
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    # gloo also all-reduces CUDA tensors, and the CPU-side counters below stay valid with it.
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.set_num_threads(int(os.environ.get("RUDDER_THREADS", "1")))
    torch.manual_seed(tc.seed + rank)

    g = dgl.distributed.DistGraph(graph_name, part_config=part_config)
    pb = g.get_partition_book()
    part_id = pb.partid
    train_nids = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    val_nids = dgl.distributed.node_split(g.ndata["val_mask"], pb, force_even=True)

    # Halo nodes: in the local partition's graph but owned by another partition.
    local_g = g.local_partition
    inner = local_g.ndata["inner_node"].bool()
    halo = local_g.ndata[dgl.NID][~inner]
    feat = g.ndata["feat"]
    feat_dim = int(feat.shape[1])
    capacity = int(pc.prefetch_fraction * halo.numel())

    policy = make_policy(pc, agent=cfg.agent)
    buffer = None
    init_rows = 0
    t_init = 0.0
    if policy.uses_buffer:
        degrees = g.in_degrees(halo) if pc.init == "degree" and halo.numel() else None
        init_ids = choose_initial(halo, capacity, pc.init, degrees, seed=tc.seed + rank)
        buffer = HaloBuffer(halo, capacity, feat_dim, alpha=pc.alpha, period=pc.period, dtype=feat.dtype)
        t0 = time.perf_counter()
        buffer.fill(init_ids, feat[init_ids] if init_ids.numel() else None)
        t_init = time.perf_counter() - t0
        init_rows = int(init_ids.numel())
    owner_of = lambda ids: pb.nid2partid(ids)  # noqa: E731
    feats = BufferedFeatures(feat, owner_of, part_id, buffer, local_id=int(local_g.ndata[dgl.NID][inner][0]))

    sampler = dgl.dataloading.NeighborSampler(tc.fanouts)

    def loader_for(nids, shuffle):
        return dgl.dataloading.DistNodeDataLoader(
            g, nids, sampler, batch_size=tc.batch_size, shuffle=shuffle, drop_last=False
        )

    train_loader = loader_for(train_nids, True)
    # DDP needs the same number of steps on every rank.
    steps = torch.tensor([(train_nids.numel() + tc.batch_size - 1) // tc.batch_size])
    torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MIN)
    steps_per_epoch = full_steps = int(steps)
    if tc.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, tc.max_steps_per_epoch)

    labels = g.ndata["label"]
    classes = int(run.get("num_classes") or 0)
    if not classes:
        raise RuntimeError("run.json lacks num_classes")
    # one class (e.g. an import whose labels are all 0): accuracy would read 1.000 and mean
    # nothing, so none is reported
    one_class = classes < 2 or run.get("classes_present") == 1
    if one_class:
        log.warning("rank %d: the labels have one class: accuracy is not reported", rank)
    model = SAGE(feat_dim, tc.hidden, classes, len(tc.fanouts))
    model = torch.nn.parallel.DistributedDataParallel(model.to(device))
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr)

    ctx = RunContext(
        rank=rank, num_trainers=world, part_id=part_id, num_parts=pb.num_partitions(),
        num_nodes=g.num_nodes(), partition_nodes=int(inner.sum()), halo_nodes=int(halo.numel()),
        capacity=capacity, batch_size=tc.batch_size, fanouts=list(tc.fanouts),
        steps_per_epoch=steps_per_epoch, epochs=tc.epochs, feat_dim=feat_dim,
        feat_bytes=feats.row_bytes, window=pc.window, lookahead=pc.lookahead,
        run_dir=str(args.run_dir), extra={"dataset": cfg.dataset.name, "seed": tc.seed, "full_steps_per_epoch": full_steps},
    )
    policy.setup(ctx)
    t_ready = policy.wait_ready(cfg.agent.ready_timeout_s)  # the agent's model loading; others: 0
    if t_ready > 0.05:
        log.info("rank %d: policy ready after %.1f s", rank, t_ready)
    ctx.extra["t_policy_ready"] = t_ready
    trace = None
    if pc.record_trace:  # also without a buffer: the oracle says what one would have saved
        from rudder.sim.trace import TraceWriter

        init = buffer.contents() if buffer is not None else torch.empty(0, dtype=torch.int64)
        trace = TraceWriter(args.run_dir / f"trace-r{rank}.npz", halo=halo, init=init,
                            capacity=capacity, feat_bytes=feats.row_bytes, part_id=part_id,
                            num_parts=pb.num_partitions(), flush_every=200)
    lookahead = pc.lookahead if pc.policy.startswith(LOOKAHEAD_POLICIES) else 0
    pipe = MinibatchPipeline(
        lambda epoch: train_loader, feats, labels, policy, MetricsCollector(pc.window),
        steps_per_epoch, tc.epochs, lookahead, trace_writer=trace, check=args.check or tc.check_features,
    )
    out = {k: JsonlWriter(args.run_dir / f"{k}-r{rank}.jsonl") for k in ("minibatches", "epochs", "windows", "decisions")}
    (args.run_dir / f"context-r{rank}.json").write_text(json.dumps(ctx.__dict__, default=str))
    log.info("rank %d/%d part %d: %d train seeds, %d steps/epoch, halo %d, capacity %d, policy %s",
             rank, world, part_id, train_nids.numel(), steps_per_epoch, halo.numel(), capacity, pc.policy)

    # Fault injection for tests of the failure path: RUDDER_FAULT="rank:global_step".
    fault = os.environ.get("RUDDER_FAULT")
    fault_rank, fault_step = (int(x) for x in fault.split(":")) if fault else (-1, -1)
    check = args.check or tc.check_features
    saved_inputs: list = []
    mismatches = 0
    for epoch in range(tc.epochs):
        model.train()
        t_epoch = time.perf_counter()
        agg = dict(t_sample=0.0, t_fetch=0.0, t_buffer=0.0, t_compute=0.0, t_stall=0.0, t_policy=0.0, loss=0.0,
                   input_rows=0, remote_rows=0, hits=0, fetched_rows=0, fetched_bytes=0, replaced_rows=0)
        correct = total = n = 0
        for mb in pipe.epoch(epoch):
            if rank == fault_rank and mb.global_step == fault_step:
                log.error("RUDDER_FAULT: rank %d exits at step %d", rank, fault_step)
                os._exit(17)
            if check:
                mismatches += mb.mismatched_rows
                if len(saved_inputs) < 5:  # for an independent remote count in tests
                    saved_inputs.append((mb.input_nodes.clone(), mb.stats.remote_rows))
            t0 = time.perf_counter()
            blocks = [b.to(device) for b in mb.blocks] if device.type == "cuda" else mb.blocks
            labels_d = mb.labels.long().to(device)
            logits = model(blocks, mb.feats.to(device))
            loss = F.cross_entropy(logits, labels_d)
            opt.zero_grad()
            loss.backward()  # DDP all-reduce: a sync point across trainers
            opt.step()
            t_compute = time.perf_counter() - t0
            pipe.state.last_t_compute = t_compute
            correct += int((logits.argmax(1) == labels_d).sum())
            total += int(mb.labels.numel())
            rec = {"epoch": epoch, "step": mb.step, "global_step": mb.global_step, "t_sample": mb.t_sample,
                   **mb.stats.as_dict(), "hit_rate": mb.stats.hits / mb.stats.remote_rows if mb.stats.remote_rows else 0.0,
                   "t_compute": t_compute, "t_stall": mb.stall, "loss": float(loss),
                   "t_policy": mb.t_policy}  # extra field (kept in the store's `extra` column)
            out["minibatches"].write(rec)
            if mb.window is not None:
                out["windows"].write(mb.window)
            for d in policy.decisions():
                out["decisions"].write(d)
            for k in agg.keys() - {"loss"}:  # every other total is a field of the record
                agg[k] += rec[k]
            agg["loss"] += float(loss)
            n += 1
        t_epoch = time.perf_counter() - t_epoch
        val_acc = None
        if not one_class and (tc.eval_every and (epoch + 1) % tc.eval_every == 0
                              or epoch == tc.epochs - 1):
            val_acc = evaluate(model, loader_for(val_nids, False), feat, labels, torch, device)
        er = {"epoch": epoch, "t_epoch": t_epoch, **agg, "loss": agg["loss"] / max(n, 1),
              "train_acc": None if one_class else correct / max(total, 1), "val_acc": val_acc, "minibatches": n,
              "initial_fill_rows": init_rows if epoch == 0 else 0, "t_initial_fill": t_init if epoch == 0 else 0.0}
        out["epochs"].write(er)
        log.info("epoch %d: %.2fs (sample %.2f | fetch %.2f | buffer %.3f | policy %.4f | compute %.2f | stall %.2f) "
                 "loss %.3f train %.3f val %s hit %.3f fetched %d/%d remote rows",
                 epoch, t_epoch, agg["t_sample"], agg["t_fetch"], agg["t_buffer"], agg["t_policy"], agg["t_compute"],
                 agg["t_stall"], er["loss"], er["train_acc"] or 0.0, f"{val_acc:.3f}" if val_acc is not None else "-",
                 agg["hits"] / max(agg["remote_rows"], 1), agg["fetched_rows"], agg["remote_rows"])
    policy.close()
    for d in policy.decisions():
        out["decisions"].write(d)
    if trace is not None:
        trace.close()
    for w in out.values():
        w.close()
    if saved_inputs:
        torch.save(saved_inputs, args.run_dir / f"inputs-r{rank}.pt")
    summary = {"rank": rank, "part_id": int(part_id), "mismatched_rows": mismatches, "checked": check}
    (args.run_dir / f"done-r{rank}.json").write_text(json.dumps(summary))
    torch.distributed.barrier()
    dgl.distributed.exit_client()
    if mismatches:
        log.error("feature check failed: %d rows differ from a direct pull", mismatches)
        return 3
    return 0


def evaluate(model, loader, feat, labels, torch, device) -> float:
    """Validation accuracy over this rank's split, summed across ranks (plain pulls: evaluation
    traffic is not part of the training measurements)."""
    model.eval()
    correct = torch.zeros(2)
    with torch.no_grad():
        for input_nodes, seeds, blocks in loader:
            if device.type == "cuda":
                blocks = [b.to(device) for b in blocks]
            pred = model.module(blocks, feat[input_nodes].to(device)).argmax(1).cpu()
            correct[0] += (pred == labels[seeds]).sum()
            correct[1] += seeds.numel()
    torch.distributed.all_reduce(correct)
    return float(correct[0] / correct[1].clamp(min=1))


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (4-10 s of module finalisers for torch/pandas/pyarrow): every
    # record is already flushed and the DGL client has exited.
    os._exit(code)
