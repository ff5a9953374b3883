"""Per-machine supervisor: `python -m rudder.cluster.machine PLAN.json`.

One runs per emulated machine, inside that machine's network namespace and private /dev/shm
(LocalCluster starts it as `ip netns exec NS unshare -m --propagation private sh -c 'mount -t
tmpfs tmpfs /dev/shm && exec python -m rudder.cluster.machine PLAN'`), so every process it starts
shares that machine's address and shared memory: trainers map the partition the server put there.

Sequence (every wait bounded by the plan's start deadline):
  0. machine 0: bind the rendezvous store's socket on this machine's address (loopback in a
     loopback run) and start the store (rudder.cluster.store) on it: the port is held from the
     bind to the end of the run, never checked and bound later;
  1. start the DGL server; wait until it listens on the DGL port — a listening socket owned by
     this server process, not just any on that port (another run's would not do); touch
     <ready>/server<m>;
  2. start the per-machine services (e.g. the agent's model server on this node's loopback);
     with `wait_services`, wait until each wrote its $RUDDER_READY_FILE; service 0's file holds
     its URL, which the trainers get as RUDDER_AGENT_URL;
  3. wait until every machine's server is listening (files <ready>/server<j>): trainers started
     earlier would sit in DGL's connect loop, which sleeps seconds between tries;
  4. start the trainers; touch <ready>/trainers<m>;
  5. watch: the machine is done when all its trainers exited 0 and its server exited 0 (a DGL
     server leaves once every client of the cluster has disconnected); services are then stopped.

With the plan's `cpus`, the supervisor pins itself to those cores first: its children inherit them.

Any child exiting non-zero (other than after we asked it to stop), a missed start deadline, a
SIGTERM/SIGINT/SIGHUP, or the death of the owner (the LocalCluster process) ends the machine: all
children get SIGTERM, then SIGKILL after the grace period. The status file (JSON, rewritten
atomically at every change) holds each child's pid, exit code and log, and the first failure.

Supervisor exit codes: 0 done, 1 a child failed, 2 start-up failed, 3 stopped by a signal,
4 owner gone, 70 internal error. This module imports only the standard library.
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rudder.cluster.exits import describe_exit
from rudder.listeners import listens

EXIT_OK, EXIT_CHILD_FAILED, EXIT_START_FAILED, EXIT_SIGNALLED, EXIT_OWNER_GONE = 0, 1, 2, 3, 4
EXIT_INTERNAL = 70
TICK_S = 0.25  # upper bound between checks; child exits and signals wake us at once


class Stop(Exception):
    """Ends the machine: `reason` goes into the status file, `code` is the supervisor's exit."""

    def __init__(self, reason: str, code: int):
        super().__init__(reason)
        self.reason, self.code = reason, code


class Child:
    def __init__(self, spec: dict):
        self.spec = spec
        self.key: str = spec["key"]  # "machine0/trainer1"
        self.label: str = spec["label"]  # "trainer 1 on machine 0"
        self.role: str = spec["role"]  # server | service | trainer
        self.popen: subprocess.Popen | None = None
        self.pidfd: int | None = None
        self.returncode: int | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.stopped = False  # we sent it a signal: its exit code is not a failure
        self.pass_fds: tuple[int, ...] = ()  # inherited descriptors (the store's socket)
        self.cpu: tuple[float, float] | None = None  # (user, sys) CPU seconds, once reaped

    @property
    def running(self) -> bool:
        return self.popen is not None and self.returncode is None

    def start(self) -> None:
        env = {**os.environ, **self.spec.get("env", {})}
        Path(self.spec["log"]).parent.mkdir(parents=True, exist_ok=True)
        with open(self.spec["log"], "ab") as out:
            self.popen = subprocess.Popen(self.spec["argv"], env=env, stdin=subprocess.DEVNULL,
                                          stdout=out, stderr=subprocess.STDOUT,
                                          cwd=self.spec.get("cwd"), pass_fds=self.pass_fds)
        self.started_at = time.time()
        try:
            self.pidfd = os.pidfd_open(self.popen.pid)
        except (AttributeError, OSError):  # no pidfd (old kernel): the tick bounds the latency
            self.pidfd = None

    def poll(self) -> bool:
        """Reaps the child; True when it has just been seen to exit."""
        if self.popen is None or self.returncode is not None:
            return False
        code = self.popen.poll()
        if code is None:
            return False
        self.returncode, self.ended_at = code, time.time()
        self.cpu = _reaped_cpu()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        return True

    def signal(self, sig: int) -> None:
        if self.running:
            self.stopped = True
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def status(self) -> dict:
        return {"key": self.key, "label": self.label, "role": self.role,
                "rank": self.spec.get("rank"), "pid": self.popen.pid if self.popen else None,
                "returncode": self.returncode, "stopped": self.stopped,
                "started_at": self.started_at, "ended_at": self.ended_at, "log": self.spec["log"],
                **({"cpu_user_s": self.cpu[0], "cpu_sys_s": self.cpu[1]} if self.cpu else {})}


_children_cpu = [0.0, 0.0]  # this process's reaped children's (user, sys) CPU seen so far


def _reaped_cpu() -> tuple[float, float]:
    """The CPU of the child reaped just now, with its own reaped descendants (a trainer's sampler
    processes): the growth of RUSAGE_CHILDREN since the last reap. Children are reaped one at a
    time by this thread's polls, so each growth is one child's."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    got = (ru.ru_utime - _children_cpu[0], ru.ru_stime - _children_cpu[1])
    _children_cpu[:] = [ru.ru_utime, ru.ru_stime]
    return got


class Supervisor:
    def __init__(self, plan: dict):
        self.plan = plan
        self.m: int = plan["machine"]
        self.children = [Child(spec) for spec in plan["procs"]]
        self.ready = Path(plan["ready_dir"])
        self.status_path = Path(plan["status_path"])
        self.phase = "init"
        self.failure: dict | None = None
        self.signalled: int | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)

    # -- plumbing ------------------------------------------------------------------------------

    def log(self, msg: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime())
        print(f"{stamp} machine {self.m} [{self.phase}] {msg}", flush=True)

    def _on_signal(self, signum, _frame) -> None:
        if self.signalled is None:
            self.signalled = signum

    def install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        try:  # SIGTERM when the owner dies (the parent of this process is the owner itself)
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() != self.plan["owner_pid"]:
            raise Stop("owner process gone before the machine started", EXIT_OWNER_GONE)

    def write_status(self) -> None:
        data = {"machine": self.m, "addr": self.plan["addr"], "phase": self.phase,
                "pid": os.getpid(), "failure": self.failure,
                "procs": [c.status() for c in self.children], "updated_at": time.time()}
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.status_path)

    def role(self, role: str) -> list[Child]:
        return [c for c in self.children if c.role == role]

    def tick(self, timeout: float = TICK_S) -> None:
        """Waits up to `timeout` for a child exit or a signal, then raises Stop when the machine
        must end. A child that exits 0 is fine at any time."""
        fds = [self._wake_r] + [c.pidfd for c in self.children if c.pidfd is not None]
        try:
            select.select(fds, [], [], max(0.0, timeout))
        except InterruptedError:
            pass
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass
        changed = False
        for c in self.children:
            if c.poll():
                changed = True
                self.log(f"{c.label} (pid {c.popen.pid}) {describe_exit(c.returncode)}")
                if c.returncode != 0 and not c.stopped:
                    self.fail(f"{c.label} {describe_exit(c.returncode)}", c.ended_at)
                    raise Stop(self.failure["reason"], EXIT_CHILD_FAILED)
        if changed:
            self.write_status()
        if self.signalled is not None:
            name = signal.Signals(self.signalled).name
            raise Stop(f"machine {self.m} supervisor received {name}", EXIT_SIGNALLED)
        if os.getppid() != self.plan["owner_pid"]:
            raise Stop(f"owner process {self.plan['owner_pid']} gone", EXIT_OWNER_GONE)

    def fail(self, reason: str, at: float | None = None) -> None:
        if self.failure is None:
            self.failure = {"reason": reason, "time": at or time.time(), "phase": self.phase}

    def wait_until(self, cond, what) -> None:
        """Ticks until `cond()`; past the start deadline raises Stop naming `what` (a string or
        a function giving one, evaluated then)."""
        deadline = self.plan["start_deadline"]
        while not cond():
            left = deadline - time.time()
            if left <= 0:
                what = what() if callable(what) else what
                waited = time.time() - self.plan["launched_at"]
                raise Stop(f"start-up timeout on machine {self.m} after {waited:.0f} s: {what}",
                           EXIT_START_FAILED)
            self.tick(min(TICK_S, left))

    def touch(self, name: str) -> None:
        """Marks a step as done for the owner and the other machines (atomically: a reader
        never sees an empty file)."""
        tmp = self.ready / f".{name}.tmp"
        tmp.write_text(f"{time.time()}\n")
        tmp.replace(self.ready / name)

    def start(self, child: Child) -> None:
        child.start()
        self.log(f"started {child.label} (pid {child.popen.pid}): {' '.join(child.spec['argv'])}")
        self.write_status()

    # -- the sequence --------------------------------------------------------------------------

    def run(self) -> int:
        code = EXIT_OK
        try:
            self.install_signals()
            self.main()
        except Stop as stop:
            self.fail(stop.reason)
            code = stop.code
            self.log(f"stopping: {stop.reason}")
        except Exception as exc:  # a bug here must still stop the children
            self.fail(f"machine {self.m} supervisor error: {exc!r}")
            code = EXIT_INTERNAL
            self.log(f"internal error: {exc!r}")
        self.write_status()  # the owner learns of the failure now, not after the grace period
        self.stop_children([c for c in self.children if c.running])
        self.phase = "done" if code == EXIT_OK else "failed"
        self.write_status()
        self.log(f"exit {code}")
        return code

    def start_store(self, store: Child) -> None:
        """Binds the store's socket (MASTER_PORT 0: a free port, told to this machine's
        trainers), listens, and hands it to the store process: held, never re-bound."""
        addr = store.spec["env"]["MASTER_ADDR"]
        port = int(store.spec["env"]["MASTER_PORT"])
        if port == 0 and self.plan["num_machines"] > 1:
            raise Stop("rendezvous port 0 (any) with several machines: the others could not "
                       "know it", EXIT_START_FAILED)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr, port))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            raise Stop(f"cannot bind the rendezvous store on {addr}:{port} on machine {self.m}: "
                       f"{exc}", EXIT_START_FAILED) from None
        port = sock.getsockname()[1]
        for c in [store, *self.role("trainer")]:
            c.spec["env"]["MASTER_PORT"] = str(port)
        store.spec["env"]["RUDDER_STORE_FD"] = str(sock.fileno())
        store.pass_fds = (sock.fileno(),)
        try:
            self.start(store)
        finally:
            sock.close()  # the store holds it now

    def main(self) -> None:
        port = self.plan["dgl_port"]
        self.phase = "store"
        for store in self.role("store"):
            self.start_store(store)
        self.phase = "server"
        for server in self.role("server"):
            self.start(server)

            def listening(server=server) -> bool:
                if server.returncode is not None:  # exited 0 without ever listening
                    raise Stop(f"{server.label} exited before listening on port {port}",
                               EXIT_START_FAILED)
                return listens(server.popen.pid, port)

            self.wait_until(listening, f"DGL server not listening on {self.plan['addr']}:{port}")
        self.touch(f"server{self.m}")
        self.phase = "services"
        for svc in self.role("service"):
            self.start(svc)
        if self.plan.get("wait_services"):
            for svc in self.role("service"):
                ready = Path(svc.spec["env"]["RUDDER_READY_FILE"])
                self.wait_until(ready.exists, f"{svc.label} did not create {ready}")
            url = self._service_url()
            if url:  # the run's own service, at the address and port it bound
                for tr in self.role("trainer"):
                    tr.spec["env"]["RUDDER_AGENT_URL"] = url
        self.phase = "barrier"
        n = self.plan["num_machines"]

        def missing() -> list[str]:
            return [str(j) for j in range(n) if not (self.ready / f"server{j}").exists()]

        self.wait_until(lambda: not missing(),
                        lambda: f"no DGL server listening yet on machine(s) {', '.join(missing())}")
        self.phase = "trainers"
        for tr in self.role("trainer"):
            self.start(tr)
        self.touch(f"trainers{self.m}")
        self.phase = "running"
        self.log("all processes started")
        core = self.role("trainer") + self.role("server")
        while any(c.returncode is None for c in core):
            self.tick()
        self.phase = "finishing"
        self.stop_children([c for c in self.role("service") + self.role("store") if c.running])

    def _service_url(self) -> str | None:
        """What service 0 wrote to its ready file, when that is a URL."""
        services = self.role("service")
        if not services:
            return None
        try:
            text = Path(services[0].spec["env"]["RUDDER_READY_FILE"]).read_text().strip()
        except OSError:
            return None
        return text if text.startswith(("http://", "https://")) else None

    def stop_children(self, children: list[Child]) -> None:
        """SIGTERM, then SIGKILL after the grace period; reaps them all (bounded)."""
        if not children:
            return
        for c in children:
            c.signal(signal.SIGTERM)
        deadline = time.time() + self.plan["kill_grace_s"]
        while any(c.running for c in children) and time.time() < deadline:
            time.sleep(0.05)
            for c in children:
                c.poll()
        for c in children:
            if c.running:
                self.log(f"{c.label} ignored SIGTERM for {self.plan['kill_grace_s']} s: SIGKILL")
                c.signal(signal.SIGKILL)
        deadline = time.time() + 5.0
        while any(c.running for c in children) and time.time() < deadline:
            time.sleep(0.02)
            for c in children:
                c.poll()
        for c in children:
            if c.returncode is not None:
                self.log(f"{c.label} stopped ({describe_exit(c.returncode)})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m rudder.cluster.machine PLAN.json", file=sys.stderr)
        return 64
    plan = json.loads(Path(argv[0]).read_text())
    if plan.get("cpus"):  # every child (server, services, trainers, samplers) inherits it
        os.sched_setaffinity(0, plan["cpus"])
    return Supervisor(plan).run()


if __name__ == "__main__":
    sys.exit(main())
