// A synthetic RunRecord's metadata for the tests that build profiles by hand (test_plan,
// test_serving_sim): the version, model and backend fields a complete file has, R ranks of one
// device class on one machine, one link. The caller fills the profile.
#pragma once

#include <cstdint>

#include "results/run_record.h"

namespace ppb_test {

/// R ranks ("node01", "Xeon", machine "m0", memory limit `memory_limit` bytes; 0 = none),
/// hidden size 64, link 2 us and 5 GB/s, workload `w`; status "complete", validation "n/a".
inline ppb::RunRecord synthetic_run(int R, const ppb::WorkloadInfo& w, int64_t memory_limit = 0) {
  ppb::RunRecord r;
  r.ppbench_version = "test";
  r.created_utc = "2026-01-02T03:04:05Z";
  r.backend = "cpu";
  r.transport = "mpi";
  r.world_size = R;
  r.model_source = "m.json";
  r.model_config_json = "{}";
  r.model_attrs_num = {{"hidden_size", 64}};
  r.workload = w;
  r.link_latency_s = 2e-6;
  r.link_bandwidth_Bps = 5e9;
  for (int k = 0; k < R; ++k) {
    ppb::RankInfo info{"node01", "Xeon", "", k, 0.0};
    info.machine_id = "m0";
    info.memory_limit_bytes = memory_limit;
    r.ranks.push_back(info);
  }
  r.validation = "n/a";
  r.status = "complete";
  return r;
}

}  // namespace ppb_test
