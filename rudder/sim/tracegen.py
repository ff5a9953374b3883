"""Traces without training: partition a graph, sample one trainer's minibatches, record its
remote accesses (the same trace format training writes).

  graph      a `rudder.data.synthetic` preset (or any DGLGraph; tests use dgl.rand_graph)
  partition  METIS (rudder data partition's cut: rudder.data.metis) or random assignment
             into P parts; ownership is all DistDGL's halo definition needs
  halo       1-hop in-neighbours of partition `part`'s nodes that it does not own (the nodes
             DistDGL's partition_graph puts in the local graph with inner_node == False)
  sampling   dgl.dataloading.NeighborSampler(fanouts) on the full graph over the partition's
             training nodes, shuffled (or in `order`: rudder.seed_order, as the trainer's
             train.order), `batch_size` seeds per minibatch, as the trainer does;
             remote = input nodes owned by another partition (2-hop ones need not be halo)
  init       the buffer's initial fill, capacity = fraction x |halo|: `degree` (top in-degree
             halo nodes, stored highest first, so a smaller capacity keeps the best), `random`,
             or `empty`

`random_trace` makes small synthetic traces (no graph) for tests and benchmarks.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rudder.data import metis
from rudder.trace import Trace

log = logging.getLogger(__name__)

# 2: METIS and the sampler seeded, the partition rudder data partition's (2026-12-06); traces of
# version 1 (no version in trace.json) differ from checkout to checkout
TRACEGEN_VERSION = 2


@dataclass
class TraceGenSpec:
    graph: str = "synth-medium"  # a rudder.data.synthetic preset
    parts: int = 2  # P: 2..64
    part: int = 0  # the trainer's partition
    method: str = "metis"  # metis | random
    fanouts: list[int] = field(default_factory=lambda: [10, 25])  # the reference default
    batch_size: int = 1000  # the reference default
    epochs: int = 3
    fraction: float = 0.25  # buffer capacity / halo nodes
    init: str = "degree"  # degree | random | empty
    seed: int = 0
    max_steps_per_epoch: int | None = None
    feat_bytes: int | None = None  # default: the graph's feature row size (float32)
    order: str = "shuffle"  # the seeds' order per epoch (train.order): shuffle | proximity | cluster
    cluster_size: int = 4000  # seeds per cluster for order=cluster (train.cluster_size)

    def validate(self) -> None:
        if not 1 <= self.parts <= 1024 or not 0 <= self.part < self.parts:
            raise ValueError(f"need 0 <= part < parts (got part {self.part}, parts {self.parts})")
        if self.method not in ("metis", "random"):
            raise ValueError(f"unknown partition method {self.method!r}; valid: metis, random")
        if self.init not in ("degree", "random", "empty"):
            raise ValueError(f"unknown init {self.init!r}; valid: degree, random, empty")
        if not 0 <= self.fraction <= 1:
            raise ValueError("fraction must be in [0, 1]")
        from rudder.seed_order import check_order

        check_order(self.order)
        if self.batch_size <= 0 or self.epochs <= 0 or not self.fanouts:
            raise ValueError("batch_size and epochs must be > 0, fanouts non-empty")
        if any(f == 0 or f < -1 for f in self.fanouts):  # DGL's sampler would abort the process
            raise ValueError(f"fanouts: need one entry >= 1 (or -1 = all) per layer, got {list(self.fanouts)}")
        if self.max_steps_per_epoch is not None and self.max_steps_per_epoch < 1:
            raise ValueError(f"max_steps_per_epoch must be >= 1, got {self.max_steps_per_epoch}")


def partition_assignment(g, parts: int, method: str = "metis", seed: int = 0) -> np.ndarray:
    """Partition id of every node (int64)."""
    n = g.num_nodes()
    if parts == 1:
        return np.zeros(n, dtype=np.int64)
    # `rudder data partition`'s assignment either way (random: DGL's RNG at the seed, as
    # partition_graph draws it; METIS: the same seeded cut, train nodes and edges balanced), so
    # a trace's halo is the one a live run's trainer has
    if method == "random":
        import dgl

        dgl.random.seed(seed)
        return np.asarray(dgl.random.choice(parts, n), dtype=np.int64)
    train = g.ndata["train_mask"] if "train_mask" in g.ndata else None
    return metis.assignment(g, parts, train, balance_edges=True, seed=seed).numpy()


def halo_of(g, owner: np.ndarray, part: int) -> np.ndarray:
    """Sorted ids of the in-neighbours of `part`'s nodes that `part` does not own."""
    src, dst = (x.numpy() for x in g.edges())
    m = (owner[dst] == part) & (owner[src] != part)
    return np.unique(src[m])


def initial_fill(halo: np.ndarray, capacity: int, init: str, in_degrees: np.ndarray | None,
                 seed: int = 0) -> np.ndarray:
    """Initial fill ids in priority order (degree: highest in-degree first)."""
    if init == "empty" or capacity == 0 or halo.size == 0:
        return np.zeros(0, dtype=np.int64)
    if init == "random":
        return np.random.default_rng(seed).permutation(halo)[:capacity]
    order = np.argsort(-in_degrees, kind="stable")[:capacity]  # ties: smaller id first
    return halo[order]


def trace_from_graph(g, owner: np.ndarray, spec: TraceGenSpec, train_mask: np.ndarray | None = None) -> Trace:
    """Samples spec.epochs epochs of partition spec.part's training nodes and records them."""
    import dgl
    import torch

    spec.validate()
    n = g.num_nodes()
    if train_mask is None:
        train_mask = g.ndata["train_mask"].numpy().astype(bool) if "train_mask" in g.ndata else np.ones(n, bool)
    part = spec.part
    owned = owner == part
    train = np.flatnonzero(owned & train_mask)
    if train.size == 0:
        raise ValueError(f"partition {part} owns no training nodes")
    halo = halo_of(g, owner, part)
    capacity = int(spec.fraction * halo.size)
    deg = g.in_degrees(torch.from_numpy(halo)).numpy() if spec.init == "degree" and halo.size else None
    init = initial_fill(halo, capacity, spec.init, deg, spec.seed)
    feat_bytes = spec.feat_bytes
    if feat_bytes is None:
        f = g.ndata.get("feat") if hasattr(g.ndata, "get") else None
        feat_bytes = int(f.shape[1]) * f.element_size() if f is not None else 0

    # every draw seeded, so a spec gives one trace anywhere: the shuffle from its own generator,
    # the sampler's on this thread (DGL's DataLoader samples on a prefetch thread whose RNG no
    # seed reaches, and shuffles with numpy's global RNG)
    shuffle = torch.Generator().manual_seed(spec.seed)
    sampler = dgl.dataloading.NeighborSampler(list(spec.fanouts))
    order = None
    if spec.order != "shuffle":  # the trainer's SeedOrder over the edges between owned nodes
        from rudder.seed_order import SeedOrder

        src, dst = (x.numpy() for x in g.edges())
        both = owned[src] & owned[dst]
        order = SeedOrder(train, spec.order, spec.seed + part, src[both], dst[both],
                          cluster_size=spec.cluster_size)
    owner_t = torch.from_numpy(owner)
    chunks, epochs, inputs = [], [], []
    t0 = time.perf_counter()
    with _seeded_sampling(spec.seed):
        for epoch in range(spec.epochs):
            seeds = torch.from_numpy(train[order.epoch(epoch)] if order is not None else
                                     train[torch.randperm(train.size, generator=shuffle).numpy()])
            for step, first in enumerate(range(0, seeds.numel(), spec.batch_size)):
                if spec.max_steps_per_epoch and step >= spec.max_steps_per_epoch:
                    break
                input_nodes, _seeds, _blocks = sampler.sample(g, seeds[first:first + spec.batch_size])
                remote = input_nodes[owner_t[input_nodes] != part]
                chunks.append(remote.numpy().astype(np.int64))
                epochs.append(epoch)
                inputs.append(int(input_nodes.numel()))
    log.info("sampled %d minibatches (%d remote accesses) in %.1f s", len(chunks),
             sum(c.size for c in chunks), time.perf_counter() - t0)
    return Trace.from_minibatches(
        halo, chunks, init=init, capacity=capacity, epochs=np.asarray(epochs, dtype=np.int32),
        input_rows=np.asarray(inputs, dtype=np.int64), feat_bytes=feat_bytes, part_id=part,
        num_parts=spec.parts,
    )


@contextlib.contextmanager
def _seeded_sampling(seed: int) -> Iterator[None]:
    """DGL's sampling reproducible: its RNG seeded, one OpenMP thread (with several, to_block
    numbers a layer's inputs in a varying order and the next layer's draws follow that order)."""
    import dgl

    threads = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    dgl.random.seed(seed)
    try:
        yield
    finally:
        dgl.utils.set_num_threads(threads)


def spec_from_config(cfg, part: int = 0, **over) -> TraceGenSpec:
    """The TraceGenSpec of a run config (a RunConfig, e.g. configs/scenarios/*.yaml): its
    dataset (a synthetic preset), partitioning, machines, fanouts, batch size, epochs, seed
    order and buffer fraction; `over` replaces fields (epochs, max_steps_per_epoch, ...)."""
    import dataclasses

    tc, pc = cfg.train, cfg.prefetch
    spec = TraceGenSpec(
        graph=cfg.dataset.name, parts=cfg.cluster.machines * cfg.cluster.trainers_per_machine,
        part=part, method=cfg.dataset.partition_method, fanouts=list(tc.fanouts),
        batch_size=tc.batch_size, epochs=tc.epochs, fraction=pc.prefetch_fraction, init=pc.init,
        seed=tc.seed, max_steps_per_epoch=tc.max_steps_per_epoch, order=tc.order,
        cluster_size=tc.cluster_size)
    return dataclasses.replace(spec, **over)


def load_graph(name: str, seed: int | None = None):
    """A synthetic preset as a DGLGraph without feature rows (traces need none), plus its
    feature row size in bytes."""
    from rudder.data.synthetic import arrays_to_graph, generate_arrays, resolve_spec

    s = resolve_spec(name, seed)
    arr = generate_arrays(s)
    g = arrays_to_graph(arr.src, arr.dst, s.nodes, {"train_mask": arr.train_mask})
    return g, 4 * s.feat_dim


def generate_trace(spec: TraceGenSpec, g=None, owner: np.ndarray | None = None) -> tuple[Trace, dict]:
    """(trace, graph facts) for `spec`; `g` overrides the preset (e.g. dgl.rand_graph), `owner`
    the partitioning (else partition_assignment's: the same on every call)."""
    import dataclasses

    spec.validate()
    t0 = time.perf_counter()
    if g is None:
        g, fb = load_graph(spec.graph, spec.seed)
        if spec.feat_bytes is None:
            spec = dataclasses.replace(spec, feat_bytes=fb)
    if owner is None:
        owner = partition_assignment(g, spec.parts, spec.method, spec.seed)
    t_part = time.perf_counter() - t0
    trace = trace_from_graph(g, owner, spec)
    facts = {
        "dataset": spec.graph, "num_nodes": int(g.num_nodes()), "num_edges": int(g.num_edges()),
        "partition_nodes": int((owner == spec.part).sum()), "num_trainers": spec.parts,
        "batch_size": spec.batch_size, "fanouts": list(spec.fanouts),
        "halo_nodes": trace.num_halo, "capacity": trace.capacity, "t_partition": t_part,
        "t_total": time.perf_counter() - t0,
    }
    return trace, facts


def write_tracegen(out_dir: str | Path, trace: Trace, spec: TraceGenSpec, facts: dict) -> Path:
    """out_dir/trace-r<part>.npz and out_dir/trace.json (spec + graph facts + TRACEGEN_VERSION;
    not a run.json, so the results store does not mistake the folder for a run)."""
    out = Path(out_dir)
    _refuse_other_spec(out, spec)
    out.mkdir(parents=True, exist_ok=True)
    path = trace.save(out / f"trace-r{spec.part}.npz")
    (out / "trace.json").write_text(json.dumps(
        {"spec": asdict(spec), "graph": facts, "tracegen": TRACEGEN_VERSION}, indent=2))
    return path


def _refuse_other_spec(out: Path, spec: TraceGenSpec) -> None:
    """The ranks of one folder are replayed as one run: a rank of another spec (graph, parts,
    fanouts, ... or tracegen version) must not join the traces there."""
    others = sorted(p.name for p in out.glob("trace-r*.npz") if p.name != f"trace-r{spec.part}.npz")
    if not others or not (out / "trace.json").exists():
        return
    from rudder.records import read_json_object

    meta = read_json_object(out / "trace.json")
    old, new = dict(meta.get("spec") or {}), json.loads(json.dumps(asdict(spec)))
    diff = [f"{k} {old.get(k)!r} here, {new.get(k)!r} now" for k in sorted(set(old) | set(new))
            if k != "part" and old.get(k) != new.get(k)]
    if meta.get("tracegen") != TRACEGEN_VERSION:
        diff.append(f"tracegen version {meta.get('tracegen')!r} here, {TRACEGEN_VERSION!r} now")
    if diff:
        raise ValueError(f"{out} holds {', '.join(others)} of another trace spec ({'; '.join(diff)}): "
                         "give another --out, or remove that folder")


def is_current(out_dir: str | Path) -> bool:
    """Whether out_dir's trace was written by this tracegen (a cache made by an older one, whose
    traces differ, is made again)."""
    try:
        meta = json.loads((Path(out_dir) / "trace.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("tracegen") == TRACEGEN_VERSION


def cached_trace(spec: TraceGenSpec, out_dir: str | Path | None = None) -> Trace:
    """The trace of `spec`, read from out_dir when an earlier call wrote it there, else generated
    (and written there, when out_dir is given): benchmarks that replay one trace many ways."""
    path = Path(out_dir) / "trace-r0.npz" if out_dir else None
    if path is not None and path.exists():
        if is_current(path.parent):
            return Trace.load(path)
        log.info("%s: written by an older tracegen; sampling it again", path)
    trace, info = generate_trace(spec)
    if path is not None:
        write_tracegen(path.parent, trace, spec, info)
    return trace


def random_trace(
    halo: int = 1000, minibatches: int = 50, batch: int = 200, nonhalo: float = 0.1,
    capacity: float | int = 0.25, skew: float = 1.0, epochs: int = 1, seed: int = 0,
    init: str = "degree",
) -> Trace:
    """A synthetic trace: each minibatch draws `batch` distinct remote ids, a `nonhalo` share
    outside the halo, halo ids with Zipf-like popularity `skew` (0 = uniform). Halo ids are
    0..halo-1 shuffled into a larger id space; init = the most popular ids (`degree`)."""
    rng = np.random.default_rng(seed)
    ids_space = rng.permutation(halo * 4)
    halo_ids = np.sort(ids_space[:halo])
    other = ids_space[halo:]
    w = 1.0 / np.arange(1, halo + 1) ** skew
    w /= w.sum()
    pop = rng.permutation(halo_ids)  # pop[0] most popular
    C = int(capacity * halo) if isinstance(capacity, float) else int(capacity)
    mbs = []
    per_epoch = max(1, minibatches // epochs)
    ep = []
    for i in range(minibatches):
        nh = rng.binomial(batch, nonhalo) if nonhalo > 0 else 0
        k = min(batch - nh, halo)
        hv = pop[rng.choice(halo, size=k, replace=False, p=w)]
        ov = rng.choice(other, size=min(nh, other.size), replace=False)
        mb = np.concatenate([hv, ov])
        rng.shuffle(mb)
        mbs.append(mb)
        ep.append(min(i // per_epoch, epochs - 1))
    init_ids = {"degree": pop[:C], "random": rng.permutation(halo_ids)[:C], "empty": pop[:0]}[init]
    return Trace.from_minibatches(halo_ids, mbs, init=init_ids, capacity=C,
                                  epochs=np.asarray(ep, dtype=np.int32), feat_bytes=128)


def tracegen_summary(trace: Trace) -> dict[str, Any]:
    ok, _ = trace.halo_positions()
    sizes = trace.sizes()
    return {
        "minibatches": trace.num_minibatches, "remote_accesses": trace.num_accesses,
        "halo_accesses_frac": float(ok.mean()) if ok.size else 0.0, "halo_nodes": trace.num_halo,
        "capacity": trace.capacity, "remote_per_minibatch": float(sizes.mean()) if sizes.size else 0.0,
    }
