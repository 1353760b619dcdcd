// Summary statistics shared by the profiler, the benchmark metrics and the report.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace ppb {

/// Percentile q in [0, 100] of `v` with linear interpolation between closest ranks
/// (numpy's default "linear" method). NaN values are ignored; NaN if none remain.
double percentile(std::vector<double> v, double q);
inline double median(const std::vector<double>& v) { return percentile(v, 50.0); }
/// Arithmetic mean ignoring NaN; NaN if empty.
double mean(const std::vector<double>& v);
/// Harmonic mean n / sum(1/x) of the finite values > 0 of `v` (the others are skipped); NaN if
/// none remain. For rates over equal work (every repetition of a benchmark generates the same
/// tokens) it is the total work over the total time: the rate of the whole measurement
/// (Hoefler & Belli, SC'15, rule 3: summarize rates with the harmonic mean; J. E. Smith,
/// "Characterizing computer performance with a single number", CACM 31(10), 1988).
double harmonic_mean(const std::vector<double>& v);

/// Resamples of compare_paired()'s bootstrap, unless told otherwise (every CI a file or summary
/// reports).
constexpr int kBootstrapResamples = 10000;

/// Fewest pairs compare_paired() gives a confidence interval for: below it a percentile
/// bootstrap has too few distinct resamples to mean anything (Hoefler & Belli, SC'15, sec. 3.2:
/// report a CI only where the sample supports one).
inline constexpr int kMinPairsForCI = 5;

/// One rate of partition B against partition A from paired repetitions: a[i] and b[i] were
/// measured side by side (round i of an interleaved benchmark), so that drift between rounds
/// falls on both.
struct PairedComparison {
  double ratio = std::numeric_limits<double>::quiet_NaN();    ///< harmonic_mean(b) / harmonic_mean(a)
  double ci_low = std::numeric_limits<double>::quiet_NaN();   ///< CI of ratio; NaN when n < kMinPairsForCI
  double ci_high = std::numeric_limits<double>::quiet_NaN();
  int n = 0;  ///< pairs used: both values finite and > 0
  /// (ci_high - ci_low) / 2 / ratio: the CI's relative half-width (NaN without a CI).
  double half_width() const { return (ci_high - ci_low) / 2.0 / ratio; }
};

/// ratio = harmonic_mean(b) / harmonic_mean(a) of two rates (e.g. tokens/s) over the pairs whose
/// two values are finite and > 0 (a figure missing in one repetition drops that pair): with equal
/// work per repetition, A's total time over B's, the ratio of the summarized rates and not a
/// summary of per-round ratios (Hoefler & Belli, SC'15, rules 3 and 4). Not the ratio of
/// medians: on a machine whose speed flips between states for seconds at a time (issue 13: a
/// stage's decode step 1.6x apart between repetitions of one run), the median of ~15 values
/// jumps between the states' modes, and its interval was 1.1-1.7x as wide on the main job's
/// stored rounds. With a `level` (e.g. 0.95) percentile
/// bootstrap confidence interval that resamples the pairs (B. Efron & R. Tibshirani, "An
/// Introduction to the Bootstrap", 1993, ch. 13; resampling pairs keeps what the two
/// partitions shared in one round), at the expanded tails of expanded_tail(): the plain
/// percentile interval of a mean-like statistic from 10 pairs missed the truth 2x as often as
/// it claimed (40 of 400 simulated benchmarks, Stats.PairedComparisonCoversTheTruth...). `resamples` draws from a std::mt19937_64 seeded with
/// `seed`: the same data give the same interval. a and b must have one value per round.
/// @throws ppb::InternalError if a and b differ in length or level is outside (0, 1).
PairedComparison compare_paired(const std::vector<double>& a, const std::vector<double>& b, double level = 0.95,
                                int resamples = kBootstrapResamples, uint64_t seed = 20151115);

/// compare_paired() for pairs that arrive one at a time (a benchmark's rounds), at a cost per
/// pair and per reading that does not grow with the pairs seen: an online Poisson bootstrap
/// (each pair enters resample k with a Poisson(1) weight drawn when it arrives, in place of the
/// multinomial counts of a resample drawn afresh; Hanley & MacGibbon, Comput. Methods Programs
/// Biomed. 83, 2006; Chamandy et al., "Estimating uncertainty for massive data streams", Google,
/// 2012). For n pairs it approximates compare_paired()'s interval (their CIs agree within the
/// bootstraps' Monte-Carlo error for tens of pairs or more); `ratio` and `n` are compare_paired's
/// to the bit. A screening statistic: what a file or summary reports comes from compare_paired.
class StreamingPairedComparison {
 public:
  /// `resamples` (>= 1) resamples, weights drawn from a std::mt19937_64 seeded with `seed`.
  explicit StreamingPairedComparison(int resamples = 2000, uint64_t seed = 20151115);
  /// Adds the pair (a, b) of one round; skipped (as compare_paired skips it) unless both are
  /// finite and > 0. O(resamples).
  void add(double a, double b);
  /// The comparison of the pairs so far at `level` (as compare_paired's: expanded tails; no CI
  /// below kMinPairsForCI pairs). O(resamples).
  /// @throws ppb::InternalError if level is outside (0, 1).
  PairedComparison current(double level = 0.95) const;

 private:
  std::mt19937_64 rng_;
  std::vector<double> sum_inv_a_, sum_inv_b_;  // per resample: sum of weight / a and weight / b
  double inv_a_ = 0.0, inv_b_ = 0.0;           // sum of 1 / a and 1 / b over the pairs
  int n_ = 0;
};

/// The tail probability at which to read a percentile bootstrap interval of a mean from n
/// samples so that it is about as wide as Student's t interval: Phi(sqrt(n / (n - 1)) *
/// t_{n-1}(tail)), the "expanded percentile interval" of T. Hesterberg, "What Teachers Should
/// Know About the Bootstrap", The American Statistician 69(4), 2015, sec. 3.4 (the plain
/// percentile interval is too narrow for small n: it uses the bootstrap's variance, smaller by
/// (n - 1) / n, and normal instead of t quantiles). E.g. n = 10, tail 0.025: 0.0085.
/// @throws ppb::InternalError if n < 2 or tail is outside (0, 0.5).
double expanded_tail(int n, double tail);

/// The verdict on a comparison: "faster" (the CI lies above 1), "slower" (below 1), "no
/// significant difference" (it covers 1), or "too few repetitions" (no CI: n < kMinPairsForCI).
std::string comparison_verdict(const PairedComparison& c);

}  // namespace ppb
