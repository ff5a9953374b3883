"""The study DAG on real Parsl (thread executors) with fake apps injected: its shape (stage once
per dataset, partition once per (dataset, machines), collect one at a time after each run,
report last), failure isolation with retries, resume, and the CLI's dry run."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rudder.workflow.execution import parse_execution
from rudder.workflow.study import expand, parse_study

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def load_script():
    spec = importlib.util.spec_from_file_location("scaling_study", REPO / "workflows" / "scaling_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Recorder:
    """Fake apps that record what ran, when, and how many collects overlapped."""

    def __init__(self, fail_policy: str | None = None, sleep: float = 0.05):
        self.events: list[tuple[str, tuple, float]] = []
        self.lock = threading.Lock()
        self.collecting = 0
        self.max_collecting = 0
        self.attempts: dict[str, int] = {}
        self.fail_policy = fail_policy
        self.sleep = sleep

    def _log(self, kind, key):
        with self.lock:
            self.events.append((kind, key, time.monotonic()))

    def stage(self, name, root, parsl_resource_specification={}):
        self._log("stage", (name,))
        time.sleep(self.sleep)
        return {"dataset": name}

    def partition(self, name, parts, method, bt, be, root, feature_dtype="float32", inputs=(),
                  parsl_resource_specification={}):
        self._log("partition", (name, parts))
        time.sleep(self.sleep)
        return {"dataset": name, "num_parts": parts}

    def train(self, config, run_id, study, launch=None, timeout_s=None, cwd=None, rerun=False,
              inputs=(), parsl_resource_specification={}):
        from rudder.records import update_run_json
        from rudder.workflow.study import config_hash
        from rudder.config import RunConfig
        from rudder.workflow.tasks import RunFailed

        with self.lock:
            self.attempts[run_id] = self.attempts.get(run_id, 0) + 1
        self._log("train", (run_id,))
        cfg = RunConfig.model_validate(config)
        run_dir = Path(cfg.runs_dir) / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        time.sleep(self.sleep)
        ok = cfg.prefetch.policy != self.fail_policy
        update_run_json(run_dir, run_id=run_id, study=study, config_hash=config_hash(cfg),
                        status="complete" if ok else "failed", reason=None if ok else "boom",
                        wall_s=self.sleep)
        self._log("train_end", (run_id,))
        if not ok:
            raise RunFailed(run_id, "boom")
        return {"run_id": run_id, "status": "complete", "skipped": False, "wall_s": self.sleep}

    def collect(self, run_dir, db, inputs=(), parsl_resource_specification={}):
        with self.lock:
            self.collecting += 1
            self.max_collecting = max(self.max_collecting, self.collecting)
        self._log("collect", (Path(run_dir).name,))
        time.sleep(self.sleep)
        with self.lock:
            self.collecting -= 1
        return {"collected": True}

    def report(self, db, out, study=None, inputs=(), parsl_resource_specification={}):
        self._log("report", ())
        return {}

    def overrides(self):
        return {"stage": self.stage, "partition": self.partition, "train": self.train,
                "collect": self.collect, "report": self.report}

    def first(self, kind, key=None):
        return min(t for k, kk, t in self.events if k == kind and (key is None or kk == key))

    def last(self, kind, key=None):
        return max(t for k, kk, t in self.events if k == kind and (key is None or kk == key))

    def count(self, kind):
        return sum(1 for k, _, _ in self.events if k == kind)


STUDY = {"name": "fake", "datasets": ["synth-tiny", "synth-small"], "machines": [1, 2, 4],
         "policies": ["none", "static", "fixed"], "repeats": 1}


def execution(collect_on_threads: bool, retries: int = 0):
    apps = {"stage": "threads", "partition": "threads", "train": "threads"}
    if collect_on_threads:  # collects on a 3-thread executor: the chain alone keeps them apart
        apps.update(collect="threads", report="threads")
    return parse_execution({"retries": retries, "executors": {
        "threads": {"type": "ThreadPoolExecutor", "max_threads": 3}}, "apps": apps})


@pytest.mark.parametrize("collect_on_threads", [False, True])
def test_dag_shape_with_fake_apps(tmp_path, collect_on_threads):
    mod = load_script()
    rec = Recorder()
    runs_dir = tmp_path / "runs"
    study = expand(parse_study(STUDY), runs_dir=str(runs_dir))
    ex = execution(collect_on_threads)
    import io

    from rich.console import Console

    from rudder.workflow.view import StudyView, summary_table

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=150)
    with StudyView(console, live=not collect_on_threads) as view:  # the live panel and the log
        dag = mod.run_study(study, ex, str(runs_dir), str(tmp_path / "r.duckdb"),
                            str(tmp_path / "rep"), app_overrides=rec.overrides(), view=view)
    assert dag.ok, dag.summary()
    console.print(summary_table(dag))
    out = buf.getvalue()
    assert "synth-small-m4-t1-fixed-r0-" in out and "done" in out
    if collect_on_threads:  # log mode: one line per settled run
        assert out.count(" done synth-") == 18
    assert dag.counts()["done"] == 18
    # each dataset staged once, each (dataset, machines) partitioned once
    assert sorted(k for kind, k, _ in rec.events if kind == "stage") == [("synth-small",), ("synth-tiny",)]
    parts = sorted(k for kind, k, _ in rec.events if kind == "partition")
    assert parts == sorted((d, m) for d in STUDY["datasets"] for m in STUDY["machines"])
    # dependencies: stage -> partition -> train -> collect; report after the last collect
    for r in study.runs:
        d, m = r.dataset, r.config.cluster.machines
        assert rec.first("stage", (d,)) < rec.first("partition", (d, m)) < rec.first("train", (r.run_id,))
        assert rec.last("train_end", (r.run_id,)) < rec.first("collect", (r.run_id,))
    assert rec.count("collect") == 18 and rec.max_collecting == 1
    assert rec.count("report") == 1 and rec.first("report") > rec.last("collect")
    # runs overlapped (3 threads): the DAG does not serialise them
    starts = sorted(rec.first("train", (r.run_id,)) for r in study.runs)
    ends = sorted(rec.last("train_end", (r.run_id,)) for r in study.runs)
    assert starts[1] < ends[0]


def test_failed_runs_are_retried_and_isolated_then_resumed(tmp_path):
    mod = load_script()
    runs_dir = tmp_path / "runs"
    study = expand(parse_study(STUDY), runs_dir=str(runs_dir))
    rec = Recorder(fail_policy="fixed")
    dag = mod.run_study(study, execution(False, retries=2), str(runs_dir),
                        str(tmp_path / "r.duckdb"), None, app_overrides=rec.overrides())
    c = dag.counts()
    assert c["failed"] == 6 and c["done"] == 12 and not dag.ok
    for st in dag.states:
        expect = 3 if st.run.point["policy"] == "fixed" else 1  # 1 + retries
        assert rec.attempts[st.run.run_id] == expect
        if st.status == "failed":
            assert st.reason == "boom"
    assert rec.count("collect") == 18  # failed runs are collected too (their status, reason)
    summary = dag.write_summary(tmp_path / "study.json")
    assert json.loads(summary.read_text())["counts"]["failed"] == 6

    # rerun: the 12 complete runs are skipped (collected again), the 6 failed ones rerun
    rec2 = Recorder(fail_policy=None)
    dag2 = mod.run_study(study, execution(False), str(runs_dir), str(tmp_path / "r.duckdb"),
                         None, app_overrides=rec2.overrides())
    assert dag2.ok and dag2.counts() == {**dag2.counts(), "skipped": 12, "done": 6}
    assert set(rec2.attempts) == {st.run.run_id for st in dag.states if st.status == "failed"}
    assert rec2.count("collect") == 18
    assert rec2.count("stage") == 2  # only datasets with runs left (here: both)
    assert rec2.count("partition") == 6


def test_dependency_failure_fails_only_its_runs(tmp_path):
    mod = load_script()
    rec = Recorder()

    def bad_partition(name, parts, *a, **k):
        if parts == 4:
            raise RuntimeError("metis exploded")
        return rec.partition(name, parts, *a, **k)

    runs_dir = tmp_path / "runs"
    study = expand(parse_study({**STUDY, "datasets": ["synth-tiny"]}), runs_dir=str(runs_dir))
    dag = mod.run_study(study, execution(False), str(runs_dir), str(tmp_path / "r.duckdb"), None,
                        app_overrides={**rec.overrides(), "partition": bad_partition})
    failed = [st for st in dag.states if st.status == "failed"]
    assert {st.run.point["machines"] for st in failed} == {4} and len(failed) == 3
    assert all("metis exploded" in st.reason and "dependency" in st.reason for st in failed)
    assert dag.counts()["done"] == 6


def test_cli_dry_run_and_bad_study(tmp_path):
    out = subprocess.run([PY, "workflows/scaling_study.py", "--dry-run", "--runs-dir",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    # the inputs are checked too: without `make models` the agent runs' model is missing
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert out.returncode == (2 if errors else 0), out.stderr
    assert all("agent.model" in ln and "scripts/models.sh" in ln for ln in errors), out.stderr
    text = out.stdout
    assert text.count("stage_dataset ") == 1 and text.count("train_block ") == 10
    assert text.count("partition_graph ") == 2  # synth-medium x {2, 4}
    assert "collect_metrics after each run, one at a time [collector]" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndatasets: [synth-tiny]\nmachines: [1]\npolicies: [none]\n"
                   "run: {train: {epochs: 1, lr_typo: 3}}\n")
    out = subprocess.run([PY, "workflows/scaling_study.py", "--study", str(bad), "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "run.train.lr_typo" in out.stderr and "Extra inputs" in out.stderr
    # where the results go is checked too: a db that is a folder, a report dir under a file
    (tmp_path / "afile").write_text("x")
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: x\ndatasets: [synth-tiny]\nmachines: [1]\npolicies: [none]\n")
    out = subprocess.run([PY, "workflows/scaling_study.py", "--study", str(ok), "--dry-run",
                          "--runs-dir", str(tmp_path / "runs"), "--db", str(tmp_path),
                          "--report-dir", str(tmp_path / "afile" / "report")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert f"--db {tmp_path}: a folder, not a database file" in out.stderr
    assert f"--report-dir {tmp_path}/afile/report: {tmp_path}/afile is a file" in out.stderr
    assert not (tmp_path / "runs").exists()
    out = subprocess.run([PY, "workflows/scaling_study.py", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--endpoint UUID" in out.stdout and "--dry-run" in out.stdout
