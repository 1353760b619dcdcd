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
#include "common/workload.h"
#include "transport/transport.h"

namespace ppb {


/// How the lanes are used.
enum class LaneMode {
  overlap,     ///< recv, compute, send on three lanes: transfers overlap compute (the default)
  no_overlap,  ///< recv, compute and send of activations on one lane (--no-overlap)
  serialized,  ///< one lane and a barrier after every item: one item in flight in the whole pipeline
};


struct PipelineConfig {
  /// M = work.groups groups of B = work.batch sequences, P prompt tokens and G decode steps
  /// each; prompts drawn from work.seed (work.dtype is the stages', not used here).
  Workload work{1, 16, 4};
  int warmup = 1;   ///< untimed repetitions
  int iters = 3;    ///< timed repetitions
  int vocab = 0;    ///< prompt token ids are drawn in [0, vocab)
  LaneMode mode = LaneMode::overlap;
};

/// Where this rank sits in a layout: its stage, and the world ranks it exchanges messages with.
/// A stage of tensor-parallel width t runs on t ranks (backend/tensor_parallel.h), each of which
/// holds the whole activation after its last all-reduce; layout_placement() says who sends to
/// whom.
struct StagePlacement {
  int rank = 0;         ///< this process's rank (where the stage runs)
  int replica = 0;      ///< which of the layout's replicas (balance::Partition::replicas) it serves
  int stage = 0;
  int num_stages = 1;
  int tp_rank = 0;      ///< this rank's index in its stage's group, [0, tp_width)
  int tp_width = 1;     ///< ranks of this stage
  int prev_rank = -1;   ///< the rank of stage - 1 this rank receives its input from (-1 for stage 0)
  std::vector<int> next_ranks;    ///< ranks of stage + 1 this rank sends its output to (may be empty)
  int last_rank = -1;   ///< stage 0 of several: the last stage's rank that returns its tokens
  std::vector<int> return_ranks;  ///< last stage of several: stage-0 ranks it returns tokens to
};

/// This rank's placement in a layout whose stage k runs on the ranks stage_ranks[k] (its
/// tensor-parallel group, in group-rank order; one rank per stage without tensor parallelism).
/// The hand-off between stages of widths a and b: receiver j of the next stage gets the whole
/// activation from sender j % a, so no link carries more than one copy when a >= b (each
/// receiver has its own sender; senders j >= b send nothing), and a sender carries ceil(b/a)
/// copies when a < b: full copies rather than Megatron's scatter + all-gather, which would send
/// 1/b per receiver and then all-gather inside the next stage, because inside a node (where a
/// tensor-parallel group lives) the copies cost shared-memory bandwidth and no extra collective
/// sits on the critical path. The token return (last stage -> stage 0) follows the same rule.
/// @throws ppb::InternalError if `rank` is in no stage or in two, or a stage is empty.
StagePlacement layout_placement(const std::vector<std::vector<int>>& stage_ranks, int rank);

/// What one stage measured.
struct StageRecord {
  /// [iters][M][G+1][kNumEvents] monotonic seconds of this rank; NaN where the item has no
  /// such operation (no recv of the prompt on stage 0, no send after the last decode step).
  std::vector<double> events;
  std::vector<double> rep_start_s;   ///< [iters] time each timed repetition was released
  /// Last stage only: sampled tokens [M][G+1][B] of the last timed repetition.
  std::vector<int32_t> tokens;
  double checksum = 0.0;            ///< last stage only: hidden-state checksum of the last repetition
  /// StageExecutor::expert_tokens() of the last repetition (every rank; empty without MoE).
  std::vector<std::vector<int64_t>> expert_tokens;
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
