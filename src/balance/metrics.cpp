#include "balance/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/events.h"
#include "common/stats.h"

namespace ppb {

namespace {

/// The mean of the finite values of `v` (a step without both compute events is NaN); NaN if none.
double finite_mean(const std::vector<double>& v) {
  double sum = 0.0;
  size_t n = 0;
  for (double x : v)
    if (std::isfinite(x)) {
      sum += x;
      ++n;
    }
  return n ? sum / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

PartitionMetrics compute_metrics(const std::vector<double>& ev, const EventShape& sh, int batch, int gen_len) {
  PartitionMetrics m;
  const int S = sh.stages, M = sh.groups, steps = sh.steps;
  const int last = S - 1;
  std::vector<double> ttft, tpot, decode_rate, rep_bound;
  std::vector<std::vector<double>> prefill(S), decode(S), bubble(S), recv_wait(S);
  for (int r = 0; r < sh.iters; ++r) {
    double start = std::numeric_limits<double>::infinity(), end = -start;
    double first_decode_out = start, last_decode_out = -start;
    const size_t ttft_from = ttft.size(), tpot_from = tpot.size();
    for (int g = 0; g < M; ++g) {
      start = std::min(start, ev[sh.index(r, g, 0, 0, kComputeStart)]);
      end = std::max(end, ev[sh.index(r, g, steps - 1, last, kComputeEnd)]);
      for (int t = 1; t < steps; ++t) {
        first_decode_out = std::min(first_decode_out, ev[sh.index(r, g, t, last, kComputeEnd)]);
        last_decode_out = std::max(last_decode_out, ev[sh.index(r, g, t, last, kComputeEnd)]);
      }
      ttft.push_back(1e3 * (ev[sh.index(r, g, 0, last, kComputeEnd)] - ev[sh.index(r, g, 0, 0, kComputeStart)]));
      for (int t = 1; t < steps; ++t)
        tpot.push_back(1e3 * (ev[sh.index(r, g, t, last, kComputeEnd)] - ev[sh.index(r, g, t - 1, last, kComputeEnd)]));
    }
    const double wall = end - start;
    m.rep_wall_s.push_back(wall);
    const double tokens = static_cast<double>(M) * batch * gen_len;
    m.rep_tokens_per_s.push_back(tokens / wall);
    // Decode steady state: M*G decode steps leave the last stage; (M*G - 1) intervals between
    // the first and the last of them (the usual N-1 over the span of N periodic events).
    const double decode_steps = static_cast<double>(M) * gen_len;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (decode_steps > 1 && last_decode_out > first_decode_out) {
      decode_rate.push_back((decode_steps - 1) * batch / (last_decode_out - first_decode_out));
      m.rep_decode_tokens_per_s.push_back(decode_rate.back());
    } else {
      m.rep_decode_tokens_per_s.push_back(nan);
    }
    // This repetition's bound, from the decode steps its rate spans: (M*G - 1) intervals between
    // decode tokens out are (M*G - 1) services of the bottleneck, so each stage's mean step is
    // over its decode steps but its first (the one whose service precedes the first token out of
    // the window). Pooling the steps of every repetition (or keeping the first step, cheaper or
    // slower than the rest) would put a repetition's rate above its own bound (issue 13: 100.2-
    // 102.6% measured with the pooled bound).
    {
      double max_d = 0.0, sum_d = 0.0;
      for (int s = 0; s < S; ++s) {
        double first_start = std::numeric_limits<double>::infinity(), first_d = 0.0, total = 0.0;
        int n = 0;
        for (int g = 0; g < M; ++g)
          for (int t = 1; t < steps; ++t) {
            const double st = ev[sh.index(r, g, t, s, kComputeStart)], d = ev[sh.index(r, g, t, s, kComputeEnd)] - st;
            if (!std::isfinite(d)) continue;
            total += d;
            ++n;
            if (st < first_start) {
              first_start = st;
              first_d = d;
            }
          }
        const double mean_d = n > 1 ? (total - first_d) / (n - 1) : n == 1 ? total : 0.0;
        max_d = std::max(max_d, mean_d);
        sum_d += mean_d;
      }
      const double cycle_s = std::max(M * max_d, sum_d);
      rep_bound.push_back(cycle_s > 0 ? M * batch / cycle_s : nan);
    }
    m.rep_ttft_p50_ms.push_back(median(std::vector<double>(ttft.begin() + ttft_from, ttft.end())));
    m.rep_tpot_p50_ms.push_back(tpot.size() > tpot_from ? median(std::vector<double>(tpot.begin() + tpot_from, tpot.end())) : nan);
    for (int s = 0; s < S; ++s) {
      double busy = 0.0;
      for (int g = 0; g < M; ++g) {
        for (int t = 0; t < steps; ++t) {
          double d = ev[sh.index(r, g, t, s, kComputeEnd)] - ev[sh.index(r, g, t, s, kComputeStart)];
          busy += d;
          (t == 0 ? prefill[s] : decode[s]).push_back(1e3 * d);
          double rs = ev[sh.index(r, g, t, s, kRecvStart)], re = ev[sh.index(r, g, t, s, kRecvEnd)];
          if (!std::isnan(rs)) recv_wait[s].push_back(1e3 * (re - rs));
        }
      }
      bubble[s].push_back(1.0 - busy / wall);
    }
  }
  // Every repetition generates the same tokens: the harmonic mean of its rates is the total
  // tokens over the total time (common/stats.h harmonic_mean).
  m.tokens_per_s = harmonic_mean(m.rep_tokens_per_s);
  m.decode_tokens_per_s = decode_rate.empty() ? 0.0 : harmonic_mean(decode_rate);
  m.ttft_p50_ms = percentile(ttft, 50);
  m.ttft_p99_ms = percentile(ttft, 99);
  m.tpot_p50_ms = tpot.empty() ? 0.0 : percentile(tpot, 50);
  m.tpot_p99_ms = tpot.empty() ? 0.0 : percentile(tpot, 99);
  double max_work = -1.0;
  for (int s = 0; s < S; ++s) {
    m.stage_prefill_ms.push_back(median(prefill[s]));
    m.stage_decode_ms.push_back(decode[s].empty() ? 0.0 : median(decode[s]));
    m.stage_prefill_mean_ms.push_back(finite_mean(prefill[s]));
    m.stage_decode_mean_ms.push_back(decode[s].empty() ? 0.0 : finite_mean(decode[s]));
    m.stage_workload_ms.push_back(m.stage_prefill_ms[s] + gen_len * m.stage_decode_ms[s]);
    m.bubble_fraction.push_back(median(bubble[s]));
    m.recv_wait_ms.push_back(recv_wait[s].empty() ? 0.0 : median(recv_wait[s]));
    if (m.stage_workload_ms[s] > max_work) {
      max_work = m.stage_workload_ms[s];
      m.bottleneck_stage = s;
    }
  }
  // Each repetition against its own bound: a repetition slowed by the machine lowers its rate
  // and its bound together, unlike a bound pooled over all. Summed as the rates are (harmonic
  // means over the repetitions that have both), so that efficiency = decode rate / bound over
  // the same repetitions: the bound's total time over the measured total time.
  std::vector<double> rates, bounds;
  for (size_t r = 0; r < rep_bound.size(); ++r) {
    if (std::isfinite(rep_bound[r]) && std::isfinite(m.rep_decode_tokens_per_s[r])) {
      rates.push_back(m.rep_decode_tokens_per_s[r]);
      bounds.push_back(rep_bound[r]);
    }
  }
  if (!bounds.empty()) {
    m.bottleneck_bound_tok_s = harmonic_mean(bounds);
    m.pipeline_efficiency = harmonic_mean(rates) / m.bottleneck_bound_tok_s;
  } else {  // no decode rate (fewer than two decode steps): the bound alone, efficiency 0
    const double bound = harmonic_mean(rep_bound);
    m.bottleneck_bound_tok_s = std::isnan(bound) ? 0.0 : bound;
  }
  return m;
}

}  // namespace ppb
