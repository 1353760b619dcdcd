// Summary statistics shared by the profiler, the benchmark metrics and the report.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ppb {

/// Percentile q in [0, 100] of `v` with linear interpolation between closest ranks
/// (numpy's default "linear" method). NaN values are ignored; NaN if none remain.
double percentile(std::vector<double> v, double q);
inline double median(const std::vector<double>& v) { return percentile(v, 50.0); }
/// Arithmetic mean ignoring NaN; NaN if empty.
double mean(const std::vector<double>& v);

/// Fewest pairs compare_paired() gives a confidence interval for: below it a percentile
/// bootstrap has too few distinct resamples to mean anything (Hoefler & Belli, SC'15, sec. 3.2:
/// report a CI only where the sample supports one).
inline constexpr int kMinPairsForCI = 5;

/// One figure of partition B against partition A from paired repetitions: a[i] and b[i] were
/// measured side by side (round i of an interleaved benchmark), so that drift between rounds
/// falls on both.
struct PairedComparison {
  double ratio = std::numeric_limits<double>::quiet_NaN();    ///< median(b) / median(a)
  double ci_low = std::numeric_limits<double>::quiet_NaN();   ///< CI of ratio; NaN when n < kMinPairsForCI
  double ci_high = std::numeric_limits<double>::quiet_NaN();
  int n = 0;  ///< pairs used: both values finite and > 0
  /// (ci_high - ci_low) / 2 / ratio: the CI's relative half-width (NaN without a CI).
  double half_width() const { return (ci_high - ci_low) / 2.0 / ratio; }
};

/// ratio = median(b) / median(a) over the pairs whose two values are finite and > 0 (a figure
/// that is missing in one repetition drops that pair), with a `level` (e.g. 0.95) percentile
/// bootstrap confidence interval that resamples the pairs (B. Efron & R. Tibshirani, "An
/// Introduction to the Bootstrap", 1993, ch. 13; resampling pairs keeps what the two
/// partitions shared in one round). `resamples` draws from a std::mt19937_64 seeded with
/// `seed`: the same data give the same interval. a and b must have one value per round.
/// @throws ppb::InternalError if a and b differ in length or level is outside (0, 1).
PairedComparison compare_paired(const std::vector<double>& a, const std::vector<double>& b, double level = 0.95,
                                int resamples = 10000, uint64_t seed = 20151115);

/// The verdict on a comparison: "faster" (the CI lies above 1), "slower" (below 1), "no
/// significant difference" (it covers 1), or "too few repetitions" (no CI: n < kMinPairsForCI).
std::string comparison_verdict(const PairedComparison& c);

}  // namespace ppb
