// The pipelined loop across ranks: its tokens and checksum equal a 1-rank sequential run of
// the same model, in every lane mode.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <functional>
#include <map>
#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "backend/tensor_parallel.h"
#include "balance/partition.h"
#include "common/error.h"
#include "model/model_spec.h"
#include "mpi_test_main.h"
#include "pipeline/pipeline.h"
#include "transport/transport.h"

namespace ppb {
namespace {

struct Reference {
  std::vector<int32_t> tokens;  // [M][G+1][B]
  double checksum = 0;
};

/// Sequential generation on one executor holding every unit: the "1-rank run".
Reference sequential_run(Device& device, const model::ModelSpec& m, const PipelineConfig& cfg) {
  StageConfig sc{cfg.work};  // f32, KV capacity P + G
  auto stage = device.create_stage(m, 0, m.num_units() - 1, sc);
  auto lane = device.create_lane("ref");
  const int B = cfg.work.batch, P = cfg.work.prompt_len, steps = cfg.work.gen_len + 1;
  Reference ref;
  ref.tokens.resize(static_cast<size_t>(cfg.work.groups) * steps * B);
  stage->reset_checksum();
  for (int g = 0; g < cfg.work.groups; ++g) {
    std::vector<int32_t> prompt(static_cast<size_t>(B) * P), tok(B);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < P; ++t) prompt[b * P + t] = prompt_token(cfg.work.seed, g, b, t, cfg.vocab);
    stage->enqueue_forward(*lane, prompt.data(), tok.data(), g, 0, P);
    lane->synchronize();
    for (int t = 0; t < steps; ++t) {
      if (t > 0) {
        std::vector<int32_t> in = tok;
        stage->enqueue_forward(*lane, in.data(), tok.data(), g, P + t - 1, 1);
        lane->synchronize();
      }
      std::copy(tok.begin(), tok.end(), ref.tokens.begin() + (static_cast<size_t>(g) * steps + t) * B);
    }
  }
  ref.checksum = stage->checksum();
  return ref;
}

/// The MPI transport plus NCCL's connection discipline: connect() blocks on each link until
/// its other end calls it too (as ncclCommInitRank does), and a message on a link that was not
/// connected first is an error. Proves the pipeline connects every link it uses, ahead of time,
/// in an order that cannot deadlock.
class RendezvousTransport final : public Transport {
 public:
  explicit RendezvousTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "rendezvous(" + inner_->name() + ")"; }
  void connect(const std::vector<std::pair<int, int>>& links) override {
    if (!std::is_sorted(links.begin(), links.end())) throw std::runtime_error("connect: links not sorted");
    for (const auto& [src, dst] : links) {
      const int me = test::mpi().rank(), peer = me == src ? dst : src;
      char out = 1, in = 0;  // blocking exchange: both ends must be here
      MPI_Sendrecv(&out, 1, MPI_CHAR, peer, 999, &in, 1, MPI_CHAR, peer, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      connected_.emplace(src, dst);
    }
  }
  void enqueue_send(Lane& lane, const void* buf, size_t bytes, int peer, int tag) override {
    require({test::mpi().rank(), peer});
    inner_->enqueue_send(lane, buf, bytes, peer, tag);
  }
  void enqueue_recv(Lane& lane, void* buf, size_t bytes, int peer, int tag) override {
    require({peer, test::mpi().rank()});
    inner_->enqueue_recv(lane, buf, bytes, peer, tag);
  }
  void enqueue_barrier(Lane& lane) override { inner_->enqueue_barrier(lane); }
  const std::set<std::pair<int, int>>& connected() const { return connected_; }

 private:
  void require(std::pair<int, int> link) const {
    if (!connected_.count(link))
      throw std::runtime_error("message on link " + std::to_string(link.first) + "->" + std::to_string(link.second) +
                               " before connect()");
  }
  std::unique_ptr<Transport> inner_;
  std::set<std::pair<int, int>> connected_;
};

/// Memory ranges of the buffers a device allocated.
struct BufferRanges {
  std::vector<std::pair<const char*, const char*>> ranges;
  bool contains(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    return std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) { return c >= r.first && c + bytes <= r.second; });
  }
};

/// A lane that counts copies from or to memory outside the device's buffers.
class CheckedLane final : public Lane {
 public:
  CheckedLane(std::unique_ptr<Lane> inner, std::shared_ptr<BufferRanges> buffers, std::shared_ptr<int> outside)
      : inner_(std::move(inner)), buffers_(std::move(buffers)), outside_(std::move(outside)) {}
  const std::string& name() const override { return inner_->name(); }
  void record(Event& ev) override { inner_->record(ev); }
  void wait(const Event& ev) override { inner_->wait(ev); }
  void host_task(std::function<void()> fn) override { inner_->host_task(std::move(fn)); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (!buffers_->contains(dst, bytes) || !buffers_->contains(src, bytes)) ++*outside_;
    inner_->copy(dst, src, bytes);
  }
  void synchronize() override { inner_->synchronize(); }
  double cpu_time_s() const override { return inner_->cpu_time_s(); }

 private:
  std::unique_ptr<Lane> inner_;
  std::shared_ptr<BufferRanges> buffers_;
  std::shared_ptr<int> outside_;
};

/// The CPU device, with lanes that count every lane copy from or to host memory that is not a
/// device buffer. On a GPU such a copy is a host round trip inside the stream (CUDA stages a
/// pageable destination through a host task), so the pipeline must make none: a copy of each
/// item's tokens into a host vector between compute_start and compute_end timed it as compute.
class DeviceMemoryOnly final : public Device {
 public:
  DeviceMemoryOnly() : inner_(create_cpu_device(1)) {}
  int copies_outside_buffers() const { return *outside_; }
  std::string backend() const override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  std::string bus_id() const override { return inner_->bus_id(); }
  size_t free_memory() const override { return inner_->free_memory(); }
  std::unique_ptr<Lane> create_lane(const std::string& name) override {
    return std::make_unique<CheckedLane>(inner_->create_lane(name), buffers_, outside_);
  }
  std::unique_ptr<Event> create_event() override { return inner_->create_event(); }
  std::unique_ptr<Buffer> allocate(size_t bytes) override {
    auto b = inner_->allocate(bytes);
    const char* p = static_cast<const char*>(b->data());
    buffers_->ranges.emplace_back(p, p + bytes);
    return b;
  }
  std::unique_ptr<StageExecutor> create_stage(const model::ModelSpec& model, int first, int last,
                                              const StageConfig& config) override {
    return inner_->create_stage(model, first, last, config);
  }
  StageBytes stage_bytes(const model::ModelSpec& model, int first, int last, const StageConfig& config) const override {
    return inner_->stage_bytes(model, first, last, config);
  }

 private:
  std::unique_ptr<Device> inner_;
  std::shared_ptr<BufferRanges> buffers_ = std::make_shared<BufferRanges>();
  std::shared_ptr<int> outside_ = std::make_shared<int>(0);
};

/// Runs `config` pipelined on the layout `stage_ranks` (stage k on the ranks stage_ranks[k], a
/// tensor-parallel group when there are several) and checks it against the sequential 1-rank
/// run: tokens and checksum bitwise at width 1 everywhere; with tensor parallelism the same
/// tokens and the checksum within 1e-4 relative (the all-reduces sum in another order, issue 14),
/// and then the same layout serialized gives the pipelined run's bits exactly.
void check_layout(const char* config, LaneMode mode, const std::vector<std::vector<int>>& stage_ranks, int groups = 3) {
  const auto& mpi = test::mpi();
  auto m = model::load_model_config(std::string(PPB_SOURCE_DIR) + "/tests/data/" + config);
  auto device = std::make_unique<DeviceMemoryOnly>();
  auto transport = std::make_unique<RendezvousTransport>(create_mpi_transport(mpi, {}));
  const int S = static_cast<int>(stage_ranks.size());
  PipelineConfig cfg;
  cfg.work.batch = 2;
  cfg.work.prompt_len = 5;
  cfg.work.gen_len = 4;
  cfg.work.groups = groups;
  cfg.warmup = 1;
  cfg.iters = 2;
  cfg.work.seed = 77;
  cfg.vocab = m.vocab;
  cfg.mode = mode;
  auto part = balance::solve_uniform(m.num_units(), S);
  const StagePlacement place = layout_placement(stage_ranks, mpi.rank());
  const int k = place.stage;
  bool tensor_parallel = false;
  for (const auto& g : stage_ranks) tensor_parallel = tensor_parallel || g.size() > 1;
  MpiPollConfig poll;
  poll.spin_us = 100;
  auto tp = create_mpi_tp_group(mpi, place.tp_width > 1 ? k : -1, place.tp_rank, poll);
  StageConfig sc{cfg.work};  // f32, KV capacity P + G
  sc.tp_width = place.tp_width;
  sc.tp_rank = place.tp_rank;
  sc.tp = tp.get();
  auto stage = device->create_stage(m, part.first_unit[k], part.last_unit[k], sc);
  auto rec = run_pipeline(*device, *transport, *stage, place, cfg);
  EXPECT_EQ(device->copies_outside_buffers(), 0) << "the pipeline copied from or to host memory inside a lane";
  // The links of this rank, all connected: from its sender in the previous stage, to its
  // receivers in the next, and the token return from the last stage to the first.
  std::set<std::pair<int, int>> links;
  if (place.prev_rank >= 0) links.emplace(place.prev_rank, mpi.rank());
  for (int r : place.next_ranks) links.emplace(mpi.rank(), r);
  if (S > 1 && k == 0) links.emplace(place.last_rank, mpi.rank());
  if (S > 1 && k == S - 1)
    for (int r : place.return_ranks) links.emplace(mpi.rank(), r);
  EXPECT_EQ(transport->connected(), links);

  const int steps = cfg.work.gen_len + 1;
  ASSERT_EQ(rec.events.size(), static_cast<size_t>(cfg.iters) * cfg.work.groups * steps * kNumEvents);
  // Every item computed; times ordered within an item.
  for (size_t i = 0; i < rec.events.size(); i += kNumEvents) {
    EXPECT_LE(rec.events[i + kComputeStart], rec.events[i + kComputeEnd]);
    if (!std::isnan(rec.events[i + kRecvEnd])) EXPECT_LE(rec.events[i + kRecvEnd], rec.events[i + kComputeStart] + 1e-9);
    if (!std::isnan(rec.events[i + kSendStart])) EXPECT_GE(rec.events[i + kSendStart], rec.events[i + kComputeEnd] - 1e-9);
  }
  StageRecord serial;
  if (tensor_parallel) {
    PipelineConfig vc = cfg;
    vc.warmup = 0;
    vc.iters = 1;
    vc.mode = LaneMode::serialized;
    serial = run_pipeline(*device, *transport, *stage, place, vc);
  }
  if (k == S - 1) {  // every rank of the last stage holds the tokens
    auto ref = sequential_run(*device, m, cfg);
    EXPECT_EQ(rec.tokens, ref.tokens);
    if (!tensor_parallel) {
      EXPECT_NEAR(rec.checksum, ref.checksum, 1e-9 * std::max(1.0, std::abs(ref.checksum)));
    } else {
      EXPECT_NEAR(rec.checksum, ref.checksum, 1e-4 * std::abs(ref.checksum));
      EXPECT_EQ(serial.tokens, rec.tokens);
      EXPECT_EQ(serial.checksum, rec.checksum);
    }
    // The tokens must not be trivially constant (the model would hide ordering bugs).
    std::vector<int32_t> sorted = ref.tokens;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 3);
  }
}

/// One stage per rank: stage k on rank k, or (reversed, as --order auto may place them) on rank S-1-k.
void check_pipeline(const char* config, LaneMode mode, int groups = 3, bool reversed = false) {
  const int S = test::mpi().size();
  std::vector<std::vector<int>> stage_ranks;
  for (int k = 0; k < S; ++k) stage_ranks.push_back({reversed ? S - 1 - k : k});
  check_layout(config, mode, stage_ranks, groups);
}

TEST(MpiPipeline, OverlapEqualsSequentialLlama) { check_pipeline("tiny-llama.json", LaneMode::overlap); }
TEST(MpiPipeline, NoOverlapEqualsSequentialLlama) { check_pipeline("tiny-llama.json", LaneMode::no_overlap); }
TEST(MpiPipeline, SerializedEqualsSequentialLlama) { check_pipeline("tiny-llama.json", LaneMode::serialized); }
TEST(MpiPipeline, OverlapEqualsSequentialGemma3) { check_pipeline("tiny-gemma3.json", LaneMode::overlap); }
// Many groups in flight (M > 2 x ring depth): the token return must not wait on the ring.
TEST(MpiPipeline, ManyGroupsNoOverlapEqualsSequential) { check_pipeline("tiny-llama.json", LaneMode::no_overlap, 11); }
TEST(MpiPipeline, ManyGroupsOverlapEqualsSequential) { check_pipeline("tiny-llama.json", LaneMode::overlap, 11); }
// Stages on the ranks in reverse order (the links then run from high to low ranks).
TEST(MpiPipeline, ReversedRanksOverlapEqualsSequential) { check_pipeline("tiny-llama.json", LaneMode::overlap, 3, true); }

// Tensor-parallel layouts (issue 14): every rank in one stage; and, on 4 ranks, stages of widths
// 2,1,1 (hand-offs 2->1, 1->1, return 1->2), 1,2,1 (1->2, 2->1, return 1->1) and 2,2.
std::vector<std::vector<std::vector<int>>> tp_layouts(int ranks) {
  std::vector<int> all(ranks);
  for (int r = 0; r < ranks; ++r) all[r] = r;
  std::vector<std::vector<std::vector<int>>> out = {{all}};
  if (ranks == 4) {
    out.push_back({{0, 1}, {2}, {3}});
    out.push_back({{0}, {1, 2}, {3}});
    out.push_back({{0, 1}, {2, 3}});
  }
  return out;
}
TEST(MpiPipeline, TensorParallelLayoutsOverlapEqualSequentialAndSerialized) {
  for (const auto& layout : tp_layouts(test::mpi().size())) check_layout("tiny-llama.json", LaneMode::overlap, layout);
}
TEST(MpiPipeline, TensorParallelLayoutsNoOverlapGemma3) {
  for (const auto& layout : tp_layouts(test::mpi().size())) check_layout("tiny-gemma3.json", LaneMode::no_overlap, layout, 5);
}

/// Who sends to whom between stages of every pair of widths the issue names (1->2, 2->1, 2->4,
/// 4->2, 4->1, and 2->2): each receiver has exactly one sender, which computed the whole
/// activation, and a sender serves ceil(b / a) receivers at most (one when a >= b).
TEST(MpiPipeline, HandOffsGiveEveryReceiverOneSender) {
  for (auto [a, b] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {2, 4}, {4, 2}, {4, 1}, {2, 2}}) {
    std::vector<std::vector<int>> layout(2);
    for (int i = 0; i < a; ++i) layout[0].push_back(i);
    for (int i = 0; i < b; ++i) layout[1].push_back(a + i);
    std::map<int, int> senders_of;  // receiver -> its sender
    for (int r = 0; r < a; ++r) {
      const StagePlacement p = layout_placement(layout, r);
      EXPECT_EQ(p.stage, 0);
      EXPECT_LE(static_cast<int>(p.next_ranks.size()), (b + a - 1) / a);
      for (int to : p.next_ranks) {
        EXPECT_EQ(senders_of.count(to), 0u) << a << "->" << b << ": rank " << to << " has two senders";
        senders_of[to] = r;
        EXPECT_EQ(layout_placement(layout, to).prev_rank, r);  // the receiver listens to its sender
      }
      EXPECT_EQ(static_cast<int>(p.return_ranks.size()), 0);  // stage 0 is not the last
      EXPECT_GE(p.last_rank, a);                               // its tokens come from stage 1
    }
    EXPECT_EQ(static_cast<int>(senders_of.size()), b) << a << "->" << b;
    // The token return, stage 1 -> stage 0: every rank of stage 0 gets the tokens once.
    std::map<int, int> returned;
    for (int r = a; r < a + b; ++r)
      for (int to : layout_placement(layout, r).return_ranks) ++returned[to];
    for (int r = 0; r < a; ++r) EXPECT_EQ(returned[r], 1) << a << "->" << b << " rank " << r;
  }
  EXPECT_THROW(layout_placement({{0, 1}, {1}}, 1), InternalError);
  EXPECT_THROW(layout_placement({{0}}, 1), InternalError);
}

}  // namespace
}  // namespace ppb
