#!/usr/bin/env bash
# Make unequal devices real on CPU ranks: run one launcher rank's command under a cgroup CPU quota.
#
#   mpirun -np 2 scripts/cpu_quota.sh --rank 1 --cores 0.5 -- build/ppbench run --model ...
#   srun   -n 2 scripts/cpu_quota.sh --rank 1 --cores 0.5 -- build/ppbench run --model ...
#
# The ranks named by --rank (a comma list of world ranks, from OMPI_COMM_WORLD_RANK, PMIX_RANK or
# SLURM_PROCID) run their command inside a new cgroup whose CPU bandwidth is --cores cores
# (cgroup v2 cpu.max or v1 cpu.cfs_quota_us / cpu.cfs_period_us: quota = cores x period); every
# other rank execs its command unchanged. All of the rank's threads (its compute lane, its
# transfer lanes, BLAS) share the quota, as all of a slower GPU's work shares that GPU.
#
# --period-us is the CFS period: the rank runs at most cores x period in each period, then waits for
# the next. The default is the shortest the kernel allows (a quota of at least 1 ms: 2 ms at 0.5
# cores, 1 ms from 1 core), so that a timed unit of a few ms sees the mean rate rather than
# all-or-nothing windows (Linux's default 100 ms stalls a 30 ms decode step for up to 50 ms at 0.5
# cores, and the profile's medians then see the unthrottled windows). ppbench records each rank's
# quota in /ranks (cpu_quota_cores, cpu_quota_period_ms, cpu_quota_cgroup).
#
# Needs a writable cgroup hierarchy (root on this project's machines); the cgroup is removed when
# the command ends. Errors (bad flags, no writable cgroup) exit 2 before the command starts.
# Exit status: the command's.
set -uo pipefail

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "cpu_quota.sh: $*" >&2; exit 2; }

ranks="" cores="" period=""
while (($#)); do
  case "$1" in
    --rank) ranks="${2:-}"; shift 2 || die "--rank needs a comma list of ranks";;
    --cores) cores="${2:-}"; shift 2 || die "--cores needs a number of cores";;
    --period-us) period="${2:-}"; shift 2 || die "--period-us needs microseconds";;
    -h|--help) usage; exit 0;;
    --) shift; break;;
    *) die "unknown flag '$1' (valid: --rank LIST --cores X [--period-us US] -- COMMAND...)";;
  esac
done
(($#)) || die "no command after '--' (usage: --rank 1 --cores 0.5 -- build/ppbench run ...)"
[[ "$ranks" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--rank must be a comma list of world ranks (e.g. 1 or 1,3), got '$ranks'"
[[ "$cores" =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v c="$cores" 'BEGIN { exit !(c > 0) }' ||
  die "--cores must be a positive number of cores, got '$cores'"
[[ -n "$period" ]] || period=$(awk -v c="$cores" 'BEGIN { p = 1000; if (c < 1) p = int(1000 / c + 0.999999); print p }')
[[ "$period" =~ ^[0-9]+$ ]] && ((period >= 1000 && period <= 1000000)) ||
  die "--period-us must be an integer in [1000, 1000000] (the kernel's bounds), got '$period'"
quota=$(awk -v c="$cores" -v p="$period" 'BEGIN { print int(c * p + 0.5) }')
((quota >= 1000)) || die "the quota --cores x --period-us = $quota us is under the kernel's 1000 us minimum: raise --period-us to at least $(awk -v c="$cores" 'BEGIN { print int(1000 / c + 0.999999) }')"

rank="${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-}}}"
[[ -n "$rank" ]] || die "no launcher rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID): start it under mpirun or srun"
[[ ",$ranks," == *",$rank,"* ]] || exec "$@"

name="ppbench_quota_$$"
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  # cgroup v2: a sibling of our own cgroup (a cgroup with processes cannot delegate the cpu
  # controller to a child), inside our parent's limits (a Slurm job's, a container's whose cgroup
  # namespace shows it as /); so this wrapper inside another one lands beside it, not in it
  parent="/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)"
  parent="${parent%/*}"; [[ -n "$parent" ]] || parent=/sys/fs/cgroup
  grep -qw cpu "$parent/cgroup.subtree_control" 2>/dev/null || echo +cpu >"$parent/cgroup.subtree_control" 2>/dev/null ||
    die "the cpu controller is not enabled under $parent and cannot be (not root, or not delegated)"
  dir="$parent/$name"
  mkdir "$dir" 2>/dev/null || die "cannot create cgroup $dir (not root, or the hierarchy is read-only)"
  echo "$quota $period" >"$dir/cpu.max" || { rmdir "$dir"; die "cannot write $dir/cpu.max"; }
else  # cgroup v1: the cpu controller's own hierarchy
  root=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ { print $2; exit }' /proc/mounts)
  [[ -n "$root" ]] || die "no cgroup v2 and no cgroup v1 cpu controller mounted"
  # a child of our own cpu cgroup (a Slurm job's, a container's): its limits still hold
  parent="$root$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ { print $3; exit }' /proc/self/cgroup)"
  parent="${parent%/}"
  dir="$parent/$name"
  mkdir "$dir" 2>/dev/null || die "cannot create cgroup $dir (not root, or the hierarchy is read-only)"
  { echo "$period" >"$dir/cpu.cfs_period_us" && echo "$quota" >"$dir/cpu.cfs_quota_us"; } ||
    { rmdir "$dir"; die "cannot set the quota in $dir"; }
fi
echo $$ >"$dir/cgroup.procs" || { rmdir "$dir"; die "cannot move rank $rank into $dir"; }
echo "cpu_quota.sh: rank $rank runs at $cores cores ($quota us per $period us, $dir)" >&2

# The command runs as our child, so that the cgroup can be removed after it; a TERM, INT or HUP
# (mpirun or srun ending the job) is passed on to it, and the cleanup still runs.
forward() { kill -TERM "$child" 2>/dev/null || :; }
"$@" &
child=$!
trap forward TERM INT HUP
while :; do
  wait "$child"; rc=$?
  kill -0 "$child" 2>/dev/null || break  # a trapped signal interrupted wait: wait again
done
echo $$ >"$parent/cgroup.procs" 2>/dev/null
# The kernel may still count the command's exiting threads in the cgroup for a moment (rmdir: EBUSY)
for _ in $(seq 50); do rmdir "$dir" 2>/dev/null && break; [[ -d "$dir" ]] || break; sleep 0.1; done
[[ ! -d "$dir" ]] || echo "cpu_quota.sh: could not remove $dir (tasks still in it: $(tr '\n' ' ' <"$dir/cgroup.procs"))" >&2
exit "$rc"
