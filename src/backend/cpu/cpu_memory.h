// Free host memory for the CPU device: the node's MemAvailable, capped by the memory cgroup
// limit of the process (a Slurm job's --mem/--mem-per-cpu, a container's limit).
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include "backend/memory_pool.h"

namespace ppb {

/// Bytes the memory cgroups of a process still let it allocate, or nullopt when no cgroup
/// limits it. `self_cgroup` is the text of /proc/<pid>/cgroup; `cgroup_root` is where the
/// cgroup file systems are mounted (/sys/fs/cgroup; a fake tree in tests).
///  - cgroup v2 (line "0::/<path>"): every directory from <root>/<path> up to <root> with a
///    memory.max other than "max" contributes memory.max - usage.
///  - cgroup v1 (line "<id>:<...,>memory<,...>:/<path>"): the same under <root>/memory with
///    memory.limit_in_bytes (>= 2^62: unlimited) and memory.usage_in_bytes.
/// usage = memory.current (v2) / memory.usage_in_bytes (v1) minus the inactive page cache of
/// memory.stat (inactive_file / total_inactive_file), which the kernel reclaims before an OOM
/// kill (the "working set" of cAdvisor/kubelet). The smallest headroom of all levels and both
/// versions wins (0 when usage is over the limit). Any missing or unreadable file, or a path
/// with "..", means no limit from that source; never throws.
std::optional<size_t> cgroup_memory_headroom(std::string_view self_cgroup,
                                             const std::filesystem::path& cgroup_root);

/// Size in bytes of the largest cache of CPU 0 (sysfs cache/index*/size: the last-level cache),
/// 32 MiB if sysfs does not say.
size_t cpu_last_level_cache_bytes();

/// Free memory of this process in bytes: min(MemAvailable of <proc_root>/meminfo,
/// cgroup_memory_headroom(<proc_root>/self/cgroup, cgroup_root)); whichever is known when only
/// one is; 0 when neither is.
size_t cpu_free_memory(const std::filesystem::path& proc_root = "/proc",
                       const std::filesystem::path& cgroup_root = "/sys/fs/cgroup");

/// The pools this process's memory comes from, for dividing among the ranks drawing on each
/// (memory_share): MemAvailable of <proc_root>/meminfo keyed "kernel" (every rank of the
/// machine draws on it), and, where a memory cgroup limits the process, the tightest
/// cgroup_memory_headroom keyed "cgroup:<dev>:<inode>" of the directory that sets it (the ranks
/// in that cgroup, e.g. one Slurm job step's on a node, or one container's, draw on it).
/// Either is left out when unknown.
std::vector<MemoryPool> cpu_memory_pools(const std::filesystem::path& proc_root = "/proc",
                                         const std::filesystem::path& cgroup_root = "/sys/fs/cgroup");

}  // namespace ppb
