// The hooks of the benchmark's rounds (run/rounds.h): profile cycles between rounds
// (--round-profile) and the adaptive re-solve (--partition adaptive).
#pragma once

#include <memory>
#include <string>

#include "balance/predict.h"
#include "profile/profiler.h"
#include "run/rounds.h"

namespace ppb::run {

/// --round-profile: a together cycle of one unit of every signature (built once beside the
/// stages) after round 1 and whenever the cycles so far have taken at most kShare of the rounds'
/// turns, gathered into /profile/latency_rounds_ms; after the rounds every prediction is made
/// again from them (balance::rounds_profile). Where the profile had two passes, unless off, or
/// auto with two or more splits of one rank per stage (they cross-calibrate each other), or the
/// units do not fit beside the stages (said so, in the record's round_profile_status).
class RoundProfileHook : public RoundHook {
 public:
  /// Share of the rounds' time the cycles may take (20%: the gains' CIs widen by ~10% for the
  /// rounds they take).
  static constexpr double kShare = 0.2;

  /// `two_passes`: the profile had an alone and a together pass (ProfileOutcome).
  explicit RoundProfileHook(bool two_passes) : two_passes_(two_passes) {}
  /// Collective: decides and, where the cycles run, builds their units beside the stages.
  void before_rounds(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) override;
  double after_round(RunContext& ctx, const RoundState& state) override;
  void finish(RunContext& ctx) override { units_.reset(); }

 private:
  bool two_passes_ = false;
  std::unique_ptr<ResidentProfiler> units_;
  double spent_s_ = 0.0;  ///< rank 0: the cycles' seconds so far
};

/// --partition adaptive: once every partition has max(--iters, 2) rounds, rank 0 calibrates the
/// profile by what the measured stages of one rank each ran (balance::calibration_factors of
/// balance::stage_measurements), solves the balanced split from the calibrated table, and
/// proposes it ("adaptive", then "adaptive_2", ...) when it is a split not measured yet; it
/// holds the rounds until a solve returns a split already measured (converged) or after
/// kMaxSolves. A failing solve ends the adaptive splits, never the run.
class AdaptiveHook : public RoundHook {
 public:
  static constexpr int kMaxSolves = 3;

  explicit AdaptiveHook(bool enabled) : pending_(enabled) {}
  bool holds_rounds() const override { return pending_; }
  std::vector<balance::Partition> propose(RunContext& ctx, const PartitionSet& set, const RoundState& state) override;

 private:
  /// The next solve, or nothing (converged: the record's adaptive_status says so).
  std::vector<balance::Partition> solve(RunContext& ctx, const PartitionSet& set, const RoundState& state);

  bool pending_ = false;
  int solves_ = 0;
};

}  // namespace ppb::run
