#include "balance/contention.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "common/error.h"
#include "common/events.h"

namespace ppb::balance {

namespace {

struct Interval {
  double lo, hi;
};

/// The union of `v` as sorted disjoint intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.lo < b.lo; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.lo <= out.back().hi)
      out.back().hi = std::max(out.back().hi, i.hi);
    else
      out.push_back(i);
  }
  return out;
}

/// Length of [x.lo, x.hi] covered by the sorted disjoint intervals `u`.
double covered(const Interval& x, const std::vector<Interval>& u) {
  auto it = std::upper_bound(u.begin(), u.end(), x.lo, [](double v, const Interval& i) { return v < i.hi; });
  double len = 0.0;
  for (; it != u.end() && it->lo < x.hi; ++it) len += std::max(0.0, std::min(x.hi, it->hi) - std::max(x.lo, it->lo));
  return len;
}

}  // namespace

std::vector<double> step_overlap(const std::vector<double>& events, const EventShape& shape,
                                 const std::vector<int>& node) {
  const int S = shape.stages;
  if (static_cast<int>(node.size()) != S)
    throw InternalError("step_overlap: node has " + std::to_string(node.size()) + " entries for " +
                        std::to_string(S) + " stages");
  const size_t steps = static_cast<size_t>(shape.iters) * shape.groups * shape.steps;
  auto interval = [&](size_t row, int s) -> std::optional<Interval> {  // row: [iters][M][G+1] flattened
    const double a = events[(row * S + s) * kNumEvents + kComputeStart], b = events[(row * S + s) * kNumEvents + kComputeEnd];
    if (std::isfinite(a) && std::isfinite(b) && b > a) return Interval{a, b};
    return std::nullopt;
  };
  std::vector<double> share(steps * S, std::nan(""));
  for (int s = 0; s < S; ++s) {
    std::vector<Interval> others;  // every compute step of the other stages of s's node
    for (int o = 0; o < S; ++o)
      if (o != s && node[o] == node[s])
        for (size_t row = 0; row < steps; ++row)
          if (const auto x = interval(row, o)) others.push_back(*x);
    const std::vector<Interval> u = merged(std::move(others));
    for (size_t row = 0; row < steps; ++row)
      if (const auto x = interval(row, s)) share[row * S + s] = std::clamp(covered(*x, u) / (x->hi - x->lo), 0.0, 1.0);
  }
  return share;
}

std::pair<std::vector<double>, std::vector<double>> compute_overlap(const std::vector<double>& events,
                                                                    const EventShape& shape,
                                                                    const std::vector<int>& node) {
  return overlap_of_steps(events, shape, step_overlap(events, shape, node));
}

std::pair<std::vector<double>, std::vector<double>> overlap_of_steps(const std::vector<double>& events,
                                                                     const EventShape& shape,
                                                                     const std::vector<double>& share) {
  const int S = shape.stages;
  // Time-weighted: the share of the stage's whole compute time in the phase.
  std::vector<double> total(2 * static_cast<size_t>(S), 0.0), over(total.size(), 0.0);
  for (size_t row = 0; row * S < share.size(); ++row)
    for (int s = 0; s < S; ++s) {
      if (!std::isfinite(share[row * S + s])) continue;
      const double d = events[(row * S + s) * kNumEvents + kComputeEnd] - events[(row * S + s) * kNumEvents + kComputeStart];
      const size_t at = 2 * static_cast<size_t>(s) + (row % shape.steps == 0 ? 0 : 1);
      total[at] += d;
      over[at] += share[row * S + s] * d;
    }
  std::vector<double> pre(S, 0.0), dec(S, 0.0);
  for (int s = 0; s < S; ++s) {
    pre[s] = total[2 * s] > 0 ? std::clamp(over[2 * s] / total[2 * s], 0.0, 1.0) : 0.0;
    dec[s] = total[2 * s + 1] > 0 ? std::clamp(over[2 * s + 1] / total[2 * s + 1], 0.0, 1.0) : 0.0;
  }
  return {pre, dec};
}

ContentionResult contended_step_times(const std::vector<SimStage>& alone, const std::vector<SimStage>& together,
                                      const std::vector<int>& node, const SimConfig& cfg,
                                      const std::vector<char>& always_overlapped) {
  const size_t S = alone.size();
  if (together.size() != S || node.size() != S || (!always_overlapped.empty() && always_overlapped.size() != S))
    throw UserError("contended_step_times: " + std::to_string(alone.size()) + " alone stages, " +
                    std::to_string(together.size()) + " together, " + std::to_string(node.size()) + " node ids, " +
                    std::to_string(always_overlapped.size()) + " twin flags");
  ContentionResult res;
  res.stages = alone;
  for (size_t k = 0; k < S; ++k) {  // start from the together times: a busy pipeline's
    res.stages[k].prefill_ms = together[k].prefill_ms;
    res.stages[k].decode_ms = together[k].decode_ms;
  }
  res.overlap_prefill.assign(S, 0.0);
  res.overlap_decode.assign(S, 0.0);
  constexpr int kMaxSimulations = 60;
  constexpr double kTolerance = 1e-4;
  for (res.iterations = 1; res.iterations <= kMaxSimulations; ++res.iterations) {
    const SimResult sim = simulate_pipeline(res.stages, cfg);
    std::tie(res.overlap_prefill, res.overlap_decode) = compute_overlap(sim.events, sim.shape, node);
    for (size_t k = 0; k < always_overlapped.size(); ++k)
      if (always_overlapped[k]) res.overlap_prefill[k] = res.overlap_decode[k] = 1.0;
    double moved = 0.0;
    for (size_t k = 0; k < S; ++k) {
      auto step = [&](double& x, double a, double t, double f) {
        const double target = a + (t - a) * f;
        const double next = 0.5 * (x + target);
        moved = std::max(moved, std::abs(next - x) / std::max({x, next, 1e-12}));
        x = next;
      };
      step(res.stages[k].prefill_ms, alone[k].prefill_ms, together[k].prefill_ms, res.overlap_prefill[k]);
      step(res.stages[k].decode_ms, alone[k].decode_ms, together[k].decode_ms, res.overlap_decode[k]);
    }
    if (moved < kTolerance) {
      res.converged = true;
      break;
    }
  }
  res.iterations = std::min(res.iterations, kMaxSimulations);
  return res;
}

}  // namespace ppb::balance
