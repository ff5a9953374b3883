"""Issue 18 (h18d): the past counterfactual -- at each window close, what a round at the window
before's close would have done to the window that just ran, replayed from the buffer as it was
(rudder.sim.replay.BufferReplayer, Policy.past_rounds) -- and what it is worth.

  python benchmarks/bench_past_cf.py rule [--scenario history_cold] [--margin 0.005]
      the "follow the past counterfactual" rule: at each window close, replace with the round
      (budget x evict) that would have saved the most of the window just closed, when it saved
      more than --margin of its remote rows; else keep. Rows fetched over the whole trace.
  python benchmarks/bench_past_cf.py pool --trace T/trace-r0.npz --seeds 0 1 2 [--json OUT]
      a labelled pool of windows from a held-out trace: a coin decider (p 0.5, medium/stale)
      played on it; at every window close the window record (with its past counterfactual) and
      the counterfactual judge's shares of every option over the next --horizon windows (the
      forks of bench_cf_oracle), labelled as bench_cf_suite labels (replace when the best option
      saves > 0.5% of the horizon's remote rows, keep when none saves anything, else too close).
  python benchmarks/bench_past_cf.py ship --pool benchmarks/results/history_pool_h18d.json
      the pool as judge-history-3 retrieves its examples from it (h18e): rudder/agent/history_pool.jsonl,
      one labelled window a line (the window record without its time and lookahead fields, the
      three windows before it as hit rate and rows, the judge's shares, best option and label).
  python benchmarks/bench_past_cf.py llm --scenario S --best FIXED --agents M.. --prompts P.. --json OUT
      the LLM deciders alone, as bench_baselines.py --agents replays them (in-process, answers
      applied at the next minibatch, the whole trace), beside the named fixed-best setting only;
      OUT (bench_baselines.py's --json layout) is rewritten after every model x prompt.
  python benchmarks/bench_past_cf.py judge --runs OUT.json [--scenario S]
      the counterfactual Pass@1 of the LLM answers a bench_baselines.py --json run recorded: the
      trace replayed with each agent's answers applied as recorded (at the minibatch after their
      window), the judge's forks at every window close (--horizon windows, every option); each
      answer is right (correct_cf, rudder.agent.judge.counterfactual) when its own action beats
      the other -- a replace's own budget/evict round against no round -- by the judge's margin.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 0.005  # the judge's REPLACE_MARGIN


def past_shares(window: dict) -> dict[str, float] | None:
    """{label: share of the window's remote rows a round at its start would have saved}
    (positive: saved) from a window's past counterfactual fields; None where it has none."""
    keep = window.get("past_keep_fetched")
    if keep is None:
        return None
    remote = max(1, int(window.get("remote_rows") or 0))
    return {k[len("past_fetched_"):]: (keep - v) / remote for k, v in window.items() if k.startswith("past_fetched_")}


def one_round(round, first: int):
    """A policy that plans `round` (None: keep) at minibatch `first` and nothing else: one branch
    of the judge's counterfactual."""
    from rudder.prefetch.policy import Policy

    class OneRound(Policy):
        def plan(self, step):
            return round if step.global_step == first else None

    return OneRound()


def _policy_base():
    from rudder.prefetch.policy import Policy

    class PastPolicy(Policy):
        """Plays `choose(window) -> label | None` at each window close (applied at the next
        minibatch), with the past counterfactual measured on every window."""

        def __init__(self, pc, capacity: int, choose):
            from rudder.agent.steering import past_rounds

            self.rounds = past_rounds(capacity, pc)
            self.choose, self.next, self.windows, self.answers = choose, None, [], []

        def past_rounds(self):
            return self.rounds

        def observe(self, metrics, window=None):
            if window is None:
                return
            self.windows.append(dict(window))
            label = self.choose(window)
            self.answers.append(label)
            self.next = (int(window["last_step"]) + 1, self.rounds[label]) if label else None

        def plan(self, step):
            if self.next and step.global_step == self.next[0]:
                return self.next[1]
            return None

    return PastPolicy


def play(trace, pc, choose, horizon: int = 0, judge_opts=None):
    """Replays `trace` under PastPolicy(choose); with horizon > 0 also the judge's shares of
    every option at every window close (forks). Returns (fetched rows, windows, answers, judged)."""
    from rudder.sim.replay import BufferReplayer, PositionTrace, replay

    PastPolicy = _policy_base()
    pt, C, W = PositionTrace(trace), trace.capacity, pc.window
    pol = PastPolicy(pc, C, choose)
    run = BufferReplayer(pt, pol, C, alpha=pc.alpha, period=pc.period, depth=0, window=W)
    run.fill(trace.init_positions()[:C])
    S = len(pt)
    judged = []
    counts = None
    if horizon:
        for first in range(W, S + 1, W):
            counts = replay(pt, run, counts, stop=first)
            if first + horizon * W > S:
                continue
            span = slice(first, first + horizon * W)
            got = {}
            for label, r in [(None, None), *pol.rounds.items()]:
                f = run.fork(one_round(r, first))
                f.records = False
                n = replay(pt, f, stop=span.stop)
                got[label] = (int(n["fetched_rows"][span].sum()), int(n["remote_rows"][span].sum()))
            keep, remote = got.pop(None)
            judged.append({"first": first, **{k: (keep - v[0]) / max(1, remote) for k, v in got.items()}})
    c = replay(pt, run, counts)
    return int(c["fetched_rows"].sum()), pol.windows, pol.answers, judged


def follow_rule(margin: float):
    def choose(window):
        sh = past_shares(window)
        if not sh:
            return None
        best = max(sh, key=lambda k: (sh[k], -list(sh).index(k)))
        return best if sh[best] > margin else None
    return choose


def coin(seed: int, p: float = 0.5, label: str = "medium_stale"):
    rng = random.Random(seed)
    return lambda window: label if rng.random() < p else None


def label_of(j: dict) -> tuple[str | None, str]:
    """(best option, label) of a judged window: replace / keep / close."""
    opts = {k: v for k, v in j.items() if k != "first"}
    best = max(opts, key=lambda k: opts[k])
    if opts[best] > MARGIN:
        return best, "replace"
    if opts[best] <= 0:
        return None, "keep"
    return best, "close"


def judged_windows(trace, pc, choose, horizon: int):
    """play() with the judge's forks, each window matched to the fork at its close:
    (rows, windows, answers, [(i, window, judged, best, label)]) for every judged window."""
    rows, wins, ans, judged = play(trace, pc, choose, horizon)
    by_first = {j["first"]: j for j in judged}
    out = []
    for i, w in enumerate(wins):
        j = by_first.get(int(w["last_step"]) + 1)
        if j is not None:
            out.append((i, w, j, *label_of(j)))
    return rows, wins, ans, out


WINDOW_DROP = ("t_fetch", "t_stall", "t_minibatch", "lookahead_missing", "lookahead_rows")
RECENT_KEEP = ("hit_rate", "minibatches", "remote_rows", "fetched_rows")


def ship(pool: Path, out: Path) -> None:
    """The pool's windows as judge-history-3 reads them (rudder.agent.history_examples.example_pool)."""
    d = json.loads(pool.read_text())
    lines = [json.dumps({"trace_digest": d["digest"], "seed": e["seed"],
                         "window": {k: v for k, v in e["window"].items() if k not in WINDOW_DROP},
                         "recent": [{k: r[k] for k in RECENT_KEEP} for r in e["recent"]],
                         "judged": e["judged"], "best": e["best"], "label": e["label"]})
             for e in d["pool"]]
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} windows of {d['trace']} (digest {d['digest']}) -> {out}")


def recorded(answers: list[dict]):
    """A decider that gives, at each window close, the recorded answer for that window (None: keep)."""
    by_window = {int(x["window"]): x for x in answers if x.get("window") is not None}

    def choose(window):
        x = by_window.get(int(window["window"]))
        if not x or x.get("fallback") or not x.get("replace"):
            return None
        return f"{x['budget']}_{x.get('evict') or 'stale'}"
    return choose


def pass_at_1(answers: list[dict], judged: list[dict], window: int) -> tuple[int, int, list]:
    """(right, judged, per answer (window, right)) by the counterfactual judge, as judge_run rules:
    an answer's own action against the other at its own budget and evict word (a keep names
    one too), right where the action agrees with the label of what that round saved
    (rudder.agent.judge.counterfactual: > 0.5% replace, <= 0 keep, in between too close: None)."""
    from rudder.agent.judge import counterfactual

    by_first = {j["first"]: j for j in judged}
    marks = []
    for x in answers:
        j = by_first.get((int(x["window"]) + 1) * window)  # applied at the next window's first minibatch
        if j is None or x.get("replace") is None:
            continue
        if x.get("fallback"):  # the fallback's action, not the answer's: not judged (as judge_run)
            marks.append((int(x["window"]), None))
            continue
        share = j[f"{x['budget']}_{x.get('evict') or 'stale'}"]
        marks.append((int(x["window"]), counterfactual(bool(x["replace"]), x.get("fallback"), share)))
    right = sum(m is True for _, m in marks)
    return right, sum(m is not None for _, m in marks), marks


def judge_runs(runs: list[Path], trace_dir: Path, horizon: int) -> dict:
    """Every LLM answer list of bench_baselines.py --json files, replayed on its scenario's trace
    with the judge's forks: rows fetched (as bench_baselines counted them: a check), Pass@1 by
    the counterfactual; the follow-the-past-counterfactual rule (margin 0.5%) beside them."""
    from rudder.config import load_run_config
    from rudder.trace import Trace

    out = {}
    for path in runs:
        for name, res in json.loads(path.read_text())["results"].items():
            pc = load_run_config(ROOT / "configs" / "scenarios" / f"{name}.yaml").prefetch
            pre = res["prefix"]
            trace = Trace.load(trace_dir / name / "trace-r0.npz")
            if pre["minibatches"] < trace.num_minibatches:
                print(f"{path}: {name} replayed a prefix ({pre['minibatches']} minibatches): left out")
                continue
            best = pre["rows"][pre["best"]]["fetched_rows"]
            rows = out.setdefault(name, {"fixed-best": {"name": pre["best"], "rows": best}})
            deciders = {k: recorded(r["answers"]) for k, r in pre["rows"].items() if r.get("answers")}
            if "follow the past counterfactual" not in rows:
                deciders["follow the past counterfactual"] = follow_rule(MARGIN)
            for label, choose in deciders.items():
                t0 = time.time()
                n, wins, ans, judged = play(trace, pc, choose, horizon)
                answers = pre["rows"].get(label, {}).get("answers") or [
                    {"window": w["window"], "replace": a is not None, "budget": (a or "small_stale").split("_")[0],
                     "evict": (a or "small_stale").split("_")[1]} for w, a in zip(wins, ans)]
                right, judged_n, marks = pass_at_1(answers, judged, pc.window)
                rec = pre["rows"].get(label, {}).get("fetched_rows")
                rows[label if label not in rows else f"{label} ({path.name})"] = {"rows": n, "ratio": n / best, "recorded_rows": rec, "right": right,
                               "judged": judged_n, "pass_at_1_cf": right / judged_n if judged_n else None,
                               "marks": marks, "file": str(path)}
                print(f"{name}: {label}: {n:,} rows ({n / best:.3f} of {pre['best']}; recorded {rec}), "
                      f"Pass@1 cf {right}/{judged_n} ({time.time() - t0:.0f} s)", flush=True)
    return out


def run_llm(a, cfg, pc) -> None:
    """--agents x --prompts replayed on the scenario's trace (bench_baselines.run_scenario's agent
    part) beside the --best fixed setting, the JSON rewritten after each."""
    from bench_agent_sim import load_agent
    from bench_baselines import replay

    from rudder.trace import Trace

    pc = pc.model_copy(update={"policy": "lookahead"})  # as bench_baselines.run_scenario
    trace = Trace.load(a.trace_dir / a.scenario / "trace-r0.npz")
    n = trace.num_minibatches
    rows = {a.best: replay(trace, a.best, pc)}
    out = {"results": {a.scenario: {"trace": {"digest": trace.digest()},
                                    "prefix": {"minibatches": n, "rows": rows, "best": a.best}}},
           "args": {k: str(v) for k, v in vars(a).items()}}
    for m in a.agents:
        extra = load_agent(m, timeout_s=a.agent_timeout_s)
        for pr in a.prompts:
            t1 = time.time()
            run = {**extra, "agent": extra["agent"].model_copy(update={"prompt": pr})}
            r = replay(trace, "agent", pc, None, extra=run, src={"config": cfg.model_dump(mode="json")},
                       wait=a.agent_timeout_s + 5.0)
            r["note"] = f"{r.get('note', '')}; {time.time() - t1:.0f} s"
            rows[f"agent {m} {pr}"] = r
            print(f"# {a.scenario}: agent {m} {pr}: {r['fetched_rows']:,} rows "
                  f"({r['fetched_rows'] / rows[a.best]['fetched_rows']:.3f} of {a.best}), {r['note']}", flush=True)
            a.json.write_text(json.dumps(out, indent=1, default=str))
        extra["decision_maker"].shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["rule", "pool", "ship", "judge", "llm"])
    p.add_argument("--scenario", default="history_cold")
    p.add_argument("--trace-dir", type=Path, default=Path("data/traces/baselines"))
    p.add_argument("--trace", type=Path, help="pool: the held-out trace")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--margins", type=float, nargs="+", default=[MARGIN])
    p.add_argument("--horizon", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--pool", type=Path, help="ship: a pool's --json")
    p.add_argument("--out", type=Path, default=ROOT / "rudder" / "agent" / "history_pool.jsonl")
    p.add_argument("--runs", type=Path, nargs="+", help="judge: bench_baselines.py --json files")
    p.add_argument("--best", help="llm: the fixed-best setting to replay beside (e.g. fixed:10)")
    p.add_argument("--agents", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m"])
    p.add_argument("--prompts", nargs="+", default=["judge-history-3"])
    p.add_argument("--agent-timeout-s", type=float, default=300.0)
    a = p.parse_args()
    if a.what == "ship":
        ship(a.pool, a.out)
        return
    if a.what == "judge":
        import torch

        torch.set_num_threads(1)
        t0 = time.time()
        out = judge_runs(a.runs, a.trace_dir, a.horizon)
        print("| scenario | decider | rows | / fixed-best | Pass@1 (counterfactual) |")
        print("|---|---|---|---|---|")
        for name, rows in out.items():
            for label, r in rows.items():
                if label != "fixed-best":
                    print(f"| {name} | {label} | {r['rows']:,} | {r['ratio']:.3f} | "
                          f"{r['right']}/{r['judged']} = {r['pass_at_1_cf'] or 0:.2f} |")
        print(f"({time.time() - t0:.0f} s)")
        if a.json:
            a.json.write_text(json.dumps(out, indent=1, default=str))
        return
    import torch

    torch.set_num_threads(1)
    from rudder.config import load_run_config
    from rudder.trace import Trace

    t0 = time.time()
    cfg = load_run_config(ROOT / "configs" / "scenarios" / f"{a.scenario}.yaml")
    pc = cfg.prefetch
    if a.what == "llm":
        run_llm(a, cfg, pc)
        print(f"({time.time() - t0:.0f} s)")
        return
    if a.what == "rule":
        trace = Trace.load(a.trace_dir / a.scenario / "trace-r0.npz")
        out = {}
        for m in a.margins:
            rows, wins, ans, _ = play(trace, pc, follow_rule(m))
            out[m] = {"fetched_rows": rows, "answers": ans}
            seq = " ".join(x or "k" for x in ans)
            print(f"{a.scenario} follow-the-past-counterfactual, margin {m}: {rows:,} rows; "
                  f"{sum(x is not None for x in ans)}/{len(ans)} replace: {seq}")
    else:
        trace = Trace.load(a.trace)
        out = {"trace": str(a.trace), "digest": trace.digest(), "pool": []}
        for seed in a.seeds:
            rows, wins, ans, judged = judged_windows(trace, pc, coin(seed), a.horizon)
            for i, w, j, best, lab in judged:
                out["pool"].append({"seed": seed, "window": w, "recent": wins[max(0, i - 3):i],
                                    "decided": ans[i], "judged": j, "best": best, "label": lab})
            print(f"seed {seed}: {rows:,} rows, labels " + " ".join(
                e["label"][0] for e in out["pool"] if e["seed"] == seed))
    print(f"({time.time() - t0:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
