// `ppbench run --plan K` (issue 36, the measured front): the deployment planner of balance/plan.h
// on this run's own profile, for its own ranks, chooses the points the rounds measure beside the
// uniform split; after the rounds each point's prediction sits beside its measurement and the
// run says whether the point predicted best measured best.
#pragma once

#include <string>
#include <vector>

#include "balance/partition.h"
#include "run/context.h"

namespace ppb::run {

/// The partition name of a plan candidate: "plan-" + its label in lower case, spaces as '-'
/// ("PP2 M4" -> "plan-pp2-m4", "PP2 tp2-1 M2" -> "plan-pp2-tp2-1-m2").
std::string plan_point_name(const std::string& label);

/// Rank 0, --plan K: balance::plan_layouts on the run's record for its R ranks (every layout of
/// R devices like rank 0, M = 1 .. 2S, unpruned: every candidate simulated), stored in
/// record().plan; returns the splits to measure after the reference, in this order: the K front
/// points with the most predicted tokens/s (equal within a relative 1e-9: more tokens/s per user
/// first), filled up to K with the candidates off the front in the same order where the front
/// has fewer than K points, then the best layout's other M (strategy 3's groups-in-flight curve: every M of the search, at most 8,
/// evenly spaced), each with its own M (Partition::groups) and name (plan_point_name).
/// @throws ppb::UserError when no layout fits memory (the planner's message).
std::vector<balance::Partition> plan_points(RunContext& ctx);

/// Rank 0, after the rounds (the measured metrics complete): each measured point's prediction
/// (the planner's, made before the rounds) as the metrics plan_predicted_tokens_per_s,
/// plan_predicted_ttft_p50_ms, plan_predicted_tpot_p50_ms of its /benchmark/<name>; the verdict
/// in record().plan: the point predicted best (most predicted tokens/s among those measured, ties
/// as plan_points ranks them), the
/// one measured best (most measured tokens/s), and whether they are one, or the predicted best's
/// tokens/s lies within the paired 95% CI of the measured best's (compare_paired over their
/// common rounds: the CI of predicted best / measured best covers 1). No-op without --plan.
void plan_verdict(RunContext& ctx);

}  // namespace ppb::run
