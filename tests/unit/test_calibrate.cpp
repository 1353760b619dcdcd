// Unit tests of src/balance/calibrate: the adaptive split's calibration of the profile by the
// pipeline's measured stages, and that the balancer solved from the calibrated table moves work
// off a rank that ran slower than its profile said.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "balance/calibrate.h"
#include "balance/problem.h"
#include "common/error.h"
#include "results/profile_step_fit.h"
#include "stepcost/step_model.h"

namespace ppb::balance {
namespace {

TEST(Calibrate, FactorsAreMeasuredOverPredictedPerRankAndPhase) {
  // Rank 0 ran two stages (two partitions): prefill 10+20 predicted, 12+24 measured -> 1.2;
  // decode 2+4 predicted, 3+6 measured -> 1.5. Rank 1: 0.8 and 1.0. Rank 2 ran nothing -> 1.
  const std::vector<StageMeasurement> st{{0, 10, 2, 12, 3}, {0, 20, 4, 24, 6}, {1, 10, 5, 8, 5}};
  const std::vector<double> f = calibration_factors(st, 3);
  ASSERT_EQ(f.size(), 6u);
  EXPECT_DOUBLE_EQ(f[0], 1.2);
  EXPECT_DOUBLE_EQ(f[1], 1.5);
  EXPECT_DOUBLE_EQ(f[2], 0.8);
  EXPECT_DOUBLE_EQ(f[3], 1.0);
  EXPECT_DOUBLE_EQ(f[4], 1.0);
  EXPECT_DOUBLE_EQ(f[5], 1.0);
  // A phase never measured (0 ms: no decode steps) or never predicted keeps factor 1.
  const std::vector<double> g = calibration_factors({{0, 10, 0, 11, 0}}, 1);
  EXPECT_DOUBLE_EQ(g[0], 1.1);
  EXPECT_DOUBLE_EQ(g[1], 1.0);
}

ProfileTable two_rank_table(int U) {
  ProfileTable t;
  for (int u = 0; u < U; ++u) t.unit_name.push_back("u" + std::to_string(u));
  for (int r = 0; r < 2; ++r)
    for (int u = 0; u < U; ++u) {
      t.latency_ms.insert(t.latency_ms.end(), {10.0, 1.0});  // every unit alike on both ranks
      t.latency_min_ms.insert(t.latency_min_ms.end(), {9.0, 0.9});
      t.latency_max_ms.insert(t.latency_max_ms.end(), {11.0, 1.1});
      t.latency_alone_ms.insert(t.latency_alone_ms.end(), {9.5, 0.8});  // the profile's alone pass
      t.cost_ms.push_back(10.0 + 4 * 1.0);
    }
  t.decode_contexts = {8, 9};
  t.decode_context_ms.assign(2 * U * 2, 1.0);
  return t;
}

TEST(Calibrate, ScalesEachRanksRowAndItsCost) {
  const ProfileTable t = two_rank_table(4);
  const ProfileTable c = calibrated_profile(t, {1.0, 2.0, 0.5, 1.0}, Objective::workload, 4);
  for (int u = 0; u < 4; ++u) {
    EXPECT_DOUBLE_EQ(c.latency_ms[u * 2], 10.0);       // rank 0 prefill x1
    EXPECT_DOUBLE_EQ(c.latency_ms[u * 2 + 1], 2.0);    // rank 0 decode x2
    EXPECT_DOUBLE_EQ(c.latency_max_ms[u * 2 + 1], 2.2);
    EXPECT_DOUBLE_EQ(c.latency_alone_ms[u * 2 + 1], 1.6);  // both passes scaled alike
    EXPECT_DOUBLE_EQ(c.latency_alone_ms[(4 + u) * 2], 4.75);
    EXPECT_DOUBLE_EQ(c.cost_ms[u], 10.0 + 4 * 2.0);    // workload = prefill + G x decode
    EXPECT_DOUBLE_EQ(c.latency_ms[(4 + u) * 2], 5.0);  // rank 1 prefill x0.5
    EXPECT_DOUBLE_EQ(c.latency_min_ms[(4 + u) * 2], 4.5);
    EXPECT_DOUBLE_EQ(c.cost_ms[4 + u], 5.0 + 4 * 1.0);
  }
  EXPECT_DOUBLE_EQ(c.decode_context_ms[0], 2.0);  // rank 0's decode contexts x2
  EXPECT_DOUBLE_EQ(c.decode_context_ms[8], 1.0);  // rank 1's x1
  EXPECT_THROW(calibrated_profile(t, {1.0, 1.0}, Objective::workload, 4), InternalError);
}

/// A forward's fixed cost scales with its rank's and kind's timings (the stage's sum less (n - 1)
/// F then scales as a whole): pairs of one = 1 ms, two = 1.8 ms (F = 0.2) on both ranks and kinds,
/// timed on unit 1.
TEST(Calibrate, AForwardsFixedCostScalesWithItsRanksTimings) {
  ProfileTable t = two_rank_table(3);
  t.fixed_unit = 1;
  const int K = stepcost::kFixedCostSamples;
  t.fixed_one_ms.assign(2 * 2 * K, 1.0);
  t.fixed_two_ms.assign(2 * 2 * K, 1.8);
  const ProfileTable c = calibrated_profile(t, {1.0, 2.0, 0.5, 1.0}, Objective::workload, 4);
  const double want[2][2] = {{0.2, 0.4}, {0.1, 0.2}};
  for (int r = 0; r < 2; ++r)
    for (int ph = 0; ph < 2; ++ph) EXPECT_NEAR(fixed_cost_at(c, r, ph).ms, want[r][ph], 1e-12) << r << ph;
  // The rounds' drift of the unit the pairs were timed on (1), not of another (0).
  std::vector<double> rounds = t.latency_ms;
  rounds[(0 * 3 + 1) * 2 + 1] *= 1.5;  // rank 0 unit 1 decode
  rounds[(1 * 3 + 0) * 2] *= 3.0;      // rank 1 unit 0 prefill
  const ProfileTable s = profile_as_rounds_saw_it(t, rounds, Objective::workload, 4);
  EXPECT_NEAR(fixed_cost_at(s, 0, 1).ms, 0.3, 1e-12);
  EXPECT_NEAR(fixed_cost_at(s, 0, 0).ms, 0.2, 1e-12);
  EXPECT_NEAR(fixed_cost_at(s, 1, 0).ms, 0.2, 1e-12);
}

/// The rounds' table replaces the together table; each unit's alone time, spread and decode
/// contexts move by that unit's own rounds / profile ratio; the cost follows the new table.
TEST(Calibrate, ProfileAsTheRoundsSawItScalesEachUnitByItsOwnDrift) {
  const ProfileTable t = two_rank_table(3);
  std::vector<double> rounds = t.latency_ms;
  rounds[1] = 1.5;                 // rank 0 unit 0 decode: x1.5
  rounds[(3 + 2) * 2] = 8.0;       // rank 1 unit 2 prefill: x0.8
  const ProfileTable c = profile_as_rounds_saw_it(t, rounds, Objective::workload, 4);
  EXPECT_EQ(c.latency_ms, rounds);
  EXPECT_DOUBLE_EQ(c.latency_alone_ms[1], 0.8 * 1.5);
  EXPECT_DOUBLE_EQ(c.latency_alone_ms[0], 9.5);  // its prefill did not move
  EXPECT_DOUBLE_EQ(c.latency_max_ms[1], 1.1 * 1.5);
  EXPECT_DOUBLE_EQ(c.decode_context_ms[0], 1.5);  // rank 0 unit 0's two contexts
  EXPECT_DOUBLE_EQ(c.decode_context_ms[1], 1.5);
  EXPECT_DOUBLE_EQ(c.decode_context_ms[2], 1.0);  // unit 1's did not move
  EXPECT_DOUBLE_EQ(c.latency_alone_ms[(3 + 2) * 2], 9.5 * 0.8);
  EXPECT_DOUBLE_EQ(c.latency_min_ms[(3 + 2) * 2], 9.0 * 0.8);
  EXPECT_DOUBLE_EQ(c.decode_context_ms[(3 + 2) * 2], 1.0);  // a prefill drift leaves decode alone
  EXPECT_DOUBLE_EQ(c.cost_ms[0], 10.0 + 4 * 1.5);
  EXPECT_DOUBLE_EQ(c.cost_ms[3 + 2], 8.0 + 4 * 1.0);
  EXPECT_DOUBLE_EQ(c.cost_ms[1], 14.0);
  rounds.pop_back();
  EXPECT_THROW(profile_as_rounds_saw_it(t, rounds, Objective::workload, 4), InternalError);
}

TEST(Calibrate, TheSplitSolvedFromTheCalibratedTableUnloadsTheSlowRank) {
  // Twelve equal units on two equal ranks: the balanced split is 6,6. The pipeline measured
  // rank 0's stage 1.5x slower than predicted (decode and prefill): solved again, rank 0 gets
  // fewer units, and the calibrated prediction of the two stages is within one unit of equal.
  const int U = 12;
  RunRecord run;
  run.profile = two_rank_table(U);
  run.profile.unit_weight_bytes.assign(U, 1000);
  run.profile.unit_kv_bytes.assign(U, 0);
  run.workload.batch = 1;
  run.workload.prompt_len = 8;
  run.workload.gen_len = 4;
  run.workload.microbatches = 2;
  run.ranks.resize(2);
  for (auto& r : run.ranks) r.memory_limit_bytes = int64_t(1) << 40;
  SplitRequest req;
  req.method = Method::balanced;
  req.stages = 2;
  const Partition before = make_split(problem_from_run(run, Objective::workload), req);
  EXPECT_EQ(before.counts_string(), "6,6");
  run.profile = calibrated_profile(run.profile, calibration_factors({{0, 60, 6, 90, 9}, {1, 60, 6, 60, 6}}, 2),
                                   Objective::workload, 4);
  const Partition after = make_split(problem_from_run(run, Objective::workload), req);
  const int n0 = after.last_unit[0] - after.first_unit[0] + 1;
  EXPECT_LT(n0, 6) << after.counts_string();
  EXPECT_EQ(n0, 5) << after.counts_string();  // 5 x 21 = 105 vs 7 x 14 = 98 beats 4 x 21 = 84 vs 8 x 14 = 112
}

TEST(Calibrate, ContentionCalibrationRecoversTheLevelAndTheContention) {
  // Rank 0's true state: steps cost alone x (1.3 + 0.5 x share) in decode (the pipeline's
  // neighbour costs 50% of the alone time at full overlap), rank 1 alone x (0.9 + 0.2 x share).
  // Steps of two partitions' stages (different alone sums) at shares across [0, 1]: the least
  // squares recover both exactly, where one factor could not hold at both shares.
  const double truth[2][2][2] = {{{1.1, 0.1}, {1.3, 0.5}}, {{0.8, 0.0}, {0.9, 0.2}}};  // [rank][phase]{level, contention}
  std::vector<StepSample> steps;
  for (int r = 0; r < 2; ++r)
    for (int ph = 0; ph < 2; ++ph)
      for (double a : {40.0, 55.0})     // the two partitions' stages on this rank
        for (int i = 0; i <= 8; ++i) {  // shares 0, 1/8, ..., 1
          const double s = i / 8.0;
          steps.push_back({r, ph, a, s, a * (truth[r][ph][0] + truth[r][ph][1] * s)});
        }
  const ContentionCalibration c = contention_calibration(steps, 3);
  ASSERT_EQ(c.level.size(), 6u);
  for (int r = 0; r < 2; ++r)
    for (int ph = 0; ph < 2; ++ph) {
      EXPECT_NEAR(c.level[2 * r + ph], truth[r][ph][0], 1e-12) << r << ph;
      EXPECT_NEAR(c.contention[2 * r + ph], truth[r][ph][1], 1e-12) << r << ph;
      EXPECT_EQ(c.fit[2 * r + ph], CalibrationFit::contention);
    }
  EXPECT_EQ(c.fit[4], CalibrationFit::none);  // rank 2 ran nothing: the profile as it is
  EXPECT_EQ(c.level[4], 1.0);
  EXPECT_TRUE(std::isnan(c.contention[5]));
}

TEST(Calibrate, ContentionCalibrationFallsBackToTheLevelWhereTheShareDoesNotVary) {
  // Every step at share 0.6 (the spread criterion fails: var = 0): the level alone on the
  // profile's own contended step, sum m / sum (a + e s) with the profile's excess e = 10.
  std::vector<StepSample> steps;
  for (int i = 0; i < 10; ++i) steps.push_back({0, 1, 50.0, 0.6, 62.0 + (i % 2), 10.0});
  // Rank 1: the steps overlapped run faster than those alone (noise, not contention): a
  // negative contention is unphysical, so the level alone; the profile's excess is negative
  // (a disturbed alone pass): taken as 0.
  for (int i = 0; i <= 4; ++i) steps.push_back({1, 1, 50.0, i / 4.0, 60.0 - 4.0 * i, -20.0});
  // Rank 1 prefill: a constant cost whatever the share: level 1.1, contention 0 (fitted at 0,
  // or at -0 by rounding and then the level alone: the same factors).
  for (int i = 0; i <= 4; ++i) steps.push_back({1, 0, 20.0, i / 4.0, 22.0});
  steps.push_back({1, 0, std::nan(""), 0.5, 22.0});  // not finite: left out
  steps.push_back({3, 0, 20.0, 0.5, 99.0});          // no such rank: left out
  const ContentionCalibration c = contention_calibration(steps, 2);
  EXPECT_EQ(c.fit[1], CalibrationFit::level);
  EXPECT_NEAR(c.level[1], (10 * 62.0 + 5) / (10 * (50.0 + 6.0)), 1e-12);
  EXPECT_TRUE(std::isnan(c.contention[1]));
  EXPECT_EQ(c.fit[3], CalibrationFit::level);
  EXPECT_NEAR(c.level[3], (5 * 60.0 - 40.0) / (5 * 50.0), 1e-12);
  EXPECT_TRUE(std::isnan(c.contention[3]));
  EXPECT_NE(c.fit[2], CalibrationFit::none);
  EXPECT_NEAR(c.level[2], 1.1, 1e-12);
  if (c.fit[2] == CalibrationFit::contention) EXPECT_NEAR(c.contention[2], 0.0, 1e-12);
  EXPECT_EQ(c.fit[0], CalibrationFit::none);  // rank 0 prefill: no steps
}

}  // namespace
}  // namespace ppb::balance
