"""Scenario (d) of issue 18, by replay: a link whose rate changes during the run
(cluster.bandwidth_schedule). Which answer is right at each window -- keep, replace (lookahead
rounds admitting only misses) or admit-any (rounds pulling rows ahead of use) -- judged by the
time model's counterfactual (rudder.sim.timemodel): all three forked from the run's buffer and
clock at the window's close and replayed over the next `horizon` windows; the fastest is right,
none when the two fastest lie within 0.5% of each other.

  rudder tracegen --graph synth-medium --parts 2 --batch-size 1000 --epochs 3 --out T
  python benchmarks/bench_bandwidth_schedule.py T/trace-r0.npz \
      [--config configs/scenarios/bandwidth_schedule.yaml] [--compute-s 0.59] [--json OUT]

The run forked from is the lookahead policy at the config's depth and budget (admit misses).
Also printed: the whole run's modelled time and rows under fixed settings (none, replace
misses, admit any) and under the hand-written rule "admit any while the link has slack
(fetch < compute), else admit misses", and how often that rule's choice is the right one.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rudder.config import load_run_config  # noqa: E402
from rudder.prefetch.policy import Policy, Replace, StepInfo, budget_rows  # noqa: E402
from rudder.sim.timemodel import TimeModel, time_label, timed_branches  # noqa: E402
from rudder.trace import Trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class SlackRule(Policy):
    """The hand-written rule: a lookahead round every minibatch, admitting any node while the
    last minibatch's pull left compute time over (link slack), else only misses."""

    def __init__(self, rows: int, replayer):
        self.rows, self.rp = rows, replayer

    def plan(self, step: StepInfo) -> Replace | None:
        clock = self.rp.clock
        slack = clock.slack(self.last_rows) if step.global_step else 1.0
        return Replace("lookahead", self.rows, "rule", "any" if slack > 0 else "misses")

    def observe(self, metrics: dict, window: dict | None = None) -> None:
        self.last_rows = metrics["fetched_rows"]


def replayer(trace, pt, policy, pc, model):
    import numpy as np

    from rudder.sim.replay import BufferReplayer

    rp = BufferReplayer(pt, policy, trace.capacity, alpha=pc.alpha, period=pc.period, depth=pc.lookahead,
                        window=pc.window)
    rp.fill(trace.init_positions()[:trace.capacity] if pc.init != "empty" else np.zeros(0, dtype=np.int64))
    rp.clock = model.clock()
    return rp


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--config", type=Path, default=ROOT / "configs/scenarios/bandwidth_schedule.yaml")
    p.add_argument("--compute-s", type=float, default=0.59,
                   help="compute seconds per minibatch (median t_compute of a live synth-medium run, §6)")
    p.add_argument("--latency-s", type=float, default=0.002)
    p.add_argument("--t0-s", type=float, default=0.0, help="the schedule's clock at the first minibatch")
    p.add_argument("--horizon", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--agent", metavar="MODEL", help="also replay the agent (this model, --prompt, "
                   "1 llama.cpp thread; answers applied at the next minibatch) under the time model")
    p.add_argument("--prompt", default="judge")
    p.add_argument("--skip-labels", action="store_true", help="only the whole-run rows")
    a = p.parse_args()
    from rudder.prefetch.policies import make_policy
    from rudder.sim.replay import PositionTrace, replay
    from rudder.sim.simulate import simulate

    t_start = time.time()
    cfg = load_run_config(a.config)
    pc = cfg.prefetch.model_copy(update={"policy": "lookahead", "admit": "misses"})
    trace = Trace.load(a.trace)
    model = TimeModel.from_config(cfg, a.compute_s, trace.feat_bytes, latency_s=a.latency_s, t0_s=a.t0_s)
    pt = PositionTrace(trace)
    rows = budget_rows(pc.budget, trace.capacity)

    # the run forked from, and the three branches at every window close
    pol = make_policy(pc)
    pol.setup(type("Ctx", (), {"capacity": trace.capacity})())
    rp = replayer(trace, pt, pol, pc, model)
    W, S, H = pc.window, len(pt), a.horizon
    windows = []

    def fork(g, _c):
        first = g + 1
        if first % W or first + H * W > S:
            return
        t = rp.clock.t
        br = timed_branches(rp, pt, model, t, W, H, rows)
        # the rule's choice here: any while the last pull left slack
        slack = model.compute_s - model.step(t, int(_c.misses + _c.replaced_rows))[0]
        windows.append({"window": first // W - 1, "t_s": round(t, 2), "rate_bit_s": model.rate(t),
                        "slack_s": round(slack, 3), "label": time_label(br),
                        "rule": "any" if slack > 0 else "replace", **{b: br[b] for b in br}})

    replay(pt, rp, after_step=None if a.skip_labels else fork)
    n = max(1, len(windows))
    labels = Counter(w["label"] for w in windows)
    rule_right = sum(w["label"] == w["rule"] for w in windows if w["label"])
    decided = sum(1 for w in windows if w["label"])

    # whole runs under fixed settings and the rule (modelled time, rows)
    runs = {}
    for spec in ("none", f"lookahead:{pc.lookahead}:{pc.budget}:misses", f"lookahead:{pc.lookahead}:{pc.budget}:any"):
        s = simulate(trace, spec, time_model=model).summary()
        runs[spec] = {"time_s": round(s["time_s"], 2), "rows": s["fetched_rows"], "hit_rate": round(s["hit_rate"], 4)}
    rule_rp = replayer(trace, pt, None, pc, model)
    rule_rp.policy = SlackRule(rows, rule_rp)
    rule_rp.policy.last_rows = 0
    n_rule = replay(pt, rule_rp)
    tm = model.times(n_rule["fetched_rows"])
    runs["rule: any while slack"] = {"time_s": round(float((tm["t_compute"] + tm["t_stall"]).sum()), 2),
                                     "rows": int(n_rule["fetched_rows"].sum()),
                                     "hit_rate": round(int(n_rule["hits"].sum()) / max(1, int(n_rule["remote_rows"].sum())), 4)}

    decisions = []
    if a.agent:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_agent_sim import load_agent

        extra = load_agent(a.agent, prompt=a.prompt, timeout_s=240.0)
        try:
            src = {"config": cfg.model_dump(mode="json")}
            res = simulate(trace, "agent", source=src, extra=extra, agent_wait_s=245.0, time_model=model)
        finally:
            extra["decision_maker"].shutdown()
        s = res.summary()
        decisions = [{k: d.get(k) for k in ("window", "applied_step", "replace", "budget", "admit", "reason",
                                            "latency_s", "fallback")} for d in res.decisions]
        runs[f"agent {a.agent} ({a.prompt})"] = {"time_s": round(s["time_s"], 2), "rows": s["fetched_rows"],
                                                 "hit_rate": round(s["hit_rate"], 4)}

    print(f"trace {a.trace} ({S} minibatches, capacity {trace.capacity}, {trace.feat_bytes} B/row); "
          f"window {W}, horizon {H}, budget {pc.budget} ({rows} rows), depth {pc.lookahead}; "
          f"compute {a.compute_s} s, latency {a.latency_s} s; schedule {cfg.cluster.bandwidth_schedule}")
    print(f"| windows | keep | replace | admit any | too close | rule right |")
    print(f"| {n} | {labels['keep'] / n:.2f} | {labels['replace'] / n:.2f} | {labels['any'] / n:.2f} | "
          f"{labels[None] / n:.2f} | {rule_right}/{decided} |")
    for w in windows:
        print(f"  w{w['window']:>3} t={w['t_s']:>6.1f}s rate={w['rate_bit_s'] / 1e6 if w['rate_bit_s'] else 0:>5.0f}Mbit "
              f"slack={w['slack_s']:+.2f}s label={w['label']!s:8} " +
              " ".join(f"{b}={w[b]['time_s']:.2f}s/{w[b]['rows']}" for b in ("keep", "replace", "any")))
    print("| run | time (model) | rows | hit rate |")
    for k, v in runs.items():
        print(f"| {k} | {v['time_s']} s | {v['rows']:,} | {v['hit_rate']:.3f} |")
    for d in decisions:
        print(f"  agent w{d['window']} @{d['applied_step']}: "
              f"{'replace ' + str(d['budget']) + ' admit ' + str(d['admit']) if d['replace'] else 'keep'} "
              f"({d['reason']}; {d['latency_s'] or 0:.1f} s){' fallback' if d['fallback'] else ''}")
    print(f"({time.time() - t_start:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps({"windows": windows, "runs": runs, "agent_decisions": decisions, "labels": {str(k): v for k, v in labels.items()},
                                      "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))


if __name__ == "__main__":
    main()
