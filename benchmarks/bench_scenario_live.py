"""Issue 18, must-have 4: a scenario's baselines live, on a real emulated cluster -- epoch time
and rows fetched for every fixed setting, the hand-written rule and the agent -- beside the
replay rows of bench_baselines.py.

  python benchmarks/bench_scenario_live.py --scenario configs/scenarios/history_cold.yaml \\
      --policies none static fixed:10 fixed:5:half rule rule+probe+half agent:smollm2-135m \\
      --repeats 2 --bandwidth 100mbit [--set dataset.name=synth-ring-bench ...] [--belady]

Policy words: none, static, fixed:PERIOD[:half] (prefetch.period, prefetch.evict), lookahead
[:any] (prefetch.admit), rule[+probe][+half][+pay] (the run config's `rule:` section: probe, evict half, go_on payback), agent:MODEL
[:PROMPT] (in-process; the scenario's prompt, or agent.prompt PROMPT), script:DIR[:PROMPT] (the agent with
the answers recorded in DIR/decisions-r<R>.jsonl, e.g. `rudder sim`'s replay of the LLM on a
live run's traces, window by window and no model running: rudder.agent.script), classifier:NAME
(a trained model in $RUDDER_CLASSIFIERS_DIR, default models/classifiers). Where the windows carry the
past counterfactual (a past prompt: judge-history-2 / -2b), its live cost is printed too
(t_past_cf per window and its share of the epochs: benchmarks/bench_past_live.py).
The runs go in rounds, every policy once per round in turn, so load drifting over the benchmark
falls on all of them alike; each figure is the median over the rounds. Rows and epoch time are
quoted against the best fixed setting (min over the fixed:* words given) of the same rounds.
On a 2-core host the agent's model shares the trainers' cores: its epoch time is its CPU cost,
its decisions' worth is the replay's (bench_baselines.py), or live a script: word's (its answers
without its CPU).
--set KEY=VALUE overrides a scenario key for every run (as `rudder run --set`), WORD@KEY=VALUE for
WORD's runs only (e.g. script:DIR@prefetch.past_thread=false beside script:DIR); --belady adds
each run's hits as a share of Belady's over all remote nodes on its own traces (`rudder oracle`'s
yardstick). Validation accuracy is the end-of-run pass (train.eval_every 0).
--replay WORD: afterwards, the traces of WORD's first run (every rank) are replayed (`rudder
sim`) under every policy word at that word's live config, so live and replay rows stand side by
side on one stream.
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
from bench_policies import belady_hits, summarize  # noqa: E402

from rudder.config import load_run_config  # noqa: E402
from rudder.run_cli import parse_overrides  # noqa: E402
from rudder.runner import execute_run  # noqa: E402


def overrides_for(word: str) -> dict:
    """A policy word -> the config keys it sets (module docstring); `WORD@KEY=VALUE[@...]` sets
    those keys for that word's runs only (two words that differ by one key, side by side)."""
    word, *extra = word.split("@")
    try:
        own = parse_overrides(extra)
    except ValueError as exc:
        raise SystemExit(f"bad policy word {word!r}: {exc}") from None
    return {**_policy_keys(word), **own}


def _policy_keys(word: str) -> dict:
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
    if base == "script" and arg:
        folder, _, prompt = arg.partition(":")
        return {"prefetch.policy": "agent", "agent.backend": "script", "agent.script": folder,
                **({"agent.prompt": prompt} if prompt else {})}
    if base == "classifier" and arg:  # a trained model in $RUDDER_CLASSIFIERS_DIR (or models/classifiers)
        return {"prefetch.policy": f"classifier:{arg}"}
    if base == "agent" and arg:
        model, _, prompt = arg.partition(":")
        return {"prefetch.policy": "agent", "agent.model.name": model, "agent.backend": "inproc",
                **({"agent.prompt": prompt} if prompt else {})}
    raise SystemExit(f"unknown policy word {word!r} (see --help)")


def base_overrides(args: argparse.Namespace) -> dict:
    """The config keys every run of the benchmark sets (before its policy word's): where runs and
    data go, one validation pass at the end, the link, the epochs and the --set items."""
    try:
        user = parse_overrides(args.set)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    base = {"runs_dir": args.runs_dir, "dataset.root": args.data_root, "train.eval_every": 0}
    if args.bandwidth != "scenario":
        base["cluster.bandwidth"] = None if args.bandwidth == "none" else args.bandwidth
    if args.epochs:
        base["train.epochs"] = args.epochs
    return {**base, **user}


def replay_rows(run_dir: Path, cfgs: dict, ranks: int) -> dict[str, dict]:
    """The traces of one live run replayed under each word's live config (its prefetch section;
    the rule's `rule:` knobs): fetched rows per epoch and trainer, hits / Belady's (all remote)."""
    from rudder.prefetch.policies import policy_extras
    from rudder.sim.oracle import belady
    from rudder.sim.simulate import parse_policy, simulate
    from rudder.trace import Trace

    traces = [Trace.load(run_dir / f"trace-r{r}.npz") for r in range(ranks)]
    epochs = next(iter(cfgs.values())).train.epochs
    best = sum(belady(t, universe="all").total_hits for t in traces)
    out = {}
    for w, cfg in cfgs.items():
        spec = parse_policy(cfg.prefetch.policy, cfg.prefetch)
        extra = policy_extras(cfg) if cfg.prefetch.policy == "rule" else None
        res = [simulate(t, spec, extra=extra).summary() for t in traces]
        out[w] = {"fetched_rows_per_epoch": sum(r["fetched_rows"] for r in res) / epochs / ranks,
                  "hits_of_belady": sum(r["hits"] for r in res) / best if best else 0.0}
    return out


def build_parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a scenario key in every run, e.g. --set dataset.name=synth-ring-bench "
                         "(repeatable; a policy word's own keys win)")
    ap.add_argument("--belady", action="store_true",
                    help="also hits / Belady's over all remote nodes, from each run's traces")
    ap.add_argument("--replay", metavar="WORD",
                    help="replay the traces of WORD's first run under every policy word (live vs replay rows)")
    ap.add_argument("--out", help="write the summary rows as JSON here")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    words = list(dict.fromkeys(args.policies))
    sets = {w: overrides_for(w) for w in words}  # every word checked before any run starts
    base = base_overrides(args)
    if args.replay and args.replay not in words:
        raise SystemExit(f"--replay {args.replay}: not one of --policies")
    cfgs = {w: load_run_config(args.scenario, {**base, **sets[w]}) for w in words}
    results: dict[str, list[dict]] = {w: [] for w in words}
    t0 = time.time()
    for rnd in range(args.repeats):
        for w in words:
            cfg = load_run_config(args.scenario, {**base, **sets[w]})  # a fresh one per run
            res = execute_run(cfg, run_id=run_id(args.scenario, w, rnd))
            if not res.ok:
                raise SystemExit(f"run {res.run_dir} failed: {res.reason}")
            ranks = cfg.cluster.machines * cfg.cluster.trainers_per_machine
            s = summarize(Path(res.run_dir), ranks)
            s["past"] = past_cost(Path(res.run_dir), ranks)
            s["run_dir"] = str(res.run_dir)
            if args.belady:
                bh = belady_hits(Path(res.run_dir), ranks)
                s["hits_of_belady"] = s["hits"] / bh if bh else 0.0
            results[w].append(s)
            print(f"[{time.time() - t0:6.0f} s] round {rnd + 1}/{args.repeats} {w}: epoch {s['epoch_s']:.2f} s, "
                  f"fetched rows/epoch {s['fetched_rows_per_epoch']:,.0f}", flush=True)
    out = {"scenario": args.scenario}
    if args.repeats:
        out.update(live_table(args, words, results))
    if args.replay:
        out["replay"] = replay_table(args, cfgs, out.get("median"))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


def run_id(scenario: str, word: str, rnd: int) -> str:
    word, *extra = word.split("@")
    if word.startswith("script:"):  # a directory: its name stands for it
        folder, _, prompt = word.split(":", 1)[1].partition(":")
        word = "script:" + Path(folder).name + (f":{prompt}" if prompt else "")
    word = "_".join([word, *(e.replace("=", "-") for e in extra)])  # KEY=VALUE -> KEY-VALUE
    return f"live-{Path(scenario).stem}-{word.replace(':', '_').replace('+', '_')}-{rnd}"


def best_fixed(words, rows: dict) -> str | None:
    """The fixed:* word with the fewest rows fetched (the reference of the ratios)."""
    fixed = [w for w in words if w.startswith("fixed:")]
    return min(fixed, key=lambda w: rows[w]["fetched_rows_per_epoch"]) if fixed else None


def replay_table(args, cfgs: dict, live: dict | None) -> dict:
    src = Path(args.runs_dir) / run_id(args.scenario, args.replay, 0)
    cfg = cfgs[args.replay]
    t0 = time.time()
    rep = replay_rows(src, cfgs, cfg.cluster.machines * cfg.cluster.trainers_per_machine)
    ref, lref = best_fixed(cfgs, rep), best_fixed(cfgs, live) if live else None
    print(f"\nreplay of {src}'s traces ({time.time() - t0:.0f} s); rows as a share of each side's best fixed\n")
    print("| policy | live rows / fixed-best | replay rows / fixed-best | replay rows per epoch | live hits / Belady | replay hits / Belady |")
    print("|---|---|---|---|---|---|")
    for w, r in rep.items():
        lr = f"{live[w]['fetched_rows_per_epoch'] / live[lref]['fetched_rows_per_epoch']:.3f}" if lref else "-"
        lh = f"{live[w]['hits_of_belady']:.3f}" if live and "hits_of_belady" in live[w] else "-"
        rr = f"{r['fetched_rows_per_epoch'] / rep[ref]['fetched_rows_per_epoch']:.3f}" if ref else "-"
        print(f"| {w} | {lr} | {rr} | {r['fetched_rows_per_epoch']:,.0f} | {lh} | {r['hits_of_belady']:.3f} |")
    return {"source": str(src), "reference": ref, "rows": rep}


def live_table(args, words, results: dict[str, list[dict]]) -> dict:
    keys = ("epoch_s", "fetched_rows_per_epoch", "hit_rate", "stall_share", "val_acc") + (("hits_of_belady",) if args.belady else ())
    med = {w: {k: statistics.median(r[k] for r in rs) for k in keys} for w, rs in results.items()}
    for w, rs in results.items():
        if any("decisions" in r for r in rs):
            med[w]["decisions"] = [(r.get("decisions", 0), r.get("applied", 0)) for r in rs]
    ref = best_fixed(words, med)
    print(f"\n{args.scenario}, {args.repeats} rounds, link {args.bandwidth}; ratios to {ref or '(no fixed word)'}\n")
    hb = " hits / Belady (all remote) |" if args.belady else ""
    print(f"| policy | epoch s | epoch / fixed-best | fetched rows per epoch | rows / fixed-best | hit rate |{hb} "
          "stall share | val acc | decisions (applied) |")
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if args.belady else ""))
    for w in words:
        m = med[w]
        er = f"{m['epoch_s'] / med[ref]['epoch_s']:.3f}" if ref else "-"
        rr = f"{m['fetched_rows_per_epoch'] / med[ref]['fetched_rows_per_epoch']:.3f}" if ref else "-"
        dec = ", ".join(f"{d} ({a})" for d, a in m.get("decisions", [])) or "-"
        hbv = f" {m['hits_of_belady']:.3f} |" if args.belady else ""
        print(f"| {w} | {m['epoch_s']:.2f} | {er} | {m['fetched_rows_per_epoch']:,.0f} | {rr} | "
              f"{100 * m['hit_rate']:.1f}% |{hbv} {100 * m['stall_share']:.0f}% | {m['val_acc']:.3f} | {dec} |")
    past = [w for w in words if any(r["past"]["past_windows"] for r in results[w])]
    if past:
        print("\nthe past counterfactual live (per round: windows measured, t_past_cf median / max ms, "
              "sum / epochs' time; the loader thread's share: t_past_loader median ms, sum / epochs' time)\n")
        for w in past:
            print(f"- {w}: " + "; ".join(
                f"{p['past_windows']} windows, {p['t_past_cf_ms_median']:.1f} / {p['t_past_cf_ms_max']:.1f} ms, "
                f"{100 * p['past_share']:.2f}%"
                + (f"; loader {p['t_past_loader_ms_median']:.1f} ms, {100 * p['loader_share']:.2f}%"
                   if "loader_share" in p else "")
                for p in (r["past"] for r in results[w]) if p["past_windows"]))
    return {"reference": ref, "median": med, "runs": results}


if __name__ == "__main__":
    main()
