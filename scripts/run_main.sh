#!/usr/bin/env bash
# The main job on its default input: installs what is missing, builds, and runs
#   mpirun -np 2 ppbench run --model inputs/models/qwen3-0.6b.json -p 4 -g 8 --target-ci 2 --max-time 160
# (one rank per core of this 2-core machine, one BLAS thread each), printing the summary and
# writing results/ppbench_qwen3-0.6b_2r_<UTC time>.h5. Extra arguments go to `ppbench run`;
# one of -p/--prompt-len, -g/--gen-len, --target-ci, --max-time among them replaces this job's value.
# --max-time 150: on a noisy day (issue 13, 2026-12-03, five runs each) 120 s of rounds with
# profile cycles between them left the tokens/s gain's CI at +-1.7..2.3% (decode +-2.8..3.7%,
# 40-45 rounds), 150 s without cycles at +-1.6..2.2% (decode +-2.3..3.0%, 63-68 rounds); one
# run of each five had its tokens/s CI touch 1. The job stays near 3 minutes (177-209 s).
# --max-time 160 since the profile's passes take turns forward by forward (~20 s where it took
# ~30 s): on a slower day 28-33 rounds fit 150 s, and one run of five left the decode gain's CI
# at +-5.3%.
#
# Why this workload (docs/DESIGN.md §1 step 5, "Repetition length"): on the 2-core VMs this
# project runs on, the machine's speed moves by ~18% (sd over 0.25 s windows), both cores at
# once, and stays correlated for only ~1-2 s. Short repetitions, so the two partitions'
# repetitions of a round see nearly the same machine and their ratio cancels it: ppbench's
# defaults (P=32 G=16, ~3.3 s) left the balanced/uniform gain's 95% CI at +-5..16% after 120 s,
# P=8 G=4 (~1 s on a faster day) +-1.1..1.6% (tokens/s) and +-2.0..2.3% (decode). P=4 G=8
# (~2 s on a slower day): the same length, spent in decode, where a head-heavy model's balance
# pays. With P=8 G=4 about half of each repetition was prefill, in which the head costs ~1.7
# layers (in decode ~8), so the split that balances the workload unbalances the prefill: on
# the slower day its tokens/s gain was 0.98-1.06 (decode 1.01-1.12) over eleven runs, six
# with a CI reaching below 1 (issue 13).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh ppbench  # the binary alone (scripts/test.sh builds the tests)
export OPENBLAS_NUM_THREADS=1
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# This job's workload, each unless the arguments set it (ppbench takes an option once).
given() {  # given "PATTERN..." ARGS...: whether an argument matches one of the glob patterns
  local - patterns=$1 a p
  set -f  # the patterns are case patterns, not file names
  shift
  for a in "$@"; do
    for p in $patterns; do
      # shellcheck disable=SC2254
      case "$a" in $p) return 0 ;; esac
    done
  done
  return 1
}
job=()
given '-p -p[0-9]* --prompt-len --prompt-len=*' "$@" || job+=(--prompt-len 4)
given '-g -g[0-9]* --gen-len --gen-len=*' "$@" || job+=(--gen-len 8)
given '--target-ci --target-ci=*' "$@" || job+=(--target-ci 2)
given '--max-time --max-time=*' "$@" || job+=(--max-time 160)
exec mpirun --oversubscribe -np "${PPBENCH_RANKS:-2}" build/ppbench run --model inputs/models/qwen3-0.6b.json \
  "${job[@]}" "$@"
