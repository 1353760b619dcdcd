// Unit tests of src/profile/profiler on the CPU device: what profile_model returns for a small
// model, and that time_forwards times the enqueued work only, not the host enqueueing it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/device.h"
#include "common/error.h"
#include "backend/lane_hold.h"
#include "model/model_spec.h"
#include "profile/profiler.h"

namespace ppb {
namespace {

/// A stage whose forward is slow to enqueue on the host (enqueue_ms) and then runs for run_ms
/// on the lane: a launch-bound GPU forward in miniature.
class SlowEnqueueStage final : public StageExecutor {
 public:
  SlowEnqueueStage(double enqueue_ms, double run_ms) : enqueue_ms_(enqueue_ms), run_ms_(run_ms) {}
  int first_unit() const override { return 0; }
  int last_unit() const override { return 0; }
  size_t input_bytes(int) const override { return 4; }
  size_t output_bytes(int) const override { return 4; }
  size_t ragged_input_bytes(int) const override { return 4; }
  size_t ragged_output_bytes(int, int) const override { return 4; }
  void enqueue_forward_ragged(Lane&, const void*, void*, int, const RaggedStep&) override {
    throw InternalError("SlowEnqueueStage runs no ragged forward");
  }
  void enqueue_forward(Lane& lane, const void*, void*, int, int, int) override {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(enqueue_ms_));
    const double run = run_ms_;
    lane.host_task([run] { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(run)); });
  }
  double checksum() const override { return 0.0; }
  void reset_checksum() override {}
  size_t weight_bytes() const override { return 0; }
  size_t kv_cache_bytes() const override { return 0; }
  size_t launches_per_forward(int) const override { return launches_; }
  void set_launches(size_t n) { launches_ = n; }

 private:
  double enqueue_ms_, run_ms_;
  size_t launches_ = 0;
};

/// A lane that counts its host tasks (a hold is one, the stage's work another).
class CountingLane final : public Lane {
 public:
  explicit CountingLane(std::unique_ptr<Lane> inner) : inner_(std::move(inner)) {}
  const std::string& name() const override { return inner_->name(); }
  void record(Event& ev) override { inner_->record(ev); }
  void wait(const Event& ev) override { inner_->wait(ev); }
  void host_task(std::function<void()> fn) override {
    ++host_tasks;
    inner_->host_task(std::move(fn));
  }
  void copy(void* dst, const void* src, size_t bytes) override { inner_->copy(dst, src, bytes); }
  void synchronize() override { inner_->synchronize(); }
  double cpu_time_s() const override { return inner_->cpu_time_s(); }
  int host_tasks = 0;

 private:
  std::unique_ptr<Lane> inner_;
};

TEST(Profiler, TimesTheEnqueuedWorkNotTheEnqueueing) {
  // 40 ms of host enqueueing, 20 ms of lane work: the profile must say ~20 ms (the lane is held
  // until the forward is enqueued), not ~60 ms (timed while being enqueued).
  auto dev = create_cpu_device(1);
  auto lane = dev->create_lane("profile");
  SlowEnqueueStage stage(40.0, 20.0);
  auto in = dev->allocate(4), out = dev->allocate(4);
  const auto ms = time_forwards(*dev, *lane, stage, in->data(), out->data(), 0, 1, 1, 3);
  ASSERT_EQ(ms.size(), 3u);
  for (double t : ms) {
    EXPECT_GE(t, 19.0);
    EXPECT_LT(t, 40.0) << "timed the host's enqueueing";
  }
}

/// A forward of more launches than a device queue holds is not held (a held CUDA stream would
/// block the launching thread behind its own hold: a deadlock); a small one is.
TEST(Profiler, HoldsOnlyForwardsThatFitTheLaunchQueue) {
  auto dev = create_cpu_device(1);
  SlowEnqueueStage stage(0.0, 1.0);
  auto in = dev->allocate(4), out = dev->allocate(4);
  for (size_t launches : {size_t{0}, size_t{11}, kMaxHeldLaunches, kMaxHeldLaunches + 1, size_t{2389}}) {
    stage.set_launches(launches);
    CountingLane lane(dev->create_lane("profile"));
    const int warmup = 1, iters = 3;
    time_forwards(*dev, lane, stage, in->data(), out->data(), 0, 1, warmup, iters);
    const bool held = launches <= kMaxHeldLaunches;
    // One host task per forward (the stage's work), plus one hold per timed forward when held.
    EXPECT_EQ(lane.host_tasks, warmup + iters + (held ? iters : 0)) << launches << " launches";
  }
}

/// The together pass: the align callback runs once before every timed forward (not the
/// warm-ups), after that forward's cache flush finished and before its start event.
TEST(Profiler, AlignRunsBeforeEachTimedForward) {
  auto dev = create_cpu_device(1);
  SlowEnqueueStage stage(0.0, 1.0);
  auto in = dev->allocate(4), out = dev->allocate(4);
  CountingLane lane(dev->create_lane("profile"));
  int calls = 0, tasks_at_first_call = -1;
  const int warmup = 2, iters = 4;
  time_forwards(*dev, lane, stage, in->data(), out->data(), 0, 1, warmup, iters, 0, [&] {
    if (calls++ == 0) tasks_at_first_call = lane.host_tasks;
  });
  EXPECT_EQ(calls, iters);
  EXPECT_EQ(tasks_at_first_call, warmup);  // the warm-ups ran first, the timed forward not yet
}

/// The profile shapes the tiny-llama tests share: B=2, P=8, G=5 (decode contexts 8, 10, 12), one
/// warm-up, `iters` timed forwards.
ProfileConfig tiny_llama_config(int iters) {
  ProfileConfig cfg;
  cfg.work.batch = 2;
  cfg.work.prompt_len = 8;
  cfg.work.gen_len = 5;
  cfg.num_contexts = 3;
  cfg.warmup = 1;
  cfg.iters = iters;
  return cfg;
}

TEST(Profiler, ProfilesEveryUnitOfTinyLlama) {
  const model::ModelSpec m = model::load_model_config(PPB_SOURCE_DIR "/tests/data/tiny-llama.json");
  auto dev = create_cpu_device(1);
  ProfileConfig cfg = tiny_llama_config(3);
  int calls = 0;
  const ProfileResult r = profile_model(*dev, m, cfg, [&](int, int, const std::string&) { ++calls; });
  EXPECT_EQ(calls, static_cast<int>(m.signatures.size()) + 1);  // one per signature, then "done"
  // Contexts evenly spaced over the positions decode writes: P + (G-1)*i/(C-1).
  EXPECT_EQ(r.decode_contexts, (std::vector<int>{8, 10, 12}));
  const size_t U = static_cast<size_t>(m.num_units());
  ASSERT_EQ(r.prefill_ms.size(), U);
  ASSERT_EQ(r.decode_context_ms.size(), U * 3);
  for (size_t u = 0; u < U; ++u) {
    SCOPED_TRACE(m.units[u].name);
    EXPECT_GT(r.prefill_min_ms[u], 0.0);
    EXPECT_LE(r.prefill_min_ms[u], r.prefill_ms[u]);
    EXPECT_LE(r.prefill_ms[u], r.prefill_max_ms[u]);
    EXPECT_GT(r.decode_min_ms[u], 0.0);
    EXPECT_LE(r.decode_min_ms[u], r.decode_ms[u]);
    EXPECT_LE(r.decode_ms[u], r.decode_max_ms[u]);
    // decode_ms is the mean over contexts of the per-context medians.
    double mean = 0.0;
    for (size_t c = 0; c < 3; ++c) mean += r.decode_context_ms[u * 3 + c] / 3.0;
    EXPECT_NEAR(r.decode_ms[u], mean, 1e-9 * mean);
  }
  // Units of one signature share their values (profiled once).
  for (size_t a = 0; a < U; ++a)
    for (size_t b = a + 1; b < U; ++b)
      if (m.units[a].signature == m.units[b].signature) EXPECT_EQ(r.prefill_ms[a], r.prefill_ms[b]);
}

/// The grid's timed passes each take their own order (issue 47: in grid order a slow stretch of
/// the machine kept the same consecutive steps slow in every pass, and their medians with it):
/// every pass a permutation, the passes different, the same for the same seed (the ranks' aligned
/// forwards must time the same step). The grid on tiny-llama: a median per signature and step.
TEST(Profiler, GridPassesTakeSeededOrders) {
  const std::size_t N = 28;
  std::vector<std::vector<std::size_t>> orders;
  for (int pass = 0; pass < 5; ++pass) {
    orders.push_back(grid_pass_order(N, 1234, pass));
    std::vector<std::size_t> sorted = orders.back();
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < N; ++i) ASSERT_EQ(sorted[i], i) << "pass " << pass;
    EXPECT_EQ(orders.back(), grid_pass_order(N, 1234, pass));
  }
  for (int a = 0; a < 5; ++a)
    for (int b = a + 1; b < 5; ++b) EXPECT_NE(orders[a], orders[b]) << a << " " << b;
  EXPECT_NE(grid_pass_order(N, 1235, 0), orders[0]);

  const model::ModelSpec m = model::load_model_config(PPB_SOURCE_DIR "/tests/data/tiny-llama.json");
  auto dev = create_cpu_device(1);
  const ProfileConfig cfg = tiny_llama_config(3);
  const auto grid = stepcost::plan_grid(step_grid_spec(cfg, cfg.work.batch * cfg.work.prompt_len));
  const StepGridResult r = profile_grid(*dev, m, cfg, grid);
  ASSERT_EQ(r.ms.size(), m.signatures.size() * grid.size());
  for (double v : r.ms) EXPECT_GT(v, 0.0);
}

/// The units built once and profiled twice: each profile shaped as profile_model's (the same
/// contexts, a value per unit, units of one signature sharing theirs), fastest <= median <=
/// slowest; the memory it holds is its signatures' stage bytes; a config of other decode
/// contexts is refused rather than timed at the wrong KV-cache lengths.
TEST(Profiler, ResidentProfilerProfilesItsUnitsAgain) {
  const model::ModelSpec m = model::load_model_config(PPB_SOURCE_DIR "/tests/data/tiny-llama.json");
  auto dev = create_cpu_device(1);
  ProfileConfig cfg = tiny_llama_config(3);
  const ProfileResult once = profile_model(*dev, m, cfg);
  size_t bytes = 0;
  StageConfig sc;
  sc.work = cfg.work;
  sc.work.groups = 1;
  for (int example : m.signature_example) bytes += dev->stage_bytes(m, example, example, sc).total();
  EXPECT_EQ(ResidentProfiler::bytes(*dev, m, cfg), bytes);
  ResidentProfiler resident(*dev, m, cfg);
  const size_t U = static_cast<size_t>(m.num_units());
  for (int cycle = 0; cycle < 2; ++cycle) {
    SCOPED_TRACE(cycle);
    const ProfileResult r = resident.profile(cfg);
    EXPECT_EQ(r.decode_contexts, once.decode_contexts);
    ASSERT_EQ(r.prefill_ms.size(), U);
    ASSERT_EQ(r.decode_ms.size(), U);
    ASSERT_EQ(r.decode_context_ms.size(), once.decode_context_ms.size());
    for (size_t u = 0; u < U; ++u) {
      EXPECT_GT(r.prefill_min_ms[u], 0.0);
      EXPECT_LE(r.prefill_min_ms[u], r.prefill_ms[u]);
      EXPECT_LE(r.prefill_ms[u], r.prefill_max_ms[u]);
      EXPECT_LE(r.decode_min_ms[u], r.decode_ms[u]);
      EXPECT_LE(r.decode_ms[u], r.decode_max_ms[u]);
      for (size_t v = 0; v < U; ++v)
        if (m.units[u].signature == m.units[v].signature) EXPECT_EQ(r.decode_ms[u], r.decode_ms[v]);
    }
  }
  ProfileConfig other = cfg;
  other.work.gen_len = 9;  // contexts 8, 12, 16
  EXPECT_THROW(resident.profile(other), InternalError);
}

/// A forward's fixed cost (issue 47): tiny Llama's first layer (unit 1, whose successor has its
/// signature) as a one-layer stage and a two-layer stage, `pairs` per kind, every forward
/// aligned; a two-layer forward takes longer than a one-layer one (median over the pairs); the
/// memory is the two stages'; two windows join per kind, window a's pairs first.
TEST(Profiler, FixedCostTimesOneLayerAgainstTwoAndJoinsWindowsPerKind) {
  const model::ModelSpec m = model::load_model_config(PPB_SOURCE_DIR "/tests/data/tiny-llama.json");
  auto dev = create_cpu_device(1);
  ProfileConfig cfg = tiny_llama_config(3);
  int aligned = 0;
  cfg.align = [&aligned] { ++aligned; };
  ASSERT_EQ(fixed_cost_unit(m), 1);
  StageConfig sc;
  sc.work = cfg.work;
  sc.work.groups = 1;
  EXPECT_EQ(fixed_cost_bytes(*dev, m, cfg), dev->stage_bytes(m, 1, 1, sc).total() + dev->stage_bytes(m, 1, 2, sc).total());
  const FixedCostTiming t = time_fixed_cost(*dev, m, cfg, 5);
  EXPECT_EQ(t.unit, 1);
  ASSERT_EQ(t.one_ms.size(), 10u);
  ASSERT_EQ(t.two_ms.size(), 10u);
  EXPECT_EQ(aligned, 20);  // every timed forward
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<double> one(t.one_ms.begin() + 5 * kind, t.one_ms.begin() + 5 * kind + 5);
    std::vector<double> two(t.two_ms.begin() + 5 * kind, t.two_ms.begin() + 5 * kind + 5);
    for (double v : one) EXPECT_GT(v, 0.0);
    std::sort(one.begin(), one.end());
    std::sort(two.begin(), two.end());
    EXPECT_GT(two[2], one[2]) << kind;
  }
  EXPECT_EQ(time_fixed_cost(*dev, m, cfg, 0).unit, -1);
  // Windows: per kind, a's pairs then b's.
  FixedCostTiming a, b;
  a.unit = b.unit = 1;
  a.one_ms = {1, 2, 3, 4}, a.two_ms = {10, 20, 30, 40};  // [kind][2 pairs]
  b.one_ms = {5, 6, 7, 8}, b.two_ms = {50, 60, 70, 80};
  const FixedCostTiming j = join_fixed_windows(a, b);
  EXPECT_EQ(j.unit, 1);
  EXPECT_EQ(j.one_ms, (std::vector<double>{1, 2, 5, 6, 3, 4, 7, 8}));
  EXPECT_EQ(j.two_ms, (std::vector<double>{10, 20, 50, 60, 30, 40, 70, 80}));
  b.unit = 2;
  EXPECT_EQ(join_fixed_windows(a, b).unit, -1);  // another unit
  b.unit = 1;
  b.one_ms.pop_back();
  EXPECT_EQ(join_fixed_windows(a, b).unit, -1);  // another shape
  EXPECT_EQ(join_fixed_windows(FixedCostTiming{}, a).unit, -1);
}

/// The interleaved cycle (issue 13): `enter` is asked for every turn of every iteration, in an
/// order rotated by one per iteration; a together turn aligns each of its timed forwards (one
/// per signature's prefill and per decode context); each result is shaped as profile()'s, its
/// decode the mean of its contexts' medians, fastest <= median <= slowest; a rank that timed no
/// alone turn gets an empty alone result; bad turns and other contexts are refused.
TEST(Profiler, InterleavedCycleTakesTurnsForwardByForward) {
  const model::ModelSpec m = model::load_model_config(PPB_SOURCE_DIR "/tests/data/tiny-llama.json");
  auto dev = create_cpu_device(1);
  ProfileConfig cfg = tiny_llama_config(4);
  int aligned = 0;
  cfg.align = [&] { ++aligned; };
  ResidentProfiler resident(*dev, m, cfg);
  const ProfileResult once = resident.profile(cfg);
  using Turn = ResidentProfiler::Turn;
  std::vector<int> order;
  aligned = 0;
  const auto [alone, together] = resident.profile_interleaved(cfg, 3, [&](int t) {
    order.push_back(t);
    return t == 0 ? Turn::alone : t == 1 ? Turn::wait : Turn::together;
  });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2}));
  const int items = static_cast<int>(m.signatures.size()) * (1 + 3);
  EXPECT_EQ(aligned, cfg.iters * items);  // the together turns' forwards only
  const size_t U = static_cast<size_t>(m.num_units());
  for (const ProfileResult* r : {&alone, &together}) {
    EXPECT_EQ(r->decode_contexts, once.decode_contexts);
    ASSERT_EQ(r->prefill_ms.size(), U);
    ASSERT_EQ(r->decode_context_ms.size(), U * 3);
    for (size_t u = 0; u < U; ++u) {
      EXPECT_GT(r->prefill_min_ms[u], 0.0);
      EXPECT_LE(r->prefill_min_ms[u], r->prefill_ms[u]);
      EXPECT_LE(r->prefill_ms[u], r->prefill_max_ms[u]);
      double sum = 0.0;
      for (size_t c = 0; c < 3; ++c) {
        const double d = r->decode_context_ms[u * 3 + c];
        EXPECT_LE(r->decode_min_ms[u], d);
        EXPECT_LE(d, r->decode_max_ms[u]);
        sum += d;
      }
      EXPECT_DOUBLE_EQ(r->decode_ms[u], sum / 3.0);
      for (size_t v = 0; v < U; ++v)
        if (m.units[u].signature == m.units[v].signature) EXPECT_EQ(r->prefill_ms[u], r->prefill_ms[v]);
    }
  }
  const auto waited = resident.profile_interleaved(cfg, 2, [](int t) { return t == 0 ? Turn::wait : Turn::together; });
  EXPECT_TRUE(waited.first.decode_contexts.empty());
  EXPECT_TRUE(waited.first.prefill_ms.empty());
  EXPECT_EQ(waited.second.prefill_ms.size(), U);
  EXPECT_THROW(resident.profile_interleaved(cfg, 0, [](int) { return Turn::alone; }), InternalError);
  ProfileConfig other = cfg;
  other.work.gen_len = 9;
  EXPECT_THROW(resident.profile_interleaved(other, 1, [](int) { return Turn::alone; }), InternalError);
}

}  // namespace
}  // namespace ppb
