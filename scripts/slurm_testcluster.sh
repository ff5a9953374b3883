#!/usr/bin/env bash
# A throw-away one-node Slurm cluster under DIR (nothing under /etc is touched), for trying the
# Slurm execution path by hand:
#   scripts/slurm_testcluster.sh up /tmp/slurm      # prints: export SLURM_CONF=/tmp/slurm/slurm.conf
#   export SLURM_CONF=/tmp/slurm/slurm.conf; sinfo; srun hostname
#   python workflows/scaling_study.py --execution configs/slurm_test.yaml ...
#   scripts/slurm_testcluster.sh down /tmp/slurm    # scancel, stop daemons, kill stray slurmstepd
# Needs the Slurm binaries (scripts/install_slurm.sh) and root (SlurmUser=root, auth/none).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
[ $# -eq 2 ] || { echo "usage: $0 up|down DIR" >&2; exit 64; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m rudder.workflow.testcluster "$1" "$2"
