// Unit tests of src/balance/metrics: the metrics of DESIGN.md §3 on hand-built event arrays
// whose every value follows from the definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "balance/metrics.h"
#include "common/stats.h"

namespace ppb {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// One stage, one group: prefill of `prefill_ms`, then back-to-back decode steps of the given
/// durations (ms). Events in seconds, no transfers (recv/send NaN).
std::vector<double> one_stage_events(const EventShape& sh, double prefill_ms, const std::vector<double>& decode_ms) {
  std::vector<double> ev(static_cast<std::size_t>(sh.iters) * sh.groups * sh.steps * sh.stages * 6, kNaN);
  double t = 0.0;
  for (int step = 0; step < sh.steps; ++step) {
    const double d = step == 0 ? prefill_ms : decode_ms[step - 1];
    ev[sh.index(0, 0, step, 0, 2)] = 1e-3 * t;
    ev[sh.index(0, 0, step, 0, 3)] = 1e-3 * (t + d);
    t += d;
  }
  return ev;
}

TEST(Metrics, OneStageByDefinition) {
  // G = 30 decode steps of 0.1, 1.0, 1.0, 0.1, ... ms after a 5 ms prefill, B = 2.
  const int G = 30, B = 2;
  EventShape sh{1, 1, G + 1, 1};
  std::vector<double> d;
  for (int i = 0; i < G; ++i) d.push_back(i % 3 == 0 ? 0.1 : 1.0);
  const PartitionMetrics m = compute_metrics(one_stage_events(sh, 5.0, d), sh, B, G);
  double sum = 0.0;
  for (double x : d) sum += x;
  ASSERT_EQ(m.rep_wall_s.size(), 1u);
  EXPECT_NEAR(m.rep_wall_s[0], 1e-3 * (5.0 + sum), 1e-12);
  EXPECT_NEAR(m.tokens_per_s, B * G / (1e-3 * (5.0 + sum)), 1e-6);
  EXPECT_NEAR(m.ttft_p50_ms, 5.0, 1e-9);
  // (M*G - 1) * B tokens over the span from the first to the last decode token out.
  EXPECT_NEAR(m.decode_tokens_per_s, (G - 1) * B / (1e-3 * (sum - d[0])), 1e-6);
  EXPECT_NEAR(m.stage_prefill_ms[0], 5.0, 1e-9);
  EXPECT_NEAR(m.stage_decode_ms[0], 1.0, 1e-9);  // the median step
  EXPECT_NEAR(m.stage_prefill_mean_ms[0], 5.0, 1e-9);
  EXPECT_NEAR(m.stage_decode_mean_ms[0], sum / G, 1e-9);  // the mean step: 0.7 ms, what the rate follows
  EXPECT_NEAR(m.stage_workload_ms[0], 5.0 + G * 1.0, 1e-9);
  EXPECT_NEAR(m.bubble_fraction[0], 0.0, 1e-9);
  EXPECT_EQ(m.bottleneck_stage, 0);
  // The bound uses the mean step over the steps the rate's window spans (all but the first):
  // with the median (1.0 ms) the measured rate would be 139% of it; back-to-back steps reach it.
  EXPECT_NEAR(m.bottleneck_bound_tok_s, 1e3 * B / ((sum - d[0]) / (G - 1)), 1e-6);
  EXPECT_NEAR(m.pipeline_efficiency, 1.0, 1e-12);
}

/// Issue 13's efficiencies above 100%: a bound pooled over repetitions, or counting the first
/// decode step, is not the bound of the steps a repetition's rate measured. Three repetitions of
/// back-to-back steps, one of them 30% slower (a busy machine), each with a first decode step
/// three times the others (after the prefill): every repetition runs at its own bound.
TEST(Metrics, EfficiencyIsEachRepetitionAgainstItsOwnBound) {
  const int G = 10, B = 1, R = 3;
  EventShape sh{R, 1, G + 1, 1};
  std::vector<double> ev(static_cast<std::size_t>(R) * sh.steps * 6, kNaN);
  const double slow[R] = {1.0, 1.3, 1.0};
  for (int r = 0; r < R; ++r) {
    double t = 100.0 * r;  // ms
    for (int step = 0; step <= G; ++step) {
      const double d = slow[r] * (step == 0 ? 5.0 : step == 1 ? 3.0 : 1.0);
      ev[sh.index(r, 0, step, 0, 2)] = 1e-3 * t;
      ev[sh.index(r, 0, step, 0, 3)] = 1e-3 * (t + d);
      t += d;
    }
  }
  const PartitionMetrics m = compute_metrics(ev, sh, B, G);
  // Each repetition: (G - 1) tokens over (G - 1) steps of slow[r] ms.
  // The rate of the three together: 3 x (G - 1) tokens over (G - 1) x (1 + 1.3 + 1) ms, the
  // harmonic mean of 1000, 769 and 1000 tokens/s; each repetition at its own bound, so the
  // bounds' harmonic mean is the same and the efficiency 1.
  EXPECT_NEAR(m.decode_tokens_per_s, 3e3 / 3.3, 1e-6);
  EXPECT_NEAR(m.bottleneck_bound_tok_s, 3e3 / 3.3, 1e-6);
  EXPECT_NEAR(m.pipeline_efficiency, 1.0, 1e-12);
  EXPECT_NEAR(m.decode_tokens_per_s, harmonic_mean(m.rep_decode_tokens_per_s), 1e-9);
  // The first definition: the median repetition's rate (1000) against the mean step of every
  // repetition, first steps included, (2 x (3 + 9) + 1.3 x (3 + 9)) / 30 = 1.32 ms: 132%.
  const double pooled_ms = (2 * (3.0 + 9.0) + 1.3 * (3.0 + 9.0)) / 30;
  EXPECT_GT(median(m.rep_decode_tokens_per_s) / (1e3 * B / pooled_ms), 1.3);
}

TEST(Metrics, BoundIsTheLargerOfTheStageAndTheCrossing) {
  // Two stages, M = 1: a group's step crosses both stages (sum of the steps) and no stage can
  // overlap its own group's next step, so the bound is B / (d0 + d1), not B / max(d0, d1).
  const int G = 4, B = 1, S = 2;
  EventShape sh{1, 1, G + 1, S};
  std::vector<double> ev(static_cast<std::size_t>(sh.groups) * sh.steps * S * 6, kNaN);
  const double d0 = 1.0, d1 = 3.0;  // ms per decode step (prefill the same)
  double t = 0.0;
  for (int step = 0; step <= G; ++step) {
    ev[sh.index(0, 0, step, 0, 2)] = 1e-3 * t;
    ev[sh.index(0, 0, step, 0, 3)] = 1e-3 * (t + d0);
    ev[sh.index(0, 0, step, 1, 2)] = 1e-3 * (t + d0);
    ev[sh.index(0, 0, step, 1, 3)] = 1e-3 * (t + d0 + d1);
    t += d0 + d1;
  }
  const PartitionMetrics m = compute_metrics(ev, sh, B, G);
  EXPECT_NEAR(m.bottleneck_bound_tok_s, 1e3 * B / (d0 + d1), 1e-9);
  EXPECT_NEAR(m.decode_tokens_per_s, 1e3 * B / (d0 + d1), 1e-9);
  EXPECT_NEAR(m.pipeline_efficiency, 1.0, 1e-12);
  EXPECT_EQ(m.bottleneck_stage, 1);
  EXPECT_NEAR(m.bubble_fraction[0], 1.0 - d0 / (d0 + d1), 1e-9);
  EXPECT_NEAR(m.tpot_p50_ms, d0 + d1, 1e-9);
}

}  // namespace
}  // namespace ppb
