// The hand-made ragged batch of the ragged-attention tests (test_ragged_attention.cpp, CPU;
// test_cuda_ragged.cpp, the CUDA twin): what a continuous-batching step of issue 37 looks like.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace ppb_ragged_test {

/// One request of a step: its cache slot, tokens already cached, new tokens this step.
struct RaggedRow {
  int32_t slot, pos, n;
};

/// A ragged batch's host arrays (cpu::RaggedBatch points into them).
struct RaggedArrays {
  std::vector<int32_t> slot, pos, offset;
  int tokens() const { return offset.back(); }
  ppb::cpu::RaggedBatch view() const {
    return {static_cast<int>(slot.size()), slot.data(), pos.data(), offset.data()};
  }
};

inline RaggedArrays ragged_arrays(const std::vector<RaggedRow>& rows) {
  RaggedArrays a;
  a.offset.push_back(0);
  for (const RaggedRow& r : rows) {
    a.slot.push_back(r.slot);
    a.pos.push_back(r.pos);
    a.offset.push_back(a.offset.back() + r.n);
  }
  return a;
}

/// The step of the brief: a prefill of 5 tokens at 0, a decode at 17, a decode at 3, a request
/// admitted last step with nothing new (n = 0: writes nothing), a prefill of 2 tokens at 9; in
/// slots 5, 0, 3, 1, 6 of 7 (not contiguous, not in row order; slots 2 and 4 idle).
inline std::vector<RaggedRow> brief_step() { return {{5, 0, 5}, {0, 17, 1}, {3, 3, 1}, {1, 4, 0}, {6, 9, 2}}; }
inline constexpr int kBriefSlots = 7;
inline constexpr int kBriefContext = 24;  // >= every row's pos + n (18)

/// The largest pos_r + n_r of `rows` (attention_ragged's plan_keys without a window).
inline int max_keys(const std::vector<RaggedRow>& rows) {
  int m = 1;
  for (const RaggedRow& r : rows) m = r.pos + r.n > m ? r.pos + r.n : m;
  return m;
}

}  // namespace ppb_ragged_test
