// `ppbench run --scenario poisson|gamma --request-rate search` (issue 38): the highest request
// rate that meets --goodput's TTFT and TPOT limits for --attainment of the requests, predicted
// and confirmed by measurement in one run. The steps (run/serving_rounds.cpp runs them):
//   1. before the rounds (the balance phase, rank 0): the serving simulator on the profile
//      (balance::ProfileStepCosts) finds the highest rate of the uniform split; the scenario's
//      balancer objective is taken at it, and the pilot plays at it (or at N / --max-time where
//      that is higher: a pessimistic profile must not make the pilot hours long);
//   2. pilot: every partition plays the scenario at that rate for one round; its measured
//      steps calibrate the step model per rank (balance::calibrate_steps, every partition's), and
//      the calibrated simulator finds each partition's highest rate, and its curve over rates;
//      the partition with the highest one is the searched partition, its rate R*;
//   3. the main measurement at 0.9 R* (/benchmark: the rounds, paired gains, validation);
//   4. the same rounds at 1.1 R* (/rate_search/above);
//   5. the verdict: confirmed when the searched partition's measured attainment is >= the
//      target at 0.9 R* and below it at 1.1 R* (the done-when; MLPerf's search for the
//      Server scenario's highest passing QPS confirms the same way, by runs on either side).
// Why a pilot: the profile's step model times prefill at one token count; the steps of
// continuous batching at small token counts cost up to 2x that on CPU ranks (serving_calibration.h)
// and the profile-only search says 1.45x too high a rate on Qwen3-0.6B here (DESIGN.md §11).
#pragma once

#include <vector>

#include "balance/partition.h"
#include "balance/predict.h"
#include "run/context.h"
#include "run/plan.h"
#include "serving/pipeline_sim.h"
#include "serving/rate_search.h"

namespace ppb::run {

/// The rates measured around R*, as multiples of it (the 0.9x and 1.1x).
constexpr double kRateBelow = 0.9, kRateAbove = 1.1;

/// The serving simulator's configuration of partition `p` in ctx's scenario (its M, B slots,
/// its step policy: balance::Partition::step_policy or the scenario's), the engine's too.
serving::PipelineSimConfig serving_sim_config(const RunContext& ctx, const balance::Partition& p);

/// Rank 0: the profile's highest rate (requests/s) for `p` on opt.scenario.drawn.requests (drawn at 1
/// request/s), and the outcome. @throws ppb::UserError when no rate meets the SLO or every rate
/// does (the SLO does not bind), naming the limits.
double profile_max_rate(const RunContext& ctx, const balance::Predictor& pred, const balance::Partition& p);

/// Rank 0, once the pilot's round is in ctx.record().serving.partitions (their steps, the same
/// order as set.splits): fills record().serving.rate_search's partitions (both maxima, the
/// curves), the searched partition, R*, the rates below and above.
/// @throws ppb::UserError when the calibrated simulator finds no partition a rate that meets the
///         SLO (no rate passes, or every rate does).
void plan_rate_confirmation(RunContext& ctx, const PartitionSet& set);

/// Rank 0, after the rounds at both rates (the main /benchmark partitions at the rate below,
/// rate_search.above at the rate above): the measured attainments and the verdict.
void judge_rate_confirmation(ServingRunRecord& s);

}  // namespace ppb::run
