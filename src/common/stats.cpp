#include "common/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include <boost/math/distributions/normal.hpp>
#include <boost/math/distributions/students_t.hpp>

#include "common/error.h"

namespace ppb {

double percentile(std::vector<double> v, double q) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  double pos = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, v.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return v[lo] + frac * (v[hi] - v[lo]);
}

double mean(const std::vector<double>& v) {
  double sum = 0.0;
  size_t n = 0;
  for (double x : v) {
    if (!std::isnan(x)) {
      sum += x;
      ++n;
    }
  }
  return n ? sum / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
}

double harmonic_mean(const std::vector<double>& v) {
  double inverse_sum = 0.0;
  size_t n = 0;
  for (double x : v) {
    if (std::isfinite(x) && x > 0) {
      inverse_sum += 1.0 / x;
      ++n;
    }
  }
  return n ? static_cast<double>(n) / inverse_sum : std::numeric_limits<double>::quiet_NaN();
}

double expanded_tail(int n, double tail) {
  if (n < 2 || !(tail > 0.0 && tail < 0.5)) throw InternalError("expanded_tail: need n >= 2 and tail in (0, 0.5)");
  const double t = boost::math::quantile(boost::math::students_t(n - 1), tail);  // < 0
  return boost::math::cdf(boost::math::normal(), std::sqrt(static_cast<double>(n) / (n - 1)) * t);
}

PairedComparison compare_paired(const std::vector<double>& a, const std::vector<double>& b, double level,
                                int resamples, uint64_t seed) {
  if (a.size() != b.size()) throw InternalError("compare_paired: a and b differ in length");
  if (!(level > 0.0 && level < 1.0)) throw InternalError("compare_paired: level must be in (0, 1)");
  std::vector<double> x, y;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(a[i]) && std::isfinite(b[i]) && a[i] > 0 && b[i] > 0) {
      x.push_back(a[i]);
      y.push_back(b[i]);
    }
  }
  PairedComparison c;
  c.n = static_cast<int>(x.size());
  if (c.n == 0) return c;
  c.ratio = harmonic_mean(y) / harmonic_mean(x);
  if (c.n < kMinPairsForCI || resamples < 1) return c;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
  // Each resample's harmonic means from the pairs' inverses, summed in the order drawn: the same
  // operations harmonic_mean does on the resampled vectors (every value is finite and > 0), so
  // the same bits, without copying the resample.
  std::vector<double> ratios(static_cast<size_t>(resamples)), inv_x(x.size()), inv_y(y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    inv_x[i] = 1.0 / x[i];
    inv_y[i] = 1.0 / y[i];
  }
  const double n = static_cast<double>(x.size());
  for (double& r : ratios) {
    double sx = 0.0, sy = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t j = pick(rng);
      sx += inv_x[j];
      sy += inv_y[j];
    }
    r = (n / sy) / (n / sx);
  }
  const double tail = 100.0 * expanded_tail(c.n, (1.0 - level) / 2.0);
  c.ci_low = percentile(ratios, tail);
  c.ci_high = percentile(ratios, 100.0 - tail);
  return c;
}

StreamingPairedComparison::StreamingPairedComparison(int resamples, uint64_t seed)
    : rng_(seed), sum_inv_a_(static_cast<size_t>(std::max(resamples, 1)), 0.0),
      sum_inv_b_(static_cast<size_t>(std::max(resamples, 1)), 0.0) {}

void StreamingPairedComparison::add(double a, double b) {
  if (!(std::isfinite(a) && std::isfinite(b) && a > 0 && b > 0)) return;
  ++n_;
  const double ia = 1.0 / a, ib = 1.0 / b;
  inv_a_ += ia;  // in arrival order: harmonic_mean's sums over the same pairs
  inv_b_ += ib;
  std::poisson_distribution<int> weight(1.0);
  for (size_t k = 0; k < sum_inv_a_.size(); ++k) {
    const int w = weight(rng_);
    if (w == 0) continue;
    sum_inv_a_[k] += w * ia;
    sum_inv_b_[k] += w * ib;
  }
}

PairedComparison StreamingPairedComparison::current(double level) const {
  if (!(level > 0.0 && level < 1.0)) throw InternalError("StreamingPairedComparison: level must be in (0, 1)");
  PairedComparison c;
  c.n = n_;
  if (n_ == 0) return c;
  const double n = static_cast<double>(n_);
  c.ratio = (n / inv_b_) / (n / inv_a_);
  if (n_ < kMinPairsForCI) return c;
  // A resample's ratio of harmonic means is sum(w / a) / sum(w / b): its weight total cancels.
  // A resample that drew no pair (all weights 0: probability e^-n) has none: NaN, skipped.
  std::vector<double> ratios(sum_inv_a_.size());
  for (size_t k = 0; k < ratios.size(); ++k)
    ratios[k] = sum_inv_b_[k] > 0 ? sum_inv_a_[k] / sum_inv_b_[k] : std::numeric_limits<double>::quiet_NaN();
  const double tail = 100.0 * expanded_tail(c.n, (1.0 - level) / 2.0);
  c.ci_low = percentile(ratios, tail);
  c.ci_high = percentile(ratios, 100.0 - tail);
  return c;
}

std::string comparison_verdict(const PairedComparison& c) {
  if (std::isnan(c.ci_low) || std::isnan(c.ci_high)) return "too few repetitions";
  if (c.ci_low > 1.0) return "faster";
  if (c.ci_high < 1.0) return "slower";
  return "no significant difference";
}

}  // namespace ppb
