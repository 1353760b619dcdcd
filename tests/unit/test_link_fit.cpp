// The link model's fit (common/link_fit.h) and the probe's size ladder (transport/link_probe.h):
// exact α-β data is recovered, noise is bounded by the fit's own max_rel_error, the relative
// weighting keeps the latency where unweighted least squares loses it, the constraints hold.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/error.h"
#include "common/link_fit.h"
#include "transport/link_probe.h"

namespace ppb {
namespace {

/// Samples of t(n) = alpha + n / bw at the probe's sizes up to 256 MiB, each time times
/// factor(i) (1 = exact), as medians (min = median).
template <typename Factor>
std::vector<LinkSample> ladder(double alpha, double bw, Factor factor) {
  std::vector<LinkSample> v;
  int i = 0;
  for (size_t n : link_sweep_sizes(size_t(256) << 20)) {
    const double t = (alpha + static_cast<double>(n) / bw) * factor(i++);
    v.push_back({static_cast<double>(n), t, t, 5});
  }
  return v;
}

/// Σ ((model - t) / t)^2: what fit_link minimises.
double relative_sse(const LinkFit& f, const std::vector<LinkSample>& v) {
  double s = 0;
  for (const LinkSample& x : v) s += std::pow((link_fit_time_s(f, x.bytes) - x.median_s) / x.median_s, 2);
  return s;
}

TEST(LinkFit, ExactLatencyBandwidthDataIsRecovered) {
  const auto v = ladder(5e-6, 150e9, [](int) { return 1.0; });  // NVLink-like: 5 us, 150 GB/s
  const LinkFit f = fit_link(v);
  EXPECT_NEAR(f.latency_s, 5e-6, 5e-6 * 1e-9);
  EXPECT_NEAR(f.bandwidth_Bps, 150e9, 150e9 * 1e-9);
  EXPECT_LT(f.max_rel_error, 1e-9);
}

TEST(LinkFit, EverySizeIsWithinTheFitsBoundWhichOneSizeReaches) {
  // +-20% alternating noise on a 50 us, 3 GB/s link (the CPU transport's order of magnitude).
  const auto v = ladder(50e-6, 3e9, [](int i) { return i % 2 ? 1.2 : 0.8; });
  const LinkFit f = fit_link(v);
  double worst = 0;
  for (const LinkSample& x : v) {
    const double rel = std::abs(link_fit_time_s(f, x.bytes) - x.median_s) / x.median_s;
    EXPECT_LE(rel, f.max_rel_error * (1 + 1e-12)) << x.bytes << " B";
    worst = std::max(worst, rel);
  }
  EXPECT_DOUBLE_EQ(worst, f.max_rel_error);  // the bound is the tightest: one size reaches it
  EXPECT_LT(f.max_rel_error, 0.5);
  EXPECT_NEAR(f.latency_s, 50e-6, 50e-6 * 0.25);
  EXPECT_NEAR(f.bandwidth_Bps, 3e9, 3e9 * 0.25);
}

TEST(LinkFit, IsTheLeastSquaresOptimumInRelativeError) {
  const auto v = ladder(20e-6, 10e9, [](int i) { return 1.0 + 0.07 * std::sin(1.7 * i); });
  const LinkFit f = fit_link(v);
  const double best = relative_sse(f, v);
  for (const double d : {0.99, 1.01}) {
    EXPECT_GT(relative_sse({f.latency_s * d, f.bandwidth_Bps, 0}, v), best) << "latency x" << d;
    EXPECT_GT(relative_sse({f.latency_s, f.bandwidth_Bps * d, 0}, v), best) << "bandwidth x" << d;
  }
}

TEST(LinkFit, RelativeWeightsKeepTheLatencyThatUnweightedLeastSquaresLoses) {
  // 2 us and 25 GB/s, the largest size 3% slow: an unweighted fit of the times drives the
  // latency to about -3% of 10.7 ms (negative); the relative fit keeps it near 2 us.
  auto v = ladder(2e-6, 25e9, [](int) { return 1.0; });
  v.back().median_s *= 1.03;
  const LinkFit f = fit_link(v);
  EXPECT_NEAR(f.latency_s, 2e-6, 0.2e-6);
  EXPECT_NEAR(f.bandwidth_Bps, 25e9, 25e9 * 0.03);
  double sx = 0, sy = 0, sxx = 0, sxy = 0;  // the unweighted line, for contrast
  for (const LinkSample& x : v) {
    sx += x.bytes;
    sy += x.median_s;
    sxx += x.bytes * x.bytes;
    sxy += x.bytes * x.median_s;
  }
  const double n = static_cast<double>(v.size()), slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  EXPECT_LT((sy - slope * sx) / n, 0.0);
}

TEST(LinkFit, ConstraintsKeepLatencyAndBandwidthNonNegative) {
  // Times that fall with the size: no bandwidth term (0 = infinite), the latency their fit.
  const LinkFit flat = fit_link({{8, 2e-5, 2e-5, 3}, {4096, 1e-5, 1e-5, 3}});
  EXPECT_EQ(flat.bandwidth_Bps, 0.0);
  EXPECT_GT(flat.latency_s, 1e-5);
  EXPECT_LT(flat.latency_s, 2e-5);
  EXPECT_DOUBLE_EQ(link_fit_time_s(flat, 1e9), flat.latency_s);
  // Small sizes faster than the line through the large ones: latency 0, bandwidth alone.
  const LinkFit line = fit_link({{1e3, 0.5e-6, 0.5e-6, 3}, {1e6, 1e-3, 1e-3, 3}, {1e9, 1.0, 1.0, 3}});
  EXPECT_EQ(line.latency_s, 0.0);
  // β alone minimises Σ (β n_i / t_i − 1)²: the 1 KiB size at twice its rate pulls it up to 1.5 GB/s.
  EXPECT_NEAR(line.bandwidth_Bps, 1.5e9, 1e-6 * 1.5e9);
  // One size: the latency alone.
  EXPECT_DOUBLE_EQ(fit_link({{64, 3e-6, 3e-6, 3}}).latency_s, 3e-6);
}

TEST(LinkFit, NoUsableSampleIsAnInternalError) {
  EXPECT_THROW(fit_link({}), InternalError);
  EXPECT_THROW(fit_link({{8, 0, 0, 3}, {64, NAN, NAN, 3}}), InternalError);
}

TEST(LinkSweepSizes, EightBytesThenPowersOfFourTo256MiB) {
  const auto s = link_sweep_sizes(size_t(256) << 20);
  ASSERT_EQ(s.size(), 13u);
  EXPECT_EQ(s.front(), 8u);
  EXPECT_EQ(s[1], 64u);
  EXPECT_EQ(s.back(), size_t(256) << 20);
  EXPECT_NE(std::find(s.begin(), s.end(), size_t(4) << 20), s.end());  // link_matrix's size
  EXPECT_EQ(link_sweep_sizes(100), (std::vector<size_t>{8, 64}));
  EXPECT_TRUE(link_sweep_sizes(4).empty());
  EXPECT_EQ(link_sweep_sizes((size_t(256) << 20) - 1).back(), size_t(64) << 20);
}

}  // namespace
}  // namespace ppb
