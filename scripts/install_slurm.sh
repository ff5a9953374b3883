#!/usr/bin/env bash
# Installs Debian's slurm-wlm (slurmctld, slurmd, sbatch, srun, squeue, ...) if missing; idempotent.
# Nothing is configured under /etc: the tests write their own slurm.conf and point SLURM_CONF at it
# (see scripts/slurm_testcluster.sh and rudder/workflow/testcluster.py).
set -euo pipefail
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null; then
  echo "[install_slurm] already installed: $(slurmd -V)" >&2
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq slurm-wlm >/dev/null
echo "[install_slurm] installed: $(slurmd -V)" >&2
