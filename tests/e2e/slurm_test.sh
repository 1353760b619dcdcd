#!/usr/bin/env bash
# End-to-end test under a real Slurm: installs Slurm and MUNGE from Debian when missing, starts
# munged, slurmctld and slurmd on this machine with a minimal one-node configuration (in a
# temporary directory, on ports of its own), checks every jobs/*.sbatch with `bash -n` and
# `sbatch --test-only`, submits jobs/cpu.sbatch with `sbatch --wait`, and
# checks that the results file appears, is complete (root attribute complete=1) and that
# `ppbench report` reads it (text and CSV). Stops the daemons it started (by pid) on exit.
#
# Usage: tests/e2e/slurm_test.sh BUILD_DIR        (as root, no stdin; ctest label e2e)
# Environment:
#   PPBENCH_SLURM_PORT   first of the two TCP ports used (slurmctld, slurmd); default 16817
#   PPBENCH_SLURM_KEEP=1 keep the temporary directory (logs, job output) for debugging
#   PPBENCH_LAUNCH       srun | mpirun: how jobs/cpu.sbatch starts the ranks (default: its own)
# Exit status: 0 pass, 1 fail, 77 skipped (not root and Slurm/MUNGE not installed).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:?usage: slurm_test.sh BUILD_DIR}" && pwd)
PPBENCH="$BUILD/ppbench"
PORT=${PPBENCH_SLURM_PORT:-16817}
NODE=$(hostname -s)

say() { echo "[slurm_test] $*"; }
fail() { say "FAIL: $*"; exit 1; }

[[ -x "$PPBENCH" ]] || fail "no ppbench binary at $PPBENCH (build the ppbench target first)"

# ---- install ----------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null ||
   ! command -v munged >/dev/null; then
  if [[ $(id -u) -ne 0 ]]; then
    say "SKIP: Slurm/MUNGE not installed and not root (apt-get install slurmd slurmctld slurm-client munge)"
    exit 77
  fi
  say "installing slurmd slurmctld slurm-client munge from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends slurmd slurmctld slurm-client munge </dev/null >/dev/null ||
    { apt-get update </dev/null >/dev/null &&
      apt-get install -y --no-install-recommends slurmd slurmctld slurm-client munge </dev/null >/dev/null; } ||
    fail "apt-get install of Slurm/MUNGE failed"
fi
[[ $(id -u) -eq 0 ]] || { say "SKIP: starting slurmd needs root"; exit 77; }

TMP=$(mktemp -d /tmp/ppbench-slurm.XXXXXX)
chmod 755 "$TMP"
PIDS=()
MUNGE_PARENT=0
cleanup() {
  local rc=$?
  # munged runs under runuser: stop the daemon itself (its pid file) and let runuser reap it and
  # exit (killing runuser first would leave munged a zombie of init).
  if [[ -s "$TMP/munge/munged.pid" ]]; then
    kill "$(cat "$TMP/munge/munged.pid")" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$MUNGE_PARENT" 2>/dev/null || break; sleep 0.1; done
  fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [[ $rc -ne 0 ]]; then
    for log in "$TMP"/*.log "$TMP"/out/*.out; do
      [[ -f "$log" ]] || continue
      say "---- tail of $log"; tail -n 40 "$log" || true
    done
  fi
  if [[ "${PPBENCH_SLURM_KEEP:-0}" == 1 || $rc -ne 0 ]]; then say "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

# ---- munge ------------------------------------------------------------------------------
# A running munged (the machine's own) is used as is; else one is started on a socket of our own.
MUNGE_SOCKET=/run/munge/munge.socket.2
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
  fi
  mkdir -p "$TMP/munge"
  chown munge:munge "$TMP/munge" 2>/dev/null || true
  MUNGE_SOCKET="$TMP/munge/munge.socket"
  MUNGED_ARGS=(--foreground --socket="$MUNGE_SOCKET" --pid-file="$TMP/munge/munged.pid"
               --log-file="$TMP/munged.log" --seed-file="$TMP/munge/munged.seed")
  if id munge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged "${MUNGED_ARGS[@]}" </dev/null >"$TMP/munged.stdout" 2>&1 &
  else
    /usr/sbin/munged --force "${MUNGED_ARGS[@]}" </dev/null >"$TMP/munged.stdout" 2>&1 &
  fi
  MUNGE_PARENT=$!
  PIDS+=($!)
  for _ in $(seq 50); do [[ -S "$MUNGE_SOCKET" ]] && break; sleep 0.1; done
  munge --socket="$MUNGE_SOCKET" -n </dev/null | unmunge --socket="$MUNGE_SOCKET" >/dev/null ||
    fail "munged does not answer on $MUNGE_SOCKET"
  say "munged started (socket $MUNGE_SOCKET)"
else
  say "using the running munged"
fi

# ---- slurm.conf -------------------------------------------------------------------------
# The node line comes from `slurmd -C` (what slurmd will detect: CPUs, sockets, cores, memory),
# so slurmctld never drains the node for a mismatch.
NODE_LINE=$(slurmd -C | head -n 1)
REAL_MEM=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")
NODE_LINE=$(sed "s/RealMemory=[0-9]*/RealMemory=$((REAL_MEM * 9 / 10))/" <<<"$NODE_LINE")
mkdir -p "$TMP/state" "$TMP/spool" "$TMP/out" "$TMP/results"
cat >"$TMP/slurm.conf" <<EOF
# Minimal one-node Slurm for ppbench's e2e test: no cgroups, no accounting, root daemons.
ClusterName=ppbench-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$TMP/state
SlurmdSpoolDir=$TMP/spool
SlurmctldPidFile=$TMP/slurmctld.pid
SlurmdPidFile=$TMP/slurmd.pid
SlurmctldLogFile=$TMP/slurmctld.log
SlurmdLogFile=$TMP/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
$NODE_LINE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=60 State=UP
EOF
export SLURM_CONF="$TMP/slurm.conf"

# ---- daemons ----------------------------------------------------------------------------
/usr/sbin/slurmctld -D -i -f "$SLURM_CONF" </dev/null >"$TMP/slurmctld.stdout" 2>&1 &
PIDS+=($!)
/usr/sbin/slurmd -D -f "$SLURM_CONF" -N "$NODE" </dev/null >"$TMP/slurmd.stdout" 2>&1 &
PIDS+=($!)
say "slurmctld (pid ${PIDS[-2]}) and slurmd (pid ${PIDS[-1]}) started, ports $PORT/$((PORT + 1))"

state=""
for _ in $(seq 60); do
  state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
  [[ "$state" == idle ]] && break
  for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || fail "a daemon (pid $pid) exited"; done
  sleep 1
done
[[ "$state" == idle ]] || fail "node $NODE not idle after 60 s (state '$state')"
say "node $NODE idle"
sinfo

# ---- every job script's directives ------------------------------------------------------
# `sbatch --test-only` parses a script's #SBATCH lines (an unknown or malformed option fails)
# and asks slurmctld whether it could schedule the job, without submitting it. cpu.sbatch is
# checked as is; the GPU and multi-node shapes are shrunk to this one CPU node (command-line
# options override #SBATCH lines).
SHRINK=(--nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0)
for script in "$REPO"/jobs/*.sbatch; do
  name=$(basename "$script")
  bash -n "$script" || fail "bash -n $name"
  opts=()
  [[ "$name" == cpu.sbatch ]] || opts=("${SHRINK[@]}")
  msg=$(cd "$REPO" && sbatch --test-only "${opts[@]}" "$script" 2>&1) || fail "sbatch --test-only $name: $msg"
  say "sbatch --test-only${opts[*]:+ ${opts[*]}} $name: ${msg##*sbatch: }"
done

# ---- the job ----------------------------------------------------------------------------
export PPBENCH="$PPBENCH" PPBENCH_RESULTS="$TMP/results"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
say "sbatch --wait jobs/cpu.sbatch (launch: ${PPBENCH_LAUNCH:-default})"
t0=$(date +%s)
set +e
JOB_LINE=$(cd "$REPO" && timeout 900 sbatch --wait --parsable --output="$TMP/out/%x_%j.out" jobs/cpu.sbatch)
sb_rc=$?
set -e
JOB_ID=${JOB_LINE%%;*}
say "job $JOB_ID finished with status $sb_rc after $(( $(date +%s) - t0 )) s"
OUT=$(ls "$TMP"/out/*_"$JOB_ID".out 2>/dev/null | head -n 1 || true)
[[ -n "$OUT" ]] && { say "---- job output ($OUT)"; cat "$OUT"; }
[[ $sb_rc -eq 0 ]] || fail "sbatch --wait returned $sb_rc"

H5=$(ls "$TMP"/results/*_"$JOB_ID".h5 2>/dev/null | head -n 1 || true)
[[ -n "$H5" ]] || fail "no results file $TMP/results/<job name>_$JOB_ID.h5"
say "results file $H5"
if command -v h5dump >/dev/null; then
  h5dump -a /complete "$H5" | grep -q '(0): 1' || fail "$H5 is not complete (root attribute complete != 1)"
  h5dump -a /slurm_job_id "$H5" | grep -q "\"$JOB_ID\"" || fail "$H5 does not record slurm_job_id $JOB_ID"
fi
"$PPBENCH" report "$H5" >"$TMP/report.txt" || fail "ppbench report failed on $H5"
cat "$TMP/report.txt"
grep -q "slurm: job $JOB_ID" "$TMP/report.txt" || fail "report does not show the Slurm job id"
grep -q "^validation: OK" "$TMP/report.txt" || fail "report does not say validation: OK"
"$PPBENCH" report "$H5" "$H5" --csv >"$TMP/report.csv" || fail "ppbench report --csv failed"
[[ $(wc -l <"$TMP/report.csv") -ge 3 ]] || fail "CSV has fewer than 2 rows"
head -n 1 "$TMP/report.csv" | grep -q '^file,model,' || fail "CSV has no header row"
say "PASS"
