"""Issue 18's scenarios and their label balance: for each configs/scenarios/*.yaml, the share of
windows where replacing saves, is neutral or costs by the counterfactual judge, per budget, and
the replay baselines (hits and rows against Belady) on the scenario's stream.

  python benchmarks/bench_scenarios.py [--scenarios stationary ring_cluster ...] [--seeds 3]
         [--ring-nodes 1000000] [--out-dir traces/scenarios] [--runs-dir runs/scenarios]

Per scenario: a trace of partition 0's trainer as `rudder tracegen` samples it from the config
(rudder.sim.tracegen.spec_from_config: dataset, partitioning, machines, fanouts, batch size,
epochs, train.order). ring_cluster's trace is sampled from a `structure: ring` graph of
--ring-nodes nodes generated here (the synth-ring-bench preset at that size, see ring_spec; the
config's synth-ring is the small one training uses by default); its
`ring_shuffle` twin is the same graph with shuffled seeds, the "before" of the order.
Label balance: the agent policy with a seeded coin for a decision maker
(rudder.agent.hindsight.collect_run) at each budget word, at the config's depth (`lookahead`)
and admission, every decision judged by rudder.agent.hindsight.judge_run (the decision taken vs
its alternative from the same buffer state, the two windows after it). A depth-0 scenario's
replace is a MassiveGNN round. Baselines: `rudder sim`'s replay of static, fixed:25, lookahead at
depth 8 (budget 0.1 and 1.0) and Belady at the config's buffer fraction.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("stationary", "stationary_nolookahead", "history_only", "ring_cluster")
BUDGETS = ("small", "medium", "large")
BASELINES = ("static", "fixed:25", "lookahead:8:0.1", "lookahead:8:1.0", "belady")


def ring_spec(nodes: int, seed: int = 0):
    """The benchmark's ring: the `synth-ring-bench` preset (rudder/data/synthetic.py, the graph
    the live runs train on) scaled to `nodes` nodes at ~1000 per community. Features are not
    needed for a trace: feat_dim 4 keeps generation small, and it is what the §7c traces were
    sampled with (feat_dim changes the random stream after the edges and labels, hence which
    nodes train)."""
    from rudder.data.synthetic import PRESETS

    return dataclasses.replace(PRESETS["synth-ring-bench"], nodes=nodes,
                               communities=max(2, nodes // 1000), feat_dim=4, seed=seed)


def ring_trace(spec, nodes: int):
    """(trace, facts) of `spec` (a TraceGenSpec) on a generated ring of `nodes` nodes."""
    from rudder.data.synthetic import arrays_to_graph, generate_arrays
    from rudder.sim.tracegen import partition_assignment, trace_from_graph

    s = ring_spec(nodes, spec.seed)
    arr = generate_arrays(s)
    g = arrays_to_graph(arr.src, arr.dst, s.nodes, {"train_mask": arr.train_mask})
    del arr
    owner = partition_assignment(g, spec.parts, spec.method, spec.seed)
    spec = dataclasses.replace(spec, feat_bytes=512)  # 128 float32 features, as synth-bench
    trace = trace_from_graph(g, owner, spec)
    facts = {"dataset": f"ring-{nodes}", "num_nodes": nodes, "num_edges": int(g.num_edges()),
             "partition_nodes": int((owner == spec.part).sum()), "num_trainers": spec.parts,
             "batch_size": spec.batch_size, "fanouts": list(spec.fanouts),
             "halo_nodes": trace.num_halo, "capacity": trace.capacity}
    return trace, facts, spec


def make_trace(name: str, cfg, out: Path, ring_nodes: int, ring_epochs: int, order: str | None = None) -> Path:
    from rudder.sim.tracegen import generate_trace, is_current, spec_from_config, write_tracegen

    over = {"order": order} if order else {}
    if cfg.dataset.name == "synth-ring" and ring_nodes:
        over["epochs"] = ring_epochs
    spec = spec_from_config(cfg, **over)
    path = out / name / "trace-r0.npz"
    if path.exists() and is_current(path.parent):
        return path
    t0 = time.perf_counter()
    if cfg.dataset.name == "synth-ring" and ring_nodes:
        trace, facts, spec = ring_trace(spec, ring_nodes)
    else:
        trace, facts = generate_trace(spec)
    write_tracegen(out / name, trace, spec, facts)
    print(f"# {name}: {trace.num_minibatches} minibatches, {trace.num_accesses} remote accesses, "
          f"halo {trace.num_halo}, capacity {trace.capacity} ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    return path


def balance(trace: Path, runs: Path, pc, depth: int, budget: str, seeds: int) -> dict:
    from rudder.agent.hindsight import collect_run, summarize

    recs = []
    for seed in range(seeds):
        run = collect_run(trace, runs, window=pc.window, lookahead=depth, budget=budget,
                          seed=seed, admit=pc.admit, study="scenarios")
        recs += [json.loads(x) for x in (run / "decisions-r0.jsonl").read_text().splitlines()]
    return summarize(recs)


def baselines(trace: Path) -> dict:
    from rudder.sim.simulate import load_source, simulate

    t = load_source(trace)[0][0]
    return {p: simulate(t, p).summary() for p in BASELINES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--ring-nodes", type=int, default=1_000_000)
    p.add_argument("--ring-epochs", type=int, default=2, help="epochs of the generated ring's trace")
    p.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=BUDGETS)
    p.add_argument("--out-dir", type=Path, default=Path("traces/scenarios"))
    p.add_argument("--runs-dir", type=Path, default=Path("runs/scenarios"))
    a = p.parse_args()
    import torch

    # one thread: the replays work on halo-sized tensors; on a loaded 2-core host torch's thread
    # pool made them ~36x slower (measured: 40 minibatches of the 1M ring, 161 s vs 4.4 s)
    torch.set_num_threads(1)
    from rudder.config import load_run_config

    todo = []
    for name in a.scenarios:
        cfg = load_run_config(ROOT / "configs" / "scenarios" / f"{name}.yaml")
        todo.append((name, cfg, make_trace(name, cfg, a.out_dir, a.ring_nodes, a.ring_epochs)))
        if name == "ring_cluster":  # the same graph, seeds shuffled: the stream before the order
            todo.append(("ring_shuffle", cfg, make_trace("ring_shuffle", cfg, a.out_dir, a.ring_nodes,
                                                         a.ring_epochs, order="shuffle")))
    rows = []
    print("| scenario | depth | budget | judged | saves | neutral | costs | Pass@1 cf (coin) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cfg, trace in todo:
        # the drifting pair also history-only: does a recency-scored round stay right there?
        depths = (cfg.prefetch.lookahead, 0) if name.startswith("ring") else (cfg.prefetch.lookahead,)
        for depth, budget in ((d, b) for d in depths for b in a.budgets):
            s = balance(trace, a.runs_dir / name, cfg.prefetch, depth, budget, a.seeds)
            j = max(1, s["judged"])
            cc, cn = s["pass_at_1_cf"]
            rows.append({"scenario": name, "depth": depth, "budget": budget, **s})
            print(f"| {name} | {depth} | {budget} | {s['judged']} | {s['saves'] / j:.2f} "
                  f"| {s['neutral'] / j:.2f} | {s['costs'] / j:.2f} | {cc / max(1, cn):.2f} ({cn}) |",
                  flush=True)
    print()
    print("| scenario | " + " | ".join(BASELINES[:-1]) + " | Belady hit % |")
    print("|---|" + "---|" * len(BASELINES))
    base = {}
    for name, _cfg, trace in todo:
        b = base[name] = baselines(trace)
        bel = b["belady"]
        cells = [f"{b[q]['hits'] / max(1, bel['hits']):.2f} / {b[q]['fetched_rows'] / max(1, bel['fetched_rows']):.2f}"
                 for q in BASELINES[:-1]]
        print(f"| {name} | " + " | ".join(cells) + f" | {100 * bel['hit_rate']:.1f} |", flush=True)
    print(json.dumps({"balance": rows, "baselines": base}, default=str))


if __name__ == "__main__":
    main()
