#include "pipeline/pipeline.h"

#include "pipeline/stage_loop.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>

#include "common/check.h"
#include "common/error.h"
#include "common/flight_recorder.h"

namespace ppb {

int32_t prompt_token(uint64_t seed, int group, int seq, int pos, int vocab) {
  // splitmix64 of the packed coordinates: cheap, deterministic, identical on every rank.
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL ^ (static_cast<uint64_t>(group) << 40) ^
               (static_cast<uint64_t>(seq) << 20) ^ static_cast<uint64_t>(pos);
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<int32_t>(z % static_cast<uint64_t>(vocab));
}

StagePlacement layout_placement(const std::vector<std::vector<int>>& stage_ranks, int rank) {
  const int S = static_cast<int>(stage_ranks.size());
  StagePlacement p;
  p.rank = rank;
  p.num_stages = S;
  p.stage = -1;
  for (int k = 0; k < S; ++k) {
    if (stage_ranks[k].empty()) throw InternalError("layout_placement: stage " + std::to_string(k) + " has no rank");
    for (size_t j = 0; j < stage_ranks[k].size(); ++j) {
      if (stage_ranks[k][j] != rank) continue;
      if (p.stage >= 0) throw InternalError("layout_placement: rank " + std::to_string(rank) + " is in two stages");
      p.stage = k;
      p.tp_rank = static_cast<int>(j);
    }
  }
  if (p.stage < 0) throw InternalError("layout_placement: rank " + std::to_string(rank) + " is in no stage");
  const int k = p.stage, j = p.tp_rank;
  const std::vector<int>& mine = stage_ranks[k];
  p.tp_width = static_cast<int>(mine.size());
  // Receiver i of a stage of width b gets from sender i % a of the stage of width a before it.
  auto receivers_of = [&](const std::vector<int>& to) {
    std::vector<int> out;
    for (size_t i = 0; i < to.size(); ++i)
      if (static_cast<int>(i % mine.size()) == j) out.push_back(to[i]);
    return out;
  };
  if (k > 0) p.prev_rank = stage_ranks[k - 1][j % stage_ranks[k - 1].size()];
  if (k + 1 < S) p.next_ranks = receivers_of(stage_ranks[k + 1]);
  if (S > 1 && k == 0) p.last_rank = stage_ranks[S - 1][j % stage_ranks[S - 1].size()];
  if (S > 1 && k == S - 1) p.return_ranks = receivers_of(stage_ranks[0]);
  return p;
}

namespace {

constexpr int kRing = 2;  // double buffering of recv and output slots

/// A fault injected for the reliability tests: PPBENCH_FAULT=stall:RANK:ITEM makes world rank
/// RANK stop at item ITEM of its first timed repetition (its compute lane sleeps until the job
/// is aborted), the "rank that stops answering" of the tests.
struct InjectedFault {
  bool active = false;
  int item = 0;
};

InjectedFault injected_fault(int rank) {
  InjectedFault f;
  const char* env = std::getenv("PPBENCH_FAULT");
  int r = -1, item = 0;
  if (env && std::sscanf(env, "stall:%d:%d", &r, &item) == 2 && r == rank) {
    f.active = true;
    f.item = item;
  }
  return f;
}

/// Message tag of an item; MPI guarantees tags up to 32767.
int item_tag(int item) { return item % 32000; }


/// run_pipeline on one stage: its buffers and lanes (members in that order, so that the lanes
/// are destroyed, and drained, first), the links, and the steps of every repetition.
class StageLoop : StageLoopBase {
 public:
  /// Allocates the buffers, creates the lanes and connects the links.
  StageLoop(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
            const PipelineConfig& cfg);
  ~StageLoop() { flight::note("pipeline", ""); }
  /// Runs cfg.warmup + cfg.iters repetitions (`progress(rep, total)` after each) and returns
  /// the record.
  StageRecord run(const std::function<void(int, int)>& progress);

 private:
  /// One repetition's events, [items][kNumEvents], and the items that received / sent.
  struct RepEvents {
    std::vector<std::unique_ptr<Event>> ev;
    std::vector<bool> has_recv, has_send;
    Event& at(int item, int k) { return *ev[item * kNumEvents + k]; }
  };

  /// Ring slots, stage 0's prompts and token buffers, the last stage's return buffers and token log.
  void allocate_buffers();
  /// The compute lane, and the recv and send lanes the mode (and the token return) needs.
  void create_lanes();
  /// One repetition: the barrier that starts it, every item, the lanes synchronised, its events kept.
  void run_repetition(int rep);
  /// Enqueues the barrier that starts repetition `rep` and waits for it; marks the timed window's start.
  void start_repetition(int rep, bool timed);
  /// Enqueues item i's input (the prompt, the group's own last token, or a receive); returns it.
  const void* enqueue_input(RepEvents& r, int i, int slot);
  /// Enqueues item i's forward from `in` (and the copies of its tokens); returns its output.
  void* enqueue_compute(RepEvents& r, int i, int slot, const void* in);
  /// Enqueues item i's send (if any) and, serialized, the barrier after the item.
  void enqueue_send(RepEvents& r, int i, void* out);
  /// Waits for every lane of the repetition; a failure aborts the lanes and names the stage.
  void synchronize_lanes(int rep);
  /// Copies a timed repetition's event times into the record (NaN where an item has no such operation).
  void store_events(RepEvents& r, int rep);
  /// After the last repetition: lane CPU times, tokens and checksum, events in the file's order.
  void finish();
  /// The flight recorder's tag of item i's operation `op` in the current repetition.
  flight::Tag flight_tag(int i, const char* op) const { return {op, rep_, i % M, i / M}; }

  const PipelineConfig& cfg_;
  /// The workload's M, G, P, B (DESIGN.md §2), G + 1 steps and M * steps items per repetition.
  const int M, G, P, B, steps, items;
  const InjectedFault fault_;

  // ---- buffers (declared before the lanes: lanes are destroyed, and drained, first) --------
  std::vector<std::unique_ptr<Buffer>> recv_slot_, out_slot_;
  /// Stage 0: each group's prompt and its own token buffer (its decode input).
  std::vector<std::unique_ptr<Buffer>> prompt_, group_tokens_;
  /// The last stage of several: each group's token return buffer.
  std::vector<std::unique_ptr<Buffer>> return_tokens_;
  /// The last stage's sampled tokens of every item of a repetition, [item][B], in device memory.
  std::unique_ptr<Buffer> token_log_dev_;
  std::vector<int32_t> token_log_;

  // ---- lanes ------------------------------------------------------------------------------
  std::unique_ptr<Lane> compute_lane_, recv_lane_owned_, send_lane_owned_;
  Lane* recv_lane_ = nullptr;
  Lane* send_lane_ = nullptr;

  StageRecord rec_;
  int rep_ = 0;  ///< the repetition being enqueued (the flight recorder's tags)
  double cpu0_[3] = {0, 0, 0};
  double wall0_ = 0.0;
};

StageLoop::StageLoop(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
                     const PipelineConfig& cfg)
    : StageLoopBase(device, transport, stage, place, "stage"),
      cfg_(cfg),
      M(cfg.work.groups),
      G(cfg.work.gen_len),
      P(cfg.work.prompt_len),
      B(cfg.work.batch),
      steps(G + 1),
      items(M * steps),
      fault_(injected_fault(place.rank)) {
  allocate_buffers();
  create_lanes();
  connect_links();
  rec_.events.assign(static_cast<size_t>(cfg_.iters) * items * kNumEvents, std::numeric_limits<double>::quiet_NaN());
}

void StageLoop::allocate_buffers() {
  const size_t in_max = stage_.input_bytes(P);
  const size_t out_max = stage_.output_bytes(P);
  recv_slot_.resize(kRing);
  out_slot_.resize(kRing);
  for (int r = 0; r < kRing; ++r) {
    recv_slot_[r] = device_.allocate(in_max);
    out_slot_[r] = device_.allocate(out_max);
  }
  // Stage 0's decode input is the group's own token buffer: written by the token return (or,
  // with one stage, copied from the output), read by the group's next step. Receiving into it
  // rather than into a ring slot keeps the return path free of the ring's back-pressure: a ring
  // slot is freed by a compute that may itself wait on this very return, a deadlock once the
  // transport needs the receive posted (NCCL always, MPI above the eager limit) and M > 2.
  prompt_.resize(first ? M : 0);
  group_tokens_.resize(first ? M : 0);
  // The last stage returns each group's token from a buffer of that group's own, for the same
  // reason: a ring slot would make its compute wait for a return that waits for stage 0.
  return_tokens_.resize(last && S > 1 ? M : 0);
  for (auto& b : return_tokens_) b = device_.allocate(static_cast<size_t>(B) * sizeof(int32_t));
  if (first) {
    std::vector<int32_t> host(static_cast<size_t>(B) * P);
    for (int g = 0; g < M; ++g) {
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < P; ++t) host[static_cast<size_t>(b) * P + t] = prompt_token(cfg_.work.seed, g, b, t, cfg_.vocab);
      prompt_[g] = device_.allocate(host.size() * sizeof(int32_t));
      prompt_[g]->upload(host.data(), host.size() * sizeof(int32_t));
      group_tokens_[g] = device_.allocate(static_cast<size_t>(B) * sizeof(int32_t));
    }
  }
  // The token log is downloaded once after the repetition: a copy into host memory between
  // compute_start and compute_end would put a host round trip into every item's compute time
  // (CUDA stages a pageable destination through a host task the stream waits for).
  if (last) token_log_dev_ = device_.allocate(static_cast<size_t>(items) * B * sizeof(int32_t));
  token_log_.resize(last ? static_cast<size_t>(items) * B : 0);
}

void StageLoop::create_lanes() {
  compute_lane_ = device_.create_lane("compute");
  recv_lane_ = compute_lane_.get();
  send_lane_ = compute_lane_.get();
  if (cfg_.mode == LaneMode::overlap) {
    recv_lane_owned_ = device_.create_lane("recv");
    recv_lane_ = recv_lane_owned_.get();
  }
  // The last stage's token return keeps a lane of its own in every mode: a blocking return on
  // the compute lane would close the ring stage 0 -> ... -> last -> stage 0 into a deadlock
  // whenever the transport needs the receiver to be posted (NCCL always, MPI for large
  // messages). It carries B int32 per step, so it hides nothing worth measuring.
  if (cfg_.mode == LaneMode::overlap || (last && S > 1)) {
    send_lane_owned_ = device_.create_lane("send");
    send_lane_ = send_lane_owned_.get();
  }
}

StageRecord StageLoop::run(const std::function<void(int, int)>& progress) {
  const int reps = cfg_.warmup + cfg_.iters;
  for (int rep = 0; rep < reps; ++rep) {
    run_repetition(rep);
    if (progress) progress(rep + 1, reps);
  }
  finish();
  return std::move(rec_);
}

void StageLoop::run_repetition(int rep) {
  const bool timed = rep >= cfg_.warmup;
  rep_ = rep;
  flight::note("pipeline", describe_stage() + " of " + std::to_string(S) + ", repetition " + std::to_string(rep) + " of " +
                               std::to_string(cfg_.warmup + cfg_.iters) + " (" + std::to_string(cfg_.warmup) +
                               " warm-up), " + std::to_string(items) + " items of M=" + std::to_string(M) + " groups x " +
                               std::to_string(steps) + " steps");
  RepEvents r;
  r.ev.resize(static_cast<size_t>(items) * kNumEvents);
  for (auto& e : r.ev) e = device_.create_event();
  r.has_recv.assign(items, false);
  r.has_send.assign(items, false);
  stage_.reset_checksum();
  start_repetition(rep, timed);

  for (int i = 0; i < items; ++i) {
    const int slot = i % kRing;
    const void* in = enqueue_input(r, i, slot);
    if (fault_.active && timed && rep == cfg_.warmup && i == fault_.item) {
      // Injected fault (tests): this rank stops answering, as a stuck process would.
      flight::Scope scope(flight_tag(i, "injected stall (PPBENCH_FAULT)"));
      compute_lane_->host_task([] {
        while (!lane_abort_requested()) {
          timespec ts{0, 100000000};
          nanosleep(&ts, nullptr);
        }
      });
    }
    void* out = enqueue_compute(r, i, slot, in);
    enqueue_send(r, i, out);
  }

  synchronize_lanes(rep);
  if (last) token_log_dev_->download(token_log_.data(), token_log_.size() * sizeof(int32_t));
  if (timed) store_events(r, rep);
}

void StageLoop::start_repetition(int rep, bool timed) {
  // Barrier through the transport: polled, bounded by --timeout, never a hang.
  flight::Scope scope(flight::Tag{"start of repetition", rep});
  barrier(*compute_lane_, "start of repetition " + std::to_string(rep));
  if (timed && rep == cfg_.warmup) {
    cpu0_[0] = compute_lane_->cpu_time_s();
    cpu0_[1] = recv_lane_owned_ ? recv_lane_owned_->cpu_time_s() : 0.0;
    cpu0_[2] = send_lane_owned_ ? send_lane_owned_->cpu_time_s() : 0.0;
    wall0_ = monotonic_s();
  }
  if (timed) rec_.rep_start_s.push_back(monotonic_s());
}

const void* StageLoop::enqueue_input(RepEvents& r, int i, int slot) {
  const int t = i / M, g = i % M;
  const int T = t == 0 ? P : 1;
  if (first && t == 0) return prompt_[g]->data();
  if (first && S == 1) return group_tokens_[g]->data();
  flight::Scope scope(flight_tag(i, "recv"));
  const int peer = first ? place_.last_rank : place_.prev_rank;
  const size_t bytes = stage_.input_bytes(T);
  void* dst = first ? group_tokens_[g]->data() : recv_slot_[slot]->data();
  // The buffer must have been consumed: the group's previous decode step on stage 0 (its
  // prefill reads the prompt instead), the item two back in the ring elsewhere.
  if (first) {
    if (t >= 2) recv_lane_->wait(r.at(i - M, kComputeEnd));
  } else if (i >= kRing) {
    recv_lane_->wait(r.at(i - kRing, kComputeEnd));
  }
  recv_lane_->record(r.at(i, kRecvStart));
  // Tags name the producing item: stage 0's decode input is the token of the group's
  // previous step, item i - M.
  const int tag = item_tag(first ? i - M : i);
  transport_.enqueue_recv(*recv_lane_, dst, bytes, peer, tag);
  recv_lane_->record(r.at(i, kRecvEnd));
  compute_lane_->wait(r.at(i, kRecvEnd));
  r.has_recv[i] = true;
  return dst;
}

void* StageLoop::enqueue_compute(RepEvents& r, int i, int slot, const void* in) {
  const int t = i / M, g = i % M;
  const int T = t == 0 ? P : 1;
  const int pos = t == 0 ? 0 : P + t - 1;
  flight::Scope scope(flight_tag(i, "compute"));
  // The output buffer must have been sent (if it was) before it is overwritten.
  void* out = out_slot_[slot]->data();
  if (last && S > 1) {
    out = return_tokens_[g]->data();
    if (i >= M && r.has_send[i - M]) compute_lane_->wait(r.at(i - M, kSendEnd));
  } else if (i >= kRing && r.has_send[i - kRing]) {
    compute_lane_->wait(r.at(i - kRing, kSendEnd));
  }
  stage_.prepare_forward(g, pos, T);  // a first decode graph's capture: before, not inside, the timing
  compute_lane_->record(r.at(i, kComputeStart));
  stage_.enqueue_forward(*compute_lane_, in, out, g, pos, T);
  if (last)
    compute_lane_->copy(static_cast<int32_t*>(token_log_dev_->data()) + static_cast<size_t>(i) * B, out,
                        B * sizeof(int32_t));
  if (first && S == 1 && t < G) compute_lane_->copy(group_tokens_[g]->data(), out, B * sizeof(int32_t));
  compute_lane_->record(r.at(i, kComputeEnd));
  return out;
}

void StageLoop::enqueue_send(RepEvents& r, int i, void* out) {
  const int t = i / M;
  const int T = t == 0 ? P : 1;
  // Send: activations to the next stage, or tokens back to stage 0 (not after the last
  // step); to each receiver this rank serves (layout_placement), none for some ranks of a
  // stage wider than the next.
  const std::vector<int>& peers = last ? place_.return_ranks : place_.next_ranks;
  flight::Scope scope(flight_tag(i, "send"));
  if ((!last || (S > 1 && t < G)) && !peers.empty()) {
    send_lane_->wait(r.at(i, kComputeEnd));
    send_lane_->record(r.at(i, kSendStart));
    for (int peer : peers) transport_.enqueue_send(*send_lane_, out, stage_.output_bytes(T), peer, item_tag(i));
    send_lane_->record(r.at(i, kSendEnd));
    r.has_send[i] = true;
  }
  if (cfg_.mode == LaneMode::serialized) {
    // One item in the whole pipeline at a time: every rank meets after its part of item i.
    // Wait for an activation send (the next stage receives it before the barrier), but not
    // for a token return: stage 0 posts that receive only at the group's next step, after
    // more barriers, so waiting here deadlocks once the return is a rendezvous (B >~ 1000
    // tokens over Open MPI's 4 KB eager limit, or NCCL).
    if (r.has_send[i] && !last && send_lane_ != compute_lane_.get()) compute_lane_->wait(r.at(i, kSendEnd));
    transport_.enqueue_barrier(*compute_lane_);
  }
}

void StageLoop::synchronize_lanes(int rep) {
  drain({compute_lane_.get(), recv_lane_owned_.get(), send_lane_owned_.get()}, "repetition " + std::to_string(rep));
}

void StageLoop::store_events(RepEvents& r, int rep) {
  const size_t base = static_cast<size_t>(rep - cfg_.warmup) * items * kNumEvents;
  for (int i = 0; i < items; ++i) {
    for (int k = 0; k < kNumEvents; ++k) {
      if (event_present(k, r.has_recv[i], r.has_send[i])) rec_.events[base + static_cast<size_t>(i) * kNumEvents + k] = r.at(i, k).time_s();
    }
  }
}

void StageLoop::finish() {
  rec_.timed_wall_s = monotonic_s() - wall0_;
  rec_.expert_tokens = stage_.expert_tokens();
  rec_.compute_lane_cpu_s = compute_lane_->cpu_time_s() - cpu0_[0];
  rec_.recv_lane_cpu_s = recv_lane_owned_ ? recv_lane_owned_->cpu_time_s() - cpu0_[1] : 0.0;
  rec_.send_lane_cpu_s = send_lane_owned_ ? send_lane_owned_->cpu_time_s() - cpu0_[2] : 0.0;
  if (last) {
    rec_.tokens = token_log_;  // [t][g][B] in item order; reorder to [g][t][B]
    for (int g = 0; g < M; ++g)
      for (int t = 0; t < steps; ++t)
        for (int b = 0; b < B; ++b)
          rec_.tokens[(static_cast<size_t>(g) * steps + t) * B + b] = token_log_[(static_cast<size_t>(t) * M + g) * B + b];
    rec_.checksum = stage_.checksum();
  }
  // Reorder events from item order [rep][t][g] to the file's [rep][g][t].
  std::vector<double> ordered(rec_.events.size(), std::numeric_limits<double>::quiet_NaN());
  for (int r = 0; r < cfg_.iters; ++r)
    for (int t = 0; t < steps; ++t)
      for (int g = 0; g < M; ++g)
        for (int k = 0; k < kNumEvents; ++k)
          ordered[((static_cast<size_t>(r) * M + g) * steps + t) * kNumEvents + k] =
              rec_.events[((static_cast<size_t>(r) * items) + t * M + g) * kNumEvents + k];
  rec_.events = std::move(ordered);
}

}  // namespace

StageRecord run_pipeline(Device& device, Transport& transport, StageExecutor& stage,
                         const StagePlacement& place, const PipelineConfig& cfg,
                         const std::function<void(int, int)>& progress) {
  StageLoop loop(device, transport, stage, place, cfg);
  return loop.run(progress);
}

}  // namespace ppb
