// The pipelined loop across ranks: its tokens and checksum equal a 1-rank sequential run of
// the same model, in every lane mode.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/device.h"
#include "balance/partition.h"
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
  StageConfig sc{cfg.batch, cfg.prompt_len + cfg.gen_len, cfg.groups, DType::f32, cfg.seed};
  auto stage = device.create_stage(m, 0, m.num_units() - 1, sc);
  auto lane = device.create_lane("ref");
  const int B = cfg.batch, P = cfg.prompt_len, steps = cfg.gen_len + 1;
  Reference ref;
  ref.tokens.resize(static_cast<size_t>(cfg.groups) * steps * B);
  stage->reset_checksum();
  for (int g = 0; g < cfg.groups; ++g) {
    std::vector<int32_t> prompt(static_cast<size_t>(B) * P), tok(B);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < P; ++t) prompt[b * P + t] = prompt_token(cfg.seed, g, b, t, cfg.vocab);
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

void check_pipeline(const char* config, LaneMode mode, int groups = 3) {
  const auto& mpi = test::mpi();
  auto m = model::load_model_config(std::string(PPB_SOURCE_DIR) + "/tests/data/" + config);
  auto device = create_cpu_device(1);
  auto transport = create_mpi_transport(mpi, {});
  const int S = mpi.size();
  PipelineConfig cfg;
  cfg.batch = 2;
  cfg.prompt_len = 5;
  cfg.gen_len = 4;
  cfg.groups = groups;
  cfg.warmup = 1;
  cfg.iters = 2;
  cfg.seed = 77;
  cfg.vocab = m.vocab;
  cfg.mode = mode;
  auto part = balance::solve_uniform(m.num_units(), S);
  StagePlacement place{mpi.rank(), S, mpi.rank() > 0 ? mpi.rank() - 1 : -1, mpi.rank() + 1 < S ? mpi.rank() + 1 : -1, 0, S - 1};
  StageConfig sc{cfg.batch, cfg.prompt_len + cfg.gen_len, cfg.groups, DType::f32, cfg.seed};
  auto stage = device->create_stage(m, part.first_unit[mpi.rank()], part.last_unit[mpi.rank()], sc);
  auto rec = run_pipeline(mpi, *device, *transport, *stage, place, cfg);

  const int steps = cfg.gen_len + 1;
  ASSERT_EQ(rec.events.size(), static_cast<size_t>(cfg.iters) * cfg.groups * steps * kNumEvents);
  // Every item computed; times ordered within an item.
  for (size_t i = 0; i < rec.events.size(); i += kNumEvents) {
    EXPECT_LE(rec.events[i + kComputeStart], rec.events[i + kComputeEnd]);
    if (!std::isnan(rec.events[i + kRecvEnd])) EXPECT_LE(rec.events[i + kRecvEnd], rec.events[i + kComputeStart] + 1e-9);
    if (!std::isnan(rec.events[i + kSendStart])) EXPECT_GE(rec.events[i + kSendStart], rec.events[i + kComputeEnd] - 1e-9);
  }
  if (mpi.rank() == S - 1) {
    auto ref = sequential_run(*device, m, cfg);
    EXPECT_EQ(rec.tokens, ref.tokens);
    EXPECT_NEAR(rec.checksum, ref.checksum, 1e-9 * std::max(1.0, std::abs(ref.checksum)));
    // The tokens must not be trivially constant (the model would hide ordering bugs).
    std::vector<int32_t> sorted = ref.tokens;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 3);
  }
}

TEST(MpiPipeline, OverlapEqualsSequentialLlama) { check_pipeline("tiny-llama.json", LaneMode::overlap); }
TEST(MpiPipeline, NoOverlapEqualsSequentialLlama) { check_pipeline("tiny-llama.json", LaneMode::no_overlap); }
TEST(MpiPipeline, SerializedEqualsSequentialLlama) { check_pipeline("tiny-llama.json", LaneMode::serialized); }
TEST(MpiPipeline, OverlapEqualsSequentialGemma3) { check_pipeline("tiny-gemma3.json", LaneMode::overlap); }
// Many groups in flight (M > 2 x ring depth): the token return must not wait on the ring.
TEST(MpiPipeline, ManyGroupsNoOverlapEqualsSequential) { check_pipeline("tiny-llama.json", LaneMode::no_overlap, 11); }
TEST(MpiPipeline, ManyGroupsOverlapEqualsSequential) { check_pipeline("tiny-llama.json", LaneMode::overlap, 11); }

}  // namespace
}  // namespace ppb
