// The memory a device allocates from, and each rank's share of it (Device::memory_pools).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ppb {

/// Memory a device allocates from, shared by the ranks of a machine that name it alike.
struct MemoryPool {
  size_t free_bytes = 0;  ///< free now, for all the ranks drawing on it
  std::string key;        ///< names the pool within one machine ("kernel", "cgroup:...", "device:<bus id>")
};

/// For each of this rank's pools (`mine`, keys already prefixed with the machine's id so that
/// pools of different machines never compare equal), how many ranks draw on it: the ranks, this
/// one included, whose key list (`all`, every rank's, prefixed alike) holds the same key.
/// A rank listing a key twice counts once.
std::vector<int> count_pool_sharers(const std::vector<std::string>& mine,
                                    const std::vector<std::vector<std::string>>& all);

/// A rank's share of its free memory in bytes: the smallest pools[i].free_bytes / sharers[i]
/// (sharers as count_pool_sharers gives them, each >= 1). 0 when there is no pool.
/// @throws std::invalid_argument if the sizes differ or a sharer count is < 1.
size_t memory_share(const std::vector<MemoryPool>& pools, const std::vector<int>& sharers);

}  // namespace ppb
