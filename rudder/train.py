"""One DistDGL trainer: `python -m rudder.train --run-dir runs/<id>` (started by the cluster).

Reads the resolved config from run.json, joins the DGL servers and the gloo DDP group, trains
GraphSAGE with the Rudder feature path, and writes its records (rudder/records.py) as it goes.
Loop: the pipeline thread samples + assembles minibatch i+1 while this thread computes i.

Set-up, in order: join the cluster -> build the feature path (halo buffer + BufferedFeatures)
-> the policy and what it may know (RunContext) -> the pipeline; then the loop, then close.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rudder  # noqa: F401  (sets DGLBACKEND)

log = logging.getLogger("rudder.train")


def pin_dgl_machine() -> None:
    """Machines emulated on loopback (no namespaces) listen on 127.A.B.m addresses that no
    interface carries, and DGL finds a client's machine by its interfaces' addresses: every
    client would take itself for machine 0 and read partition 0's rows from its own machine's
    shared memory. The launcher names the address (RUDDER_DGL_MACHINE_ADDR); DGL is told it.
    Runs at import too: DGL's sampler processes are spawned and import this module again."""
    addr = os.environ.get("RUDDER_DGL_MACHINE_ADDR")
    if addr:
        from dgl.distributed import rpc_client

        rpc_client.local_ip4_addr_list = lambda: {addr}


pin_dgl_machine()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F

    from rudder.config import RunConfig, sample_ahead, schedules_ahead
    from rudder.data.partition import served_features
    from rudder.pipeline import MinibatchPipeline
    from rudder.prefetch.metrics import MetricsCollector
    from rudder.prefetch.labels import SeedLabels
    from rudder.prefetch.policies import NoBufferPolicy, make_policy, policy_extras
    from rudder.records import EpochTotals, read_run
    from rudder.device import DeviceError, synchronize

    run = read_run(args.run_dir)
    cfg = RunConfig.model_validate(run["config"])
    tc, pc = cfg.train, cfg.prefetch
    check = args.check or tc.check_features

    try:  # before joining the cluster: a run that asked for cuda never trains on the CPU
        device = pick_device(tc.device)
    except DeviceError as exc:
        log.error("%s", exc)
        return 4
    part = join_cluster(run["part_config"], tc.seed)
    # the features in dataset.feature_dtype (bfloat16: stored as int16 bits, viewed back)
    part.feat = served_features(part.feat, cfg.dataset.feature_dtype)
    # features_free: no buffer and no policy, but the policy's sampling schedule (sample_ahead,
    # schedule_ahead below read prefetch.policy): the bound of a run with that policy
    policy = NoBufferPolicy() if tc.features_free else make_policy(pc, **policy_extras(cfg))
    feats, fill = feature_path(part, pc, policy.uses_buffer, seed=tc.seed + part.rank, device=device,
                               free_remote=tc.features_free)
    if tc.pulls_in_flight > 1:  # every pull of the loader thread, the check's too, through it
        from rudder.prefetch.pulls import DGLPulls

        feats.pulls = DGLPulls()
    # schedule_ahead samples epoch e+1 while e trains (with samplers > 0 it collects what the
    # sampler processes sampled meanwhile); all of e+1 before e ends: DGL's sampler pool has no
    # locking and evaluation, in this thread, shares it
    next_epoch = schedules_ahead(pc)
    train_loader, steps_per_epoch, full_steps = train_loader_and_steps(part, tc, seeded=next_epoch)
    classes = int(run.get("num_classes") or 0)
    model, opt = make_model(part, tc, classes, device)
    # one class (e.g. an import whose labels are all 0): accuracy would read 1.000 and mean
    # nothing, so none is reported
    one_class = classes < 2 or run.get("classes_present") == 1
    if one_class:
        log.warning("rank %d: the labels have one class: accuracy is not reported", part.rank)
    evaluates = lambda epoch: not one_class and bool(  # noqa: E731  (a validation pass after it)
        tc.eval_every and (epoch + 1) % tc.eval_every == 0 or epoch == tc.epochs - 1)
    ctx = start_policy(policy, cfg, part, feats, fill.capacity, steps_per_epoch, full_steps, args.run_dir, device)
    trace = trace_writer(args.run_dir, part, feats, fill.capacity) if pc.record_trace else None
    # the rank's seed labels read once, here, before the loader thread's RPC starts
    labels = SeedLabels(part.labels, part.train_nids)
    pipe = MinibatchPipeline(
        lambda epoch: train_loader, feats, labels, policy, MetricsCollector(pc.window),
        steps_per_epoch, tc.epochs, sample_ahead(pc), trace_writer=trace, check=check,
        hold_after=evaluates,  # the loader waits while this thread evaluates (DGL RPC)
        sample_next_epoch=next_epoch,
        start_depth=pc.lookahead,  # the first epoch starts once 1 + lookahead are sampled
        pulls_in_flight=tc.pulls_in_flight, past_thread=pc.past_thread,
    )
    out = RecordFiles(args.run_dir, part.rank)
    (args.run_dir / f"context-r{part.rank}.json").write_text(json.dumps(ctx.__dict__, default=str))
    log.info("rank %d/%d part %d: %d train seeds, %d steps/epoch, halo %d, capacity %d, policy %s",
             part.rank, part.world, part.part_id, part.train_nids.numel(), steps_per_epoch,
             part.halo.numel(), fill.capacity,
             f"{pc.policy}'s sampling, features free (no remote row pulled)" if tc.features_free else pc.policy)

    fault = Fault.from_env()
    checked = FeatureCheck(check)
    for epoch in range(tc.epochs):
        model.train()
        t_epoch, cpu_s = time.perf_counter(), time.process_time()
        totals, correct, total = EpochTotals(), 0, 0
        steps: list[tuple[float, float]] = []  # (t_sample, t_compute) per step, for the bounds
        for mb in pipe.epoch(epoch):
            fault.maybe_exit(part.rank, mb.global_step)
            checked.add(mb)
            slower = SlowerWait(mb.stall)  # the slower rank's wait, reduced during the compute
            # compute: forward, backward (DDP all-reduce: a sync point across trainers), step
            t0 = time.perf_counter()
            labels = mb.labels.long().to(device)
            # DGL blocks -> tensors on the device; rows move in the served dtype (float16/bfloat16:
            # half the bytes), the model computes in float32 (cast on the device)
            logits = model(mb.blocks, mb.feats.to(device).float())
            loss = F.cross_entropy(logits, labels)
            synchronize(device)  # CUDA runs ahead of the host: time the work, not its launch
            t1 = time.perf_counter()
            opt.zero_grad()
            loss.backward()  # DDP's all-reduce: this rank waits here for the slower one
            opt.step()
            synchronize(device)
            now = time.perf_counter()
            t_backward, t_compute = now - t1, now - t0
            pipe.state.last_t_compute = t_compute
            correct += int((logits.argmax(1) == labels).sum())
            total += int(mb.labels.numel())
            # the loader's record, completed with what only this thread knows
            rec = dataclasses.replace(mb.record, t_compute=t_compute, t_backward=t_backward, t_stall=mb.stall,
                                      loss=float(loss.detach()), t_policy=mb.t_policy,
                                      t_stall_max=slower.result())
            out.write(rec, mb.window, policy.decisions())
            totals.add(rec)
            steps.append((rec.t_sample, t_compute))
        t_epoch, cpu_s = time.perf_counter() - t_epoch, time.process_time() - cpu_s
        bounds = gather_bounds(epoch, steps, t_epoch)
        val_acc = None
        if evaluates(epoch):
            val_acc = evaluate(model, part.loader(part.val_nids, tc, shuffle=False), part.feat, part.labels, device)
        train_acc = None if one_class else correct / max(total, 1)
        er = totals.record(epoch, t_epoch=t_epoch, train_acc=train_acc, val_acc=val_acc,
                           initial_fill_rows=fill.rows if epoch == 0 else 0,
                           t_initial_fill=fill.seconds if epoch == 0 else 0.0, cpu_s=cpu_s, **bounds)
        out.epochs.write(er.to_dict())
        log_epoch(er)

    policy.close()
    out.write(decisions=policy.decisions())
    if trace is not None:
        trace.close()
    out.close()
    checked.save(args.run_dir, part.rank)
    summary = {"rank": part.rank, "part_id": int(part.part_id), "mismatched_rows": checked.mismatches,
               "checked": check, "most_pulls_in_flight": feats.pulls.most_in_flight,
               "epoch_ends_in_flight": pipe.epoch_ends_in_flight}
    if feats.buffer is not None and feats.buffer.index is not None:  # the remote universe seen
        held = len(feats.buffer.index)  # distinct remote ids held (all seen, unless it filled)
        summary.update(universe_held=held, capacity_frac_remote=fill.capacity / max(held, 1))
    (args.run_dir / f"done-r{part.rank}.json").write_text(json.dumps(summary))
    torch.distributed.barrier()
    import dgl

    dgl.distributed.exit_client()
    if checked.mismatches:
        log.error("feature check failed: %d rows differ from a direct pull", checked.mismatches)
        return 3
    return 0


# ---- set-up, step by step --------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--check", action="store_true", help="verify every assembled row against a direct pull")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args


def pick_device(wanted: str):
    """The one place the trainer's device is chosen (train.device: auto | cpu | cuda); binds this
    trainer's GPU (the launcher sets CUDA_VISIBLE_DEVICES). Raises DeviceError for cuda without one."""
    from rudder.device import resolve

    return resolve(wanted, bind=True)


@dataclass
class Partition:
    """What this trainer sees of the distributed graph."""

    g: Any  # DistGraph
    pb: Any  # its partition book
    rank: int
    world: int
    part_id: int
    train_nids: Any
    val_nids: Any
    inner: Any  # local partition: owned-node mask
    halo: Any  # ids in the local partition's graph but owned by another partition
    local_ids: Any  # ids of the local partition's graph (dgl.NID)
    feat: Any  # DistTensor of features
    labels: Any  # DistTensor of labels
    threads: int  # torch threads of this trainer

    def loader(self, nids, tc, shuffle: bool, timed: bool = False):
        """DistDGL's node loader; sampling runs in its sampler processes when the cluster
        started any (train.samplers). timed: each minibatch also carries its sampling seconds,
        measured where it ran (rudder.pipeline.TimedCollate)."""
        import dgl

        sampler = dgl.dataloading.NeighborSampler(tc.fanouts)
        if not timed:
            return dgl.dataloading.DistNodeDataLoader(
                self.g, nids, sampler, batch_size=tc.batch_size, shuffle=shuffle, drop_last=False)
        from dgl.dataloading.dist_dataloader import NodeCollator

        from rudder.pipeline import TimedCollate

        collator = NodeCollator(self.g, nids, sampler)  # as DistNodeDataLoader builds it
        return dgl.distributed.DistDataLoader(collator.dataset, batch_size=tc.batch_size, shuffle=shuffle,
                                              collate_fn=TimedCollate(collator.collate), drop_last=False)


def join_cluster(part_config: str, seed: int) -> Partition:
    """Joins the DGL servers and the gloo DDP group; this rank's seeds, halo and tensors."""
    import dgl
    import torch

    graph_name = json.loads(Path(part_config).read_text())["graph_name"]
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])  # before init_process_group (DGL)
    # gloo also all-reduces CUDA tensors, and the CPU-side counters stay valid with it.
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    # The launcher's share of the node's cores (node cores / trainers on it), recorded in run.json
    threads = int(os.environ.get("RUDDER_THREADS") or os.environ.get("OMP_NUM_THREADS") or 1)
    torch.set_num_threads(threads)
    torch.manual_seed(seed + rank)

    g = dgl.distributed.DistGraph(graph_name, part_config=part_config)
    pb = g.get_partition_book()
    local_g = g.local_partition
    inner = local_g.ndata["inner_node"].bool()
    ids = local_g.ndata[dgl.NID]
    return Partition(
        g, pb, rank, world, pb.partid,
        train_nids=dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True),
        val_nids=dgl.distributed.node_split(g.ndata["val_mask"], pb, force_even=True),
        inner=inner, halo=ids[~inner], local_ids=ids, feat=g.ndata["feat"], labels=g.ndata["label"],
        threads=threads)


@dataclass
class InitialFill:
    capacity: int  # buffer rows (prefetch_fraction of the halo)
    rows: int = 0  # rows filled before the first minibatch
    seconds: float = 0.0


def feature_path(part: Partition, pc, with_buffer: bool, seed: int, device, free_remote: bool = False):
    """The halo buffer, filled (for policies that use one), behind BufferedFeatures
    (free_remote: train.features_free, no buffer)."""
    from rudder.prefetch.buffer import HaloBuffer, choose_initial
    from rudder.prefetch.features import BufferedFeatures

    from rudder.config import buffer_capacity, universe_max_nodes

    halo, feat = part.halo, part.feat
    fill = InitialFill(buffer_capacity(pc, halo.numel()))
    buffer = None
    if with_buffer:
        degrees = part.g.in_degrees(halo) if pc.init == "degree" and halo.numel() else None
        init_ids = choose_initial(halo, fill.capacity, pc.init, degrees, seed=seed)
        buffer = HaloBuffer(halo, fill.capacity, int(feat.shape[1]), alpha=pc.alpha, period=pc.period,
                            dtype=feat.dtype, device=device, universe=pc.universe,
                            max_nodes=universe_max_nodes(pc, halo.numel(), fill.capacity)
                            if pc.universe == "remote" else None, id_bound=part.g.num_nodes())
        t0 = time.perf_counter()
        buffer.fill(init_ids, feat[init_ids] if init_ids.numel() else None)
        fill.seconds = time.perf_counter() - t0
        fill.rows = int(init_ids.numel())
    owner_of = lambda ids: part.pb.nid2partid(ids)  # noqa: E731
    feats = BufferedFeatures(feat, owner_of, part.part_id, buffer,
                             local_id=int(part.local_ids[part.inner][0]), device=device,
                             free_remote=free_remote)
    return feats, fill


def train_loader_and_steps(part: Partition, tc, seeded: bool = False):
    """The training loader (seeds in train.order) and the steps per epoch (the same on every rank: DDP).
    seeded: the shuffle too is SeedOrder's, by (seed, rank, epoch), not DGL's draw from torch's
    global RNG at iter(): an epoch sampled during the previous one would take that draw in the
    loader thread amid the training thread's dropout draws, so the order would vary run to run."""
    import torch

    loader = part.loader(part.train_nids, tc, shuffle=tc.order == "shuffle" and not seeded, timed=True)
    if tc.order != "shuffle" or seeded:  # an order set per epoch (rudder/seed_order.py)
        from rudder.seed_order import OrderedLoader, trainer_order

        loader = OrderedLoader(loader, trainer_order(part, tc))
    steps = torch.tensor([(part.train_nids.numel() + tc.batch_size - 1) // tc.batch_size])
    torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MIN)
    full_steps = int(steps)
    return loader, min(full_steps, tc.max_steps_per_epoch or full_steps), full_steps


def make_model(part: Partition, tc, classes: int, device):
    import torch

    from rudder.model import SAGE

    if not classes:
        raise RuntimeError("run.json lacks num_classes")
    model = SAGE(int(part.feat.shape[1]), tc.hidden, classes, len(tc.fanouts))
    model = torch.nn.parallel.DistributedDataParallel(model.to(device))
    return model, torch.optim.Adam(model.parameters(), lr=tc.lr)


def start_policy(policy, cfg, part: Partition, feats, capacity: int, steps_per_epoch: int,
                 full_steps: int, run_dir: Path, device):
    """Sets the policy up with the run's static facts (returned) and waits until it is ready
    (the agent loads its model)."""
    from rudder.config import schedules_ahead
    from rudder.device import describe
    from rudder.prefetch.policy import RunContext

    tc, pc = cfg.train, cfg.prefetch
    ctx = RunContext(
        rank=part.rank, num_trainers=part.world, part_id=part.part_id, num_parts=part.pb.num_partitions(),
        num_nodes=part.g.num_nodes(), partition_nodes=int(part.inner.sum()), halo_nodes=int(part.halo.numel()),
        capacity=capacity, batch_size=tc.batch_size, fanouts=list(tc.fanouts),
        steps_per_epoch=steps_per_epoch, epochs=tc.epochs, feat_dim=int(part.feat.shape[1]),
        feat_bytes=feats.row_bytes, window=pc.window, lookahead=pc.lookahead, run_dir=str(run_dir),
        schedule_ahead=schedules_ahead(pc),
        extra={"dataset": cfg.dataset.name, "seed": tc.seed, "full_steps_per_epoch": full_steps,
               "threads": part.threads, "device": describe(device),
               "feature_dtype": str(part.feat.dtype).removeprefix("torch."),
               "buffer_bytes": feats.buffer.feat_bytes if feats.buffer is not None else 0,
               "universe": pc.universe, "capacity_frac_halo": capacity / max(int(part.halo.numel()), 1),
               "universe_max_nodes": feats.buffer.index.max_nodes
               if feats.buffer is not None and feats.buffer.index is not None else None},
    )
    policy.setup(ctx)
    t_ready = policy.wait_ready(cfg.agent.ready_timeout_s)  # the agent's model loading; others: 0
    if t_ready > 0.05:
        log.info("rank %d: policy ready after %.1f s", part.rank, t_ready)
    ctx.extra["t_policy_ready"] = t_ready
    return ctx


def trace_writer(run_dir: Path, part: Partition, feats, capacity: int):
    """The remote-access trace (rudder.trace), also without a buffer: the oracle says what one
    would have saved."""
    import torch

    from rudder.trace import TraceWriter

    buf = feats.buffer
    init = buf.contents() if buf is not None else torch.empty(0, dtype=torch.int64)
    return TraceWriter(run_dir / f"trace-r{part.rank}.npz", halo=part.halo, init=init, capacity=capacity,
                       feat_bytes=feats.row_bytes, part_id=part.part_id,
                       num_parts=part.pb.num_partitions(), flush_from=200)


# ---- the loop's helpers ----------------------------------------------------------------------
class RecordFiles:
    """minibatches/epochs/windows/decisions-r<R>.jsonl (rudder.records), flushed per line. A
    window whose past counterfactual is still measured off the loader (prefetch.past_thread)
    is written, in order, at the first write after its measurement ends: the training thread
    never waits for it (at the close it does)."""

    def __init__(self, run_dir: Path, rank: int):
        from rudder.prefetch import past
        from rudder.records import JsonlWriter

        self.past = past
        self.files = {k: JsonlWriter(run_dir / f"{k}-r{rank}.jsonl")
                      for k in ("minibatches", "epochs", "windows", "decisions")}
        self.epochs = self.files["epochs"]
        self._windows: collections.deque[dict] = collections.deque()  # not yet written, oldest first

    def write(self, minibatch=None, window: dict | None = None, decisions: list[dict] = ()) -> None:
        if minibatch is not None:
            self.files["minibatches"].write(minibatch.to_dict())
        if window is not None:
            self._windows.append(window)
        self._write_windows(wait=False)
        for d in decisions:
            self.files["decisions"].write(d)

    def _write_windows(self, wait: bool) -> None:
        while self._windows and (wait or self.past.measured(self._windows[0])):
            self.files["windows"].write(self.past.settle(self._windows.popleft()))

    def close(self) -> None:
        self._write_windows(wait=True)
        for w in self.files.values():
            w.close()


@dataclass
class Fault:
    """Fault injection for tests of the failure path: RUDDER_FAULT="rank:global_step"."""

    rank: int = -1
    step: int = -1

    @classmethod
    def from_env(cls) -> "Fault":
        spec = os.environ.get("RUDDER_FAULT")
        return cls(*(int(x) for x in spec.split(":"))) if spec else cls()

    def maybe_exit(self, rank: int, global_step: int) -> None:
        if rank == self.rank and global_step == self.step:
            log.error("RUDDER_FAULT: rank %d exits at step %d", rank, self.step)
            os._exit(17)


class FeatureCheck:
    """--check: rows that differ from a direct pull (counted by the loader), and the first
    minibatches' inputs, for an independent remote count in tests, with their assembled rows
    (rows-r<R>.pt: tests compare them with the staged graph's, e.g. cast to float16)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.mismatches = 0
        self.saved: list = []
        self.rows: list = []

    def add(self, mb) -> None:
        if self.enabled:
            self.mismatches += mb.mismatched_rows
            if len(self.saved) < 5:
                self.saved.append((mb.input_nodes.clone(), mb.stats.remote_rows))
                self.rows.append((mb.input_nodes.clone(), mb.feats.cpu().clone()))

    def save(self, run_dir: Path, rank: int) -> None:
        if self.saved:
            import torch

            torch.save(self.saved, run_dir / f"inputs-r{rank}.pt")
            torch.save(self.rows, run_dir / f"rows-r{rank}.pt")


class SlowerWait:
    """The most any rank waited for this step's minibatch: a MAX all-reduce started before the
    step's compute and read after it (gloo runs it in the background: no extra sync point)."""

    def __init__(self, stall: float):
        import torch

        self.t = torch.tensor([stall], dtype=torch.float64)
        self.work = torch.distributed.all_reduce(self.t, op=torch.distributed.ReduceOp.MAX, async_op=True)

    def result(self) -> float:
        self.work.wait()
        return float(self.t[0])


def gather_bounds(epoch: int, steps: list[tuple[float, float]], t_epoch: float) -> dict:
    """The epoch's compute-only and pipeline bounds over all ranks (rudder.bounds.epoch_bounds):
    one all_gather of every rank's per-step (t_sample, t_compute) and its t_epoch."""
    import torch

    from rudder.bounds import epoch_bounds

    mine = torch.tensor([[t_epoch, float(len(steps))], *steps] if steps else [[t_epoch, 0.0]],
                        dtype=torch.float64)
    n = torch.tensor([mine.shape[0]])
    torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MAX)  # ranks' step counts match (DDP)
    padded = torch.zeros(int(n), 2, dtype=torch.float64)
    padded[:mine.shape[0]] = mine
    got = [torch.empty_like(padded) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(got, padded)
    per_rank = []
    for g in got:
        k = int(g[0, 1])
        per_rank.append((g[1:1 + k, 0].tolist(), g[1:1 + k, 1].tolist(), float(g[0, 0])))
    return epoch_bounds(epoch, per_rank)


def log_epoch(er) -> None:
    """One line per epoch: the time of each phase, the fields of the epoch record."""
    log.info("epoch %d: %.2fs (sample %.2f | fetch %.2f | buffer %.3f | policy %.4f | compute %.2f | stall %.2f) "
             "loss %.3f train %.3f val %s hit %.3f fetched %d/%d remote rows",
             er.epoch, er.t_epoch, er.t_sample, er.t_fetch, er.t_buffer, er.t_policy or 0.0, er.t_compute,
             er.t_stall, er.loss or 0.0, er.train_acc or 0.0, f"{er.val_acc:.3f}" if er.val_acc is not None else "-",
             er.hits / max(er.remote_rows, 1), er.fetched_rows, er.remote_rows)
    if er.bound_pipeline_s:  # all ranks: the slowest's epoch against the bounds (rudder.bounds)
        log.info("epoch %d, all ranks: %.2fs = %.2fx the pipeline bound %.2fs, %.2fx the compute-only "
                 "bound %.2fs; loader %.2fs (waited for sampling %.2f); slower rank's stall %.2fs",
                 er.epoch, er.t_epoch_max, er.epoch_over_pipeline, er.bound_pipeline_s,
                 er.epoch_over_compute, er.bound_compute_s, er.t_load or 0.0, er.t_sample_wait or 0.0,
                 er.t_stall_max or 0.0)


def evaluate(model, loader, feat, labels, device) -> float:
    """Validation accuracy over this rank's split, summed across ranks (plain pulls: evaluation
    traffic is not part of the training measurements)."""
    import torch

    model.eval()
    correct = torch.zeros(2)
    with torch.no_grad():
        for input_nodes, seeds, blocks in loader:
            pred = model.module(blocks, feat[input_nodes].to(device).float()).argmax(1).cpu()
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
