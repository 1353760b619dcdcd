#include "serving/simulated_rate.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace ppb::serving {

double mean_solo_e2e_s(const std::vector<Request>& unit, const StepCostModel& costs, const PipelineSimConfig& cfg) {
  if (unit.empty()) throw InternalError("mean_solo_e2e_s: no request");
  const std::size_t n = std::min<std::size_t>(unit.size(), 8);
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    Request alone = unit[i];
    alone.arrival_s = 0.0;
    sum += simulate_serving({alone}, costs, cfg).times[0].finish_s;
  }
  return sum / static_cast<double>(n);
}

RateSearchResult search_simulated_rate(const std::vector<Request>& unit, const StepCostModel& costs,
                                       const PipelineSimConfig& cfg, const SloTarget& slo) {
  RateSearchOptions so;
  so.start_rate = 0.1 / mean_solo_e2e_s(unit, costs, cfg);
  so.min_rate = so.start_rate / 1024.0;
  so.max_rate = so.start_rate * 1073741824.0;
  return search_max_rate(
      [&](double rate) { return judge_requests(simulate_serving(scale_arrivals(unit, rate), costs, cfg).times, slo); }, so);
}

ScaledStepCosts::ScaledStepCosts(const StepCostModel& base, double scale) : base_(base), scale_(scale) {
  if (!(scale > 0.0) || !std::isfinite(scale)) throw InternalError("ScaledStepCosts: scale must be > 0 and finite");
}

RateBand search_rate_band(const std::vector<Request>& unit, const StepCostModel& costs, const PipelineSimConfig& cfg,
                          const SloTarget& slo, double rel_error) {
  if (!(rel_error >= 0.0 && rel_error < 1.0)) throw InternalError("search_rate_band: relative error outside [0, 1)");
  RateBand b;
  b.rel_error = rel_error;
  b.slower = search_simulated_rate(unit, ScaledStepCosts(costs, 1.0 + rel_error), cfg, slo);
  b.faster = search_simulated_rate(unit, ScaledStepCosts(costs, 1.0 - rel_error), cfg, slo);
  return b;
}

ServingMetrics simulate_at_rate(const std::vector<Request>& unit, double rate, const StepCostModel& costs,
                                const PipelineSimConfig& cfg, const GoodputSpec& limits) {
  return serving_metrics(simulate_serving(scale_arrivals(unit, rate), costs, cfg).times, limits);
}

}  // namespace ppb::serving
