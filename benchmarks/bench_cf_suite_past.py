"""Issue 18, must-have 5: the decision suite rebuilt from the mixed-label scenarios, with the
signals today's prompts read (judge-history-2b, judge-history-3: the past counterfactual),
held out by graph (and so by scenario: each mixed scenario is on its own graph).

  python benchmarks/bench_cf_suite_past.py build [--scenarios history_cold_small history_cold]
         [--coins small_stale medium_stale large_half] [--seeds 0 1] [--p 0.5] [--horizon 2]
         [--trace-dir data/traces/baselines] [--out benchmarks/results/cf_suite_past]
      Per scenario, its trace (bench_baselines makes it: data/traces/baselines/S/trace-r0.npz)
      replayed under a seeded coin decider (p, one round label per coin: budget x evict) by
      bench_past_cf.play -- the replay that computes each window's past counterfactual as the
      live trainer does (rudder.prefetch.past via BufferReplayer, Policy.past_rounds) -- with the
      counterfactual judge's forks at every window close (every option, --horizon windows).
      Each window labelled as bench_past_cf.label_of labels it: replace when the best option
      saves > 0.5% of the horizon's remote rows, keep when none saves anything, too close left
      out. Windows repeated across coins (before the coins differ) kept once. Balanced per
      scenario (the majority downsampled, seed 0). Written, one labelled window a line
      (`rudder agent eval --windows FILE` reads them): suite-all.jsonl (every labelled window),
      suite.jsonl (balanced), and per graph G: heldout-G.jsonl (G's balanced windows: the test
      set when G is held out) -- the split by graph is tune = the other graphs, test = G.
  python benchmarks/bench_cf_suite_past.py score --windows F --models M.. --prompts P.. --json OUT
      the no-model baselines (follow the past counterfactual at margin 0.5%; the nearest
      example's answer -- the answer of the pool window judge-history-3 shows last, i.e. a
      1-nearest-neighbour lookup in the held-out pool; the majority answer of the other graphs'
      windows; keep; replace) and every model x prompt in-process (1 thread): accuracy,
      fallbacks, latency p50/p95, counterfactual Pass@1 (the answer's own round -- budget x
      evict, a keep's too -- against the window's judged shares, rudder.agent.judge.counterfactual;
      too close and fallbacks not counted), and how often the answer is the prompt's last
      example's (small models copy it). OUT rewritten after every window. --canned-order 1,0,3,2:
      judge-history-2b's canned examples (PAST_CANNED) in that order, a subset allowed ("none": no
      example), this process only (an experiment on what the examples do; the prompt's hash
      changes with them).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
MIXED = ["history_cold_small", "history_cold"]  # the scenarios whose labels mix (BENCHMARKS 7c, 7f)
COINS = ["small_stale", "medium_stale", "large_half"]
TIMING = ("t_past_cf", "t_past_loader")  # the measurement's own seconds: not a signal, not deterministic


def _signals(w: dict) -> dict:
    return {k: v for k, v in w.items() if k not in TIMING}


def trace_context(trace, pc, graph: dict | None) -> dict:
    """The RunContext a trainer on this trace sees (rudder.sim.simulate.run_context), as a dict."""
    from dataclasses import asdict

    from rudder.sim.simulate import run_context

    d = asdict(run_context(trace, pc, trace.capacity, 0, {"graph": graph or {}}))
    d.pop("run_dir", None)
    d.pop("extra", None)
    return d


def suite_windows(trace, pc, ctx: dict, scenario: str, graph: str, coins=COINS, seeds=(0, 1),
                  p: float = 0.5, horizon: int = 2) -> list[dict]:
    """Labelled windows of `trace` replayed under coin deciders (bench_past_cf.play, coin,
    label_of), too close ones left out, repeats kept once; each window carries its past
    counterfactual (the replay's window record), the 3 windows before it, and the judge's shares."""
    from bench_past_cf import coin, judged_windows

    digest = trace.digest()[:12]
    out, seen = [], set()
    for label in coins:
        for seed in seeds:
            _, wins, _, judged = judged_windows(trace, pc, coin(seed, p, label), horizon)
            for i, w, j, best, lab in judged:
                if lab == "close":
                    continue
                w, recent = _signals(w), [_signals(x) for x in wins[max(0, i - 3):i]]
                key = json.dumps([w, recent], sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                out.append({"context": ctx, "window": w, "recent": recent, "history": [],
                            "label_replace": lab == "replace", "label_by": "counterfactual",
                            "judged": {k: v for k, v in j.items() if k != "first"}, "best": best,
                            "scenario": scenario, "graph": graph, "trace_digest": digest,
                            "kind": "counterfactual-past", "coin": f"{label}:{seed}",
                            "source": f"{scenario}:{digest}:{label}:{seed}:w{w['window']}"})
    return out


def build(scenarios, trace_dir: Path, coins, seeds, p: float, horizon: int) -> list[dict]:
    from rudder.config import load_run_config
    from rudder.sim.tracegen import is_current
    from rudder.trace import Trace

    recs = []
    for name in scenarios:
        pc = load_run_config(ROOT / "configs" / "scenarios" / f"{name}.yaml").prefetch
        tdir = trace_dir / name
        trace = Trace.load(tdir / "trace-r0.npz")
        if not is_current(tdir):  # made before tracegen was seeded: a rebuild elsewhere differs
            print(f"# warning: {tdir} was not written by this tracegen (no reproducible digest); "
                  f"`bench_baselines.py` makes it again", flush=True)
        meta = json.loads((tdir / "trace.json").read_text()) if (tdir / "trace.json").exists() else {}
        graph = (meta.get("graph") or {}).get("dataset") or (meta.get("spec") or {}).get("graph") or name
        t0 = time.time()
        rs = suite_windows(trace, pc, trace_context(trace, pc, meta.get("graph")), name, graph, coins, seeds, p, horizon)
        print(f"# {name} ({graph}, trace {trace.digest()[:12]}): {len(rs)} labelled windows "
              f"({time.time() - t0:.0f} s)", flush=True)
        recs += rs
    return recs


def pool_overlap(recs: list[dict]) -> list[str]:
    """Sources of windows whose trace is the judge-history-3 example pool's (must be none)."""
    from rudder.agent.history_examples import POOL_DIGEST

    return [r["source"] for r in recs if r["trace_digest"] == POOL_DIGEST[:12]]


# ---- scoring --------------------------------------------------------------------------------
def cf_right(rec: dict, replace: bool | None, budget: str | None, evict: str | None, fallback=None) -> bool | None:
    """correct_cf of an answer on a suite window: its own round's judged share."""
    from rudder.agent.judge import counterfactual

    share = rec["judged"].get(f"{budget or 'small'}_{evict or 'stale'}")
    return counterfactual(replace, fallback, share)


def follow_past(rec: dict) -> tuple[bool, str, str]:
    """The follow-the-past-counterfactual rule (bench_past_cf.follow_rule, margin 0.5%)."""
    from bench_past_cf import MARGIN, follow_rule

    lab = follow_rule(MARGIN)(rec["window"])
    b, e = (lab or "small_stale").split("_")
    return lab is not None, b, e


def nearest_example(rec: dict) -> tuple[bool, str, str]:
    """The answer of the pool window judge-history-3 shows last for this window (its nearest,
    ExamplePool.nearest): a 1-nearest-neighbour lookup, the decider a model that copies its last
    example is."""
    from rudder.agent.context import ContextBuilder

    last = ContextBuilder(rec["context"], "judge-history-3").retrieved_examples(rec["window"], rec["recent"])[-1]
    a = last["answer"]
    return a["replace"], a["budget"], a["evict"]


def last_example_replace(prompt) -> bool | None:
    """The `replace` of the last example answer in a prompt's messages (None without examples)."""
    from rudder.agent.last_example import last_answer

    text = last_answer(prompt.messages)
    return None if text is None else json.loads(text)["replace"]


def summarise(name: str, variant: str, rows: list[dict]) -> dict:
    from rudder.agent.eval import percentile

    n = len(rows)
    lat = [r["latency_s"] for r in rows if r.get("latency_s") is not None]
    cf = [r["cf"] for r in rows if r["cf"] is not None]
    last = [r["replace"] == r["last"] for r in rows if r.get("last") is not None and r.get("fallback") is None]
    return {"decider": name, "variant": variant, "n": n, "accuracy": sum(r["ok"] for r in rows) / n if n else None,
            "fallbacks": sum(r.get("fallback") is not None for r in rows),
            "replace_share": sum(bool(r["replace"]) for r in rows) / n if n else None,
            "pass_at_1_cf": f"{sum(cf)}/{len(cf)}", "pass_at_1_cf_share": sum(cf) / len(cf) if cf else None,
            "latency_p50_s": percentile(lat, 0.5), "latency_p95_s": percentile(lat, 0.95),
            "as_last_example": f"{sum(last)}/{len(last)}" if last else None}


def balanced_sample(windows: list[dict], n: int, seed: int = 0) -> list[dict]:
    """n/2 replace and n/2 keep windows drawn with a seeded rng, in file order."""
    import random

    rng = random.Random(seed)
    pick = set()
    for lab in (True, False):
        idx = [i for i, r in enumerate(windows) if bool(r["label_replace"]) == lab]
        pick.update(rng.sample(idx, min(len(idx), n // 2)))
    return [r for i, r in enumerate(windows) if i in pick]


def score_baselines(windows: list[dict], tune: list[dict] | None = None) -> list[dict]:
    from rudder.agent.judge import agrees

    out = []
    maj = None
    if tune:
        rep = sum(bool(r["label_replace"]) for r in tune)
        maj = 2 * rep > len(tune)
    fixed = [("follow the past counterfactual", follow_past),
             ("the nearest example's answer (judge-history-3's last example)", nearest_example),
             ("keep", lambda r: (False, "small", "stale")),
             ("replace medium/stale", lambda r: (True, "medium", "stale"))]
    if maj is not None:
        fixed.append((f"majority of the tune windows ({'replace' if maj else 'keep'}, medium/stale)",
                      lambda r: (maj, "medium", "stale")))
    for name, f in fixed:
        rows = []
        for r in windows:
            rep, b, e = f(r)
            rows.append({"ok": bool(agrees(rep, r["label_replace"])), "replace": rep, "cf": cf_right(r, rep, b, e),
                         "latency_s": None, "fallback": None})
        out.append(summarise(name, "-", rows))
    return out


def score_model(windows: list[dict], model: str, variants, json_out: Path | None, done: dict) -> None:
    from rudder.agent.context import ContextBuilder
    from rudder.agent.decision import DecisionMaker, warm_prompt
    from rudder.agent.eval import make_backend
    from rudder.agent.judge import agrees

    backend = make_backend(model, threads=1)
    maker = DecisionMaker(backend, model, "static", max_tokens=160, timeout_s=600.0)
    try:
        for v in variants:
            maker.warm(warm_prompt(v))
            rows = done.setdefault(f"{model} {v}", {"rows": []})["rows"]
            for rec in windows:
                builder = ContextBuilder(rec["context"], v, 4)
                prompt = builder.build(rec["window"], rec.get("history") or [], rec.get("recent") or [])
                d = maker.decide(prompt)
                try:
                    ans = json.loads(d.raw or "{}")
                except ValueError:
                    ans = {}
                rows.append({"source": rec["source"], "label": rec["label_replace"], "replace": d.replace,
                             "fallback": d.fallback, "ok": bool(agrees(d.replace, rec["label_replace"], d.fallback)),
                             "cf": None if d.fallback else cf_right(rec, d.replace, ans.get("budget"), ans.get("evict")),
                             "latency_s": d.latency_s, "raw": d.raw, "load": _load(),
                             "last": last_example_replace(prompt)})
                done[f"{model} {v}"]["summary"] = summarise(model, v, rows)
                if json_out:
                    json_out.write_text(json.dumps(done, indent=1, default=str))
                print(f"{model} {v} {rec['source']}: label {'R' if rec['label_replace'] else 'k'} "
                      f"answer {'R' if d.replace else 'k'}{' fallback' if d.fallback else ''} "
                      f"{d.latency_s or 0:.1f} s load {_load():.1f}", flush=True)
    finally:
        maker.close()


def reorder_canned(order: list[int]) -> None:
    """PAST_CANNED (judge-history-2b's examples) in `order` (a subset allowed), in place, for this process."""
    from rudder.agent import context

    if len(set(order)) != len(order) or not set(order) <= set(range(len(context.PAST_CANNED))):
        raise SystemExit(f"--canned-order {order}: not distinct indices of 0..{len(context.PAST_CANNED) - 1}")
    before = list(context.PAST_CANNED)
    context.PAST_CANNED[:] = [before[i] for i in order]


def _load() -> float:
    import os

    return os.getloadavg()[0]


def table(rows: list[dict]) -> str:
    lines = ["| decider | prompt | n | accuracy | fallbacks | replace share | Pass@1 cf | latency p50 s "
             "| answer = the last example's |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "" if r["accuracy"] is None else f"{r['accuracy']:.2f}"
        cf = r["pass_at_1_cf"] + ("" if r["pass_at_1_cf_share"] is None else f" = {r['pass_at_1_cf_share']:.2f}")
        lat = "" if r["latency_p50_s"] is None else f"{r['latency_p50_s']:.1f}"
        lines.append(f"| {r['decider']} | {r['variant']} | {r['n']} | {acc} | {r['fallbacks']} | "
                     f"{r['replace_share']:.2f} | {cf} | {lat} | {r.get('as_last_example') or ''} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["build", "score"])
    p.add_argument("--scenarios", nargs="+", default=MIXED)
    p.add_argument("--coins", nargs="+", default=COINS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--p", type=float, default=0.5)
    p.add_argument("--horizon", type=int, default=2)
    p.add_argument("--trace-dir", type=Path, default=ROOT / "data" / "traces" / "baselines")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cf_suite_past")
    p.add_argument("--windows", type=Path, help="score: the held-out file")
    p.add_argument("--tune", type=Path, help="score: the tune file (for the majority baseline)")
    p.add_argument("--models", nargs="*", default=[])
    p.add_argument("--prompts", nargs="+", default=["judge-history-2b", "judge-history-3"])
    p.add_argument("--limit", type=int)
    p.add_argument("--sample", type=int, help="score: a balanced seeded subsample of this many windows")
    p.add_argument("--json", type=Path)
    p.add_argument("--canned-order", help="score: PAST_CANNED's examples in this order, e.g. 1,0,3,2, or 'none' "
                   "(experiment)")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from rudder.agent.eval import balanced, label_balance, load_windows, write_jsonl

    t0 = time.time()
    if a.what == "build":
        recs = build(a.scenarios, a.trace_dir, a.coins, a.seeds, a.p, a.horizon)
        bad = pool_overlap(recs)
        if bad:
            raise SystemExit(f"windows from the judge-history-3 pool's trace: {bad[:3]}")
        bal = balanced(recs, key="scenario", seed=0)
        a.out.mkdir(parents=True, exist_ok=True)
        write_jsonl(recs, a.out / "suite-all.jsonl")
        write_jsonl(bal, a.out / "suite.jsonl")
        for g in sorted({r["graph"] for r in bal}):
            write_jsonl([r for r in bal if r["graph"] == g], a.out / f"heldout-{g}.jsonl")
        before, after = label_balance(recs), label_balance(bal)
        print("| scenario | graph | labelled windows | replace right | keep right | replace share | balanced |")
        print("|---|---|---|---|---|---|---|")
        graphs = {r["scenario"]: r["graph"] for r in recs}
        for k, b in before.items():
            print(f"| {k} | {graphs.get(k, '')} | {b['n']} | {b['replace']} | {b['keep']} | "
                  f"{b['replace_share']:.2f} | {after.get(k, {}).get('n', 0)} |")
        print(f"-> {a.out} ({time.time() - t0:.0f} s)")
        return
    if a.canned_order:
        reorder_canned([] if a.canned_order == "none" else [int(x) for x in a.canned_order.split(",")])
    windows = load_windows(a.windows)[:a.limit]
    if a.sample:
        windows = balanced_sample(windows, a.sample)
    tune = load_windows(a.tune) if a.tune else None
    done: dict = {"windows": str(a.windows), "n": len(windows), "canned_order": a.canned_order}
    base = score_baselines(windows, tune)
    done["baselines"] = base
    if a.json:
        a.json.write_text(json.dumps(done, indent=1, default=str))
    for m in a.models:
        score_model(windows, m, a.prompts, a.json, done)
    rows = base + [v["summary"] for k, v in done.items() if isinstance(v, dict) and "summary" in v]
    print(table(rows))
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
