#!/usr/bin/env bash
# A throw-away Slurm cluster under DIR (nothing under /etc is touched): this host as one node, or
# N nodes each in its own network/UTS/mount namespace; for trying the Slurm execution path by hand:
#   scripts/slurm_testcluster.sh up /tmp/slurm      # prints: export SLURM_CONF=/tmp/slurm/slurm.conf
#   scripts/slurm_testcluster.sh up /tmp/slurm --nodes 4   # 4 nodes, each in its own namespaces
#     (its executor address: the bridge address printed; launch.ifname: eth0)
#   export SLURM_CONF=/tmp/slurm/slurm.conf; sinfo; srun hostname
#   python workflows/scaling_study.py --execution configs/slurm_test.yaml ...
#   scripts/slurm_testcluster.sh down /tmp/slurm    # scancel, stop daemons, kill stray slurmstepd
#                                                   # (N nodes: and remove its namespaces, links)
# Needs the Slurm binaries (scripts/install_slurm.sh) and root (SlurmUser=root, auth/none).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
[ $# -ge 2 ] || { echo "usage: $0 up|down DIR [--nodes N]" >&2; exit 64; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m rudder.workflow.testcluster "$@"
