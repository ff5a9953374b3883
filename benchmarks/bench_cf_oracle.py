"""Issue 18: the counterfactual-greedy decider -- the ceiling of what the judge's labels are worth
on a scenario. At each window close, in order, it takes the answer the counterfactual judge
(rudder agent judge: replace vs keep from the same buffer state over the next --horizon windows,
2 as the judge's default)
finds best given its own earlier answers: replace at the budget word that saves the most rows,
or keep where no budget saves any. Its rows fetched over the whole trace say how far a decider
that is always right by the judge gets against the fixed setting chosen in hindsight.

  python benchmarks/bench_cf_oracle.py [--scenario history_cold] [--trace-dir data/traces/baselines]
         [--budgets small medium large] [--runs-dir /tmp/cf-oracle]

The trace is the scenario's as bench_baselines samples it (same --trace-dir: the same trace).
Cost: windows x budgets replays, each judged (~1 s each on synth-medium).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]


class ScriptedMaker:
    """Answers from a list, in order ((replace, budget) pairs); keep once the list runs out."""

    def __init__(self, answers: list[tuple[bool, str]], keep_budget: str):
        self.answers, self.i, self.keep_budget = list(answers), 0, keep_budget

    def decide(self, prompt, cancel=None):
        from rudder.agent.messages import Decision

        rep, budget = self.answers[self.i] if self.i < len(self.answers) else (False, self.keep_budget)
        self.i += 1
        return Decision(replace=rep, budget=budget, expected_hit_rate="flat", expected_remote_rows="flat",
                        reason="scripted", model="scripted", backend="scripted", latency_s=0.0)

    def close(self) -> None:
        pass


def scripted_run(trace_path: Path, runs: Path, answers, keep_budget: str, prefetch: dict,
                 horizon: int = 2) -> tuple[list[dict], int]:
    """(judged decision records, rows fetched) of the agent policy answering `answers` then keep:
    hindsight.collect_run with this maker, at the scenario's prefetch settings (not the trace's)."""
    from rudder.agent.hindsight import collect_run
    from rudder.records import read_jsonl

    run = collect_run(trace_path, runs, window=None, prefetch=prefetch, study="cf-oracle", horizon=horizon,
                      maker=lambda rank: ScriptedMaker(answers, keep_budget),
                      run_id=f"oracle-{len(answers)}-{keep_budget}")
    recs = read_jsonl(run / "decisions-r0.jsonl")
    rows = int(sum(e["fetched_rows"] for e in read_jsonl(run / "epochs-r0.jsonl")))
    shutil.rmtree(run)
    return recs, rows


def greedy(trace_path: Path, runs: Path, budgets: list[str], prefetch: dict, horizon: int = 2) -> dict:
    answers: list[tuple[bool, str]] = []
    shares: list[dict] = []
    while True:
        k = len(answers)
        best, judged = None, {}
        for b in budgets:  # keep at k (and after), judged against a replace at b
            recs, _ = scripted_run(trace_path, runs, answers, b, prefetch, horizon)
            if k >= len(recs) or recs[k].get("cf_replace_share") is None:
                break  # past the last judgeable decision
            judged[b] = recs[k]["cf_replace_share"]
        if len(judged) < len(budgets):
            break
        b, share = max(judged.items(), key=lambda kv: kv[1])
        answers.append((share > 0, b if share > 0 else budgets[0]))
        shares.append(judged)
    _, rows = scripted_run(trace_path, runs, answers, budgets[0], prefetch)
    return {"answers": answers, "shares": shares, "fetched_rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="history_cold")
    p.add_argument("--trace-dir", type=Path, default=Path("data/traces/baselines"))
    p.add_argument("--budgets", nargs="+", default=["small", "medium", "large"])
    p.add_argument("--runs-dir", type=Path, default=Path("runs/cf-oracle"))
    p.add_argument("--horizon", type=int, default=2, help="windows the judge counts after a decision")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from bench_baselines import SAME_TRACE
    from bench_scenarios import make_trace

    from rudder.config import load_run_config

    t0 = time.time()
    cfg = load_run_config(ROOT / "configs" / "scenarios" / f"{a.scenario}.yaml")
    tname = SAME_TRACE.get(a.scenario, a.scenario)
    trace = make_trace(tname, load_run_config(ROOT / "configs" / "scenarios" / f"{tname}.yaml"), a.trace_dir, 200_000, 2)
    pc = cfg.prefetch
    out = greedy(trace, a.runs_dir, a.budgets, pc.model_dump(mode="json"), a.horizon)
    seq = " ".join(f"{b[0]}" if r else "k" for r, b in out["answers"])
    print(f"{a.scenario}, horizon {a.horizon} windows: counterfactual-greedy answers (s/m/l = replace at that budget, k = keep): {seq}")
    print(f"rows fetched {out['fetched_rows']:,} ({time.time() - t0:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
