"""Never hand Parsl's MPI executor a task that would have to wait for nodes.

Parsl's MPIExecutor (2026.10.26) puts a task that does not fit the block's free nodes in a
backlog. When a result comes back and a backlogged task still does not fit,
`MPITaskScheduler._schedule_backlog_tasks` puts it back and calls itself again, until
RecursionError; the worker pool logs "Failed to send result to interchange" and drops the result
it had just taken, so that task's future never completes (four 4-node runs on an 8-node block
are enough).

So the study schedules its own MPI tasks: each app call routed to an MPI executor is held here
until its dependencies are done and it fits (nodes of the tasks in flight + its own <=
nodes_per_block, and fewer than max_workers in flight); only then is it submitted to Parsl, where
it starts at once. Its nodes are released when its future completes (the pool returns a task's
nodes before it sends the result, and Parsl's retries happen before the future completes). Held
tasks start first-fit in submission order: a small run may start before a big one that waits.
With max_blocks > 1 the interchange may send any task to any block, so the gate still admits
one block's worth in total. A Globus MPI endpoint's block is not known here: not gated.

    apps = gate_apps(make_apps(ex.route), ex)     # same calls, same futures (cf.Future)
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

log = logging.getLogger("rudder.workflow")


class GateError(Exception):
    """A task asks for more nodes than a block has: it could never start."""


class GatedFuture(cf.Future):
    """The caller's future of a held task; `task_record` is Parsl's once it is submitted."""

    inner: Any = None

    @property
    def task_record(self) -> Any:
        return getattr(self.inner, "task_record", None)


@dataclass
class _Held:
    nodes: int
    deps: list
    launch: Callable[[], cf.Future]
    out: GatedFuture = field(default_factory=GatedFuture)


class NodeGate:
    """Admission for one MPI executor: `capacity` nodes (its block's), `slots` tasks at once."""

    def __init__(self, capacity: int, slots: int, label: str = "mpi"):
        if capacity < 1 or slots < 1:
            raise ValueError(f"capacity and slots must be >= 1, got {capacity}, {slots}")
        self.capacity, self.slots, self.label = capacity, slots, label
        self._lock = threading.RLock()
        self._held: list[_Held] = []
        self.nodes_in_flight = 0
        self.in_flight = 0
        self.peak_nodes = 0  # the most nodes ever in flight (tests check it never exceeds)

    def submit(self, nodes: int, deps: list, launch: Callable[[], cf.Future]) -> GatedFuture:
        """`launch()` submits the task to Parsl; it is called once `deps` are done and `nodes`
        fit. A task bigger than the block fails at once (GateError naming the numbers)."""
        h = _Held(int(nodes), [d for d in deps if isinstance(d, cf.Future)], launch)
        if h.nodes > self.capacity:
            h.out.set_exception(GateError(
                f"executor {self.label}: a task asks for {h.nodes} nodes but a block has "
                f"{self.capacity} (nodes_per_block): it could never start"))
            return h.out
        with self._lock:
            self._held.append(h)
        for d in h.deps:
            d.add_done_callback(lambda _f: self._pump())
        self._pump()
        return h.out

    @property
    def held(self) -> int:
        return len(self._held)

    def _pump(self) -> None:
        with self._lock:
            ready = []
            for h in list(self._held):
                if not all(d.done() for d in h.deps):
                    continue
                if self.in_flight >= self.slots or self.nodes_in_flight + h.nodes > self.capacity:
                    continue  # a later, smaller task may still fit
                self._held.remove(h)
                self.in_flight += 1
                self.nodes_in_flight += h.nodes
                self.peak_nodes = max(self.peak_nodes, self.nodes_in_flight)
                ready.append(h)
        failed = False
        for h in ready:  # outside the lock: Parsl may call back into us from its own threads
            try:
                h.out.inner = h.launch()
            except BaseException as exc:  # noqa: BLE001 (handed to the caller's future)
                self._release(h)
                h.out.set_exception(exc)
                failed = True
                continue
            h.out.inner.add_done_callback(lambda f, h=h: self._finished(h, f))
        if failed:
            self._pump()

    def _release(self, h: _Held) -> None:
        with self._lock:
            self.in_flight -= 1
            self.nodes_in_flight -= h.nodes

    def _finished(self, h: _Held, inner: cf.Future) -> None:
        self._release(h)  # before the caller sees it: its dependents find the nodes free
        if inner.cancelled():
            h.out.cancel()
        elif inner.exception() is not None:
            h.out.set_exception(inner.exception())
        else:
            h.out.set_result(inner.result())
        self._pump()


def gate_apps(apps: Any, ex: Any) -> Any:
    """`apps` (make_apps) with every app routed to an MPI executor going through that
    executor's NodeGate (nodes_per_block, max_workers); other apps unchanged."""
    from rudder.workflow.execution import MpiModel

    gates = {label: NodeGate(getattr(m.provider, "nodes_per_block", 1), m.max_workers, label)
             for label, m in ex.executors.items() if isinstance(m, MpiModel)}

    def wrap(name: str, app: Callable) -> Callable:
        gate = gates.get(ex.route(name))
        if gate is None:
            return app

        def call(*args, parsl_resource_specification=None, **kwargs):
            spec = dict(parsl_resource_specification or {})
            deps = [*kwargs.get("inputs", ()), *args, *kwargs.values()]
            return gate.submit(spec.get("num_nodes", 1), deps, lambda: app(
                *args, parsl_resource_specification=spec, **kwargs))

        return call

    out = SimpleNamespace(**{name: wrap(name, app) for name, app in vars(apps).items()})
    out.gates = gates
    return out
