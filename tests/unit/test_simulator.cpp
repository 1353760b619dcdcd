// Unit tests of src/balance/simulator: hand-computed schedules of the inference loop
// (DESIGN.md §2) — one stage; two stages with M = 1 and M = 2 — and properties of larger runs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "balance/simulator.h"
#include "common/error.h"

namespace ppb::balance {
namespace {

enum { kRs = 0, kRe, kCs, kCe, kSs, kSe };

/// Event (group g, step t, stage s, column k) of a simulated repetition, in ms.
double at(const SimResult& r, int g, int t, int s, int k) { return 1e3 * r.events[r.shape.index(0, g, t, s, k)]; }

TEST(Simulator, OneStage) {
  SimConfig cfg;
  cfg.groups = 1;
  cfg.gen_len = 2;
  const SimResult r = simulate_pipeline({{10.0, 2.0, 0.0, 0.0}}, cfg);
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 0, kCs), 0.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 0, kCe), 10.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 0, kCe), 12.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 2, 0, kCe), 14.0);
  EXPECT_TRUE(std::isnan(at(r, 0, 1, 0, kRs)));  // the group's own token: no transfer
  EXPECT_TRUE(std::isnan(at(r, 0, 2, 0, kSs)));
  EXPECT_NEAR(r.metrics.ttft_p50_ms, 10.0, 1e-9);
  EXPECT_NEAR(r.metrics.tpot_p50_ms, 2.0, 1e-9);
  EXPECT_NEAR(r.metrics.tokens_per_s, 2.0 / 0.014, 1e-6);
  EXPECT_NEAR(r.metrics.decode_tokens_per_s, 1.0 / 0.002, 1e-6);  // (M*G - 1) * B over the decode span 12..14 ms
  EXPECT_NEAR(r.metrics.bubble_fraction[0], 0.0, 1e-12);
}

// Two stages: prefill 3 / 5 ms, decode 1 / 2 ms; activations 1 ms (prefill) and 0.5 ms
// (decode); token return 0.25 ms. Overlap, rendezvous transfers.
const std::vector<SimStage> kTwo = {{3.0, 1.0, 1.0, 0.5}, {5.0, 2.0, 0.25, 0.25}};

TEST(Simulator, TwoStagesOneGroup) {
  SimConfig cfg;
  cfg.groups = 1;
  cfg.gen_len = 1;
  const SimResult r = simulate_pipeline(kTwo, cfg);
  // Stage 0 prefill [0,3], activations [3,4]; stage 1 prefill [4,9], token back [9,9.25];
  // stage 0 decode [9.25,10.25], activations [10.25,10.75]; stage 1 decode [10.75,12.75].
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 0, kCe), 3.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 0, kSe), 4.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 1, kRs), 0.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 1, kRe), 4.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 1, kCe), 9.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 0, 1, kSe), 9.25);
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 0, kRs), 0.0);
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 0, kRe), 9.25);
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 0, kCs), 9.25);
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 1, kRe), 10.75);
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 1, kCe), 12.75);
  EXPECT_TRUE(std::isnan(at(r, 0, 1, 1, kSs)));  // no token return after the last step
  EXPECT_NEAR(r.metrics.ttft_p50_ms, 9.0, 1e-9);
  EXPECT_NEAR(r.metrics.tpot_p50_ms, 3.75, 1e-9);
  EXPECT_NEAR(r.metrics.tokens_per_s, 1.0 / 0.01275, 1e-6);
  EXPECT_EQ(r.metrics.decode_tokens_per_s, 0.0);  // one decode step: no span between decode tokens
  EXPECT_NEAR(r.metrics.bubble_fraction[0], 1.0 - 4.0 / 12.75, 1e-12);
  EXPECT_NEAR(r.metrics.bubble_fraction[1], 1.0 - 7.0 / 12.75, 1e-12);
}

TEST(Simulator, TwoStagesTwoGroups) {
  SimConfig cfg;
  cfg.groups = 2;
  cfg.gen_len = 1;
  const SimResult r = simulate_pipeline(kTwo, cfg);
  // Items in order (t, g): (0,0) (0,1) (1,0) (1,1). Hand schedule:
  //   stage 0 compute: [0,3] [3,6] [9.25,10.25] [14.25,15.25]
  //   stage 0 -> 1:    [3,4] [6,7] [10.25,10.75] [15.25,15.75]
  //   stage 1 compute: [4,9] [9,14] [14,16] [16,18]
  //   tokens 1 -> 0:   [9,9.25] [14,14.25]
  // The recv of item 2 on stage 0 is posted at once (it lands in group 0's own token buffer,
  // which nothing has read yet); the recv of item 2 on stage 1 waits for its compute of item 0
  // (ring slot reuse).
  const double cs0[2][2] = {{0, 9.25}, {3, 14.25}}, cs1[2][2] = {{4, 14}, {9, 16}};
  for (int g = 0; g < 2; ++g)
    for (int t = 0; t < 2; ++t) {
      EXPECT_DOUBLE_EQ(at(r, g, t, 0, kCs), cs0[g][t]) << g << "," << t;
      EXPECT_DOUBLE_EQ(at(r, g, t, 1, kCs), cs1[g][t]) << g << "," << t;
    }
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 0, kRs), 0.0);    // posted at once, into group 0's token buffer
  EXPECT_DOUBLE_EQ(at(r, 1, 1, 0, kRs), 9.25);   // recv lane busy until then
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 1, kRs), 9.0);
  EXPECT_DOUBLE_EQ(at(r, 1, 1, 1, kRe), 15.75);
  EXPECT_DOUBLE_EQ(at(r, 1, 1, 1, kCe), 18.0);
  EXPECT_NEAR(r.metrics.ttft_p50_ms, 10.0, 1e-9);  // 9 and 11
  EXPECT_NEAR(r.metrics.tpot_p50_ms, 5.5, 1e-9);   // 7 and 4
  EXPECT_NEAR(r.metrics.tokens_per_s, 2.0 / 0.018, 1e-6);
  EXPECT_NEAR(r.metrics.decode_tokens_per_s, 1.0 / 0.002, 1e-6);  // decode tokens out at 16 and 18 ms
  EXPECT_NEAR(r.metrics.bubble_fraction[0], 1.0 - 8.0 / 18.0, 1e-12);
  EXPECT_NEAR(r.metrics.bubble_fraction[1], 1.0 - 14.0 / 18.0, 1e-12);
}

TEST(Simulator, NoOverlapSerialisesTransfersWithCompute) {
  SimConfig cfg;
  cfg.groups = 1;
  cfg.gen_len = 1;
  cfg.overlap = false;
  const SimResult r = simulate_pipeline(kTwo, cfg);
  // Same as the M = 1 case: with one group nothing overlaps anyway.
  EXPECT_DOUBLE_EQ(at(r, 0, 1, 1, kCe), 12.75);
  // With two groups stage 0's send of group 0 now delays its compute of group 1.
  cfg.groups = 2;
  const SimResult r2 = simulate_pipeline(kTwo, cfg);
  EXPECT_DOUBLE_EQ(at(r2, 1, 0, 0, kCs), 4.0);
}

TEST(Simulator, SteadyStateApproachesTheBottleneck) {
  // 4 balanced stages of 1 ms per decode step, M = 4 groups, free transfers: one token per
  // group every 4 ms once the pipe is full, i.e. M*B / (M * 1 ms) = 1000 tokens/s per sequence.
  std::vector<SimStage> st(4, {1.0, 1.0, 0.0, 0.0});
  SimConfig cfg;
  cfg.groups = 4;
  cfg.gen_len = 200;
  cfg.batch = 1;
  const SimResult r = simulate_pipeline(st, cfg);
  EXPECT_NEAR(r.metrics.decode_tokens_per_s, r.metrics.bottleneck_bound_tok_s, 1e-6 * r.metrics.bottleneck_bound_tok_s);
  EXPECT_NEAR(r.metrics.tpot_p50_ms, 4.0, 1e-9);
  for (double b : r.metrics.bubble_fraction) EXPECT_LT(b, 0.02);
}

TEST(Simulator, RendezvousTokenReturnNeverDeadlocksWithManyGroups) {
  // Regression: with rendezvous transfers (NCCL) the token return used to land in a ring slot
  // freed by a compute that waited on the return itself: M >= 8 on 2 stages deadlocked, in the
  // simulator and in pipeline.cpp alike. Stage 0 now receives into the group's own buffer.
  for (int S = 2; S <= 4; ++S) {
    for (int M : {1, 2, 3, 8, 17, 30}) {
      std::vector<SimStage> st(S, SimStage{1.0, 0.2, 0.05, 0.01});
      SimConfig cfg;
      cfg.groups = M;
      cfg.gen_len = 12;
      cfg.batch = 2;
      for (bool overlap : {true, false}) {
        cfg.overlap = overlap;
        SCOPED_TRACE("S=" + std::to_string(S) + " M=" + std::to_string(M) + (overlap ? " overlap" : " no-overlap"));
        SimResult r;
        ASSERT_NO_THROW(r = simulate_pipeline(st, cfg));
        // Every item of every stage computed.
        for (int g = 0; g < M; ++g)
          for (int t = 0; t <= cfg.gen_len; ++t)
            for (int s = 0; s < S; ++s) EXPECT_FALSE(std::isnan(r.events[r.shape.index(0, g, t, s, 3)]));
        EXPECT_LE(r.metrics.decode_tokens_per_s, r.metrics.bottleneck_bound_tok_s * (1 + 1e-9));
      }
    }
  }
}

TEST(Simulator, Errors) {
  SimConfig cfg;
  EXPECT_THROW(simulate_pipeline({}, cfg), UserError);
  EXPECT_THROW(simulate_pipeline({{-1, 1, 0, 0}}, cfg), UserError);
  cfg.groups = 0;
  EXPECT_THROW(simulate_pipeline({{1, 1, 0, 0}}, cfg), UserError);
}

}  // namespace
}  // namespace ppb::balance
