#include "common/host_conditions.h"

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>

#include "common/cgroup.h"

namespace ppb {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::optional<long long> to_int(std::string_view s) {
  s = trim(s);
  long long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<CpuQuota> make_quota(std::optional<long long> q, std::optional<long long> p,
                                   const std::filesystem::path& dir) {
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
  return CpuQuota{static_cast<double>(*q) / static_cast<double>(*p), static_cast<double>(*p) / 1000.0, dir};
}

/// quota / period of one directory, or nullopt.
std::optional<CpuQuota> quota_v2(const std::filesystem::path& dir) {
  const std::string text = read_text(dir / "cpu.max");  // "" when absent: no quota
  const auto parts = split_fields(trim(text), ' ');
  if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
  return make_quota(to_int(parts[0]), to_int(parts[1]), dir);
}

std::optional<CpuQuota> quota_v1(const std::filesystem::path& dir) {
  return make_quota(to_int(read_text(dir / "cpu.cfs_quota_us")), to_int(read_text(dir / "cpu.cfs_period_us")), dir);
}

/// Keeps the binding quota of two: the fewer cores, of equal cores the longer period.
void take_binding(std::optional<CpuQuota>& best, const std::optional<CpuQuota>& q) {
  if (q && (!best || q->cores < best->cores || (q->cores == best->cores && q->period_ms > best->period_ms))) best = q;
}

/// Appends the quota of every directory from <root>/<path> up to <root> that sets one, deepest first.
template <class Fn>
void hierarchy_quotas(std::vector<CpuQuota>& out, const std::filesystem::path& root, std::string_view path, Fn quota) {
  for (const std::filesystem::path& dir : cgroup_dirs_up(root, path))
    if (const auto q = quota(dir)) out.push_back(*q);
}

}  // namespace

std::vector<int> cpu_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

std::optional<std::vector<int>> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  text = trim(text);
  if (text.empty()) return cpus;
  for (std::string_view piece : split_fields(text, ',')) {
    const size_t dash = piece.find('-');
    const auto lo = to_int(dash == std::string_view::npos ? piece : piece.substr(0, dash));
    const auto hi = dash == std::string_view::npos ? lo : to_int(piece.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi - *lo > 1 << 20) return std::nullopt;
    for (long long c = *lo; c <= *hi; ++c) cpus.push_back(static_cast<int>(c));
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<CpuQuota> cgroup_cpu_quotas(std::string_view self_cgroup, const std::filesystem::path& cgroup_root) {
  std::vector<CpuQuota> all;
  for (const CgroupMembership& m : cgroup_memberships(self_cgroup)) {
    if (m.v2) {
      hierarchy_quotas(all, cgroup_root, m.path, quota_v2);
    } else if (m.has("cpu")) {  // cgroup v1: mounted as cpu or cpu,cpuacct
      const std::string mount(m.controllers);
      hierarchy_quotas(all, cgroup_root / mount, m.path, quota_v1);
      if (mount != "cpu") hierarchy_quotas(all, cgroup_root / "cpu", m.path, quota_v1);
    }
  }
  std::optional<CpuQuota> best;
  for (const CpuQuota& q : all) take_binding(best, q);
  if (best) {  // the binding level first, the others after it in the order found
    const auto at = std::find_if(all.begin(), all.end(), [&](const CpuQuota& q) { return q.dir == best->dir; });
    std::rotate(all.begin(), at, at + 1);
  }
  return all;
}

std::optional<CpuQuota> cgroup_cpu_quota(std::string_view self_cgroup, const std::filesystem::path& cgroup_root) {
  const std::vector<CpuQuota> all = cgroup_cpu_quotas(self_cgroup, cgroup_root);
  if (all.empty()) return std::nullopt;
  return all.front();
}

std::string cgroup_identity(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "";
  return std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
         std::to_string(static_cast<unsigned long long>(st.st_ino));
}

std::string cpu_governor(int cpu, const std::filesystem::path& sys_root) {
  std::string dir = "cpu";
  dir += std::to_string(cpu);
  return std::string(trim(read_text(sys_root / "devices/system/cpu" / dir / "cpufreq/scaling_governor")));
}

}  // namespace ppb
