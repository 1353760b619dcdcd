// The timestamps of one pipeline item (a request group's prefill or decode step on a stage): one
// definition for the pipelined loop's timeline (pipeline/), the metrics and the simulator
// (balance/), and the results file's /benchmark/<name>/events, whose last axis they index.
#pragma once

namespace ppb {

/// Index of each timestamp of an item in an events array (its last axis, size kNumEvents).
enum EventIndex { kRecvStart = 0, kRecvEnd, kComputeStart, kComputeEnd, kSendStart, kSendEnd, kNumEvents };

}  // namespace ppb
