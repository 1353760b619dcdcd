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

/// `base`'s step costs with every stage's compute x `scale` (> 0, finite), transfers as `base`'s:
/// a step model's relative error propagated to what is predicted from it (search_rate_band).
/// Keeps a reference to `base`.
/// @throws ppb::InternalError for a scale <= 0 or not finite.
class ScaledStepCosts final : public StepCostModel {
 public:
  ScaledStepCosts(const StepCostModel& base, double scale);
  int stages() const override { return base_.stages(); }
  double compute_ms(int k, const StepShape& s) const override { return scale_ * base_.compute_ms(k, s); }
  double transfer_ms(int k, const StepShape& s) const override { return base_.transfer_ms(k, s); }
  /// `base`'s: the scale moves the together and alone times alike.
  std::vector<StageContention> contention() const override { return base_.contention(); }

 private:
  const StepCostModel& base_;
  double scale_;
};

/// The highest rate at the ends of a step model's relative error e (issue 47: every prediction
/// with the model's own uncertainty): search_simulated_rate with every compute x (1 + e)
/// (`slower`: the band's low end) and x (1 - e) (`faster`: its high end). The SLO's pass/fail
/// is monotone in step times for a fixed schedule only, so the ends bracket the answer at e's
/// edges, not every rate between (the searches' non_monotone counts say where they did not).
struct RateBand {
  double rel_error = 0.0;     ///< e, in [0, 1)
  RateSearchResult slower;    ///< at compute x (1 + e)
  RateSearchResult faster;    ///< at compute x (1 - e)
};
/// @throws ppb::InternalError for e outside [0, 1) or an empty `unit`; what the cost model throws.
RateBand search_rate_band(const std::vector<Request>& unit, const StepCostModel& costs, const PipelineSimConfig& cfg,
                          const SloTarget& slo, double rel_error);

/// The simulator's metrics of `unit` at `rate` (> 0, finite) with goodput limits `limits`.
ServingMetrics simulate_at_rate(const std::vector<Request>& unit, double rate, const StepCostModel& costs,
                                const PipelineSimConfig& cfg, const GoodputSpec& limits);

}  // namespace ppb::serving
