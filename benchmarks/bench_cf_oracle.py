"""Issue 18: the counterfactual-greedy decider -- the ceiling of what the judge's labels are worth
on a scenario. At each window close, in order, it takes the answer the counterfactual judge
(rudder agent judge: replace vs keep from the same buffer state over the next --horizon windows,
2 as the judge's default)
finds best given its own earlier answers: replace at the budget word (and, history only, the
`evict` word: which slots the round counts stale) that saves the most rows, or keep where no
option saves any. Its rows fetched over the whole trace say how far a decider that is always
right by the judge gets against the fixed setting chosen in hindsight.

  python benchmarks/bench_cf_oracle.py [--scenario history_cold] [--trace-dir data/traces/baselines]
         [--budgets small medium large] [--evicts stale half] [--runs-dir /tmp/cf-oracle]
         [--stale-multiples 0.25 0.5 1 2]   (a sweep of other thresholds, x prefetch.period)

The trace is the scenario's as bench_baselines samples it (same --trace-dir: the same trace).
The options are played by forking one replay at each window close (hindsight's Branch: the
judge's own branches), then the answers are replayed through the agent policy and judged by
`rudder agent judge` (scripted_run), which must find each answer's share as the greedy did.
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
    """Answers from a list, in order ((replace, budget) or (replace, budget, evict)); keep once
    the list runs out."""

    def __init__(self, answers: list[tuple], keep_budget: str, keep_evict: str | None = None):
        self.answers, self.i, self.keep_budget, self.keep_evict = list(answers), 0, keep_budget, keep_evict

    def decide(self, prompt, cancel=None):
        from rudder.agent.messages import Decision

        a = self.answers[self.i] if self.i < len(self.answers) else (False, self.keep_budget, self.keep_evict)
        rep, budget, evict = (*a, None)[:3]
        self.i += 1
        return Decision(replace=rep, budget=budget, evict=evict, expected_hit_rate="flat",
                        expected_remote_rows="flat", reason="scripted", model="scripted", backend="scripted",
                        latency_s=0.0)

    def close(self) -> None:
        pass


def scripted_run(trace_path: Path, runs: Path, answers, keep_budget: str, prefetch: dict,
                 horizon: int = 2, keep_evict: str | None = None) -> tuple[list[dict], int]:
    """(judged decision records, rows fetched) of the agent policy answering `answers` then keep:
    hindsight.collect_run with this maker, at the scenario's prefetch settings (not the trace's)."""
    from rudder.agent.hindsight import collect_run
    from rudder.records import read_jsonl

    run = collect_run(trace_path, runs, window=None, prefetch=prefetch, study="cf-oracle", horizon=horizon,
                      maker=lambda rank: ScriptedMaker(answers, keep_budget, keep_evict),
                      run_id=f"oracle-{len(answers)}-{keep_budget}")
    recs = read_jsonl(run / "decisions-r0.jsonl")
    rows = int(sum(e["fetched_rows"] for e in read_jsonl(run / "epochs-r0.jsonl")))
    shutil.rmtree(run)
    return recs, rows


class _Script:
    """The answers so far as rounds at their applied steps (a Policy for the replayer)."""

    def __init__(self) -> None:
        self.at: dict = {}

    def setup(self, ctx) -> None:
        pass

    def start(self, state) -> bool:
        return False

    def plan(self, step):
        return self.at.get(step.global_step)


def greedy(trace_path: Path, runs: Path, budgets: list[str], prefetch: dict, horizon: int = 2,
           evicts: list[str] | None = None, multiples: list[float] | None = None, check: bool = True) -> dict:
    """The counterfactual-greedy answers: at each window close (its answer applies at the next
    minibatch, as a replay applies the agent's), fork the run into keep and every option
    (budget x evict word) over `horizon` windows -- the judge's branches (hindsight.Branch) --
    and take the option that saves the most rows, keep where none saves any. evicts: words of
    rudder.prefetch.policy.EVICT_PERIODS (default: the config's only); multiples: instead, any
    stale thresholds as multiples of prefetch.period (a sweep; not answerable by the agent, so
    not checked by the judge). check: replay the answers through the agent policy and the judge
    (scripted_run) and assert it finds the same shares and rows."""
    from rudder.agent.hindsight import Branch
    from rudder.agent.messages import budget_rows
    from rudder.config import PrefetchConfig
    from rudder.prefetch.policy import EVICT_PERIODS, mechanism_for
    from rudder.sim.replay import BufferReplayer, PositionTrace, replay
    from rudder.trace import Trace

    tr = Trace.load(trace_path)
    pc = PrefetchConfig.model_validate({**prefetch, "policy": "agent"})
    if mechanism_for(pc.lookahead) != "massivegnn":
        raise ValueError("bench_cf_oracle: history-only scenarios (lookahead 0) only")
    pt, C, W, S = PositionTrace(tr), tr.capacity, pc.window, tr.num_minibatches
    if multiples is not None:
        opts = [(b, m) for b in budgets for m in multiples]
    else:
        opts = [(b, e) for b in budgets for e in (evicts or [pc.evict])]
    rows_of = {b: budget_rows(b, C) for b in budgets}

    def branch(first: int, opt) -> Branch:
        if opt is None:
            return Branch(False, first, W, "massivegnn", 0, pc.admit)
        b, e = opt
        br = Branch(True, first, W, "massivegnn", rows_of[b], pc.admit, e if isinstance(e, str) else "stale",
                    pc.period)
        if not isinstance(e, str):  # a sweep's multiple
            from dataclasses import replace as dc_replace

            br.round = dc_replace(br.round, stale_after=None if e == 1 else e * pc.period)
        return br

    script = _Script()
    run = BufferReplayer(pt, script, C, alpha=pc.alpha, period=pc.period, depth=0, window=W, records=False)
    init = tr.init_positions()[:C]  # the trace's initial fill, as the run's replay (start "init")
    run.fill(init)
    answers: list[tuple] = []
    shares: list[dict] = []
    for first in range(W, S + 1, W):
        replay(pt, run, stop=first)
        if first + horizon * W > S:
            break  # past the last judgeable decision
        span = slice(first, first + horizon * W)
        got = {}
        for opt in [None, *opts]:
            n = replay(pt, run.fork(branch(first, opt)), stop=span.stop)
            got[opt] = (int(n["fetched_rows"][span].sum()), int(n["remote_rows"][span].sum()))
        keep, remote = got.pop(None)
        judged = {opt: (keep - f) / max(1, remote) for opt, (f, _) in got.items()}
        best = max(judged, key=lambda o: (judged[o], -opts.index(o)))  # ties: the first option
        rep = judged[best] > 0
        answers.append((rep, *(best if rep else (budgets[0], opts[0][1]))))
        shares.append({f"{b}/{e}": round(v, 6) for (b, e), v in judged.items()})
        if rep:
            script.at[first] = branch(first, best).round
    full = BufferReplayer(pt, script, C, alpha=pc.alpha, period=pc.period, depth=0, window=W, records=False)
    full.fill(init)
    rows = int(replay(pt, full)["fetched_rows"].sum())
    out = {"answers": answers, "shares": shares, "fetched_rows": rows}
    if check and multiples is None:
        scripted = [(r, b, e) for r, b, e in answers]
        recs, rows_agent = scripted_run(trace_path, runs, scripted, budgets[0], prefetch, horizon, opts[0][1])
        assert rows_agent == rows, (rows_agent, rows)
        for k, (a, sh) in enumerate(zip(answers, shares)):
            want = sh[f"{a[1]}/{a[2]}"]
            assert recs[k]["replace"] == a[0] and abs(recs[k]["cf_replace_share"] - want) < 1e-6, (k, recs[k], sh)
        out["judged_by_agent_path"] = True
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="history_cold")
    p.add_argument("--trace-dir", type=Path, default=Path("data/traces/baselines"))
    p.add_argument("--budgets", nargs="+", default=["small", "medium", "large"])
    p.add_argument("--evicts", nargs="+", default=None, help="evict words the greedy may answer "
                   "(default: the scenario's prefetch.evict only)")
    p.add_argument("--stale-multiples", nargs="+", type=float, default=None,
                   help="a sweep: stale thresholds as multiples of prefetch.period instead of words")
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
    out = greedy(trace, a.runs_dir, a.budgets, pc.model_dump(mode="json"), a.horizon, a.evicts, a.stale_multiples)
    seq = " ".join(f"{b[0]}{'' if e in (None, 'stale', 1.0) else ('/' + str(e))}" if r else "k"
                   for r, b, e in out["answers"])
    print(f"{a.scenario}, horizon {a.horizon} windows, options {a.budgets} x {a.stale_multiples or a.evicts or [pc.evict]}: "
          f"counterfactual-greedy answers (s/m/l = replace at that budget [/ evict], k = keep): {seq}")
    print(f"rows fetched {out['fetched_rows']:,} ({time.time() - t0:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
