// What the operating system lets a rank run on, recorded beside its timings (issue 13,
// "conditions recorded"): the CPUs it may use (its core binding: Open MPI's --bind-to, Slurm's
// --cpu-bind, a cgroup cpuset), a CPU quota of its cgroups (a Slurm or container limit, or the
// quota that makes one rank a slower device on purpose), and the frequency governor. A run with
// more compute threads on a node than CPUs there measures contention, not stages: the summary
// says so (results/conditions.h: host_loads).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ppb {

/// CPUs this process may run on (sched_getaffinity), ascending; empty if the call fails.
std::vector<int> cpu_affinity();

/// Linux cpulist text ("0-3,8,10-11", as /sys/.../cpulist and taskset -c print it) of an
/// ascending list; "" for an empty one.
std::string format_cpu_list(const std::vector<int>& cpus);

/// The inverse of format_cpu_list, ascending and without duplicates; nullopt when `text` is not
/// a cpulist (empty pieces, a range whose end is before its start, not a number).
std::optional<std::vector<int>> parse_cpu_list(std::string_view text);

/// The binding CPU quota of a process's cgroups: its cores (quota / period) and the CFS period it
/// is enforced over, in ms. The process runs at most cores x period in each period, then waits
/// for the next: under a long period a timing shorter than it runs at full speed or stalls.
struct CpuQuota {
  double cores = 0.0;
  double period_ms = 0.0;
  /// The cgroup directory that sets it (the binding level), as this process's mounts show it.
  /// Every process in that cgroup or below shares the quota: ranks in one cgroup take turns
  /// within cores x period together.
  std::filesystem::path dir{};
};

/// The CPU quota that the cgroups of a process impose, or nullopt when none does.
/// `self_cgroup` is the text of /proc/<pid>/cgroup, `cgroup_root` where cgroups are mounted.
///  - cgroup v2 ("0::/<path>"): cpu.max "<quota> <period>" (quota "max" = none) in every
///    directory from <root>/<path> up to <root>;
///  - cgroup v1 (a line whose controllers include "cpu"): cpu.cfs_quota_us (-1 = none) /
///    cpu.cfs_period_us in the same directories under <root>/cpu (or <root>/cpu,cpuacct).
/// The level that binds wins: the smallest quota / period, of equal ones the longest period.
/// Missing or unreadable files, or a path with "..", mean no quota from that source; never throws.
std::optional<CpuQuota> cgroup_cpu_quota(std::string_view self_cgroup, const std::filesystem::path& cgroup_root);

/// Every level of a process's cgroups that sets a CPU quota, as cgroup_cpu_quota reads them: the
/// binding one first (cgroup_cpu_quota's), then the others, deepest first per hierarchy. A level
/// above the binding one is shared by every process below it, each held to its own tighter
/// quota (scripts/cpu_quota.sh inside a container's --cpus). Empty when none; never throws.
std::vector<CpuQuota> cgroup_cpu_quotas(std::string_view self_cgroup, const std::filesystem::path& cgroup_root);

/// The identity of a cgroup directory on its machine, "<st_dev>:<st_ino>": the same for every
/// process in that cgroup whatever path its cgroup namespace shows (a container sees "/"), and
/// different for two containers' cgroups that each show "/". "" when stat fails.
std::string cgroup_identity(const std::filesystem::path& dir);

/// The cpufreq scaling governor of `cpu` (<sys_root>/devices/system/cpu/cpu<N>/cpufreq/
/// scaling_governor: "performance", "powersave", "schedutil", ...), or "" when the kernel does
/// not expose it (virtual machines, containers without /sys).
std::string cpu_governor(int cpu, const std::filesystem::path& sys_root = "/sys");

}  // namespace ppb
