"""Issue 18, must-have 4: a scenario's baselines live, on a real emulated cluster -- epoch time
and rows fetched for every fixed setting, the hand-written rule and the agent -- beside the
replay rows of bench_baselines.py.

  python benchmarks/bench_scenario_live.py --scenario configs/scenarios/history_cold.yaml \\
      --policies none static fixed:10 fixed:5:half rule rule+probe+half agent:smollm2-135m \\
      --repeats 2 --bandwidth 100mbit

Policy words: none, static, fixed:PERIOD[:half] (prefetch.period, prefetch.evict), lookahead
[:any] (prefetch.admit), rule[+probe][+half][+pay] (the run config's `rule:` section: probe, evict half, go_on payback), agent:MODEL
[:PROMPT] (in-process; the scenario's prompt, or agent.prompt PROMPT). Where the windows carry the
past counterfactual (a past prompt: judge-history-2 / -2b), its live cost is printed too
(t_past_cf per window and its share of the epochs: benchmarks/bench_past_live.py).
The runs go in rounds, every policy once per round in turn, so load drifting over the benchmark
falls on all of them alike; each figure is the median over the rounds. Rows and epoch time are
quoted against the best fixed setting (min over the fixed:* words given) of the same rounds.
On a 2-core host the agent's model shares the trainers' cores: its epoch time is its CPU cost,
its decisions' worth is the replay's (bench_baselines.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_past_live import past_cost  # noqa: E402
from bench_policies import summarize  # noqa: E402

from rudder.config import load_run_config  # noqa: E402
from rudder.runner import execute_run  # noqa: E402


def overrides_for(word: str) -> dict:
    """A policy word -> the config keys it sets (module docstring)."""
    base, _, arg = word.partition(":")
    if base in ("none", "static") and not arg:
        return {"prefetch.policy": base}
    if base == "fixed":
        period, _, evict = arg.partition(":")
        if not period.isdigit() or evict not in ("", "half", "stale"):
            raise SystemExit(f"bad policy word {word!r}: expected fixed:PERIOD or fixed:PERIOD:half")
        return {"prefetch.policy": "fixed", "prefetch.period": int(period), "prefetch.evict": evict or "stale"}
    if base == "lookahead" and arg in ("", "any", "misses"):
        return {"prefetch.policy": "lookahead", "prefetch.admit": arg or "misses"}
    if word.split("+")[0] == "rule":
        opts = set(word.split("+")[1:])
        if opts - {"probe", "half", "pay"}:
            raise SystemExit(f"bad policy word {word!r}: rule takes +probe, +half and +pay")
        return {"prefetch.policy": "rule", "rule.probe": "probe" in opts, "rule.evict": "half" if "half" in opts else None,
                "rule.go_on": "payback" if "pay" in opts else "lift"}
    if base == "agent" and arg:
        model, _, prompt = arg.partition(":")
        return {"prefetch.policy": "agent", "agent.model.name": model, "agent.backend": "inproc",
                **({"agent.prompt": prompt} if prompt else {})}
    raise SystemExit(f"unknown policy word {word!r} (see --help)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="configs/scenarios/history_cold.yaml")
    ap.add_argument("--policies", nargs="+",
                    default=["none", "static", "fixed:10", "fixed:5:half", "rule", "rule+probe+half"])
    ap.add_argument("--repeats", type=int, default=2, help="rounds (every policy once per round)")
    ap.add_argument("--bandwidth", default="scenario",
                    help="tbf rate per machine link; none = unshaped; scenario (default) = the "
                         "scenario's link and its bandwidth_schedule")
    ap.add_argument("--epochs", type=int, help="train.epochs (default: the scenario's)")
    ap.add_argument("--runs-dir", default="runs/scenario-live")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--out", help="write the summary rows as JSON here")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config keys set on every run (e.g. agent.model.path=FILE)")
    args = ap.parse_args()
    words = list(dict.fromkeys(args.policies))
    sets = {w: overrides_for(w) for w in words}  # every word checked before any run starts
    base = {"runs_dir": args.runs_dir, "dataset.root": args.data_root, "train.eval_every": 0}
    if args.bandwidth != "scenario":
        base["cluster.bandwidth"] = None if args.bandwidth == "none" else args.bandwidth
    if args.epochs:
        base["train.epochs"] = args.epochs
    base.update(kv.split("=", 1) for kv in args.set)
    results: dict[str, list[dict]] = {w: [] for w in words}
    t0 = time.time()
    for rnd in range(args.repeats):
        for w in words:
            cfg = load_run_config(args.scenario, {**base, **sets[w]})
            res = execute_run(cfg, run_id=f"live-{Path(args.scenario).stem}-{w.replace(':', '_').replace('+', '_')}-{rnd}")
            if not res.ok:
                raise SystemExit(f"run {res.run_dir} failed: {res.reason}")
            ranks = cfg.cluster.machines * cfg.cluster.trainers_per_machine
            s = summarize(Path(res.run_dir), ranks)
            s["past"] = past_cost(Path(res.run_dir), ranks)
            s["run_dir"] = str(res.run_dir)
            results[w].append(s)
            print(f"[{time.time() - t0:6.0f} s] round {rnd + 1}/{args.repeats} {w}: epoch {s['epoch_s']:.2f} s, "
                  f"fetched rows/epoch {s['fetched_rows_per_epoch']:,.0f}", flush=True)
    med = {w: {k: statistics.median(r[k] for r in rs) for k in ("epoch_s", "fetched_rows_per_epoch", "hit_rate", "stall_share")}
           for w, rs in results.items()}
    for w, rs in results.items():
        if any("decisions" in r for r in rs):
            med[w]["decisions"] = [(r.get("decisions", 0), r.get("applied", 0)) for r in rs]
    fixed = [w for w in words if w.startswith("fixed:")]
    ref = min(fixed, key=lambda w: med[w]["fetched_rows_per_epoch"]) if fixed else None
    print(f"\n{args.scenario}, {args.repeats} rounds, link {args.bandwidth}; ratios to {ref or '(no fixed word)'}\n")
    print("| policy | epoch s | epoch / fixed-best | fetched rows per epoch | rows / fixed-best | hit rate | stall share | decisions (applied) |")
    print("|---|---|---|---|---|---|---|---|")
    for w in words:
        m = med[w]
        er = f"{m['epoch_s'] / med[ref]['epoch_s']:.3f}" if ref else "-"
        rr = f"{m['fetched_rows_per_epoch'] / med[ref]['fetched_rows_per_epoch']:.3f}" if ref else "-"
        dec = ", ".join(f"{d} ({a})" for d, a in m.get("decisions", [])) or "-"
        print(f"| {w} | {m['epoch_s']:.2f} | {er} | {m['fetched_rows_per_epoch']:,.0f} | {rr} | "
              f"{100 * m['hit_rate']:.1f}% | {100 * m['stall_share']:.0f}% | {dec} |")
    past = [w for w in words if any(r["past"]["past_windows"] for r in results[w])]
    if past:
        print("\nthe past counterfactual live (per round: windows measured, t_past_cf median / max ms, "
              "sum / epochs' time)\n")
        for w in past:
            print(f"- {w}: " + "; ".join(
                f"{p['past_windows']} windows, {p['t_past_cf_ms_median']:.1f} / {p['t_past_cf_ms_max']:.1f} ms, "
                f"{100 * p['past_share']:.2f}%" for p in (r["past"] for r in results[w]) if p["past_windows"]))
    if args.out:
        Path(args.out).write_text(json.dumps({"scenario": args.scenario, "reference": ref, "median": med,
                                              "runs": results}, indent=1))


if __name__ == "__main__":
    main()
