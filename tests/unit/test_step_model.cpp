// The step-cost model (stepcost/step_model.h): the grid it times, the fit recovering a synthetic
// cost function of known shape (a fixed cost, a knee at 16/17 tokens, a curved GEMM term, the
// attention terms), and its held-out error bounding the error everywhere it interpolates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <random>

#include "common/error.h"
#include "stepcost/step_model.h"

namespace ppb::stepcost {
namespace {

/// A small-M kernel of register blocks of 4, 2 and 1 rows, as the CPU backend's
/// (cpu_small_m_kernel.inc): each pass over the weights costs 0.5 ms plus 0.05 ms per row, so
/// 3 rows (passes of 2 and 1) cost 1.15 ms and 4 rows (one pass) 0.7: not monotone, not linear.
double small_m_gemm_ms(double T) {
  double ms = 0.0;
  for (int m = static_cast<int>(T); m > 0;) {
    const int rows = m >= 4 ? 4 : m >= 2 ? 2 : 1;
    ms += 0.5 + 0.05 * rows;
    m -= rows;
  }
  return ms;
}

/// A unit's synthetic cost (ms): a fixed 0.5 ms per step, the small-M kernel above up to 16
/// tokens, then a library GEMM with a 3 ms packing cost and 0.05 ms per token^1.15 (curved: the
/// piecewise-linear g can only interpolate it), attention at 2e-4 ms per prefill key and 5e-5
/// per decode key.
double synthetic_ms(const StepWork& w) {
  const double T = w.tokens;
  const double gemm = T <= 16 ? small_m_gemm_ms(T) : 3.0 + 0.05 * std::pow(T, 1.15);
  return 0.5 + gemm + 2e-4 * w.prefill_keys + 5e-5 * w.decode_keys;
}

/// The head's synthetic cost: per row, whatever the tokens (0.8 ms + 1.1 ms per row, knee at 16).
double synthetic_head_ms(const StepWork& w) { return 0.8 + (w.rows <= 16 ? 1.1 * w.rows : 4.0 + 0.9 * w.rows); }

GridSpec serving_spec() {
  GridSpec s;
  s.max_rows = 32;
  s.max_tokens = 512;
  s.max_context = 96;
  s.contexts = {64, 79, 95};
  return s;
}

std::vector<Sample> time_grid(const std::vector<GridStep>& grid, double (*cost)(const StepWork&)) {
  std::vector<Sample> out;
  for (const GridStep& g : grid) out.push_back({g.work(), cost(g.work()), g.role});
  return out;
}

TEST(StepModel, StepWorkCountsTokensRowsAndKeys) {
  // a prefill of 4 at 0 (keys 1+2+3+4), a chunk of 3 at 5 (6+7+8), two decodes at 9 and 0
  const StepWork w = step_work({0, 5, 9, 0}, {4, 3, 1, 1});
  EXPECT_EQ(w.tokens, 9.0);
  EXPECT_EQ(w.rows, 4.0);
  EXPECT_EQ(w.prefill_keys, 10.0 + 21.0);
  EXPECT_EQ(w.decode_keys, 10.0 + 1.0);
  EXPECT_THROW(step_work({0}, {0}), InternalError);
  EXPECT_THROW(step_work({0, 1}, {1}), InternalError);
}

TEST(StepModel, GridHasEveryCountTo16AndBothSidesOfEachPowerOfTwoAndFitsTheCache) {
  const GridSpec s = serving_spec();
  const std::vector<int> k = knot_tokens(s);
  const std::vector<int> want = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                  17, 32, 33, 64, 65, 128, 129, 256, 257, 512};
  EXPECT_EQ(k, want);
  int knots = 0, contexts = 0, attention = 0, held = 0;
  for (const GridStep& g : plan_grid(s)) {
    ASSERT_FALSE(g.pos.empty());
    EXPECT_LE(static_cast<int>(g.pos.size()), s.max_rows);
    int T = 0;
    for (std::size_t i = 0; i < g.pos.size(); ++i) {
      EXPECT_LE(g.pos[i] + g.tokens[i], s.max_context);
      T += g.tokens[i];
    }
    EXPECT_LE(T, s.max_tokens);
    knots += g.role == Role::knot;
    contexts += g.role == Role::context;
    attention += g.role == Role::attention;
    held += g.role == Role::held_out;
  }
  EXPECT_EQ(knots, static_cast<int>(want.size()));
  EXPECT_EQ(contexts, 3);
  EXPECT_GE(attention, 2);
  EXPECT_EQ(held, 5 + 3);  // five between knots (17..512), a 3-token prompt, a half decode, a mixed step
  // A tiny closed workload (B=4, P=4, G=8: steps of at most 16 tokens) still gets a grid.
  GridSpec tiny;
  tiny.max_rows = 4, tiny.max_tokens = 16, tiny.max_context = 12, tiny.contexts = {4, 7, 11};
  EXPECT_EQ(knot_tokens(tiny), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}));
  EXPECT_FALSE(plan_grid(tiny).empty());
  tiny.max_tokens = 49;  // more than B rows of the cache hold
  EXPECT_THROW(plan_grid(tiny), InternalError);
}

TEST(StepModel, FitRecoversASyntheticCostWithinItsHeldOutError) {
  const GridSpec s = serving_spec();
  const std::vector<Sample> samples = time_grid(plan_grid(s), synthetic_ms);
  const UnitModel m = fit_unit(samples, false);
  // The attention terms are linear in the keys: recovered to rounding.
  EXPECT_NEAR(m.decode_key_ms, 5e-5, 1e-12);
  EXPECT_NEAR(m.prefill_key_ms, 2e-4, 1e-12);
  // At every knot g is the synthetic GEMM plus the fixed cost, exactly (both sides of the knee).
  for (std::size_t i = 0; i < m.knots.size(); ++i) {
    const double T = m.knots[i];
    EXPECT_NEAR(m.base_ms[i], 0.5 + (T <= 16 ? small_m_gemm_ms(T) : 3.0 + 0.05 * std::pow(T, 1.15)), 1e-9) << "T=" << T;
  }
  const std::vector<double> err = held_out_errors(m, samples);
  ASSERT_EQ(err.size(), 8u);
  double reported = 0.0;
  for (double e : err) reported = std::max(reported, std::abs(e));
  EXPECT_GT(reported, 0.0);   // the curved term is not piecewise linear...
  EXPECT_LT(reported, 0.02);  // ...but between knots a factor <= 2 apart it is within 2%
  // Everywhere between the knots (every T, in B, B/2 or one row; with decodes beside): the
  // model is within the error it reports on its held-out steps (to 5% of it: the curved term's
  // interpolation error peaks near a segment's arithmetic middle, the held-out steps sit at
  // its geometric one).
  std::mt19937 rng(7);
  double worst = 0.0;
  for (int T = 1; T <= s.max_tokens; ++T)
    for (int rows : {std::min(T, s.max_rows), std::max(1, std::min(T, s.max_rows) / 2)}) {
      if ((T + rows - 1) / rows > s.max_context) continue;
      std::vector<int> pos(static_cast<std::size_t>(rows), 0), tok;
      for (int r = 0; r < rows; ++r) tok.push_back(T / rows + (r < T % rows ? 1 : 0));
      const StepWork w = step_work(pos, tok);
      worst = std::max(worst, std::abs(m.ms(w) / synthetic_ms(w) - 1.0));
    }
  EXPECT_LE(worst, reported * 1.05) << "held-out " << reported;
  std::printf("held-out max |error| %.4f%%, everywhere %.4f%%\n", 100 * reported, 100 * worst);
  // A knot step, a decode step at any context, a fixed-cost-dominated single token, and 3
  // decode rows (two passes of the small-M kernel: dearer than 4, which a line from 2 to 4
  // tokens would price at the mean of the two): exact.
  EXPECT_GT(synthetic_ms(step_work({50, 50, 50}, {1, 1, 1})), synthetic_ms(step_work({50, 50, 50, 50}, {1, 1, 1, 1})));
  for (const StepWork& w : {step_work({0}, {1}), step_work(std::vector<int>(32, 50), std::vector<int>(32, 1)),
                            step_work({0, 0}, {8, 8}), step_work({50, 50, 50}, {1, 1, 1})})
    EXPECT_NEAR(m.ms(w), synthetic_ms(w), 1e-9 * synthetic_ms(w));
}

// The grid's level against the cycles: a model of g(T) = T ms on two units, B = 2, P = 4 (its
// prefill step 8 ms, each decode 2 ms), against cycles of 12 ms per prefill and 3 ms per decode:
// 1.5 for both kinds; the predictions take sqrt (kCyclesLevelWeight 0.5). Sums that cannot be
// formed give 1; arrays of the wrong size throw.
TEST(StepModel, LevelAgainstTheCyclesIsTheirSumsRatio) {
  stepcost::UnitModel m;
  m.knots = {1, 8};
  m.base_ms = {1, 8};
  const std::vector<stepcost::UnitModel> models = {m};
  const stepcost::Level l = stepcost::level_against(models, {0, 0}, 2, 4, {5, 6}, {12, 12}, {3, 3, 3, 3});
  EXPECT_NEAR(l.decode, 1.5, 1e-12);
  EXPECT_NEAR(l.prefill, 1.5, 1e-12);
  EXPECT_NEAR(stepcost::pooled_level(l, true), std::sqrt(1.5), 1e-12);
  EXPECT_NEAR(stepcost::pooled_level({0.81, 1.21}, false), 0.9, 1e-12);
  EXPECT_NEAR(stepcost::pooled_level({0.81, 1.21}, true), 1.1, 1e-12);
  const stepcost::Level none = stepcost::level_against(models, {0, 0}, 2, 4, {}, {0, 0}, {});
  EXPECT_EQ(none.decode, 1.0);
  EXPECT_EQ(none.prefill, 1.0);
  EXPECT_THROW(stepcost::level_against(models, {0, 0}, 2, 4, {5, 6}, {12}, {3, 3, 3, 3}), InternalError);
  EXPECT_THROW(stepcost::level_against(models, {0, 0}, 2, 4, {5, 6}, {12, 12}, {3, 3}), InternalError);
}

// A forward's fixed cost: pairs of a one-unit stage (t1 = F + u) and a two-unit stage (t2 = F +
// 2u) give 2·t1 - t2 = F whatever u; the predictions take it only where all 18 pairs (two
// windows of 9) have one sign and it is at least 10% of a one-unit forward.
TEST(StepModel, FixedCostIsTheMedianPairTakenWhereSignedAndMaterial) {
  const double F = 0.6;
  const int n = kFixedCostSamples;
  ASSERT_EQ(n, 18);
  std::vector<double> one, two;
  for (int i = 0; i < n; ++i) {
    const double u = 4.0 + 0.1 * i, noise = 0.02 * (i % 3 - 1);  // pairs' F: 0.58, 0.60, 0.62
    one.push_back(F + u);
    two.push_back(F + 2 * u - noise);
  }
  const FixedCost f = fixed_cost_of(one, two);
  EXPECT_EQ(f.pairs, n);
  EXPECT_NEAR(f.ms, F, 1e-12);
  EXPECT_NEAR(f.lo_ms, F - 0.02, 1e-12);
  EXPECT_NEAR(f.hi_ms, F + 0.02, 1e-12);
  EXPECT_NEAR(f.one_ms, F + 4.85, 1e-12);  // the median of 18: between the 9th and 10th
  EXPECT_TRUE(f.taken());                  // 0.6 of 5.45 ms: 11%
  EXPECT_NEAR(f.applied_ms(), F, 1e-12);
  // A stage of n units pays it once: its units' sum less (n - 1) F.
  EXPECT_EQ(stage_fixed_correction_ms(1, F), 0.0);
  EXPECT_NEAR(stage_fixed_correction_ms(4, F), -3 * F, 1e-15);
  // Under 10% of a unit (units 2x longer): measured, not taken.
  std::vector<double> one_long = one, two_long = two;
  for (int i = 0; i < n; ++i) one_long[i] += 5.0, two_long[i] += 10.0;
  const FixedCost small = fixed_cost_of(one_long, two_long);
  EXPECT_NEAR(small.ms, F, 1e-9);
  EXPECT_FALSE(small.taken());
  EXPECT_EQ(small.applied_ms(), 0.0);
  // One pair of the other sign (in either window): not taken; a negative F of one sign is.
  for (int at : {4, 13}) {
    std::vector<double> two_mixed = two;
    two_mixed[at] = 2 * one[at] + 0.01;
    EXPECT_FALSE(fixed_cost_of(one, two_mixed).taken()) << at;
  }
  std::vector<double> two_neg;
  for (int i = 0; i < n; ++i) two_neg.push_back(2 * one[i] + 0.6 + 0.01 * i);
  const FixedCost neg = fixed_cost_of(one, two_neg);
  EXPECT_NEAR(neg.ms, -0.685, 1e-12);
  EXPECT_TRUE(neg.taken());
  // One window's pairs alone are not enough; none: nothing.
  EXPECT_FALSE(fixed_cost_of({one.begin(), one.begin() + 9}, {two.begin(), two.begin() + 9}).taken());
  EXPECT_EQ(fixed_cost_of({}, {}).applied_ms(), 0.0);
  EXPECT_THROW(fixed_cost_of(one, {two.begin(), two.begin() + 8}), InternalError);
}

TEST(StepModel, TheHeadIsFittedInRowsNotTokens) {
  const GridSpec s = serving_spec();
  const std::vector<Sample> samples = time_grid(plan_grid(s), synthetic_head_ms);
  const UnitModel m = fit_unit(samples, true);
  for (int rows = 1; rows <= s.max_rows; ++rows) {
    const StepWork w = step_work(std::vector<int>(static_cast<std::size_t>(rows), 0),
                                 std::vector<int>(static_cast<std::size_t>(rows), 3));
    EXPECT_NEAR(m.ms(w), synthetic_head_ms(w), 1e-9) << rows << " rows";  // linear on each side of 16/17
  }
  for (double e : held_out_errors(m, samples)) EXPECT_NEAR(e, 0.0, 1e-12);
  EXPECT_THROW(fit_unit({}, true), InternalError);
}

TEST(StepModel, WholeModelErrorWeighsEachUnitByItsTime) {
  // Signature 0: a unit of microseconds whose held-out steps measured 50% slow (noise at that
  // size); signature 1: 28 layers of the synthetic cost, exactly. Per signature the largest
  // error is the tiny unit's 1/1.5 - 1; over the whole model it is its share of the sum.
  const std::vector<GridStep> grid = plan_grid(serving_spec());
  const std::size_t N = grid.size();
  std::vector<double> ms(2 * N);
  for (std::size_t n = 0; n < N; ++n) {
    const double layer = synthetic_ms(grid[n].work());
    ms[n] = 1e-3 * (1.0 + grid[n].work().tokens) * (grid[n].role == Role::held_out ? 1.5 : 1.0);
    ms[N + n] = layer;
  }
  const GridFit per = fit_grid(grid, {0, 0}, ms);
  EXPECT_NEAR(per.abs_error_max, 1.0 - 1.0 / 1.5, 1e-9);
  std::vector<int> unit_signature(29, 1);
  unit_signature[0] = 0;  // one embedding, 28 layers
  const GridFit whole = fit_profile_grid(flatten(grid), {0, 0}, ms, unit_signature);
  EXPECT_LT(whole.abs_error_max, 0.02);  // the layers' interpolation error and the tiny unit's share
  EXPECT_LE(whole.abs_error_p50, whole.abs_error_max);
  EXPECT_THROW(fit_profile_grid(flatten(grid), {0, 0}, ms, {0, 2}), UserError);  // no signature 2
}

}  // namespace
}  // namespace ppb::stepcost
