#!/usr/bin/env bash
# The GPU bundle route (issue 35), proven where there is no GPU: scripts/gpu_check.sh --pack
# bundles the CUDA build's binaries with every shared library they need that the GPU machine
# lacks (it has no MPI, HDF5, OpenBLAS or CLI11, and can install nothing). Here:
#   1. the bundle is packed from this build and fits the device tool's 64 MiB with the repo;
#   2. unpacked, every executable and library in it resolves each library it needs inside the
#      bundle or to one of what the GPU machine has (glibc, libstdc++, the driver, cuBLAS, NCCL:
#      gpu_check.sh's HOST_LIBS_RE), with the bundle's libraries first on the path;
#   3. the bundle's ppbench prints its version, and the bundle's mpirun (relocated with
#      OPAL_PREFIX) runs it on 2 CPU-backend ranks, validated;
#   4. gpu_check.sh on the bundle exits 0 when every selected step is ok or skipped, and 1 when
#      one fails (PPB_GPU_CHECK_FAIL fails a step on purpose).
# Usage: gpu_bundle_test.sh BUILD_DIR (a build with the CUDA backend; exit 77 = skipped without).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ ! -x "$build/src/backend/cuda/ppb_gpu_bench" ]; then
  echo "skipped: $build has no CUDA backend (ppb_gpu_bench)"
  exit 77
fi
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== 1. pack"
mkdir -p "$work/build-gpu"
bundle=$work/build-gpu/ppb-gpu-bundle.tar.xz
PPB_BUNDLE_OUT=$bundle bash "$src/scripts/gpu_check.sh" --pack "$build" | tail -2
repo_bytes=$(cd "$src" && git ls-files -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
bytes=$(stat -c %s "$bundle")
echo "bundle $bytes bytes, tracked repo ${repo_bytes:-?} bytes (limit 64 MiB together)"
[ $(( bytes + ${repo_bytes:-0} )) -lt $(( 64 << 20 )) ] || fail "bundle + repo over 64 MiB"

echo "== 2. every library resolved in the bundle or on the GPU machine's list"
mkdir "$work/b"
tar -C "$work/b" -xJf "$bundle"
# shellcheck disable=SC1090  # the two functions and the list, as gpu_check.sh defines them
source <(sed -n '/^HOST_LIBS_RE=/p; /^use_bundle()/,/^}/p; /^verify_bundle()/,/^}/p' "$src/scripts/gpu_check.sh")
(
  use_bundle "$work/b"
  verify_bundle "$work/b" || fail "the bundle needs a library the GPU machine lacks"
  echo "ok: $(find "$work/b" -type f | wc -l) files checked"

  echo "== 3. the bundle's ppbench and mpirun"
  "$work/b/bin/ppbench" --version || fail "ppbench --version from the bundle"
  [ "$(command -v mpirun)" = "$work/b/ompi/usr/bin/mpirun" ] || fail "mpirun is $(command -v mpirun), not the bundle's"
  cd "$src"
  OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe -np 2 -x OPENBLAS_NUM_THREADS "$work/b/bin/ppbench" run \
    --model tests/data/tiny-llama-1layer.json --device cpu -b 1 -p 8 -g 4 --iters 2 --target-ci 0 \
    -o "$work/run.h5" --force >"$work/run.log" 2>&1 || { tail -30 "$work/run.log"; fail "mpirun from the bundle"; }
  grep -q '^validation: OK' "$work/run.log" || { tail -30 "$work/run.log"; fail "no 'validation: OK'"; }
  echo "ok: 2 ranks from the bundle, validated"
) || exit 1

echo "== 4. gpu_check.sh's exit status"
set +e
PPB_GPU_CHECK_STEPS=torch bash "$src/scripts/gpu_check.sh" "$work/build-gpu" >"$work/check_ok.log" 2>&1
rc_ok=$?
PPB_GPU_CHECK_STEPS=torch PPB_GPU_CHECK_FAIL=torch bash "$src/scripts/gpu_check.sh" "$work/build-gpu" >"$work/check_fail.log" 2>&1
rc_fail=$?
set -e
sed -n '/=== summary/,$p' "$work/check_ok.log"
sed -n '/=== summary/,$p' "$work/check_fail.log"
[ "$rc_ok" = 0 ] || fail "gpu_check exited $rc_ok with every selected step ok or skipped"
grep -qE '^binaries +ok' "$work/check_ok.log" || fail "binaries not ok from the bundle"
[ "$rc_fail" = 1 ] || fail "gpu_check exited $rc_fail with a step failed on purpose (want 1)"
grep -qE '^torch +FAIL +failed on purpose' "$work/check_fail.log" || fail "the failed step is not in the summary"
echo "PASS"
