// Closed batches as a scenario of the rounds (run/rounds.h): M groups of B sequences of P and G
// tokens, all at once (DESIGN.md §2). A turn is one timed repetition of the pipelined loop
// (pipeline/pipeline.h); a round's repetitions go to rank 0 (run/gather.h) and are appended to
// the results file; the gains pair tokens/s and decode tokens/s by round; the validation is the
// serialized run of the same stages; the finish completes every partition's record.
#pragma once

#include <vector>

#include "run/gather.h"
#include "run/rounds.h"

namespace ppb::run {

class ClosedRounds final : public RoundScenario {
 public:
  void add_bench(size_t j) override { turns_.resize(j + 1); }
  /// Its --warmup repetitions when `warm_up`, then one timed repetition.
  void play_turn(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j, bool warm_up) override;
  /// gather_round, then the round's rows appended to the file (O(that round)).
  void record_round(RunContext& ctx, const PartitionSet& set, std::vector<Bench>& benches, int rounds) override;
  std::vector<std::string> figure_labels() const override { return {"tokens/s", "decode"}; }
  /// rep_tokens_per_s and rep_decode_tokens_per_s of rank 0's record, with rep_round.
  std::vector<RoundFigure> figures(const RunContext& ctx, size_t pi) const override;
  /// The serialized reference run (one item in the pipeline at a time).
  void validate(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j) override;
  /// gather_final: validation against the reference, every metric, the predictions.
  void finish(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) override;

 private:
  std::vector<ClosedTurns> turns_;  ///< by bench index
};

}  // namespace ppb::run
