// One copy of each weight tensor per rank (backend/cpu/cpu_weight_cache.h):
//  - the cache: one block per key while some holder lives, filled once; a new block after the
//    last holder is gone; a key asked for with another size refused;
//  - stages built from one cache: two overlapping stages of every tiny model hold, together,
//    exactly the whole model's weights (cpu_stage_bytes of units [0, last]: each tensor once, a
//    tied lm_head and the MTP embedding on the embedding), so no two distinct tensors share a
//    key and no tensor is generated twice; and they compute bitwise what stages with their own
//    weights compute (prefill and decodes through both stages, tokens and checksums).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_stage.h"
#include "backend/cpu/cpu_evict.h"
#include "backend/cpu/cpu_weight_cache.h"
#include "backend/stage.h"
#include "common/error.h"
#include "model/model_spec.h"
#include "sync_lane.h"

namespace {

using ppb::cpu::WeightCache;
using ppb::cpu::WeightKey;
using ppb::model::ModelSpec;
using ppb::test::SyncLane;

WeightKey key_of(uint64_t unit, uint64_t tensor, size_t a) {
  return WeightKey{WeightKey::Fill::projection, 77, unit, tensor, a, 8, 0, 0};
}

TEST(WeightCache, OneBlockPerKeyWhileHeldFilledOnce) {
  WeightCache cache;
  int fills = 0;
  auto fill = [&](float* p) {
    ++fills;
    for (int i = 0; i < 32; ++i) p[i] = static_cast<float>(i);
  };
  std::shared_ptr<float> a = cache.get(key_of(3, 1, 4), 32, fill);
  std::shared_ptr<float> b = cache.get(key_of(3, 1, 4), 32, fill);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(fills, 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 64, 0u);  // cpu_aligned.h's alignment
  EXPECT_EQ(a.get()[31], 31.0f);
  // Another unit, tensor or block is another tensor.
  std::shared_ptr<float> c = cache.get(key_of(4, 1, 4), 32, fill);
  std::shared_ptr<float> d = cache.get(key_of(3, 2, 4), 32, fill);
  std::shared_ptr<float> e = cache.get(key_of(3, 1, 5), 32, fill);
  EXPECT_NE(c.get(), a.get());
  EXPECT_NE(d.get(), a.get());
  EXPECT_NE(e.get(), a.get());
  EXPECT_EQ(fills, 4);
  EXPECT_EQ(cache.resident_bytes(), 4 * 32 * sizeof(float));
  EXPECT_THROW(cache.get(key_of(3, 1, 4), 16, fill), ppb::InternalError);
  EXPECT_EQ(fills, 4);
  // Freed with its last holder; asked for again, made again.
  a.reset();
  EXPECT_EQ(cache.resident_bytes(), 4 * 32 * sizeof(float));  // b still holds it
  b.reset();
  EXPECT_EQ(cache.resident_bytes(), 3 * 32 * sizeof(float));
  std::shared_ptr<float> again = cache.get(key_of(3, 1, 4), 16, [&](float* p) {  // a new block: any size
    ++fills;
    for (int i = 0; i < 16; ++i) p[i] = -1.0f;
  });
  EXPECT_EQ(fills, 5);
  EXPECT_EQ(again.get()[15], -1.0f);
  EXPECT_EQ(cache.tensors_made(), 5u);
}

TEST(WeightCache, ManyShortLivedTensorsLeaveOnlyTheHeldOnesResident) {
  WeightCache cache;
  for (uint64_t u = 0; u < 5000; ++u) cache.get(key_of(u, 1, 1), 4, [](float* p) { p[0] = 1.0f; });  // each freed at once
  std::shared_ptr<float> held = cache.get(key_of(9999, 1, 1), 4, [](float* p) { p[0] = 2.0f; });
  EXPECT_EQ(cache.resident_bytes(), 4 * sizeof(float));
  EXPECT_EQ(cache.tensors_made(), 5001u);
  EXPECT_EQ(held.get()[0], 2.0f);
}

ModelSpec tiny(const std::string& name) {
  return ppb::model::load_model_config(std::string(PPB_SOURCE_DIR "/tests/data/") + name + ".json");
}

ppb::StageConfig config() {
  ppb::StageConfig c;
  c.work.batch = 2;
  c.work.prompt_len = 5;
  c.work.gen_len = 3;
  c.work.groups = 2;
  c.work.seed = 77;
  return c;
}

/// Tokens and checksums of a prefill and gen_len - 1 decodes through stages a then b (a holds
/// embed, b the head), group 1, the head's tokens fed back.
std::vector<double> run_two_stages(ppb::StageExecutor& a, ppb::StageExecutor& b, const ppb::StageConfig& cfg, int vocab) {
  SyncLane lane;
  const int B = cfg.work.batch, P = cfg.work.prompt_len;
  std::mt19937 gen(5);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> in(static_cast<size_t>(B) * P);
  for (int32_t& x : in) x = d(gen);
  std::vector<double> seen;
  for (int step = 0; step < cfg.work.gen_len; ++step) {
    const int pos = step == 0 ? 0 : P + step - 1, T = step == 0 ? P : 1;
    std::vector<char> mid(a.output_bytes(T));
    std::vector<int32_t> out(static_cast<size_t>(B));
    a.reset_checksum();
    b.reset_checksum();
    a.enqueue_forward(lane, in.data(), mid.data(), 1, pos, T);
    b.enqueue_forward(lane, mid.data(), out.data(), 1, pos, T);
    seen.push_back(b.checksum());
    seen.insert(seen.end(), out.begin(), out.end());
    in = out;
  }
  return seen;
}

TEST(CpuStageWeights, OverlappingStagesOfOneCacheHoldTheModelOnceAndComputeAsTheirOwn) {
  for (const char* name : {"tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-gemma3", "tiny-gpt-oss"}) {
    for (bool mtp : {false, true}) {
      if (mtp && std::string(name) != "tiny-deepseek-v3") continue;
      ModelSpec m = tiny(name);
      if (mtp) ppb::model::enable_mtp(m);
      const int last = m.num_units() - 1;
      ASSERT_GE(last, 3) << name;
      const ppb::StageConfig cfg = config();
      // Stage a: units [0, last - 1]; stage b: [1, last]: every decoder layer in both.
      auto cache = std::make_shared<WeightCache>();
      auto a = ppb::create_cpu_stage(m, 0, last - 1, cfg, cache);
      const size_t made_a = cache->tensors_made();
      auto b = ppb::create_cpu_stage(m, 1, last, cfg, cache);
      const size_t whole = ppb::cpu_stage_bytes(m, 0, last, cfg).weights;
      EXPECT_EQ(cache->resident_bytes(), whole) << name << (mtp ? "+mtp" : "");
      EXPECT_GT(cache->tensors_made(), made_a) << name;  // the head's own tensors
      // Each stage still counts all the weights it holds (the memory model's per-stage bytes).
      EXPECT_EQ(a->weight_bytes(), ppb::cpu_stage_bytes(m, 0, last - 1, cfg).weights) << name;
      EXPECT_EQ(b->weight_bytes(), ppb::cpu_stage_bytes(m, 1, last, cfg).weights) << name;
      // Stage b of its own weights, and a of its own: the same bits.
      auto own_a = ppb::create_cpu_stage(m, 0, last - 1, cfg);
      auto own_b = ppb::create_cpu_stage(m, 1, last, cfg);
      const std::vector<double> shared = run_two_stages(*a, *b, cfg, m.vocab);
      const std::vector<double> own = run_two_stages(*own_a, *own_b, cfg, m.vocab);
      ASSERT_EQ(shared.size(), own.size());
      for (size_t i = 0; i < own.size(); ++i) EXPECT_EQ(shared[i], own[i]) << name << " value " << i;
      a.reset();
      b.reset();
      EXPECT_EQ(cache->resident_bytes(), 0u) << name;
    }
  }
}

// The memory the profile evicts before a cold forward (Device::flush_caches with the stage):
// the stage's weight blocks and its KV store, every byte it counts; evicting them changes no bit
// of what the stages compute.
TEST(CpuStageWeights, HostBlocksAreTheWeightsAndTheKvStoreAndEvictingThemChangesNothing) {
  for (const char* name : {"tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3"}) {
    const ModelSpec m = tiny(name);
    const int last = m.num_units() - 1;
    const ppb::StageConfig cfg = config();
    auto a = ppb::create_cpu_stage(m, 0, last - 1, cfg);
    auto b = ppb::create_cpu_stage(m, last - 1, last, cfg);
    for (const ppb::StageExecutor* s : {a.get(), b.get()}) {
      size_t bytes = 0;
      for (const auto& [p, n] : s->host_blocks()) {
        EXPECT_NE(p, nullptr) << name;
        bytes += n;
      }
      EXPECT_EQ(bytes, s->weight_bytes() + s->kv_cache_bytes()) << name;
    }
    const std::vector<double> before = run_two_stages(*a, *b, cfg, m.vocab);
    for (const ppb::StageExecutor* s : {a.get(), b.get()})
      for (const auto& [p, n] : s->host_blocks()) ppb::cpu::evict_lines(p, n);
    EXPECT_EQ(run_two_stages(*a, *b, cfg, m.vocab), before) << name;
  }
}

}  // namespace
