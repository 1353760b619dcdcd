#include "pipeline/pipeline.h"

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

}  // namespace

StageRecord run_pipeline(Device& device, Transport& transport, StageExecutor& stage,
                         const StagePlacement& place, const PipelineConfig& cfg,
                         const std::function<void(int, int)>& progress) {
  const int M = cfg.work.groups, G = cfg.work.gen_len, P = cfg.work.prompt_len, B = cfg.work.batch;
  const int S = place.num_stages, s = place.stage;
  const bool first = s == 0, last = s == S - 1;
  const int steps = G + 1;
  const int items = M * steps;

  // ---- buffers (declared before the lanes: lanes are destroyed, and drained, first) ----------------------------------------------------------------------------
  const size_t in_max = stage.input_bytes(P);
  const size_t out_max = stage.output_bytes(P);
  std::vector<std::unique_ptr<Buffer>> recv_slot(kRing), out_slot(kRing);
  for (int r = 0; r < kRing; ++r) {
    recv_slot[r] = device.allocate(in_max);
    out_slot[r] = device.allocate(out_max);
  }
  // Stage 0's decode input is the group's own token buffer: written by the token return (or,
  // with one stage, copied from the output), read by the group's next step. Receiving into it
  // rather than into a ring slot keeps the return path free of the ring's back-pressure: a ring
  // slot is freed by a compute that may itself wait on this very return, a deadlock once the
  // transport needs the receive posted (NCCL always, MPI above the eager limit) and M > 2.
  std::vector<std::unique_ptr<Buffer>> prompt(first ? M : 0), group_tokens(first ? M : 0);
  // The last stage returns each group's token from a buffer of that group's own, for the same
  // reason: a ring slot would make its compute wait for a return that waits for stage 0.
  std::vector<std::unique_ptr<Buffer>> return_tokens(last && S > 1 ? M : 0);
  for (auto& b : return_tokens) b = device.allocate(static_cast<size_t>(B) * sizeof(int32_t));
  if (first) {
    std::vector<int32_t> host(static_cast<size_t>(B) * P);
    for (int g = 0; g < M; ++g) {
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < P; ++t) host[static_cast<size_t>(b) * P + t] = prompt_token(cfg.work.seed, g, b, t, cfg.vocab);
      prompt[g] = device.allocate(host.size() * sizeof(int32_t));
      prompt[g]->upload(host.data(), host.size() * sizeof(int32_t));
      group_tokens[g] = device.allocate(static_cast<size_t>(B) * sizeof(int32_t));
    }
  }

  // The last stage's sampled tokens of every item of a repetition, [item][B], kept in device
  // memory and downloaded once after the repetition: a copy into host memory between
  // compute_start and compute_end would put a host round trip into every item's compute time
  // (CUDA stages a pageable destination through a host task the stream waits for).
  std::unique_ptr<Buffer> token_log_dev = last ? device.allocate(static_cast<size_t>(items) * B * sizeof(int32_t)) : nullptr;
  std::vector<int32_t> token_log(last ? static_cast<size_t>(items) * B : 0);

  // ---- lanes ------------------------------------------------------------------------------
  auto compute_lane = device.create_lane("compute");
  std::unique_ptr<Lane> recv_lane_owned, send_lane_owned;
  Lane* recv_lane = compute_lane.get();
  Lane* send_lane = compute_lane.get();
  if (cfg.mode == LaneMode::overlap) {
    recv_lane_owned = device.create_lane("recv");
    recv_lane = recv_lane_owned.get();
  }
  // The last stage's token return keeps a lane of its own in every mode: a blocking return on
  // the compute lane would close the ring stage 0 -> ... -> last -> stage 0 into a deadlock
  // whenever the transport needs the receiver to be posted (NCCL always, MPI for large
  // messages). It carries B int32 per step, so it hides nothing worth measuring.
  if (cfg.mode == LaneMode::overlap || (last && S > 1)) {
    send_lane_owned = device.create_lane("send");
    send_lane = send_lane_owned.get();
  }

  // ---- links: made before the first message (NCCL: one communicator per direction) ------
  {
    const int me = place.rank;
    std::vector<std::pair<int, int>> links;
    if (place.prev_rank >= 0) links.emplace_back(place.prev_rank, me);
    for (int r : place.next_ranks) links.emplace_back(me, r);
    if (S > 1 && first) links.emplace_back(place.last_rank, me);  // the token return
    if (S > 1 && last)
      for (int r : place.return_ranks) links.emplace_back(me, r);
    std::sort(links.begin(), links.end());
    links.erase(std::unique(links.begin(), links.end()), links.end());
    transport.connect(links);
  }

  StageRecord rec;
  const int reps = cfg.warmup + cfg.iters;
  const InjectedFault fault = injected_fault(place.rank);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  rec.events.assign(static_cast<size_t>(cfg.iters) * items * kNumEvents, nan);
  double cpu0[3] = {0, 0, 0};
  double wall0 = 0.0;

  auto describe_stage = [&] {
    std::ostringstream os;
    os << "stage " << s << " (units " << stage.first_unit() << ".." << stage.last_unit() << ")";
    return os.str();
  };

  for (int rep = 0; rep < reps; ++rep) {
    const bool timed = rep >= cfg.warmup;
    std::vector<std::unique_ptr<Event>> ev(static_cast<size_t>(items) * kNumEvents);
    for (auto& e : ev) e = device.create_event();
    std::vector<bool> has_recv(items, false), has_send(items, false);
    stage.reset_checksum();

    // Barrier through the transport: polled, bounded by --timeout, never a hang.
    transport.enqueue_barrier(*compute_lane);
    try {
      compute_lane->synchronize();
    } catch (const std::exception& e) {
      request_lane_abort();
      throw InternalError(describe_stage() + ", start of repetition " + std::to_string(rep) + ": " + e.what());
    }
    if (timed && rep == cfg.warmup) {
      cpu0[0] = compute_lane->cpu_time_s();
      cpu0[1] = recv_lane_owned ? recv_lane_owned->cpu_time_s() : 0.0;
      cpu0[2] = send_lane_owned ? send_lane_owned->cpu_time_s() : 0.0;
      wall0 = monotonic_s();
    }
    if (timed) rec.rep_start_s.push_back(monotonic_s());

    for (int i = 0; i < items; ++i) {
      const int t = i / M, g = i % M;
      const int T = t == 0 ? P : 1;
      const int pos = t == 0 ? 0 : P + t - 1;
      const int slot = i % kRing;
      Event& recv_start = *ev[i * kNumEvents + kRecvStart];
      Event& recv_end = *ev[i * kNumEvents + kRecvEnd];
      Event& compute_start = *ev[i * kNumEvents + kComputeStart];
      Event& compute_end = *ev[i * kNumEvents + kComputeEnd];
      Event& send_start = *ev[i * kNumEvents + kSendStart];
      Event& send_end = *ev[i * kNumEvents + kSendEnd];

      // Input: the prompt, the group's own last token (1 stage), or a message.
      const void* in = nullptr;
      if (first && t == 0) {
        in = prompt[g]->data();
      } else if (first && S == 1) {
        in = group_tokens[g]->data();
      } else {
        const int peer = first ? place.last_rank : place.prev_rank;
        const size_t bytes = stage.input_bytes(T);
        void* dst = first ? group_tokens[g]->data() : recv_slot[slot]->data();
        // The buffer must have been consumed: the group's previous decode step on stage 0 (its
        // prefill reads the prompt instead), the item two back in the ring elsewhere.
        if (first) {
          if (t >= 2) recv_lane->wait(*ev[(i - M) * kNumEvents + kComputeEnd]);
        } else if (i >= kRing) {
          recv_lane->wait(*ev[(i - kRing) * kNumEvents + kComputeEnd]);
        }
        recv_lane->record(recv_start);
        // Tags name the producing item: stage 0's decode input is the token of the group's
        // previous step, item i - M.
        const int tag = item_tag(first ? i - M : i);
        transport.enqueue_recv(*recv_lane, dst, bytes, peer, tag);
        recv_lane->record(recv_end);
        compute_lane->wait(recv_end);
        in = dst;
        has_recv[i] = true;
      }

      if (fault.active && timed && rep == cfg.warmup && i == fault.item) {
        // Injected fault (tests): this rank stops answering, as a stuck process would.
        compute_lane->host_task([] {
          while (!lane_abort_requested()) {
            timespec ts{0, 100000000};
            nanosleep(&ts, nullptr);
          }
        });
      }
      // Compute: the output buffer must have been sent (if it was) before it is overwritten.
      void* out = out_slot[slot]->data();
      if (last && S > 1) {
        out = return_tokens[g]->data();
        if (i >= M && has_send[i - M]) compute_lane->wait(*ev[(i - M) * kNumEvents + kSendEnd]);
      } else if (i >= kRing && has_send[i - kRing]) {
        compute_lane->wait(*ev[(i - kRing) * kNumEvents + kSendEnd]);
      }
      stage.prepare_forward(g, pos, T);  // a first decode graph's capture: before, not inside, the timing
      compute_lane->record(compute_start);
      stage.enqueue_forward(*compute_lane, in, out, g, pos, T);
      if (last)
        compute_lane->copy(static_cast<int32_t*>(token_log_dev->data()) + static_cast<size_t>(i) * B, out,
                           B * sizeof(int32_t));
      if (first && S == 1 && t < G) compute_lane->copy(group_tokens[g]->data(), out, B * sizeof(int32_t));
      compute_lane->record(compute_end);

      // Send: activations to the next stage, or tokens back to stage 0 (not after the last
      // step); to each receiver this rank serves (layout_placement), none for some ranks of a
      // stage wider than the next.
      const std::vector<int>& peers = last ? place.return_ranks : place.next_ranks;
      if ((!last || (S > 1 && t < G)) && !peers.empty()) {
        send_lane->wait(compute_end);
        send_lane->record(send_start);
        for (int peer : peers) transport.enqueue_send(*send_lane, out, stage.output_bytes(T), peer, item_tag(i));
        send_lane->record(send_end);
        has_send[i] = true;
      }
      if (cfg.mode == LaneMode::serialized) {
        // One item in the whole pipeline at a time: every rank meets after its part of item i.
        // Wait for an activation send (the next stage receives it before the barrier), but not
        // for a token return: stage 0 posts that receive only at the group's next step, after
        // more barriers, so waiting here deadlocks once the return is a rendezvous (B >~ 1000
        // tokens over Open MPI's 4 KB eager limit, or NCCL).
        if (has_send[i] && !last && send_lane != compute_lane.get()) compute_lane->wait(send_end);
        transport.enqueue_barrier(*compute_lane);
      }
    }

    try {
      compute_lane->synchronize();
      if (recv_lane_owned) recv_lane_owned->synchronize();
      if (send_lane_owned) send_lane_owned->synchronize();
    } catch (const std::exception& e) {
      request_lane_abort();  // let every lane of this rank drain before the buffers go
      throw InternalError(describe_stage() + ", repetition " + std::to_string(rep) + ": " + e.what());
    }

    if (last) token_log_dev->download(token_log.data(), token_log.size() * sizeof(int32_t));
    if (timed) {
      const size_t base = static_cast<size_t>(rep - cfg.warmup) * items * kNumEvents;
      for (int i = 0; i < items; ++i) {
        for (int k = 0; k < kNumEvents; ++k) {
          bool present = (k <= kRecvEnd) ? has_recv[i] : (k >= kSendStart ? has_send[i] : true);
          if (present) rec.events[base + static_cast<size_t>(i) * kNumEvents + k] = ev[i * kNumEvents + k]->time_s();
        }
      }
    }
    if (progress) progress(rep + 1, reps);
  }

  rec.timed_wall_s = monotonic_s() - wall0;
  rec.expert_tokens = stage.expert_tokens();
  rec.compute_lane_cpu_s = compute_lane->cpu_time_s() - cpu0[0];
  rec.recv_lane_cpu_s = recv_lane_owned ? recv_lane_owned->cpu_time_s() - cpu0[1] : 0.0;
  rec.send_lane_cpu_s = send_lane_owned ? send_lane_owned->cpu_time_s() - cpu0[2] : 0.0;
  if (last) {
    rec.tokens = token_log;  // [t][g][B] in item order; reorder to [g][t][B]
    for (int g = 0; g < M; ++g)
      for (int t = 0; t < steps; ++t)
        for (int b = 0; b < B; ++b)
          rec.tokens[(static_cast<size_t>(g) * steps + t) * B + b] = token_log[(static_cast<size_t>(t) * M + g) * B + b];
    rec.checksum = stage.checksum();
  }
  // Reorder events from item order [rep][t][g] to the file's [rep][g][t].
  std::vector<double> ordered(rec.events.size(), nan);
  for (int r = 0; r < cfg.iters; ++r)
    for (int t = 0; t < steps; ++t)
      for (int g = 0; g < M; ++g)
        for (int k = 0; k < kNumEvents; ++k)
          ordered[((static_cast<size_t>(r) * M + g) * steps + t) * kNumEvents + k] =
              rec.events[((static_cast<size_t>(r) * items) + t * M + g) * kNumEvents + k];
  rec.events = std::move(ordered);
  return rec;
}

}  // namespace ppb
