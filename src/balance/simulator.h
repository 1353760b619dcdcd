// The pipeline simulator: plays the inference loop of DESIGN.md §2 exactly as
// src/pipeline/pipeline.cpp enqueues it, from per-stage step times, and scores the simulated
// timeline with compute_metrics (balance/metrics.h), the definitions the benchmark uses.
//
// What is modelled (one repetition; all lanes idle at t = 0, as after the run's barrier):
//   - static item order i = t * M + g on every stage (step t, group g);
//   - stage 0 takes the prompt for t = 0 and, for t >= 1, the token of item i - M returned by
//     the last stage (with one stage: its own output, no transfer);
//   - lanes: recv, compute, send with overlap; one lane without (--no-overlap), except the last
//     stage's token return, which keeps a lane of its own in every mode (as pipeline.cpp does);
//   - double buffering (ring of 2): the recv of item i waits for the compute of item i-2
//     (slot consumed); the compute of item i waits for the send of item i-2 (slot free);
//   - a transfer of stage s's output of item i to its consumer: rendezvous (starts when both the
//     send and the matching recv are posted, both end together; NCCL, and MPI above its eager
//     limit) or eager (the send ends after its own time whether or not the recv is posted).
// Not modelled here: contention between lanes for cores, jitter; between stages of one node
// for memory bandwidth, balance/contention.h wraps this simulator in a fixed point.
//
// Pure C++: no MPI, CUDA or HDF5 here (DESIGN.md §5).
#pragma once

#include <vector>

#include "balance/metrics.h"

namespace ppb::balance {

/// Step times of one stage, ms.
struct SimStage {
  double prefill_ms = 0.0;       ///< compute of one prefill step (B sequences of P tokens)
  double decode_ms = 0.0;        ///< compute of one decode step (B sequences, 1 token)
  double send_prefill_ms = 0.0;  ///< transfer of the output of a prefill step (last stage: token return)
  double send_decode_ms = 0.0;   ///< transfer of the output of a decode step (last stage: token return)
};

struct SimConfig {
  int groups = 1;    ///< M request groups (micro-batches) in flight
  int gen_len = 1;   ///< G decode steps per group
  int batch = 1;     ///< B sequences per group (scales tokens/s only)
  bool overlap = true;       ///< recv/compute/send lanes (false: --no-overlap)
  bool eager_sends = false;  ///< false: rendezvous transfers; true: eager (see the file comment)
};

struct SimResult {
  EventShape shape;            ///< {1, M, G+1, S}
  std::vector<double> events;  ///< [1][M][G+1][S][6] seconds since the repetition's start (NaN: no op)
  PartitionMetrics metrics;    ///< compute_metrics(events, shape, batch, gen_len)
};

/// Simulates one repetition of the pipelined loop. stages: [S] step times.
/// @throws ppb::UserError for M < 1, G < 0, B < 1, no stages, or negative/NaN times.
/// @throws ppb::InternalError if the schedule deadlocks (a bug: pipeline.cpp cannot).
SimResult simulate_pipeline(const std::vector<SimStage>& stages, const SimConfig& cfg);

}  // namespace ppb::balance
