"""Trace generation on a small random graph (dgl.rand_graph), and the agent policy replayed
through the simulator with a scripted decision maker (no model)."""
from __future__ import annotations

import numpy as np
import pytest

from rudder.sim.simulate import simulate
from rudder.sim.tracegen import (TraceGenSpec, generate_trace, halo_of, partition_assignment,
                                 random_trace, write_tracegen)
from rudder.sim.trace import Trace


@pytest.fixture(scope="module")
def graph():
    import dgl
    import torch

    torch.manual_seed(0)
    g = dgl.rand_graph(3000, 30000)
    g.ndata["train_mask"] = torch.rand(3000) < 0.3
    return g


@pytest.mark.parametrize("method,parts", [("random", 2), ("metis", 4)])
def test_trace_from_random_graph(graph, method, parts, tmp_path):
    spec = TraceGenSpec(graph="rand", parts=parts, part=1, method=method, fanouts=[5, 10],
                        batch_size=100, epochs=2, fraction=0.25, feat_bytes=64, seed=1)
    owner = partition_assignment(graph, parts, method, 1)
    trace, facts = generate_trace(spec, g=graph, owner=owner)
    assert np.bincount(owner, minlength=parts).min() > 0
    # every recorded id is remote; minibatches are sets; the halo is the 1-hop in-neighbourhood
    assert (owner[trace.ids] != 1).all()
    for i in range(trace.num_minibatches):
        mb = trace.minibatch(i)
        assert np.unique(mb).size == mb.size
    src, dst = (x.numpy() for x in graph.edges())
    expect = np.unique(src[(owner[dst] == 1) & (owner[src] != 1)])
    assert np.array_equal(trace.halo, expect) and np.array_equal(halo_of(graph, owner, 1), expect)
    ok, _ = trace.halo_positions()
    assert ok.mean() > 0.3  # most remote inputs of a 2-hop sample are 1-hop halo nodes
    # degree init: the top in-degree halo nodes, highest first
    deg = graph.in_degrees().numpy()
    assert trace.capacity == int(0.25 * trace.num_halo) == trace.init.size
    assert deg[trace.init].min() >= np.sort(deg[trace.halo])[::-1][trace.capacity - 1]
    assert np.all(np.diff(deg[trace.init]) <= 0)
    steps = int(np.ceil((owner == 1)[graph.ndata["train_mask"].numpy()].sum() / 100))
    assert trace.num_minibatches == 2 * steps and set(trace.epoch.tolist()) == {0, 1}
    assert (trace.input_rows > trace.sizes()).all()
    assert facts["halo_nodes"] == trace.num_halo and facts["num_nodes"] == 3000
    p = write_tracegen(tmp_path, trace, spec, facts)
    assert p.name == "trace-r1.npz" and Trace.load(p).num_accesses == trace.num_accesses
    # and it replays
    r = simulate(Trace.load(p), "static")
    assert r.summary()["remote_rows"] == trace.num_accesses


def test_random_trace_shape():
    t = random_trace(halo=100, minibatches=10, batch=30, nonhalo=0.2, capacity=0.1, epochs=2, seed=0)
    assert t.num_minibatches == 10 and t.capacity == 10 and t.init.size == 10
    ok, _ = t.halo_positions()
    assert 0.6 < ok.mean() < 0.95
    assert t.epoch.tolist() == [0] * 5 + [1] * 5


# ---- the agent through the simulator ------------------------------------------------------
class ScriptedMaker:
    """Answers 'replace, small budget' on even decisions, 'keep' on odd ones."""

    def __init__(self):
        self.n = 0
        self.closed = False

    def decide(self, prompt, cancel=None):
        from rudder.agent.messages import Decision

        self.n += 1
        rep = self.n % 2 == 1
        return Decision(replace=rep, budget="small" if rep else None, expected_hit_rate="up",
                        expected_remote_rows="down", reason="scripted", model="scripted",
                        backend="test", latency_s=0.0)

    def close(self):
        self.closed = True


def test_agent_policy_replays_with_decisions():
    t = random_trace(halo=300, minibatches=60, batch=80, capacity=0.2, skew=1.0, epochs=2, seed=5)
    maker = ScriptedMaker()
    r = simulate(t, "agent", extra={"decision_maker": maker})
    assert maker.n >= 5 and maker.closed
    assert len(r.decisions) == maker.n
    applied = [d for d in r.decisions if d["applied_step"] is not None]
    assert applied and all(d["staleness"] == 1 for d in applied)  # synchronous replay
    # the start decision (the run samples ahead) steers from minibatch 0 in a synced replay
    assert r.decisions[0]["window"] == -1 and r.decisions[0]["applied_step"] == 0
    from rudder.config import AgentConfig

    off = simulate(t, "agent", extra={"decision_maker": ScriptedMaker(), "agent": AgentConfig(start_decision=False)})
    assert off.decisions[0]["window"] == 0 and len(off.decisions) == len(r.decisions) - 1
    assert r.total("admitted_rows") > 0  # the replace decisions changed the buffer
    assert r.summary()["decisions"] == maker.n


def test_trace_digest_names_the_content(tmp_path):
    t = random_trace(halo=200, minibatches=12, batch=40, capacity=0.2, epochs=2, seed=1)
    same = type(t).load(t.save(tmp_path / "t.npz"))
    assert same.digest() == t.digest() and len(t.digest()) == 12
    assert t.head(11).digest() != t.digest()
    assert random_trace(halo=200, minibatches=12, batch=40, capacity=0.2, epochs=2, seed=2).digest() != t.digest()


def test_a_folder_takes_ranks_of_one_spec_only(tmp_path):
    """Rank 1 joins rank 0 of the same spec; a rank of another spec (or an older tracegen's
    folder) is refused, naming what differs, and the folder is left as it was."""
    import json

    t = random_trace(halo=100, minibatches=6, batch=20, epochs=1, seed=1)
    spec = TraceGenSpec(graph="synth-tiny", parts=2, part=0)
    write_tracegen(tmp_path, t, spec, {})
    write_tracegen(tmp_path, t, TraceGenSpec(graph="synth-tiny", parts=2, part=1), {})
    meta = (tmp_path / "trace.json").read_text()
    with pytest.raises(ValueError, match=r"holds trace-r1.npz of another trace spec \(parts 2 here, 4 now\)"):
        write_tracegen(tmp_path, t, TraceGenSpec(graph="synth-tiny", parts=4, part=0), {})
    with pytest.raises(ValueError, match="fanouts"):
        write_tracegen(tmp_path, t, TraceGenSpec(graph="synth-tiny", parts=2, part=3, fanouts=[5]), {})
    assert (tmp_path / "trace.json").read_text() == meta and not (tmp_path / "trace-r3.npz").exists()
    (tmp_path / "trace.json").write_text(json.dumps({**json.loads(meta), "tracegen": 1}))
    with pytest.raises(ValueError, match="tracegen version 1 here"):
        write_tracegen(tmp_path, t, spec, {})


def test_cached_trace_writes_once_then_reads_back(tmp_path):
    from rudder.sim.tracegen import TraceGenSpec, cached_trace

    spec = TraceGenSpec(graph="synth-tiny", parts=2, part=0, epochs=1, fraction=1.0, init="degree")
    first = cached_trace(spec, tmp_path / "t")
    written = tmp_path / "t" / "trace-r0.npz"
    assert written.is_file()
    mtime = written.stat().st_mtime_ns
    again = cached_trace(spec, tmp_path / "t")
    assert written.stat().st_mtime_ns == mtime  # read, not regenerated
    assert (again.offsets == first.offsets).all() and (again.ids == first.ids).all()
    # a cache an older tracegen wrote (no version in trace.json) is sampled again
    meta = tmp_path / "t" / "trace.json"
    meta.write_text(meta.read_text().replace('"tracegen"', '"tracegen_old"'))
    third = cached_trace(spec, tmp_path / "t")
    assert written.stat().st_mtime_ns != mtime and '"tracegen": 2' in meta.read_text()
    assert third.digest() == first.digest()  # the same spec, the same trace


TRACE = """
import dgl
from rudder.sim.tracegen import TraceGenSpec, generate_trace
threads = dgl.utils.get_num_threads()
spec = TraceGenSpec(graph="synth-small", parts=4, part=1, fanouts=[5, 10], batch_size=500,
                    epochs=2, max_steps_per_epoch=6, seed=3)
trace, _ = generate_trace(spec)
print(trace.digest(), threads, dgl.utils.get_num_threads())
"""


@pytest.mark.slow
def test_a_spec_gives_one_trace_in_every_process():
    """METIS seeded (rudder.data.metis), the shuffle and the sampler's draws seeded on the calling
    thread: a spec's trace is the same in two fresh processes (DGL's DataLoader shuffled with
    numpy's global RNG and sampled on a thread no seed reached), and DGL's thread count is
    restored after sampling."""
    import subprocess
    import sys

    out = [subprocess.run([sys.executable, "-c", TRACE], capture_output=True, text=True,
                          check=True).stdout.split() for _ in range(2)]
    assert out[0][0] == out[1][0]
    assert out[0][1] == out[0][2]  # sampling's one thread given back
    other = subprocess.run([sys.executable, "-c", TRACE.replace("seed=3", "seed=4")],
                           capture_output=True, text=True, check=True).stdout.split()
    assert other[0] != out[0][0]
