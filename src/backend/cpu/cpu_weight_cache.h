// One copy of each weight tensor per rank, shared by every CPU stage that holds it.
//
// Why: a run builds several stages side by side on a rank (every partition of the interleaved
// rounds; the same split at several M for `run --plan`), and each used to generate its own copy
// of the weights it holds. A decode step streams its stage's weights from memory, and on a
// virtual machine how fast a copy streams depends on where its pages landed: measured here
// (AMD EPYC VM, 2 cores, 1.4 GiB blocks each streamed by a GEMV while another process streamed
// its own) the medians of eight copies spread over 10.3-12.3 GB/s, and in three `run --plan 4`
// runs the split 17,13 at M=3 ran its decode steps 15-41% slower than the same split at M=4 for
// the whole run (the compute threads on a CPU 97-99% of their steps' time, so not preemption),
// while a run whose two copies landed alike measured them within 3%. Comparisons between
// partitions then measured where their copies landed as much as the splits. With one copy per
// tensor, every stage holding unit u on a rank reads the same memory for it, so the same split at
// two M differs by M alone and two splits by the units they move. Weights are a pure function of
// (seed, unit, tensor, block) (backend/weights.h), so sharing changes no value.
//
// The cache holds weak references: a tensor is freed when the last stage holding it is, as
// before. The memory checks still count each stage's weights whole (an upper bound when stages
// share).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace ppb::cpu {

/// Everything a weight tensor's values are a function of: the fill (backend/weights.h's
/// fill_* function), the seed, the unit, the tensor id and the fill's sizes and offsets, in the
/// order of its arguments (unused ones 0).
struct WeightKey {
  enum class Fill : uint8_t { projection, projection_rows, projection_cols, norm, bias, embedding, uniform };
  Fill fill = Fill::projection;
  uint64_t seed = 0;
  uint64_t unit = 0;
  uint64_t tensor = 0;
  size_t a = 0, b = 0, c = 0, d = 0;
  bool operator<(const WeightKey& o) const {
    return std::tie(fill, seed, unit, tensor, a, b, c, d) < std::tie(o.fill, o.seed, o.unit, o.tensor, o.a, o.b, o.c, o.d);
  }
};

/// A rank's weight tensors by WeightKey, each 64-byte aligned (cpu_aligned.h). Thread-safe.
class WeightCache {
 public:
  /// The tensor `key` of `n` floats: the one a live stage already holds, or a new block that
  /// `fill` writes (called once, under the cache's lock). A key names its size: asking for one
  /// with another `n` is an internal error.
  /// @throws std::bad_alloc when the memory is not there; ppb::InternalError on a size mismatch.
  std::shared_ptr<float> get(const WeightKey& key, size_t n, const std::function<void(float*)>& fill);

  /// Bytes of the tensors some stage still holds, each counted once.
  size_t resident_bytes() const;
  /// Tensors made (filled) so far, over the cache's life.
  size_t tensors_made() const;

 private:
  struct Entry {
    std::weak_ptr<float> block;
    size_t n = 0;
  };
  void prune_expired();  // with mu_ held
  mutable std::mutex mu_;
  std::map<WeightKey, Entry> entries_;
  size_t made_ = 0;
  size_t prune_at_ = 1024;  // entries_ size that triggers the next sweep of expired entries
};

}  // namespace ppb::cpu
