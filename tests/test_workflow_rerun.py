"""`--rerun` runs complete runs again: the study submits them, and the train task (which skips
complete runs on resume) runs them, starting from an empty record set."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _complete_run(tmp_path, dataset="no-such-dataset"):
    from rudder.config import RunConfig
    from rudder.records import update_run_json
    from rudder.workflow.study import config_hash

    cfg = RunConfig.model_validate({"dataset": {"name": dataset, "root": str(tmp_path / "data")},
                                    "runs_dir": str(tmp_path / "runs")})
    run_dir = Path(cfg.runs_dir) / "r1"
    run_dir.mkdir(parents=True)
    update_run_json(run_dir, run_id="r1", status="complete", config_hash=config_hash(cfg),
                    wall_s=1.0)
    (run_dir / "minibatches-r0.jsonl").write_text('{"step": 0}\n')  # the earlier attempt's
    return cfg, run_dir


@pytest.mark.timeout(120)
def test_run_block_skips_a_complete_run_unless_rerun(tmp_path):
    from rudder.workflow.tasks import RunFailed, run_block

    cfg, run_dir = _complete_run(tmp_path)
    out = run_block(cfg.model_dump(mode="json"), "r1", "s")
    assert out["skipped"] is True and not (run_dir / "block.log").exists()
    # rerun: the block process really starts (and fails here on the missing dataset, which
    # shows it ran the run rather than trusting run.json), after clearing the old records
    with pytest.raises(RunFailed, match="no-such-dataset"):
        run_block(cfg.model_dump(mode="json"), "r1", "s", rerun=True)
    assert "attempt on" in (run_dir / "block.log").read_text()
    assert not (run_dir / "minibatches-r0.jsonl").exists()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


class FakeApps:
    """Stand-ins for the apps that record what the DAG asked (no Parsl workers needed)."""

    def __init__(self):
        self.trained: list[tuple[str, bool]] = []

    def train(self, config, run_id, study, launch=None, timeout_s=None, cwd=None, rerun=False,
              inputs=(), parsl_resource_specification={}):  # noqa: B006
        from rudder.config import RunConfig
        from rudder.records import update_run_json
        from rudder.workflow.study import config_hash

        cfg = RunConfig.model_validate(config)
        run_dir = Path(cfg.runs_dir) / run_id
        self.trained.append((run_id, rerun))
        if not rerun and (run_dir / "run.json").exists():  # what run_block does
            return {"run_id": run_id, "skipped": True, "wall_s": 0.0}
        run_dir.mkdir(parents=True, exist_ok=True)
        update_run_json(run_dir, run_id=run_id, study=study, status="complete",
                        config_hash=config_hash(cfg), wall_s=0.0)
        return {"run_id": run_id, "skipped": False, "wall_s": 0.0}

    def overrides(self):
        ok = lambda *a, **k: {}  # noqa: E731
        return {"stage": ok, "partition": ok, "train": self.train,
                "collect": lambda *a, **k: {"collected": True}, "report": ok}


@pytest.mark.timeout(120)
def test_study_rerun_submits_and_reruns_complete_runs(tmp_path):
    from rudder.workflow.execution import parse_execution
    from rudder.workflow.study import expand, parse_study

    spec = importlib.util.spec_from_file_location("scaling_study",
                                                  REPO / "workflows" / "scaling_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = tmp_path / "runs"
    study = expand(parse_study({"name": "rr", "datasets": ["synth-tiny"], "machines": [1, 2],
                                "policies": ["none"]}), runs_dir=str(runs))
    ex = parse_execution({"executors": {"t": {"type": "ThreadPoolExecutor", "max_threads": 2}},
                          "parsl_run_dir": str(tmp_path / "runinfo")})
    ids = sorted(r.run_id for r in study.runs)
    first = FakeApps()
    dag = mod.run_study(study, ex, str(runs), str(tmp_path / "r.db"), None,
                        app_overrides=first.overrides())
    assert dag.ok and sorted(first.trained) == [(i, False) for i in ids]
    again = FakeApps()  # resume: complete runs are not even submitted
    dag = mod.run_study(study, ex, str(runs), str(tmp_path / "r.db"), None,
                        app_overrides=again.overrides())
    assert again.trained == [] and {s.status for s in dag.states} == {"skipped"}
    rerun = FakeApps()  # --rerun: every run submitted, told to run even though complete
    dag = mod.run_study(study, ex, str(runs), str(tmp_path / "r.db"), None, rerun=True,
                        app_overrides=rerun.overrides())
    assert sorted(rerun.trained) == [(i, True) for i in ids]
    assert dag.ok and {s.status for s in dag.states} == {"done"}
