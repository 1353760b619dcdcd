// The profile phase of `ppbench run` (DESIGN.md §1 step 3): every unit timed on every rank's
// own device, in prefill and in decode at several KV-cache lengths; where a machine's ranks
// share memory, alone and together (balance/contention.h), cycled and pooled; then each
// tensor-parallel group a layout needs, at its width. Rank 0 gathers the tables into the record.
#pragma once

#include <vector>

#include "profile/profiler.h"
#include "run/context.h"

namespace ppb::run {

/// --profile-repeats auto: profile cycles until the profile has taken this long (s) ...
inline constexpr double kProfileSpanS = 15.0;
/// ... or this many cycles. Why: on the 2-core VM of issue 13 a layer's decode step moved by
/// +-20% (p10-p90) from one ~4 s window to the next with no memory between windows (lag-1
/// autocorrelation -0.04..0.11 in 4 of 5 runs), while one cycle times each unit within well
/// under a second: one sample of that state, which the benchmark's 120 s of rounds average.
inline constexpr int kAutoProfileRepeats = 4;
/// ... and at least this many where there are two passes: the median of three keeps out one
/// disturbed cycle. On a slower day of the same VMs (a cycle ~10 s, so two in 15 s) one run in
/// two or three had one cycle's medians of some unit 1.3-2.7x the other's (a layer's alone
/// prefill 60.6 ms against 22.2; the head's together decode 62.6 against 44.5): the mean of
/// two moved that unit's cost by up to 50%, chose 19,11 over 17,13 on a head made heavy, and
/// made cross-calibrated predictions miss by 5-13% (issue 13, eleven runs of the main job).
inline constexpr int kMinAutoRepeats = 3;

/// What the profile phase tells the later phases.
struct ProfileOutcome {
  /// The profile had an alone and a together pass (ranks sharing a machine's memory,
  /// --contention auto): the balancer solves on the together table, predictions go through the
  /// contention model, and the profile may be taken again between rounds.
  bool two_passes = false;
  /// Cycles of the whole profile its tables average (every rank: the same number).
  int cycles = 1;
};

/// The profile's settings from the run's options and workload. resident_bytes: this machine's
/// share of the model's weights (its ranks' stages, in every layout: a tensor-parallel group's
/// ranks split what one rank would hold), which decides cold or warm timing.
ProfileConfig profile_config(const RunContext& ctx);

/// [U][2] (prefill, decode) from a ProfileResult's two [U] columns: a row of the profile tables.
std::vector<double> pack_phases(const std::vector<double>& prefill, const std::vector<double>& decode);

/// One table of several profile cycles: each entry the median of the cycles' medians with three
/// or more cycles (one disturbed cycle kept out, see kMinAutoRepeats), their mean with two (each
/// cycle's median keeps out a forward's spikes); decode the mean over contexts of those pooled
/// per context; the fastest and slowest of all cycles. runs: >= 1, equally shaped.
ProfileResult pool_cycles(const std::vector<ProfileResult>& runs);

/// The profile of every unit at width 1 on every rank (collective), gathered into rank 0's
/// record (/profile: the tables, their cycles, the units' bytes, FLOPs and floors). Where the
/// ranks of a machine share memory (--contention auto), two passes: alone (the machine's ranks
/// take turns, the others wait without spinning) and together (a barrier of all ranks before
/// every timed forward); the together table is the one the balancer solves on, the alone
/// medians feed the contention model, min/max span both. Cycled --profile-repeats times (auto:
/// kProfileSpanS / kAutoProfileRepeats, at least kMinAutoRepeats with two passes), each table
/// pool_cycles of its cycles. Where one unit of every signature fits every rank at once, each
/// cycle's passes take turns forward by forward (ResidentProfiler::profile_interleaved).
ProfileOutcome profile_units(RunContext& ctx);

/// Profiles every group of ranks a layout of ctx.plan needs (collective), together at its width
/// (issue 14): the group's ranks each build their shard of every unit and time the same
/// forwards, the all-reduces inside. Groups that share no rank are profiled at the same time,
/// others in later rounds; ranks outside a round's groups wait. Rank 0 keeps each group's first
/// rank's tables in /profile/tp. A group must be identical devices of one node (bad input
/// otherwise: the all-reduce would cross the network and a stage run at its slowest rank's pace).
/// Each group is profiled `cycles` times (the width-1 profile's cycles, ProfileOutcome::cycles)
/// and its tables pooled as the width-1 profile's (pool_cycles): one cycle's medians moved run to run by up to +-12% on a shared VM (issue 36:
/// Qwen3-0.6B TP2 predicted 28.9, 32.8, 34.9 tokens/s in three runs of one cycle each).
void profile_tp_groups(RunContext& ctx, int cycles = 1);

}  // namespace ppb::run
