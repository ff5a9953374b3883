# The two commands a newcomer needs (both create .venv first if it is missing):
#   make study   set up, then run the local scaling study on the embedded default
#   make test    set up, then run the test suite
PY := .venv/bin/python

.PHONY: setup study test test-fast models slurm clean

setup:  # CUDA=1: the CUDA build of the pinned torch (GPU nodes); default: the CPU build
	CUDA=$(CUDA) bash scripts/setup.sh

study: setup models
	$(PY) workflows/scaling_study.py

# As root (CI) a failed Slurm install fails `make test`, and tests/conftest.py turns a skipped
# cluster/netns/Slurm test into a failure; without root those tests skip.
# --durations: the report names the slowest tests (CI must stay well under 40 minutes).
test: setup
	@if [ "$$(id -u)" = 0 ]; then bash scripts/install_slurm.sh; \
	else bash scripts/install_slurm.sh || echo "slurm-wlm not installed: the Slurm tests will skip (not root)"; fi
	$(PY) -m pytest -q -ra --durations=15

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

models: setup
	bash scripts/models.sh qwen2.5-coder-0.5b

clean:
	rm -rf runs results.duckdb report
