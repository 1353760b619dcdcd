#!/usr/bin/env bash
# Configures and builds ppbench (Release) in build/. The CUDA backend is built when nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${PPBENCH_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "${PPBENCH_BUILD_JOBS:-2}"
