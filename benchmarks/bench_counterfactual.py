"""Decisions judged against their counterfactual (issue 18): how often replacing saves, costs or
is neutral, and Pass@1 before/after vs counterfactual, on a real trace.

  rudder tracegen --graph synth-small --parts 2 --batch-size 500 --epochs 10 --out T
  python benchmarks/bench_counterfactual.py T/trace-r0.npz [--runs-dir D] [--seeds 3]

Decision makers (no LLM): the random collector of the agent policy (RandomDecisionMaker, replace
or keep by a seeded coin, rudder.agent.hindsight.collect_run) at budgets medium and large, and
the classifiers' random collector (`rudder sim -p collect`); each with lookahead (depth 8, the
default) and history-only (`prefetch.lookahead: 0`, MassiveGNN rounds). Every run is judged by
rudder.agent.hindsight.judge_run (horizon: the two windows after each decision).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.agent.hindsight import collect_run, judge_run, summarize  # noqa: E402


def collector_run(trace: Path, runs_dir: Path, lookahead: int, window: int, seed: int) -> Path:
    """The classifiers' random collector (`collect`) replayed and written as `rudder sim` does."""
    from rudder.sim.simulate import load_source, rank_source, simulate, write_sim_run

    traces, source = load_source(trace)
    cfg = json.loads(json.dumps(source.get("config") or {}))
    cfg.setdefault("prefetch", {}).update(policy="collect", window=window, lookahead=lookahead)
    cfg.setdefault("agent", {})["seed"] = seed
    source["config"] = cfg
    res = [simulate(t, "collect", rank=r, source=rank_source(source, r)) for r, t in sorted(traces.items())]
    return write_sim_run(runs_dir, res, source, run_id=f"sim-collect-w{window}-la{lookahead}-s{seed}",
                         study="counterfactual")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--runs-dir", type=Path, default=Path("runs/counterfactual"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--window", type=int, default=10)
    a = p.parse_args()
    rows = []
    for la in (8, 0):
        for maker in ("random:medium", "random:large", "collect"):
            recs = []
            for seed in range(a.seeds):
                if maker == "collect":
                    run = collector_run(a.trace, a.runs_dir, la, a.window, seed)
                    judge_run(run)
                else:  # collect_run judges its run
                    run = collect_run(a.trace, a.runs_dir, window=a.window, lookahead=la, seed=seed,
                                      budget=maker.split(":")[1], study="counterfactual")
                recs += [json.loads(x) for x in (run / "decisions-r0.jsonl").read_text().splitlines()]
            s = summarize(recs)
            rows.append({"lookahead": la, "maker": maker, **s})
            (c, n), (cc, cn) = s["pass_at_1"], s["pass_at_1_cf"]
            j = max(1, s["judged"])
            print(f"| {la} | {maker} | {s['judged']} | {s['saves'] / j:.2f} | {s['neutral'] / j:.2f} | "
                  f"{s['costs'] / j:.2f} | {c / max(1, n):.2f} ({n}) | {cc / max(1, cn):.2f} ({cn}) |",
                  flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
