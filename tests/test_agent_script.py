"""agent.backend=script (rudder.agent.script): a run answers each window with the decision a
recorded run took at that window, through the agent's own path, no model running. Issue 18,
must-have 6: the agent's decisions measured live apart from its model's CPU."""
from __future__ import annotations

import json
import os

import pytest

from rudder.agent.decision import DecisionMaker
from rudder.agent.script import ScriptedMaker, load_answers
from rudder.config import AgentConfig, PrefetchConfig, RunConfig
from rudder.runner import preflight
from rudder.sim.simulate import parse_policy, simulate
from rudder.sim.tracegen import random_trace

from test_agent_policy import ScriptedBackend  # noqa: E402 (tests/ is on sys.path)


def answer(replace: bool, budget: str = "medium", evict: str = "stale") -> dict:
    return {"reason": f"my reading: {'replace' if replace else 'keep'}", "replace": replace, "budget": budget,
            "evict": evict, "expected": {"hit_rate": "up" if replace else "flat", "remote_rows": "flat"}}


# a recorder's answers, one per window of the trace's 8 in order: mixed budgets, evict words and a bad answer
RECORDED = [answer(True, "large", "half"), answer(False), answer(True, "small"), "not json",
            answer(True, "medium", "half"), answer(False), answer(True, "large"), answer(False)]


@pytest.fixture(scope="module")
def trace():
    return random_trace(halo=400, minibatches=40, batch=80, capacity=0.25, skew=0.8, epochs=2, seed=7,
                        init="random")


def _replay(trace, agent: AgentConfig, maker=None):
    pc = PrefetchConfig(policy="agent", lookahead=0, window=5, period=10, init="random")
    extra = {"agent": agent, **({"decision_maker": maker} if maker else {})}
    res = simulate(trace, parse_policy("agent", pc), extra=extra, agent_wait_s=30.0)
    return res, sorted(res.decisions, key=lambda d: d["decision"])


def _record(path, rank: int, decisions: list[dict]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / f"decisions-r{rank}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))


def test_a_scripted_replay_takes_the_recorded_decisions(trace, tmp_path):
    """Record a run whose 'model' answers RECORDED; a run scripted from its records takes the
    same decision at every window (the bad answer's fallback too) and fetches the same rows."""
    agent = AgentConfig(prompt="judge-history", timeout_s=30)
    maker = DecisionMaker(ScriptedBackend(RECORDED), "recorder", "static", 160, 30.0)
    rec_res, recorded = _replay(trace, agent, maker)
    assert len(recorded) == len(RECORDED) and sum(d["replace"] for d in recorded) == 4
    assert recorded[3]["fallback"] == "static"
    _record(tmp_path / "rec", 0, recorded)

    got_res, got = _replay(trace, agent.model_copy(update={"backend": "script", "script": str(tmp_path / "rec")}))
    key = ("window", "replace", "budget", "evict", "fallback", "applied_step")
    assert [{k: d.get(k) for k in key} for d in got] == [{k: d.get(k) for k in key} for d in recorded]
    assert {d["model"] for d in got} == {"script:recorder"} and {d["backend"] for d in got} == {"script"}
    assert all(d["latency_s"] == 0.0 for d in got)
    assert got[3]["reason"].startswith("fallback: recorded fallback: invalid")
    assert got_res.total("fetched_rows") == rec_res.total("fetched_rows")
    # the answers are what steers: keeping everywhere fetches other rows
    _record(tmp_path / "keep", 0, [{**d, "replace": False, "raw": json.dumps(answer(False))} for d in recorded])
    keep_res, _ = _replay(trace, agent.model_copy(update={"backend": "script", "script": str(tmp_path / "keep")}))
    assert keep_res.total("fetched_rows") != rec_res.total("fetched_rows")


def test_windows_without_a_recorded_answer_fall_back(trace, tmp_path):
    """Answers go by window number: a window the recorder never answered falls back, and the
    windows after it still get their own recorded answers."""
    agent = AgentConfig(prompt="judge-history", timeout_s=30)
    maker = DecisionMaker(ScriptedBackend([answer(True, "large"), answer(False), answer(True, "small")]),
                          "recorder", "static", 160, 30.0)
    _, recorded = _replay(trace, agent, maker)
    # windows 0 and 2 answered; window 1 dropped (a negative number, no answer); nothing after 2
    _record(tmp_path, 0, [recorded[0], {**recorded[1], "decision": -1, "raw": ""}, recorded[2]])
    _, got = _replay(trace, agent.model_copy(update={"backend": "script", "script": str(tmp_path)}))
    assert len(got) == len(recorded)
    assert [(d["window"], d["replace"], d.get("budget"), d.get("fallback")) for d in (got[0], got[2])] == \
        [(0, True, "large", None), (2, True, "small", None)]
    assert all(d["fallback"] == "static" and d["reason"].startswith(
        f"fallback: no recorded answer for window {d['window']}") for d in [got[1], *got[3:]])


def test_bad_scripts_are_named(tmp_path):
    with pytest.raises(ValueError, match="agent.backend=script needs agent.script"):
        AgentConfig(backend="script")
    with pytest.raises(FileNotFoundError, match=r"rank 1: .*decisions-r1.jsonl does not exist"):
        ScriptedMaker.from_dir(tmp_path, 1)
    (tmp_path / "decisions-r0.jsonl").write_text('{"window": 0, "decision": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"decisions-r0.jsonl:2: not a JSON decision record"):
        load_answers(tmp_path, 0)
    # before a cluster starts: every trainer's file must be there
    cfg = RunConfig.model_validate({"prefetch": {"policy": "agent"}, "cluster": {"machines": 2},
                                    "agent": {"backend": "script", "script": str(tmp_path)}})
    problems = [p for p in preflight(cfg, probe=False) if p.startswith("agent.")]
    assert len(problems) == 1 and problems[0].startswith("agent.script: ") and ":2: not a JSON decision record" in problems[0]
    (tmp_path / "decisions-r0.jsonl").write_text('{"window": 0, "decision": 1}\n')
    assert [p for p in preflight(cfg, probe=False) if p.startswith("agent.")] == [
        f"agent.script: no recorded answers for rank 1: {tmp_path / 'decisions-r1.jsonl'} does not exist "
        f"(agent.script names a run directory, or `rudder sim`'s replay of one)"]


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated machines need root (network namespaces)")
def test_a_real_run_answers_from_each_trainers_script(tmp_path):
    """2 emulated machines, synth-small, history only from a cold buffer, judge-history-2b (its
    windows carry the past counterfactual as the LLM's would). Each trainer answers from its own
    rank's recorded file: rank 0 replaces at window 0, rank 1 at window 1; both keep at window 2;
    later windows were never recorded and fall back. The rounds land where the scripts put them."""
    from rudder.records import read_jsonl
    from rudder.runner import execute_run

    script = tmp_path / "recorded"
    for r in (0, 1):
        recs = [{"decision": w + 1, "window": w, "model": "handmade", "raw": json.dumps(answer(w == r, "large", "half"))}
                for w in range(3)]
        _record(script, r, recs)
    cfg = RunConfig.model_validate({
        "dataset": {"name": "synth-small", "root": str(tmp_path / "data")},
        # 3 epochs (~30 minibatches a trainer): a round answered at window 1 may land at minibatch
        # 10 or 11 (the answer is async), and either way its 2-window horizon must fit in the run
        # for the judge to take it (with 2 epochs, ~20 minibatches, one landing at 11 did not)
        "train": {"epochs": 3, "batch_size": 500, "hidden": 16, "eval_every": 0},
        "prefetch": {"policy": "agent", "lookahead": 0, "init": "random", "period": 10, "window": 5, "alpha": 0.05},
        "agent": {"prompt": "judge-history-2b", "backend": "script", "script": str(script)},
        "cluster": {"machines": 2, "start_timeout_s": 120, "run_timeout_s": 400},
        "runs_dir": str(tmp_path / "runs"),
    })
    res = execute_run(cfg)
    assert res.ok, res.reason
    n_judged = 0
    for r in (0, 1):
        decisions = sorted(read_jsonl(res.run_dir / f"decisions-r{r}.jsonl"), key=lambda d: d["window"])
        windows = read_jsonl(res.run_dir / f"windows-r{r}.jsonl")
        assert len(decisions) == len(windows) > 3
        assert [(d["replace"], d.get("evict"), d["model"], d["backend"]) for d in decisions[:3]] == \
            [(w == r, "half", "script:handmade", "script") for w in range(3)]
        assert all(d["fallback"] == "static" and "no recorded answer" in d["reason"] for d in decisions[3:])
        # the one round: applied at the first minibatch of the window after the answered one
        replaced = [w["replaced_rows"] for w in windows]
        assert replaced[r + 1] > 0 and sum(replaced) == replaced[r + 1]
        assert all(w["t_past_cf"] > 0 for w in windows)
        # the run judged its answers as it completed (runner.judge_decisions); fallbacks are not
        judged = [d for d in decisions if d["cf_rows_saved"] is not None]
        assert decisions[r]["replace"] and decisions[r] in judged
        assert all(d["fallback"] is None for d in judged)
        n_judged += len(judged)
    assert json.loads((res.run_dir / "run.json").read_text())["judge"]["judged"] == n_judged
