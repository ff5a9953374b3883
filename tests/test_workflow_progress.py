"""While a study runs, each running run's progress is shown (epoch/minibatch, hits, rows vs
`none` so far, agent answers), read from the record files as the trainers append them."""
from __future__ import annotations

import io
import json
import time
from pathlib import Path

from rich.console import Console

from rudder.workflow.execution import parse_execution
from rudder.workflow.progress import RunProgress
from rudder.workflow.study import expand, parse_study


def mb(epoch, step, remote, hits, fetched):
    return {"epoch": epoch, "step": step, "global_step": epoch * 10 + step,
            "remote_rows": remote, "hits": hits, "fetched_rows": fetched}


def test_reads_only_what_was_appended_and_waits_for_torn_lines(tmp_path):
    p = RunProgress(tmp_path)
    assert not p.poll() and p.line() == "starting (no minibatch yet)"
    f = tmp_path / "minibatches-r0.jsonl"
    f.write_text(json.dumps(mb(0, 0, 100, 0, 100)) + "\n" + '{"epoch": 0, "st')
    assert p.poll()
    assert (p.minibatches, p.remote_rows) == (1, 100)
    with open(f, "a") as out:  # the torn line completes, one more arrives
        out.write('ep": 1, "global_step": 1, "remote_rows": 100, "hits": 50, '
                  '"fetched_rows": 50}\n' + json.dumps(mb(1, 2, 200, 150, 50)) + "\n")
    (tmp_path / "minibatches-r1.jsonl").write_text(json.dumps(mb(0, 0, 100, 0, 100)) + "\n")
    (tmp_path / "decisions-r0.jsonl").write_text(
        json.dumps({"fallback": None, "reason": "hit rate falling: replace"}) + "\n"
        + json.dumps({"fallback": "lookahead", "reason": "timeout"}) + "\n")
    assert p.poll()
    assert (p.minibatches, p.ranks, p.epoch, p.step) == (4, 2, 1, 2)
    assert p.hit_rate == 200 / 500 and p.fetched_per_minibatch == 300 / 4
    line = p.line(none_per_minibatch=150.0)
    assert "epoch 2 minibatch 3" in line and "hits 40%" in line and "rows 0.50x none" in line
    assert "agent 1 answer(s), 1 fallback(s), last: 'hit rate falling: replace'" in line
    assert not p.poll()  # nothing new


class SlowTrain:
    """A fake train app that writes minibatch records over ~1 s while its run.json says
    running (as a trainer does); `static` fetches half of what `none` fetches."""

    def __call__(self, config, run_id, study, launch=None, timeout_s=None, cwd=None, inputs=(),
                 rerun=False, parsl_resource_specification={}):
        from rudder.config import RunConfig
        from rudder.records import JsonlWriter, update_run_json
        from rudder.workflow.study import config_hash

        cfg = RunConfig.model_validate(config)
        run_dir = Path(cfg.runs_dir) / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        update_run_json(run_dir, run_id=run_id, study=study, config_hash=config_hash(cfg),
                        status="running", updated_at=time.time())
        none = cfg.prefetch.policy == "none"
        w = JsonlWriter(run_dir / "minibatches-r0.jsonl")
        for step in range(10):
            w.write(mb(0, step, 1000, 0 if none else 500, 1000 if none else 500))
            time.sleep(0.12)
        w.close()
        update_run_json(run_dir, status="complete", wall_s=1.2)
        return {"run_id": run_id, "status": "complete", "skipped": False, "wall_s": 1.2}


def test_study_log_shows_progress_lines_with_rows_vs_none(tmp_path):
    from test_workflow_dag import Recorder, load_script  # tests/ is on sys.path under pytest
    from rudder.workflow.view import StudyView

    mod = load_script()
    rec = Recorder()
    runs_dir = tmp_path / "runs"
    study = expand(parse_study({"name": "p", "datasets": ["synth-tiny"], "machines": [2],
                                "policies": ["none", "static"]}), runs_dir=str(runs_dir))
    ex = parse_execution({"executors": {"one": {"type": "ThreadPoolExecutor",
                                                "max_threads": 1}},
                          "apps": {"stage": "one", "partition": "one", "train": "one"}})
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    with StudyView(console, live=False, progress_every_s=0.2) as view:
        dag = mod.run_study(study, ex, str(runs_dir), str(tmp_path / "r.duckdb"), None,
                            app_overrides={**rec.overrides(), "train": SlowTrain()}, view=view)
    assert dag.ok
    out = buf.getvalue()
    lines = [ln for ln in out.splitlines() if "running synth-tiny m=2 t=1 static" in ln]
    assert lines, out
    assert any("rows 0.50x none" in ln and "hits 50%" in ln for ln in lines), lines
    assert any("running synth-tiny m=2 t=1 none r0: epoch 1 minibatch" in ln
               for ln in out.splitlines()), out
