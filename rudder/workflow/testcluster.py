"""Throw-away Slurm clusters for tests and local trials; nothing under /etc is touched.

SlurmTestCluster: one node (this host). NetnsSlurmCluster (below): several nodes, each in its
own network, UTS and mount namespace, as on a real machine (see its docstring).

    with SlurmTestCluster(tmp_dir) as sc:     # slurmctld + slurmd, SLURM_CONF in tmp_dir
        env = sc.env()                        # SLURM_CONF for sbatch/srun/squeue and jobs
        ...
    # teardown: scancel, wait until squeue is empty, stop both daemons by pid, kill any
    # slurmstepd left behind by this cluster (found by the SLURM_CONF in its environment)

    python -m rudder.workflow.testcluster up DIR [--nodes N]   # scripts/slurm_testcluster.sh
    python -m rudder.workflow.testcluster down DIR

Settings that work without munge or root-owned paths (Debian slurm-wlm 22.05): auth/none,
cred/none, proctrack/linuxproc, task/none, select/cons_tres with CR_Core, no accounting, every
pid/spool/state/log path in DIR. Ports are picked free, so clusters can run side by side.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


# Settings both test clusters share: no munge or accounting, processes tracked from /proc, every
# daemon as root (ENVIRONMENT.md, "Slurm, for real, on one machine").
COMMON_CONF = (
    "AuthType=auth/none",
    "CredType=cred/none",
    "ProctrackType=proctrack/linuxproc",
    "TaskPlugin=task/none",
    "SelectType=select/cons_tres",
    "SelectTypeParameters=CR_Core",
    "SchedulerType=sched/backfill",
    "SlurmUser=root",
    "SlurmdUser=root",
    "MpiDefault=none",
    "JobAcctGatherType=jobacct_gather/none",
    "AccountingStorageType=accounting_storage/none",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_resources() -> tuple[int, int]:
    """(CPUs, RealMemory MB) as slurmd sees this host."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    return int(fields.get("CPUs", os.cpu_count() or 1)), int(fields.get("RealMemory", 1024))


class SlurmTestCluster:
    def __init__(self, root: str | Path, cpus: int | None = None, start_timeout_s: float = 30.0):
        self.root = Path(root).resolve()
        self.cpus = cpus
        self.start_timeout_s = start_timeout_s
        self.conf = self.root / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]
        self.ctld: subprocess.Popen | None = None
        self.slurmd: subprocess.Popen | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> "SlurmTestCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self, base: dict | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def write_conf(self) -> None:
        for d in ("state", "spool", "log", "run"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        cpus, mem = _node_resources()
        cpus = self.cpus or cpus
        r = self.root
        self.conf.write_text("\n".join([
            "ClusterName=rudder-test",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            *COMMON_CONF,
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=30",
            "InactiveLimit=0",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def start(self) -> None:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"Slurm binaries missing: {', '.join(missing)} "
                               "(scripts/install_slurm.sh installs them)")
        self.write_conf()
        env = self.env()
        logs = self.root / "log"
        # -D: stay in the foreground, so the pids are ours; -c -i: start clean
        self.ctld = subprocess.Popen(["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)], env=env,
                                     stdout=open(logs / "slurmctld.out", "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.slurmd = subprocess.Popen(["slurmd", "-D", "-f", str(self.conf)], env=env,
                                       stdout=open(logs / "slurmd.out", "ab"),
                                       stderr=subprocess.STDOUT, start_new_session=True)
        (self.root / "run" / "pids.json").write_text(json.dumps(
            {"slurmctld": self.ctld.pid, "slurmd": self.slurmd.pid}))
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            for name, p in (("slurmctld", self.ctld), ("slurmd", self.slurmd)):
                if p.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{name} exited with {p.returncode}: "
                                       f"{self.log_tail(name)}")
            state = self.run(["sinfo", "-h", "-o", "%T"], check=False).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"slurm node not idle after {self.start_timeout_s:.0f} s")

    def log_tail(self, name: str, lines: int = 20) -> str:
        p = self.root / "log" / f"{name}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else ""

    def run(self, argv: list[str], check: bool = True, timeout: float = 30.0):
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=check)

    def jobs(self) -> list[str]:
        out = self.run(["squeue", "-h", "-o", "%i %T"], check=False).stdout
        return [ln for ln in out.splitlines() if ln.strip()]

    def _cancel_jobs(self, timeout: float) -> list[str]:
        """Cancels every job and waits (bounded) for the queue to empty; what is still queued."""
        if self.ctld is None or self.ctld.poll() is not None:
            return []
        self.run(["scancel", "--full", "--user", str(os.getuid())], check=False)
        deadline = time.monotonic() + timeout
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.3)
        return [f"jobs still queued: {self.jobs()}"] if self.jobs() else []

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Cancels every job, waits for the queue to empty, stops the daemons by pid and kills
        any slurmstepd of this cluster left behind. Returns what had to be killed hard."""
        hard = self._cancel_jobs(timeout)
        daemons = [(n, p) for n, p in self._daemons() if p is not None]
        for _, p in daemons:  # all at once: each slurmd's shutdown overlaps the others'
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in daemons:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                hard.append(name)
                p.kill()
                p.wait(timeout=5)
            if p.stdout:
                p.stdout.close()
        for pid in self.stray_stepds():
            hard.append(f"slurmstepd {pid}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return hard + self._remove_network()

    def _daemons(self) -> list[tuple[str, subprocess.Popen | None]]:
        return [("slurmd", self.slurmd), ("slurmctld", self.ctld)]

    def _remove_network(self) -> list[str]:
        return []  # this host is the node: nothing of ours to take down

    def stray_stepds(self) -> list[int]:
        """slurmstepd processes whose environment names this cluster's SLURM_CONF."""
        out = []
        marker = f"SLURM_CONF={self.conf}".encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if not (d / "cmdline").read_bytes().startswith(b"slurmstepd"):
                    continue
                if marker in (d / "environ").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
        return out


# -- several nodes: one network + UTS + mount namespace per slurmd ------------------------------

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _used_subnets() -> set[str]:
    """The a.b.c of every IPv4 address and route on this host (other clusters' bridges too)."""
    out = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
    return {".".join(w.split("/")[0].split(".")[:3]) for w in out.split() if w.count(".") == 3}


class NetnsSlurmCluster(SlurmTestCluster):
    """`nodes` Slurm nodes on this host, as on a real machine: each slurmd runs in its own
    network namespace (address on a private bridge, interface eth0), UTS namespace (hostname =
    its NodeName) and mount namespace (own /dev/shm: DGL servers name their shared memory
    without the partition id). slurmctld runs on the host side in its own UTS namespace at the
    bridge's address; a study process on the host is reached from the nodes at that address too
    (Parsl's executor `address`). Jobs inherit their slurmd's namespaces.

    Everything it creates is named with a random prefix (`rs` + 5 hex: bridge <p>br, host veths
    <p>v1.., namespaces and hostnames <p>n1.., controller <p>ctl), the subnet is a random free
    10.x.y.0/24 and ports are picked free: clusters run side by side (other tests, CI), and
    stop() removes only its own. Root only. Pitfalls it avoids (shared ENVIRONMENT.md): nsenter,
    not `ip netns exec` (which remounts /sys: slurmd then finds no cgroup mount and exits); no
    default route in the namespaces (listeners stalled in reverse DNS); ReturnToService=2.
    """

    def __init__(self, root: str | Path, nodes: int = 4, cpus: int = 2,
                 start_timeout_s: float = 60.0, prefix: str | None = None):
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        super().__init__(root, cpus=cpus, start_timeout_s=start_timeout_s)
        self.prefix = prefix or "rs" + secrets.token_hex(3)[:5]
        if len(self.prefix) + len(f"v{nodes}") > 15:  # Linux interface names: 15 characters
            raise ValueError(f"prefix {self.prefix!r} too long for {nodes} nodes")
        self.bridge = f"{self.prefix}br"
        self.node_names = [f"{self.prefix}n{i}" for i in range(1, nodes + 1)]
        self.veths = [f"{self.prefix}v{i}" for i in range(1, nodes + 1)]
        self.ctl_host = f"{self.prefix}ctl"
        self.node = self.node_names[0]
        self.address = ""  # the bridge's (slurmctld, study process)
        self.node_addrs: list[str] = []
        self.slurmds: list[subprocess.Popen] = []

    @property
    def netns(self) -> list[str]:
        return list(self.node_names)

    # -- network ---------------------------------------------------------------------------------

    def _make_network(self) -> None:
        used = _used_subnets()
        rng = random.Random(secrets.randbits(32))
        for _ in range(200):
            net = f"10.{rng.randint(100, 254)}.{rng.randint(0, 255)}"
            if net not in used:
                break
        else:
            raise RuntimeError("no free 10.x.y.0/24 subnet found")
        self.address = f"{net}.1"
        self.node_addrs = [f"{net}.{10 + i}" for i in range(1, len(self.node_names) + 1)]
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, veth, addr in zip(self.node_names, self.veths, self.node_addrs):
            _ip("netns", "add", ns)
            peer = f"{veth}p"
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", veth, "master", self.bridge, "up")

    def _remove_network(self) -> list[str]:
        """Kills what still runs in our namespaces, deletes them, then our links."""
        hard = []
        present = set(_ip("netns", "list", check=False).stdout.split())
        for ns in self.node_names:
            if ns not in present:
                continue
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                hard.append(f"pid {pid} in {ns}")
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            deadline = time.monotonic() + 10
            while _ip("netns", "pids", ns, check=False).stdout.split() and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            _ip("netns", "del", ns, check=False)
        for link in [*self.veths, self.bridge]:
            if _ip("link", "show", link, check=False).returncode == 0:
                _ip("link", "del", link, check=False)
        return hard

    def leftovers(self) -> list[str]:
        """What of this cluster still exists: namespaces, links, daemons, slurmstepd."""
        out = [f"netns {n}" for n in _ip("netns", "list", check=False).stdout.split()
               if n in self.node_names]
        links = _ip("-o", "link", check=False).stdout
        out += [f"link {name}" for name in [*self.veths, self.bridge]
                if f" {name}:" in links or f" {name}@" in links]
        out += [f"{name} {p.pid}" for name, p in self._daemons() if p.poll() is None]
        out += [f"slurmstepd {pid}" for pid in self.stray_stepds()]
        return out

    # -- Slurm -----------------------------------------------------------------------------------

    def write_conf(self) -> None:
        for d in ("state", "log", "run", *(f"spool/{n}" for n in self.node_names)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        _, mem = _node_resources()
        mem = max(256, mem // len(self.node_names))
        r = self.root
        self.conf.write_text("\n".join([
            f"ClusterName={self.prefix}",
            f"SlurmctldHost={self.ctl_host}({self.address})",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",  # one port: every slurmd has its own namespace
            *COMMON_CONF,
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "KillWait=5",
            "MinJobAge=600",  # finished jobs stay in `scontrol show job` (block start/end)
            "InactiveLimit=0",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.%n.log'}",
            *(f"NodeName={n} NodeAddr={a} NodeHostname={n} CPUs={self.cpus} RealMemory={mem} "
              "State=UNKNOWN" for n, a in zip(self.node_names, self.node_addrs)),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def _daemons(self) -> list[tuple[str, subprocess.Popen]]:
        out = [(f"slurmd {n}", p) for n, p in zip(self.node_names, self.slurmds)]
        return out + ([("slurmctld", self.ctld)] if self.ctld is not None else [])

    def start(self) -> None:
        missing = missing_binaries() + [b for b in ("ip", "nsenter", "unshare")
                                        if shutil.which(b) is None]
        if missing:
            raise RuntimeError(f"binaries missing: {', '.join(missing)} "
                               "(scripts/install_slurm.sh installs Slurm)")
        if os.geteuid() != 0:
            raise RuntimeError("NetnsSlurmCluster needs root (namespaces, slurmd as root)")
        try:
            self._make_network()
            self.write_conf()
            env = self.env()
            logs = self.root / "log"
            conf = str(self.conf)
            self.ctld = subprocess.Popen(
                ["unshare", "--uts", "sh", "-c", 'hostname "$1" && exec slurmctld -D -c -i -f "$0"',
                 conf, self.ctl_host], env=env, stdout=open(logs / "slurmctld.out", "ab"),
                stderr=subprocess.STDOUT, start_new_session=True)
            for ns in self.node_names:
                self.slurmds.append(subprocess.Popen(
                    ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount",
                     "--propagation", "private", "sh", "-c",
                     'mount -t tmpfs tmpfs /dev/shm && hostname "$1" && exec slurmd -D -f "$0"',
                     conf, ns], env=env, stdout=open(logs / f"slurmd.{ns}.out", "ab"),
                    stderr=subprocess.STDOUT, start_new_session=True))
            (self.root / "run" / "cluster.json").write_text(json.dumps({
                "prefix": self.prefix, "nodes": self.node_names, "address": self.address,
                "node_addrs": self.node_addrs, "slurmctld": self.ctld.pid,
                "slurmd": [p.pid for p in self.slurmds]}))
            self._wait_idle()
        except BaseException:
            self.stop()
            raise

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, p in self._daemons():
                if p.poll() is not None:
                    log = name.replace(" ", ".")
                    raise RuntimeError(f"{name} exited with {p.returncode}: {self.log_tail(log)}"
                                       f"{self._out_tail(log)}")
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
            states = dict(ln.split() for ln in out.splitlines() if len(ln.split()) == 2)
            if all(states.get(n) in ("idle", "mixed", "allocated") for n in self.node_names):
                return
            time.sleep(0.3)
        raise RuntimeError(f"slurm nodes not idle after {self.start_timeout_s:.0f} s: {states}")

    def _out_tail(self, name: str) -> str:
        p = self.root / "log" / f"{name}.out"
        return ("\n" + p.read_text(errors="replace")[-1000:]) if p.exists() else ""

    # -- what a test reads back -----------------------------------------------------------------

    def job_records(self) -> list[dict[str, str]]:
        """Every job slurmctld still knows (finished ones for MinJobAge = 600 s), as
        `scontrol show job` fields: JobName, StartTime, EndTime, NumNodes, NodeList, StdOut..."""
        out = self.run(["scontrol", "-o", "show", "job"], check=False).stdout
        return [dict(kv.split("=", 1) for kv in ln.split() if "=" in kv)
                for ln in out.splitlines() if ln.startswith("JobId=")]

def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rudder.workflow.testcluster",
                                description="a throw-away Slurm cluster under DIR (no /etc)")
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("dir", type=Path)
    p.add_argument("--nodes", type=int, default=1,
                   help="1: this host as the node; >1: one network namespace per node (root)")
    args = p.parse_args(argv)
    root = args.dir.resolve()
    if args.action == "up":
        sc = SlurmTestCluster(root) if args.nodes == 1 else NetnsSlurmCluster(root, args.nodes)
        sc.start()
        # leave the daemons running: forget the Popen objects without stopping them
        extra = f"; executor address {sc.address}" if isinstance(sc, NetnsSlurmCluster) else ""
        print(f"export SLURM_CONF={sc.conf}   # daemons: {root / 'run'}{extra}")
        return 0
    state = root / "run" / "cluster.json"
    if state.exists():  # a NetnsSlurmCluster
        info = json.loads(state.read_text())
        sc = NetnsSlurmCluster(root, len(info["nodes"]), prefix=info["prefix"])
        pids = [info["slurmctld"], *info["slurmd"]]
    else:
        sc = SlurmTestCluster(root)
        pids = list(json.loads((root / "run" / "pids.json").read_text()).values())
    env = sc.env()
    subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=env, check=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and subprocess.run(
            ["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
        time.sleep(0.3)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(1)
    for pid in sc.stray_stepds():
        os.kill(pid, signal.SIGKILL)
    if isinstance(sc, NetnsSlurmCluster):
        sc._remove_network()
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
