"""SlurmCluster: the machines of a run are Slurm nodes (Perlmutter), one machine per node.

Inside an allocation (sbatch, salloc, or a Parsl MPIExecutor task that was given
PARSL_MPI_NODELIST), a run with M machines takes the first M nodes and:
  1. probes each node's address on the high-speed interface (`srun ... python -m
     rudder.cluster.slurm probe --ifname hsn0`; one short job step) -> DGL's ip_config;
  2. writes one plan per machine, exactly as LocalCluster does (same supervisor, same
     environment: DGL server, per-node agent service, trainers; GLOO_SOCKET_IFNAME = ifname);
  3. starts ONE srun step with --ntasks-per-node=1: on each node `python -m rudder.cluster.slurm
     node CDIR` finds its machine id by its Slurm node name, gives each trainer one GPU
     (CUDA_VISIBLE_DEVICES) when the node has GPUs, sets OMP_NUM_THREADS = cores / trainers, and
     runs the LocalCluster machine supervisor (rudder.cluster.machine) in-process;
  4. watches the supervisors' status files (the run directory must be on a shared filesystem,
     e.g. $SCRATCH) exactly as LocalCluster does; teardown signals srun, which signals the tasks.

Everything but the launch is LocalCluster's: this class only overrides where the machines are
(start), how they are started (_launch) and their environment (_base_env).

Selection: `rudder.cluster.launch.make_cluster(spec, run_dir, launch)` returns a SlurmCluster
for the execution config's `launch: {type: slurm, ifname, srun_args}` (passed as data): ifname
names the interface (hsn0 on Perlmutter; default: the address the node name resolves to) and
srun_args adds srun options (e.g. "-c 128 --cpu-bind=none --gpus-per-node=4").
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from rudder.cluster.local import _LIVE, ClusterError, ClusterSpec, LocalCluster, spawn_logged

log = logging.getLogger("rudder.cluster")

SIOCGIFADDR = 0x8915
PROBE_TIMEOUT_S = 120.0


# -- nodes and addresses -------------------------------------------------------------------------

def allocation_nodes() -> list[str]:
    """Node names available to this run: PARSL_MPI_NODELIST (the nodes Parsl's MPIExecutor gave
    this task), else the whole allocation (SLURM_JOB_NODELIST expanded by scontrol)."""
    parsl_nodes = os.environ.get("PARSL_MPI_NODELIST")
    if parsl_nodes:
        return [n for n in parsl_nodes.split(",") if n]
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ClusterError("launcher slurm needs a Slurm allocation (SLURM_JOB_NODELIST is unset):"
                           " run inside sbatch/salloc, or through a Slurm execution config")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ClusterError(f"cannot expand SLURM_JOB_NODELIST={nodelist!r}: {exc}") from None
    return [n for n in out.split() if n]


def task_nodes(hold_s: float = 0.0,
               parsl_resource_specification: dict = {}) -> list[str]:  # noqa: B006 (Parsl reads it)
    """A probe for MPI executors (tests): the nodes this task was given, after holding them
    `hold_s` seconds."""
    time.sleep(hold_s)
    return allocation_nodes()


def interface_addresses() -> dict[str, str]:
    """IPv4 address of every interface of this host that has one (ioctl SIOCGIFADDR)."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out[name] = socket.inet_ntoa(res[20:24])
    return out


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def probe(ifname: str | None) -> dict:
    """This node's name, address and interface. With ifname: that interface's address (hsn0 on
    Perlmutter, the reference scripts' 10.249.x.x); without: the address the host name resolves
    to, and the interface holding it."""
    addrs = interface_addresses()
    if ifname:
        if ifname not in addrs:
            raise ClusterError(f"node {node_name()}: interface {ifname!r} has no IPv4 address "
                               f"(interfaces: {', '.join(sorted(addrs)) or 'none'})")
        return {"node": node_name(), "addr": addrs[ifname], "ifname": ifname}
    addr = socket.gethostbyname(socket.gethostname())
    owner = next((n for n, a in addrs.items() if a == addr), None)
    if owner is None and addr.startswith("127."):
        owner, addr = "lo", "127.0.0.1"
    return {"node": node_name(), "addr": addr, "ifname": owner or ""}


def srun_base(hosts: list[str], extra: list[str]) -> list[str]:
    n = len(hosts)
    return ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
            f"--nodelist={','.join(hosts)}", *extra]


# -- the cluster -------------------------------------------------------------------------------

class SlurmCluster(LocalCluster):
    """LocalCluster whose machines are the nodes of a Slurm allocation (see module docstring)."""

    def __init__(self, spec: ClusterSpec, run_dir: str | Path, ifname: str | None = None,
                 srun_args: str | list[str] | None = None, nodes: list[str] | None = None):
        if spec.bandwidth or spec.bandwidth_schedule:
            raise ClusterError("bandwidth shaping emulates a network; on Slurm nodes the network "
                               "is real (set cluster.bandwidth and cluster.bandwidth_schedule: null)")
        super().__init__(spec, run_dir)
        self.ifname = ifname or None
        srun_args = srun_args or []
        self.srun_args = shlex.split(srun_args) if isinstance(srun_args, str) else list(srun_args)
        self._nodes = nodes
        self.hosts: list[str] = []
        self._ifnames: list[str] = []

    def start(self) -> "SlurmCluster":
        with self._lock:
            if self._closed:
                raise ClusterError("cluster already closed")
            if self.use_netns is not None:
                return self
            nodes = list(self._nodes) if self._nodes is not None else allocation_nodes()
            m = self.spec.machines
            if len(nodes) < m:
                raise ClusterError(f"{m} machines asked but the allocation has {len(nodes)} "
                                   f"node(s) ({', '.join(nodes)}): raise nodes_per_block or "
                                   "the MPI num_nodes")
            hosts = nodes[:m]
            found = self._probe(hosts)
            self.hosts = hosts
            self._addresses = [found[h]["addr"] for h in hosts]
            self._ifnames = [found[h]["ifname"] or "lo" for h in hosts]
            self.use_netns = False
            _LIVE.add(self)
            log.info("SlurmCluster: %d machine(s): %s", m,
                     ", ".join(f"{h}={a}" for h, a in zip(hosts, self._addresses)))
            return self

    def _probe(self, hosts: list[str]) -> dict[str, dict]:
        cmd = srun_base(hosts, ["--kill-on-bad-exit=1", "--job-name=rudder-probe"])
        cmd += [sys.executable, "-m", "rudder.cluster.slurm", "probe"]
        if self.ifname:
            cmd += ["--ifname", self.ifname]
        timeout = min(PROBE_TIMEOUT_S, self.spec.start_timeout_s)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=self._base_env(None))
        except subprocess.TimeoutExpired:
            raise ClusterError(f"probing node addresses took over {timeout:.0f} s: "
                               f"{shlex.join(cmd)}") from None
        except FileNotFoundError:
            raise ClusterError("srun not found: launcher slurm needs the Slurm tools") from None
        if proc.returncode != 0:
            raise ClusterError(f"probing node addresses failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        found = {}
        for line in proc.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            found[rec["node"]] = rec
        missing = [h for h in hosts if h not in found]
        if missing:
            raise ClusterError(f"no address from node(s) {', '.join(missing)}; probe said: "
                               f"{proc.stdout.strip()[-1000:]} {proc.stderr.strip()[-1000:]}")
        return found

    @property
    def interfaces(self) -> list[str]:
        return list(self._ifnames) or ["lo"] * self.spec.machines

    def _base_env(self, env: dict[str, str] | None) -> dict[str, str]:
        had_omp = "OMP_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in (env or {})
        base = super()._base_env(env)
        if not had_omp:  # LocalCluster divides this host's cores; each node divides its own
            base.pop("OMP_NUM_THREADS", None)
        return base

    def _launch(self, m: int, plan_path: Path, env: dict, log_path: Path) -> None:
        """LocalCluster calls this once per machine, plans written in order; one srun step
        starts every machine once the last plan exists."""
        if m != self.spec.machines - 1:
            return
        cdir = plan_path.parent
        (cdir / "hosts.json").write_text(json.dumps(self.hosts))
        cmd = srun_base(self.hosts, ["--kill-on-bad-exit=1", "--job-name=rudder-machines",
                                     *self.srun_args])
        cmd += [sys.executable, "-m", "rudder.cluster.slurm", "node", str(cdir)]
        srun_log = log_path.parent / "srun.log"
        self._procs.append(spawn_logged(cmd, env, srun_log))


def make_cluster(spec: ClusterSpec, run_dir: str | Path, launch=None) -> LocalCluster:
    """Kept for callers of the old name: rudder.cluster.launch.make_cluster."""
    from rudder.cluster.launch import make_cluster as make

    return make(spec, run_dir, launch)


# -- the per-node side ----------------------------------------------------------------------------

def _gpus() -> list[str]:
    """GPUs this task may use: CUDA_VISIBLE_DEVICES (Slurm sets it with --gpus*), else the
    devices the NVIDIA driver lists; [] on CPU nodes."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    drv = Path("/proc/driver/nvidia/gpus")
    if drv.is_dir():
        return [str(i) for i in range(len(list(drv.iterdir())))]
    return []


def node_main(cdir: Path) -> int:
    """On each node (one srun task): pick this node's plan and run the machine supervisor."""
    hosts = json.loads((cdir / "hosts.json").read_text())
    name = node_name()
    if name not in hosts:
        print(f"node {name} is not one of this run's machines ({', '.join(hosts)})",
              file=sys.stderr)
        return 2
    m = hosts.index(name)
    plan = json.loads((cdir / f"machine{m}.plan.json").read_text())
    logs = Path(plan["procs"][0]["log"]).parent
    logs.mkdir(parents=True, exist_ok=True)
    fd = os.open(logs / f"machine{m}.supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    gpus = _gpus()
    trainers = [p for p in plan["procs"] if p["role"] == "trainer"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for p in trainers:
        local = int(p["env"].get("LOCAL_RANK", 0))
        if gpus:
            p["env"]["CUDA_VISIBLE_DEVICES"] = gpus[local % len(gpus)]
        threads = str(max(1, (cores or 1) // max(1, len(trainers))))  # this node's cores
        p["env"]["RUDDER_THREADS"] = threads  # the trainer's torch threads (run.json records it)
        if "OMP_NUM_THREADS" not in os.environ:
            p["env"]["OMP_NUM_THREADS"] = threads
    # The owner is whoever started us (slurmstepd): the supervisor stops if it goes away.
    plan["owner_pid"] = os.getppid()
    print(f"{time.strftime('%H:%M:%S')} node {name}: machine {m} of {len(hosts)}, "
          f"{cores} cores, gpus {gpus or 'none'}", flush=True)
    from rudder.cluster.machine import Supervisor

    return Supervisor(plan).run()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rudder.cluster.slurm",
                                     description="per-node helpers of SlurmCluster (srun runs them)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="print this node's name, address and interface (JSON)")
    p.add_argument("--ifname")
    n = sub.add_parser("node", help="run this node's machine supervisor")
    n.add_argument("cdir", type=Path, help="the run's cluster/ folder (plans, hosts.json)")
    args = parser.parse_args(argv)
    if args.cmd == "probe":
        try:
            print(json.dumps(probe(args.ifname)), flush=True)
        except ClusterError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        return 0
    return node_main(args.cdir)


if __name__ == "__main__":
    sys.exit(main())
