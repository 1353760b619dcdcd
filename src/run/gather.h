// What the ranks hand to rank 0 during and after the benchmark (DESIGN.md §3): each round's new
// repetition of every partition (its events, on rank 0's clock), and, after the rounds, each
// partition's tokens, checksums, lane CPU times and MoE routing, from which rank 0 completes its
// record (validation, metrics, predictions). Collective; rank 0 alone writes the record.
#pragma once

#include <vector>

#include "balance/predict.h"
#include "run/context.h"
#include "run/plan.h"
#include "run/rounds.h"

namespace ppb::run {

/// What a closed-batch partition's turns recorded on this rank (run/closed_rounds.h keeps one per
/// bench, by bench index).
struct ClosedTurns {
  StageRecord rec, ref;      ///< its timed repetitions so far; the serialized reference run
  size_t reps_gathered = 0;  ///< repetitions rank 0 has of it (gather_round)
};

/// Collective, after a round: every bench's repetitions (turns[j] of benches[j]) rank 0 does not have yet (one per round)
/// gathered in one gatherv, appended to rank 0's record (events [reps][M][G+1][S][6] on rank 0's
/// clock, rep_round, and each new repetition's rep_* metrics: compute_metrics of that repetition
/// alone, which is what compute_metrics of all gives it). O(new repetitions), not O(rounds).
void gather_round(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches,
                  std::vector<ClosedTurns>& turns);

/// Collective, after the rounds and the validation runs: each bench's tokens, reference tokens,
/// checksums, lane CPU and wall times (and the first partition's MoE routing) to rank 0, which
/// completes its record: validation against the serialized run and against the first partition,
/// every metric of DESIGN.md §3 from all its events, and the simulator's predictions.
void gather_final(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches,
                  const std::vector<ClosedTurns>& turns);

}  // namespace ppb::run
