// Unit tests of src/profile/profiler on the CPU device: what profile_model returns for a small
// model, and that time_forwards times the enqueued work only, not the host enqueueing it.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "backend/device.h"
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
  void enqueue_forward(Lane& lane, const void*, void*, int, int, int) override {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(enqueue_ms_));
    const double run = run_ms_;
    lane.host_task([run] { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(run)); });
  }
  double checksum() const override { return 0.0; }
  void reset_checksum() override {}
  size_t weight_bytes() const override { return 0; }
  size_t kv_cache_bytes() const override { return 0; }

 private:
  double enqueue_ms_, run_ms_;
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

TEST(Profiler, ProfilesEveryUnitOfTinyLlama) {
  const model::ModelSpec m = model::load_model_config(PPB_SOURCE_DIR "/tests/data/tiny-llama.json");
  auto dev = create_cpu_device(1);
  ProfileConfig cfg;
  cfg.batch = 2;
  cfg.prompt_len = 8;
  cfg.gen_len = 5;
  cfg.num_contexts = 3;
  cfg.warmup = 1;
  cfg.iters = 3;
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

}  // namespace
}  // namespace ppb
