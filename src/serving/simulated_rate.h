// The serving simulator's answer to "the highest request rate that meets the SLO" (issue 38),
// shared by `ppbench serve-search` (offline, from a file) and `ppbench run --request-rate search`
// (the prediction its measured rates confirm): search_max_rate (rate_search.h) with each probe
// the simulator playing one scenario's requests at that rate. Pure C++.
//
// One scenario for every rate: the requests drawn once at 1 request/s, and at rate R the same
// requests with every arrival divided by R (scale_arrivals: equal to drawing at R), so a probe
// differs from another only by the rate.
#pragma once

#include <vector>

#include "serving/pipeline_sim.h"
#include "serving/rate_search.h"
#include "serving/request_metrics.h"

namespace ppb::serving {

/// The mean E2E (s) of the first (up to 8) requests of `unit` each served alone on `costs`: the
/// light-load scale of the search's first probe. `unit` non-empty.
double mean_solo_e2e_s(const std::vector<Request>& unit, const StepCostModel& costs, const PipelineSimConfig& cfg);

/// The highest rate (requests/s) at which the simulator, playing `unit` (arrivals at 1
/// request/s, shape [N], N >= 1) rescaled with scale_arrivals on `costs` and `cfg`, passes
/// `slo` (judge_requests), to 1% (search_max_rate): the first probe a tenth of the rate one
/// request alone would sustain (0.1 / mean_solo_e2e_s), limits 2^10 below and 2^30 above it.
/// @throws ppb::InternalError for an empty `unit`; what the cost model throws.
RateSearchResult search_simulated_rate(const std::vector<Request>& unit, const StepCostModel& costs,
                                       const PipelineSimConfig& cfg, const SloTarget& slo);

/// The simulator's metrics of `unit` at `rate` (> 0, finite) with goodput limits `limits`.
ServingMetrics simulate_at_rate(const std::vector<Request>& unit, double rate, const StepCostModel& costs,
                                const PipelineSimConfig& cfg, const GoodputSpec& limits);

}  // namespace ppb::serving
