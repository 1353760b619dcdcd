#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit, MPI, e2e) with ctest.
# PPBENCH_SLURM_TESTS=1 also runs the real-Slurm test (root: installs and starts Slurm).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --python
scripts/build.sh
export OPENBLAS_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cd build
# Two at a time where a test allows it (the unit tests); the MPI and e2e tests, whose ranks
# oversubscribe the cores and some of which assert on timings, are RUN_SERIAL and run alone.
ctest -j2 --output-on-failure --timeout 1800 "$@"
