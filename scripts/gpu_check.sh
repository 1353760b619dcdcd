#!/usr/bin/env bash
# One-call GPU check of the CUDA backend (issue 3), a few minutes on one H200:
#   1. binaries: the prebuilt bundle if carried (see below), else configure + build (sm_90 only)
#   2. kernel resource usage (registers, shared/local memory, from cuobjdump)
#   3. kernel tests (CUDA vs CPU twins, CUDA stage vs CPU stage, lanes)
#   4. ceilings + Llama-3.1-8B layer/head vs floors and issue 3's targets (ppb_gpu_bench)
#   5. mpirun -np 2 ppbench run sharing the GPU (MPI transport), with validation
#   5b. ppbench profile of a Llama-3.1-8B layer at B=4, P=8192: a forward of > 2,000 launches,
#       which deadlocked a held lane before the launch bound (issue 17, item 1)
#   5c. a two-stage run through NCCL, where nvidia-smi lists two GPUs (issue 17, item 6)
#   5d. decode replayed from CUDA graphs vs eager (--no-cuda-graphs): Qwen3-0.6B on one rank,
#       decode tokens/s of each and the simulator's error against it (issue 17, item 8)
#   5f. MoE and MLA (issue 15): tiny DeepSeek-V3 --mtp and gpt-oss runs, a Qwen3-30B-A3B profile
#   5e. tensor-parallel stages (issue 14), where nvidia-smi lists two GPUs: the width-2 stage
#       test, then mpirun -np 2 ppbench run --tp 1 --tp 2 (PP2 against TP2), validated; on one
#       GPU it says it skipped
#   6. the same layer in PyTorch eager, if importable
# Every step runs under a timeout carved from one budget (PPB_GPU_CHECK_BUDGET seconds, default
# 450), a failing step does not stop the next, and the summary table is always printed last.
#
#   scripts/gpu_check.sh [build-dir]          on the GPU machine (default build-gpu)
#   scripts/gpu_check.sh --pack [build-dir]   on a machine WITH the build dependencies and nvcc
#
# The GPU machine's image may lack ppbench's build dependencies (MPI, HDF5, OpenBLAS, GTest,
# nlohmann-json, CLI11, NCCL headers) and cannot install any. --pack builds the three binaries
# here (sm_90) and writes BUILD/ppb-gpu-bundle.tar.xz: the binaries, the shared libraries they
# need (not glibc, libstdc++, the driver, cuBLAS or NCCL: those come from the GPU machine's CUDA
# and PyTorch), and Open MPI's runtime (mpirun, its components, relocated with OPAL_PREFIX) for
# a machine without one. Carry that one file to the GPU machine (device run: carry
# ["build-gpu/ppb-gpu-bundle.tar.xz"]); when it is there, step 1 uses it and builds nothing.
set -u
cd "$(dirname "$0")/.."
ARCH=${PPB_CUDA_ARCH:-90}
JOBS=$(nproc)
BUNDLE_NAME=ppb-gpu-bundle.tar.xz

if [ "${1:-}" = "--pack" ]; then
  set -e
  BUILD=${2:-build-gpu}
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >/dev/null
  cmake --build "$BUILD" -j"$JOBS" --target test_cuda_kernels test_cuda_moe test_cuda_mla ppb_gpu_bench ppbench
  st=$(mktemp -d)
  mkdir -p "$st/bin" "$st/lib" "$st/ompi/usr/bin" "$st/ompi/usr/lib/x86_64-linux-gnu" "$st/ompi/usr/share"
  cp "$BUILD/tests/test_cuda_kernels" "$BUILD/tests/test_cuda_moe" "$BUILD/tests/test_cuda_mla" \
    "$BUILD/src/backend/cuda/ppb_gpu_bench" "$BUILD/ppbench" "$st/bin/"
  # Open MPI as Debian lays it out (prefix /usr; OPAL_PREFIX moves every path under it).
  ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi
  cp -a "$ompi_lib" "$st/ompi/usr/lib/x86_64-linux-gnu/"
  cp -a /usr/share/openmpi "$st/ompi/usr/share/"
  pmix=/usr/lib/x86_64-linux-gnu/pmix2  # Open MPI 4's PMIx: its components (found via PMIX_MCA_...)
  mkdir -p "$st/ompi$pmix/lib"
  cp -a "$pmix/lib/pmix" "$st/ompi$pmix/lib/"
  cp -L "$(command -v orterun)" "$(command -v orted)" "$st/ompi/usr/bin/"
  ln -s orterun "$st/ompi/usr/bin/mpirun"
  # Shared libraries of the binaries and of Open MPI's components, except what the GPU machine
  # must provide itself (glibc, the C++ runtime, the driver, cuBLAS, NCCL).
  { for f in "$st"/bin/* "$st"/ompi/usr/bin/orterun "$st"/ompi/usr/bin/orted "$ompi_lib"/lib/openmpi3/*.so "$pmix"/lib/pmix/*.so; do
      ldd "$f" 2>/dev/null || true; done; } |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libnvidia-[a-z-]*|libcublas|libcublasLt|libnccl)\.so' |
    while read -r l; do cp -L "$l" "$st/lib/"; done
  tar -C "$st" -cJf "$BUILD/$BUNDLE_NAME" .
  rm -rf "$st"
  ls -l "$BUILD/$BUNDLE_NAME"
  echo "carry $BUILD/$BUNDLE_NAME to the GPU machine and run scripts/gpu_check.sh $BUILD there"
  exit 0
fi

BUILD=${1:-build-gpu}
LOG=$(mktemp -d)
TEST_BIN= BENCH_BIN= PPB_BIN= LANES_HANG=0 MOE_TEST_BINS=
declare -A RESULT
t0=$(date +%s)
BUDGET=${PPB_GPU_CHECK_BUDGET:-450}
step() { echo; echo "=== $* ($(( $(date +%s) - t0 )) s)"; }
# Timeout of a step: at most `$1` s, and never past the budget (minus 10 s kept for the summary).
tmo() {
  local left=$(( t0 + BUDGET - 10 - $(date +%s) ))
  [ "$left" -lt "$1" ] && set -- "$left"
  [ "$1" -lt 5 ] && set -- 5
  echo "$1"
}
summary_done=0
summary() {
  [ "$summary_done" = 1 ] && return
  summary_done=1
  step "summary"
  printf '%-10s %s\n' "step" "result"
  for k in binaries tests bench mpirun longfwd moe nccl graphs tp torch; do printf '%-10s %s\n' "$k" "${RESULT[$k]:-not reached}"; done
  echo
  grep -E '^(ceilings|layer|head|targets)' "$LOG/bench" 2>/dev/null
  grep -E 'torch/ppbench' "$LOG/torch" 2>/dev/null
  # The device tool brings back what is under $OUT: every log, the results file, the tables.
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    cp -r "$LOG"/. "$OUT"/ 2>/dev/null
    rm -rf "$OUT/bundle"  # the unpacked binaries: 100+ MB, not a result
    echo "total $(( $(date +%s) - t0 )) s; logs in $LOG, copied to \$OUT"
  else
    echo "total $(( $(date +%s) - t0 )) s; logs in $LOG"
  fi
}
trap summary EXIT
trap 'exit 130' INT TERM

# ---- 1. binaries --------------------------------------------------------------------------
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null
# The GPUs the driver lists: with PPB_EXPECT_GPUS set, a test binary that sees none (built for a
# newer CUDA than the driver supports) fails loudly instead of reporting every test SKIPPED.
PPB_EXPECT_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
export PPB_EXPECT_GPUS
echo "nvidia-smi lists $PPB_EXPECT_GPUS GPU(s)"
if [ -f "$BUILD/$BUNDLE_NAME" ]; then
  step "binaries: prebuilt bundle $BUILD/$BUNDLE_NAME"
  B=$LOG/bundle
  mkdir -p "$B"
  # tar -J needs xz; Python's tarfile reads .tar.xz without it.
  if tar -C "$B" -xJf "$BUILD/$BUNDLE_NAME" 2>/dev/null ||
     python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUILD/$BUNDLE_NAME" "$B"; then
    TEST_BIN=$B/bin/test_cuda_kernels BENCH_BIN=$B/bin/ppb_gpu_bench PPB_BIN=$B/bin/ppbench
    MOE_TEST_BINS="$B/bin/test_cuda_moe $B/bin/test_cuda_mla"
    # cuBLAS and NCCL from this machine: the CUDA toolkit, else PyTorch's pip wheels (-H:
    # /usr/local/cuda and its lib64 are usually symbolic links).
    libdirs=$B/lib
    for l in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudart.so.13; do
      d=$(find -H /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib/x86_64-linux-gnu /opt /usr/local/lib \
            -maxdepth 9 -name "$l" 2>/dev/null | head -1)
      [ -n "$d" ] && case ":$libdirs:" in *":$(dirname "$d"):"*) ;; *) libdirs=$libdirs:$(dirname "$d") ;; esac
    done
    export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    # mpirun: the bundle's, always (its libmpi is the one ppbench loads), relocated.
    export OPAL_PREFIX=$B/ompi/usr PATH=$B/ompi/usr/bin:$PATH OMPI_MCA_mca_base_component_show_load_errors=0 \
      PMIX_MCA_mca_base_component_path=$B/ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
    missing=$(ldd "$TEST_BIN" "$BENCH_BIN" "$PPB_BIN" 2>&1 | grep 'not found' | sort -u | tr -s ' \t\n' ' ')
    if [ -z "$missing" ]; then RESULT[binaries]="ok (bundle)"; else RESULT[binaries]="bundle: MISSING$missing"; echo "missing: $missing"; fi
  else
    RESULT[binaries]="FAILED to unpack the bundle"
  fi
else
  step "binaries: build ($BUILD, sm_$ARCH)"
  TEST_BIN=$BUILD/tests/test_cuda_kernels BENCH_BIN=$BUILD/src/backend/cuda/ppb_gpu_bench PPB_BIN=$BUILD/ppbench
  MOE_TEST_BINS="$BUILD/tests/test_cuda_moe $BUILD/tests/test_cuda_mla"
  if timeout "$(tmo 300)" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$LOG/cfg" 2>&1 &&
     timeout "$(tmo 300)" cmake --build "$BUILD" -j"$JOBS" --target test_cuda_kernels test_cuda_moe test_cuda_mla ppb_gpu_bench ppbench >"$LOG/build" 2>&1; then
    RESULT[binaries]="ok (built in $(( $(date +%s) - t0 )) s)"
  else
    tail -30 "$LOG/cfg" "$LOG/build" 2>/dev/null
    RESULT[binaries]="build FAILED (missing dependencies? run scripts/gpu_check.sh --pack where they are, carry the bundle)"
  fi
fi

# ---- 2. resource usage ----------------------------------------------------------------------
step "kernel resource usage (sm_90: registers, shared, local = spills/stack)"
CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null)
if [ -x "$TEST_BIN" ] && [ -n "$CUOBJDUMP" ]; then
  "$CUOBJDUMP" --dump-resource-usage "$TEST_BIN" 2>/dev/null |
    awk '/^[[:space:]]*Function/ {f=$2; sub(/:$/, "", f)} /REG:/ {print f, $0}' |
    { command -v c++filt >/dev/null && c++filt || cat; } |
    sed -E 's/ppb::cuda::(\(anonymous namespace\)::)?//g; s/__nv_bfloat16/bf16/g; s/\(.*\) +REG/ REG/; s/[[:space:]]+(TEXTURE|SURFACE|SAMPLER):[0-9]+//g' |
    sort -u | tee "$LOG/resources" | cut -c1-150
else
  echo "skipped (no test binary or no cuobjdump)"
fi

# ---- 3. kernel tests ------------------------------------------------------------------------
# Kernels and stages first; the lane tests (host tasks: the stream waits on a host-written
# counter through cuStreamWaitValue32) apart, with a short timeout: if that wait never sees the
# host's write (not verified on these machines), only they hang, and they are retried with the
# spin-kernel fallback (PPB_CUDA_SPIN_WAIT=1), which the mpirun step then keeps.
step "kernel tests"
if [ -x "$TEST_BIN" ]; then
  timeout "$(tmo 200)" "$TEST_BIN" --gtest_brief=1 --gtest_filter='-CudaLanes*' >"$LOG/tests" 2>&1
  rc=$?
  tail -40 "$LOG/tests"
  sum=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$LOG/tests" | tr -s ' \n' ' ')
  RESULT[tests]="rc=$rc ${sum:-no gtest summary (crashed or timed out)}"
  if grep -q "but CUDA sees none" "$LOG/tests"; then
    RESULT[tests]="FAILED: nvidia-smi lists $PPB_EXPECT_GPUS GPU(s) but CUDA sees none ($(grep -m1 -o 'CUDA sees none: .*' "$LOG/tests"))"
  fi
  step "lane tests (host tasks, events, copies)"
  timeout "$(tmo 40)" "$TEST_BIN" --gtest_brief=1 --gtest_filter='CudaLanes*' >"$LOG/lanes" 2>&1
  lrc=$?
  cat "$LOG/lanes" | tail -15
  if [ "$lrc" = 124 ]; then
    echo "lane tests timed out: again with PPB_CUDA_SPIN_WAIT=1 (spin-kernel stream wait)"
    PPB_CUDA_SPIN_WAIT=1 timeout "$(tmo 40)" "$TEST_BIN" --gtest_brief=1 --gtest_filter='CudaLanes*' >"$LOG/lanes" 2>&1
    lrc=$?
    tail -15 "$LOG/lanes"
    [ "$lrc" = 0 ] && export PPB_CUDA_SPIN_WAIT=1
    [ "$lrc" = 124 ] && LANES_HANG=1
    RESULT[tests]="${RESULT[tests]}; lanes: cuStreamWaitValue32 HUNG, spin-kernel fallback rc=$lrc"
  else
    RESULT[tests]="${RESULT[tests]}; lanes rc=$lrc"
  fi
  [ "$lrc" != 0 ] && rc=$lrc
  # Issue 15's kernels (router, dispatch, grouped expert GEMMs, combine; MLA, sinks, MTP input).
  for tb in $MOE_TEST_BINS; do
    [ -x "$tb" ] || { RESULT[tests]="${RESULT[tests]}; $(basename "$tb") not built"; continue; }
    timeout "$(tmo 60)" "$tb" --gtest_brief=1 >"$LOG/$(basename "$tb")" 2>&1
    mrc=$?
    tail -15 "$LOG/$(basename "$tb")"
    msum=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$LOG/$(basename "$tb")" | tr -s ' \n' ' ')
    RESULT[tests]="${RESULT[tests]}; $(basename "$tb") rc=$mrc ${msum:-no gtest summary}"
    [ "$mrc" != 0 ] && rc=$mrc
  done
  # A failing kernel usually shows only as a wrong result or a later "illegal address": rerun
  # the failed tests (all CUDA kernel tests after a crash) under compute-sanitizer, which names
  # the kernel and the bad access (it runs on Firecracker machines, not on gVisor ones).
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ "$rc" != 0 ] && [ -n "$SANITIZER" ]; then
    failed=$(cat "$LOG/tests" "$LOG/lanes" | grep -E '^\[  FAILED  \] [A-Za-z_]+\.[A-Za-z_]+ \(' | awk '{print $4}' |
             sort -u | paste -sd: -)
    step "compute-sanitizer on ${failed:-CudaKernels.*}"
    timeout "$(tmo 90)" "$SANITIZER" --tool memcheck --print-limit 20 "$TEST_BIN" --gtest_brief=1 \
      --gtest_filter="${failed:-CudaKernels.*}" >"$LOG/sanitizer" 2>&1
    grep -E '^=========|FAILED|PASSED' "$LOG/sanitizer" | head -60
    RESULT[tests]="${RESULT[tests]}; sanitizer: $(grep -m1 -E 'ERROR SUMMARY' "$LOG/sanitizer" | sed 's/^=* *//')"
  fi
else
  RESULT[tests]="not built"
fi

# ---- 4. ceilings, layer and head vs floors ----------------------------------------------------
step "ceilings and Llama-3.1-8B layer/head vs floors"
BENCH="$LOG/bench.txt"
if [ -x "$BENCH_BIN" ]; then
  timeout "$(tmo 150)" "$BENCH_BIN" --model inputs/models/llama-3.1-8b.json --dtype bf16 \
    --prompt 2048 --batch 8 --context 2048 --iters 20 --out "$BENCH" >"$LOG/bench" 2>&1
  rc=$?
  cat "$LOG/bench"
  if [ "$rc" = 0 ]; then
    RESULT[bench]="ok: $(grep -E '^targets' "$LOG/bench" | sed -E 's/^targets[^:]*: //; s/;.*//')"
  else
    RESULT[bench]="FAILED rc=$rc"
  fi
else
  RESULT[bench]="not built"
fi

# ---- 5. the whole program: 2 ranks on the GPU --------------------------------------------------
step "mpirun -np 2 ppbench run, 2 ranks sharing the GPU (MPI transport), validated"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RUN_H5="$LOG/run.h5"
if [ "$LANES_HANG" = 1 ]; then
  RESULT[mpirun]="skipped: lane host tasks hang with either stream wait (see the lane tests)"
elif [ -x "$PPB_BIN" ] && command -v mpirun >/dev/null; then
  # The ranks are forked locally: they inherit this environment (the bundle's library path).
  timeout "$(tmo 150)" mpirun --oversubscribe -np 2 "$PPB_BIN" run \
    --model inputs/models/qwen3-0.6b.json --device cuda --transport mpi --dtype bf16 -b 4 -p 128 -g 32 --iters 3 --target-ci 0 \
    -o "$RUN_H5" --force >"$LOG/run" 2>&1
  rc=$?
  tail -30 "$LOG/run"
  if [ "$rc" = 124 ] && [ "$(tmo 100)" -ge 60 ]; then
    # A hang: the two likeliest causes without a hardware fault are a lazily loaded kernel
    # waiting for the whole context behind a lane held by a host task, and streams sharing a
    # hardware queue with one that waits on the host. Once more with both ruled out.
    echo "mpirun timed out: again with CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32"
    CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 timeout "$(tmo 100)" mpirun --oversubscribe -np 2 \
      -x CUDA_MODULE_LOADING -x CUDA_DEVICE_MAX_CONNECTIONS "$PPB_BIN" run \
      --model inputs/models/qwen3-0.6b.json --device cuda --transport mpi --dtype bf16 -b 4 -p 128 -g 32 --iters 3 --target-ci 0 \
      -o "$RUN_H5" --force >"$LOG/run2" 2>&1
    rc2=$?
    tail -20 "$LOG/run2"
    RESULT[mpirun]="TIMED OUT; with CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32: rc=$rc2"
  elif [ "$rc" = 0 ]; then RESULT[mpirun]="ok (validated)"; else RESULT[mpirun]="FAILED rc=$rc (see above)"; fi
else
  RESULT[mpirun]="skipped (no ppbench binary or no mpirun)"
fi

# ---- 5b. a forward of more launches than a stream queues: profiled, never held --------------------
step "ppbench profile: Llama-3.1-8B layer at B=4, P=8192 (> 2,000 launches per forward)"
if [ -x "$PPB_BIN" ] && command -v mpirun >/dev/null; then
  timeout "$(tmo 150)" mpirun -np 1 "$PPB_BIN" profile --model inputs/models/llama-3.1-8b.json --device cuda \
    --dtype bf16 -b 4 -p 8192 -g 1 --profile-warmup 1 --profile-iters 2 --profile-contexts 1 \
    -o "$LOG/longfwd.h5" --force >"$LOG/longfwd" 2>&1
  rc=$?
  tail -12 "$LOG/longfwd"
  if [ "$rc" = 0 ]; then RESULT[longfwd]="ok (profiled without a hang)"
  elif [ "$rc" = 124 ]; then RESULT[longfwd]="TIMED OUT: a held forward of > 2,000 launches hangs (issue 17 item 1)"
  else RESULT[longfwd]="FAILED rc=$rc"; fi
else
  RESULT[longfwd]="skipped (no ppbench binary or no mpirun)"
fi

# ---- 5f. mixture of experts and MLA (issue 15) --------------------------------------------------
# The tiny DeepSeek-V3 (MLA, grouped sigmoid router, shared experts, MTP module) and gpt-oss
# (sinks, biased experts) on 2 ranks sharing the GPU, validated; then a profile of Qwen3-30B-A3B
# (48 MoE layers of 128 experts, top-8), whose decode reads only the experts its tokens reach.
step "mixture of experts on the GPU: tiny DeepSeek-V3 --mtp and gpt-oss runs, Qwen3-30B-A3B profile"
if [ "$LANES_HANG" = 1 ]; then
  RESULT[moe]="skipped: lane host tasks hang with either stream wait (see the lane tests)"
elif [ -x "$PPB_BIN" ] && command -v mpirun >/dev/null; then
  moe=""
  for cfg in "tests/data/tiny-deepseek-v3.json --mtp" tests/data/tiny-gpt-oss.json; do
    name=$(basename "${cfg%% *}" .json)
    # shellcheck disable=SC2086  # cfg carries the flag
    timeout "$(tmo 60)" mpirun --oversubscribe -np 2 "$PPB_BIN" run --model $cfg --device cuda --transport mpi \
      --dtype bf16 -b 4 -p 64 -g 16 --iters 2 --target-ci 0 -o "$LOG/$name.h5" --force >"$LOG/$name" 2>&1
    mrc=$?
    grep -E 'experts|validation' "$LOG/$name" | head -4
    moe="$moe$name rc=$mrc; "
  done
  timeout "$(tmo 90)" mpirun -np 1 "$PPB_BIN" profile --model inputs/models/qwen3-30b-a3b.json --device cuda \
    --dtype bf16 -b 8 -p 512 -g 4 --profile-warmup 1 --profile-iters 3 -o "$LOG/moe_profile.h5" --force >"$LOG/moe_profile" 2>&1
  mrc=$?
  tail -8 "$LOG/moe_profile"
  RESULT[moe]="${moe}qwen3-30b-a3b profile rc=$mrc"
else
  RESULT[moe]="skipped (no ppbench binary or no mpirun)"
fi

# ---- 5c. two stages through NCCL (two GPUs) -------------------------------------------------------
if [ "${PPB_EXPECT_GPUS:-0}" -ge 2 ] && [ -x "$PPB_BIN" ] && command -v mpirun >/dev/null; then
  step "mpirun -np 2 ppbench run, one GPU per rank, NCCL transport, validated"
  timeout "$(tmo 120)" mpirun -np 2 "$PPB_BIN" run --model inputs/models/qwen3-0.6b.json --device cuda \
    --transport nccl --dtype bf16 -b 4 -p 128 -g 32 --iters 3 --target-ci 0 -o "$LOG/nccl.h5" --force >"$LOG/nccl" 2>&1
  rc=$?
  tail -20 "$LOG/nccl"
  if [ "$rc" = 0 ]; then RESULT[nccl]="ok (validated)"; elif [ "$rc" = 124 ]; then RESULT[nccl]="TIMED OUT"; else RESULT[nccl]="FAILED rc=$rc"; fi
else
  RESULT[nccl]="skipped (needs two GPUs; nvidia-smi lists ${PPB_EXPECT_GPUS:-0})"
fi

# ---- 5e. tensor parallelism (two GPUs) ------------------------------------------------------------
# A stage of width 2 is one NCCL group of two GPUs: it cannot run on one (NCCL refuses two ranks
# on one GPU), so on one GPU this step only says so.
if [ "${PPB_EXPECT_GPUS:-0}" -ge 2 ] && [ -x "$PPB_BIN" ] && command -v mpirun >/dev/null; then
  step "tensor parallelism: the width-2 stage test, then mpirun -np 2 ppbench run --tp 1 --tp 2"
  tp_test=skipped
  if [ -x "$TEST_BIN" ]; then
    timeout "$(tmo 60)" "$TEST_BIN" --gtest_filter='CudaStage.TensorParallel*' >"$LOG/tp_test" 2>&1 && tp_test=ok || tp_test="FAILED rc=$?"
    tail -5 "$LOG/tp_test"
  fi
  timeout "$(tmo 150)" mpirun -np 2 "$PPB_BIN" run --model inputs/models/qwen3-0.6b.json --device cuda --dtype bf16 \
    -b 4 -p 128 -g 32 --iters 3 --target-ci 0 --tp 1 --tp 2 -o "$LOG/tp.h5" --force >"$LOG/tp" 2>&1
  rc=$?
  grep -A4 'layouts side by side' "$LOG/tp"
  tail -3 "$LOG/tp"
  if [ "$rc" = 0 ]; then RESULT[tp]="test $tp_test; run ok (validated): $(grep -A3 'layouts side by side' "$LOG/tp" | tail -2 | awk '{printf "%s %s tok/s TPOT %s ms; ", $1, $4, $7}')"
  elif [ "$rc" = 124 ]; then RESULT[tp]="test $tp_test; run TIMED OUT"
  else RESULT[tp]="test $tp_test; run FAILED rc=$rc"; fi
else
  RESULT[tp]="skipped (tensor parallelism needs two GPUs; nvidia-smi lists ${PPB_EXPECT_GPUS:-0})"
fi

# ---- 5d. decode from CUDA graphs vs eager ---------------------------------------------------------
# A small model's decode step is host-bound when each kernel is launched (a Qwen3-0.6B layer:
# ~11 launches of a few µs against ~25-35 µs of GPU work); replayed from a graph, one launch per
# step. The profile times what the pipeline runs, so the simulator's decode error should be small
# both ways; the gain is the ratio of the two decode tokens/s, measured one after the other.
step "decode A/B: CUDA graphs vs eager (--no-cuda-graphs), Qwen3-0.6B, one rank"
if [ "$LANES_HANG" = 1 ]; then
  RESULT[graphs]="skipped: lane host tasks hang with either stream wait (see the lane tests)"
elif [ "$(tmo 60)" -lt 40 ]; then
  RESULT[graphs]="skipped: under 40 s of the budget left (PPB_GPU_CHECK_BUDGET)"
elif [ -x "$PPB_BIN" ] && command -v mpirun >/dev/null; then
  declare -A DEC SIM RC
  for mode in graphs eager; do
    extra=
    [ "$mode" = eager ] && extra=--no-cuda-graphs
    timeout "$(tmo 90)" mpirun -np 1 "$PPB_BIN" run --model inputs/models/qwen3-0.6b.json --device cuda --dtype bf16 \
      -b 4 -p 128 -g 64 --iters 3 --target-ci 0 --partition uniform $extra -o "$LOG/$mode.h5" --force >"$LOG/$mode" 2>&1
    RC[$mode]=$?
    grep -E '^  (tokens/s|simulator)' "$LOG/$mode"
    DEC[$mode]=$(grep -m1 -oE 'tokens/s [0-9.]+ \(decode [0-9.]+' "$LOG/$mode" | awk '{print $4}')
    SIM[$mode]=$(grep -m1 -oE '\([-+0-9.]+% vs measured' "$LOG/$mode" | grep -oE '[-+0-9.]+%')
  done
  if [ "${RC[graphs]}" = 0 ] && [ "${RC[eager]}" = 0 ] && [ -n "${DEC[graphs]}" ] && [ -n "${DEC[eager]}" ]; then
    RESULT[graphs]="decode tok/s graphs ${DEC[graphs]} vs eager ${DEC[eager]} ($(awk -v a="${DEC[graphs]}" -v b="${DEC[eager]}" 'BEGIN {printf "%.2fx", a / b}')); simulator decode error graphs ${SIM[graphs]:-?}, eager ${SIM[eager]:-?}"
  elif [ "${RC[graphs]}" = 124 ] || [ "${RC[eager]}" = 124 ]; then
    RESULT[graphs]="TIMED OUT (budget; rc graphs=${RC[graphs]} eager=${RC[eager]})"
  else
    RESULT[graphs]="FAILED rc graphs=${RC[graphs]} eager=${RC[eager]}"
  fi
else
  RESULT[graphs]="skipped (no ppbench binary or no mpirun)"
fi

# ---- 6. PyTorch eager ----------------------------------------------------------------------------
step "PyTorch eager, same layer"
if timeout 60 python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  timeout "$(tmo 120)" python3 scripts/torch_layer.py --model inputs/models/llama-3.1-8b.json --bench "$BENCH" >"$LOG/torch" 2>&1
  rc=$?
  cat "$LOG/torch"
  n=$(grep -c 'torch/ppbench' "$LOG/torch")
  if [ "$rc" = 0 ] && [ "$n" = 2 ]; then
    RESULT[torch]="ok: $(grep 'torch/ppbench' "$LOG/torch" | awk '{print $1, $NF}' | tr '\n' ' ')"
  else
    RESULT[torch]="FAILED rc=$rc"
  fi
else
  RESULT[torch]="PyTorch with CUDA not importable: skipped"
fi
# The summary table: the EXIT trap.
