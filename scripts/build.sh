#!/usr/bin/env bash
# Configures and builds ppbench (Release) in build/. The CUDA backend is built when nvcc is found.
# Usage: scripts/build.sh [TARGET...]   (default: every target, the tests' too; e.g.
# `scripts/build.sh ppbench` builds the binary alone, as scripts/run_main.sh does)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${PPBENCH_CMAKE_ARGS:-} >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "${PPBENCH_BUILD_JOBS:-2}" "${targets[@]}"
