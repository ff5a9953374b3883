"""NodeGate (rudder.workflow.gate), the study's own admission for MPI executors: a task reaches
Parsl only once its dependencies are done and its nodes fit the block, so Parsl's MPI backlog
(whose recursion drops results) is never used. Plain futures stand in for Parsl's here; the
multi-node Slurm test (test_slurm_multinode.py) runs it against the real executor."""
from __future__ import annotations

import concurrent.futures as cf
from types import SimpleNamespace

import pytest

from rudder.workflow.gate import GateError, NodeGate, gate_apps


class FakeParsl:
    """Records launches; each returns a future the test completes."""

    def __init__(self):
        self.launched: list[tuple[str, int, cf.Future]] = []

    def launcher(self, name: str, nodes: int):
        def launch():
            f = cf.Future()
            f.task_record = {"status": SimpleNamespace(name="launched"), "name": name}
            self.launched.append((name, nodes, f))
            return f
        return launch

    def names(self) -> list[str]:
        return [n for n, _, _ in self.launched]

    def finish(self, name: str, value=None, exc=None) -> None:
        (f,) = [f for n, _, f in self.launched if n == name]
        f.set_exception(exc) if exc else f.set_result(value if value is not None else name)


def test_gate_holds_what_does_not_fit_and_backfills():
    p, g = FakeParsl(), NodeGate(capacity=4, slots=3, label="gpu")
    futs = {n: g.submit(k, [], p.launcher(n, k))
            for n, k in [("a2", 2), ("b2", 2), ("c4", 4), ("d1", 1)]}
    assert p.names() == ["a2", "b2"]  # c4 and d1 would have to wait in Parsl's backlog
    assert futs["c4"].task_record is None and not futs["c4"].done()
    p.finish("a2")
    assert futs["a2"].result() == "a2"
    assert futs["a2"].task_record["name"] == "a2"
    assert p.names() == ["a2", "b2", "d1"]  # c4 still does not fit (2 free); d1 does
    p.finish("b2")
    assert p.names() == ["a2", "b2", "d1"]  # 3 free: still not c4
    p.finish("d1")
    assert p.names()[-1] == "c4"
    p.finish("c4")
    assert all(f.result() == n for n, f in futs.items())
    assert g.peak_nodes == 4 and g.nodes_in_flight == 0 and g.in_flight == 0 and g.held == 0


def test_gate_respects_slots_dependencies_and_failures():
    p, g = FakeParsl(), NodeGate(capacity=8, slots=2)
    dep = cf.Future()
    a = g.submit(1, [dep], p.launcher("a", 1))
    b = g.submit(1, [], p.launcher("b", 1))
    c = g.submit(1, [], p.launcher("c", 1))
    d = g.submit(1, [], p.launcher("d", 1))
    assert p.names() == ["b", "c"]  # a waits for its dependency, d for a slot
    dep.set_result(None)
    assert p.names() == ["b", "c"]  # no slot free yet
    p.finish("b", exc=RuntimeError("run failed"))
    with pytest.raises(RuntimeError, match="run failed"):
        b.result()
    assert p.names() == ["b", "c", "a"]  # the failure freed its slot; a is first in line
    p.finish("a"), p.finish("c")
    p.finish("d")
    assert d.result() == "d" and a.result() == "a"


def test_task_bigger_than_block_fails_naming_the_numbers():
    p, g = FakeParsl(), NodeGate(capacity=4, slots=4, label="gpu")
    f = g.submit(8, [], p.launcher("big", 8))
    with pytest.raises(GateError, match="asks for 8 nodes but a block has 4"):
        f.result(timeout=1)
    assert p.names() == []


def test_a_launch_that_raises_frees_its_nodes():
    p, g = FakeParsl(), NodeGate(capacity=2, slots=2)

    def boom():
        raise ValueError("submit refused")
    f = g.submit(2, [], boom)
    with pytest.raises(ValueError, match="submit refused"):
        f.result(timeout=1)
    g.submit(2, [], p.launcher("next", 2))
    assert p.names() == ["next"]


def test_gate_apps_routes_only_mpi_executors():
    from rudder.workflow.execution import parse_execution

    ex = parse_execution({
        "executors": {
            "mpi": {"type": "MPIExecutor", "max_workers": 2, "provider": {
                "type": "SlurmProvider", "nodes_per_block": 4}},
            "local": {"type": "ThreadPoolExecutor"}},
        "apps": {"train": "mpi", "stage": "local"}})
    calls = []

    def app(name):
        def call(*args, parsl_resource_specification=None, **kw):
            inputs = kw.pop("inputs", [])
            calls.append((name, args, list(inputs), parsl_resource_specification, kw))
            f = cf.Future()
            f.set_result(name)
            return f
        return call

    apps = SimpleNamespace(train=app("train"), stage=app("stage"))
    gated = gate_apps(apps, ex)
    assert gated.stage is apps.stage and set(gated.gates) == {"mpi"}
    assert gated.gates["mpi"].capacity == 4 and gated.gates["mpi"].slots == 2
    part = cf.Future()
    out = gated.train({"c": 1}, "run1", inputs=[part], timeout_s=5,
                      parsl_resource_specification={"num_nodes": 4})
    assert calls == []  # its partition is not done
    part.set_result(None)
    assert out.result(timeout=1) == "train"
    assert calls == [("train", ({"c": 1}, "run1"), [part], {"num_nodes": 4}, {"timeout_s": 5})]
    calls.clear()  # an app called without inputs gets none (stage_dataset takes no `inputs`)
    assert gated.train("x", parsl_resource_specification={"num_nodes": 1}).result(1) == "train"
    assert calls == [("train", ("x",), [], {"num_nodes": 1}, {})]
