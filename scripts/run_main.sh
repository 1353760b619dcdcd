#!/usr/bin/env bash
# The main job on its default input: installs what is missing, builds, and runs
#   mpirun -np 2 ppbench run --model inputs/models/qwen3-0.6b.json
# (one rank per core of this 2-core machine, one BLAS thread each), printing the summary and
# writing results/ppbench_qwen3-0.6b_2r_<UTC time>.h5. Extra arguments go to `ppbench run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
export OPENBLAS_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
exec mpirun --oversubscribe -np "${PPBENCH_RANKS:-2}" build/ppbench run --model inputs/models/qwen3-0.6b.json "$@"
