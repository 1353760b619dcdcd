#include "backend/cpu/cpu_weight_cache.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "backend/cpu/cpu_aligned.h"
#include "common/error.h"

namespace ppb::cpu {

std::shared_ptr<float> WeightCache::get(const WeightKey& key, size_t n, const std::function<void(float*)>& fill) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    if (std::shared_ptr<float> live = it->second.block.lock()) {
      if (it->second.n != n)
        throw InternalError("weight cache: tensor " + std::to_string(key.tensor) + " of unit " + std::to_string(key.unit) +
                            " asked for with " + std::to_string(n) + " floats, held with " + std::to_string(it->second.n));
      return live;
    }
  }
  AlignedFloats owned = make_aligned_floats(n);
  fill(owned.get());
  std::shared_ptr<float> block(owned.release(), AlignedDelete{});
  entries_[key] = Entry{block, n};
  ++made_;
  if (entries_.size() >= prune_at_) prune_expired();
  return block;
}

void WeightCache::prune_expired() {
  for (auto it = entries_.begin(); it != entries_.end();)
    it = it->second.block.expired() ? entries_.erase(it) : std::next(it);
  prune_at_ = std::max<size_t>(1024, 2 * entries_.size());  // amortised O(1) per get
}

size_t WeightCache::resident_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t bytes = 0;
  for (const auto& [key, e] : entries_)
    if (!e.block.expired()) bytes += e.n * sizeof(float);
  return bytes;
}

size_t WeightCache::tensors_made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return made_;
}

}  // namespace ppb::cpu
