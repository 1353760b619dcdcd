// Dividing free memory among the ranks that draw on it (backend/memory_pool.h).
#include <algorithm>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/memory_pool.h"

namespace ppb {

std::vector<int> count_pool_sharers(const std::vector<std::string>& mine,
                                    const std::vector<std::vector<std::string>>& all) {
  std::vector<int> sharers(mine.size(), 0);
  for (const auto& keys : all) {
    const std::set<std::string> distinct(keys.begin(), keys.end());
    for (size_t i = 0; i < mine.size(); ++i) sharers[i] += distinct.count(mine[i]) ? 1 : 0;
  }
  return sharers;
}

size_t memory_share(const std::vector<MemoryPool>& pools, const std::vector<int>& sharers) {
  if (pools.size() != sharers.size())
    throw std::invalid_argument("memory_share: " + std::to_string(pools.size()) + " pools but " +
                                std::to_string(sharers.size()) + " sharer counts");
  if (pools.empty()) return 0;
  size_t share = std::numeric_limits<size_t>::max();
  for (size_t i = 0; i < pools.size(); ++i) {
    if (sharers[i] < 1) throw std::invalid_argument("memory_share: pool " + pools[i].key + " has no rank");
    share = std::min(share, pools[i].free_bytes / static_cast<size_t>(sharers[i]));
  }
  return share;
}

}  // namespace ppb
