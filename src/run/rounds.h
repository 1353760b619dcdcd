// The benchmark's rounds (DESIGN.md §1 step 5) as a schedule: run_interleaved_rounds gives every
// partition one timed repetition per round, in an order rotated by one each round, until a
// StopRule says stop; what else happens between rounds (the adaptive re-solve, profile cycles)
// comes in as RoundHooks, so that a new scenario brings its own rule and hooks without editing
// the loop (Megatron's schedules.py, one function per schedule, is the model). After the rounds
// the serialized validation runs and rank 0 gathers each partition's record.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/stage.h"
#include "backend/tensor_parallel.h"
#include "common/stats.h"
#include "pipeline/pipeline.h"
#include "run/context.h"
#include "run/plan.h"

namespace ppb::run {

/// One partition under benchmark, on every rank: its stage here (while built), whether it stays
/// built between turns, the rounds it took part in and what its timed repetitions (one per round)
/// and its validation run recorded so far.
struct Bench {
  size_t pi = 0;  ///< index in the PartitionSet (and in rank 0's record.partitions)
  StagePlacement place;
  std::unique_ptr<TpGroup> tp;  ///< this rank's tensor-parallel group (null at width 1); outlives the stage
  std::unique_ptr<StageExecutor> stage;
  bool resident = true;
  bool warmed = false;
  std::vector<int> rounds;  ///< the rounds (0-based) of its repetitions
  StageRecord rec, ref;     ///< its timed repetitions so far; the serialized reference run
  size_t reps_gathered = 0;  ///< repetitions rank 0 has of it (gather_round)
};

/// When the rounds stop (rank 0 decides, StopRule::verdict).
struct StopRule {
  int min_rounds = 2;         ///< --iters: every partition gets at least this many, whatever the time
  double target_ci_pct = 5;   ///< stop once every gain's 95% CI is within +-this % (0: after min_rounds)
  double max_time_s = 120;    ///< no round that would end after this (s since the first round)
  int max_rounds = 10000;     ///< and never more rounds than this
};

/// Rank 0's view of the rounds so far, for the stop rule and the hooks.
struct RoundState {
  int rounds = 0;           ///< rounds done
  double elapsed_s = 0;     ///< since the first round started (turns, gathers, hooks)
  double round_s = 0;       ///< the last round, start to now
  double turns_s = 0;       ///< the rounds' turns alone (their repetitions and warm-ups), summed
  const std::vector<Bench>* benches = nullptr;
};

/// What happens between rounds besides the turns, the gather and the snapshot.
class RoundHook {
 public:
  virtual ~RoundHook() = default;
  /// Collective, once the partitions' stages are built (what fits beside them is known now).
  virtual void before_rounds(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) {}
  /// Collective, after each round is gathered: returns the seconds it spent (they count toward
  /// --max-time, as the rounds' do).
  virtual double after_round(RunContext& ctx, const RoundState& state) { return 0.0; }
  /// Rank 0: whether the hook still needs rounds (the stop rule then goes on while a round fits
  /// in --max-time, even when every gain's CI is narrow enough).
  virtual bool holds_rounds() const { return false; }
  /// Rank 0, when the rounds go on: partitions to add (they join the next round), each with its
  /// record already appended to rank 0's record.partitions by the hook. Exceptions are the
  /// hook's to handle (never leave the other ranks in the broadcast).
  virtual std::vector<balance::Partition> propose(RunContext& ctx, const PartitionSet& set, const RoundState& state) {
    return {};
  }
  /// Collective, after the rounds: release what it holds (memory, before validation builds
  /// stages again).
  virtual void finish(RunContext& ctx) {}
};

/// How the rounds went.
struct RoundsOutcome {
  int rounds = 0;
  std::string stop_reason;  ///< why they stopped (StopRule::verdict's text)
  std::string schedule;     ///< "interleaved, stages resident" | "... rebuilt every round" | "... some ..."
};

/// Builds a stage of every distinct split of `set` (side by side where every rank can hold them
/// all, else rebuilt on every turn), runs interleaved rounds until `rule` stops them (a round is
/// gathered on rank 0 and appended to the results file after it: O(that round)), calling
/// `hooks` between rounds; partitions a hook proposes are added to `set` and join the rounds.
/// Then, with validation on, each stage's serialized reference run; rank 0 gathers every
/// partition's final record (tokens, checksums, lane CPU, metrics and predictions). Collective.
RoundsOutcome run_interleaved_rounds(RunContext& ctx, PartitionSet& set, const StopRule& rule,
                                     const std::vector<RoundHook*>& hooks);

/// The values of `a` and `b` measured in the same rounds (`ra`, `rb`: each value's round, both
/// ascending), in round order: the pairs compare_paired takes. O(|a| + |b|).
std::pair<std::vector<double>, std::vector<double>> same_rounds(const std::vector<double>& a, const std::vector<int>& ra,
                                                                const std::vector<double>& b, const std::vector<int>& rb);

}  // namespace ppb::run
