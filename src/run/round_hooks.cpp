#include "run/round_hooks.h"

#include <algorithm>
#include <sstream>

#include "balance/calibrate.h"
#include "balance/problem.h"
#include "common/clock.h"
#include "common/format.h"
#include "run/profile_phase.h"

namespace ppb::run {

void RoundProfileHook::before_rounds(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) {
  const bool two_passes = two_passes_;
  RunRecord* run = ctx.root ? &ctx.record() : nullptr;
  auto status = [&](const std::string& s) {
    if (run) run->round_profile_status = s;
  };
  size_t single = 0;  // splits of one rank per stage measured on their own: cross-calibration's sources
  for (const Bench& b : benches) single += set.splits[b.pi].tensor_parallel() ? 0 : 1;
  // With two of them, cross-calibration (after the rounds) sees the rounds' machine at no cost,
  // and predicted the main job's stages within +-3.6% where these cycles left up to +16.6%
  // (issue 13, five runs); the cycles would take 20% of the rounds' time from the gains' CIs.
  const bool crossed = ctx.opt.round_profile == RoundProfile::automatic && single >= 2;
  if (ctx.opt.round_profile == RoundProfile::off) status("off: --round-profile off");
  else if (!two_passes) status("none: the profile has one pass (no ranks sharing a machine's memory)");
  else if (crossed)
    status("none: two or more splits of one rank per stage are measured, which cross-calibrate each other after the "
           "rounds (--round-profile on takes the cycles too)");
  if (ctx.opt.round_profile == RoundProfile::off || !two_passes || benches.empty() || crossed) return;
  const ProfileConfig pc = profile_config(ctx);
  const bool fits = ResidentProfiler::bytes(*ctx.device, ctx.spec, pc) <= ctx.device->free_memory();
  if (ctx.mpi.agree(fits ? 0 : 1) != 0) {
    status("none: one unit of every signature would not fit beside the stages on some rank");
    ctx.progress.say("benchmark: no profile between rounds (none: one unit of every signature would not fit beside the "
                     "stages on some rank)");
    return;
  }
  ctx.phase("units of the profile between rounds",
            [&] { units_ = std::make_unique<ResidentProfiler>(*ctx.device, ctx.spec, pc); });
  status("together cycles between rounds, at most " + format_fixed(100 * kShare, 0) + "% of the rounds' time");
  ctx.progress.say("benchmark: profile cycles (together) between rounds, at most " + format_fixed(100 * kShare, 0) +
                   "% of the rounds' time; every prediction is made again from them after the rounds");
}

double RoundProfileHook::after_round(RunContext& ctx, const RoundState& state) {
  if (!units_) return 0.0;
  // Rank 0 decides whether a cycle is due: the cycles so far took at most kShare of the turns.
  std::vector<int> due{ctx.root && spent_s_ <= kShare * state.turns_s ? 1 : 0};
  ctx.mpi.bcast_ints(due);
  if (due.empty() || due[0] == 0) return 0.0;
  const double start = monotonic_s();
  ProfileResult r;
  ctx.phase("profile after round " + std::to_string(state.rounds), [&] {
    ProfileConfig pc = profile_config(ctx);
    pc.align = [&ctx] { ctx.mpi.barrier(); };
    r = units_->profile(pc);
  });
  const auto all = ctx.mpi.gather_doubles(pack_phases(r.prefill_ms, r.decode_ms));
  const double took = monotonic_s() - start;
  if (ctx.root) {
    RunRecord& run = ctx.record();
    ProfileTable& t = run.profile;
    t.latency_rounds_ms.insert(t.latency_rounds_ms.end(), all.begin(), all.end());
    t.latency_rounds_after.push_back(state.rounds);
    spent_s_ += took;
    run.round_profile_s = spent_s_;
  }
  return took;
}

namespace {

/// "adaptive" for the first adaptive split, then "adaptive_2", "adaptive_3".
std::string next_adaptive_name(const PartitionSet& set) {
  const auto n = std::count_if(set.splits.begin(), set.splits.end(),
                               [](const balance::Partition& q) { return q.solver.rfind("adaptive", 0) == 0; });
  return n == 0 ? std::string("adaptive") : "adaptive_" + std::to_string(n + 1);
}

}  // namespace

std::vector<balance::Partition> AdaptiveHook::propose(RunContext& ctx, const PartitionSet& set, const RoundState& state) {
  if (!pending_) return {};
  // Due once every partition has max(--iters, 2) rounds.
  for (const Bench& b : *state.benches)
    if (static_cast<int>(b.rounds.size()) < std::max(ctx.opt.iters, 2)) return {};
  try {
    return solve(ctx, set, state);
  } catch (const std::exception& e) {  // rank 0 alone: never leave the others in the broadcast
    pending_ = false;
    ctx.record().adaptive_status = std::string("the re-solve failed (the rounds go on without it): ") + e.what();
    ctx.progress.say("adaptive: " + ctx.record().adaptive_status);
    return {};
  }
}

std::vector<balance::Partition> AdaptiveHook::solve(RunContext& ctx, const PartitionSet& set, const RoundState& state) {
  ++solves_;
  RunRecord& run = ctx.record();
  std::vector<balance::StageMeasurement> stages;
  std::vector<std::string> from;
  for (const Bench& b : *state.benches) {
    const balance::Partition& p = set.splits[b.pi];
    if (p.tensor_parallel()) continue;  // calibrates the ranks' own rows: one rank per stage only
    from.push_back(p.solver);
    const auto m = balance::stage_measurements(ctx.predictor(), p, run.profile, run.partitions[b.pi].events);
    stages.insert(stages.end(), m.begin(), m.end());
  }
  const std::vector<double> factors = balance::calibration_factors(stages, ctx.ranks);
  RunRecord calibrated = run;
  calibrated.profile = balance::calibrated_profile(run.profile, factors, ctx.opt.objective, ctx.workload.gen_len);
  std::ostringstream fs;
  for (int r = 0; r < ctx.ranks; ++r)
    fs << (r ? ", " : "") << "rank " << r << " x" << format_fixed(factors[2 * r], 2) << "/x" << format_fixed(factors[2 * r + 1], 2);
  balance::SplitRequest req;
  req.method = balance::Method::balanced;
  req.stages = ctx.ranks;
  req.order = ctx.opt.order;
  balance::Partition p = balance::make_split(balance::problem_from_run(calibrated, ctx.opt.objective), req);
  p.groups = ctx.workload.groups;  // compared with the run's splits at the run's M
  for (const balance::Partition& q : set.splits) {
    if (balance::compare_splits(q, p, ctx.cluster.equivalence) != balance::Sameness::different) {
      pending_ = false;
      run.adaptive_status = "converged after " + std::to_string(solves_) + " solve(s): the profile calibrated by " +
                            "the pipeline (prefill/decode factors: " + fs.str() + ") gives " + q.solver + "'s split " +
                            q.counts_string();
      ctx.progress.say("adaptive: " + run.adaptive_status);
      return {};
    }
  }
  if (solves_ >= kMaxSolves) pending_ = false;  // this one is the last
  p.solver = next_adaptive_name(set);
  p.tp_width.assign(p.num_stages(), 1);
  p.groups = ctx.workload.groups;
  PartitionRecord pr = describe_partition(ctx, p, calibrated.profile);
  pr.calibration_factor = factors;
  pr.calibrated_from = from;
  pr.solved_after_round = static_cast<int>(state.benches->front().rounds.size());
  run.partitions.push_back(pr);
  run.adaptive_status = std::to_string(solves_) + " solve(s); the last gave " + p.solver + " " + p.counts_string() +
                        " from the profile calibrated by " + fs.str() + (pending_ ? "" : " (the most solves)");
  ctx.progress.say("adaptive: calibrated by the pipeline (prefill/decode factors: " + fs.str() + "): split " +
                   p.counts_string() + ", predicted bottleneck " + format_fixed(pr.predicted_bottleneck_ms, 2) + " ms");
  return {p};
}

}  // namespace ppb::run
