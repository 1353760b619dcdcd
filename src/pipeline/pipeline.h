// The pipelined inference loop (DESIGN.md §2), run by every stage.
//
// M request groups (micro-batches) of B sequences each; every group runs one prefill step
// (T = P tokens) then G autoregressive decode steps (T = 1). The last stage samples B token
// ids per step and returns them to stage 0, where they are the next decode input.
//
// Every stage processes items in one static order, item i = t * M + g (step t, group g): all
// prefills, then decode step 1 of every group, and so on. That is exactly "ready inputs in
// arrival order": stage 0 has every prompt at the start, each stage is FIFO and MPI/NCCL keep
// the order of messages between two ranks, so tokens return to stage 0 in the order the groups
// left it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/device.h"
#include "common/events.h"
#include "transport/transport.h"

namespace ppb {


/// How the lanes are used.
enum class LaneMode {
  overlap,     ///< recv, compute, send on three lanes: transfers overlap compute (the default)
  no_overlap,  ///< recv, compute and send of activations on one lane (--no-overlap)
  serialized,  ///< one lane and a barrier after every item: one item in flight in the whole pipeline
};


struct PipelineConfig {
  int batch = 1;
  int prompt_len = 16;
  int gen_len = 4;
  int groups = 1;   ///< M
  int warmup = 1;   ///< untimed repetitions
  int iters = 3;    ///< timed repetitions
  uint64_t seed = 0;
  int vocab = 0;    ///< prompt token ids are drawn in [0, vocab)
  LaneMode mode = LaneMode::overlap;
};

/// Where this stage sits: world ranks of its neighbours.
struct StagePlacement {
  int rank = 0;         ///< this process's rank (where the stage runs)
  int stage = 0;
  int num_stages = 1;
  int prev_rank = -1;   ///< rank of stage - 1 (-1 for stage 0)
  int next_rank = -1;   ///< rank of stage + 1 (-1 for the last stage)
  int first_rank = 0;   ///< rank of stage 0 (where the last stage returns tokens)
  int last_rank = 0;    ///< rank of the last stage
};

/// What one stage measured.
struct StageRecord {
  /// [iters][M][G+1][kNumEvents] monotonic seconds of this rank; NaN where the item has no
  /// such operation (no recv of the prompt on stage 0, no send after the last decode step).
  std::vector<double> events;
  std::vector<double> rep_start_s;   ///< [iters] time each timed repetition was released
  /// Last stage only: sampled tokens [M][G+1][B] of the last timed repetition.
  std::vector<int32_t> tokens;
  double checksum = 0.0;            ///< last stage only: hidden-state checksum of the last repetition
  double compute_lane_cpu_s = 0.0;  ///< CPU time of each lane's thread over the timed repetitions
  double recv_lane_cpu_s = 0.0;
  double send_lane_cpu_s = 0.0;
  double timed_wall_s = 0.0;        ///< wall time of the timed repetitions on this rank
};

/// Deterministic prompt token of (seed, group, sequence, position) in [0, vocab).
int32_t prompt_token(uint64_t seed, int group, int seq, int pos, int vocab);

/// Runs cfg.warmup + cfg.iters repetitions of the pipelined loop on this stage, on rank
/// place.rank. Collective over the transport's ranks (its barrier starts each repetition). `progress(rep, total)` after each one.
/// @throws InternalError naming the stage when a transfer times out or a peer fails.
StageRecord run_pipeline(Device& device, Transport& transport, StageExecutor& stage,
                         const StagePlacement& place, const PipelineConfig& cfg,
                         const std::function<void(int, int)>& progress = {});

}  // namespace ppb
