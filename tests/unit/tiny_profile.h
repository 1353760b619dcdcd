// A tiny profile by hand for the serving simulator's and the offline commands' tests
// (test_serving_sim, test_scenario): 3 units on R ranks, the step model's hand-computed values.
#pragma once

#include <vector>

#include "results/run_record.h"
#include "synthetic_run.h"

namespace ppb_test {

/// R ranks on one machine, 3 units (embed, layer.0, head), B=2 P=4 G=9 M=2; contexts 4, 8, 12.
/// Rank r's table is rank 0's times (1 + r).
inline ppb::RunRecord tiny_profile(int R) {
  ppb::RunRecord r = synthetic_run(R, {2, 4, 9, 2, "f32", 1, 2, 0, 3, true, 7, "workload"});
  auto& p = r.profile;
  p.unit_name = {"embed", "layer.0", "head"};
  p.unit_signature = {0, 1, 2};
  p.signature_name = {"embed", "layer", "head"};
  p.unit_params = {100, 100, 100};
  p.unit_weight_bytes = {1000, 1000, 3000};
  p.unit_kv_bytes = {0, 400, 0};
  p.decode_contexts = {4, 8, 12};
  const std::vector<double> lat = {1.0, 0.2, 3.0, 1.6, 0.5, 0.4};           // [U][2]
  const std::vector<double> ctx = {0.1, 0.2, 0.3, 1.0, 1.4, 2.4, 0.4, 0.4, 0.4};  // [U][C]
  for (int k = 0; k < R; ++k) {
    for (double v : lat) p.latency_ms.push_back(v * (1 + k));
    for (double v : ctx) p.decode_context_ms.push_back(v * (1 + k));
  }
  p.latency_min_ms = p.latency_max_ms = p.latency_ms;
  p.cost_ms.assign(static_cast<std::size_t>(R) * 3, 1.0);
  return r;
}

}  // namespace ppb_test
