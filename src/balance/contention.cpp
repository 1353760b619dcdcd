#include "balance/contention.h"

#include <algorithm>
#include <cmath>
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

std::pair<std::vector<double>, std::vector<double>> compute_overlap(const std::vector<double>& events,
                                                                    const EventShape& shape,
                                                                    const std::vector<int>& node) {
  const int S = shape.stages;
  if (static_cast<int>(node.size()) != S)
    throw InternalError("compute_overlap: node has " + std::to_string(node.size()) + " entries for " +
                        std::to_string(S) + " stages");
  // [stage][phase] compute intervals of every repetition.
  std::vector<std::vector<Interval>> own(2 * static_cast<size_t>(S));
  for (int r = 0; r < shape.iters; ++r)
    for (int g = 0; g < shape.groups; ++g)
      for (int t = 0; t < shape.steps; ++t)
        for (int s = 0; s < S; ++s) {
          const double a = events[shape.index(r, g, t, s, kComputeStart)];
          const double b = events[shape.index(r, g, t, s, kComputeEnd)];
          if (std::isfinite(a) && std::isfinite(b) && b > a) own[2 * s + (t == 0 ? 0 : 1)].push_back({a, b});
        }
  std::vector<double> pre(S, 0.0), dec(S, 0.0);
  for (int s = 0; s < S; ++s) {
    std::vector<Interval> others;
    for (int o = 0; o < S; ++o)
      if (o != s && node[o] == node[s])
        for (int ph = 0; ph < 2; ++ph) others.insert(others.end(), own[2 * o + ph].begin(), own[2 * o + ph].end());
    if (others.empty()) continue;
    const std::vector<Interval> u = merged(std::move(others));
    for (int ph = 0; ph < 2; ++ph) {
      double total = 0.0, over = 0.0;
      for (const Interval& x : own[2 * s + ph]) {
        total += x.hi - x.lo;
        over += covered(x, u);
      }
      (ph == 0 ? pre : dec)[s] = total > 0 ? std::clamp(over / total, 0.0, 1.0) : 0.0;
    }
  }
  return {pre, dec};
}

ContentionResult contended_step_times(const std::vector<SimStage>& alone, const std::vector<SimStage>& together,
                                      const std::vector<int>& node, const SimConfig& cfg) {
  const size_t S = alone.size();
  if (together.size() != S || node.size() != S)
    throw UserError("contended_step_times: " + std::to_string(alone.size()) + " alone stages, " +
                    std::to_string(together.size()) + " together, " + std::to_string(node.size()) + " node ids");
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
