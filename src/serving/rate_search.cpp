// The SLO verdict and the rate search (definitions and sources in rate_search.h).
#include "serving/rate_search.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace ppb::serving {

double loadgen_percentile(std::vector<double> values, double p) {
  if (values.empty()) throw InternalError("loadgen_percentile: no value");
  std::sort(values.begin(), values.end());
  const auto i = static_cast<std::size_t>(static_cast<double>(values.size()) * p);
  return values[std::min(i, values.size() - 1)];
}

double binomial_cdf(int64_t t, int64_t n, double q) {
  if (t >= n) return 1.0;
  if (t < 0) return 0.0;
  if (q <= 0.0) return 1.0;
  if (q >= 1.0) return 0.0;
  const double lq = std::log(q), l1q = std::log1p(-q), lnf = std::lgamma(static_cast<double>(n) + 1.0);
  double sum = 0.0;
  for (int64_t x = 0; x <= t; ++x) {
    const double xd = static_cast<double>(x), nd = static_cast<double>(n);
    sum += std::exp(lnf - std::lgamma(xd + 1.0) - std::lgamma(nd - xd + 1.0) + xd * lq + (nd - xd) * l1q);
  }
  return std::min(sum, 1.0);
}

bool mlperf_early_stopping(int64_t n, int64_t t, double p, double c) {
  // LoadGen: passes iff n >= h_min + t, h_min the least h >= 1 with odds(h, t) < 1 - c, where
  // odds(h, t) = P(Binomial(h + t, 1 - p) <= t) falls as h grows: so iff n - t >= 1 and
  // odds(n - t, t) < 1 - c.
  if (n - t < 1) return false;
  return binomial_cdf(t, n, 1.0 - p) < 1.0 - c;
}

int64_t mlperf_min_queries(int64_t t, double p, double c) {
  int64_t lo = t + 1, hi = t + 1;
  while (!mlperf_early_stopping(hi, t, p, c)) {
    lo = hi + 1;
    hi *= 2;
  }
  while (lo < hi) {  // least n in [lo, hi] that passes
    const int64_t mid = lo + (hi - lo) / 2;
    if (mlperf_early_stopping(mid, t, p, c)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

RateVerdict judge_requests(const std::vector<RequestTimes>& times, const SloTarget& slo) {
  if (times.empty()) throw InternalError("judge_requests: no request");
  GoodputSpec limits;
  limits.ttft_ms = slo.ttft_ms;
  limits.tpot_ms = slo.tpot_ms;
  std::vector<double> ttft, tpot, tpot_or_zero;  // seconds
  RateVerdict v;
  int64_t good = 0;
  for (const RequestTimes& r : times) {
    const RequestLatency l = request_latency(r);
    ttft.push_back(l.ttft_s);
    if (!std::isnan(l.tpot_s)) tpot.push_back(l.tpot_s);
    tpot_or_zero.push_back(std::isnan(l.tpot_s) ? 0.0 : l.tpot_s);
    good += meets_slo(l, limits) ? 1 : 0;
    v.ttft_over += l.ttft_s > slo.ttft_ms / 1000.0 ? 1 : 0;
    v.tpot_over += tpot_or_zero.back() > slo.tpot_ms / 1000.0 ? 1 : 0;
  }
  const auto n = static_cast<int64_t>(times.size());
  v.attainment = static_cast<double>(good) / static_cast<double>(n);
  if (!slo.mlperf) {
    v.ttft_p99_ms = summarize_ms(ttft).p99_ms;
    v.tpot_p99_ms = summarize_ms(tpot).p99_ms;
    v.pass = v.attainment >= slo.attainment;
    return v;
  }
  v.ttft_p99_ms = loadgen_percentile(ttft, 0.99) * 1e3;
  v.tpot_p99_ms = loadgen_percentile(tpot_or_zero, 0.99) * 1e3;
  v.early_stopping = mlperf_early_stopping(n, v.ttft_over) && mlperf_early_stopping(n, v.tpot_over);
  v.pass = v.ttft_p99_ms <= slo.ttft_ms && v.tpot_p99_ms <= slo.tpot_ms && v.early_stopping &&
           n >= kMlperfMinQueries;
  return v;
}

namespace {

int count_non_monotone(const std::vector<RateProbe>& probes) {
  double lowest_fail = std::numeric_limits<double>::infinity();
  for (const RateProbe& p : probes)
    if (!p.verdict.pass) lowest_fail = std::min(lowest_fail, p.rate);
  int n = 0;
  for (const RateProbe& p : probes) n += p.verdict.pass && p.rate > lowest_fail ? 1 : 0;
  return n;
}

}  // namespace

const char* outcome_name(RateSearchResult::Outcome o) {
  return o == RateSearchResult::Outcome::found ? "found" : o == RateSearchResult::Outcome::none ? "none" : "unbounded";
}

RateSearchResult search_max_rate(const std::function<RateVerdict(double)>& judge_at, const RateSearchOptions& opt) {
  if (!(opt.start_rate > 0.0) || !std::isfinite(opt.start_rate) || !(opt.rel_tol > 0.0) || !(opt.min_rate > 0.0) ||
      !(opt.max_rate >= opt.min_rate) || !std::isfinite(opt.max_rate))
    throw InternalError("search_max_rate: options out of range");
  RateSearchResult res;
  auto probe = [&](double rate) {
    res.probes.push_back({rate, judge_at(rate)});
    return res.probes.back().verdict.pass;
  };
  double lo = 0.0, hi = 0.0, r = opt.start_rate;
  if (probe(r)) {  // bracket upwards
    lo = r;
    while (true) {
      r *= 2.0;
      if (r > opt.max_rate) {
        res.outcome = RateSearchResult::Outcome::unbounded;
        res.rate = lo;
        res.non_monotone = count_non_monotone(res.probes);
        return res;
      }
      if (!probe(r)) break;
      lo = r;
    }
    hi = r;
  } else {  // bracket downwards
    hi = r;
    while (true) {
      r *= 0.5;
      if (r < opt.min_rate) {
        res.outcome = RateSearchResult::Outcome::none;
        res.failing_rate = hi;
        res.non_monotone = count_non_monotone(res.probes);
        return res;
      }
      if (probe(r)) break;
      hi = r;
    }
    lo = r;
  }
  while (hi - lo > opt.rel_tol * lo) {
    const double mid = 0.5 * (lo + hi);
    if (probe(mid)) lo = mid;
    else hi = mid;
  }
  res.outcome = RateSearchResult::Outcome::found;
  res.rate = lo;
  res.failing_rate = hi;
  res.non_monotone = count_non_monotone(res.probes);
  return res;
}

}  // namespace ppb::serving
