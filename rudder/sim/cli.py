"""`rudder sim` (replay traces against policies) and `rudder tracegen` (traces without training).

  rudder sim runs/<id> -p static -p fixed:10,25,50 -p lookahead:3:0.05 -p lru -p belady
  rudder sim traces/synth-medium-p4/trace-r0.npz --fraction 0.25 --no-write
  rudder tracegen --graph synth-medium --parts 4 --fraction 0.25 --out traces/synth-medium-p4

Each policy's replay becomes a run directory runs/sim-<source>-<policy>/ marked
"simulated": true, which `rudder collect` ingests into the same tables as real runs.

Columns: hit% (buffer hits / remote rows), fetched% of none (rows pulled, misses and rows pulled
ahead, / every remote row), admitted (rows taken into the buffer after the initial fill: a
cache's evictions, a buffer's replacements), extra (rows pulled only for the buffer, ahead of use).
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from rudder.arg_types import at_least, positive, ranks

log = logging.getLogger(__name__)

DEFAULT_POLICIES = ["none", "static", "fixed", "lookahead", "lru", "lfu", "s3fifo", "sieve", "belady"]


def register(sub) -> None:
    p = sub.add_parser(
        "sim", help="replay remote-access traces against prefetch/cache policies",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", type=Path, help="a run directory (its trace-r<R>.npz) or one trace file")
    p.add_argument("-p", "--policy", action="append", default=None, metavar="NAME",
                   help="none | static | fixed[:PERIOD[:ALPHA[:EVICT]]] | lookahead[:DEPTH[:BUDGET[:ADMIT]]] | agent | "
                        "rule | classifier:NAME | collect | lru | lfu | s3fifo | sieve | belady; comma lists make a grid "
                        "(fixed:10,25); repeatable (default: " + ", ".join(DEFAULT_POLICIES) + ")")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--capacity", type=int, default=None, help="buffer rows (default: the trace's)")
    cap.add_argument("--fraction", type=at_least(float, 0), default=None, help="buffer rows as a share of the halo")
    p.add_argument("--start", choices=["init", "empty"], default="init",
                   help="start from the trace's initial fill (default) or an empty buffer")
    p.add_argument("--ranks", type=ranks, default=None, help="comma list of ranks to replay (default: all)")
    p.add_argument("--config", type=Path, default=None,
                   help="run config YAML whose prefetch/agent sections set the policies' knobs "
                        "(default: the source run's config)")
    p.add_argument("--models-dir", default=None, help="classifier models directory")
    p.add_argument("--no-agent-sync", action="store_true",
                   help="do not wait for the agent's answer at each window close")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where simulated runs are written")
    p.add_argument("--study", default=None, help="study name recorded in the simulated runs")
    p.add_argument("--no-write", action="store_true", help="print only; write no run directories")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON lines")
    p.add_argument("--threads", type=positive(int), default=1,
                   help="torch threads (default 1, as the trainer's loader: the per-minibatch ops "
                        "are small, and extra threads only spin on a busy machine)")
    p.set_defaults(func=main_sim)

    t = sub.add_parser(
        "tracegen", help="partition a synthetic graph and record one trainer's remote accesses",
        description="Partition a synthetic graph (METIS or random) into P parts, sample partition "
                    "PART's training minibatches with NeighborSampler on the full graph, and write "
                    "its remote accesses as OUT/trace-r<PART>.npz (+ trace.json: spec, graph facts).",
    )
    t.add_argument("--graph", default="synth-medium", help="a rudder.data.synthetic preset")
    t.add_argument("--parts", type=int, default=2, help="partitions (machines), 1..1024")
    t.add_argument("--part", type=int, default=0, help="the trainer's partition")
    t.add_argument("--method", choices=["metis", "random"], default="metis")
    t.add_argument("--fanouts", default="10,25")
    t.add_argument("--batch-size", type=int, default=1000)
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--fraction", type=at_least(float, 0), default=0.25, help="buffer capacity / halo nodes")
    t.add_argument("--init", choices=["degree", "random", "empty"], default="degree")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--max-steps", type=int, default=None, help="cap on minibatches per epoch")
    t.add_argument("--order", choices=["shuffle", "proximity", "cluster"], default="shuffle",
                   help="the seeds' order per epoch, as train.order (rudder/seed_order.py)")
    t.add_argument("--cluster-size", type=int, default=4000, help="seeds per cluster (--order cluster)")
    t.add_argument("--out", type=Path, default=None,
                   help="output folder (default traces/<graph>-p<P>-<method>)")
    t.set_defaults(func=main_tracegen)


def _prefetch_and_extra(args, source: dict):
    """make_policy's extra kwargs (agent config, policy rule's knobs, classifier models dir,
    dataset); a --config also replaces the source's prefetch section, which the policies' knobs
    start from, and gives the agent and rule sections (else the source run's own)."""
    from rudder.config import RunConfig, load_run_config

    extra: dict = {}
    if args.config is not None:
        cfg = load_run_config(args.config)
        source["config"] = {**(source.get("config") or {}), "prefetch": cfg.prefetch.model_dump(mode="json"),
                            "agent": cfg.agent.model_dump(mode="json"), "rule": cfg.rule.model_dump(mode="json")}
        extra["agent"], extra["rule"] = cfg.agent, cfg.rule
    else:
        for key in ("agent", "rule"):
            if (source.get("config") or {}).get(key):
                try:
                    extra[key] = getattr(RunConfig.model_validate({key: source["config"][key]}), key)
                except Exception:  # noqa: BLE001 - another version's config: defaults
                    pass
    if args.models_dir:
        extra["models_dir"] = args.models_dir
    ds = ((source.get("config") or {}).get("dataset") or {}).get("name") or (source.get("graph") or {}).get("dataset")
    if ds:
        extra["dataset"] = ds
    return extra


def main_sim(args) -> int:
    from rudder.sim.simulate import (expand_grid, load_source, parse_policy, rank_source, simulate,
                                     write_sim_run, _source_prefetch)

    import torch

    torch.set_num_threads(args.threads)
    traces, source = load_source(args.source)
    if args.ranks:
        want = set(args.ranks)
        missing = want - set(traces)
        if missing:
            raise ValueError(f"no trace for rank(s) {sorted(missing)}; have {sorted(traces)}")
        traces = {r: t for r, t in traces.items() if r in want}
    extra = _prefetch_and_extra(args, source)
    specs = [s for p in (args.policy or DEFAULT_POLICIES) for s in expand_grid(p)]
    base_pf = _source_prefetch(source)
    parsed = [parse_policy(s, base_pf) for s in specs]  # fail on a bad name before any replay
    header = not args.json  # printed with the first row: a bad capacity fails before any table
    for spec in parsed:
        results = []
        for rank, trace in traces.items():
            cap = args.capacity
            if args.fraction is not None:
                cap = int(args.fraction * trace.num_halo)
            # each policy its own kwargs; the others take none
            ex: dict = {}
            if spec.base == "agent":
                ex = {k: v for k, v in extra.items() if k == "agent"}
            elif spec.base == "classifier":
                ex = {k: v for k, v in extra.items() if k not in ("agent", "rule")}
            elif spec.base == "rule":  # the config's `rule:` knobs (probe, evict, drop, go_on)
                ex = extra["rule"].model_dump() if "rule" in extra else {}
            res = simulate(trace, spec, capacity=cap, start=args.start, rank=rank,
                           source=rank_source(source, rank), extra=ex, agent_sync=not args.no_agent_sync)
            results.append(res)
            s = res.summary()
            if args.json:
                print(json.dumps(s))
            else:
                if header:
                    print(f"{'policy':<22} {'rank':>4} {'capacity':>8} {'hit%':>6} {'fetched% of none':>17} "
                          f"{'admitted':>9} {'extra':>7} {'decisions':>9} {'Maccesses/s':>12}")
                    header = False
                print(f"{spec.spec:<22} {rank:>4} {s['capacity']:>8} {100 * s['hit_rate']:>6.1f} "
                      f"{100 * s['fetched_frac']:>17.1f} {s['admitted_rows']:>9} {s['replaced_rows']:>7} "
                      f"{s['decisions']:>9} "
                      f"{s['accesses_per_s'] / 1e6:>12.2f}")
        if not args.no_write:
            cap_tag = args.capacity if args.capacity is not None else (
                f"f{args.fraction:g}" if args.fraction is not None else None)
            d = write_sim_run(args.runs_dir, results, source, study=args.study, start=args.start,
                              capacity=cap_tag)
            log.info("wrote %s", d)
    return 0


def main_tracegen(args) -> int:
    from rudder.sim.tracegen import TraceGenSpec, generate_trace, tracegen_summary, write_tracegen

    spec = TraceGenSpec(
        graph=args.graph, parts=args.parts, part=args.part, method=args.method,
        fanouts=[int(x) for x in str(args.fanouts).split(",") if x], batch_size=args.batch_size,
        epochs=args.epochs, fraction=args.fraction, init=args.init, seed=args.seed,
        max_steps_per_epoch=args.max_steps, order=args.order, cluster_size=args.cluster_size,
    )
    spec.validate()
    trace, facts = generate_trace(spec)
    out = args.out or Path("traces") / f"{args.graph}-p{args.parts}-{args.method}"
    path = write_tracegen(out, trace, spec, facts)
    print(json.dumps({"trace": str(path), **tracegen_summary(trace), **facts}, indent=2))
    return 0
