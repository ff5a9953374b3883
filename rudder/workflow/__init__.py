"""The study workflow: a YAML study (datasets x machines x trainers x policies x repeats x
sweeps) expanded into runs, an execution config turned into a Parsl Config, the DAG built and
watched by `workflows/scaling_study.py`, and the two remote launch paths (Slurm, Globus Compute).

  study.py      StudyConfig (pydantic) -> list[PlannedRun], each keyed by its config hash
  execution.py  ExecutionConfig (pydantic) -> parsl.config.Config; app -> executor routing
  tasks.py      the bodies of the Parsl apps (apps/ wraps them): stage, partition, one run in a
                subprocess, collect, report
  block.py      `python -m rudder.workflow.block`: one run in its own process (train_block)
  dag.py        the DAG: stage once per dataset, partition once per (dataset, machines), runs,
                collect one at a time, report; resume; live view; summary
  globus.py     Globus Compute submission (login check, executor) and the local engine harness
  view.py       the live panel (rich) and the summary table
  testcluster.py  a throw-away Slurm cluster for tests (slurmctld + slurmd under a temp dir)

The study process never imports dgl; the runs, stage and partition happen in the apps.
"""
