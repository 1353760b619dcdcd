// `ppbench plan FILE.h5 --devices N --scenario poisson|gamma` (issue 38 on issue 36's planner):
// every candidate layout of the planner (balance/plan.h: stages, tensor-parallel widths, the
// exact split, M groups in flight) ranked by the highest request rate it serves within a
// serving SLO (TTFT and TPOT limits met by a share of the requests), found by bisection on the
// serving simulator with the profile's step model (serving/simulated_rate.h,
// balance/serving_step_model.h) — the search `ppbench serve-search` runs on one split, here on
// every layout of N devices like the file's rank 0 (plan_record). Pure C++.
#pragma once

#include <cstddef>
#include <vector>

#include "balance/plan.h"
#include "results/run_record.h"
#include "serving/rate_search.h"
#include "serving/scenario.h"

namespace ppb::balance {

/// One candidate under the serving scenario.
struct ServingPlanEntry {
  std::size_t candidate = 0;           ///< index into PlanResult::candidates
  serving::RateSearchResult search;    ///< the bisection (outcome, probes)
  double max_rate = 0.0;               ///< found: the highest passing rate, requests/s (all replicas); unbounded: the last probed; none: 0
  double max_rate_per_device = 0.0;    ///< max_rate / N
  serving::ServingMetrics at_rate;     ///< the simulator's metrics at max_rate (found or unbounded)
};

/// Every candidate of `plan` (plan_layouts on `run`) searched for its highest rate meeting
/// spec.slo() on `unit` (spec's requests at 1 request/s, N >= 1) with spec's step policy, the
/// candidate's M and B, at which its metrics take spec.goodput's limits; each candidate's step
/// costs from plan_record(run, N, M) (ProfileStepCosts), ranked: unbounded first, then found by
/// max_rate descending, then none; ties (relative 1e-9) to fewer stages, then fewer groups.
/// Every candidate is searched (no pruning: a closed batch's bounds do not bound a rate under an
/// SLO), on up to 8 threads; the cost is candidates x probes (~17) x one simulation of `unit`.
/// A candidate of R replicas (PlanCandidate::replicas) is one replica of N / R devices searched
/// as above, each request sent to a replica at random: every replica sees the scenario at
/// rate / R (for Poisson arrivals exactly a Poisson process; round-robin would be at least as
/// regular), so max_rate is R x the replica's, and at_rate the replica's latencies with its
/// rates (output tokens/s, requests/s, goodput) x R.
/// @throws ppb::UserError when a candidate's stages lack a profile (a width the file did not
///         profile); ppb::InternalError for an empty `unit`.
std::vector<ServingPlanEntry> rank_by_serving_rate(const RunRecord& run, const PlanResult& plan,
                                                   const std::vector<serving::Request>& unit,
                                                   const serving::ScenarioSpec& spec);

}  // namespace ppb::balance
