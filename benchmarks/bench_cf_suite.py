"""Issue 18, must-have 5 (first cut): the decision suite rebuilt from counterfactual labels of the
scenarios, balanced, with a held-out split by scenario.

  python benchmarks/bench_cf_suite.py [--scenarios stationary_nolookahead history_only ...]
         [--seeds 2] [--budgets small medium large] [--held-out history_only]
         [--trace-dir data/traces/baselines] [--out data/cf_suite] [--eval-model smollm2-135m]

Per scenario: its trace (bench_scenarios.make_trace, as bench_baselines), replayed under the
agent policy with a seeded coin for a decision maker (rudder.agent.hindsight.collect_run) at
the scenario's depth and window, every decision judged against its counterfactual; each judged
window labelled by what replacing saved (rudder.agent.eval.label_windows_from_run(...,
by="counterfactual")). The held-out scenarios make test.jsonl with their labels as they fall;
the rest, balanced (the majority label downsampled per scenario; a scenario with one label only
is dropped), make train.jsonl. Printed: label balance per scenario before and after. --eval-model: score that model (`default` prompt) on the held-out set.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
from bench_baselines import SCENARIOS  # noqa: E402  (the scenarios every baseline runs on)

from rudder.agent.hindsight import HORIZON  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--budgets", nargs="+", default=["small", "medium", "large"])
    p.add_argument("--held-out", nargs="+", default=["history_only"])
    p.add_argument("--ring-nodes", type=int, default=200_000)
    p.add_argument("--trace-dir", type=Path, default=Path("data/traces/baselines"))
    p.add_argument("--out", type=Path, default=Path("data/cf_suite"))
    p.add_argument("--eval-model", default=None)
    p.add_argument("--horizon", type=int, default=HORIZON,
                   help=f"windows the judge replays after each decision (default {HORIZON}, the judge's)")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from bench_baselines import SAME_TRACE
    from bench_scenarios import make_trace

    from rudder.agent.eval import balanced, label_balance, label_windows_from_run, split_held_out, write_jsonl
    from rudder.agent.hindsight import collect_run
    from rudder.config import load_run_config

    t0 = time.time()
    recs = []
    for name in a.scenarios:
        cfg = load_run_config(ROOT / "configs" / "scenarios" / f"{name}.yaml")
        tname = SAME_TRACE.get(name, name)
        tcfg = load_run_config(ROOT / "configs" / "scenarios" / f"{tname}.yaml")
        trace = make_trace(tname, tcfg, a.trace_dir, a.ring_nodes, 2)
        pc = cfg.prefetch
        for budget in a.budgets:
            for seed in range(a.seeds):
                run = collect_run(trace, a.out / "runs" / name, window=pc.window, lookahead=pc.lookahead,
                                  budget=budget, seed=seed, admit=pc.admit, study="cf-suite",
                                  prefetch={"alpha": pc.alpha, "period": pc.period}, horizon=a.horizon)
                recs += label_windows_from_run(run, by="counterfactual", scenario=name)
        print(f"# {name}: {len(recs)} labelled windows so far ({time.time() - t0:.0f} s)", flush=True)
    # held out first (the test part keeps its natural labels), then the training part balanced
    rest, test = split_held_out(recs, a.held_out)
    bal = train = balanced(rest)
    a.out.mkdir(parents=True, exist_ok=True)
    for f, rs in (("suite-all.jsonl", recs), ("suite-balanced.jsonl", bal), ("train.jsonl", train), ("test.jsonl", test)):
        write_jsonl(rs, a.out / f)
    before, after = label_balance(recs), label_balance(bal)
    print("| scenario | windows | replace right | keep right | replace share | balanced windows |")
    print("|---|---|---|---|---|---|")
    for k, b in before.items():
        print(f"| {k} | {b['n']} | {b['replace']} | {b['keep']} | {b['replace_share']:.2f} | {after.get(k, {}).get('n', 0)} |")
    print(f"held out ({', '.join(a.held_out)}): train {len(train)}, test {len(test)} windows")
    if a.eval_model and test:
        from rudder.agent.eval import evaluate_many, format_table

        res = evaluate_many(a.out / "test.jsonl", [a.eval_model], ["default"])
        print(format_table([r.summary() for r in res]))
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
