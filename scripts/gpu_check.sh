#!/usr/bin/env bash
# One-call GPU check of the CUDA backend (issue 3), < 8 minutes on one H200:
#   1. configure + build with CUDA (sm_90 only, to build fast)   2. kernel tests (CUDA vs CPU twins)
#   3. ceilings + Llama-3.1-8B layer/head vs floors (ppb_gpu_bench)
#   4. mpirun -np 2 ppbench run sharing the GPU (MPI transport), with validation
#   5. the same layer in PyTorch eager, if importable
# Prints a summary table at the end. Usage: scripts/gpu_check.sh [build-dir] (default build-gpu)
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
ARCH=${PPB_CUDA_ARCH:-90}
JOBS=$(nproc)
LOG=$(mktemp -d)
declare -A RESULT
t0=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - t0 )) s)"; }

step "build ($BUILD, sm_$ARCH)"
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$LOG/cfg" 2>&1 &&
   cmake --build "$BUILD" -j"$JOBS" --target test_cuda_kernels ppb_gpu_bench ppbench >"$LOG/build" 2>&1; then
  RESULT[build]="ok ($(( $(date +%s) - t0 )) s)"
else
  tail -40 "$LOG/cfg" "$LOG/build"; RESULT[build]="FAILED"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null

step "kernel tests"
if [ -x "$BUILD/tests/test_cuda_kernels" ]; then
  timeout 240 "$BUILD/tests/test_cuda_kernels" --gtest_brief=1 2>&1 | tee "$LOG/tests" | tail -40
  sum=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOG/tests" | tr '\n' ' ')
  RESULT[tests]="${sum:-no summary}"
else
  RESULT[tests]="not built"
fi

step "ceilings and Llama-3.1-8B layer/head vs floors"
BENCH="$LOG/bench.txt"
if [ -x "$BUILD/src/backend/cuda/ppb_gpu_bench" ]; then
  timeout 180 "$BUILD/src/backend/cuda/ppb_gpu_bench" --model inputs/models/llama-3.1-8b.json --dtype bf16 \
    --prompt 2048 --batch 8 --context 2048 --iters 20 --out "$BENCH" 2>&1 | tee "$LOG/bench"
  RESULT[bench]=$([ -s "$BENCH" ] && echo ok || echo FAILED)
else
  RESULT[bench]="not built"
fi

step "mpirun -np 2 ppbench run, 2 ranks sharing the GPU (MPI transport), validated"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT="$LOG/run.h5"
if timeout 180 mpirun --oversubscribe -np 2 "$BUILD/ppbench" run --model inputs/models/qwen3-0.6b.json \
     --device cuda --transport mpi --dtype bf16 -b 4 -p 128 -g 32 --iters 3 -o "$OUT" --force 2>&1 | tee "$LOG/run" | tail -30; then
  RESULT[mpirun]="ok (validated)"
else
  RESULT[mpirun]="FAILED rc=${PIPESTATUS[0]} (see above)"
fi

step "PyTorch eager, same layer"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  timeout 120 python3 scripts/torch_layer.py --model inputs/models/llama-3.1-8b.json --bench "$BENCH" 2>&1 | tee "$LOG/torch"
  RESULT[torch]=$(grep -c 'torch/ppbench' "$LOG/torch" 2>/dev/null | sed 's/^2$/ok/')
else
  RESULT[torch]="PyTorch with CUDA not importable: skipped"
fi

step "summary"
printf '%-10s %s\n' "step" "result"
for k in build tests bench mpirun torch; do printf '%-10s %s\n' "$k" "${RESULT[$k]:-?}"; done
echo
grep -E '^(ceilings|layer|head)' "$LOG/bench" 2>/dev/null
grep -E 'torch/ppbench' "$LOG/torch" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s; logs in $LOG"
