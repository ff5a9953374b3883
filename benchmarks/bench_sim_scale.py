"""Policies against Belady's optimum from 2 to 64 partitions, by trace replay (no training):
%-hits and rows fetched per policy as fractions of the oracle's, at two buffer sizes.

  python benchmarks/bench_sim_scale.py --graph synth-medium --parts 2 4 8 16 32 64
  python benchmarks/bench_sim_scale.py --policies static fixed:25 classifier:best agent --fractions 0.25

`agent` replays with a real LLM in the loop (--agent-model; one model loaded once for every
cell, each window's answer applied at the next minibatch); `classifier:NAME` loads NAME from
--models-dir, `classifier:best` the one with the highest cross-validated accuracy there (as
trained by benchmarks/bench_agent_sim.py). The agent decides once before the first minibatch
(the start decision) and once per window of 10 minibatches, so cells with fewer than 10
minibatches see only the start decision.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench_agent_sim import PAUSE_FILE, best_classifier, load_agent, provenance, replay, yield_to  # benchmarks/ is on sys.path as a script
from rudder.sim.simulate import simulate
from rudder.sim.tracegen import TraceGenSpec, generate_trace, write_tracegen

POLICIES = ["static", "fixed:25", "lookahead:3:0.05", "lookahead:8:0.05", "lookahead:8:0.05:any", "lru", "lfu", "s3fifo", "sieve"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="synth-medium")
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--out", default="benchmarks/results/sim_scale.md")
    ap.add_argument("--trace-dir", type=Path, default=None,
                    help="keep each P's trace here and reuse it on the next run (default: regenerate)")
    ap.add_argument("--agent-model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--models-dir", default="runs/bench-agent-sim/classifiers",
                    help="classifier models (policy classifier:NAME; classifier:best)")
    ap.add_argument("--pause-file", default=PAUSE_FILE, help="wait while this file exists ('' = never)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if "classifier:best" in args.policies:
        best = best_classifier(args.models_dir)
        if best is None:
            ap.error(f"classifier:best: no trained classifiers in {args.models_dir}")
        args.policies = [f"classifier:{best}" if p == "classifier:best" else p for p in args.policies]
    yield_to(args.pause_file)
    agent = load_agent(args.agent_model) if "agent" in args.policies else None
    try:
        run(args, agent)
    finally:
        if agent:
            agent["decision_maker"].shutdown()


def scale_trace(args, P: int):
    """P's trace: from --trace-dir when it is there, else sampled (and kept there if given)."""
    spec = TraceGenSpec(graph=args.graph, parts=P, epochs=args.epochs, fraction=max(args.fractions))
    path = args.trace_dir / f"{args.graph}-p{P}-e{args.epochs}-f{spec.fraction:g}" / "trace-r0.npz" if args.trace_dir else None
    if path is not None and path.exists():
        from rudder.sim.simulate import load_source, rank_source

        traces, source = load_source(path)
        return traces[0], rank_source(source, 0)
    trace, facts = generate_trace(spec)
    if path is not None:
        write_tracegen(path.parent, trace, spec, facts)
    return trace, {"graph": facts}


def run(args, agent) -> None:
    lines = [
        f"graph {args.graph}, METIS, fanout 10,25, batch 1000, {args.epochs} epochs, partition 0's trainer; "
        "each cell: hits / Belady's hits, rows fetched / Belady's rows (Belady: demand-fetch optimum, "
        f"same capacity and initial fill); {provenance()}",
        "",
        "| P | fraction | halo | accesses | Belady hit % | " + " | ".join(args.policies) + " |",
        "|---|---|---|---|---|" + "---|" * len(args.policies),
    ]
    speeds: dict[str, list[float]] = {}
    agent_cells: list = []
    for P in args.parts:
        t0 = time.time()
        yield_to(args.pause_file)
        trace, source = scale_trace(args, P)
        print(f"P={P}: trace of {trace.num_minibatches} minibatches, {trace.num_accesses} accesses, "
              f"halo {trace.num_halo} ({time.time() - t0:.0f} s)", flush=True)
        for frac in args.fractions:
            C = int(frac * trace.num_halo)
            opt = simulate(trace, "belady", capacity=C).summary()
            cells = []
            for pol in args.policies:
                yield_to(args.pause_file)
                s = replay(trace, source, pol, C, agent=agent, models_dir=args.models_dir)
                if pol == "agent":
                    agent_cells.append((P, frac, s, opt))
                else:  # the agent's replay time is mostly the model's: not a replay speed
                    speeds.setdefault(pol, []).append(s["accesses_per_s"])
                cells.append(f"{s['hits'] / max(opt['hits'], 1):.2f} / {s['fetched_rows'] / max(opt['fetched_rows'], 1):.2f}")
            lines.append(f"| {P} | {frac} | {trace.num_halo} | {trace.num_accesses} | {100 * opt['hit_rate']:.1f} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    lines += ["", "Replay throughput (median over runs, M accesses/s, one thread): " +
              ", ".join(f"{p} {sorted(v)[len(v) // 2] / 1e6:.1f}" for p, v in speeds.items())]
    if agent_cells:
        lines += ["", f"Agent ({args.agent_model}, 1 thread; a start decision, then one per 10 minibatches): per cell "
                  "P/fraction: minibatches, decisions (replaces, fallbacks), mean s/decision, gap to Belady "
                  "(1 - hits/Belady's hits)", ""]
        lines += [f"- P={P}, {frac}: {s['minibatches']} minibatches, {s['decisions']} decisions "
                  f"({s['replaces']} replace, {s['fallbacks']} fallback), "
                  f"{'-' if s['latency_mean_s'] is None else format(s['latency_mean_s'], '.1f')} s, "
                  f"gap {1 - s['hits'] / max(o['hits'], 1):.2f}" for P, frac, s, o in agent_cells]
    text = "\n".join(lines)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
