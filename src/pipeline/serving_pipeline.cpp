#include "pipeline/serving_pipeline.h"

#include "pipeline/stage_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>

#include "common/clock.h"
#include "common/error.h"
#include "common/events.h"
#include "common/flight_recorder.h"
#include "common/watchdog.h"

namespace ppb {

size_t serving_header_ints(int slots) { return 5 + 4 * static_cast<size_t>(slots); }

std::vector<ScheduledStep> alone_schedule(const std::vector<serving::Request>& requests, const std::vector<int>& which) {
  std::vector<ScheduledStep> out;
  for (int q : which) {
    const serving::Request& r = requests.at(q);
    // Each prefill after the first takes slot 0 over: its previous request's positions released.
    out.push_back({0, {{q, 0, 0, r.prompt_len}}, 0.0, 0.0, out.empty() ? std::vector<int>{} : std::vector<int>{0}});
    for (int k = 1; k < r.gen_len; ++k) out.push_back({0, {{q, 0, r.prompt_len + k - 1, 1}}});
  }
  return out;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Message tags: above the closed pipeline's item tags (< 32000), within MPI's guaranteed 32767.
constexpr int kHeaderTag = 32100, kPayloadTag = 32101, kReturnTag = 32102;
enum HeaderKind : int32_t { kEnd = 0, kStep = 1 };

/// One stage's part of a scenario: buffers per group, three lanes, the step loop of stage 0
/// (live or replayed) or of a later stage.
class ServingLoop : StageLoopBase {
 public:
  ServingLoop(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
              const ServingConfig& cfg, const std::vector<serving::Request>& requests);
  ~ServingLoop() { flight::note("serving", ""); }
  /// Stage 0 live (the scheduler), or a follower.
  ServingRecord run_live();
  /// Stage 0 replays `schedule` one step at a time, or a follower.
  ServingRecord run_replay(const std::vector<ScheduledStep>& schedule);

 private:
  struct StepEvents {
    std::unique_ptr<Event> ev[kNumEvents];
    bool has_recv = false, has_send = false;
  };
  void allocate_buffers();
  /// The transport barrier that starts the scenario; returns its t = 0 (monotonic s).
  double start();
  StepEvents& new_step(int rows, int tokens);
  /// Stage 0: enqueues group g's step (its input ids, the forward, the header and payload
  /// sends, the token return and the flag that says it is back).
  void launch(int g, const std::vector<ScheduledRow>& rows, const std::vector<int>& released);
  /// Stage 0: whether group g's tokens are back; waits until then or until monotonic `deadline`.
  /// `idle`: nothing is in flight (the wait is for an arrival: it beats the watchdog's heart).
  bool wait_return(int g, double deadline, bool idle = false);
  /// Stage 0: group g's step is back: its tokens appended to its requests; returns the step's
  /// end (monotonic s: the token return's end, or the forward's with one stage).
  double take_return(int g, const std::vector<ScheduledRow>& rows);
  /// Every 8th step (i % 8 == 0): the stage's resident KV into the record's peak.
  void sample_kv(size_t i) {
    if (i % 8 == 0) rec_.kv_resident_peak_bytes = std::max(rec_.kv_resident_peak_bytes, stage_.kv_resident_bytes());
  }
  /// A later stage, or a tensor-parallel peer of stage 0: runs the steps its source sends until
  /// the end header.
  void follow();
  /// Stage 0's rank 0: the one that schedules (and replays); every other rank follows.
  bool scheduler_rank() const { return first && place_.tp_rank == 0; }
  /// The ranks a step's token return goes to: the last stage's tensor-parallel rank 0 returns
  /// it to stage 0's rank 0 (return_ranks' first: receiver 0 of sender 0), the only rank that
  /// reads it (stage 0's peers take their ids from it); none with one stage.
  std::vector<int> return_peers() const {
    return S > 1 && place_.tp_rank == 0 && !place_.return_ranks.empty() ? std::vector<int>{place_.return_ranks.front()}
                                                                        : std::vector<int>{};
  }
  void send_end();
  ServingRecord finish(double t0);

  const ServingConfig& cfg_;
  const std::vector<serving::Request>& requests_;
  /// M steps in flight (groups, or batch-queue batches), B rows per step at most: a group's
  /// slots, or with batch-queue the one pool's M x slots.
  const int M, B;
  /// The KV cache a group's steps use: its own, or with batch-queue the stage's only one (built
  /// with 1 group of M x slots rows: serving::SchedulerConfig::pool_slots).
  int kv_group(int g) const { return cfg_.scheduler.pp_schedule == serving::PpSchedule::batch_queue ? 0 : g; }
  const size_t header_ints_;
  int max_tokens_ = 1;  ///< the most packed tokens a step can have (serving::max_step_tokens)

  // Buffers (before the lanes: the lanes are destroyed, and drained, first).
  std::vector<std::unique_ptr<Buffer>> in_, out_, header_out_;
  std::vector<std::vector<int32_t>> header_out_host_;
  std::unique_ptr<Buffer> header_in_[2];
  std::vector<int32_t> header_in_host_[2];
  // Stage 0: input ids, token returns, and the flag each return sets.
  std::vector<std::vector<int32_t>> ids_host_, return_host_;
  std::vector<std::unique_ptr<Buffer>> return_;
  /// Which groups' returns are in (set by a host task on the lane that completes the return,
  /// cleared by the stage-0 thread). The stage-0 thread sleeps on `cv` for them: it shares the
  /// machine's cores with the compute lanes, and a poll every 200 us (before 2026-12-06) cost
  /// rank 0's compute 3-7% in a microbenchmark here.
  struct Returns {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> in;  ///< [M]
    void set(int g, bool v) {
      {
        std::lock_guard<std::mutex> lock(mu);
        in[static_cast<size_t>(g)] = v;
      }
      if (v) cv.notify_all();
    }
  };
  std::unique_ptr<Returns> returned_;
  std::vector<StepEvents*> return_events_;  ///< [M] the step in flight's events

  std::vector<int> stage0_peers_;  ///< stage 0's rank 0: its tensor-parallel peers
  int source_ = -1;                 ///< a follower's source of headers and inputs
  std::vector<std::unique_ptr<Buffer>> peer_ids_;  ///< [M] stage 0's rank 0: the ids sent to its peers

  std::unique_ptr<Lane> compute_, recv_, send_;
  std::vector<std::unique_ptr<StepEvents>> steps_;
  ServingRecord rec_;
};

ServingLoop::ServingLoop(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
                         const ServingConfig& cfg, const std::vector<serving::Request>& requests)
    : StageLoopBase(device, transport, stage, place, "serving stage"),
      cfg_(cfg),
      requests_(requests),
      M(cfg.scheduler.groups),
      B(cfg.scheduler.pool_slots()),
      header_ints_(serving_header_ints(cfg.scheduler.pool_slots())) {
  if (M < 1 || B < 1) throw InternalError("run_serving: groups and slots must be >= 1");
  max_tokens_ = serving::max_step_tokens(requests_, cfg.scheduler);
  // A tensor-parallel stage 0: its rank 0 schedules and sends each step's header and input ids
  // to the others (its peers, ranks leader + 1 .. leader + width - 1: Partition::stage_ranks),
  // which follow it as a later stage follows its previous one.
  std::vector<std::pair<int, int>> extra;
  if (first && place_.tp_width > 1) {
    const int leader = place_.rank - place_.tp_rank;
    if (scheduler_rank()) {
      for (int j = 1; j < place_.tp_width; ++j) stage0_peers_.push_back(leader + j), extra.emplace_back(leader, leader + j);
    } else {
      extra.emplace_back(leader, place_.rank);
    }
  }
  source_ = first ? place_.rank - place_.tp_rank : place_.prev_rank;
  allocate_buffers();
  compute_ = device_.create_lane("compute");
  recv_ = device_.create_lane("recv");
  send_ = device_.create_lane("send");
  connect_links(extra);
}

void ServingLoop::allocate_buffers() {
  in_.resize(M);
  out_.resize(M);
  header_out_.resize(M);
  header_out_host_.assign(M, std::vector<int32_t>(header_ints_, 0));
  for (int g = 0; g < M; ++g) {
    in_[g] = device_.allocate(stage_.ragged_input_bytes(max_tokens_));
    out_[g] = device_.allocate(stage_.ragged_output_bytes(B, max_tokens_));
    header_out_[g] = device_.allocate(header_ints_ * sizeof(int32_t));
  }
  for (int h = 0; h < 2; ++h) {
    header_in_[h] = device_.allocate(header_ints_ * sizeof(int32_t));
    header_in_host_[h].assign(header_ints_, 0);
  }
  if (scheduler_rank() && !stage0_peers_.empty()) {
    peer_ids_.resize(M);
    for (auto& b : peer_ids_) b = device_.allocate(stage_.ragged_input_bytes(max_tokens_));
  }
  if (first) {
    ids_host_.assign(M, std::vector<int32_t>(max_tokens_, 0));
    return_host_.assign(M, std::vector<int32_t>(B, 0));
    return_.resize(M);
    for (auto& r : return_) r = device_.allocate(static_cast<size_t>(B) * sizeof(int32_t));
    returned_ = std::make_unique<Returns>();
    returned_->in.assign(static_cast<size_t>(M), 0);
    return_events_.assign(M, nullptr);
  }
}

double ServingLoop::start() {
  flight::note("serving", describe_stage() + " of " + std::to_string(S) + ", " + std::to_string(requests_.size()) +
                              " requests, M=" + std::to_string(M) + " groups of B=" + std::to_string(B) + " slots");
  stage_.reset_checksum();
  flight::Scope scope(flight::Tag{"start of the scenario"});
  barrier(*compute_, "start");
  return monotonic_s();
}

ServingLoop::StepEvents& ServingLoop::new_step(int rows, int tokens) {
  steps_.push_back(std::make_unique<StepEvents>());
  for (auto& e : steps_.back()->ev) e = device_.create_event();
  rec_.step_rows.push_back(rows);
  rec_.step_tokens.push_back(tokens);
  return *steps_.back();
}

void ServingLoop::launch(int g, const std::vector<ScheduledRow>& rows, const std::vector<int>& released) {
  RaggedStep rs;
  rs.released.assign(released.begin(), released.end());
  std::vector<int32_t>& ids = ids_host_[g];
  int n = 0;
  for (const ScheduledRow& row : rows) {
    const serving::Request& q = requests_.at(row.request);
    rs.slot.push_back(row.slot);
    rs.pos.push_back(row.position);
    rs.tokens.push_back(row.tokens);
    if (n + row.tokens > max_tokens_) throw InternalError("serving: a step of more tokens than serving::max_step_tokens");
    for (int t = 0; t < row.tokens; ++t) {
      const int p = row.position + t;
      // Position p's input: the prompt's token, or output token p - prompt_len (DESIGN.md).
      ids[n++] = p < q.prompt_len ? prompt_token(cfg_.seed, row.request, 0, p, cfg_.vocab)
                                  : rec_.tokens.at(row.request).at(p - q.prompt_len);
    }
  }
  const int R = rs.rows();
  StepEvents& e = new_step(R, n);
  returned_->set(g, false);
  return_events_[g] = &e;
  flight::Scope scope(flight::Tag{"serving step", -1, g});
  // The header (for the next stage and stage 0's tensor-parallel peers) and, for the peers, the
  // ids, sent before the forward: the peers' halves of its collectives need them.
  const bool headed = S > 1 || !stage0_peers_.empty();
  if (headed) {
    std::vector<int32_t>& h = header_out_host_[g];
    h[0] = kStep;
    h[1] = g;
    h[2] = R;
    h[3] = n;
    h[4] = static_cast<int32_t>(rs.released.size());
    for (int r = 0; r < R; ++r) {
      h[5 + r] = rs.slot[r];
      h[5 + B + r] = rs.pos[r];
      h[5 + 2 * B + r] = rs.tokens[r];
    }
    std::copy(rs.released.begin(), rs.released.end(), h.begin() + 5 + 3 * B);
    send_->copy(header_out_[g]->data(), h.data(), header_ints_ * sizeof(int32_t));
    for (int peer : stage0_peers_) transport_.enqueue_send(*send_, header_out_[g]->data(), header_ints_ * sizeof(int32_t), peer, kHeaderTag);
    if (!stage0_peers_.empty()) {
      send_->copy(peer_ids_[g]->data(), ids.data(), static_cast<size_t>(n) * sizeof(int32_t));
      for (int peer : stage0_peers_) transport_.enqueue_send(*send_, peer_ids_[g]->data(), stage_.ragged_input_bytes(n), peer, kPayloadTag);
    }
    for (int peer : place_.next_ranks) transport_.enqueue_send(*send_, header_out_[g]->data(), header_ints_ * sizeof(int32_t), peer, kHeaderTag);
  }
  compute_->copy(in_[g]->data(), ids.data(), static_cast<size_t>(n) * sizeof(int32_t));
  compute_->record(*e.ev[kComputeStart]);
  stage_.enqueue_forward_ragged(*compute_, in_[g]->data(), out_[g]->data(), kv_group(g), rs);
  compute_->record(*e.ev[kComputeEnd]);
  Returns* returns = returned_.get();
  if (S == 1) {
    compute_->copy(return_host_[g].data(), out_[g]->data(), static_cast<size_t>(R) * sizeof(int32_t));
    compute_->host_task([returns, g] { returns->set(g, true); });
    return;
  }
  send_->wait(*e.ev[kComputeEnd]);
  send_->record(*e.ev[kSendStart]);
  for (int peer : place_.next_ranks)
    transport_.enqueue_send(*send_, out_[g]->data(), stage_.ragged_output_bytes(R, n), peer, kPayloadTag);
  send_->record(*e.ev[kSendEnd]);
  e.has_send = true;
  // The return cannot come before this forward ends (the last stage computes on its output), so
  // the receiving lane waits for the forward on its event, asleep, before it polls: on a CPU
  // rank every poll takes the core from this forward (docs/MEASUREMENTS.md § "2026-12-07 the
  // return's receive after the forward"). The returns are received in the order they are sent.
  recv_->wait(*e.ev[kComputeEnd]);
  recv_->record(*e.ev[kRecvStart]);
  transport_.enqueue_recv(*recv_, return_[g]->data(), static_cast<size_t>(R) * sizeof(int32_t), place_.last_rank, kReturnTag);
  recv_->record(*e.ev[kRecvEnd]);
  e.has_recv = true;
  recv_->copy(return_host_[g].data(), return_[g]->data(), static_cast<size_t>(R) * sizeof(int32_t));
  recv_->host_task([returns, g] { returns->set(g, true); });
}

bool ServingLoop::wait_return(int g, double deadline, bool idle) {
  std::unique_lock<std::mutex> lock(returned_->mu);
  while (!returned_->in[static_cast<size_t>(g)]) {
    if (lane_abort_requested()) throw InternalError(describe_stage() + ": the run is being aborted");
    const double now = monotonic_s();
    if (now >= deadline) return false;
    // Nothing in flight, waiting for an arrival: the scenario's clock is the progress. While a
    // step is in flight the lanes' own tasks are (a return that never comes trips the watchdog).
    if (idle) heartbeat();
    // Woken by the return, at the deadline, or after 50 ms to look at an abort.
    returned_->cv.wait_for(lock, std::chrono::duration<double>(std::min(deadline - now, 0.05)));
  }
  return true;
}

double ServingLoop::take_return(int g, const std::vector<ScheduledRow>& rows) {
  StepEvents& e = *return_events_[g];
  Event& end = S == 1 ? *e.ev[kComputeEnd] : *e.ev[kRecvEnd];
  end.synchronize();
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r].emits) rec_.tokens.at(rows[r].request).push_back(return_host_[g][r]);
  returned_->set(g, false);
  return end.time_s();
}

ServingRecord ServingLoop::run_live() {
  const double t0 = start();
  if (!scheduler_rank()) {
    follow();
    return finish(t0);
  }
  rec_.tokens.assign(requests_.size(), {});
  serving::Scheduler sched(requests_, cfg_.scheduler);
  std::deque<int> fifo;                  // groups in flight, in the order they were sent
  std::vector<size_t> in_flight(M, 0);  // each group's step in rec_.schedule
  const double inf = std::numeric_limits<double>::infinity();
  while (!sched.finished()) {
    double first_offer = inf;  // when the first idle group was offered a step (scenario clock)
    for (int g = 0; g < M; ++g) {
      if (sched.in_flight(g)) continue;
      const double now = monotonic_s() - t0;
      first_offer = std::min(first_offer, now);
      const serving::Step& st = sched.next_step(g, now);
      if (st.rows.empty()) continue;
      ScheduledStep s{g, {}, st.start_s, kNaN, st.released};
      for (const serving::BatchRow& br : st.rows) s.rows.push_back({br.request, br.slot, br.position, br.tokens, br.emits});
      launch(g, s.rows, s.released);
      sample_kv(rec_.schedule.size());  // while its forward computes
      in_flight[g] = rec_.schedule.size();
      rec_.schedule.push_back(std::move(s));
      fifo.push_back(g);
    }
    const double arrival = sched.next_arrival_s();
    if (fifo.empty()) {
      if (!(arrival < inf)) throw InternalError("serving: requests left, none in flight and none to arrive");
      wait_return(0, t0 + arrival, true);  // nothing in flight: sleep until the arrival (returns false)
      continue;
    }
    // A group is idle: an arrival may give it work before the oldest step is back. One every
    // idle group was offered already (it arrived before the first offer) waits for a return: no
    // slot or block is free for it until one (the batch queue: all held by steps in flight).
    const double deadline = static_cast<int>(fifo.size()) < M && arrival < inf && arrival > first_offer ? t0 + arrival : inf;
    const int g = fifo.front();
    if (!wait_return(g, deadline)) continue;
    fifo.pop_front();
    ScheduledStep& s = rec_.schedule[in_flight[g]];
    s.end_s = take_return(g, s.rows) - t0;
    sched.complete_step(g, std::max(s.end_s, s.start_s));
  }
  send_end();
  rec_.times = sched.times();
  rec_.group.resize(requests_.size());
  rec_.slot.resize(requests_.size());
  for (size_t q = 0; q < requests_.size(); ++q) {
    rec_.group[q] = sched.group_of(static_cast<int>(q));
    rec_.slot[q] = sched.slot_of(static_cast<int>(q));
  }
  return finish(t0);
}

ServingRecord ServingLoop::run_replay(const std::vector<ScheduledStep>& schedule) {
  const double t0 = start();
  if (!scheduler_rank()) {
    follow();
    return finish(t0);
  }
  rec_.tokens.assign(requests_.size(), {});
  for (const ScheduledStep& s : schedule) {
    if (s.group < 0 || s.group >= M) throw InternalError("replay_serving: a step of group " + std::to_string(s.group));
    launch(s.group, s.rows, s.released);
    wait_return(s.group, std::numeric_limits<double>::infinity());
    const double end = take_return(s.group, s.rows) - t0;
    rec_.schedule.push_back({s.group, s.rows, end, end, s.released});
  }
  send_end();
  return finish(t0);
}

void ServingLoop::send_end() {
  if (S == 1 && stage0_peers_.empty()) return;
  std::vector<int32_t>& h = header_out_host_[0];
  // Group 0's header buffer is free: every step of every group is back.
  std::fill(h.begin(), h.end(), 0);
  h[0] = kEnd;
  send_->copy(header_out_[0]->data(), h.data(), header_ints_ * sizeof(int32_t));
  for (int peer : stage0_peers_) transport_.enqueue_send(*send_, header_out_[0]->data(), header_ints_ * sizeof(int32_t), peer, kHeaderTag);
  for (int peer : place_.next_ranks) transport_.enqueue_send(*send_, header_out_[0]->data(), header_ints_ * sizeof(int32_t), peer, kHeaderTag);
}

void ServingLoop::follow() {
  const size_t hbytes = header_ints_ * sizeof(int32_t);
  std::unique_ptr<Event> header_ready[2] = {device_.create_event(), device_.create_event()};
  std::vector<StepEvents*> sent(M, nullptr);  // each group's last step, whose send frees out_[g]
  auto post_header = [&](int h) {
    transport_.enqueue_recv(*recv_, header_in_[h]->data(), hbytes, source_, kHeaderTag);
    recv_->copy(header_in_host_[h].data(), header_in_[h]->data(), hbytes);
    recv_->record(*header_ready[h]);
  };
  post_header(0);
  for (int i = 0;; ++i) {
    const int h = i % 2;
    {
      flight::Scope scope(flight::Tag{"serving header", -1, -1, i});
      header_ready[h]->synchronize();
    }
    const std::vector<int32_t>& hd = header_in_host_[h];
    if (hd[0] == kEnd) {
      if (!last)
        for (int peer : place_.next_ranks) {
          send_->copy(header_out_[0]->data(), hd.data(), hbytes);
          transport_.enqueue_send(*send_, header_out_[0]->data(), hbytes, peer, kHeaderTag);
        }
      return;
    }
    const int g = hd[1], R = hd[2], n = hd[3], freed = hd[4];
    if (hd[0] != kStep || g < 0 || g >= M || R < 1 || R > B || n < R || n > max_tokens_ || freed < 0 || freed > B)
      throw InternalError(describe_stage() + ": a malformed step header (kind " + std::to_string(hd[0]) + ", group " +
                          std::to_string(g) + ", rows " + std::to_string(R) + ", tokens " + std::to_string(n) +
                          ", released " + std::to_string(freed) + ")");
    RaggedStep rs;
    rs.slot.assign(hd.begin() + 5, hd.begin() + 5 + R);
    rs.pos.assign(hd.begin() + 5 + B, hd.begin() + 5 + B + R);
    rs.tokens.assign(hd.begin() + 5 + 2 * B, hd.begin() + 5 + 2 * B + R);
    rs.released.assign(hd.begin() + 5 + 3 * B, hd.begin() + 5 + 3 * B + freed);
    StepEvents& e = new_step(R, n);
    flight::Scope scope(flight::Tag{"serving step", -1, g, i});
    recv_->record(*e.ev[kRecvStart]);
    transport_.enqueue_recv(*recv_, in_[g]->data(), stage_.ragged_input_bytes(n), source_, kPayloadTag);
    recv_->record(*e.ev[kRecvEnd]);
    e.has_recv = true;
    post_header(1 - h);  // the next header arrives while this step computes
    if (!last) {
      // This header leaves with the step; its host copy is free once the group's last send is.
      if (sent[g]) sent[g]->ev[kSendEnd]->synchronize();
      header_out_host_[g] = hd;
    }
    compute_->wait(*e.ev[kRecvEnd]);
    if (sent[g]) compute_->wait(*sent[g]->ev[kSendEnd]);  // out_[g] was sent
    compute_->record(*e.ev[kComputeStart]);
    stage_.enqueue_forward_ragged(*compute_, in_[g]->data(), out_[g]->data(), kv_group(g), rs);
    compute_->record(*e.ev[kComputeEnd]);
    sample_kv(static_cast<size_t>(i));  // while its forward computes
    if (!last) {
      send_->copy(header_out_[g]->data(), header_out_host_[g].data(), hbytes);
      for (int peer : place_.next_ranks) transport_.enqueue_send(*send_, header_out_[g]->data(), hbytes, peer, kHeaderTag);
    }
    send_->wait(*e.ev[kComputeEnd]);
    send_->record(*e.ev[kSendStart]);
    const std::vector<int> peers = last ? return_peers() : place_.next_ranks;
    const int tag = last ? kReturnTag : kPayloadTag;
    for (int peer : peers) transport_.enqueue_send(*send_, out_[g]->data(), stage_.ragged_output_bytes(R, n), peer, tag);
    send_->record(*e.ev[kSendEnd]);
    e.has_send = true;
    sent[g] = &e;
  }
}

ServingRecord ServingLoop::finish(double t0) {
  drain({compute_.get(), recv_.get(), send_.get()}, "end of the scenario");
  rec_.kv_resident_peak_bytes = std::max(rec_.kv_resident_peak_bytes, stage_.kv_resident_bytes());
  rec_.wall_s = monotonic_s() - t0;
  rec_.start_monotonic_s = t0;
  rec_.events.assign(steps_.size() * kNumEvents, kNaN);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const StepEvents& e = *steps_[i];
    for (int k = 0; k < kNumEvents; ++k) {
      if (event_present(k, e.has_recv, e.has_send)) rec_.events[i * kNumEvents + k] = e.ev[k]->time_s();
    }
  }
  if (last) rec_.checksum = stage_.checksum();
  return std::move(rec_);
}

}  // namespace

ServingRecord run_serving(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
                          const ServingConfig& cfg, const std::vector<serving::Request>& requests) {
  ServingLoop loop(device, transport, stage, place, cfg, requests);
  try {
    return loop.run_live();
  } catch (...) {
    request_lane_abort();
    transport.abort();
    throw;
  }
}

ServingRecord replay_serving(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
                             const ServingConfig& cfg, const std::vector<serving::Request>& requests,
                             const std::vector<ScheduledStep>& schedule) {
  ServingLoop loop(device, transport, stage, place, cfg, requests);
  try {
    return loop.run_replay(schedule);
  } catch (...) {
    request_lane_abort();
    transport.abort();
    throw;
  }
}

}  // namespace ppb
