// The serving engine (issue 37): requests that arrive, played through the pipeline's stages with
// continuous batching, each of the M groups in flight an independent batch of B slots
// (serving/scheduler.h says which requests each step runs and why).
//
// Stage 0 owns the schedule. It keeps the scenario's clock (seconds since the barrier that
// starts it), forms a group's next step when the group has no step in flight (admitting the
// requests that have arrived into its free slots), sends the step's ragged batch down the
// pipeline and learns its tokens when the last stage returns them; a group with nothing to run
// waits for the next arrival. Every step travels as a header (its group and rows: slot,
// position, new tokens; the slots released since its pool's last step, whose KV a paged store
// gives back) followed by its payload (the rows' packed activations), so the other
// stages need no schedule: they run what arrives, in order, as the closed pipeline's stages do
// (pipeline.h: each stage is FIFO and the transport keeps the order of messages between two
// ranks, so the last stage returns the steps' tokens in the order stage 0 sent them). The run
// ends with a header that says so.
//
// Lanes as the closed pipeline's overlap mode: receives (and stage 0's token returns) on a recv
// lane, forwards on the compute lane, sends on a send lane; a stage receives step i + 1's header
// while it computes step i. Buffers are per group: a group has at most one step in the pipeline,
// so its buffers are free again when its next step arrives.
//
// Not yet: tensor-parallel stages (a stage's group would need the header broadcast to its
// ranks: run refuses --tp with --scenario), the MTP modules (--mtp). Chunked prefill (vllm-v1)
// and recompute after a preemption (--kv-blocks) are rows at position > 0 or of prompt + output
// tokens: a prefill row's input at position p >= prompt_len is the request's output token p - prompt_len.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/device.h"
#include "pipeline/pipeline.h"
#include "serving/request_metrics.h"
#include "serving/scheduler.h"
#include "transport/transport.h"

namespace ppb {

/// Shape of the serving engine.
struct ServingConfig {
  /// M groups in flight (the stage's work.groups), B slots each (its work.batch), the step policy
  /// and the client's concurrency limit: the scenario's (serving::ScenarioSpec::scheduler(M)).
  serving::SchedulerConfig scheduler;
  uint64_t seed = 0;  ///< prompt token ids: prompt_token(seed, request, 0, position, vocab)
  int vocab = 1;
};

/// One row of a step as stage 0 formed it.
struct ScheduledRow {
  int request = -1;
  int slot = -1;
  int position = 0;  ///< first new position (0 for a prefill; a chunk's start)
  int tokens = 0;    ///< new tokens (the prompt or a chunk of it for a prefill, 1 for a decode)
  bool emits = true;  ///< the row's token is the request's next (not a chunk before its prompt's last)
};

/// One step of one group, as stage 0 sent it.
struct ScheduledStep {
  int group = -1;
  std::vector<ScheduledRow> rows;  ///< in slot order
  double start_s = 0.0;  ///< formed (scenario clock, s)
  double end_s = 0.0;    ///< its tokens were back on stage 0 (scenario clock, s)
  /// Slots whose request left before this step (serving::Step::released): the stages release
  /// their KV positions before its rows run.
  std::vector<int> released{};
};

/// What one rank recorded of one scenario (or replay).
struct ServingRecord {
  /// Stage 0 (its tensor-parallel rank 0) only; empty elsewhere.
  std::vector<serving::RequestTimes> times;   ///< [N], scenario clock (s); live runs only
  std::vector<std::vector<int32_t>> tokens;   ///< [N][gen_len] each request's output token ids
  std::vector<int> group, slot;               ///< [N] where each request ran
  std::vector<ScheduledStep> schedule;        ///< every step in the order stage 0 sent it
  double start_monotonic_s = 0.0;             ///< the scenario's t = 0 on stage 0's monotonic clock
  /// Every rank: per step this stage ran, in order, [steps][kNumEvents] monotonic seconds of
  /// this rank (common/events.h; NaN where the step has no such operation), and its rows and
  /// packed tokens.
  std::vector<double> events;
  std::vector<int> step_rows, step_tokens;
  double checksum = 0.0;  ///< last stage: StageExecutor::checksum() over the scenario
  /// Every rank: the most KV-cache bytes its stage held resident among samples taken while every
  /// 8th step computed and at the end (StageExecutor::kv_resident_bytes: a demand-paged store's
  /// pages written and not released; else the whole cache). A sample of a paged store costs a
  /// mincore over its pages on the host thread, outside the timed forwards.
  size_t kv_resident_peak_bytes = 0;
  double wall_s = 0.0;    ///< this rank's time from the start barrier to its lanes drained
};

/// Stage 0's ints of a step header: kind, group, rows, packed tokens, released slots, then slot,
/// pos and tokens of B rows and the released slots (int32, B each).
size_t serving_header_ints(int slots);

/// Plays `requests` (arrival_s on the scenario's clock, t = 0 at the barrier that starts it) on
/// this stage, live: stage 0 schedules (serving::Scheduler with cfg's groups, slots, policy);
/// the others follow. Collective over the layout's ranks (a transport barrier starts it). Every
/// rank passes the same requests. The stage must be built with work.batch = cfg.scheduler.slots,
/// work.groups = cfg.scheduler.groups (batch-queue: work.batch = cfg.scheduler.pool_slots(),
/// work.groups = 1) and a max_context covering every request's prompt_len + gen_len.
/// @throws ppb::InternalError naming the stage when a transfer fails or times out (the lanes
///         and the transport are aborted first), or when a step does not fit the stage.
ServingRecord run_serving(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
                          const ServingConfig& cfg, const std::vector<serving::Request>& requests);

/// Replays `schedule` (stage 0's; the other ranks pass theirs, ignored) with one step in the
/// whole pipeline at a time: the serialized reference of a live run, or any hand-made schedule
/// (e.g. every request alone in slot 0 of group 0). A decode row's input is the request's own
/// last output token of this replay; a prefill row's its prompt. Returns, on stage 0, the
/// tokens of every request of `requests` (empty for a request the schedule does not run); no
/// times. Collective as run_serving.
ServingRecord replay_serving(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
                             const ServingConfig& cfg, const std::vector<serving::Request>& requests,
                             const std::vector<ScheduledStep>& schedule);

/// The schedule that runs each of `which` alone (batch of one, group 0, slot 0): its prefill,
/// then its gen_len - 1 decode steps, request after request. For the batch-invariance count.
std::vector<ScheduledStep> alone_schedule(const std::vector<serving::Request>& requests, const std::vector<int>& which);

}  // namespace ppb
