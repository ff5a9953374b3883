"""Issue 16: how many agent answers a run gets is set by its node server's time per answer. The
trainers sharing one server ask in turn (NodeTurn) and each asks with its newest window, not
one that closed 30-40 minibatches earlier; the server keeps each trainer's state (prompt cache)."""
import json
import os
import threading
import time

import pytest

from rudder.agent.decision import Completion, DecisionMaker
from rudder.agent.messages import conclusion
from rudder.agent.policy import TURN_ENV, AgentPolicy, NodeTurn
from rudder.agent.service import AgentService
from rudder.config import AgentConfig, PrefetchConfig
from rudder.prefetch.policy import RunContext


def answer():
    return {"reason": "test" + conclusion(True), "replace": True, "budget": "medium",
            "expected": {"hit_rate": "up", "remote_rows": "down"}}


class GatedBackend:
    """Answers once `gate` is set (each call waits for it), counting calls in flight at once
    across every backend sharing `shared`."""

    name = "fake"

    def __init__(self, gate: threading.Event, shared: dict | None = None, delay: float = 0.0):
        self.gate, self.delay = gate, delay
        self.shared = shared if shared is not None else {"now": 0, "max": 0, "lock": threading.Lock()}
        self.windows = []  # the window each question was about (from its last message)

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None):
        s = self.shared
        with s["lock"]:
            s["now"] += 1
            s["max"] = max(s["max"], s["now"])
        try:
            self.windows.append(messages[-1]["content"])
            assert self.gate.wait(10)
            time.sleep(self.delay)
            return Completion(json.dumps(answer()), "stop")
        finally:
            with s["lock"]:
                s["now"] -= 1

    def close(self):
        pass


def ctx(rank=0):
    return RunContext(rank=rank, num_trainers=2, part_id=rank, num_parts=2, num_nodes=10_000,
                      partition_nodes=5_000, halo_nodes=4_000, capacity=1000, batch_size=100,
                      fanouts=[10, 25], steps_per_epoch=100, epochs=1, feat_dim=8, feat_bytes=32,
                      window=5, lookahead=3)


def win(i, n=5):
    return {"window": i, "first_step": i * n, "last_step": i * n + n - 1, "minibatches": n,
            "hit_rate": 0.3 + 0.01 * i, "remote_rows": 1000 * n, "fetched_rows": 700 * n,
            "replaced_rows": 0, "t_fetch": 0.0, "t_stall": 0.0, "t_minibatch": 0.0,
            "buffer_fill": 1000, "stale_slots": 300, "lookahead_missing": 500, "lookahead_rows": 50}


def make(backend, rank=0):
    maker = DecisionMaker(backend, "fake", fallback="lookahead", timeout_s=10)
    pol = AgentPolicy(PrefetchConfig(policy="agent", window=5),
                      agent=AgentConfig(fallback="lookahead", timeout_s=10, start_decision=False),
                      decision_maker=maker)
    pol.setup(ctx(rank))
    return pol


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_agent_asks_with_the_newest_window_that_waited():
    """While the model answers window 0, windows 1 and 2 close: the next question is about
    window 2 (the newest); window 1 is recorded as dropped, never asked about."""
    gate = threading.Event()
    backend = GatedBackend(gate)
    pol = make(backend)
    try:
        pol.observe({"global_step": 4}, win(0))
        wait_for(lambda: len(backend.windows) == 1)  # asked about window 0; the model is busy
        pol.observe({"global_step": 9}, win(1))
        pol.observe({"global_step": 14}, win(2))
        gate.set()
        wait_for(lambda: len(backend.windows) == 2)
        wait_for(lambda: pol.decider._outbox.qsize() == 2)
    finally:
        pol.close()
    recs = pol.decisions()
    dropped = [r["window"] for r in recs if r["reason"].startswith("dropped: a newer window")]
    asked = sorted(r["window"] for r in recs if not r["reason"].startswith("dropped"))
    assert dropped == [1] and asked == [0, 2]
    assert pol.dropped_windows == 1
    assert "Window 2:" in backend.windows[1] and "Window 1:" not in backend.windows[1]


def test_node_turn_is_exclusive_and_gives_up_when_the_run_ends(tmp_path):
    a, b = NodeTurn(tmp_path / "n.turn"), NodeTurn(tmp_path / "n.turn")
    assert a.acquire()
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    assert not b.acquire(stop)  # held by a: b waits until the run ends, then gives up
    assert 0.15 < time.monotonic() - t0 < 2.0
    a.release()
    assert b.acquire(threading.Event())
    b.release()


def test_node_turn_goes_to_the_trainer_that_waited_longest(tmp_path):
    """First come, first served: a trainer that just asked queues behind those already waiting
    (with 4 trainers on a node and 3-4 answers a run, a random pick left some without any)."""
    path = tmp_path / "n.turn"
    holder = NodeTurn(path)
    assert holder.acquire()
    order, stop = [], threading.Event()

    def wait(name):
        t = NodeTurn(path)
        if t.acquire(stop):
            order.append(name)
            time.sleep(0.05)
            t.release()

    threads = []
    for i, name in enumerate(("b", "c", "d")):
        threads.append(threading.Thread(target=wait, args=(name,)))
        threads[-1].start()
        # b queues first, then c, then d: each starts once the one before has its entry
        wait_for(lambda: len(os.listdir(str(path) + ".q")) == i + 1)
    holder.release()
    assert holder.acquire(stop)  # queues behind b, c, d: gets the turn after them
    order.append("a")
    holder.release()
    for t in threads:
        t.join(5)
    assert order == ["b", "c", "d", "a"]


def test_node_turn_skips_the_entry_of_a_trainer_that_died(tmp_path):
    path = tmp_path / "n.turn"
    (tmp_path / "n.turn.q").mkdir()
    (tmp_path / "n.turn.q" / f"{1:020d}-{2**22 + 12345}-1").touch()  # older, its pid gone
    t = NodeTurn(path)
    assert t.acquire(threading.Event())
    t.release()
    assert list((tmp_path / "n.turn.q").iterdir()) == []


def test_trainers_of_a_node_ask_one_at_a_time_each_with_its_newest_window(tmp_path, monkeypatch):
    """Two trainers (ranks) share one server through the node's turn file: never two questions
    in flight, both get answers (neither starves), and each question is about the newest
    window its trainer had when its turn came."""
    monkeypatch.setenv(TURN_ENV, str(tmp_path / "node.turn"))
    gate = threading.Event()
    gate.set()
    shared = {"now": 0, "max": 0, "lock": threading.Lock()}
    backends = [GatedBackend(gate, shared, delay=0.05) for _ in range(2)]
    pols = [make(b, rank) for rank, b in enumerate(backends)]
    try:
        for i in range(12):
            for pol in pols:
                pol.observe({"global_step": 5 * i + 4}, win(i))
            time.sleep(0.02)
        # the last window is asked once its trainer's turn comes (an empty inbox is not yet that)
        wait_for(lambda: all(b.windows and "Window 11:" in b.windows[-1] for b in backends))
    finally:
        for pol in pols:
            pol.close()
    assert shared["max"] == 1, "two questions were in flight on the node's server at once"
    for b, pol in zip(backends, pols):
        recs = pol.decisions()
        assert len(b.windows) >= 2  # both trainers got turns
        assert "Window 11:" in b.windows[-1]  # the last question: about the last window
        assert any(r["reason"].startswith("dropped: a newer window") for r in recs)


def test_node_server_keeps_each_trainers_state_in_a_prompt_cache():
    """llama_cpp.server's RAM prompt cache (--cache): a trainer's next question resumes from
    its own last state instead of re-reading what the other trainer's question overwrote in
    the KV cache; its batch is small, as each kept state carries n_batch x n_vocab scores."""
    argv = AgentService("m.gguf", cache_mb=256, n_batch=128, server="llama_cpp").argv()
    assert argv[argv.index("--cache") + 1] == "true"
    assert argv[argv.index("--cache_type") + 1] == "ram"
    assert argv[argv.index("--cache_size") + 1] == str(256 << 20)
    assert argv[argv.index("--n_batch") + 1] == "128"
    assert "--cache" not in AgentService("m.gguf", server="llama_cpp").argv()
    # rudder.agent.server (the default) keeps the same states (tests/test_agent_server.py)
    argv = AgentService("m.gguf", cache_mb=256, n_batch=128).argv()
    assert argv[argv.index("--cache-mb") + 1] == "256"
    assert argv[argv.index("--n-batch") + 1] == "128"
