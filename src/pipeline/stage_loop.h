// What both pipelined loops share (pipeline.h's closed batches, serving_pipeline.h's requests
// that arrive): one stage on one rank, its links to the stages around it, the transport barrier
// that starts a run, lanes drained or aborted under one failure policy, and the events of a step
// as the results file keeps them. Each loop is this skeleton plus its own order of items.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "common/events.h"
#include "pipeline/pipeline.h"
#include "transport/transport.h"

namespace ppb {

/// Whether event k (common/events.h) of a step happened: the receive pair only where the step
/// received, the send pair only where it sent, the compute pair always.
inline bool event_present(int k, bool has_recv, bool has_send) {
  return k <= kRecvEnd ? has_recv : (k >= kSendStart ? has_send : true);
}

class StageLoopBase {
 protected:
  /// `kind`: how messages name the stage ("stage", "serving stage").
  StageLoopBase(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place, const char* kind);
  ~StageLoopBase() = default;
  StageLoopBase(const StageLoopBase&) = delete;
  StageLoopBase& operator=(const StageLoopBase&) = delete;

  /// The transport's links of this placement, made before the first message (NCCL: one
  /// communicator per direction): from the previous stage, to the next, and the token return
  /// (last stage -> stage 0) with more than one stage; and `extra` (sender, receiver) pairs of the
  /// loop's own (the serving engine's stage 0 to its tensor-parallel peers).
  void connect_links(const std::vector<std::pair<int, int>>& extra = {});
  /// "stage s (units a..b)", for messages.
  std::string describe_stage() const;
  /// A transport barrier on `lane`, waited for: polled, bounded by --timeout, never a hang. On a
  /// failure the lanes and links are aborted and InternalError names the stage and `when`.
  void barrier(Lane& lane, const std::string& when);
  /// Waits for every lane in `lanes` (null entries skipped), aborting as barrier() on a failure.
  void drain(std::initializer_list<Lane*> lanes, const std::string& when);
  /// On a failure: request the lane abort and abort the transport (before unwinding), so that an
  /// NCCL kernel spinning on a dead peer returns (ncclCommAbort) and this rank fails fast instead
  /// of sitting until the watchdog; device memory is given up rather than freed while the abort
  /// is pending (cuda_raii.h).
  void abort_lanes_and_links();

  Device& device_;
  Transport& transport_;
  StageExecutor& stage_;
  const StagePlacement& place_;
  const int S;             ///< stages of the layout
  const bool first, last;  ///< stage 0, the last stage (both with one stage)

 private:
  const char* kind_;
};

}  // namespace ppb
