#include "balance/calibrate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/error.h"
#include "stepcost/step_model.h"

namespace ppb::balance {

namespace {

/// [R][2] sums over `stages` of the measured and of the predicted step per rank and phase (0
/// prefill, 1 decode); a stage on a rank outside 0..ranks-1 is left out.
std::pair<std::vector<double>, std::vector<double>> rank_sums(const std::vector<StageMeasurement>& stages, int ranks) {
  std::vector<double> meas(2 * static_cast<size_t>(std::max(ranks, 0)), 0.0), pred(meas.size(), 0.0);
  for (const StageMeasurement& s : stages) {
    if (s.rank < 0 || s.rank >= ranks) continue;
    meas[2 * s.rank] += s.measured_prefill_ms;
    meas[2 * s.rank + 1] += s.measured_decode_ms;
    pred[2 * s.rank] += s.predicted_prefill_ms;
    pred[2 * s.rank + 1] += s.predicted_decode_ms;
  }
  return {meas, pred};
}

/// Scales rank r's forward fixed-cost pairs of kind ph (0 prefill, 1 decode) by f, as its unit
/// timings were: F is a share of the forward the pairs timed (the stage's sum less (n - 1) F then
/// scales as a whole). Nothing where the table has no pairs or they are not [R][2][K].
void scale_fixed_pairs(ProfileTable& c, size_t r, size_t ph, double f) {
  const size_t K = static_cast<size_t>(stepcost::kFixedCostSamples);
  if (c.fixed_unit < 0 || !(std::isfinite(f) && f > 0)) return;
  for (std::vector<double>* v : {&c.fixed_one_ms, &c.fixed_two_ms})
    for (size_t i = (2 * r + ph) * K; i < (2 * r + ph + 1) * K && i < v->size(); ++i) (*v)[i] *= f;
}

}  // namespace

std::vector<double> calibration_factors(const std::vector<StageMeasurement>& stages, int ranks) {
  const auto [meas, pred] = rank_sums(stages, ranks);
  std::vector<double> f(meas.size(), 1.0);
  for (size_t i = 0; i < f.size(); ++i) {
    const double x = meas[i] / pred[i];
    if (std::isfinite(x) && x > 0 && meas[i] > 0) f[i] = x;
  }
  return f;
}

ProfileTable calibrated_profile(const ProfileTable& t, const std::vector<double>& factors, Objective o,
                                int gen_len) {
  const size_t U = t.unit_name.size();
  if (U == 0 || t.latency_ms.size() % (2 * U) != 0) throw InternalError("calibrated_profile: malformed profile table");
  const size_t R = t.latency_ms.size() / (2 * U);
  if (factors.size() != 2 * R) throw InternalError("calibrated_profile: need 2 factors per rank");
  ProfileTable c = t;
  for (size_t r = 0; r < R; ++r) {
    for (size_t u = 0; u < U; ++u) {
      for (size_t ph = 0; ph < 2; ++ph) {
        const size_t at = (r * U + u) * 2 + ph;
        c.latency_ms[at] *= factors[2 * r + ph];
        if (at < c.latency_min_ms.size()) c.latency_min_ms[at] *= factors[2 * r + ph];
        if (at < c.latency_max_ms.size()) c.latency_max_ms[at] *= factors[2 * r + ph];
        if (at < c.latency_alone_ms.size()) c.latency_alone_ms[at] *= factors[2 * r + ph];
      }
      if (!c.cost_ms.empty())
        c.cost_ms[r * U + u] = objective_cost(o, c.latency_ms[(r * U + u) * 2], c.latency_ms[(r * U + u) * 2 + 1], gen_len);
    }
    const size_t C = c.decode_contexts.size();
    for (size_t i = r * U * C; i < (r + 1) * U * C && i < c.decode_context_ms.size(); ++i) c.decode_context_ms[i] *= factors[2 * r + 1];
    for (size_t ph = 0; ph < 2; ++ph) scale_fixed_pairs(c, r, ph, factors[2 * r + ph]);
  }
  return c;
}

ProfileTable profile_as_rounds_saw_it(const ProfileTable& t, const std::vector<double>& rounds, Objective o,
                                      int gen_len) {
  const size_t U = t.unit_name.size();
  if (U == 0 || t.latency_ms.size() % (2 * U) != 0 || rounds.size() != t.latency_ms.size())
    throw InternalError("profile_as_rounds_saw_it: the rounds' table is not shaped as the profile's");
  const size_t R = t.latency_ms.size() / (2 * U), C = t.decode_contexts.size();
  ProfileTable c = t;
  for (size_t r = 0; r < R; ++r) {
    for (size_t u = 0; u < U; ++u) {
      for (size_t ph = 0; ph < 2; ++ph) {
        const size_t at = (r * U + u) * 2 + ph;
        const double f = rounds[at] / t.latency_ms[at];
        c.latency_ms[at] = rounds[at];
        if (!(std::isfinite(f) && f > 0)) continue;
        if (at < c.latency_min_ms.size()) c.latency_min_ms[at] *= f;
        if (at < c.latency_max_ms.size()) c.latency_max_ms[at] *= f;
        if (at < c.latency_alone_ms.size()) c.latency_alone_ms[at] *= f;
        if (ph == 1)
          for (size_t i = (r * U + u) * C; i < (r * U + u + 1) * C && i < c.decode_context_ms.size(); ++i)
            c.decode_context_ms[i] *= f;
        if (static_cast<int>(u) == c.fixed_unit) scale_fixed_pairs(c, r, ph, f);  // timed on that unit
      }
      if (!c.cost_ms.empty())
        c.cost_ms[r * U + u] = objective_cost(o, c.latency_ms[(r * U + u) * 2], c.latency_ms[(r * U + u) * 2 + 1], gen_len);
    }
  }
  return c;
}

ContentionCalibration contention_calibration(const std::vector<StepSample>& steps, int ranks) {
  const size_t n = 2 * static_cast<size_t>(std::max(ranks, 0));
  ContentionCalibration c{std::vector<double>(n, 1.0), std::vector<double>(n, std::nan("")),
                          std::vector<CalibrationFit>(n, CalibrationFit::none)};
  struct Sums {  // per rank and phase: the normal equations' sums
    double aa = 0, ax = 0, xx = 0, am = 0, xm = 0, profile = 0, m = 0;
    size_t count = 0;
  };
  std::vector<Sums> sums(n);
  for (const StepSample& st : steps) {
    if (st.rank < 0 || st.rank >= ranks || (st.phase != 0 && st.phase != 1)) continue;
    if (!(std::isfinite(st.alone_ms) && std::isfinite(st.share) && std::isfinite(st.measured_ms) &&
          std::isfinite(st.excess_ms)))
      continue;
    Sums& z = sums[2 * static_cast<size_t>(st.rank) + st.phase];
    const double a = st.alone_ms, x = st.alone_ms * st.share, m = st.measured_ms;
    z.aa += a * a;
    z.ax += a * x;
    z.xx += x * x;
    z.am += a * m;
    z.xm += x * m;
    z.profile += a + std::max(st.excess_ms, 0.0) * st.share;  // the profile's contended step
    z.m += m;
    ++z.count;
  }
  for (size_t i = 0; i < n; ++i) {
    const Sums& z = sums[i];
    const double level = z.m / z.profile;
    if (z.count == 0 || !(std::isfinite(level) && level > 0 && z.profile > 0)) continue;
    c.level[i] = level;
    c.fit[i] = CalibrationFit::level;
    const double det = z.aa * z.xx - z.ax * z.ax;
    if (!(z.aa > 0 && z.xx > 0) || det < kMinShareSpread * z.aa * z.xx) continue;
    const double l2 = (z.am * z.xx - z.xm * z.ax) / det, c2 = (z.aa * z.xm - z.ax * z.am) / det;
    if (!(std::isfinite(l2) && std::isfinite(c2) && l2 > 0 && c2 >= 0)) continue;
    c.level[i] = l2;
    c.contention[i] = c2;
    c.fit[i] = CalibrationFit::contention;
  }
  return c;
}

}  // namespace ppb::balance
