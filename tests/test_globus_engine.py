"""Globus Compute up to the service boundary: the study's apps packed exactly as the SDK packs
them (ComputeSerializer, messagepack Task) run on a real GlobusComputeEngine started here with a
LocalProvider, and results (and errors) come back as messagepack Results. The Perlmutter endpoint
(configs/perlmutter/: 4.x layout, config.yaml + user_config_template.yaml.j2) is loaded and
rendered by the endpoint package's own code with the variables the study sends, and the rendered
engines run a study here (their SlurmProvider swapped for a LocalProvider). Without a login or a
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
ENDPOINT_DIR = REPO / "configs" / "perlmutter"
SITE = {"RUDDER_ACCOUNT": "m1234", "RUDDER_MODEL": "/models/gemma.gguf", "SCRATCH": "/scratch"}


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
                          env={**_clean_env(tmp_path), **SITE}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"GlobusComputeExecutor endpoint {EP} (MPI)" in out
    assert "[globus, 4 node(s)]" in out  # a 4-machine run asks the MPI endpoint for 4 nodes
    assert "one at a time [globus]" in out


def _gpu_execution(study_cfg: dict, runs_dir: str):
    """configs/perlmutter/gpu.yaml with the site variables, fitted to a study, routed to an
    endpoint: what `scaling_study.py --execution configs/perlmutter/gpu.yaml --endpoint` sends."""
    from rudder.workflow.execution import split_execution_file, with_endpoint
    from rudder.workflow.fit import fit_study
    from rudder.workflow.study import expand, parse_study

    ex, _ = split_execution_file(ENDPOINT_DIR / "gpu.yaml", env=SITE)
    study = expand(parse_study(study_cfg), runs_dir=runs_dir)
    return study, ex, with_endpoint(fit_study(ex, study), EP)


def test_endpoint_config_is_the_4x_layout_and_renders_the_execution_values(tmp_path):
    """config.yaml holds no engine (the 4.x endpoint refuses one there); the template, rendered
    by the endpoint's own code with the variables the study sends per app, gives the GPU block
    of gpu.yaml to the runs and its CPU node to stage/partition/collect."""
    import jsonschema
    from globus_compute_endpoint.endpoint.config import CoreEndpointConfig
    from globus_compute_endpoint.endpoint.config.utils import get_config

    from rudder.workflow.globus import render_user_config

    assert isinstance(get_config(ENDPOINT_DIR), CoreEndpointConfig)
    study, ex, gx = _gpu_execution({"name": "t", "datasets": ["synth-tiny"], "machines": [1, 4],
                                    "policies": ["none"]}, str(tmp_path))
    gpu = ex.executors["gpu"]
    uec = {app: gx.user_endpoint_config(app) for app in
           ("stage", "partition", "train", "collect", "report")}
    assert uec["train"]["account"] == "m1234" and uec["train"]["nodes"] == 8
    built = {}
    for app in ("train", "stage"):
        cfg = render_user_config(ENDPOINT_DIR, {**uec[app], "ifname": "lo"})  # no hsn0 here
        built[app] = cfg.engine.executor
        cfg.engine.shutdown()
    train, stage = built["train"], built["stage"]
    p = train.provider
    assert type(train).__name__ == "MPIExecutor" and train.max_workers_per_block == 2
    assert (p.account, p.qos, p.constraint, p.nodes_per_block, p.gpus_per_node, p.walltime) == \
        ("m1234", "regular", "gpu", 8, 4, "03:00:00")
    # the drain period fitted to the study: walltime - (run timeout 1800 s + 300 s margin)
    assert train.drain_period == 3 * 3600 - 2100 == fit_drain(ex, study)
    assert p.worker_init.strip() == gpu.provider.worker_init.strip()
    assert sys.prefix in p.worker_init  # the venv this checkout's study process runs in
    q = stage.provider
    assert (q.constraint, q.nodes_per_block, q.gpus_per_node) == ("cpu", 1, None)
    assert uec["partition"] == uec["stage"] == uec["collect"] == uec["report"]
    # the schema refuses what the template cannot use, before anything renders
    with pytest.raises(jsonschema.ValidationError, match="account"):
        render_user_config(ENDPOINT_DIR, {k: v for k, v in uec["train"].items()
                                          if k != "account"})
    # an engine in config.yaml (the pre-4.x single file) is refused
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.yaml").write_text("engine:\n  type: ThreadPoolEngine\n")
    for f in ("user_config_template.yaml.j2", "user_config_schema.json"):
        (old / f).write_text((ENDPOINT_DIR / f).read_text())
    with pytest.raises(ValueError, match="refuses"):
        render_user_config(old, uec["train"])


def fit_drain(ex, study) -> int:
    from rudder.workflow.fit import fit_study

    return fit_study(ex, study).executors["gpu"].drain_period


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


def _local_substitute(nodefile: Path):
    """What cannot run here is Slurm: the rendered engine keeps everything but its provider,
    which becomes a LocalProvider running the rendered worker_init, with a one-node nodefile
    standing in for the allocation the MPI workers read their nodes from."""

    def adapt(engine, user_opts):
        from parsl.launchers import SimpleLauncher
        from parsl.providers import LocalProvider

        rendered = engine.executor.provider
        engine.executor._provider = LocalProvider(  # parsl: `provider` is a read-only property
            init_blocks=0, min_blocks=0, max_blocks=1, launcher=SimpleLauncher(),
            worker_init=f"{rendered.worker_init}\nexport PBS_NODEFILE={nodefile}")
        engine.executor.encrypted = False

    return adapt


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_study_through_the_rendered_perlmutter_endpoint(tmp_path):
    """The whole study (stage, partition, one real run, collect, report) submitted through
    Parsl's GlobusComputeExecutor with gpu.yaml's values as each app's user endpoint config; the
    endpoint's template is rendered per config by the endpoint's own code and each rendered
    engine (GlobusMPIEngine, drain period, runs per block) runs here."""
    import importlib.util
    import socket

    import duckdb

    from rudder.workflow.execution import LaunchModel
    from rudder.workflow.globus import LocalEngineExecutor, TemplateEngines

    spec = importlib.util.spec_from_file_location("scaling_study",
                                                  REPO / "workflows" / "scaling_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = tmp_path / "runs"
    study, _, ex = _gpu_execution({
        "name": "gce", "datasets": ["synth-tiny"], "machines": [1], "policies": ["static"],
        "run": {"train": {"epochs": 1, "eval_every": 0},
                "dataset": {"root": str(tmp_path / "data")},
                "cluster": {"start_timeout_s": 180, "netns": False}}}, str(runs))
    gce = ex.executors["globus"]
    gce = gce.model_copy(update={"user_configs": {  # this host has no hsn0
        app: {**uec, "ifname": "lo"} for app, uec in gce.user_configs.items()}})
    ex = ex.model_copy(update={"executors": {"globus": gce}, "launch": LaunchModel(),
                               "parsl_run_dir": str(tmp_path / "runinfo")})
    nodefile = tmp_path / "nodefile"
    nodefile.write_text(socket.gethostname() + "\n")
    engines = TemplateEngines(ENDPOINT_DIR, tmp_path / "endpoint", adapt=_local_substitute(nodefile))
    made = []

    def factory(endpoint_id):
        made.append(LocalEngineExecutor(engines))
        return made[-1]

    db = tmp_path / "gce.duckdb"
    try:
        dag = mod.run_study(study, ex, str(runs), str(db), str(tmp_path / "report"), remote=True,
                            globus_executor_factory=factory)
        assert dag.ok, dag.summary()
        (st,) = dag.states
        assert st.status == "done" and st.collected
        info = json.loads((runs / "gce" / st.run.run_id / "run.json").read_text())
        assert info["status"] == "complete"
        assert all(t >= 1 for t in info["threads_per_trainer"].values())
        with duckdb.connect(str(db), read_only=True) as con:
            assert con.execute("select status from runs").fetchall() == [("complete",)]
        assert (tmp_path / "report" / "report.md").exists()
        # two user endpoints, as the endpoint would start: the runs' GPU block, the CPU node
        seen = made[0].user_configs_seen
        assert len(engines.engines) == 2 and len(seen) == 5  # stage partition train collect report
        assert sorted(c["constraint"] for c in seen) == ["cpu"] * 4 + ["gpu"]
        assert [c["nodes"] for c in seen if c["constraint"] == "gpu"] == [8]
        train_engine = next(e for k, e in engines.engines.items() if '"gpu"' in k)
        assert train_engine.executor.max_workers_per_block == 2
        assert train_engine.executor.drain_period == 3 * 3600 - 2100
        # resume through the endpoint: the task itself sees the complete run and skips it
        dag2 = mod.run_study(study, ex, str(runs), str(db), None, remote=True,
                             globus_executor_factory=factory)
        assert dag2.ok and dag2.states[0].status == "skipped"
    finally:
        engines.shutdown()
