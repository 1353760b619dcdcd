// Unit tests of src/balance/contention: the overlap of each stage's compute with its node's other
// stages on hand-made timelines, and the shared-bandwidth model's fixed point on simulated ones.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "balance/contention.h"
#include "common/error.h"
#include "common/events.h"

namespace ppb::balance {
namespace {

/// One repetition, one group, prefill + one decode step, two stages, with the given compute
/// intervals (ms) and NaN elsewhere.
std::vector<double> two_stage_events(const EventShape& sh, const double (&c)[2][2][2]) {
  std::vector<double> ev(sh.index(0, 0, sh.steps - 1, sh.stages - 1, kNumEvents - 1) + 1, std::nan(""));
  for (int t = 0; t < 2; ++t)
    for (int s = 0; s < 2; ++s) {
      ev[sh.index(0, 0, t, s, kComputeStart)] = 1e-3 * c[t][s][0];
      ev[sh.index(0, 0, t, s, kComputeEnd)] = 1e-3 * c[t][s][1];
    }
  return ev;
}

TEST(Contention, OverlapOfHandMadeTimeline) {
  const EventShape sh{1, 1, 2, 2};
  // [step][stage] = {start, end} ms: stage 0 prefill [0,3], decode [5,6]; stage 1 prefill [2,7],
  // decode [8,9].
  const double c[2][2][2] = {{{0, 3}, {2, 7}}, {{5, 6}, {8, 9}}};
  const auto ev = two_stage_events(sh, c);
  const auto [pre, dec] = compute_overlap(ev, sh, {0, 0});
  EXPECT_NEAR(pre[0], 1.0 / 3.0, 1e-12);  // [2,3] of [0,3]
  EXPECT_NEAR(dec[0], 1.0, 1e-12);        // [5,6] inside [2,7]
  EXPECT_NEAR(pre[1], 2.0 / 5.0, 1e-12);  // [2,3] and [5,6] of [2,7]
  EXPECT_NEAR(dec[1], 0.0, 1e-12);
  const auto [pre2, dec2] = compute_overlap(ev, sh, {0, 1});  // two nodes: nothing shared
  for (int s = 0; s < 2; ++s) EXPECT_EQ(pre2[s] + dec2[s], 0.0);
}

TEST(Contention, StepOverlapGivesEachStepsShare) {
  const EventShape sh{1, 1, 2, 2};
  const double c[2][2][2] = {{{0, 3}, {2, 7}}, {{5, 6}, {8, 9}}};  // as OverlapOfHandMadeTimeline
  auto ev = two_stage_events(sh, c);
  const auto share = step_overlap(ev, sh, {0, 0});  // [rep][group][step][stage]
  ASSERT_EQ(share.size(), 4u);
  EXPECT_NEAR(share[0], 1.0 / 3.0, 1e-12);  // stage 0 prefill [0,3]: [2,3] covered
  EXPECT_NEAR(share[1], 2.0 / 5.0, 1e-12);  // stage 1 prefill [2,7]: [2,3] and [5,6]
  EXPECT_NEAR(share[2], 1.0, 1e-12);        // stage 0 decode [5,6]
  EXPECT_NEAR(share[3], 0.0, 1e-12);        // stage 1 decode [8,9]
  for (double x : step_overlap(ev, sh, {0, 1})) EXPECT_EQ(x, 0.0);  // two nodes: nothing shared
  ev[sh.index(0, 0, 1, 1, kComputeEnd)] = std::nan("");              // a step that did not run
  const auto gap = step_overlap(ev, sh, {0, 0});
  EXPECT_TRUE(std::isnan(gap[3]));
  EXPECT_NEAR(gap[2], 1.0, 1e-12);
  EXPECT_THROW(step_overlap(ev, sh, {0}), InternalError);
}

SimConfig config(int groups, int gen_len) {
  SimConfig cfg;
  cfg.groups = groups;
  cfg.gen_len = gen_len;
  cfg.batch = 4;
  return cfg;
}

/// Alone and together stages: together = alone x `slow` in both phases.
std::vector<SimStage> scaled(const std::vector<SimStage>& a, double slow) {
  auto t = a;
  for (auto& s : t) s.prefill_ms *= slow, s.decode_ms *= slow;
  return t;
}

/// The fixed point holds: each step time is alone + (together - alone) x its overlap.
void expect_fixed_point(const ContentionResult& r, const std::vector<SimStage>& alone,
                        const std::vector<SimStage>& together) {
  ASSERT_TRUE(r.converged);
  for (size_t k = 0; k < alone.size(); ++k) {
    const double pre = alone[k].prefill_ms + (together[k].prefill_ms - alone[k].prefill_ms) * r.overlap_prefill[k];
    const double dec = alone[k].decode_ms + (together[k].decode_ms - alone[k].decode_ms) * r.overlap_decode[k];
    // Converged to 1e-4 per damped step: the remaining distance to the target is within 2e-4
    // relative, plus what the last overlap moved.
    EXPECT_NEAR(r.stages[k].prefill_ms, pre, 1e-3 * pre) << "stage " << k;
    EXPECT_NEAR(r.stages[k].decode_ms, dec, 1e-3 * dec) << "stage " << k;
    EXPECT_GE(r.stages[k].decode_ms, alone[k].decode_ms * (1 - 1e-9));
    EXPECT_LE(r.stages[k].decode_ms, together[k].decode_ms * (1 + 1e-9));
    EXPECT_GE(r.stages[k].prefill_ms, alone[k].prefill_ms * (1 - 1e-9));
    EXPECT_LE(r.stages[k].prefill_ms, together[k].prefill_ms * (1 + 1e-9));
  }
}

TEST(Contention, OneStageOrOneStagePerNodeRunsAtItsAloneTimes) {
  const std::vector<SimStage> one = {{30.0, 3.0, 0.0, 0.0}};
  auto r = contended_step_times(one, scaled(one, 1.4), {0}, config(2, 16));
  EXPECT_TRUE(r.converged);
  EXPECT_NEAR(r.stages[0].prefill_ms, 30.0, 30.0 * 1e-3);
  EXPECT_NEAR(r.stages[0].decode_ms, 3.0, 3.0 * 1e-3);
  const std::vector<SimStage> two = {{30.0, 3.0, 0.1, 0.01}, {40.0, 4.0, 0.01, 0.01}};
  r = contended_step_times(two, scaled(two, 1.4), {0, 1}, config(2, 16));
  expect_fixed_point(r, two, scaled(two, 1.4));
  for (int k = 0; k < 2; ++k) EXPECT_NEAR(r.stages[k].decode_ms, two[k].decode_ms, 1e-3 * two[k].decode_ms);
}

TEST(Contention, AStageWithATwinOnItsNodeRunsAtItsTogetherTimes) {
  // Replicas in lockstep: a stage whose twin (another replica's copy) shares its node is
  // overlapped all the time, whatever its own pipeline does; the others keep their model.
  const std::vector<SimStage> two = {{30.0, 3.0, 0.1, 0.01}, {40.0, 4.0, 0.01, 0.01}};
  const auto t = scaled(two, 1.4);
  const auto r = contended_step_times(two, t, {0, 1}, config(2, 16), {1, 0});
  EXPECT_TRUE(r.converged);
  EXPECT_DOUBLE_EQ(r.overlap_prefill[0], 1.0);
  EXPECT_DOUBLE_EQ(r.overlap_decode[0], 1.0);
  EXPECT_NEAR(r.stages[0].prefill_ms, t[0].prefill_ms, 1e-3 * t[0].prefill_ms);
  EXPECT_NEAR(r.stages[0].decode_ms, t[0].decode_ms, 1e-3 * t[0].decode_ms);
  EXPECT_NEAR(r.stages[1].decode_ms, two[1].decode_ms, 1e-3 * two[1].decode_ms);  // alone on node 1
  EXPECT_THROW(contended_step_times(two, t, {0, 1}, config(2, 16), {1}), UserError);
}

TEST(Contention, EqualStagesOnOneNodeRunNearTheirTogetherTimes) {
  // Two equal stages, M = 2 groups: in the decode steady state each computes while the other
  // does; only the fill and drain are alone.
  const std::vector<SimStage> a = {{30.0, 3.0, 0.01, 0.01}, {30.0, 3.0, 0.01, 0.01}};
  const auto t = scaled(a, 1.3);
  const auto r = contended_step_times(a, t, {0, 0}, config(2, 64));
  expect_fixed_point(r, a, t);
  for (int k = 0; k < 2; ++k) {
    EXPECT_GT(r.overlap_decode[k], 0.9) << k;
    EXPECT_GT(r.stages[k].decode_ms, a[k].decode_ms + 0.9 * (t[k].decode_ms - a[k].decode_ms));
  }
}

TEST(Contention, ALightStageSlowsTheHeavyOneOnlyWhileItComputes) {
  // Stage 0 does half the work of stage 1: stage 1 (the bottleneck) is overlapped only while
  // stage 0 computes, about half its time; stage 0 nearly always.
  const std::vector<SimStage> a = {{20.0, 2.0, 0.01, 0.01}, {40.0, 4.0, 0.01, 0.01}};
  const auto t = scaled(a, 1.3);
  const auto r = contended_step_times(a, t, {0, 0}, config(2, 64));
  expect_fixed_point(r, a, t);
  EXPECT_GT(r.overlap_decode[0], 0.9);
  // Steady state: stage 1's overlap = stage 0's step / stage 1's step (both at their fixed
  // points), within the fill and drain's share.
  const double busy = r.stages[0].decode_ms / r.stages[1].decode_ms;
  EXPECT_NEAR(r.overlap_decode[1], busy, 0.05);
  EXPECT_LT(r.overlap_decode[1], 0.75);
  EXPECT_LT(r.stages[1].decode_ms, t[1].decode_ms * 0.95);
}

TEST(Contention, ComputeOverlapIsTheTimeWeightedMeanOfTheStepShares) {
  // A simulated pipeline of unequal stages: every step's share, weighted by its time, gives the
  // stage's share of its phase's compute time.
  const std::vector<SimStage> st{{3.0, 0.7, 0.1, 0.01}, {5.0, 1.3, 0.1, 0.01}, {2.0, 0.4, 0.1, 0.01}};
  const SimResult sim = simulate_pipeline(st, config(4, 5));
  const std::vector<int> node{0, 0, 1};
  const auto share = step_overlap(sim.events, sim.shape, node);
  const auto [pre, dec] = compute_overlap(sim.events, sim.shape, node);
  const int S = sim.shape.stages;
  for (int s = 0; s < S; ++s) {
    double w[2] = {0, 0}, ws[2] = {0, 0};
    for (size_t row = 0; row * S < share.size(); ++row) {
      const size_t e = (row * S + s) * kNumEvents;
      const double d = sim.events[e + kComputeEnd] - sim.events[e + kComputeStart];
      const int ph = row % sim.shape.steps == 0 ? 0 : 1;
      w[ph] += d;
      ws[ph] += d * share[row * S + s];
    }
    EXPECT_NEAR(pre[s], ws[0] / w[0], 1e-12) << s;
    EXPECT_NEAR(dec[s], ws[1] / w[1], 1e-12) << s;
  }
  EXPECT_GT(dec[0], 0.0);
  EXPECT_EQ(dec[2], 0.0);  // alone on its node
}

TEST(Contention, RejectsMismatchedSizes) {
  const std::vector<SimStage> a = {{1.0, 1.0, 0.0, 0.0}, {1.0, 1.0, 0.0, 0.0}};
  EXPECT_THROW(contended_step_times(a, {a[0]}, {0, 0}, config(1, 1)), UserError);
  EXPECT_THROW(contended_step_times(a, a, {0}, config(1, 1)), UserError);
}

}  // namespace
}  // namespace ppb::balance
