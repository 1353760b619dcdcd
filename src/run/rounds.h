// The benchmark's rounds (DESIGN.md §1 step 5) as one harness for every scenario:
// run_interleaved_rounds gives every partition one timed turn per round, in an order rotated by
// one each round, until a StopRule says stop, then validates each partition and hands the
// scenario its final gather. What a turn plays, what a round records and which figures the
// gains pair are the scenario's (RoundScenario: closed batches, run/closed_rounds.h; requests
// that arrive, run/serving_rounds.h); what else happens between rounds (the adaptive re-solve,
// profile cycles) comes in as RoundHooks. A new scenario implements RoundScenario and calls
// run_interleaved_rounds; it does not edit the loop (nccl-tests' one harness over its
// operations' table, Megatron's one function per schedule, are the models).
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
/// built between turns and the rounds it took part in. What its turns recorded is the
/// scenario's (kept by bench index).
struct Bench {
  size_t pi = 0;  ///< index in the PartitionSet (and in rank 0's record.partitions)
  StagePlacement place;
  std::unique_ptr<TpGroup> tp;  ///< this rank's tensor-parallel group (null at width 1); outlives the stage
  std::unique_ptr<StageExecutor> stage;
  bool resident = true;
  bool warmed = false;
  std::vector<int> rounds;  ///< the rounds (0-based) of its turns
};

/// One figure of a partition the gains pair by round (rank 0's record): its value per turn and
/// that turn's round, both in turn order.
struct RoundFigure {
  const std::vector<double>* values = nullptr;
  const std::vector<int>* rounds = nullptr;
};

/// What a scenario brings to the rounds. Collective methods are called on every rank in the same
/// order; the figures on rank 0.
class RoundScenario {
 public:
  virtual ~RoundScenario() = default;
  /// Bench j (= the benches so far) joined: room for what its turns record.
  virtual void add_bench(size_t j) = 0;
  /// Collective: bench j's turn: its warm-up when `warm_up` (its first turn, or every turn of a
  /// stage rebuilt each time), then one timed repetition, kept on this rank.
  virtual void play_turn(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j, bool warm_up) = 0;
  /// Collective, after each round: its turns' records to rank 0, then into the results file
  /// (complete=0), so that a run that fails later keeps them.
  virtual void record_round(RunContext& ctx, const PartitionSet& set, std::vector<Bench>& benches, int rounds) = 0;
  /// The figures the gains pair, their labels: the first is the throughput the progress line shows
  /// (its unit, e.g. "tokens/s"), the others name their gains ("decode").
  virtual std::vector<std::string> figure_labels() const = 0;
  /// Rank 0: partition pi's figures so far, in figure_labels' order.
  virtual std::vector<RoundFigure> figures(const RunContext& ctx, size_t pi) const = 0;
  /// Whether the partitions are validated after the rounds (with --no-validate never).
  virtual bool validates() const { return true; }
  /// Collective: bench j's validation (its stage built; freed after).
  virtual void validate(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j) = 0;
  /// Collective, after the validation: what rank 0 completes its record with (the stages freed).
  virtual void finish(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) = 0;
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

/// Builds `scenario`'s stage of every distinct split of `set` (side by side where every rank can
/// hold them all, else rebuilt on every turn), runs interleaved rounds until `rule` stops them
/// (each round recorded by the scenario on rank 0 and into the results file: O(that round)),
/// calling `hooks` between rounds; partitions a hook proposes are added to `set` and join the
/// rounds. Then, with validation on, each partition's validation, and the scenario's finish.
/// Rank 0 judges the stop rule on the scenario's figures paired by round: the gains' streaming
/// 95% CIs, confirmed by compare_paired on every pair. Collective.
RoundsOutcome run_interleaved_rounds(RunContext& ctx, PartitionSet& set, RoundScenario& scenario, const StopRule& rule,
                                     const std::vector<RoundHook*>& hooks = {});

/// The values of `a` and `b` measured in the same rounds (`ra`, `rb`: each value's round, both
/// ascending), in round order: the pairs compare_paired takes. O(|a| + |b|).
std::pair<std::vector<double>, std::vector<double>> same_rounds(const std::vector<double>& a, const std::vector<int>& ra,
                                                                const std::vector<double>& b, const std::vector<int>& rb);

}  // namespace ppb::run
