"""Bad input never reaches a cluster: names, config values, model and classifier files, agent
URLs, damaged datasets and partitions; the agent's HTTP call under a total deadline (a fake
OpenAI-compatible server on loopback that trickles bytes); clean attempts; interrupted runs."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rudder.config import ConfigError, RunConfig, check_name, load_run_config
from rudder.run_cli import parse_overrides

REPO = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "rudder.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


# -- names ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["../../x", "/abs/run", ".hidden", "a/b", "", "..", "a\\b"])
def test_run_ids_and_dataset_names_are_plain_names(bad, tmp_path):
    with pytest.raises(ValueError, match="plain name"):
        check_name(bad, "run id")
    with pytest.raises(ConfigError, match="dataset.name"):
        load_run_config(_yaml(tmp_path, {"dataset": {"name": bad}}))
    assert check_name("ogbn-papers100M") == "ogbn-papers100M"


def test_execute_run_refuses_a_path_as_run_id(tmp_path):
    from rudder.runner import execute_run

    cfg = RunConfig.model_validate({"runs_dir": str(tmp_path / "runs")})
    with pytest.raises(ValueError, match="run id"):
        execute_run(cfg, run_id="../escape")
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs").exists()


def _yaml(tmp_path, data) -> Path:
    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# -- config values -------------------------------------------------------------------------------

def test_lists_accept_commas_and_bad_sets_name_the_key(tmp_path):
    p = _yaml(tmp_path, {})
    assert load_run_config(p, parse_overrides(["train.fanouts=15,10"])).train.fanouts == [15, 10]
    assert load_run_config(p, parse_overrides(["train.fanouts=[5]"])).train.fanouts == [5]
    with pytest.raises(ConfigError, match="train.fanouts"):
        load_run_config(p, parse_overrides(["train.fanouts=[]"]))
    with pytest.raises(ConfigError, match="train.fanouts"):
        load_run_config(p, parse_overrides(["train.fanouts=10,0"]))
    with pytest.raises(ConfigError, match=r"invalid config .*\.yaml with --set train.epochs=abc: train.epochs: "):
        load_run_config(p, parse_overrides(["train.epochs=abc"]))  # the value is named, not only the file
    with pytest.raises(ConfigError, match="valid keys here: .*batch_size"):
        load_run_config(p, parse_overrides(["train.epoch=5"]))
    with pytest.raises(ConfigError, match="valid keys here: dataset, train, prefetch"):
        load_run_config(p, parse_overrides(["trian.epochs=5"]))
    p2 = _yaml(tmp_path, {"train": {"fanouts": [10, 25]}})
    with pytest.raises(ConfigError, match="train.fanouts is a value"):
        load_run_config(p2, parse_overrides(["train.fanouts.x=1"]))
    with pytest.raises(ConfigError, match="train: .*section"):
        load_run_config(p, parse_overrides(["train=5"]))
    p3 = tmp_path / "empty_section.yaml"
    p3.write_text("agent:\n")  # a section left empty (None): --set fills it
    assert load_run_config(p3, parse_overrides(["agent.timeout_s=5"])).agent.timeout_s == 5


def test_cluster_progress_timeout_config():
    assert RunConfig().cluster.progress_timeout_s is None
    assert RunConfig.model_validate({"cluster": {"progress_timeout_s": 0}}).cluster.progress_timeout_s == 0
    with pytest.raises(Exception, match="progress_timeout_s"):
        RunConfig.model_validate({"cluster": {"progress_timeout_s": -1}})


@pytest.mark.parametrize("sets,needle", [
    (["train.fanouts.x=1"], "train.fanouts"),
    (["train=5"], "train"),
    (["train.fanouts=[]"], "train.fanouts"),
    (["prefetch.policy=agent", "agent.model.path=/nonexistent/m.gguf"], "agent.model"),
    (["prefetch.policy=agent", "agent.prompt=judge-histroy-2b"], "unknown prompt variant 'judge-histroy-2b'"),
    (["prefetch.policy=agent", "agent.model.chat_format=chatmlx"], "unknown chat_format 'chatmlx'"),
    (["prefetch.policy=classifier:nope"], "classifier"),
    (["prefetch.policy=fixed:50"], "policy 'fixed:50': only classifier:<name> and collect"),
    (["prefetch.policy=classifier:../../etc/x"], "classifier model name"),
    (["dataset.name=no-such-data"], "unknown dataset 'no-such-data'"),
    (["train.epochz=1"], "valid keys here"),
    (["prefetch.policy=agent", "agent.backend=http", "agent.url=http://127.0.0.1:9",
      "cluster.netns=true"], "loopback"),
])
def test_dry_run_fails_in_one_line(tmp_path, sets, needle):
    cfgp = _yaml(tmp_path, {"dataset": {"root": str(tmp_path / "data")}})
    args = ["run", "--dry-run", "--config", str(cfgp)]
    for s in sets:
        args += ["--set", s]
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, r.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data" / "synth-small").exists()


def test_dry_run_prints_the_resolved_config_and_starts_nothing(tmp_path):
    import yaml

    cfgp = _yaml(tmp_path, {"dataset": {"root": str(tmp_path / "data")}})
    r = cli("run", "--dry-run", "--config", str(cfgp), "--set", "train.fanouts=15,10",
            "--run-id", "ok-1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = yaml.safe_load(r.stdout)
    assert out["train"]["fanouts"] == [15, 10] and out["cluster"]["progress_timeout_s"] is None
    assert not (tmp_path / "runs").exists()
    r = cli("run", "--dry-run", "--config", str(cfgp), "--run-id", "../x", cwd=tmp_path)
    assert r.returncode == 2 and "--run-id" in r.stderr and "Traceback" not in r.stderr


def test_dry_run_names_a_runs_dir_that_cannot_be_written(tmp_path):
    (tmp_path / "afile").write_text("x")
    cfgp = _yaml(tmp_path, {"dataset": {"root": str(tmp_path / "data")}})
    r = cli("run", "--dry-run", "--config", str(cfgp), "--set", f"runs_dir={tmp_path}/afile/runs",
            cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"runs_dir: {tmp_path}/afile/runs: {tmp_path}/afile is a file, not a folder" in r.stderr
    assert "Traceback" not in r.stderr and (tmp_path / "afile").read_text() == "x"


def test_run_takes_its_config_as_an_argument_too(tmp_path):
    """`rudder run my.yaml` (what a newcomer types first) is `--config my.yaml`; two different
    configs are one clear error."""
    import yaml

    cfgp = _yaml(tmp_path, {"dataset": {"root": str(tmp_path / "data")}, "train": {"epochs": 3}})
    r = cli("run", str(cfgp), "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["train"]["epochs"] == 3
    r = cli("run", str(cfgp), "--dry-run", "--config", str(tmp_path / "other.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "two configs given" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


# -- agent URL -----------------------------------------------------------------------------------

def _agent_cfg(url, **cluster):
    return RunConfig.model_validate({"prefetch": {"policy": "agent"},
                                     "agent": {"backend": "http", "url": url},
                                     "cluster": cluster})


def test_agent_url_loopback_with_namespaces_or_dead_is_an_error():
    from rudder.runner import preflight

    (p,) = [x for x in preflight(_agent_cfg("http://127.0.0.1:9", netns=True)) if "agent" in x]
    assert "loopback" in p and "namespace" in p
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (p,) = [x for x in preflight(_agent_cfg(f"http://127.0.0.1:{port}", netns=False, machines=1))
            if "agent" in x]
    assert "unreachable" in p and str(port) in p
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        assert not [x for x in preflight(_agent_cfg(url, netns=False, machines=1)) if "agent" in x]


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_agent_url_probed_from_each_machines_network(tmp_path):
    """A URL this host reaches (loopback) but the machine cannot: refused before any trainer."""
    from rudder.cluster import ClusterSpec, LocalCluster
    from rudder.runner import probe_agent_url

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with LocalCluster(ClusterSpec(machines=1, netns=True, prefix="rdq"), tmp_path) as c:
            why = probe_agent_url(_agent_cfg(url), c)
            tag = c.net.tag
    assert "unreachable from machine 0" in why and tag in why
    assert tag not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


# -- the agent's HTTP deadline (a fake OpenAI-compatible server trickling bytes) ------------------

class Trickle(BaseHTTPRequestHandler):
    """Answers with headers, then one byte every 0.2 s, never finishing (read timeouts never
    fire: each read gets a byte in time)."""

    stop = threading.Event()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            while not self.stop.is_set():
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def log_message(self, *a):
        pass


@pytest.fixture
def trickle_url():
    Trickle.stop.clear()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    Trickle.stop.set()
    srv.shutdown()
    srv.server_close()


def _prompt():
    from rudder.agent.context import Prompt
    from rudder.agent.messages import answer_schema

    return Prompt([{"role": "user", "content": "replace?"}], answer_schema(True), "h", "t")


def test_trickling_server_is_cut_at_the_total_deadline(trickle_url):
    from rudder.agent.decision import DecisionMaker, HttpBackend

    m = DecisionMaker(HttpBackend(trickle_url), "m", fallback="static", timeout_s=1.5)
    t0 = time.monotonic()
    d = m.decide(_prompt())
    took = time.monotonic() - t0
    assert d.fallback == "static" and d.reason.startswith("fallback: late:"), d.reason
    assert "total deadline" in d.reason
    # bounded by the deadline, not by the (endless) trickle; loose: a busy host
    assert 1.4 < took < 10, took
    assert d.latency_s == pytest.approx(took, abs=0.5)


def test_agent_policy_falls_back_records_dropped_windows_and_closes_fast(trickle_url):
    from rudder.agent.policy import AgentPolicy
    from rudder.config import AgentConfig, PrefetchConfig
    from rudder.prefetch.policy import RunContext, StepInfo

    ctx = RunContext(rank=0, num_trainers=1, part_id=0, num_parts=2, num_nodes=1000,
                     partition_nodes=500, halo_nodes=200, capacity=100, batch_size=10,
                     fanouts=[5], steps_per_epoch=100, epochs=1, feat_dim=4, feat_bytes=16,
                     window=5, lookahead=0)
    pol = AgentPolicy(PrefetchConfig(policy="agent", window=5),
                      agent=AgentConfig(backend="http", url=trickle_url, timeout_s=30, history=0,
                                        prompt="zero-shot", ready_timeout_s=2),
                      inbox_size=1)  # (its wait for /v1/models, trickled too, ends in 2 s)
    pol.setup(ctx)

    def window(i):
        return {"window": i, "first_step": 5 * i, "last_step": 5 * i + 4, "minibatches": 5,
                "hit_rate": 0.2, "remote_rows": 500, "fetched_rows": 400, "replaced_rows": 0,
                "buffer_fill": 100, "stale_slots": 60, "lookahead_missing": 0, "lookahead_rows": 0}

    pol.observe({"global_step": 4}, window(0))
    deadline = time.monotonic() + 10
    while pol.decider._inbox.qsize() and time.monotonic() < deadline:  # the agent thread took window 0
        time.sleep(0.01)
    for i in (1, 2, 3):  # the call on window 0 hangs: 1 and 2 are pushed out by the next
        pol.observe({"global_step": 5 * i + 4}, window(i))
    assert pol.dropped_windows == 2
    pol.plan(StepInfo(epoch=0, step=20, global_step=20, remaining_steps=80))  # no answer: fallback
    t0 = time.monotonic()
    pol.close()
    assert time.monotonic() - t0 < 3.0  # not the 30 s timeout of the hung call
    recs = pol.decisions()
    dropped = [r for r in recs if r["reason"].startswith("dropped")]
    assert sorted(r["window"] for r in dropped) == [1, 2]
    # each its own number (the store keys decisions by run, rank, decision): -1, -2, apart from asked ones
    assert sorted(r["decision"] for r in dropped) == [-2, -1]
    assert all(r["decision"] > 0 for r in recs if r not in dropped)
    assert any("cancelled" in r["reason"] for r in recs), recs


# -- classifiers: only from the models folder, after a digest check ------------------------------

def test_classifier_loads_only_named_and_digest_checked(tmp_path, monkeypatch):
    import joblib

    from rudder.agent.classifiers import resolve_checked

    monkeypatch.setenv("RUDDER_CLASSIFIERS_DIR", str(tmp_path / "models"))
    models = tmp_path / "models"
    models.mkdir()
    evil = tmp_path / "evil.joblib"
    joblib.dump({"pipeline": None}, evil)
    with pytest.raises(ValueError, match="plain name"):
        resolve_checked(str(evil))
    with pytest.raises(ValueError, match="plain name"):
        resolve_checked("../evil")
    path = models / "logreg.joblib"
    joblib.dump({"pipeline": None, "meta": {}}, path)
    with pytest.raises(ValueError, match="no recorded sha256"):
        resolve_checked("logreg")
    import hashlib

    (models / "logreg.json").write_text(json.dumps(
        {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}))
    assert resolve_checked("logreg") == path.resolve() or resolve_checked("logreg") == path
    with open(path, "ab") as f:
        f.write(b"tampered")
    with pytest.raises(ValueError, match="altered since training"):
        resolve_checked("logreg")
    (models / "link.joblib").symlink_to(evil)
    with pytest.raises(ValueError, match="outside"):
        resolve_checked("link")


# -- datasets and partitions: checksums, safe overwrite, torn records ---------------------------

def test_truncated_partition_file_is_detected_and_redone(tmp_path):
    from rudder.data.partition import partition

    a = partition("synth-tiny", 2, root=tmp_path)
    assert not a.reused and "part1/graph.dgl" in a.manifest["files"]
    assert partition("synth-tiny", 2, root=tmp_path).reused  # intact: reused (verified)
    victim = a.dir / "part1" / "graph.dgl"
    victim.write_bytes(victim.read_bytes()[:100])  # the manifest still says all is well
    b = partition("synth-tiny", 2, root=tmp_path)
    assert not b.reused
    assert victim.stat().st_size > 100


def test_damaged_graph_is_not_staged_and_failed_overwrite_keeps_the_data(tmp_path):
    from rudder.data.importers import import_edge_list
    from rudder.data.store import dataset_known, is_staged, read_meta

    edges = tmp_path / "e.csv"
    edges.write_text("src,dst\n" + "".join(f"{i},{(i + 1) % 50}\n" for i in range(50)))
    import_edge_list(edges, "mine", root=tmp_path / "data", generate_labels=True)
    good = read_meta("mine", tmp_path / "data")
    loops = tmp_path / "loops.csv"
    loops.write_text("src,dst\n" + "".join(f"{i},{i}\n" for i in range(50)))
    with pytest.raises(ValueError, match="no edges"):
        import_edge_list(loops, "mine", root=tmp_path / "data", overwrite=True, generate_labels=True)
    assert is_staged("mine", tmp_path / "data")
    assert read_meta("mine", tmp_path / "data")["checksum"] == good["checksum"]
    assert not [p for p in (tmp_path / "data").iterdir() if ".tmp" in p.name]
    g = tmp_path / "data" / "mine" / "graph.dgl"
    data = bytearray(g.read_bytes())
    data[-1] ^= 0xFF  # same size, altered content
    g.write_bytes(bytes(data))
    assert not is_staged("mine", tmp_path / "data")
    with pytest.raises(ValueError, match="damaged"):
        dataset_known("mine", tmp_path / "data")


def test_torn_middle_record_is_reported(tmp_path, caplog):
    from rudder.records import read_jsonl

    p = tmp_path / "epochs-r0.jsonl"
    p.write_text('{"epoch": 0}\n{"epo\n{"epoch": 2}\n{"ep')
    with caplog.at_level(logging.WARNING, logger="rudder.records"):
        recs = read_jsonl(p)
    assert [r["epoch"] for r in recs] == [0, 2]
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "line 2 of 4" in msgs[0]


# -- attempts and interrupted owners -------------------------------------------------------------

def test_an_earlier_attempt_is_moved_aside(tmp_path):
    from rudder.runner import set_aside_attempt

    run = tmp_path / "r1"
    run.mkdir()
    (run / ".lock").write_text("")
    (run / "run.json").write_text(json.dumps({"status": "failed", "reason": "x"}))
    (run / "epochs-r0.jsonl").write_text('{"epoch": 0}\n')
    (run / "logs").mkdir()
    (run / "block.log").write_text("=== attempt 1\n")  # the study's, open as our stdout
    earlier = set_aside_attempt(run)
    assert earlier == [{"attempt": 1, "status": "failed", "reason": "x"}]
    assert sorted(p.name for p in run.iterdir()) == [".lock", "attempts", "block.log"]
    assert (run / "attempts" / "1" / "epochs-r0.jsonl").exists()
    (run / "run.json").write_text(json.dumps({"status": "complete"}))
    assert [e["attempt"] for e in set_aside_attempt(run)] == [1, 2]


def test_a_run_left_running_by_a_dead_owner_is_marked_interrupted(tmp_path):
    from rudder.cluster.netns import process_start_time
    from rudder.runner import live_owner, reconcile_run

    p = subprocess.Popen(["sleep", "30"])
    start = process_start_time(p.pid)
    run = tmp_path / "r"
    run.mkdir()
    owner = {"pid": p.pid, "start": start, "host": socket.gethostname()}
    (run / "run.json").write_text(json.dumps({"status": "running", "owner": owner}))
    assert reconcile_run(run) is None and live_owner(run) == p.pid  # alive: left alone
    p.kill()
    p.wait()
    assert reconcile_run(run).startswith("failed: interrupted")
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and "owner pid" in info["reason"]
    assert reconcile_run(run) is None  # once


def test_rudder_collect_marks_a_dead_owners_run_interrupted(tmp_path):
    from rudder.cluster.netns import process_start_time

    p = subprocess.Popen(["true"])
    start = process_start_time(p.pid)  # None once gone: any start time then counts as gone
    p.wait()
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "run_id": "r", "status": "running", "config": RunConfig().model_dump(mode="json"),
        "owner": {"pid": p.pid, "start": start, "host": socket.gethostname()}}))
    cli("collect", str(tmp_path / "runs"), "--db", str(tmp_path / "r.duckdb"))
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["reason"].startswith("interrupted")


@pytest.mark.parametrize("sub,value,needle", [("judge", "0", "at least 1 window"),
                                              ("judge", "-2", "at least 1 window"),
                                              ("label", "two", "not a whole number of windows")])
def test_a_horizon_under_one_window_is_refused(tmp_path, sub, value, needle):
    """`rudder agent judge|label --horizon`: 0 windows would judge every decision neutral (it
    ran, and printed a Pass@1); the parser refuses it before any run is read."""
    r = cli("agent", sub, "--horizon", value, str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "argument --horizon" in r.stderr and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("value, needle", [("99999", "a TCP port is 1-65535"), ("x", "not a port number")])
def test_a_bad_service_port_is_refused(tmp_path, value, needle):
    r = cli("agent", "serve", "--port", value, cwd=tmp_path)
    assert r.returncode == 2 and "argument --port" in r.stderr and needle in r.stderr, r.stderr


def test_a_service_that_cannot_start_says_why(tmp_path):
    """`python -m rudder.agent.service` (what `rudder agent serve` and the study's node services
    run) on a port another process holds: the model server exits at bind. The service exits 1
    with one error line, and the server's own output, which used to go nowhere, says why: in
    the --log file (its tail quoted in the error), else on the service's own output."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        base = [sys.executable, "-m", "rudder.agent.service", "--port", str(port), "--no-warm"]
        log = tmp_path / "server.log"
        logged = subprocess.run(base + ["--log", str(log)], cwd=tmp_path, capture_output=True,
                                text=True, timeout=180)
        plain = subprocess.run(base, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    for r in (logged, plain):
        assert r.returncode == 1, r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("agent service: error: ")]
        assert len(errors) == 1 and "exited with code" in errors[0], r.stderr
        assert "Address already in use" in r.stderr
    assert f"log tail ({log})" in logged.stderr and "Address already in use" in log.read_text()


@pytest.mark.parametrize("args, needle", [([], "usage: scripts/gpu_offline.sh"),
                                          (["{wheels}", "{out}", "figure"], "unknown part 'figure'"),
                                          (["{tmp}/none", "{out}", "agent"], "no wheels folder at")])
def test_the_gpu_script_refuses_bad_arguments_before_it_installs(tmp_path, args, needle):
    """Device time is short: a misspelt part or a missing wheels folder must not spend it on an
    install and a dataset that nothing then uses."""
    (tmp_path / "wheels").mkdir()
    argv = [a.format(wheels=tmp_path / "wheels", out=tmp_path / "out", tmp=tmp_path) for a in args]
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_offline.sh"), *argv],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and needle in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


# -- damaged or foreign files handed to the CLI --------------------------------------------------

def _damaged(tmp_path: Path) -> dict[str, Path]:
    import numpy as np

    from rudder.trace import Trace

    good = Trace.from_minibatches(np.arange(10), [[1, 2], [3]], capacity=2).save(tmp_path / "good.npz")
    (tmp_path / "truncated.npz").write_bytes(good.read_bytes()[:100])
    (tmp_path / "text.npz").write_text("halo: 1\n")
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "run.json").write_text("[1]")
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "run.json").write_text('{"run_id": ')
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "tracegen").mkdir()  # a tracegen folder whose trace.json is torn
    (tmp_path / "tracegen" / "trace-r0.npz").write_bytes(good.read_bytes())
    (tmp_path / "tracegen" / "trace.json").write_text('{"graph": ')
    return {p.name: p for p in tmp_path.iterdir()}


@pytest.mark.parametrize("args, needle", [
    (["sim", "{truncated.npz}", "-p", "lru"], "{truncated.npz}: not a trace (not a readable .npz file)"),
    (["sim", "{text.npz}", "-p", "lru"], "{text.npz}: not a trace (not a readable .npz file)"),
    (["sim", "{array.npy}", "-p", "lru"], "{array.npy}: not a trace (an .npy array, not an .npz file)"),
    (["data", "import", "--name", "x", "--edges", "{truncated.npz}", "--root", "{list}"],
     "{truncated.npz}: cannot read an edge list as npz"),
    (["agent", "judge", "{list}"], "{list}/run.json is not a JSON object"),
    (["agent", "judge", "{torn}"], "{torn}/run.json is not valid JSON (Expecting value, line 1)"),
    (["sim", "{tracegen}", "-p", "lru"], "{tracegen}/trace.json is not valid JSON"),
    (["tracegen", "--graph", "synth-tiny", "--fanouts", "-3", "--out", "{list}"], "fanouts: need one entry >= 1"),
    (["tracegen", "--graph", "synth-tiny", "--max-steps", "0", "--out", "{list}"],
     "max_steps_per_epoch must be >= 1"),
    (["data", "generate", "synth-tiny", "--root", "{a_file}"], "Not a directory: '{a_file}"),
])
def test_a_damaged_or_foreign_file_is_one_line_naming_it(tmp_path, args, needle):
    """A truncated .npz, a text file, an .npy, a run.json that is no object or torn, a fanout
    DGL would abort on, a file where a folder is wanted: exit 2 and one line, no traceback."""
    files = _damaged(tmp_path)
    fill = {f"{{{k}}}": str(v) for k, v in files.items()}

    def sub(s: str) -> str:
        for k, v in fill.items():
            s = s.replace(k, v)
        return s

    r = cli(*map(sub, args))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rudder {args[0]}: error: ") and sub(needle) in last, last


def test_a_record_that_is_no_object_is_skipped_as_damage(tmp_path, caplog):
    from rudder.records import read_jsonl

    path = tmp_path / "decisions-r0.jsonl"
    path.write_text('{"window": 0}\n[1, 2]\n"text"\n{"window": 1}\n')
    with caplog.at_level(logging.WARNING, logger="rudder.records"):
        assert read_jsonl(path) == [{"window": 0}, {"window": 1}]
    assert sum("is not a JSON record" in r.message for r in caplog.records) == 2
