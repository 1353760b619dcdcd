// Unit tests of src/common/stats: percentiles, and the paired comparison behind every gain's
// confidence interval and verdict (an A/A comparison must find no difference, a real one must
// find it, and the interval must cover the truth about as often as it claims).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/stats.h"

namespace ppb {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(Stats, PercentileInterpolatesAndSkipsNaN) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, kNaN, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 25), 1.75);  // numpy.percentile([1,2,3,4], 25)
  EXPECT_TRUE(std::isnan(percentile({kNaN}, 50)));
}

/// Rounds of a benchmark on a drifting machine: round r's tokens/s of partition A and B share
/// a round factor (drift, a neighbour's job) and each has its own noise; B = gain * A in truth.
struct Rounds {
  std::vector<double> a, b;
};
Rounds simulate_rounds(int n, double gain, double round_noise, double own_noise, std::mt19937_64& rng) {
  std::normal_distribution<double> shared(0.0, round_noise), own(0.0, own_noise);
  Rounds r;
  for (int i = 0; i < n; ++i) {
    const double drift = 100.0 * std::exp(shared(rng));
    r.a.push_back(drift * std::exp(own(rng)));
    r.b.push_back(gain * drift * std::exp(own(rng)));
  }
  return r;
}

TEST(Stats, PairedComparisonOfEqualPartitionsCoversOne) {
  // The same split twice (an A/A comparison), 10 rounds with 10% drift between rounds and 3%
  // noise of its own per repetition: no significant difference, and the CI covers 1.
  std::mt19937_64 rng(7);
  const Rounds r = simulate_rounds(10, 1.0, 0.10, 0.03, rng);
  const PairedComparison c = compare_paired(r.a, r.b);
  EXPECT_EQ(c.n, 10);
  EXPECT_LE(c.ci_low, c.ratio);
  EXPECT_GE(c.ci_high, c.ratio);
  EXPECT_LT(c.ci_low, 1.0);
  EXPECT_GT(c.ci_high, 1.0);
  EXPECT_EQ(comparison_verdict(c), "no significant difference");
  // Pairing is what narrows it: the round factor cancels in each pair, so the interval is
  // about the 3% noise wide, not the 10% drift (unpaired, i.e. rounds shuffled, it is wider).
  std::vector<double> shuffled = r.b;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  const PairedComparison u = compare_paired(r.a, shuffled);
  EXPECT_LT(c.ci_high - c.ci_low, u.ci_high - u.ci_low);
}

TEST(Stats, PairedComparisonFindsARealGainAndALoss) {
  std::mt19937_64 rng(11);
  const Rounds up = simulate_rounds(12, 1.20, 0.10, 0.03, rng);
  const PairedComparison g = compare_paired(up.a, up.b);
  EXPECT_EQ(comparison_verdict(g), "faster");
  EXPECT_GT(g.ci_low, 1.0);
  EXPECT_LT(g.ci_low, 1.20);  // covers the truth
  EXPECT_GT(g.ci_high, 1.20);
  const Rounds down = simulate_rounds(12, 0.85, 0.10, 0.03, rng);
  EXPECT_EQ(comparison_verdict(compare_paired(down.a, down.b)), "slower");
}

TEST(Stats, PairedComparisonCoversTheTruthAboutAsOftenAsItSays) {
  // 400 simulated benchmarks of 10 rounds with a true gain of 1.1: a 95% interval should miss
  // it in ~5% of them (binomial(400, 0.05): 20 +- 4.4). A percentile bootstrap of a median
  // from 10 pairs is only approximately exact (Efron & Tibshirani 1993, ch. 13-14; it missed 9
  // times here, i.e. it is a little conservative); more than 48 misses (12%) would say the
  // interval claims far more than it holds, fewer than 4 that it is uselessly wide.
  std::mt19937_64 rng(2024);
  int misses = 0;
  for (int t = 0; t < 400; ++t) {
    const Rounds r = simulate_rounds(10, 1.1, 0.10, 0.03, rng);
    const PairedComparison c = compare_paired(r.a, r.b, 0.95, 2000, 1000 + t);
    if (!(c.ci_low <= 1.1 && 1.1 <= c.ci_high)) ++misses;
  }
  std::printf("coverage misses: %d of 400\n", misses);
  EXPECT_LE(misses, 48);
  EXPECT_GE(misses, 4);
}

TEST(Stats, PairedComparisonNeedsFivePairsAndDropsMissingOnes) {
  // 4 usable pairs: a ratio but no interval, and the verdict says so.
  const PairedComparison few = compare_paired({10, 10, kNaN, 10, 10, 10}, {11, 12, 11, 0, 11, 11});
  EXPECT_EQ(few.n, 4);  // the NaN pair and the pair with a 0 are dropped
  EXPECT_DOUBLE_EQ(few.ratio, 1.1);
  EXPECT_TRUE(std::isnan(few.ci_low));
  EXPECT_EQ(comparison_verdict(few), "too few repetitions");
  // Reproducible: the same data give the same interval.
  const std::vector<double> a{10, 11, 9, 10, 12, 10}, b{11, 12, 10, 12, 13, 11};
  const PairedComparison x = compare_paired(a, b), y = compare_paired(a, b);
  EXPECT_EQ(x.ci_low, y.ci_low);
  EXPECT_EQ(x.ci_high, y.ci_high);
  EXPECT_THROW(compare_paired({1, 2}, {1}), InternalError);
  EXPECT_THROW(compare_paired({1, 2}, {1, 2}, 1.0), InternalError);
}

}  // namespace
}  // namespace ppb
