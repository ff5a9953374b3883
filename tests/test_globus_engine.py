"""Globus Compute up to the service boundary: the study's apps packed exactly as the SDK packs
them (ComputeSerializer, messagepack Task) run on a real GlobusComputeEngine started here with a
LocalProvider, and results (and errors) come back as messagepack Results. Without a login or a
reachable service, `--endpoint` fails fast with a clear message and no prompt."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `apps` is imported by name, as the endpoint's workers do
    sys.path.insert(0, str(REPO))
EP = "4b116d3c-1703-4f8f-9f6f-39921e5864df"


def _clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLOBUS_")}
    env["HOME"] = str(home)  # no stored tokens
    return env


def test_endpoint_without_login_fails_fast_without_prompt(tmp_path):
    t0 = time.time()
    proc = subprocess.run([sys.executable, "workflows/scaling_study.py", "--endpoint", EP,
                           "--runs-dir", str(tmp_path / "runs")], cwd=REPO,
                          env=_clean_env(tmp_path), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs a login" in proc.stderr and "GLOBUS_COMPUTE_CLIENT_ID" in proc.stderr
    assert time.time() - t0 < 60
    assert not (tmp_path / "runs").exists()  # nothing started


def test_bad_endpoint_id_is_a_config_error(tmp_path):
    proc = subprocess.run([sys.executable, "workflows/scaling_study.py", "--endpoint", "nope",
                           "--dry-run"], cwd=REPO, env=_clean_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not a UUID" in proc.stderr


def test_endpoint_dry_run_routes_every_app_to_the_endpoint(tmp_path):
    proc = subprocess.run([sys.executable, "workflows/scaling_study.py", "--endpoint", EP,
                           "--execution", "configs/perlmutter/gpu.yaml", "--dry-run"], cwd=REPO,
                          env=_clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"GlobusComputeExecutor endpoint {EP} (MPI)" in out
    assert "[globus, 4 node(s)]" in out  # a 4-machine run asks the MPI endpoint for 4 nodes
    assert "one at a time [globus]" in out


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rudder.workflow.execution import prepare_environment
    from rudder.workflow.globus import start_local_engine

    prepare_environment(REPO)  # the engine's workers import `apps` by name, as on an endpoint
    eng = start_local_engine(tmp_path_factory.mktemp("gce"), max_workers=1)
    try:
        yield eng
    finally:
        eng.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_packed_apps_run_on_the_real_engine(engine, tmp_path):
    from globus_compute_sdk.errors import TaskExecutionFailed

    from apps import collect_metrics, stage_dataset
    from rudder.workflow.globus import LocalEngineExecutor, pack_task

    # the wire format: a messagepack Task holding SDK-serialised function, args, kwargs
    tid, packed = pack_task(collect_metrics, (str(tmp_path / "norun"), str(tmp_path / "r.db")), {})
    from globus_compute_common import messagepack

    assert messagepack.unpack(packed).task_id == tid
    gx = LocalEngineExecutor(engine)
    t0 = time.time()
    res = gx.submit(collect_metrics, str(tmp_path / "norun"), str(tmp_path / "r.db")).result(120)
    assert res == {"run_dir": str(tmp_path / "norun"), "collected": False, "reason": "no run.json"}
    print(f"first result through the engine after {time.time() - t0:.1f} s")
    # an error in the app comes back as an error Result -> TaskExecutionFailed, as in the SDK
    fut = gx.submit(stage_dataset, "no-such-dataset", str(tmp_path / "data"))
    with pytest.raises(TaskExecutionFailed, match="no-such-dataset"):
        fut.result(60)
    assert gx.submitted == 2


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_study_through_globus_compute_executor_on_the_engine(engine, tmp_path):
    """The whole study (stage, partition, one real run, collect, report) submitted through
    Parsl's GlobusComputeExecutor, whose SDK executor hands packed tasks to the engine."""
    import importlib.util

    import duckdb

    from rudder.workflow.execution import parse_execution, with_endpoint
    from rudder.workflow.globus import LocalEngineExecutor
    from rudder.workflow.study import expand, parse_study

    spec = importlib.util.spec_from_file_location("scaling_study",
                                                  REPO / "workflows" / "scaling_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = tmp_path / "runs"
    study = expand(parse_study({
        "name": "gce", "datasets": ["synth-tiny"], "machines": [1], "policies": ["static"],
        "run": {"train": {"epochs": 1, "eval_every": 0},
                "dataset": {"root": str(tmp_path / "data")},
                "cluster": {"start_timeout_s": 180}}}), runs_dir=str(runs))
    ex = with_endpoint(parse_execution({"executors": {"x": {"type": "ThreadPoolExecutor"}},
                                        "parsl_run_dir": str(tmp_path / "runinfo")}),
                       str(uuid.uuid4()))
    made = []

    def factory(endpoint_id):
        made.append(endpoint_id)
        return LocalEngineExecutor(engine)

    db = tmp_path / "gce.duckdb"
    dag = mod.run_study(study, ex, str(runs), str(db), str(tmp_path / "report"), remote=True,
                        globus_executor_factory=factory)
    assert made == [str(ex.executors["globus"].endpoint_id)]
    assert dag.ok, dag.summary()
    (st,) = dag.states
    assert st.status == "done" and st.collected
    info = json.loads((runs / "gce" / st.run.run_id / "run.json").read_text())
    assert info["status"] == "complete"
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select status from runs").fetchall() == [("complete",)]
    assert (tmp_path / "report" / "report.md").exists()
    # resume through the endpoint: the task itself sees the complete run and skips it
    dag2 = mod.run_study(study, ex, str(runs), str(db), None, remote=True,
                         globus_executor_factory=factory)
    assert dag2.ok and dag2.states[0].status == "skipped"
