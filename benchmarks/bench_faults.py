"""The fault table (BENCHMARKS.md): faults injected into real runs on emulated machines, with
the default settings (the watchdog's derived bound, agent.timeout_s as configured), measured:
time from the fault to the end of the run, the reason recorded, what was left behind.

    sudo PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_faults.py [--only NAME ...]

Runs synth-tiny on 2 machines x 1 trainer, policy none, epochs enough to outlast the fault.
Leftovers: this run's namespaces and links (by its cluster tag) and the processes it started.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rudder.cluster.netns import ClusterNet, state_dir
from rudder.config import RunConfig
from rudder.records import read_jsonl
from rudder.runner import execute_run, preflight, reconcile_run


def cfg_for(root: Path, **train) -> RunConfig:
    return RunConfig.model_validate({
        "dataset": {"name": "synth-tiny", "root": str(root / "data")},
        "train": {"epochs": 2000, "batch_size": 100, "hidden": 8, "eval_every": 0, **train},
        "prefetch": {"policy": "none", "record_trace": False},
        "cluster": {"machines": 2, "start_timeout_s": 150, "run_timeout_s": 900},
        "runs_dir": str(root / "runs")})


def wait_for(cond, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    return None


def leftovers(tag: str | None, pids=()) -> str:
    found = []
    if tag:
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        found += [ln.split()[0] for ln in ns.splitlines() if tag in ln]
        found += [ln.split(":")[1].strip() for ln in links.splitlines() if tag in ln]
    found += [f"pid {p}" for p in pids if Path(f"/proc/{p}").exists()]
    return ", ".join(found) or "none"


def my_net(owner: int) -> ClusterNet | None:
    for p in state_dir().glob("rdr*.json"):
        try:
            net = ClusterNet.load(p)
        except (OSError, ValueError, TypeError):
            continue
        if net.owner_pid == owner:
            return net
    return None


def status_pid(run_dir: Path, machine: int, key: str) -> int | None:
    try:
        st = json.loads((run_dir / "cluster" / f"machine{machine}.status.json").read_text())
    except (OSError, ValueError):
        return None
    return next((p["pid"] for p in st["procs"] if p["key"].endswith(key) and p["pid"]), None)


def in_run(root: Path, name: str, fault) -> dict:
    """execute_run in this process; `fault(run_dir)` runs in a thread once rank 0 has written
    5 minibatch records and returns (what, pids to check afterwards)."""
    run_dir = root / "runs" / name
    out: dict = {}

    def inject():
        if wait_for(lambda: len(read_jsonl(run_dir / "minibatches-r0.jsonl")) >= 5, 400):
            out["net"] = my_net(os.getpid())
            out["pids"] = fault(run_dir, out["net"])
            out["at"] = time.time()

    t = threading.Thread(target=inject, daemon=True)
    t.start()
    res = execute_run(cfg_for(root), run_id=name)
    ended = time.time()
    t.join(5)
    tag = json.loads((run_dir / "cluster" / "result.json").read_text())["cluster"]
    return {"fault": name, "time_s": ended - out["at"] if "at" in out else None,
            "reason": res.reason, "leftovers": leftovers(tag, out.get("pids", []))}


def sigstop(machine: int, key: str):
    def f(run_dir, _net):
        pid = status_pid(run_dir, machine, key)
        os.kill(pid, signal.SIGSTOP)
        return [pid]
    return f


def sigkill(machine: int, key: str):
    def f(run_dir, _net):
        pid = status_pid(run_dir, machine, key)
        os.kill(pid, signal.SIGKILL)
        return [pid]
    return f


def link_down(machine: int):
    def f(run_dir, net):
        subprocess.run(["ip", "-n", net.namespace(machine), "link", "set", net.ns_veth(machine),
                        "down"], check=True)
        return [status_pid(run_dir, machine, k) for k in ("server", f"trainer{machine}")]
    return f


def killed_parent(root: Path) -> dict:
    import yaml

    cfgp = root / "killed.yaml"
    cfgp.write_text(yaml.safe_dump(cfg_for(root).model_dump(mode="json")))
    run_dir = root / "runs" / "killed-parent"
    proc = subprocess.Popen([sys.executable, "-m", "rudder.cli", "run", "--config", str(cfgp),
                             "--run-id", run_dir.name], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: len(read_jsonl(run_dir / "minibatches-r0.jsonl")) >= 5, 400)
    net = my_net(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    at = time.time()
    time.sleep(2)
    before = leftovers(net.tag)
    r = subprocess.run([sys.executable, "-m", "rudder.cli", "collect", str(root / "runs"),
                        "--db", str(root / "r.duckdb")], capture_output=True, text=True)
    info = json.loads((run_dir / "run.json").read_text())
    return {"fault": "SIGKILL of the `rudder run` parent, then `rudder collect`",
            "time_s": time.time() - at, "reason": f"{info['status']}: {info['reason']}",
            "leftovers": f"before collect: {before}; after: {leftovers(net.tag)}"
                         + ("" if r.returncode in (0, 1) else f" (collect rc {r.returncode})")}


def trickle_agent() -> list[dict]:
    """A fake OpenAI-compatible server on loopback that trickles one byte every 0.2 s."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rudder.agent.context import Prompt
    from rudder.agent.decision import DecisionMaker, HttpBackend
    from rudder.agent.messages import answer_schema
    from rudder.agent.policy import AgentPolicy
    from rudder.config import AgentConfig, PrefetchConfig
    from rudder.prefetch.policy import RunContext

    stop = threading.Event()

    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                while not stop.is_set():
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    rows = []
    timeout = AgentConfig().timeout_s
    t0 = time.monotonic()
    d = DecisionMaker(HttpBackend(url), "m", "static", timeout_s=timeout).decide(
        Prompt([{"role": "user", "content": "?"}], answer_schema(True), "h", "t"))
    rows.append({"fault": f"agent server trickles bytes (agent.timeout_s={timeout:g}, default)",
                 "time_s": time.monotonic() - t0, "reason": d.reason, "leftovers": "none"})
    ctx = RunContext(rank=0, num_trainers=1, part_id=0, num_parts=2, num_nodes=1000,
                     partition_nodes=500, halo_nodes=200, capacity=100, batch_size=10,
                     fanouts=[5], steps_per_epoch=100, epochs=1, feat_dim=4, feat_bytes=16,
                     window=5, lookahead=0)
    pol = AgentPolicy(PrefetchConfig(policy="agent", window=5),
                      agent=AgentConfig(backend="http", url=url, prompt="zero-shot", history=0))
    pol.setup(ctx)
    w = {"first_step": 0, "last_step": 4, "minibatches": 5, "hit_rate": 0.2, "remote_rows": 500,
         "fetched_rows": 400, "replaced_rows": 0, "buffer_fill": 100, "stale_slots": 60,
         "lookahead_missing": 0, "lookahead_rows": 0}
    for i in range(5):
        pol.observe({"global_step": 5 * i + 4}, {**w, "window": i})
        time.sleep(0.3)
    t0 = time.monotonic()
    pol.close()
    closed = time.monotonic() - t0
    recs = pol.decisions()
    dropped = sum(r["reason"].startswith("dropped") for r in recs)
    rows.append({"fault": "run ends during a trickled call (AgentPolicy.close)", "time_s": closed,
                 "reason": f"{dropped} dropped windows recorded; in-flight call: "
                           + next((r["reason"] for r in recs if "cancelled" in r["reason"]), "-"),
                 "leftovers": "none"})
    stop.set()
    srv.shutdown()
    return rows


def input_rows(root: Path) -> list[dict]:
    cases = [
        ("--set train.fanouts.x=1", ["train.fanouts.x=1"]),
        ("--set train=5", ["train=5"]),
        ("--set train.fanouts=[]", ["train.fanouts=[]"]),
        ("missing model file", ["prefetch.policy=agent", "agent.model.path=/nonexistent.gguf"]),
        ("unknown classifier", ["prefetch.policy=classifier:nope"]),
        ("classifier given as a path", ["prefetch.policy=classifier:/tmp/x.joblib"]),
        ("agent.url on 127.0.0.1 with namespaces",
         ["prefetch.policy=agent", "agent.backend=http", "agent.url=http://127.0.0.1:8431"]),
        ("unknown key", ["train.epoch=3"]),
        ("--run-id ../../x", []),
    ]
    cfgp = root / "base.yaml"
    cfgp.write_text(f"dataset: {{root: {root / 'data'}}}\n")
    rows = []
    for name, sets in cases:
        args = [sys.executable, "-m", "rudder.cli", "run", "--dry-run", "--config", str(cfgp)]
        for s in sets:
            args += ["--set", s]
        if "run-id" in name:
            args += ["--run-id", "../../x"]
        t0 = time.monotonic()
        r = subprocess.run(args, capture_output=True, text=True, cwd=root)
        err = [ln for ln in r.stderr.splitlines() if "error" in ln]
        rows.append({"fault": f"`rudder run --dry-run` {name}", "time_s": time.monotonic() - t0,
                     "reason": (err[0] if len(err) == 1 else f"rc {r.returncode}: {r.stderr[-200:]}")
                     + ("" if "Traceback" not in r.stderr else " [TRACEBACK]"),
                     "leftovers": "none (nothing started)"})
    return rows


def data_rows(root: Path) -> list[dict]:
    from rudder.data.partition import partition

    a = partition("synth-tiny", 2, root=root / "data")
    victim = a.dir / "part1" / "graph.dgl"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    t0 = time.monotonic()
    b = partition("synth-tiny", 2, root=root / "data")
    return [{"fault": "truncated partition file behind an intact manifest",
             "time_s": time.monotonic() - t0,
             "reason": "sha256 mismatch: repartitioned" if not b.reused else "REUSED (bad)",
             "leftovers": "none"}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="substrings of row names to run")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="rudder-faults-"))
    assert not preflight(cfg_for(root))
    jobs = [
        ("sigstop-server", lambda: in_run(root, "sigstop-server", sigstop(1, "server"))),
        ("sigstop-trainer", lambda: in_run(root, "sigstop-trainer", sigstop(1, "trainer1"))),
        ("link-down", lambda: in_run(root, "link-down", link_down(1))),
        ("sigkill-trainer", lambda: in_run(root, "sigkill-trainer", sigkill(1, "trainer1"))),
        ("killed-parent", lambda: killed_parent(root)),
        ("agent", trickle_agent),
        ("inputs", lambda: input_rows(root)),
        ("data", lambda: data_rows(root)),
    ]
    print("| fault | time to end | reason recorded | leftovers |\n|---|---|---|---|", flush=True)
    for name, job in jobs:
        if args.only and not any(o in name for o in args.only):
            continue
        rows = job()
        for row in rows if isinstance(rows, list) else [rows]:
            t = f"{row['time_s']:.1f} s" if row["time_s"] is not None else "-"
            print(f"| {row['fault']} | {t} | {row['reason']} | {row['leftovers']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
