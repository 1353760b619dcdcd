// The pipeline simulator: the lane programme of pipeline.cpp, replayed on virtual time.
//
// Every lane is a FIFO of operations (record, wait, compute, send, recv) built exactly in the
// order run_pipeline enqueues them; a lane's operation starts when the previous one ended and
// its dependency is met. The lanes are swept until none can advance; an operation blocked on an
// event or a transfer partner not yet known is retried on the next sweep.
#include "balance/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "common/events.h"

namespace ppb::balance {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kRing = 2;  // double buffering of recv and output slots, as pipeline.cpp

struct Op {
  enum Kind { record, wait, compute, send, recv } kind;
  long index = 0;     // event (record, wait) or transfer (send, recv)
  double ms = 0.0;    // compute time
};

struct LaneState {
  std::vector<Op> ops;
  std::size_t next = 0;
  double time = 0.0;  // ms
};

/// Where the simulation keeps its times: each (stage, item, event)'s time, and per transfer
/// (the output of item i of stage s) when its send and its recv were posted and how long it
/// takes; ms, NaN until known. items = M (G + 1) per stage.
struct Timeline {
  int items = 0;
  std::vector<double> ev, send_post, recv_post, xfer_ms;

  Timeline(int stages, int items_per_stage)
      : items(items_per_stage),
        ev(static_cast<std::size_t>(stages) * items_per_stage * kNumEvents, kNaN),
        send_post(static_cast<std::size_t>(stages) * items_per_stage, kNaN),
        recv_post(send_post.size(), kNaN),
        xfer_ms(send_post.size(), 0.0) {}
  long ev_id(int s, int i, int k) const { return (static_cast<long>(s) * items + i) * kNumEvents + k; }
  long xfer_id(int s, int i) const { return static_cast<long>(s) * items + i; }  // output of (s, i)
};

/// Refuses a configuration or step times the simulation cannot play (simulate_pipeline's @throws).
void check_inputs(const std::vector<SimStage>& stages, const SimConfig& cfg) {
  const int S = static_cast<int>(stages.size()), M = cfg.groups, G = cfg.gen_len;
  if (S < 1) throw UserError("simulate: no stages");
  if (M < 1) throw UserError("simulate: --microbatches must be >= 1, got " + std::to_string(M));
  if (G < 0) throw UserError("simulate: --gen-len must be >= 0, got " + std::to_string(G));
  if (cfg.batch < 1) throw UserError("simulate: --batch must be >= 1, got " + std::to_string(cfg.batch));
  for (int s = 0; s < S; ++s)
    for (double v : {stages[s].prefill_ms, stages[s].decode_ms, stages[s].send_prefill_ms, stages[s].send_decode_ms})
      if (!std::isfinite(v) || v < 0)
        throw UserError("simulate: stage " + std::to_string(s) + " has a step time of " + std::to_string(v) +
                        " ms; times must be finite and >= 0");
}

/// Appends stage s's lanes to `lanes` with their operations in the order run_pipeline enqueues
/// them, and sets the durations of its transfers in `tl`.
void program_stage(int s, const std::vector<SimStage>& stages, const SimConfig& cfg, Timeline& tl,
                   std::vector<LaneState>& lanes) {
  const int S = static_cast<int>(stages.size()), M = cfg.groups, G = cfg.gen_len, items = tl.items;
  const bool first = s == 0, last = s == S - 1;
  const int compute = static_cast<int>(lanes.size());
  lanes.emplace_back();
  int recv = compute, send = compute;
  if (cfg.overlap) {
    recv = static_cast<int>(lanes.size());
    lanes.emplace_back();
  }
  if (cfg.overlap || (last && S > 1)) {
    send = static_cast<int>(lanes.size());
    lanes.emplace_back();
  }
  std::vector<bool> has_send(items, false);
  auto push = [&](int lane, Op::Kind kind, long index, double ms = 0.0) { lanes[lane].ops.push_back({kind, index, ms}); };
  for (int i = 0; i < items; ++i) {
    const int t = i / M;
    if (!(first && t == 0) && !(first && S == 1)) {
      // Slot consumed: a ring slot (compute of item i-2), or on stage 0 the group's own token
      // buffer (compute of item i-M, the group's previous step), as pipeline.cpp.
      if (first) {
        if (i - M >= M) push(recv, Op::wait, tl.ev_id(s, i - M, kComputeEnd));
      } else if (i >= kRing) {
        push(recv, Op::wait, tl.ev_id(s, i - kRing, kComputeEnd));
      }
      push(recv, Op::record, tl.ev_id(s, i, kRecvStart));
      push(recv, Op::recv, first ? tl.xfer_id(S - 1, i - M) : tl.xfer_id(s - 1, i));
      push(recv, Op::record, tl.ev_id(s, i, kRecvEnd));
      push(compute, Op::wait, tl.ev_id(s, i, kRecvEnd));
    }
    // Output buffer free: the last stage returns tokens from the group's own buffer (its
    // previous step's send), every other stage sends from a ring slot (item i-2), as pipeline.cpp.
    if (last && S > 1) {
      if (i >= M && has_send[i - M]) push(compute, Op::wait, tl.ev_id(s, i - M, kSendEnd));
    } else if (i >= kRing && has_send[i - kRing]) {
      push(compute, Op::wait, tl.ev_id(s, i - kRing, kSendEnd));
    }
    push(compute, Op::record, tl.ev_id(s, i, kComputeStart));
    push(compute, Op::compute, 0, t == 0 ? stages[s].prefill_ms : stages[s].decode_ms);
    push(compute, Op::record, tl.ev_id(s, i, kComputeEnd));
    if (!last || (S > 1 && t < G)) {
      push(send, Op::wait, tl.ev_id(s, i, kComputeEnd));
      push(send, Op::record, tl.ev_id(s, i, kSendStart));
      push(send, Op::send, tl.xfer_id(s, i));
      push(send, Op::record, tl.ev_id(s, i, kSendEnd));
      tl.xfer_ms[tl.xfer_id(s, i)] = t == 0 ? stages[s].send_prefill_ms : stages[s].send_decode_ms;
      has_send[i] = true;
    }
  }
}

/// Plays the lane's next operation on virtual time; false (nothing done) when it must wait for
/// an event or a transfer partner not yet known. Rendezvous transfers end max(send posted,
/// recv posted) + d on both sides; eager sends end d after they were posted.
bool advance(LaneState& lane, Timeline& tl, bool eager_sends) {
  const Op& op = lane.ops[lane.next];
  switch (op.kind) {
    case Op::record:
      tl.ev[op.index] = lane.time;
      break;
    case Op::wait:
      if (std::isnan(tl.ev[op.index])) return false;
      lane.time = std::max(lane.time, tl.ev[op.index]);
      break;
    case Op::compute:
      lane.time += op.ms;
      break;
    case Op::send: {
      if (std::isnan(tl.send_post[op.index])) tl.send_post[op.index] = lane.time;
      const double ts = tl.send_post[op.index], tr = tl.recv_post[op.index], d = tl.xfer_ms[op.index];
      if (eager_sends) lane.time = ts + d;
      else if (std::isnan(tr)) return false;
      else lane.time = std::max(ts, tr) + d;
      break;
    }
    case Op::recv: {
      if (std::isnan(tl.recv_post[op.index])) tl.recv_post[op.index] = lane.time;
      const double ts = tl.send_post[op.index], tr = tl.recv_post[op.index], d = tl.xfer_ms[op.index];
      if (std::isnan(ts)) return false;
      lane.time = eager_sends ? std::max(tr, ts + d) : std::max(ts, tr) + d;
      break;
    }
  }
  ++lane.next;
  return true;
}

/// Sweeps the lanes until none can advance. @throws ppb::InternalError when a lane is left with
/// operations (the schedule deadlocked).
void replay(std::vector<LaneState>& lanes, Timeline& tl, bool eager_sends) {
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& lane : lanes)
      while (lane.next < lane.ops.size() && advance(lane, tl, eager_sends)) progress = true;
  }
  for (std::size_t l = 0; l < lanes.size(); ++l)
    if (lanes[l].next < lanes[l].ops.size())
      throw InternalError("simulate: the schedule deadlocked (lane " + std::to_string(l) + " stuck at operation " +
                          std::to_string(lanes[l].next) + ")");
}

}  // namespace

SimResult simulate_pipeline(const std::vector<SimStage>& stages, const SimConfig& cfg) {
  check_inputs(stages, cfg);
  const int S = static_cast<int>(stages.size()), M = cfg.groups, G = cfg.gen_len;
  const int steps = G + 1, items = M * steps;
  Timeline tl(S, items);
  std::vector<LaneState> lanes;  // the lane programme of run_pipeline, stage by stage
  for (int s = 0; s < S; ++s) program_stage(s, stages, cfg, tl, lanes);
  replay(lanes, tl, cfg.eager_sends);

  // Events in the results layout [1][M][G+1][S][6], seconds.
  SimResult r;
  r.shape = EventShape{1, M, steps, S};
  r.events.assign(static_cast<std::size_t>(M) * steps * S * kNumEvents, kNaN);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < items; ++i)
      for (int k = 0; k < kNumEvents; ++k) r.events[r.shape.index(0, i % M, i / M, s, k)] = 1e-3 * tl.ev[tl.ev_id(s, i, k)];
  r.metrics = compute_metrics(r.events, r.shape, cfg.batch, G);
  return r;
}

}  // namespace ppb::balance
