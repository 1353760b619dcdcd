// Reading a process's cgroups (v1 and v2), shared by the CPU device's memory headroom
// (backend/cpu/cpu_memory.h) and the CPU quota recorded beside the timings
// (common/host_conditions.h): the lines of /proc/<pid>/cgroup and the directories of one
// hierarchy from the process's cgroup up to the root, where each limit may be set.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace ppb {

/// The whole text of a file ("" if it cannot be read).
std::string read_text(const std::filesystem::path& path);

/// The fields of `text` between `sep` characters, empty ones included ("a\n" -> "a", "").
std::vector<std::string_view> split_fields(std::string_view text, char sep);

/// One line "<hierarchy id>:<controllers>:<path>" of /proc/<pid>/cgroup (the path may itself
/// contain ':'). v2 is the unified hierarchy (id 0, no controllers).
struct CgroupMembership {
  bool v2 = false;
  std::string_view controllers;  ///< "cpu,cpuacct" (v1); "" (v2)
  std::string_view path;         ///< "/slurm/uid_0/job_7"
  /// Whether `controller` is one of the v1 controllers of this line.
  bool has(std::string_view controller) const;
};

/// The well-formed lines of `self_cgroup` (views into it), in order.
std::vector<CgroupMembership> cgroup_memberships(std::string_view self_cgroup);

/// The directories <root>/<path>, its parent, ... up to <root> itself, deepest first; empty when
/// `path` has a ".." component (outside our view of the hierarchy).
std::vector<std::filesystem::path> cgroup_dirs_up(const std::filesystem::path& root, std::string_view path);

}  // namespace ppb
