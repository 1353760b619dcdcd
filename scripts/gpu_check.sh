#!/usr/bin/env bash
# One-call GPU check of the CUDA backend, a few minutes on one H200. Short, decisive steps first:
#   1. binaries: the prebuilt bundle if carried (see below), else configure + build (sm_90 only)
#   2. kernel resource usage (registers, shared/local memory, from cuobjdump)
#   3. tests: kernel tests (CUDA vs CPU twins, CUDA stage vs CPU stage), lanes, MoE/MLA kernels
#   4. mpirun: mpirun -np 2 ppbench run sharing the GPU (MPI transport), with validation
#   4b. abort: the same with rank 1 stalled on purpose: the job must end within --timeout
#   5. nccl: a two-stage run through NCCL, where nvidia-smi lists two GPUs
#   6. graphs: decode replayed from CUDA graphs vs eager (--no-cuda-graphs): Qwen3-0.6B on one
#      rank, decode tokens/s of each and the simulator's error against it
#   7. bench: ceilings + Llama-3.1-8B layer/head vs floors (ppb_gpu_bench), a Qwen3-30B-A3B
#      (experts) and a DeepSeek-V3 (MLA + experts) layer vs theirs, NCCL send/recv and
#      all-reduce sweeps where two GPUs exist
#   8. moe: tiny DeepSeek-V3 --mtp and gpt-oss runs, a Qwen3-30B-A3B profile
#   9. longfwd: ppbench profile of a Llama-3.1-8B layer at B=4, P=8192 (> 2,000 launches)
#  10. tp: the width-2 stage test, then mpirun -np 2 ppbench run --tp 1 --tp 2, where nvidia-smi
#      lists two GPUs (NCCL refuses two ranks on one GPU)
#  11. torch: the same layer in PyTorch eager, if importable
# Every step runs under a timeout carved from one budget (PPB_GPU_CHECK_BUDGET seconds, default
# 420: a call of the device tool then ends within 8 minutes and leaves time to rerun once); a
# failing step does not stop the next, and the summary table is printed last. Each step ends
# ok, skip (with the reason: no second GPU, no PyTorch) or FAIL; the exit status is 1 when any
# step selected failed or was not reached, else 0. PPB_GPU_CHECK_STEPS=tests,mpirun (a comma
# list of the names above) runs only those steps (binaries always).
#
#   scripts/gpu_check.sh [build-dir]          on the GPU machine (default build-gpu)
#   scripts/gpu_check.sh --pack [build-dir]   on a machine WITH the build dependencies and nvcc
#
# The GPU machine's image may lack ppbench's build dependencies (MPI, HDF5, OpenBLAS, GTest,
# nlohmann-json, CLI11, NCCL headers) and cannot install any. --pack builds the binaries here
# (sm_90; a build directory already configured keeps its architectures) and writes
# BUILD/ppb-gpu-bundle.tar.xz (or PPB_BUNDLE_OUT): the binaries, the shared libraries they
# need (not glibc, libstdc++, the driver, cuBLAS or NCCL: those come from the GPU machine's CUDA
# and PyTorch), and Open MPI's runtime (mpirun, its components, relocated with OPAL_PREFIX) for
# a machine without one. Carry that one file to the GPU machine (device run: carry
# ["build-gpu/ppb-gpu-bundle.tar.xz"]); when it is there, step 1 uses it, checks that every
# library it needs resolves in it or on the machine (verify_bundle), and builds nothing.
# scripts/gpu_kernels.sh then gives one case's kernels under Nsight Compute (docs/GPU.md).
set -u
cd "$(dirname "$0")/.."
ARCH=${PPB_CUDA_ARCH:-90}
JOBS=$(nproc)
BUNDLE_NAME=ppb-gpu-bundle.tar.xz
# The shared libraries the GPU machine provides itself, so the bundle leaves them out: glibc,
# the C++ runtime, the driver, cuBLAS and NCCL (the CUDA toolkit or PyTorch's pip wheels there).
HOST_LIBS_RE='/(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libnvidia-[a-z-]*|libcublas|libcublasLt|libnccl)\.so'

# Points the environment at an unpacked bundle in $1: its libraries first, then cuBLAS, NCCL and
# the CUDA runtime wherever this machine has them; its mpirun (relocated with OPAL_PREFIX).
use_bundle() {
  local b=$1 libdirs=$1/lib l d
  for l in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudart.so.13; do
    d=$(find -H /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib/x86_64-linux-gnu /opt /usr/local/lib \
          -maxdepth 9 -name "$l" 2>/dev/null | head -1)
    [ -n "$d" ] && case ":$libdirs:" in *":$(dirname "$d"):"*) ;; *) libdirs=$libdirs:$(dirname "$d") ;; esac
  done
  export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=$b/ompi/usr PATH=$b/ompi/usr/bin:$PATH OMPI_MCA_mca_base_component_show_load_errors=0 \
    PMIX_MCA_mca_base_component_path=$b/ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
}

# Checks, after use_bundle, that every executable and library of the unpacked bundle in $1
# resolves each library it needs either inside the bundle or to one HOST_LIBS_RE allows (what
# the GPU machine has); prints each offender ("not found" or a system path) and returns 1 if any.
verify_bundle() {
  local b=$1 bad
  bad=$(find "$b/bin" "$b/lib" "$b/ompi/usr/bin" "$b/ompi/usr/lib" -type f \( -perm -u+x -o -name '*.so*' \) 2>/dev/null |
    while read -r f; do
      [ "$(head -c 4 "$f" 2>/dev/null | tail -c 3)" = ELF ] || continue
      ldd "$f" 2>/dev/null | awk -v f="${f#"$b"/}" '$2 == "=>" {print f ": " $1 " => " $3}'
    done | awk -v b="$b/" -v re="$HOST_LIBS_RE" '$4 == "not" || (index($4, b) != 1 && $4 !~ re)' | sort -u)
  if [ -n "$bad" ]; then
    echo "bundle: libraries neither in the bundle nor on the GPU machine's list:"
    echo "$bad" | head -30
    return 1
  fi
  return 0
}

if [ "${1:-}" = "--pack" ]; then
  set -e
  BUILD=${2:-build-gpu}
  # A build directory already configured keeps its own CUDA architectures (they must include
  # 90); a new one is configured for sm_$ARCH alone.
  [ -f "$BUILD/CMakeCache.txt" ] ||
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >/dev/null
  cmake --build "$BUILD" -j"$JOBS" --target test_cuda_kernels test_cuda_moe test_cuda_mla test_cuda_ragged test_cuda_stage_ragged ppb_gpu_bench ppbench
  OUT_FILE=${PPB_BUNDLE_OUT:-$BUILD/$BUNDLE_NAME}
  st=$(mktemp -d)
  mkdir -p "$st/bin" "$st/lib" "$st/ompi/usr/bin" "$st/ompi/usr/lib/x86_64-linux-gnu" "$st/ompi/usr/share"
  cp "$BUILD/tests/test_cuda_kernels" "$BUILD/tests/test_cuda_moe" "$BUILD/tests/test_cuda_mla" \
    "$BUILD/tests/test_cuda_ragged" "$BUILD/tests/test_cuda_stage_ragged" \
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
  # Shared libraries of the binaries and of Open MPI's components, except HOST_LIBS_RE's.
  { for f in "$st"/bin/* "$st"/ompi/usr/bin/orterun "$st"/ompi/usr/bin/orted "$ompi_lib"/lib/openmpi3/*.so "$pmix"/lib/pmix/*.so; do
      ldd "$f" 2>/dev/null || true; done; } |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | grep -v -E "$HOST_LIBS_RE" |
    while read -r l; do cp -L "$l" "$st/lib/"; done
  # xz -3 on every core: 150 MB packed in 16 s to 31.5 MB on 2 cores, against 62 s to 27.3 MB
  # with tar -J's default (-6, one thread); the device tool carries 64 MiB with the repo.
  XZ_OPT="-3 -T0" tar -C "$st" -cJf "$OUT_FILE" .
  rm -rf "$st"
  ls -l "$OUT_FILE"
  echo "carry $OUT_FILE to the GPU machine and run scripts/gpu_check.sh $(dirname "$OUT_FILE") there"
  exit 0
fi

BUILD=${1:-build-gpu}
LOG=$(mktemp -d)
TEST_BIN= BENCH_BIN= PPB_BIN= LANES_HANG=0 MOE_TEST_BINS=
STEPS="binaries tests mpirun abort nccl graphs bench moe longfwd tp torch"
declare -A RESULT STATUS
t0=$(date +%s)
BUDGET=${PPB_GPU_CHECK_BUDGET:-420}
step() { echo; echo "=== $* ($(( $(date +%s) - t0 )) s)"; }
# Timeout of a step: at most `$1` s, and never past the budget (minus 10 s kept for the summary).
tmo() {
  local left=$(( t0 + BUDGET - 10 - $(date +%s) ))
  [ "$left" -lt "$1" ] && set -- "$left"
  [ "$1" -lt 5 ] && set -- 5
  echo "$1"
}
# result STEP ok|skip|FAIL TEXT: the step's line in the summary and its part of the exit status.
# PPB_GPU_CHECK_FAIL=STEP fails that step on purpose (the exit status's test).
result() {
  STATUS[$1]=$2 RESULT[$1]=$3
  if [ "${PPB_GPU_CHECK_FAIL:-}" = "$1" ]; then STATUS[$1]=FAIL RESULT[$1]="failed on purpose (PPB_GPU_CHECK_FAIL); was: $2 $3"; fi
}
# True when step $1 is selected (PPB_GPU_CHECK_STEPS, default all); an unselected step is
# marked so and counts as neither pass nor failure.
want() {
  [ -z "${PPB_GPU_CHECK_STEPS:-}" ] && return 0
  case ",$PPB_GPU_CHECK_STEPS,binaries," in *",$1,"*) return 0 ;; esac
  result "$1" "-" "not selected (PPB_GPU_CHECK_STEPS)"
  return 1
}
summary_done=0
summary() {
  local rc=$? failed=0
  [ "$summary_done" = 1 ] && return
  summary_done=1
  step "summary"
  printf '%-10s %-5s %s\n' "step" "" "result"
  for k in $STEPS; do
    local st=${STATUS[$k]:-FAIL}
    printf '%-10s %-5s %s\n' "$k" "$st" "${RESULT[$k]:-not reached}"
    [ "$st" = FAIL ] && failed=$(( failed + 1 ))
  done
  echo
  grep -E '^(ceilings|layer|head|targets|nccl)' "$LOG/bench" 2>/dev/null
  for f in "$LOG"/bench_*; do [ -f "$f" ] && grep -E '^(layer|head) ' "$f" | sed "s/^/${f##*/bench_} /"; done
  grep -E 'torch/ppbench' "$LOG/torch" 2>/dev/null
  # The device tool brings back what is under $OUT (8 files at most): every log and results
  # file of the check in one archive (not the unpacked bundle: 100+ MB of binaries).
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    tar -C "$LOG" --exclude=./bundle -czf "$OUT/gpu_check_logs.tar.gz" . 2>/dev/null
    echo "total $(( $(date +%s) - t0 )) s; logs in $LOG, archived to \$OUT/gpu_check_logs.tar.gz"
  else
    echo "total $(( $(date +%s) - t0 )) s; logs in $LOG"
  fi
  rm -rf "$LOG/bundle"  # the unpacked binaries (100+ MB): not a log
  if [ "$failed" -gt 0 ]; then
    echo "gpu_check: $failed step(s) FAILED or not reached"
    exit 1
  fi
  [ "$rc" -ne 0 ] && exit "$rc"
  echo "gpu_check: every selected step ok or skipped"
  exit 0
}
trap summary EXIT
trap 'exit 130' INT TERM
# What the lanes need before any CUDA call (ppbench sets the same itself; the test binaries
# and PyTorch do not): every kernel loaded at context creation, a hardware queue per stream.
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER} CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}

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
    MOE_TEST_BINS="$B/bin/test_cuda_moe $B/bin/test_cuda_mla $B/bin/test_cuda_ragged $B/bin/test_cuda_stage_ragged"
    use_bundle "$B"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    if verify_bundle "$B"; then result binaries ok "bundle"; else result binaries FAIL "bundle: libraries missing (above)"; fi
  else
    result binaries FAIL "could not unpack the bundle"
  fi
else
  step "binaries: build ($BUILD, sm_$ARCH)"
  TEST_BIN=$BUILD/tests/test_cuda_kernels BENCH_BIN=$BUILD/src/backend/cuda/ppb_gpu_bench PPB_BIN=$BUILD/ppbench
  MOE_TEST_BINS="$BUILD/tests/test_cuda_moe $BUILD/tests/test_cuda_mla $BUILD/tests/test_cuda_ragged $BUILD/tests/test_cuda_stage_ragged"
  if timeout "$(tmo 300)" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$LOG/cfg" 2>&1 &&
     timeout "$(tmo 300)" cmake --build "$BUILD" -j"$JOBS" --target test_cuda_kernels test_cuda_moe test_cuda_mla test_cuda_ragged test_cuda_stage_ragged ppb_gpu_bench ppbench >"$LOG/build" 2>&1; then
    result binaries ok "built in $(( $(date +%s) - t0 )) s"
  else
    tail -30 "$LOG/cfg" "$LOG/build" 2>/dev/null
    result binaries FAIL "build failed (missing dependencies? run scripts/gpu_check.sh --pack where they are, carry the bundle)"
  fi
fi
have_mpi() { [ -x "$PPB_BIN" ] && command -v mpirun >/dev/null; }
# True when step $1 can run ppbench under mpirun; else the step fails saying why.
need_mpi() { have_mpi && return 0; result "$1" FAIL "no ppbench binary or no mpirun"; return 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ---- 2. resource usage ----------------------------------------------------------------------
step "kernel resource usage (sm_90: registers, shared, local = spills/stack)"
CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null)
if [ -x "$TEST_BIN" ] && [ -n "$CUOBJDUMP" ]; then
  "$CUOBJDUMP" --dump-resource-usage "$TEST_BIN" 2>/dev/null |
    awk '/^[[:space:]]*Function/ {f=$2; sub(/:$/, "", f)} /REG:/ {print f, $0}' |
    { command -v c++filt >/dev/null && c++filt || cat; } |
    sed -E 's/ppb::cuda::(\(anonymous namespace\)::)?//g; s/__nv_bfloat16/bf16/g; s/\(.*\) +REG/ REG/; s/[[:space:]]+(TEXTURE|SURFACE|SAMPLER):[0-9]+//g' |
    sort -u > "$LOG/resources"
  echo "$(wc -l < "$LOG/resources") kernels (full list in resources); any with local memory (spills, stack):"
  grep -vE 'LOCAL:0( |$)' "$LOG/resources" | cut -c1-150 | head -20
else
  echo "skipped (no test binary or no cuobjdump)"
fi

# ---- 3. tests ---------------------------------------------------------------------------------
# Kernels and stages first; the lane tests (host tasks: the stream waits on a host-written
# counter through cuStreamWaitValue32) apart, with a short timeout: if that wait never sees the
# host's write, only they hang, and they are retried with the spin-kernel fallback
# (PPB_CUDA_SPIN_WAIT=1), which the later steps then keep.
gtest_sum() { grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$1" | tr -s ' \n' ' '; }
if want tests && [ -x "$TEST_BIN" ]; then
  step "kernel tests"
  timeout "$(tmo 150)" "$TEST_BIN" --gtest_brief=1 --gtest_filter='-CudaLanes*' >"$LOG/tests" 2>&1
  rc=$?
  tail -40 "$LOG/tests"
  text="kernels rc=$rc $(gtest_sum "$LOG/tests")"
  [ "$rc" = 124 ] && text="$text TIMED OUT"
  if grep -q "but CUDA sees none" "$LOG/tests"; then
    text="nvidia-smi lists $PPB_EXPECT_GPUS GPU(s) but CUDA sees none ($(grep -m1 -o 'CUDA sees none: .*' "$LOG/tests"))"
  fi
  step "lane tests (host tasks, events, copies, aborts)"
  timeout "$(tmo 40)" "$TEST_BIN" --gtest_filter='CudaLanes*' >"$LOG/lanes" 2>&1  # not brief: a hang names its test
  lrc=$?
  tail -15 "$LOG/lanes"
  if [ "$lrc" = 124 ]; then
    # Which test hung: the last one gtest started.
    hung=$(grep -oE '^\[ RUN      \] [A-Za-z_.]+' "$LOG/lanes" | tail -1 | awk '{print $NF}')
    echo "lane tests timed out in ${hung:-?}: again with PPB_CUDA_SPIN_WAIT=1 (spin-kernel stream wait)"
    PPB_CUDA_SPIN_WAIT=1 timeout "$(tmo 40)" "$TEST_BIN" --gtest_brief=1 --gtest_filter='CudaLanes*' >"$LOG/lanes_spin" 2>&1
    src=$?
    tail -15 "$LOG/lanes_spin"
    [ "$src" = 0 ] && export PPB_CUDA_SPIN_WAIT=1
    [ "$src" = 124 ] && LANES_HANG=1
    text="$text; lanes TIMED OUT in ${hung:-?}, with PPB_CUDA_SPIN_WAIT=1 rc=$src"
  else
    text="$text; lanes rc=$lrc $(gtest_sum "$LOG/lanes")"
  fi
  [ "$lrc" != 0 ] && rc=$lrc
  # Issue 15's kernels (router, dispatch, grouped expert GEMMs, combine; MLA, sinks, MTP input);
  # issue 37's ragged attention and the stage's ragged forward against its CPU twin.
  for tb in $MOE_TEST_BINS; do
    [ -x "$tb" ] || { text="$text; $(basename "$tb") not built"; rc=1; continue; }
    timeout "$(tmo 60)" "$tb" --gtest_brief=1 >"$LOG/$(basename "$tb")" 2>&1
    mrc=$?
    tail -15 "$LOG/$(basename "$tb")"
    text="$text; $(basename "$tb") rc=$mrc $(gtest_sum "$LOG/$(basename "$tb")")"
    [ "$mrc" != 0 ] && rc=$mrc
  done
  # A failing kernel usually shows only as a wrong result or a later "illegal address": rerun
  # the failed tests under compute-sanitizer, which names the kernel and the bad access (it
  # runs on Firecracker machines, not on gVisor ones).
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  failed=$(cat "$LOG/tests" "$LOG/lanes" | grep -E '^\[  FAILED  \] [A-Za-z_]+\.[A-Za-z_]+ \(' | awk '{print $4}' | sort -u | paste -sd: -)
  if [ -n "$failed" ] && [ -n "$SANITIZER" ] && [ "$(tmo 60)" -ge 30 ]; then
    step "compute-sanitizer on $failed"
    timeout "$(tmo 60)" "$SANITIZER" --tool memcheck --print-limit 20 "$TEST_BIN" --gtest_brief=1 \
      --gtest_filter="$failed" >"$LOG/sanitizer" 2>&1
    grep -E '^=========|FAILED|PASSED' "$LOG/sanitizer" | head -40
    text="$text; sanitizer: $(grep -m1 -E 'ERROR SUMMARY' "$LOG/sanitizer" | sed 's/^=* *//')"
  fi
  if [ "$rc" = 0 ]; then result tests ok "$text"; else result tests FAIL "$text"; fi
elif want tests; then
  result tests FAIL "test binary not built"
fi
lanes_hang() { [ "$LANES_HANG" = 1 ] && result "$1" FAIL "not run: lane host tasks hang with either stream wait (see the lane tests)"; }

# ---- 4. the whole program: 2 ranks on the GPU --------------------------------------------------
if want mpirun && ! lanes_hang mpirun && need_mpi mpirun; then
  step "mpirun -np 2 ppbench run, 2 ranks sharing the GPU (MPI transport), validated"
  # The ranks are forked locally: they inherit this environment (the bundle's library path).
  timeout "$(tmo 120)" mpirun --oversubscribe -np 2 "$PPB_BIN" run \
    --model inputs/models/qwen3-0.6b.json --device cuda --transport mpi --dtype bf16 -b 4 -p 128 -g 32 --iters 3 --target-ci 0 \
    --timeout 60 -o "$LOG/run.h5" --force >"$LOG/run" 2>&1
  rc=$?
  tail -30 "$LOG/run"
  if [ "$rc" = 0 ]; then result mpirun ok "validated: $(grep -m1 -E '^  tokens/s' "$LOG/run" | tr -s ' ')"
  elif [ "$rc" = 124 ]; then result mpirun FAIL "TIMED OUT"
  else result mpirun FAIL "rc=$rc (see the run log)"; fi
fi

# ---- 4b. a stalled rank on the GPU: the job must fail fast, not hang -------------------------------
# Rank 1 stops answering at item 3 of its first timed repetition (PPBENCH_FAULT, as the CPU
# test Faults.StalledRankEndsJobNamingTheWaitingStage): rank 0's receive times out after
# --timeout 5 s, its lanes abort (streams released, device memory given up, the transport
# aborted) and the job ends with a non-zero status well before the step's 90 s.
if want abort && ! lanes_hang abort && need_mpi abort; then
  step "a stalled rank on the GPU: the job ends within --timeout, not a hang"
  a0=$(date +%s)
  PPBENCH_FAULT=stall:1:3 timeout "$(tmo 90)" mpirun --oversubscribe -x PPBENCH_FAULT -np 2 "$PPB_BIN" run \
    --model inputs/models/qwen3-0.6b.json --device cuda --transport mpi --dtype bf16 -b 4 -p 128 -g 32 --iters 3 \
    --target-ci 0 --timeout 5 -o "$LOG/abort.h5" --force >"$LOG/abort" 2>&1
  rc=$? secs=$(( $(date +%s) - a0 ))
  grep -E 'timed out|\] lane ' "$LOG/abort" | head -12
  # The flight recorder's report (common/flight_recorder.h): rank 1's compute lane running the
  # injected stall.
  fr=no
  grep -qE '^\[rank 1\] lane compute .*injected stall' "$LOG/abort" && fr=yes
  if [ "$rc" = 124 ]; then result abort FAIL "HUNG: the job outlived the step's timeout"
  elif [ "$rc" = 0 ]; then result abort FAIL "a stalled rank and the job succeeded?"
  elif grep -q 'timed out' "$LOG/abort" && [ "$fr" = yes ]; then
    result abort ok "ended in $secs s with status $rc, naming the time-out; the flight record names rank 1's stalled compute lane"
  else result abort FAIL "ended in $secs s with status $rc; time-out named: $(grep -c 'timed out' "$LOG/abort"), flight record names the stall: $fr"; fi
fi

# ---- 5. two stages through NCCL (two GPUs) -------------------------------------------------------
if want nccl && ! lanes_hang nccl; then
  if [ "${PPB_EXPECT_GPUS:-0}" -lt 2 ]; then
    result nccl skip "needs two GPUs (NCCL refuses two ranks on one); nvidia-smi lists ${PPB_EXPECT_GPUS:-0}"
  elif need_mpi nccl; then
    step "mpirun -np 2 ppbench run, one GPU per rank, NCCL transport, validated"
    timeout "$(tmo 120)" mpirun -np 2 "$PPB_BIN" run --model inputs/models/qwen3-0.6b.json --device cuda \
      --transport nccl --dtype bf16 -b 4 -p 128 -g 32 --iters 3 --target-ci 0 --timeout 60 -o "$LOG/nccl.h5" --force >"$LOG/nccl" 2>&1
    rc=$?
    tail -20 "$LOG/nccl"
    if [ "$rc" = 0 ]; then result nccl ok "validated"; elif [ "$rc" = 124 ]; then result nccl FAIL "TIMED OUT"; else result nccl FAIL "rc=$rc"; fi
  fi
fi

# ---- 6. decode from CUDA graphs vs eager ---------------------------------------------------------
# A small model's decode step is host-bound when each kernel is launched (a Qwen3-0.6B layer:
# ~11 launches of a few µs against ~25-35 µs of GPU work); replayed from a graph, one launch per
# step. The profile times what the pipeline runs, so the simulator's decode error should be small
# both ways; the gain is the ratio of the two decode tokens/s, measured one after the other.
if want graphs && ! lanes_hang graphs && need_mpi graphs; then
  step "decode A/B: CUDA graphs vs eager (--no-cuda-graphs), Qwen3-0.6B, one rank"
  declare -A DEC SIM RC
  for mode in graphs eager; do
    extra=
    [ "$mode" = eager ] && extra=--no-cuda-graphs
    timeout "$(tmo 75)" mpirun -np 1 "$PPB_BIN" run --model inputs/models/qwen3-0.6b.json --device cuda --dtype bf16 \
      -b 4 -p 128 -g 64 --iters 3 --target-ci 0 --partition uniform $extra --timeout 60 -o "$LOG/$mode.h5" --force >"$LOG/$mode" 2>&1
    RC[$mode]=$?
    grep -E '^  (tokens/s|simulator)' "$LOG/$mode"
    DEC[$mode]=$(grep -m1 -oE 'tokens/s [0-9.]+ \(decode [0-9.]+' "$LOG/$mode" | awk '{print $4}')
    SIM[$mode]=$(grep -m1 -oE 'decode [0-9.]+ \([-+0-9.]+%\) vs measured' "$LOG/$mode" | grep -oE '[-+0-9.]+%')
  done
  if [ "${RC[graphs]}" = 0 ] && [ "${RC[eager]}" = 0 ] && [ -n "${DEC[graphs]}" ] && [ -n "${DEC[eager]}" ]; then
    result graphs ok "decode tok/s graphs ${DEC[graphs]} vs eager ${DEC[eager]} ($(awk -v a="${DEC[graphs]}" -v b="${DEC[eager]}" 'BEGIN {printf "%.2fx", a / b}')); simulator decode error graphs ${SIM[graphs]:-?}, eager ${SIM[eager]:-?}"
  else
    result graphs FAIL "rc graphs=${RC[graphs]} eager=${RC[eager]} (124: timed out)"
  fi
fi

# ---- 7. ceilings, layer and head vs floors; NCCL links ---------------------------------------------
# The dense Llama-3.1-8B layer against issue 3's targets; then a layer of experts (Qwen3-30B-A3B)
# and one of latent attention and 256 experts (DeepSeek-V3, unit 4) against their floors.
if want bench; then
  step "ceilings and Llama-3.1-8B layer/head vs floors; NCCL send/recv and all-reduce where two GPUs"
  BENCH="$LOG/bench.txt"
  if [ -x "$BENCH_BIN" ]; then
    nccl_flag=
    [ "${PPB_EXPECT_GPUS:-0}" -ge 2 ] && nccl_flag=--nccl
    timeout "$(tmo 120)" "$BENCH_BIN" --model inputs/models/llama-3.1-8b.json --dtype bf16 \
      --prompt 2048 --batch 8 --context 2048 --iters 20 $nccl_flag --out "$BENCH" >"$LOG/bench" 2>&1
    rc=$?
    cat "$LOG/bench"
    # NCCL rows (gpu_nccl_bench.h): nccl OP SIZE TIME_US ALGBW BUSBW #WRONG; any wrong element fails.
    nccl_note=
    if [ -n "$nccl_flag" ] && [ "$rc" = 0 ]; then
      wrong=$(awk '$1 == "nccl" && $3 ~ /^[0-9]+$/ && $7 != 0' "$LOG/bench" | wc -l)
      big=$(awk '$1 == "nccl" && $3 == 268435456 { printf "%s %s GB/s busbw, ", $2, $6 }' "$LOG/bench")
      nccl_note="; NCCL at 256 MiB: ${big}rows with wrong elements: $wrong"
      [ "$wrong" = 0 ] || rc=1
    fi
    text="$(grep -E '^targets' "$LOG/bench" | sed -E 's/^targets[^:]*: //; s/;.*//')$nccl_note"
    for mu in "qwen3-30b-a3b 1" "deepseek-v3 4"; do
      set -- $mu
      step "$1 layer (unit $2) and head vs floors"
      timeout "$(tmo 90)" "$BENCH_BIN" --model "inputs/models/$1.json" --dtype bf16 --prompt 2048 --batch 8 \
        --context 2048 --iters 5 --unit "$2" >"$LOG/bench_$1" 2>&1
      mrc=$?
      cat "$LOG/bench_$1"
      text="$text; $1 rc=$mrc"
      [ "$mrc" != 0 ] && rc=$mrc
    done
    if [ "$rc" = 0 ]; then result bench ok "$text"; else result bench FAIL "rc=$rc; $text"; fi
  else
    result bench FAIL "not built"
  fi
fi

# ---- 8. mixture of experts and MLA ----------------------------------------------------------------
# The tiny DeepSeek-V3 (MLA, grouped sigmoid router, shared experts, MTP module) and gpt-oss
# (sinks, biased experts) on 2 ranks sharing the GPU, validated; then a profile of Qwen3-30B-A3B
# (48 MoE layers of 128 experts, top-8), whose decode reads only the experts its tokens reach.
if want moe && ! lanes_hang moe && need_mpi moe; then
  step "mixture of experts on the GPU: tiny DeepSeek-V3 --mtp and gpt-oss runs, Qwen3-30B-A3B profile"
  moe="" bad=0
  for cfg in "tests/data/tiny-deepseek-v3.json --mtp" tests/data/tiny-gpt-oss.json; do
    name=$(basename "${cfg%% *}" .json)
    # shellcheck disable=SC2086  # cfg carries the flag
    timeout "$(tmo 60)" mpirun --oversubscribe -np 2 "$PPB_BIN" run --model $cfg --device cuda --transport mpi \
      --dtype bf16 -b 4 -p 64 -g 16 --iters 2 --target-ci 0 --timeout 45 -o "$LOG/$name.h5" --force >"$LOG/$name" 2>&1
    mrc=$?
    grep -E 'experts|validation' "$LOG/$name" | head -4
    moe="$moe$name rc=$mrc; "
    [ "$mrc" != 0 ] && bad=1
  done
  timeout "$(tmo 80)" mpirun -np 1 "$PPB_BIN" profile --model inputs/models/qwen3-30b-a3b.json --device cuda \
    --dtype bf16 -b 8 -p 512 -g 4 --profile-warmup 1 --profile-iters 3 -o "$LOG/moe_profile.h5" --force >"$LOG/moe_profile" 2>&1
  mrc=$?
  tail -8 "$LOG/moe_profile"
  [ "$mrc" != 0 ] && bad=1
  if [ "$bad" = 0 ]; then result moe ok "${moe}qwen3-30b-a3b profile rc=0"; else result moe FAIL "${moe}qwen3-30b-a3b profile rc=$mrc"; fi
fi

# ---- 9. a forward of more launches than a stream queues: profiled, never held --------------------
if want longfwd && ! lanes_hang longfwd && need_mpi longfwd; then
  step "ppbench profile: Llama-3.1-8B layer at B=4, P=8192 (> 2,000 launches per forward)"
  timeout "$(tmo 100)" mpirun -np 1 "$PPB_BIN" profile --model inputs/models/llama-3.1-8b.json --device cuda \
    --dtype bf16 -b 4 -p 8192 -g 1 --profile-warmup 1 --profile-iters 2 --profile-contexts 1 \
    -o "$LOG/longfwd.h5" --force >"$LOG/longfwd" 2>&1
  rc=$?
  tail -12 "$LOG/longfwd"
  if [ "$rc" = 0 ]; then result longfwd ok "profiled without a hang"
  elif [ "$rc" = 124 ]; then result longfwd FAIL "TIMED OUT: a held forward of > 2,000 launches hangs"
  else result longfwd FAIL "rc=$rc"; fi
fi

# ---- 10. tensor parallelism (two GPUs) ------------------------------------------------------------
# A stage of width 2 is one NCCL group of two GPUs: it cannot run on one (NCCL refuses two ranks
# on one GPU), so on one GPU this step only says so.
if want tp && ! lanes_hang tp; then
  if [ "${PPB_EXPECT_GPUS:-0}" -lt 2 ]; then
    result tp skip "tensor parallelism needs two GPUs; nvidia-smi lists ${PPB_EXPECT_GPUS:-0}"
  elif need_mpi tp; then
    step "tensor parallelism: the width-2 stage test, then mpirun -np 2 ppbench run --tp 1 --tp 2"
    tp_test="not built"
    if [ -x "$TEST_BIN" ]; then
      timeout "$(tmo 60)" "$TEST_BIN" --gtest_filter='CudaStage.TensorParallel*' >"$LOG/tp_test" 2>&1 && tp_test=ok || tp_test="FAILED rc=$?"
      tail -5 "$LOG/tp_test"
    fi
    timeout "$(tmo 120)" mpirun -np 2 "$PPB_BIN" run --model inputs/models/qwen3-0.6b.json --device cuda --dtype bf16 \
      -b 4 -p 128 -g 32 --iters 3 --target-ci 0 --tp 1 --tp 2 --timeout 60 -o "$LOG/tp.h5" --force >"$LOG/tp" 2>&1
    rc=$?
    grep -A4 'layouts side by side' "$LOG/tp"
    tail -3 "$LOG/tp"
    if [ "$rc" = 0 ] && [ "$tp_test" = ok ]; then
      result tp ok "test ok; run validated: $(grep -A3 'layouts side by side' "$LOG/tp" | tail -2 | awk '{printf "%s %s tok/s TPOT %s ms; ", $1, $4, $7}')"
    else
      result tp FAIL "test $tp_test; run rc=$rc (124: timed out)"
    fi
  fi
fi

# ---- 11. PyTorch eager ----------------------------------------------------------------------------
if want torch; then
  step "PyTorch eager, same layer"
  if ! timeout 60 python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    result torch skip "PyTorch with CUDA not importable"
  elif [ ! -s "${BENCH:-$LOG/bench.txt}" ]; then
    result torch skip "no ppb_gpu_bench table to compare with (bench step)"
  else
    timeout "$(tmo 90)" python3 scripts/torch_layer.py --model inputs/models/llama-3.1-8b.json --bench "$BENCH" >"$LOG/torch" 2>&1
    rc=$?
    cat "$LOG/torch"
    n=$(grep -c 'torch/ppbench' "$LOG/torch")
    if [ "$rc" = 0 ] && [ "$n" = 2 ]; then
      result torch ok "$(grep 'torch/ppbench' "$LOG/torch" | awk '{print $1, $NF}' | tr '\n' ' ')"
    else
      result torch FAIL "rc=$rc"
    fi
  fi
fi
# The summary table and the exit status: the EXIT trap.
