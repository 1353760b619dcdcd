// A demand-paged KV store for the CPU stage (issue 49's "KV memory as engines hold it").
//
// Why: a serving engine holds its KV cache as a pool of blocks sized from free memory, and
// admits requests by free blocks (vLLM's PagedAttention; serving/scheduler.h models it). The CPU
// stage's attention reads each slot's positions as one contiguous run (cpu_ops.h attention_ragged
// takes strided rows), so instead of block tables the store follows vAttention (Prabhu et al.,
// "vAttention: Dynamic Memory Management for Serving LLMs without PagedAttention", ASPLOS 2025):
// every slot keeps its contiguous virtual range at max_context, and physical memory backs only
// the pages written since the slot was last released. The kernel is the block allocator: a write
// faults a zeroed page in, release() gives a slot's pages back (madvise MADV_DONTNEED), so the
// resident KV stays within the scheduler's pool (its blocks cover the positions written) plus a
// partly written page at each end of every slot's region (page_slack_bytes).
#pragma once

#include <cstddef>

namespace ppb::cpu {

/// The OS page size in bytes (sysconf; 4096 on x86-64 Linux).
size_t page_bytes();

/// Bytes a paged store may hold beyond the tokens its pool covers: two pages (one partly written
/// at each end) per region, `regions` = slots x layers x (2 for K and V, 1 for MLA's latent row).
inline size_t page_slack_bytes(size_t regions) { return 2 * regions * page_bytes(); }

class PagedStore {
 public:
  PagedStore() = default;
  /// Reserves `floats` floats of zeroed, demand-paged memory (anonymous mmap, MAP_NORESERVE,
  /// huge pages off so that a page is the unit of residency). Nothing is resident yet.
  /// @throws std::bad_alloc when the address space is not there.
  explicit PagedStore(size_t floats);
  ~PagedStore();
  PagedStore(PagedStore&& o) noexcept;
  PagedStore& operator=(PagedStore&& o) noexcept;
  PagedStore(const PagedStore&) = delete;
  PagedStore& operator=(const PagedStore&) = delete;

  float* data() const { return data_; }
  /// Gives back the pages wholly inside [p, p + floats) (which must lie in the store): they read
  /// as zeros again and hold no memory until written. The partial pages at either end stay.
  void release(const float* p, size_t floats);
  /// Bytes of the store resident now (mincore), for tests and the memory table.
  size_t resident_bytes() const;

 private:
  float* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ppb::cpu
