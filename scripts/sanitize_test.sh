#!/usr/bin/env bash
# ASan + UBSan: builds the unit and MPI tests and ppbench in build-asan-ci/ (-O1 -g1, the tests'
# own sources at -O0 as tests/CMakeLists.txt says; no CUDA), runs them under ctest, then a short
# 2-rank end-to-end run. Any sanitizer report (an invalid access, undefined behaviour, a leak
# outside Open MPI's own) fails the script.
# -O1 -g1: the optimisation ASan's documentation recommends, with line tables for the reports'
# stacks; -O2 -g compiled 2.2-2.8x slower here (test_serving_sim.cpp 171 s against 76 s) and
# took CI past its 90 minutes. The scale tests (the 64-device plan, the 70B-class searches) are
# left to the Release build: their code runs under the sanitizers in the small tests (the
# searches against brute force), their size only multiplies the time (315 s for one here).
# Usage: scripts/sanitize_test.sh [extra ctest args]   (PPBENCH_BUILD_JOBS: build jobs, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=build-asan-ci
t0=$SECONDS

scripts/install_deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPPBENCH_ENABLE_CUDA=OFF \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DPPBENCH_SANITIZE=address,undefined >/dev/null
targets=(ppbench)
for f in tests/unit/test_*.cpp tests/mpi/test_*.cpp; do
  name=$(basename "$f" .cpp)
  [[ $name == test_cuda_* ]] || targets+=("$name")
done
cmake --build "$build" -j "${PPBENCH_BUILD_JOBS:-2}" --target "${targets[@]}"
t_build=$((SECONDS - t0))

export OPENBLAS_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Leaks are checked everywhere; the suppressions cover Open MPI's internals only (see the file).
# Open MPI is built without frame pointers: the fast unwinder would stop at its first frame and
# no suppression would match, so unwind slowly (full stacks) on every allocation.
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1
export LSAN_OPTIONS=suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

t1=$SECONDS
scale_tests='PlanScenarioOnFourDevicesOfA70BClassProfile|A70BClassSearchOnEightDevices|SixtyFourDevicesAndAHundredTwentyEightUnits'
(cd "$build" && ctest -L 'unit|mpi' -E "$scale_tests" --output-on-failure --timeout 900 "$@")
t_ctest=$((SECONDS - t1))

# A short whole run: profile, balance, benchmark, validation, HDF5 file, with leak detection.
t2=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/e2e.log
rc=0
mpirun --oversubscribe -np 2 "$build/ppbench" run --model tests/data/tiny-llama.json \
       -p 8 -g 3 --iters 1 --target-ci 0 --warmup 0 -o "$tmp/x.h5" >"$log" 2>&1 || rc=$?
if [ $rc -ne 0 ] || grep -qE 'Sanitizer|runtime error:' "$log"; then
  cat "$log"
  echo "[sanitize] FAILED: end-to-end run under ASan/UBSan (exit status $rc)" >&2
  exit 1
fi
t_e2e=$((SECONDS - t2))
echo "[sanitize] passed: build ${t_build}s, unit+mpi tests ${t_ctest}s, end-to-end ${t_e2e}s," \
     "total $((SECONDS - t0))s"
