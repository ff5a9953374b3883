"""The study workflow: a YAML study (datasets x machines x trainers x policies x repeats x
sweeps) expanded into runs, an execution config turned into a Parsl Config, the DAG built and
watched by `workflows/scaling_study.py`, and the two remote launch paths (Slurm, Globus Compute).

  study.py      StudyConfig (pydantic) -> list[PlannedRun], each keyed by its config hash
  execution.py  ExecutionConfig (pydantic) -> parsl.config.Config; app -> executor routing;
                ${NAME} site variables of an execution file (environment or --var)
  fit.py        does the study fit its execution (walltime vs drain + longest run, runs per
                block vs nodes_per_block, no CPU work on GPU blocks), before anything is submitted
  tasks.py      the bodies of the Parsl apps (apps/ wraps them): stage, partition, one run in a
                subprocess, collect, report
  block.py      `python -m rudder.workflow.block`: one run in its own process (train_block)
  dag.py        the DAG: stage once per dataset, partition once per (dataset, machines), runs,
                collect one at a time, report; resume; live view; summary
  globus.py     Globus Compute submission (login check, executor, each app's template variables
                for the 4.x endpoint) and the local harness (engines rendered from the template)
  view.py       the live panel (rich) and the summary table
  testcluster.py  a throw-away Slurm cluster for tests (slurmctld + slurmd under a temp dir)

The study process never imports dgl; the runs, stage and partition happen in the apps.
"""
