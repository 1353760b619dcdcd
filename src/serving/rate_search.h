// The highest request rate that meets a serving SLO (issue 38): the verdict on one simulated (or
// measured) scenario, and the bracket-and-bisect search over rates. Pure: the caller supplies
// the function that plays the scenario at a rate.
//
// Two rules decide whether a rate passes:
//  - attainment (default; DistServe's goodput target): the share of requests meeting both limits
//    (TTFT <= limit and TPOT <= limit, request_metrics.h meets_slo: vLLM's comparison, a request
//    of one output token counting TPOT 0) is >= the target (0.9, 0.99, ...).
//  - MLPerf Inference's Server rule for LLMs (--mlperf), as LoadGen implements it
//    (github.com/mlcommons/inference, loadgen/results.cc PerfConstraintsMet and EarlyStopping,
//    loadgen/early_stopping.cc; limits per model in loadgen/mlperf.conf, e.g. llama2-70b
//    ttft_latency 2000 ms, tpot_latency 200 ms):
//      1. the 99th percentile of TTFT and of TPOT each <= its limit, LoadGen's percentile being
//         the sorted value at index floor(n x 0.99) (no interpolation);
//      2. early stopping, for TTFT and for TPOT each: with t requests over the limit (> limit)
//         of n, the run needs n >= h + t where h is the least number of under-limit queries with
//         P(Binomial(h + t, 1 - 0.99) <= t) < 1 - 0.99 (LoadGen's odds(h, t) =
//         BetaRegularized(0.99, h, 1 + t), confidence 0.99, tolerance 0): by the monotonicity of
//         those odds in h, that is P(Binomial(n, 0.01) <= t) < 0.01. t = 0 needs n >= 459;
//         t = 1, n >= 662 (LoadGen's MultiStream min_query_count, the same bound);
//      3. the minimum query count, LoadGen's default min_query_count = 100 (loadgen/test_settings.h;
//         mlperf.conf sets none for the LLM Server runs).
//    Not applied: the minimum duration (mlperf.conf *.Server.min_duration = 600000 ms: the last
//    query scheduled at >= 600 s, results.cc MinDurationMet, so n >= 600 x rate; the search keeps
//    n fixed over rates, so it is reported, not enforced), and the query sampling from the dataset (the lengths here are drawn
//    from --prompt-lens / --gen-lens). TPOT per request is ppbench's (E2E - TTFT) / (out - 1)
//    (vLLM's); LoadGen's own per-sample TPOT computation (loadgen/logging.cc) was not checked
//    line by line against it.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "serving/request_metrics.h"

namespace ppb::serving {

/// The SLO of a search.
struct SloTarget {
  double ttft_ms = std::numeric_limits<double>::quiet_NaN();  ///< limit, ms > 0
  double tpot_ms = std::numeric_limits<double>::quiet_NaN();  ///< limit, ms > 0
  double attainment = 0.9;  ///< attainment rule: required share of requests, (0, 1]
  bool mlperf = false;      ///< MLPerf's Server rule instead of attainment (file comment)
};

/// MLPerf LoadGen's minimum query count for a Server run (loadgen/test_settings.h default).
constexpr int kMlperfMinQueries = 100;

/// The verdict on one scenario's requests.
struct RateVerdict {
  bool pass = false;
  double attainment = 0.0;    ///< share meeting both limits
  double ttft_p99_ms = 0.0;   ///< mlperf: LoadGen's percentile; else numpy's (summarize_ms)
  /// mlperf: LoadGen's percentile over every request (TPOT 0 for one output token); else numpy's
  /// over the requests of more than one output token (as serving_metrics)
  double tpot_p99_ms = 0.0;
  int64_t ttft_over = 0;      ///< requests with TTFT > limit
  int64_t tpot_over = 0;      ///< requests with TPOT > limit
  bool early_stopping = true; ///< mlperf: both early-stopping checks pass (else true)
};

/// The verdict of `slo` on finished requests `times` (shape [N], N >= 1; request_latency's
/// checks). @throws ppb::InternalError on no request or inconsistent times.
RateVerdict judge_requests(const std::vector<RequestTimes>& times, const SloTarget& slo);

/// LoadGen's percentile: `values` sorted ascending, the one at index floor(n x p) (clamped to
/// n - 1), p in [0, 1). @throws ppb::InternalError on no value.
double loadgen_percentile(std::vector<double> values, double p);

/// P(Binomial(n, q) <= t) for n >= 0, 0 <= t, q in [0, 1] (log-space sum of the pmf).
double binomial_cdf(int64_t t, int64_t n, double q);

/// MLPerf's early-stopping check (file comment, rule 2) for n queries of which t exceed the
/// limit, at percentile p and confidence c (both 0.99 in LoadGen's Server runs).
bool mlperf_early_stopping(int64_t n, int64_t t, double p = 0.99, double c = 0.99);

/// The least total query count n with mlperf_early_stopping(n, t): h_min + t in LoadGen's terms.
int64_t mlperf_min_queries(int64_t t, double p = 0.99, double c = 0.99);

struct RateSearchOptions {
  double start_rate = 1.0;  ///< first probe, requests/s (> 0): a light load
  double rel_tol = 0.01;    ///< stop when (failing - passing) <= rel_tol x passing
  double min_rate = 1e-9;   ///< halving below this: no rate passes
  double max_rate = 1e9;    ///< doubling above this: every rate passes
};

struct RateProbe {
  double rate = 0.0;  ///< requests/s
  RateVerdict verdict;
};

struct RateSearchResult {
  enum class Outcome { found, none, unbounded };
  Outcome outcome = Outcome::none;
  double rate = 0.0;          ///< found: the highest passing rate probed; unbounded: the last one
  double failing_rate = 0.0;  ///< found: the lowest failing rate probed above it (<= (1 + tol) x rate)
  std::vector<RateProbe> probes;  ///< every probe, in order
  /// Probes that passed at a rate above a failing probe: attainment not monotone in rate (finite
  /// N: which requests share a step moves with the rate); 0 when the probes are consistent.
  int non_monotone = 0;
};

/// "found", "none" or "unbounded": the outcome as the outputs and the results file name it.
const char* outcome_name(RateSearchResult::Outcome o);

/// The highest rate at which `judge_at(rate)` passes, to within rel_tol: probe start_rate; on a
/// pass double until a probe fails (or max_rate: unbounded), on a failure halve until one passes
/// (or min_rate: none); then bisect the bracket [passing, failing] at its midpoint until
/// failing - passing <= rel_tol x passing. A monotone verdict (pass below a threshold, fail
/// above) gives the threshold within the tolerance. Where the verdict is not monotone the
/// bisection still ends on a pass with a failure within the tolerance above it, one of the
/// pass-to-fail transitions inside the first bracket (not necessarily the highest or lowest);
/// `non_monotone` counts the probes that show it.
/// @throws ppb::InternalError for options out of range (start, tolerance, limits); what judge_at
///         throws.
RateSearchResult search_max_rate(const std::function<RateVerdict(double)>& judge_at, const RateSearchOptions& opt);

}  // namespace ppb::serving
