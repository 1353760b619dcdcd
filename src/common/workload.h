// The workload of a run, one value for every layer that shapes work by it: the stages
// (StageConfig), the profiler (ProfileConfig), the pipelined loop (PipelineConfig), the
// simulator and the results record (DESIGN.md §1). B sequences per request group, P prompt
// tokens and G decode steps each, M groups in flight, in one element type, from one seed.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace ppb {

/// The seed `ppbench run` takes by default (--seed), and the offline commands' scenarios too
/// (`serve-search`, `plan --scenario`: ScenarioFlags::seed): with the same flags they draw the
/// same requests as a run, so that a rate found offline is measured on the requests it was found
/// on. On 64 requests two seeds' highest rates at one SLO differed 1.9x (docs/MEASUREMENTS.md §
/// "2026-12-07 the rate search's requests").
inline constexpr uint64_t kDefaultSeed = 1234;

struct Workload {
  int batch = 1;        ///< B: sequences per request group (micro-batch)
  int prompt_len = 1;   ///< P: prompt tokens per sequence (prefill)
  int gen_len = 1;      ///< G: decode steps per group
  int groups = 1;       ///< M: request groups in flight (KV-cache slots of a stage)
  DType dtype = DType::f32;
  uint64_t seed = 0;    ///< of the random weights and prompts
  /// Longest sequence: P + G tokens (each group's KV cache is sized for it).
  int max_context() const { return prompt_len + gen_len; }
};

}  // namespace ppb
