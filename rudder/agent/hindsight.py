"""Hindsight for the decision-quality suite: labelled windows from replayed traces, checked
against the counterfactual.

`rudder agent label RUN_DIR` labels a window from what the run did after it (eval.py:
`label_windows_from_run`). That reads one branch only: a replacement's gain is measured
against the judged window's own hit rate, so drift and noise count as gain or loss. A trace
replay is deterministic, so for a simulated run (`rudder sim`, or `collect_run` below) both
branches can be played from the very buffer state the run had when the window closed:

  keep     no replacement round for `horizon` windows
  replace  the action a replace decision takes (rudder.agent.policy): with the lookahead
           mechanism a lookahead round on every minibatch of the next window (the regime lasts
           until the next decision), without lookahead one MassiveGNN round at its first
           minibatch; then no round for the remaining horizon-1 windows

  gain = rows fetched by keep - rows fetched by replace   (= hits gained - extra rows pulled)

which is the issue's definition (did replacing at that window raise the following windows'
hits net of the rows it cost?) without the noise. `counterfactual_gains` replays a run
directory's recorded actions (it checks that it reproduces the recorded hits exactly) and
forks at every window close. `hindsight_label` turns a gain into replace (gain > REPLACE_MARGIN
of the horizon's remote rows), keep (gain <= KEEP_MARGIN) or None (too close to call).

`judge_run` judges every decision of a simulated run that way (the decision taken vs its
alternative, forked at the decision's applied step): DecisionRecord's cf_rows_saved,
cf_replace_share and correct_cf (`rudder agent judge RUN_DIR`).

`collect_run` writes such a run: the agent policy with `RandomDecisionMaker` (replace or keep
at random, a seeded coin) replayed on a trace, so the windows and decisions are real records
of the agent's mechanism, with both actions.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from rudder.agent.judge import KEEP_MARGIN, REPLACE_MARGIN, agrees, hindsight_label  # noqa: F401 (re-exported)
from rudder.agent.messages import Decision, budget_rows
from rudder.agent.steering import Regime, make_round
from rudder.prefetch.policy import budget_rows as share_rows
from rudder.prefetch.policy import Policy, Replace, StepInfo, mechanism_for
from rudder.records import read_jsonl, read_run, update_run_json

HORIZON = 2  # windows counted after the decision (the replace regime acts in the first)


class RandomDecisionMaker:
    """Stands in for the LLM when collecting windows: replace with probability p_replace
    (seeded), at a fixed budget, predicting the usual directions. Nothing is learnt from it; it
    only makes a run whose records hold both actions."""

    def __init__(self, p_replace: float = 0.5, budget: str = "medium", seed: int = 0):
        self.rng = random.Random(seed)
        self.p_replace, self.budget = p_replace, budget

    def decide(self, prompt, cancel=None) -> Decision:
        rep = self.rng.random() < self.p_replace
        return Decision(replace=rep, budget=self.budget,
                        expected_hit_rate="up" if rep else "flat",
                        expected_remote_rows="down" if rep else "flat",
                        reason="random collection", model="random", backend="random",
                        latency_s=0.0)

    def close(self) -> None:
        pass


def collect_run(trace_path: str | Path, runs_dir: str | Path, *, window: int | None = 5,
                lookahead: int | None = None, p_replace: float = 0.5, budget: str = "medium",
                seed: int = 0, study: str = "eval-windows", admit: str | None = None,
                prefetch: dict | None = None, maker: Callable[[int], Any] | None = None,
                run_id: str | None = None, horizon: int = HORIZON) -> Path:
    """Replays the trace under the agent policy with RandomDecisionMaker and writes the run
    directory (`rudder sim`'s format), every decision judged (horizon windows); returns it.
    `prefetch`: other prefetch settings of the scenario (e.g. alpha, period: which slots a
    history-only round counts stale); window None: the prefetch settings' own. `maker(rank)`:
    another decision maker per rank (e.g. bench_cf_oracle's scripted answers), `run_id`: the
    run directory's name (default: one naming the collection's settings)."""
    from rudder.sim.simulate import load_source, rank_source, simulate, write_sim_run

    traces, source = load_source(trace_path)
    cfg = json.loads(json.dumps(source.get("config") or {}))
    pf = cfg.setdefault("prefetch", {})
    pf.update(prefetch or {})
    pf.update(policy="agent")
    if window is not None:
        pf["window"] = window
    if lookahead is not None:
        pf["lookahead"] = lookahead
    if admit is not None:
        pf["admit"] = admit
    source["config"] = cfg
    results = []
    for rank, trace in sorted(traces.items()):
        dm = maker(rank) if maker is not None else RandomDecisionMaker(p_replace, budget, seed * 1000 + rank)
        results.append(simulate(trace, "agent", rank=rank, source=rank_source(source, rank),
                                extra={"decision_maker": dm}))
    if run_id is None:
        name = str(source.get("name", "trace")).removesuffix(".npz")
        la = "" if lookahead is None else f"-la{lookahead}"
        run_id = f"sim-{name}-agent-random-w{pf.get('window')}{la}{'-' + admit if admit else ''}-s{seed}"
    run = write_sim_run(runs_dir, results, source, run_id=run_id, study=study)
    judge_run(run, horizon=horizon)  # every decision judged against its counterfactual (correct_cf)
    return run


def _sim_inputs(run_dir: Path, rank: int):
    """(trace, prefetch config, capacity, start, RunContext, future depth) of a simulated run,
    or of a live run that kept its trace."""
    from rudder.config import PrefetchConfig, sample_ahead
    from rudder.sim.simulate import load_source, rank_source, run_context

    meta = read_run(run_dir)
    sim = meta.get("sim") or {}
    if not sim.get("source") and not (run_dir / f"trace-r{rank}.npz").exists():
        raise ValueError(f"{run_dir} is neither a simulated run (run.json has no sim.source) nor "
                         f"a run with its trace (no trace-r{rank}.npz): the counterfactual needs the "
                         "trace")
    # a live run replays its own recorded trace (the replay's check of every hit count says
    # whether the run is reproduced)
    traces, source = load_source(sim.get("source") or run_dir)
    if rank not in traces:
        raise ValueError(f"{sim.get('source') or run_dir} has no trace for rank {rank}")
    trace = traces[rank]
    pf = dict((meta.get("config") or {}).get("prefetch") or {})
    known = set(PrefetchConfig.model_fields)
    pc = PrefetchConfig.model_validate({k: v for k, v in pf.items() if k in known})
    C = int(sim.get("capacity") or trace.capacity)
    start = sim.get("start") or "init"
    ctx = run_context(trace, pc, C, rank, rank_source(source, rank))
    return trace, pc, C, start, ctx, sample_ahead(pc)


def sim_context(run_dir: str | Path, rank: int = 0) -> dict:
    """The RunContext a simulated run's policy saw, as a dict (for eval records)."""
    *_, ctx, _ = _sim_inputs(Path(run_dir), rank)
    d = asdict(ctx)
    d.pop("run_dir", None)
    d.pop("extra", None)
    return d


def _fallback_policy(run_dir: Path, ctx, pc):
    """The policy that steered an agent run before its first answer and after bad ones (set up
    as AgentPolicy sets it up), or None for runs of other windowed policies (no fallback)."""
    from rudder.agent.policy import fallback_policy

    cfg = read_run(run_dir).get("config") or {}
    if (cfg.get("prefetch") or {}).get("policy", "agent") != "agent":
        return None
    return fallback_policy((cfg.get("agent") or {}).get("fallback", "auto"), pc, ctx)


def _rows(budget: Any, capacity: int) -> int:
    """A budget word (the agent's) or a share of capacity, as rows."""
    if isinstance(budget, str):
        return budget_rows(budget, capacity)
    return share_rows(float(budget), capacity)


class RecordedActions(Policy):
    """Plans a replay as the run was steered: each recorded decision applied at its step, as
    the agent / windowed policies apply it (a lookahead replace holds its round every minibatch
    until the next decision), the fallback where it steered (before the first answer, after a
    bad or late one)."""

    def __init__(self, decisions: list[dict], mech: str, budget: Any, capacity: int, admit: str,
                 fallback: Policy | None, steps: int, evict: str = "stale", period: int = 25):
        self.applied = {int(d["applied_step"]): d for d in decisions if d.get("applied_step") is not None}
        self.mech, self.budget, self.capacity, self.admit = mech, budget, capacity, admit
        self.evict, self.period = evict, period
        self.fallback, self.steps = fallback, steps
        self.regime = Regime()
        self.in_fallback = fallback is not None  # until the first answer (AgentPolicy)

    def plan(self, step: StepInfo) -> Replace | None:
        g = step.global_step
        if g in self.applied:
            d = self.applied[g]
            self.in_fallback = bool(d.get("fallback")) and self.fallback is not None
            replace = d.get("replace") and not d.get("fallback")
            plan = self.regime.apply(make_round(self.mech, _rows(d.get("budget") or self.budget, self.capacity),
                                                "replay", d.get("admit") or self.admit,
                                                d.get("evict") or self.evict, self.period) if replace else None)
        else:
            plan = self.regime.standing
        if self.in_fallback:
            plan = self.fallback.plan(StepInfo(epoch=0, step=g, global_step=g, remaining_steps=self.steps - g))
        return plan


class Branch(Policy):
    """One branch from a fork at minibatch `first`: keep (no round), or replace as a replace
    decision would (a lookahead round on each minibatch of the next window; without lookahead
    one MassiveGNN round at its first minibatch, counting stale as `evict` says); no round
    after that window."""

    def __init__(self, replace: bool, first: int, window: int, mech: str, rows: int, admit: str,
                 evict: str = "stale", period: int = 25):
        self.replace, self.first, self.window = replace, first, window
        self.round = make_round(mech, rows, "counterfactual", admit, evict, period)

    def plan(self, step: StepInfo) -> Replace | None:
        k = step.global_step - self.first
        if self.replace and k < self.window and (self.round.mechanism == "lookahead" or k == 0):
            return self.round
        return None


class _Forks:
    """A simulated run replayed with its recorded actions (it checks that it reproduces the
    recorded hits exactly), forked into both branches at chosen minibatches."""

    def __init__(self, run_dir: Path, rank: int, horizon: int):
        import numpy as np

        from rudder.sim.replay import BufferReplayer, PositionTrace

        trace, pc, C, start, ctx, depth = _sim_inputs(run_dir, rank)
        self.run_dir, self.rank, self.horizon, self.C = run_dir, rank, horizon, C
        self.mech = mechanism_for(ctx.depth)
        self.admit = pc.admit
        self.evict, self.period = pc.evict, pc.period
        self.decisions = read_jsonl(run_dir / f"decisions-r{rank}.jsonl")
        # the replace branch's budget where a decision names none (a keep): the run's replace budget
        self.budget = next((d["budget"] for d in self.decisions if d.get("replace") and d.get("budget")),
                           pc.budget)
        self.recorded = [int(m["hits"]) for m in sorted(
            read_jsonl(run_dir / f"minibatches-r{rank}.jsonl"), key=lambda m: m["global_step"])]
        self.S, self.W = trace.num_minibatches, pc.window
        self.pt = PositionTrace(trace, start_depth=pc.lookahead)
        actions = RecordedActions(self.decisions, self.mech, self.budget, C, self.admit,
                                  _fallback_policy(run_dir, ctx, pc), self.S, self.evict, self.period)
        self.run = BufferReplayer(self.pt, actions, C, alpha=pc.alpha, period=pc.period, depth=depth,
                                  window=self.W, records=False)
        self.run.fill(trace.init_positions()[:C] if start == "init" else np.zeros(0, dtype=np.int64))

    def fits(self, first: int) -> bool:
        """Whether `horizon` windows from minibatch `first` lie within the run."""
        return 0 <= first and first + self.horizon * self.W <= self.S

    def branches(self, first: int, rows: int, admit: str | None = None, evict: str | None = None) -> dict:
        """{"replace"|"keep": (hits, replaced_rows, remote_rows)} over the horizon from `first`,
        both forked from the run's buffer as it stands before minibatch `first` (the replace
        branch admits as `admit` and counts stale as `evict`, defaults the run's)."""
        from rudder.sim.replay import replay

        assert self.run.g == first, (self.run.g, first)
        span = slice(first, first + self.horizon * self.W)
        res = {}
        for branch in ("replace", "keep"):
            b = self.run.fork(Branch(branch == "replace", first, self.W, self.mech, rows, admit or self.admit,
                                     evict or self.evict, self.period))
            n = replay(self.pt, b, stop=span.stop)
            res[branch] = tuple(int(n[k][span].sum()) for k in ("hits", "replaced_rows", "remote_rows"))
        return res

    def replay(self, at: dict[int, Any]) -> None:
        """Replays the whole run; at[first]() is called with the buffer as it stands before
        minibatch `first` (0 included)."""
        from rudder.sim.replay import replay

        def after(g: int, c) -> None:
            if g < len(self.recorded) and c.hits != self.recorded[g]:
                raise RuntimeError(f"{self.run_dir} rank {self.rank}: replay diverged at minibatch {g} "
                                   f"({c.hits} hits, the run recorded {self.recorded[g]})")
            if g + 1 in at:
                at[g + 1]()

        if 0 in at:
            at[0]()
        replay(self.pt, self.run, after_step=after)


def _gain(res: dict, rows: int) -> dict:
    (hr, xr, rem), (hk, xk, _) = res["replace"], res["keep"]
    gain = (hr - hk) - (xr - xk)  # = rows keep fetches - rows replace fetches (same remote rows)
    return {"gain": gain, "remote": rem, "share": gain / max(1, rem), "rows": rows,
            "hits_replace": hr, "hits_keep": hk, "extra_replace": xr, "extra_keep": xk}


def counterfactual_gains(run_dir: str | Path, rank: int = 0, horizon: int = HORIZON,
                         budget: Any = None) -> dict[int, dict]:
    """{window id: {"gain", "remote", "share", "hits_replace", "hits_keep", "extra_replace",
    "extra_keep", "rows"}} for every window of a simulated run with `horizon` windows after it.
    budget: the replace branch's budget (a word or a share of capacity); default the budget of
    the run's replace decisions, else the run's prefetch budget.
    The run is replayed (rudder.sim.replay) with its recorded actions; at each window close the
    replayer is forked into the two branches."""
    f = _Forks(Path(run_dir), rank, horizon)
    rows = _rows(f.budget if budget is None else budget, f.C)
    out: dict[int, dict] = {}

    def fork(first: int) -> None:
        out[first // f.W - 1] = _gain(f.branches(first, rows), rows)

    f.replay({first: (lambda first=first: fork(first))
              for first in range(f.W, f.S + 1, f.W) if f.fits(first)})
    return out


def judge_run(run_dir: str | Path, horizon: int = HORIZON, write: bool = True) -> dict[int, list[dict]]:
    """The counterfactual judge: every decision of a simulated run, or of a live run that kept
    its trace (agent, classifier, random collector), with the decision taken and its alternative (replace vs keep) replayed from the
    same buffer state -- the run's own, at the decision's applied_step -- over `horizon`
    windows. The replace branch acts as the decision would (`Branch`) at the decision's own
    budget (a keep that names none, e.g. a classifier's 0.0: the run's replace budget), so the
    budget is held fixed, not judged. Sets cf_rows_saved, cf_replace_share and correct_cf (rudder.agent.judge.counterfactual)
    on each record; a decision never applied, a fallback, or one whose horizon runs past the
    end keeps them null. write: rewrite decisions-r<R>.jsonl (atomically) and run.json's `judge`
    (judge_record), so the run says which horizon its verdicts are over. {rank: records}."""
    from rudder.agent.judge import counterfactual

    run_dir = Path(run_dir)
    read_run(run_dir)  # not a run directory: an error naming it
    t0 = time.perf_counter()
    out = {}
    for path in sorted(run_dir.glob("decisions-r*.jsonl")):
        rank = int(path.stem.rsplit("-r", 1)[1])
        f = _Forks(run_dir, rank, horizon)
        recs = [dict(d) for d in f.decisions]
        at: dict[int, Any] = {}

        def judge(first: int, todo: list[dict]) -> None:
            for d in todo:
                rows = _rows(d.get("budget") or f.budget, f.C)
                cf = _gain(f.branches(first, rows, d.get("admit"), d.get("evict")), rows)
                saved = cf["gain"] if d["replace"] else -cf["gain"]
                d.update(cf_rows_saved=int(saved), cf_replace_share=round(cf["share"], 6),
                         correct_cf=counterfactual(d["replace"], d.get("fallback"), cf["share"]))

        for d in recs:
            d.update(cf_rows_saved=None, cf_replace_share=None, correct_cf=None)
            a = d.get("applied_step")
            if a is None or d.get("fallback") or d.get("replace") is None or not f.fits(int(a)):
                continue
            at.setdefault(int(a), []).append(d)
        f.replay({a: (lambda a=a, todo=todo: judge(a, todo)) for a, todo in at.items()})
        if write:
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(d) + "\n" for d in recs))
            tmp.replace(path)
        out[rank] = recs
    if write:
        update_run_json(run_dir, judge=judge_record([d for recs in out.values() for d in recs],
                                                   horizon, time.perf_counter() - t0))
    return out


def judge_record(recs: list[dict], horizon: int, seconds: float) -> dict:
    """run.json's `judge` for a run whose decisions `recs` were judged over `horizon` windows:
    what the run summary and the report quote beside the decision files' verdicts."""
    s = summarize(recs)
    return {"horizon": horizon, "judged": s["judged"], "decisions": s["decisions"],
            "pass_at_1_cf": list(s["pass_at_1_cf"]), "s": round(seconds, 3)}


def check_labels(records: list[dict], run_dir: str | Path, horizon: int = HORIZON) -> list[dict]:
    """Adds `hindsight` (counterfactual gain, share, label) to each labelled record of this run
    (from label_windows_from_run) and `agrees` (the run's label equals the counterfactual's)."""
    by_rank: dict[int, dict[int, dict]] = {}
    out = []
    for rec in records:
        rank = int(rec.get("rank", rec.get("context", {}).get("rank", 0)) or 0)
        if rank not in by_rank:
            by_rank[rank] = counterfactual_gains(run_dir, rank, horizon)
        cf = by_rank[rank].get(int(rec["window"]["window"]))
        lab = hindsight_label(cf)
        rec = dict(rec)
        rec["hindsight"] = None if cf is None else {
            "gain_rows": cf["gain"], "gain_share": round(cf["share"], 5), "label": lab,
            "budget_rows": cf["rows"], "horizon": horizon}
        rec["agrees"] = agrees(lab, bool(rec["label_replace"])) if lab is not None else None
        out.append(rec)
    return out


def summarize(recs: list[dict]) -> dict:
    """Counts of judged decisions: replace saves (> REPLACE_MARGIN of the remote rows), costs
    (< -REPLACE_MARGIN) or is neutral; Pass@1 before/after (correct) and counterfactual."""
    judged = [d for d in recs if d.get("cf_replace_share") is not None]
    sh = [d["cf_replace_share"] for d in judged]

    def p1(key: str) -> tuple[int, int]:
        ev = [d[key] for d in recs if d.get(key) is not None]
        return sum(map(bool, ev)), len(ev)

    return {"decisions": len(recs), "judged": len(judged),
            "saves": sum(x > REPLACE_MARGIN for x in sh), "costs": sum(x < -REPLACE_MARGIN for x in sh),
            "neutral": sum(abs(x) <= REPLACE_MARGIN for x in sh),
            "pass_at_1": p1("correct"), "pass_at_1_cf": p1("correct_cf")}
