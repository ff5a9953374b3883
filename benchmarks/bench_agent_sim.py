"""The agent against none / static / fixed / lookahead / the classifiers / Belady, by trace replay.

  python benchmarks/bench_agent_sim.py                         # everything (see --steps)
  python benchmarks/bench_agent_sim.py --steps traces collect train      # no LLM
  python benchmarks/bench_agent_sim.py --configs untuned --agent-model smollm2-135m   # smoke

Steps, each reusing what the earlier ones left on disk:
  traces   `rudder tracegen` traces of the three configurations (below), kept in --trace-dir
  collect  classifier trajectories: policy `collect` (random replace/skip at each window close)
           replayed on the TRAINING configuration only, several RNG seeds and two capacities
  train    `rudder classifiers train`'s library call: MLP, XGBoost, linear SVM, logistic
           regression, random forest; the best = highest cross-validated accuracy
  replay   on the benchmark graph and the untuned configuration: none, static, a fixed-period
           grid, a lookahead depth x budget x admission grid (the "best chosen in hindsight"),
           lru, every classifier, the agent (a real LLM in the loop, `agent_sync`: each window's
           answer applies at the next minibatch, as a zero-latency agent's would), Belady

Configurations (fanout 10,25, METIS, partition 0's trainer, capacity 0.25 x halo):
  train    synth-medium (200k nodes), P=2, batch 1000   the classifiers' training data
  bench    synth-bench (1M nodes), P=2, batch 1000      the benchmark graph
  untuned  synth-small (20k nodes), P=2, batch 500      another graph and batch size

Per policy: %-hits, hits / Belady's, rows fetched / none's, rows / Belady's, decisions, replaces,
mean agent latency. Also each classifier's accuracy under shift: offline (`evaluate` on
trajectories collected, for this check only, on the other two configurations) and online (the
share of its own decisions judged right by the training label rule).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.agent.decision import DecisionMaker, warm_prompt  # noqa: E402
from rudder.config import AgentConfig, ModelConfig  # noqa: E402
from rudder.prefetch.policies import LOOKAHEAD_POLICIES  # noqa: E402
from rudder.sim import simulate as sim  # noqa: E402
from rudder.sim.simulate import expand_grid, load_source, parse_policy, rank_source, simulate  # noqa: E402
from rudder.sim.tracegen import TraceGenSpec, generate_trace, write_tracegen  # noqa: E402

log = logging.getLogger("bench_agent_sim")

CONFIGS = {
    "train": dict(graph="synth-medium", parts=2, batch_size=1000, epochs=12, fraction=0.5),
    "bench": dict(graph="synth-bench", parts=2, batch_size=1000, epochs=3, fraction=0.25),
    "untuned": dict(graph="synth-small", parts=2, batch_size=500, epochs=10, fraction=0.25),
}
FRACTION = 0.25  # the replay capacity (x halo)
TRAIN_FRACTIONS = (0.25, 0.5)  # trajectories at two capacities
FIXED_GRID = "fixed:10,25,50,100"
LOOKAHEAD_GRID = "lookahead:1,3,8,16:0.01,0.05,0.1,0.2,0.5,1.0:misses,any"
BASELINES = ["none", "static", *expand_grid(FIXED_GRID), *expand_grid(LOOKAHEAD_GRID), "lru"]

PAUSE_FILE = "/tmp/rudder-quiet"  # while it exists someone is timing a benchmark on this host


def yield_to(pause_file: str | None = PAUSE_FILE) -> None:
    """Waits while `pause_file` exists (called before each CPU-heavy step)."""
    if not pause_file or not os.path.exists(pause_file):
        return
    t0 = time.time()
    log.info("paused: %s exists", pause_file)
    while os.path.exists(pause_file):
        time.sleep(10)
    log.info("resumed after %.0f s", time.time() - t0)


def provenance() -> str:
    """The commit measured, and any library file that differed from it (a shared work tree)."""
    import subprocess

    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout

    dirty = [ln[3:] for ln in git("status", "--porcelain", "rudder").splitlines() if ln.strip()]
    return f"commit {git('rev-parse', '--short', 'HEAD').strip()}" + (f", uncommitted: {', '.join(dirty)}" if dirty else "")


# ---- traces -------------------------------------------------------------------------------
def trace_dir(root: Path, name: str, seed: int = 0) -> Path:
    c = CONFIGS[name]
    return root / f"{c['graph']}-p{c['parts']}-b{c['batch_size']}-e{c['epochs']}-s{seed}"


def load_or_generate(root: Path, name: str, seed: int = 0):
    """(trace, source) of configuration `name`: generated once (rudder tracegen), then read."""
    d = trace_dir(root, name, seed)
    if not (d / "trace-r0.npz").exists():
        spec = TraceGenSpec(seed=seed, **CONFIGS[name])
        t0 = time.time()
        trace, facts = generate_trace(spec)
        write_tracegen(d, trace, spec, facts)
        log.info("%s: traced %d minibatches in %.0f s -> %s", name, trace.num_minibatches,
                 time.time() - t0, d)
    traces, source = load_source(d / "trace-r0.npz")
    return traces[0], rank_source(source, 0)


# ---- the agent: one model for every replay ------------------------------------------------
class SharedDecisionMaker(DecisionMaker):
    """A DecisionMaker that survives AgentPolicy.close(), so one loaded and warmed model serves
    every replay (each replay still builds its own AgentPolicy: history and outcomes start
    empty). Call shutdown() at the end."""

    def close(self) -> None:
        pass

    def shutdown(self) -> None:
        super().close()


def load_agent(model: str, threads: int = 1, timeout_s: float = 60.0, prompt: str = "default") -> dict:
    """make_policy extras for policy `agent`: its AgentConfig and a shared, warmed model."""
    cfg = AgentConfig(model=ModelConfig(name=model), threads=threads, timeout_s=timeout_s, prompt=prompt)
    base = DecisionMaker.from_config(cfg)
    maker = SharedDecisionMaker(base.backend, base.model, base.fallback, base.max_tokens, base.timeout_s)
    t0 = time.time()
    maker.warm(warm_prompt(cfg.prompt))
    log.info("agent %s loaded and warmed in %.0f s", model, time.time() - t0)
    return {"agent": cfg, "decision_maker": maker}


# ---- classifiers --------------------------------------------------------------------------
def best_classifier(models_dir: str | Path) -> str | None:
    """The saved classifier with the highest cross-validated accuracy (<kind>.json metadata)."""
    scored = []
    for f in sorted(Path(models_dir).glob("*.json")):
        m = json.loads(f.read_text())
        if m.get("cv_accuracy") is not None:
            scored.append((m["cv_accuracy"], f.stem))
    return max(scored)[1] if scored else None


def collect(trace, source, out_dir: Path, seeds, fractions) -> list[Path]:
    """Replays policy `collect` (p_replace 0.5) per seed and capacity; returns the trajectory files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for frac in fractions:
        for seed in seeds:
            f = out_dir / f"f{frac:g}-s{seed}" / "trajectories-r0.jsonl"  # `rudder classifiers train --runs` layout
            f.unlink(missing_ok=True)
            simulate(trace, "collect", capacity=int(frac * trace.num_halo), source=source,
                     extra={"seed": seed, "p_replace": 0.5, "path": str(f), "cost": "rows"})
            files.append(f)
    return files


def train(traj_dir: Path, models_dir: Path) -> dict:
    from rudder.agent.classifiers import train_models
    from rudder.agent.trajectories import load_trajectories

    data = load_trajectories([traj_dir])
    res = train_models(data, models_dir, runs=[str(traj_dir)])
    return {k: {"cv_accuracy": m["cv_accuracy"], "majority_baseline": m["majority_baseline"],
                "samples": m["samples"], "positives": m["positives"]} for k, m in res.items()}


# ---- replay -------------------------------------------------------------------------------
def replay(trace, source, policy: str, capacity: int, *, agent: dict | None = None,
           models_dir: str | None = None) -> dict:
    """One replay's summary plus its decision statistics. `agent@16` (also classifier:NAME@16):
    the policy with the loader sampling 16 minibatches ahead instead of the trace config's depth."""
    name, _, depth = policy.partition("@")
    prefetch = sim._source_prefetch(source)
    if depth:
        from rudder.config import PrefetchConfig

        prefetch = (prefetch or PrefetchConfig()).model_copy(update={"lookahead": int(depth)})
    spec = parse_policy(name, prefetch)
    extra, wait = {}, 60.0
    if spec.base == "agent":
        extra = agent or {}
        wait = extra["agent"].timeout_s + 5.0 if extra else 60.0
    elif spec.base == "classifier":
        extra = {"models_dir": models_dir, "cost": "rows"}
    res = simulate(trace, spec, capacity=capacity, source=source, extra=extra, agent_wait_s=wait)
    s = res.summary()
    s["policy"] = policy  # with its @depth
    s["depth"] = spec.prefetch.lookahead if spec.base in LOOKAHEAD_POLICIES else None
    decs = res.decisions
    lat = [d["latency_s"] for d in decs if d.get("latency_s") is not None]
    judged = [d["correct"] for d in decs if d.get("correct") is not None]
    s.update({
        "replaces": sum(bool(d.get("replace")) for d in decs),
        "fallbacks": sum(bool(d.get("fallback")) for d in decs),
        "latency_mean_s": statistics.mean(lat) if lat else None,
        "correct_share": sum(judged) / len(judged) if judged else None,
        "decision_log": [{k: d.get(k) for k in ("window", "applied_step", "replace", "budget", "fallback",
                                                 "latency_s", "correct", "reason")} for d in decs],
    })
    return s


def fmt_row(s: dict, none: dict, opt: dict, label: str | None = None) -> str:
    lat = "" if s.get("latency_mean_s") is None or not s["policy"].startswith("agent") else f"{s['latency_mean_s']:.1f}"
    dec = f"{s['decisions']} ({s['replaces']} replace{', %d fallback' % s['fallbacks'] if s['fallbacks'] else ''})" \
        if s["decisions"] else ""
    return (f"| {label or s['policy']} | {100 * s['hit_rate']:.1f} | {s['hits'] / max(opt['hits'], 1):.2f} | "
            f"{s['fetched_rows'] / max(none['fetched_rows'], 1):.3f} | "
            f"{s['fetched_rows'] / max(opt['fetched_rows'], 1):.2f} | {dec} | {lat} |")


HEADER = ["| policy | hit % | hits / Belady | rows / none | rows / Belady | decisions | agent s/decision |",
          "|---|---|---|---|---|---|---|"]


def table(rows: list[dict], best_clf: str | None) -> list[str]:
    by = {s["policy"]: s for s in rows}
    none, opt = by["none"], by["belady"]
    grid = [s for s in rows if s["policy"].startswith(("fixed", "lookahead"))]
    best_rows = min(grid, key=lambda s: s["fetched_rows"], default=None)
    best_hits = max(grid, key=lambda s: s["hits"], default=None)
    out = list(HEADER)
    for s in rows:
        if s["policy"].startswith(("fixed:", "lookahead:")) and s not in (best_rows, best_hits) \
                and s["policy"] not in ("fixed:25", "lookahead:8:0.1:misses"):  # the defaults
            continue  # the grid is summarised below
        label = s["policy"]
        if s is best_rows:
            label += " (best rows in hindsight)"
        if s is best_hits and s is not best_rows:
            label += " (best hits in hindsight)"
        if best_clf and s["policy"] == f"classifier:{best_clf}":
            label += " (best by CV)"
        out.append(fmt_row(s, none, opt, label))
    out.append("")
    out.append("Fixed/lookahead grid, hits / Belady and rows / Belady: " + "; ".join(
        f"{s['policy']} {s['hits'] / max(opt['hits'], 1):.2f}/{s['fetched_rows'] / max(opt['fetched_rows'], 1):.2f}"
        for s in grid))
    return out


def depth_of(s: dict) -> int | None:
    """Minibatches sampled ahead in a replay: recorded, or read from a lookahead:DEPTH name."""
    if s.get("depth") is not None:
        return s["depth"]
    parts = s["policy"].split(":")
    return int(parts[1]) if parts[0] == "lookahead" and len(parts) > 1 else None


def verdict(rows: list[dict]) -> dict:
    """Per agent replay (agent, agent@D): hits / Belady's, and rows against the best fixed or
    lookahead setting in hindsight, both among settings sampling as deep as the agent's loader
    (the depth is the run's, not the agent's choice) and over the whole grid."""
    by = {s["policy"]: s for s in rows}
    opt = by["belady"]
    grid = [s for s in rows if s["policy"].startswith(("fixed", "lookahead"))
            and s.get("trace") == opt.get("trace")]  # rows of another trace do not compare
    if not grid:
        return {}
    best_all = min(grid, key=lambda s: s["fetched_rows"])
    out = {}
    for a in (s for s in rows if s["policy"].split("@")[0] == "agent" and s.get("trace") == opt.get("trace")):
        same = [s for s in grid if s["policy"].startswith("fixed") or depth_of(s) == a.get("depth")]
        best_same = min(same or grid, key=lambda s: s["fetched_rows"])
        out[a["policy"]] = {
            "depth": a.get("depth"),
            "hits_of_belady": round(a["hits"] / max(opt["hits"], 1), 3),
            "target_90pct_belady": a["hits"] >= 0.9 * opt["hits"],
            "best_same_depth_by_rows": best_same["policy"],
            "rows_over_best_same_depth": round(a["fetched_rows"] / max(best_same["fetched_rows"], 1), 4),
            "rows_minus_best_same_depth": a["fetched_rows"] - best_same["fetched_rows"],
            "best_grid_by_rows": best_all["policy"],
            "rows_over_best_grid": round(a["fetched_rows"] / max(best_all["fetched_rows"], 1), 4),
        }
    return out


# ---- main ---------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", nargs="+", default=["traces", "collect", "train", "replay"],
                    choices=["traces", "collect", "train", "replay"])
    ap.add_argument("--configs", nargs="+", default=["bench", "untuned"], choices=["bench", "untuned"],
                    help="where to replay")
    ap.add_argument("--trace-dir", type=Path, default=Path("data/traces"))
    ap.add_argument("--work-dir", type=Path, default=Path("runs/bench-agent-sim"),
                    help="trajectories and classifier models go here")
    ap.add_argument("--seeds", type=int, default=10, help="collect RNG seeds on the training trace")
    ap.add_argument("--agent-model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--agent-threads", type=int, default=1)
    ap.add_argument("--agent-prompt", default="default", help="prompt variant (rudder.agent.context.VARIANTS)")
    ap.add_argument("--policies", nargs="+", default=None,
                    help="replay only these (default: the baselines, classifiers, agent, belady)")
    ap.add_argument("--trace-seed", type=int, default=0,
                    help="sampling seed of the bench/untuned traces (another sample of the same config)")
    ap.add_argument("--max-minibatches", type=int, default=None, help="replay a trace's head only (smoke)")
    ap.add_argument("--out", default="benchmarks/results/agent_sim.md")
    ap.add_argument("--pause-file", default=PAUSE_FILE, help="wait while this file exists ('' = never)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(1)
    traj_dir, models_dir = args.work_dir / "trajectories", args.work_dir / "classifiers"
    json_out = Path(args.out).with_suffix(".json")
    report: dict = json.loads(json_out.read_text()) if json_out.exists() else {"configs": {}}
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report["code"] = provenance()

    yield_to(args.pause_file)
    if "traces" in args.steps:
        load_or_generate(args.trace_dir, "train")
        for name in args.configs:
            load_or_generate(args.trace_dir, name, args.trace_seed)
    if "collect" in args.steps:
        yield_to(args.pause_file)
        trace, source = load_or_generate(args.trace_dir, "train")
        files = collect(trace, source, traj_dir, range(args.seeds), TRAIN_FRACTIONS)
        log.info("collected %d trajectory files in %s", len(files), traj_dir)
        for name in args.configs:  # for the offline accuracy-under-shift check only
            t, s = load_or_generate(args.trace_dir, name)
            collect(t, s, args.work_dir / f"shift-{name}", range(5), (FRACTION,))
    if "train" in args.steps:
        report["classifiers"] = train(traj_dir, models_dir)
        from rudder.agent.classifiers import MODEL_KINDS, SavedClassifier, evaluate
        from rudder.agent.trajectories import load_trajectories

        for name in args.configs:
            shifted = load_trajectories([args.work_dir / f"shift-{name}"])
            for kind in MODEL_KINDS:
                acc = evaluate(SavedClassifier.load(kind, models_dir), shifted)
                report["classifiers"][kind][f"offline_{name}"] = acc["accuracy"]
                report["classifiers"][kind][f"majority_{name}"] = acc["majority_baseline"]
        report["best_classifier"] = best_classifier(models_dir)
        print(json.dumps(report["classifiers"], indent=2))

    if "replay" in args.steps:
        from rudder.agent.classifiers import MODEL_KINDS

        best = best_classifier(models_dir) or report.get("best_classifier")  # models may be gone
        report["best_classifier"] = best
        policies = args.policies or [*BASELINES, *(f"classifier:{k}" for k in MODEL_KINDS), "agent", "belady"]
        yield_to(args.pause_file)
        agent = load_agent(args.agent_model, args.agent_threads, prompt=args.agent_prompt) \
            if any(p.split("@")[0] == "agent" for p in policies) else None
        try:
            for name in args.configs:
                trace, source = load_or_generate(args.trace_dir, name, args.trace_seed)
                if args.max_minibatches:
                    trace = trace.head(args.max_minibatches)
                digest = trace.digest()
                stored = report["configs"].get(name, {}).get("trace")
                if args.policies and stored and stored != digest:
                    raise SystemExit(f"{name}: the stored rows were replayed on trace {stored}, "
                                     f"{trace_dir(args.trace_dir, name, args.trace_seed)} is {digest}; replay every "
                                     "policy (omit --policies) or use the traces they were replayed on")
                C = int(FRACTION * trace.num_halo)
                rows = []
                for pol in policies:
                    yield_to(args.pause_file)
                    t0 = time.time()
                    s = replay(trace, source, pol, C, agent=agent, models_dir=str(models_dir))
                    rows.append(s)
                    log.info("%s %s: hit %.1f%%, fetched %d, decisions %d (%.0f s)", name, pol,
                             100 * s["hit_rate"], s["fetched_rows"], s["decisions"], time.time() - t0)
                for s in rows:
                    s["code"] = report["code"]  # what each row was measured at
                    s["trace"] = digest  # and on which trace: rows compare only on the same one
                if args.policies and name in report["configs"]:  # a subset: replace those rows only
                    new = {s["policy"]: s for s in rows}
                    old = report["configs"][name]["rows"]
                    rows = [new.pop(s["policy"], s) for s in old] + list(new.values())
                names = {s["policy"] for s in rows}
                report["configs"][name] = {"config": {**CONFIGS[name], "seed": args.trace_seed}, "trace": digest,
                                           "capacity": C, "halo": trace.num_halo,
                                           "minibatches": trace.num_minibatches,
                                           "accesses": trace.num_accesses, "rows": rows, "code": report["code"],
                                           "verdict": verdict(rows) if {"belady", "none"} <= names else {}}
                write_report(report, args)
        finally:
            if agent:
                agent["decision_maker"].shutdown()
    write_report(report, args)
    return 0


def write_report(report: dict, args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    lines = [f"Agent vs baselines by trace replay ({report['date']}; agent {args.agent_model}, "
             f"{args.agent_threads} llama.cpp thread, {args.agent_prompt} prompt; capacity {FRACTION} x halo, "
             "initial fill top-degree; rows fetched = misses + replacement rows, initial fill apart; "
             f"{report.get('code')}; load average at the end {os.getloadavg()[0]:.1f})", ""]
    if report.get("classifiers"):
        lines += ["Classifiers trained on `train` (" + ", ".join(f"{k}={v}" for k, v in CONFIGS["train"].items())
                  + f"), best by CV: **{report.get('best_classifier')}**", "",
                  "| classifier | samples | CV accuracy | majority | " +
                  " | ".join(f"offline acc. on {n} (majority)" for n in args.configs) + " |",
                  "|---|---|---|---|" + "---|" * len(args.configs)]
        for k, m in report["classifiers"].items():
            lines.append(f"| {k} | {m['samples']} | {m['cv_accuracy']:.3f} | {m['majority_baseline']:.3f} | " +
                         " | ".join(f"{m.get(f'offline_{n}', float('nan')):.3f} ({m.get(f'majority_{n}', float('nan')):.3f})"
                                    for n in args.configs) + " |")
        lines.append("")
    for name, r in report.get("configs", {}).items():
        c = r["config"]
        lines += [f"### {name}: {c['graph']}, P={c['parts']}, batch {c['batch_size']}, {c['epochs']} epochs "
                  f"({r['minibatches']} minibatches, {r['accesses']} remote accesses, halo {r['halo']}, "
                  f"capacity {r['capacity']}; trace {r.get('trace')})", ""]
        if "belady" in {s["policy"] for s in r["rows"]} and "none" in {s["policy"] for s in r["rows"]}:
            lines += table(r["rows"], report.get("best_classifier"))
        else:
            lines += [json.dumps(s) for s in r["rows"]]
        onl = [s for s in r["rows"] if s["policy"].startswith("classifier:") and s.get("correct_share") is not None]
        if onl:
            lines += ["", "Classifiers online (share of their decisions right by the label rule): " +
                      ", ".join(f"{s['policy'].split(':')[1]} {s['correct_share']:.2f}" for s in onl)]
        for ag in (s for s in r["rows"] if s["policy"].split("@")[0] == "agent"):
            lines += [f"{ag['policy']}: Pass@1 {ag.get('pass_at_1')}, {ag['fallbacks']} fallbacks of {ag['decisions']} decisions"]
        if r.get("verdict"):
            lines += ["Verdict: " + json.dumps(r["verdict"])]
        codes: dict = {}
        for s in r["rows"]:
            codes.setdefault(s.get("code"), []).append(s["policy"])
        if len(codes) > 1:  # rows replayed again later (e.g. the agent after a prompt change)
            lines += ["Measured at: " + "; ".join(f"{c}: {', '.join(p)}" for c, p in codes.items()
                                                  if len(p) < len(r["rows"]) / 2) + "; the rest at "
                      + next(c for c, p in codes.items() if len(p) >= len(r["rows"]) / 2)]
        lines.append("")
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
