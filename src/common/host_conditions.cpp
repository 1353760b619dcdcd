#include "common/host_conditions.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

namespace ppb {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(sep, start);
    if (end == std::string_view::npos) {
      out.push_back(s.substr(start));
      break;
    }
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

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

std::optional<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

/// quota / period of one directory, or nullopt.
std::optional<double> quota_v2(const std::filesystem::path& dir) {
  const auto text = read_file(dir / "cpu.max");
  if (!text) return std::nullopt;
  const auto parts = split(trim(*text), ' ');
  if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
  const auto q = to_int(parts[0]), p = to_int(parts[1]);
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
  return static_cast<double>(*q) / static_cast<double>(*p);
}

std::optional<double> quota_v1(const std::filesystem::path& dir) {
  const auto qt = read_file(dir / "cpu.cfs_quota_us"), pt = read_file(dir / "cpu.cfs_period_us");
  if (!qt || !pt) return std::nullopt;
  const auto q = to_int(*qt), p = to_int(*pt);
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
  return static_cast<double>(*q) / static_cast<double>(*p);
}

/// The smallest quota from <root>/<path> up to <root>.
template <class Fn>
std::optional<double> hierarchy_quota(const std::filesystem::path& root, std::string_view path, Fn quota) {
  if (path.find("..") != std::string_view::npos) return std::nullopt;
  std::optional<double> best;
  std::filesystem::path rel = std::string(path.substr(path.starts_with("/") ? 1 : 0));
  while (true) {
    if (const auto q = quota(root / rel)) best = best ? std::min(*best, *q) : *q;
    if (rel.empty() || rel == rel.parent_path()) break;
    rel = rel.parent_path();
  }
  return best;
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
  for (std::string_view piece : split(text, ',')) {
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

std::optional<double> cgroup_cpu_quota_cores(std::string_view self_cgroup, const std::filesystem::path& cgroup_root) {
  std::optional<double> best;
  auto take = [&best](std::optional<double> q) {
    if (q) best = best ? std::min(*best, *q) : *q;
  };
  for (std::string_view line : split(self_cgroup, '\n')) {
    const size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    const size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, c1);
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string_view path = line.substr(c2 + 1);
    if (id == "0" && controllers.empty()) {  // cgroup v2
      take(hierarchy_quota(cgroup_root, path, quota_v2));
      continue;
    }
    for (std::string_view controller : split(controllers, ','))
      if (controller == "cpu") {  // cgroup v1: mounted as cpu or cpu,cpuacct
        const std::string mount(controllers);
        take(hierarchy_quota(cgroup_root / mount, path, quota_v1));
        if (mount != "cpu") take(hierarchy_quota(cgroup_root / "cpu", path, quota_v1));
        break;
      }
  }
  return best;
}

std::string cpu_governor(int cpu, const std::filesystem::path& sys_root) {
  std::string dir = "cpu";
  dir += std::to_string(cpu);
  const auto text = read_file(sys_root / "devices/system/cpu" / dir / "cpufreq/scaling_governor");
  return text ? std::string(trim(*text)) : std::string();
}

}  // namespace ppb
