#include "results/conditions.h"

#include <algorithm>
#include <set>

#include "common/host_conditions.h"

namespace ppb {

std::vector<HostLoad> host_loads(const std::vector<RankInfo>& ranks) {
  std::vector<HostLoad> loads;
  std::vector<std::set<int>> cpus;
  std::vector<bool> known;
  for (const RankInfo& r : ranks) {
    auto it = std::find_if(loads.begin(), loads.end(), [&](const HostLoad& h) { return h.hostname == r.hostname; });
    size_t i = static_cast<size_t>(it - loads.begin());
    if (it == loads.end()) {
      loads.push_back({r.hostname, 0, 0, 0, ""});
      cpus.emplace_back();
      known.push_back(true);
    }
    loads[i].ranks += 1;
    loads[i].threads += std::max(1, r.compute_threads);
    const auto list = parse_cpu_list(r.cpu_affinity);
    if (r.cpu_affinity.empty() || !list) {
      known[i] = false;
    } else {
      cpus[i].insert(list->begin(), list->end());
    }
  }
  for (size_t i = 0; i < loads.size(); ++i) {
    if (!known[i]) continue;
    loads[i].cpus = static_cast<int>(cpus[i].size());
    loads[i].cpu_list = format_cpu_list(std::vector<int>(cpus[i].begin(), cpus[i].end()));
  }
  return loads;
}

bool any_oversubscribed(const std::vector<RankInfo>& ranks) {
  for (const auto& h : host_loads(ranks))
    if (h.oversubscribed()) return true;
  return false;
}

}  // namespace ppb
