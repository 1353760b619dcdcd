#include "balance/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "balance/problem.h"
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

/// What compute_metrics gathers over the repetitions before it summarises: TTFTs and TPOTs
/// (ms), each repetition's decode rate (where it has one) and bound (tok/s), and per stage its
/// prefill and decode compute steps (ms), bubble fractions and recv waits (ms).
struct Samples {
  std::vector<double> ttft, tpot, decode_rate, rep_bound;
  std::vector<std::vector<double>> prefill, decode, bubble, recv_wait;  // [S]
  explicit Samples(int stages) : prefill(stages), decode(stages), bubble(stages), recv_wait(stages) {}
};

/// Repetition r's span (s): stage 0's first compute start, the last token out, and its first
/// and last decode token out of the last stage.
struct RepSpan {
  double start, end, first_decode_out, last_decode_out;
};

/// Repetition r's span; appends its TTFTs (stage-0 prefill start -> first token out) and TPOTs
/// (gaps between a group's consecutive tokens out) to `smp`, ms.
RepSpan scan_repetition(const std::vector<double>& ev, const EventShape& sh, int r, Samples& smp) {
  const int M = sh.groups, steps = sh.steps, last = sh.stages - 1;
  RepSpan span;
  span.start = std::numeric_limits<double>::infinity();
  span.end = -span.start;
  span.first_decode_out = span.start;
  span.last_decode_out = -span.start;
  for (int g = 0; g < M; ++g) {
    span.start = std::min(span.start, ev[sh.index(r, g, 0, 0, kComputeStart)]);
    span.end = std::max(span.end, ev[sh.index(r, g, steps - 1, last, kComputeEnd)]);
    for (int t = 1; t < steps; ++t) {
      span.first_decode_out = std::min(span.first_decode_out, ev[sh.index(r, g, t, last, kComputeEnd)]);
      span.last_decode_out = std::max(span.last_decode_out, ev[sh.index(r, g, t, last, kComputeEnd)]);
    }
    smp.ttft.push_back(1e3 * (ev[sh.index(r, g, 0, last, kComputeEnd)] - ev[sh.index(r, g, 0, 0, kComputeStart)]));
    for (int t = 1; t < steps; ++t)
      smp.tpot.push_back(1e3 * (ev[sh.index(r, g, t, last, kComputeEnd)] - ev[sh.index(r, g, t - 1, last, kComputeEnd)]));
  }
  return span;
}

/// Repetition r's bound (tok/s), from the decode steps its rate spans: (M*G - 1) intervals between
/// decode tokens out are (M*G - 1) services of the bottleneck, so each stage's mean step is
/// over its decode steps but its first (the one whose service precedes the first token out of
/// the window). Pooling the steps of every repetition (or keeping the first step, cheaper or
/// slower than the rest) would put a repetition's rate above its own bound (issue 13: 100.2-
/// 102.6% measured with the pooled bound). NaN without a decode step.
double repetition_bound(const std::vector<double>& ev, const EventShape& sh, int r, int batch) {
  const int M = sh.groups, steps = sh.steps;
  double max_d = 0.0, sum_d = 0.0;
  for (int s = 0; s < sh.stages; ++s) {
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
  return cycle_s > 0 ? M * batch / cycle_s : std::numeric_limits<double>::quiet_NaN();
}

/// Stage s's compute steps of repetition r (prefill, decode; ms) and recv waits (ms) appended to
/// `smp`, and its bubble: 1 - its busy compute time / the repetition's `wall` (s).
void scan_stage(const std::vector<double>& ev, const EventShape& sh, int r, int s, double wall, Samples& smp) {
  double busy = 0.0;
  for (int g = 0; g < sh.groups; ++g) {
    for (int t = 0; t < sh.steps; ++t) {
      double d = ev[sh.index(r, g, t, s, kComputeEnd)] - ev[sh.index(r, g, t, s, kComputeStart)];
      busy += d;
      (t == 0 ? smp.prefill[s] : smp.decode[s]).push_back(1e3 * d);
      double rs = ev[sh.index(r, g, t, s, kRecvStart)], re = ev[sh.index(r, g, t, s, kRecvEnd)];
      if (!std::isnan(rs)) smp.recv_wait[s].push_back(1e3 * (re - rs));
    }
  }
  smp.bubble[s].push_back(1.0 - busy / wall);
}

/// Each stage's medians and means of its steps, workload (prefill + G decode, the objective
/// cost of balance/problem.h), bubble and recv wait into `m`, and the bottleneck stage (the
/// largest workload).
void summarize_stages(const Samples& smp, int gen_len, PartitionMetrics& m) {
  double max_work = -1.0;
  for (size_t s = 0; s < smp.prefill.size(); ++s) {
    m.stage_prefill_ms.push_back(median(smp.prefill[s]));
    m.stage_decode_ms.push_back(smp.decode[s].empty() ? 0.0 : median(smp.decode[s]));
    m.stage_prefill_mean_ms.push_back(finite_mean(smp.prefill[s]));
    m.stage_decode_mean_ms.push_back(smp.decode[s].empty() ? 0.0 : finite_mean(smp.decode[s]));
    m.stage_workload_ms.push_back(
        balance::objective_cost(balance::Objective::workload, m.stage_prefill_ms[s], m.stage_decode_ms[s], gen_len));
    m.bubble_fraction.push_back(median(smp.bubble[s]));
    m.recv_wait_ms.push_back(smp.recv_wait[s].empty() ? 0.0 : median(smp.recv_wait[s]));
    if (m.stage_workload_ms[s] > max_work) {
      max_work = m.stage_workload_ms[s];
      m.bottleneck_stage = static_cast<int>(s);
    }
  }
}

/// The bound and the efficiency: each repetition against its own bound, so that a repetition
/// slowed by the machine lowers its rate and its bound together, unlike a bound pooled over
/// all. Summed as the rates are (harmonic means over the repetitions that have both), so that
/// efficiency = decode rate / bound over the same repetitions: the bound's total time over the
/// measured total time. Needs m.rep_decode_tokens_per_s.
void combine_bounds(const std::vector<double>& rep_bound, PartitionMetrics& m) {
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
}

}  // namespace

PartitionMetrics compute_metrics(const std::vector<double>& ev, const EventShape& sh, int batch, int gen_len) {
  PartitionMetrics m;
  const int S = sh.stages, M = sh.groups;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Samples smp(S);
  for (int r = 0; r < sh.iters; ++r) {
    const size_t ttft_from = smp.ttft.size(), tpot_from = smp.tpot.size();
    const RepSpan span = scan_repetition(ev, sh, r, smp);
    const double wall = span.end - span.start;
    m.rep_wall_s.push_back(wall);
    const double tokens = static_cast<double>(M) * batch * gen_len;
    m.rep_tokens_per_s.push_back(tokens / wall);
    // Decode steady state: M*G decode steps leave the last stage; (M*G - 1) intervals between
    // the first and the last of them (the usual N-1 over the span of N periodic events).
    const double decode_steps = static_cast<double>(M) * gen_len;
    if (decode_steps > 1 && span.last_decode_out > span.first_decode_out) {
      smp.decode_rate.push_back((decode_steps - 1) * batch / (span.last_decode_out - span.first_decode_out));
      m.rep_decode_tokens_per_s.push_back(smp.decode_rate.back());
    } else {
      m.rep_decode_tokens_per_s.push_back(nan);
    }
    smp.rep_bound.push_back(repetition_bound(ev, sh, r, batch));
    m.rep_ttft_p50_ms.push_back(median(std::vector<double>(smp.ttft.begin() + ttft_from, smp.ttft.end())));
    m.rep_tpot_p50_ms.push_back(
        smp.tpot.size() > tpot_from ? median(std::vector<double>(smp.tpot.begin() + tpot_from, smp.tpot.end())) : nan);
    for (int s = 0; s < S; ++s) scan_stage(ev, sh, r, s, wall, smp);
  }
  // Every repetition generates the same tokens: the harmonic mean of its rates is the total
  // tokens over the total time (common/stats.h harmonic_mean).
  m.tokens_per_s = harmonic_mean(m.rep_tokens_per_s);
  m.decode_tokens_per_s = smp.decode_rate.empty() ? 0.0 : harmonic_mean(smp.decode_rate);
  m.ttft_p50_ms = percentile(smp.ttft, 50);
  m.ttft_p99_ms = percentile(smp.ttft, 99);
  m.tpot_p50_ms = smp.tpot.empty() ? 0.0 : percentile(smp.tpot, 50);
  m.tpot_p99_ms = smp.tpot.empty() ? 0.0 : percentile(smp.tpot, 99);
  summarize_stages(smp, gen_len, m);
  combine_bounds(smp.rep_bound, m);
  return m;
}

}  // namespace ppb
