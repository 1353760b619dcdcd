// Memory of each pipeline stage: weights, KV cache, and how many more KV-cache tokens each
// device could hold (the stage with the embedding or the lm_head is often the one that limits
// the batch or context a pipeline can serve).
//
// Pure C++: no MPI, CUDA or HDF5 here (DESIGN.md §5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "balance/partition.h"

namespace ppb::balance {

struct StageMemory {
  int stage = 0, device = 0, first_unit = 0, last_unit = 0;
  int64_t weight_bytes = 0;    ///< resident weights of the stage's units
  int64_t kv_bytes = 0;        ///< KV cache of the workload (kv_tokens cached tokens)
  int64_t total_bytes = 0;     ///< weight_bytes + kv_bytes
  int64_t limit_bytes = 0;     ///< the device's memory for weights + KV cache; 0 = unlimited
  int64_t free_bytes = 0;      ///< limit - total (negative: does not fit); 0 when unlimited
  double kv_bytes_per_token = 0;   ///< KV bytes per cached token (one position of one sequence)
  int64_t kv_token_capacity = -1;  ///< cached tokens that fit beside the weights; -1 = unlimited
  int64_t kv_tokens_left = -1;     ///< kv_token_capacity - the workload's tokens; -1 = unlimited
};

struct MemoryReport {
  std::vector<StageMemory> stages;  ///< [S]
  int64_t kv_tokens = 0;            ///< cached tokens of the workload (M * B * (P + G))
  int limiting_stage = -1;          ///< stage with the smallest kv_token_capacity; -1 if none is limited
  int64_t pipeline_kv_token_capacity = -1;  ///< min over stages; -1 = unlimited
};

/// Per-stage memory of partition `p`.
/// weight_bytes, kv_bytes: [U] bytes per unit (kv_bytes for `kv_tokens` cached tokens, e.g.
/// /profile/unit_kv_bytes for M*B sequences of P+G tokens: kv_tokens = M*B*(P+G));
/// device_memory_bytes: [D] indexed by p.device_rank (<= 0 or empty = unlimited).
/// KV bytes per token are taken as linear in the tokens at the workload's context (exact for
/// global attention; an upper bound for sliding-window layers, whose cache stops growing).
/// @throws ppb::UserError on sizes that do not match the partition.
MemoryReport memory_report(const Partition& p, const std::vector<int64_t>& weight_bytes,
                           const std::vector<int64_t>& kv_bytes, int64_t kv_tokens,
                           const std::vector<int64_t>& device_memory_bytes);

/// A table, one line per stage: units, device, weights, KV cache, limit, free, KV tokens left;
/// then the stage that limits the pipeline's KV capacity. GiB with 3 decimals.
std::string format_memory_report(const MemoryReport& report);

}  // namespace ppb::balance
