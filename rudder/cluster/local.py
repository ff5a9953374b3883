"""LocalCluster: N emulated machines on one host, for real DistDGL runs (see the package docstring
for the picture and the API)."""
from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import random
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from rudder.child_env import with_this_rudder
from rudder.cluster import netns as nets
from rudder.cluster.exits import describe_exit

log = logging.getLogger("rudder.cluster")

LOOPBACK = "127.0.0.1"
# Inherited variables that would confuse a child about its role; LocalCluster sets its own.
# (Other DGL_*/RUDDER_* settings, e.g. DGL_DIST_MAX_TRY_TIMES, pass through.)
_ROLE_VARS = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "GLOO_SOCKET_IFNAME", "DGL_ROLE", "DGL_SERVER_ID", "DGL_IP_CONFIG", "DGL_NUM_SERVER",
    "DGL_NUM_CLIENT", "DGL_CONF_PATH", "DGL_GRAPH_FORMAT", "DGL_DIST_MODE", "DGL_NUM_SAMPLER",
    "DGL_GROUP_ID", "RUDDER_MACHINE_ID", "RUDDER_NUM_MACHINES", "RUDDER_MACHINE_ADDR",
    "RUDDER_ADDRESSES", "RUDDER_RUN_DIR", "RUDDER_IP_CONFIG", "RUDDER_SERVICE_ID", "RUDDER_DGL_MACHINE_ADDR",
    "RUDDER_READY_FILE", "RUDDER_STORE_FD", "RUDDER_THREADS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT"})


class ClusterError(RuntimeError):
    """The cluster cannot be set up as asked (the message says why and what to change)."""


@dataclass
class ClusterSpec:
    machines: int  # emulated machines (one DGL server + partition each)
    trainers_per_machine: int = 1
    samplers_per_trainer: int = 0  # DistDGL sampler processes per trainer (each a DGL client)
    bandwidth: str | None = None  # tbf rate per machine link ("1gbit", "200mbit"); None = unshaped
    # [(t_s, rate), ...]: each link's rate changes to `rate` t_s seconds after a run's machines
    # are launched (LinkScheduler); before the first entry the link runs at `bandwidth`
    bandwidth_schedule: list | None = None
    netns: bool | None = None  # None: namespaces when usable (root), else loopback (loopback_addresses)
    start_timeout_s: float = 120.0  # launch -> every server listening and every trainer started
    run_timeout_s: float = 1800.0  # launch -> every machine done; the run is torn down past it
    dgl_port: int = 30050  # DGL server port on each machine (per namespace: no clash between runs)
    master_port: int = 29500  # torch.distributed rendezvous on machine 0 (loopback: any free)
    # machine 0 hosts the trainers' torch.distributed store (rudder.cluster.store) on a socket
    # its supervisor binds and holds; False for trainers that do not use torch.distributed
    rendezvous: bool = True
    kill_grace_s: float = 5.0  # SIGTERM -> SIGKILL
    wait_services: bool = False  # trainers start after each service touched $RUDDER_READY_FILE
    graph_format: str = "csc"  # DGL_GRAPH_FORMAT of the servers
    prefix: str = nets.DEFAULT_PREFIX  # name prefix of namespaces and links (1-4 letters)
    # cores the run's processes (servers, trainers, samplers) are pinned to; None: every core
    # this process may use. A study's agent node service pinned to cores of its own passes the
    # rest here, so the trainers stay off the model's cores (rudder.runner)
    cpus: list[int] | None = None

    def __post_init__(self) -> None:
        if self.machines < 1 or self.trainers_per_machine < 1:
            raise ValueError("machines and trainers_per_machine must be >= 1")
        if self.start_timeout_s <= 0 or self.run_timeout_s <= 0 or self.kill_grace_s < 0:
            raise ValueError("timeouts must be > 0 and kill_grace_s >= 0")
        nets.check_prefix(self.prefix)
        if self.bandwidth is not None:
            nets.parse_rate(self.bandwidth)
        if self.bandwidth_schedule is not None:
            self.bandwidth_schedule = nets.check_schedule(self.bandwidth_schedule)
        if self.cpus is not None:
            self.cpus = sorted(set(self.cpus))
            if not self.cpus or any(not isinstance(c, int) or c < 0 for c in self.cpus):
                raise ValueError(f"cpus must be a non-empty list of core ids >= 0, got {self.cpus}")

    @classmethod
    def from_config(cls, cfg, **overrides) -> "ClusterSpec":
        """From rudder.config.ClusterConfig (or any object/dict with these field names)."""
        data = cfg if isinstance(cfg, dict) else cfg.model_dump()
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in {**data, **overrides}.items() if k in names})


@dataclass
class ProcessResult:
    key: str  # "machine0/trainer1"
    label: str  # "trainer 1 on machine 0"
    machine: int
    role: str  # server | service | trainer
    rank: int | None
    pid: int | None
    returncode: int | None  # None: never started or never reaped
    stopped: bool  # ended by the supervisor's SIGTERM/SIGKILL (teardown), not by itself
    log: str


@dataclass
class ClusterResult:
    ok: bool
    reason: str  # "" when ok; else what ended the run, e.g. "trainer 1 on machine 0 exited ..."
    wall_s: float  # launch -> all processes gone
    startup_s: float | None  # launch -> every trainer started (None: start-up never completed)
    processes: list[ProcessResult]
    machine_codes: list[int | None]  # supervisor exit codes (see rudder.cluster.machine)
    addresses: list[str]
    netns: bool
    run_dir: str
    cluster: str  # network tag ("rdr3fa9c1"), "" without namespaces
    # the bandwidth schedule's changes as applied (LinkScheduler.changes): t_s scheduled,
    # applied_s after launch, at (epoch seconds), rate, error (None when tc took it)
    link_changes: list[dict] = dataclasses.field(default_factory=list)

    @property
    def exit_codes(self) -> dict[str, int | None]:
        return {p.key: p.returncode for p in self.processes}

    @property
    def logs(self) -> dict[str, str]:
        return {p.key: p.log for p in self.processes}

    def summary(self, tail_lines: int = 15) -> str:
        """The reason plus the last lines of every log of a process that failed."""
        lines = [f"ok={self.ok} wall={self.wall_s:.1f}s reason={self.reason or '-'}"]
        for p in self.processes:
            lines.append(f"  {p.label}: {p.returncode}{' (stopped)' if p.stopped else ''}")
            if p.returncode not in (0, None) and not p.stopped and Path(p.log).exists():
                tail = Path(p.log).read_text(errors="replace").splitlines()[-tail_lines:]
                lines += [f"    | {t}" for t in tail]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_LIVE: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for cluster in list(_LIVE):
        cluster.close()


def loopback_addresses(machines: int) -> list[str]:
    """Machine addresses on this host's loopback: 127.0.0.1 for one machine; for several, one
    per machine in a 127.A.B.0/24 of this cluster's own (Linux routes all of 127/8 to `lo`), so
    each machine's DGL server listens on its own address and runs side by side rarely meet."""
    if machines == 1:
        return [LOOPBACK]
    if machines > 254:
        raise ClusterError(f"{machines} machines on loopback: at most 254")
    a, b = random.randrange(1, 255), random.randrange(256)
    return [f"127.{a}.{b}.{m + 1}" for m in range(machines)]


def hold_ports(hosts: list[str], tries: int = 20) -> list[socket.socket]:
    """One port, free on every one of `hosts`, held on each (hold_port); the DGL servers of all
    machines listen on the same port (ip_config has one port)."""
    for _ in range(tries):
        held = [hold_port(hosts[0])]
        port = held[0].getsockname()[1]
        try:
            for h in hosts[1:]:
                held.append(hold_port(h, port))
            return held
        except OSError:
            for s in held:
                s.close()
    raise ClusterError(f"no port free on all of {', '.join(hosts)} after {tries} tries")


def hold_port(host: str = LOOPBACK, port: int = 0) -> socket.socket:
    """A port of `host` bound and held (not listening) for a run's lifetime: SO_REUSEADDR lets
    the process that serves it (the DGL server, which sets it too) bind and listen there, while
    any other socket's bind fails and the kernel never hands the port out for bind(0). Close it
    when the run is over. (Checking a port and binding it later lets two runs pick the same.)"""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.set_inheritable(False)
    s.bind((host, port))
    return s


class LinkScheduler(threading.Thread):
    """Changes the rate of every machine link of `net` at the times of a bandwidth schedule,
    counted from `t0` (time.time() of the run's launch). Each change is appended to `changes`
    and, flushed, to `log_path` (JSON lines: a killed run keeps what happened). `stop()` ends it
    at once: no change happens after the run it belongs to."""

    def __init__(self, net: nets.ClusterNet, schedule: list[tuple[float, str]], t0: float,
                 log_path: Path):
        super().__init__(name=f"link-schedule-{net.tag}", daemon=True)
        self.net, self.schedule, self.t0, self.log_path = net, schedule, t0, log_path
        self.changes: list[dict] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        mono0 = time.monotonic() - (time.time() - self.t0)  # t0 on the monotonic clock
        for t_s, rate in self.schedule:
            if self._stop_event.wait(max(0.0, mono0 + t_s - time.monotonic())):
                return
            error = None
            try:
                nets.set_rate(self.net, rate)
            except nets.NetnsError as exc:  # recorded, not raised: the run goes on at the old rate
                error = str(exc)
                log.warning("cluster %s: link rate change to %s failed: %s", self.net.tag, rate, exc)
            now = time.time()
            rec = {"t_s": t_s, "rate": rate, "applied_s": round(now - self.t0, 3), "at": now,
                   "error": error}
            self.changes.append(rec)
            with open(self.log_path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            log.info("cluster %s: links at %s (t=%.1f s)", self.net.tag, rate, now - self.t0)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=2 * nets.CMD_TIMEOUT_S)


class LocalCluster:
    """N emulated machines on this host. Use as a context manager: the network exists from
    `__enter__` (or `start()`) to `__exit__` (or `close()`); `run()` may be called several times
    in between and always returns with every process of that run gone."""

    def __init__(self, spec: ClusterSpec, run_dir: str | Path):
        self.spec = spec
        self.run_dir = Path(run_dir).resolve()
        self.net: nets.ClusterNet | None = None
        self.use_netns: bool | None = None
        self._addresses: list[str] = []
        self._procs: list[subprocess.Popen] = []  # supervisors of the run in progress
        self.loopback = False  # machines on this host's shared loopback (no namespaces)
        self._held: list[socket.socket] = []  # ports of the run in progress (hold_port)
        self._lock = threading.Lock()
        self._closed = False
        self.net_setup_s: float | None = None
        # Optional: check(statuses) -> reason ("" while the run makes progress); see watchdog.py.
        self.watchdog = None
        self.link_scheduler: LinkScheduler | None = None  # the run in progress's, if scheduled

    # -- network lifetime ----------------------------------------------------------------------

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "LocalCluster":
        """Decides namespaces or loopback, removes stale leftovers, builds the network."""
        with self._lock:
            if self._closed:
                raise ClusterError("cluster already closed")
            if self.use_netns is not None:
                return self
            spec = self.spec
            self.use_netns = self._decide_netns()
            _LIVE.add(self)
            if not self.use_netns:
                self._addresses = loopback_addresses(spec.machines)
                self.loopback = True
                return self
            t0 = time.monotonic()
            removed = nets.cleanup_stale(spec.prefix)
            if removed:
                log.info("removed leftovers of crashed clusters: %s", ", ".join(removed))
            self.net = nets.create_network(spec.machines, spec.prefix, spec.bandwidth)
            self._addresses = self.net.addresses
            self.net_setup_s = time.monotonic() - t0
            return self

    def _decide_netns(self) -> bool:
        spec = self.spec
        if spec.netns is False:
            if spec.bandwidth or spec.bandwidth_schedule:
                raise ClusterError("bandwidth shaping needs network namespaces (netns=False)")
            self._check_loopback_machines("netns=False")
            log.info("LocalCluster: %d machine(s) on loopback without namespaces (netns=False)",
                     spec.machines)
            return False
        ok, why = nets.netns_available(spec.prefix)
        if ok:
            return True
        if spec.netns is True:
            raise ClusterError(f"netns=True but network namespaces are unusable: {why}")
        if spec.bandwidth_schedule and shutil.which("tc") is None:
            raise ClusterError("cluster.bandwidth_schedule needs `tc` (iproute2), not found on PATH")
        if spec.bandwidth or spec.bandwidth_schedule:
            raise ClusterError(f"bandwidth shaping needs network namespaces, unusable here ({why}); "
                               "run as root with iproute2, or set cluster.bandwidth: null (unshaped "
                               "loopback)")
        self._check_loopback_machines(why)
        log.warning("LocalCluster: %s; running %d machine(s) on loopback without namespaces "
                    "(no link shaping)", why, spec.machines)
        return False

    def _check_loopback_machines(self, why: str) -> None:
        """Several machines on loopback need a private /dev/shm each (DGL names its shared memory
        without the partition id, so servers on one /dev/shm overwrite each other): root and
        unshare (util-linux)."""
        if self.spec.machines == 1:
            return
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            raise ClusterError(
                f"{self.spec.machines} machines without network namespaces ({why}) need root and "
                "`unshare` (util-linux) for a private /dev/shm per machine (DGL's servers on one "
                "/dev/shm overwrite each other's shared memory); run as root, or use machines=1")

    @property
    def addresses(self) -> list[str]:
        """One address per machine (machine 0 first); available after start()."""
        if self.use_netns is None:
            raise ClusterError("call start() (or enter the context) before reading addresses")
        return list(self._addresses)

    @property
    def interfaces(self) -> list[str]:
        """Each machine's network interface as seen inside it (for GLOO_SOCKET_IFNAME)."""
        if self.net is None:
            return ["lo"] * len(self.addresses)
        return [self.net.ns_veth(i) for i in range(self.spec.machines)]

    def close(self) -> list[str]:
        """Kills any process still running, removes namespaces, veths and bridge. Idempotent;
        returns what could not be removed (normally nothing)."""
        with self._lock:
            self._closed = True
            _LIVE.discard(self)
            self._stop_link_scheduler()
            self._kill_procs(self._procs, grace=0.0)
            for held in self._held:
                held.close()
            self._held = []
            problems: list[str] = []
            if self.net is not None:
                problems = nets.destroy_network(self.net)
                self.net = None
            return problems

    def _stop_link_scheduler(self) -> list[dict]:
        """Stops the run's bandwidth schedule and puts the links back at `bandwidth` (the next
        run starts from there). Returns the changes it applied."""
        sched, self.link_scheduler = self.link_scheduler, None
        if sched is None:
            return []
        sched.stop()
        if self.net is not None and sched.changes:
            try:
                nets.set_rate(self.net, self.spec.bandwidth)
            except nets.NetnsError as exc:
                log.warning("cluster %s: could not restore the link rate: %s", self.net.tag, exc)
        return sched.changes

    # -- one run -------------------------------------------------------------------------------

    def run(self, part_config: str | Path, trainer_argv: list[str],
            service_argv: list[str] | list[list[str]] | None = None,
            env: dict[str, str] | None = None,
            server_argv: list[str] | None = None) -> ClusterResult:
        """Runs one DGL server, the services and the trainers on every machine; returns when all
        trainers and servers have finished, or when anything failed or timed out (then everything
        is killed). Never raises for a failed run; re-raises KeyboardInterrupt/SystemExit after
        tearing down."""
        self.start()
        spec = self.spec
        part_config = Path(part_config).resolve()
        if not part_config.exists():
            raise FileNotFoundError(f"partition config not found: {part_config}")
        if not trainer_argv:
            raise ValueError("trainer_argv is empty")
        services = [] if not service_argv else (
            [list(service_argv)] if isinstance(service_argv[0], str) else
            [list(a) for a in service_argv])
        cdir, logs = self.run_dir / "cluster", self.run_dir / "logs"
        ready = cdir / "ready"
        ready.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        # Fresh state and logs for each run (the supervisor appends to the logs it opens).
        for stale in [*ready.iterdir(), *cdir.glob("machine*.status.json"), *logs.glob("*.log")]:
            stale.unlink()

        dgl_port, master_port = spec.dgl_port, spec.master_port
        if self.loopback:  # the host's loopback is shared with other runs: hold our ports
            held = hold_ports(self.addresses)
            self._held.extend(held)
            dgl_port = held[0].getsockname()[1]
        if spec.machines == 1:  # only machine 0's trainers need it: its supervisor binds and
            master_port = 0     # holds any free port and tells them (no fixed-port clashes)
        ip_config = self.run_dir / "ip_config.txt"
        ip_config.write_text("".join(f"{a} {dgl_port}\n" for a in self.addresses))

        base_env = self._base_env(env)
        launched_at = time.time()
        plans = [self._plan(m, part_config, ip_config, dgl_port, master_port, trainer_argv,
                            services, server_argv, launched_at, cdir, logs)
                 for m in range(spec.machines)]

        t0 = time.monotonic()
        reason, startup_s, interrupted = "", None, None
        sigstate = {"teardown": False, "pending": None}
        old_handlers = self._install_signal_handlers(sigstate)
        try:
            for m, plan in enumerate(plans):
                plan_path = cdir / f"machine{m}.plan.json"
                plan_path.write_text(json.dumps(plan, indent=1))
                self._launch(m, plan_path, base_env, logs / f"machine{m}.supervisor.log")
            if spec.bandwidth_schedule and self.net is not None:
                changes = cdir / "link_changes.jsonl"
                changes.unlink(missing_ok=True)
                self.link_scheduler = LinkScheduler(self.net, spec.bandwidth_schedule, launched_at, changes)
                self.link_scheduler.start()
            log.info("launched %d machine(s) x %d trainer(s); logs in %s", spec.machines,
                     spec.trainers_per_machine, logs)
            reason, startup_s = self._watch(t0, launched_at, cdir, plans)
        except BaseException as exc:  # KeyboardInterrupt, SystemExit from a signal, a bug
            interrupted = exc
            reason = f"interrupted ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"
        finally:
            sigstate["teardown"] = True  # a signal now is remembered, not raised mid-teardown
            link_changes = self._stop_link_scheduler()
            codes = self._kill_procs(self._procs, grace=spec.kill_grace_s + 2.0)
            self._procs = []
            for held in self._held:
                held.close()
            self._held = []
            if self.net is not None:  # anything that escaped the supervisors' process groups
                for ns in self.net.namespaces:
                    nets.kill_namespace_processes(ns)
            self._restore_signal_handlers(old_handlers)
        if interrupted is None and sigstate["pending"] is not None:
            interrupted = SystemExit(128 + sigstate["pending"])
            reason = reason or f"interrupted (signal {sigstate['pending']})"
        wall = time.monotonic() - t0
        result = self._result(reason, wall, startup_s, codes, cdir, plans)
        result.link_changes = link_changes
        (cdir / "result.json").write_text(json.dumps(result.to_dict(), indent=1))
        if result.ok:
            log.info("cluster run ok in %.1f s (start-up %.1f s)", wall, startup_s or -1)
        else:
            log.warning("cluster run failed after %.1f s: %s", wall, result.reason)
        if interrupted is not None:
            raise interrupted
        return result

    def _base_env(self, env: dict[str, str] | None) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if k not in _ROLE_VARS}
        base["DGLBACKEND"] = "pytorch"
        base.setdefault("PYTHONUNBUFFERED", "1")  # logs stay current, even for a killed child
        base = with_this_rudder(base)  # this venv's scripts and this copy of the package first
        base.update({k: str(v) for k, v in (env or {}).items()})
        if "OMP_NUM_THREADS" not in base:  # emulated machines share this host's cores
            base["OMP_NUM_THREADS"] = str(self.threads_per_trainer())
        return base

    def threads_per_trainer(self) -> int:
        """torch threads of each trainer: emulated machines share this host's cores, or the
        run's `cpus` (a Slurm node divides its own, rudder.cluster.slurm)."""
        cores = len(self.spec.cpus) if self.spec.cpus else (os.cpu_count() or 1)
        return max(1, cores // (self.spec.machines * self.spec.trainers_per_machine))

    def _plan(self, m: int, part_config: Path, ip_config: Path, dgl_port: int, master_port: int,
              trainer_argv: list[str], services: list[list[str]], server_argv: list[str] | None,
              launched_at: float, cdir: Path, logs: Path) -> dict:
        spec = self.spec
        tpm, n = spec.trainers_per_machine, spec.machines
        addr = self.addresses[m]
        common = {"RUDDER_MACHINE_ID": str(m), "RUDDER_NUM_MACHINES": str(n),
                  "RUDDER_MACHINE_ADDR": addr, "RUDDER_ADDRESSES": ",".join(self.addresses),
                  "RUDDER_RUN_DIR": str(self.run_dir), "RUDDER_IP_CONFIG": str(ip_config)}
        if self.loopback and n > 1:  # no interface has this address: DGL's clients are told it
            common["RUDDER_DGL_MACHINE_ADDR"] = addr
        dgl = {"DGL_IP_CONFIG": str(ip_config), "DGL_NUM_SERVER": "1",
               "DGL_NUM_CLIENT": str(n * tpm * (1 + spec.samplers_per_trainer)),
               "DGL_CONF_PATH": str(part_config)}
        procs = [{
            "key": f"machine{m}/server", "label": f"server on machine {m}", "role": "server",
            "argv": list(server_argv or [sys.executable, "-m", "rudder.cluster.dist_server"]),
            "env": {**common, **dgl, "DGL_ROLE": "server", "DGL_SERVER_ID": str(m),
                    "DGL_GRAPH_FORMAT": spec.graph_format},
            "log": str(logs / f"machine{m}.server.log")}]
        if m == 0 and spec.rendezvous:  # its socket is bound (and held) by the supervisor
            procs.append({
                "key": "machine0/store", "label": "rendezvous store on machine 0", "role": "store",
                "argv": [sys.executable, "-m", "rudder.cluster.store"],
                "env": {**common, "MASTER_ADDR": addr, "MASTER_PORT": str(master_port),
                        "RUDDER_READY_FILE": str(cdir / "ready" / "store")},
                "log": str(logs / "machine0.store.log")})
        for j, argv in enumerate(services):
            procs.append({
                "key": f"machine{m}/service{j}", "label": f"service {j} on machine {m}",
                "role": "service", "argv": argv,
                "env": {**common, "RUDDER_SERVICE_ID": str(j),
                        "RUDDER_READY_FILE": str(cdir / "ready" / f"service{m}.{j}")},
                "log": str(logs / f"machine{m}.service{j}.log")})
        for local in range(tpm):
            rank = m * tpm + local
            procs.append({
                "key": f"machine{m}/trainer{rank}", "label": f"trainer {rank} on machine {m}",
                "role": "trainer", "rank": rank, "argv": list(trainer_argv),
                "env": {**common, **dgl, "DGL_ROLE": "client", "DGL_DIST_MODE": "distributed",
                        "DGL_NUM_SAMPLER": str(spec.samplers_per_trainer), "DGL_GROUP_ID": "0",
                        "MASTER_ADDR": self.addresses[0], "MASTER_PORT": str(master_port),
                        "RUDDER_THREADS": str(self.threads_per_trainer()),
                        "RANK": str(rank), "WORLD_SIZE": str(n * tpm),
                        "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(tpm),
                        "GLOO_SOCKET_IFNAME": self.interfaces[m]},
                "log": str(logs / f"machine{m}.trainer{rank}.log")})
            if spec.rendezvous:  # join machine 0's store as clients (torch: an agent's store)
                procs[-1]["env"].update({"TORCHELASTIC_USE_AGENT_STORE": "True",
                                         "TORCHELASTIC_RESTART_COUNT": "0"})
        return {"machine": m, "num_machines": n, "addr": addr, "dgl_port": dgl_port,
                "owner_pid": os.getpid(), "launched_at": launched_at,
                "start_deadline": launched_at + spec.start_timeout_s,
                "kill_grace_s": spec.kill_grace_s, "wait_services": spec.wait_services,
                "cpus": spec.cpus,
                "ready_dir": str(cdir / "ready"),
                "status_path": str(cdir / f"machine{m}.status.json"), "procs": procs}

    def _launch(self, m: int, plan_path: Path, env: dict, log_path: Path) -> None:
        sup = [sys.executable, "-m", "rudder.cluster.machine", str(plan_path)]
        if self.net is not None:
            # Own network namespace, and an own mount namespace with a private /dev/shm shared
            # by this machine's server and trainers (DGL names its shared memory without the
            # partition id: machines sharing /dev/shm would overwrite each other).
            script = 'mount -t tmpfs tmpfs /dev/shm && exec "$@"'
            cmd = ["ip", "netns", "exec", self.net.namespace(m), "unshare", "-m",
                   "--propagation", "private", "sh", "-c", script, "rudder-machine", *sup]
        elif os.geteuid() == 0 and shutil.which("unshare"):
            # Loopback as root: still a private /dev/shm, so runs side by side do not clash.
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "rudder-machine", *sup]
        else:
            cmd = sup
        self._procs.append(spawn_logged(cmd, env, log_path))

    def _watch(self, t0: float, launched_at: float, cdir: Path,
               plans: list[dict]) -> tuple[str, float | None]:
        """Waits for the end of the run; returns (failure reason or "", start-up seconds)."""
        spec = self.spec
        n = spec.machines
        startup_s = None
        pidfds = []
        for p in self._procs:
            try:
                pidfds.append(os.pidfd_open(p.pid))
            except (AttributeError, OSError):
                pass
        try:
            while True:
                codes = [p.poll() for p in self._procs]
                statuses = [self._read_status(cdir, m) for m in range(n)]
                failures = [s["failure"] for s in statuses if s and s.get("failure")]
                if failures:
                    return min(failures, key=lambda f: f["time"])["reason"], startup_s
                for m, code in enumerate(codes):
                    if code not in (None, 0):  # died without saying why
                        return (f"machine {m} supervisor {describe_exit(code)} (see "
                                f"{plans[m]['status_path']} and its log)"), startup_s
                if startup_s is None and all(
                        (cdir / "ready" / f"trainers{m}").exists() for m in range(n)):
                    stamps = [(cdir / "ready" / f"trainers{m}").read_text() for m in range(n)]
                    startup_s = max(float(t) for t in stamps) - launched_at
                    log.info("all %d machine(s) started in %.1f s", n, startup_s)
                if all(c == 0 for c in codes):
                    return "", startup_s
                if self.watchdog is not None and startup_s is not None:
                    stalled = self.watchdog.check(statuses)
                    if stalled:
                        return stalled, startup_s
                elapsed = time.monotonic() - t0
                # The supervisors enforce the start deadline with a precise reason; this is the
                # backstop for one that cannot (e.g. stuck before its first status write).
                if startup_s is None and elapsed > spec.start_timeout_s + 3.0:
                    late = [f"machine {m} ({(s or {}).get('phase', 'not started')})"
                            for m, s in enumerate(statuses)
                            if not (cdir / "ready" / f"trainers{m}").exists()]
                    return (f"start-up timeout after {spec.start_timeout_s:g} s: "
                            + ", ".join(late)), startup_s
                if elapsed > spec.run_timeout_s:
                    running = [p["label"] for s in statuses if s for p in s["procs"]
                               if p["pid"] and p["returncode"] is None]
                    return (f"timeout after {spec.run_timeout_s:g} s (still running: "
                            f"{', '.join(running) or 'supervisors'})"), startup_s
                select.select(pidfds, [], [], 0.2)
        finally:
            for fd in pidfds:
                os.close(fd)

    @staticmethod
    def _read_status(cdir: Path, m: int) -> dict | None:
        try:
            return json.loads((cdir / f"machine{m}.status.json").read_text())
        except (OSError, ValueError):
            return None

    def _kill_procs(self, procs: list[subprocess.Popen], grace: float) -> list[int | None]:
        """SIGTERM each supervisor (it stops its children within kill_grace_s), wait `grace`,
        then SIGKILL every process group. Returns the supervisors' exit codes."""
        for p in procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in procs:  # also reaches grandchildren left in the group after a clean exit
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=5.0))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    @staticmethod
    def _install_signal_handlers(state: dict) -> dict | None:
        """SIGTERM/SIGHUP to this process become SystemExit while a run is in progress, so the
        `finally` tears the run down (the default action would kill us and orphan the machines;
        their supervisors would still stop on PDEATHSIG, but the namespaces would remain until
        cleanup_stale). Only the main thread can install handlers."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, _frame):
            if state["teardown"]:
                state["pending"] = state["pending"] or signum
                return
            raise SystemExit(128 + signum)

        old = {}
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.getsignal(sig)
            if old[sig] in (signal.SIG_DFL, None):
                signal.signal(sig, handler)
        return old

    @staticmethod
    def _restore_signal_handlers(old: dict | None) -> None:
        for sig, h in (old or {}).items():
            if h is not None:
                signal.signal(sig, h)

    def _result(self, reason: str, wall: float, startup_s: float | None,
                codes: list[int | None], cdir: Path, plans: list[dict]) -> ClusterResult:
        processes = []
        for m, plan in enumerate(plans):
            status = self._read_status(cdir, m) or {"procs": []}
            seen = {p["key"]: p for p in status["procs"]}
            for spec in plan["procs"]:
                st = seen.get(spec["key"], {})
                processes.append(ProcessResult(
                    key=spec["key"], label=spec["label"], machine=m, role=spec["role"],
                    rank=spec.get("rank"), pid=st.get("pid"), returncode=st.get("returncode"),
                    stopped=bool(st.get("stopped")), log=spec["log"]))
            if not reason and any(p.returncode != 0 and not p.stopped
                                  for p in processes if p.machine == m):
                reason = f"machine {m}: a process did not finish cleanly"
        return ClusterResult(ok=not reason, reason=reason, wall_s=wall, startup_s=startup_s,
                             processes=processes, machine_codes=codes,
                             addresses=self.addresses, netns=bool(self.use_netns),
                             run_dir=str(self.run_dir), cluster=self.net.tag if self.net else "")


def spawn_logged(cmd: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    """Starts cmd with its output (and the command line first) appended to log_path, in a new
    session: the process and its children form one process group that can be killed whole."""
    with open(log_path, "ab") as out:
        out.write(f"$ {shlex.join(cmd)}\n".encode())
        out.flush()
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd())
