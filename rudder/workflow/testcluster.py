"""A throw-away one-node Slurm cluster for tests and local trials; nothing under /etc is touched.

    with SlurmTestCluster(tmp_dir) as sc:     # slurmctld + slurmd, SLURM_CONF in tmp_dir
        env = sc.env()                        # SLURM_CONF for sbatch/srun/squeue and jobs
        ...
    # teardown: scancel, wait until squeue is empty, stop both daemons by pid, kill any
    # slurmstepd left behind by this cluster (found by the SLURM_CONF in its environment)

    python -m rudder.workflow.testcluster up DIR     # for manual use (scripts/slurm_testcluster.sh)
    python -m rudder.workflow.testcluster down DIR

Settings that work without munge or root-owned paths (Debian slurm-wlm 22.05): auth/none,
cred/none, proctrack/linuxproc, task/none, select/cons_tres with CR_Core, no accounting, every
pid/spool/state/log path in DIR. Ports are picked free, so clusters can run side by side.
"""
from __future__ import annotations

import json
import os
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

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Cancels every job, waits for the queue to empty, stops the daemons by pid and kills
        any slurmstepd of this cluster left behind. Returns what had to be killed hard."""
        hard: list[str] = []
        if self.ctld is not None and self.ctld.poll() is None:
            self.run(["scancel", "--full", "--user", str(os.getuid())], check=False)
            deadline = time.monotonic() + timeout
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.3)
            if self.jobs():
                hard.append(f"jobs still queued: {self.jobs()}")
        for name, p in (("slurmd", self.slurmd), ("slurmctld", self.ctld)):
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                hard.append(name)
                p.kill()
                p.wait(timeout=5)
        for pid in self.stray_stepds():
            hard.append(f"slurmstepd {pid}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in (self.slurmd, self.ctld):
            if p is not None and p.stdout:
                p.stdout.close()
        return hard

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


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rudder.workflow.testcluster",
                                description="a one-node Slurm cluster under DIR (no /etc)")
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("dir", type=Path)
    args = p.parse_args(argv)
    sc = SlurmTestCluster(args.dir)
    if args.action == "up":
        sc.start()
        # leave the daemons running: forget the Popen objects without stopping them
        print(f"export SLURM_CONF={sc.conf}   # daemons: {sc.root / 'run' / 'pids.json'}")
        return 0
    pids = json.loads((sc.root / "run" / "pids.json").read_text())
    env = sc.env()
    subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=env, check=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and subprocess.run(
            ["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
        time.sleep(0.3)
    for name in ("slurmd", "slurmctld"):
        try:
            os.kill(pids[name], signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(1)
    for pid in sc.stray_stepds():
        os.kill(pid, signal.SIGKILL)
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
