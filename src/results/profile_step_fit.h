// The step model of a profile (issue 47): its grid fitted per rank and per tensor-parallel group,
// and the grid's level against the profile's cycles. Pure (header-only: RunRecord's tables and
// stepcost), so that the balancer's predictions (balance/serving_step_model.h) and the results
// file's writer and summary (results/step_model_io.h, results/summary.cpp) fit the same way.
#pragma once

#include <string>
#include <vector>

#include "common/error.h"
#include "results/run_record.h"
#include "stepcost/step_model.h"

namespace ppb {

/// Every (rank, signature) of `p`'s grid fitted (stepcost::fit_profile_grid), its held-out error
/// over the whole model; empty where the profile timed no grid.
/// @throws what stepcost::fit_profile_grid throws.
inline stepcost::GridFit fit_step_model(const ProfileTable& p) {
  if (p.step_rows.empty() || p.step_by_rows.empty()) return {};
  return stepcost::fit_profile_grid({p.step_rows, p.step_pos, p.step_tokens, p.step_role}, p.step_by_rows, p.step_ms,
                                    p.unit_signature);
}

/// Tensor-parallel group `g`'s grid (its step_ms on p's grid steps) fitted, [signatures], with its
/// held-out error over the whole model at the group's width; empty where either timed no grid.
/// @throws what stepcost::fit_profile_grid throws.
inline stepcost::GridFit fit_step_model(const ProfileTable& p, const ProfileTable::TpGroupProfile& g) {
  if (p.step_rows.empty() || p.step_by_rows.empty() || g.step_ms.size() != p.step_by_rows.size() * p.step_rows.size())
    return {};
  return stepcost::fit_profile_grid({p.step_rows, p.step_pos, p.step_tokens, p.step_role}, p.step_by_rows, g.step_ms,
                                    p.unit_signature);
}

/// Each rank's stepcost::Level of its fits `fits` [R][signatures] (fit_step_model) against p's
/// cycles (latency_ms prefill, decode_context_ms: the together tables; B and P of the workload
/// they were timed at), [R]; all 1 where the profile lacks a table; empty without fits.
inline std::vector<stepcost::Level> step_model_levels(const ProfileTable& p, int B, int P,
                                                      const std::vector<stepcost::UnitModel>& fits) {
  const std::size_t S = p.step_by_rows.size(), U = p.unit_name.size(), C = p.decode_contexts.size();
  if (S == 0 || fits.empty() || U == 0) return {};
  const std::size_t R = fits.size() / S;
  std::vector<stepcost::Level> out(R);
  if (p.latency_ms.size() < R * U * 2 || p.decode_context_ms.size() < R * U * C || B < 1 || P < 1) return out;
  for (std::size_t r = 0; r < R; ++r) {
    std::vector<double> pre(U), dec(p.decode_context_ms.begin() + static_cast<long>(r * U * C),
                                    p.decode_context_ms.begin() + static_cast<long>((r + 1) * U * C));
    for (std::size_t u = 0; u < U; ++u) pre[u] = p.latency_ms[(r * U + u) * 2];
    const std::vector<stepcost::UnitModel> models(fits.begin() + static_cast<long>(r * S),
                                                  fits.begin() + static_cast<long>((r + 1) * S));
    out[r] = stepcost::level_against(models, p.unit_signature, B, P, p.decode_contexts, pre, dec);
  }
  return out;
}

/// Tensor-parallel group `g`'s stepcost::Level of its fits [signatures] (fit_step_model(p, g))
/// against its cycles (latency_ms; decode the mean over p's profiled contexts); 1 where either
/// is missing.
inline stepcost::Level group_step_level(const ProfileTable& p, int B, int P, const ProfileTable::TpGroupProfile& g,
                                        const std::vector<stepcost::UnitModel>& fits) {
  const std::size_t U = p.unit_name.size(), C = p.decode_contexts.size();
  if (fits.size() != p.step_by_rows.size() || g.latency_ms.size() != 2 * U || B < 1 || P < 1) return {};
  std::vector<double> pre(U), dec;
  for (std::size_t u = 0; u < U; ++u) {
    pre[u] = g.latency_ms[2 * u];
    dec.insert(dec.end(), C, g.latency_ms[2 * u + 1]);
  }
  return stepcost::level_against(fits, p.unit_signature, B, P, p.decode_contexts, pre, dec);
}

/// The forward fixed cost of rank `r`, kind `ph` (0 prefill, 1 decode): stepcost::fixed_cost_of
/// of its K = kFixedCostSamples pairs in p's fixed_one_ms / fixed_two_ms
/// ([R][2][K]); empty (no pairs) where the profile timed none, r is out of range or the tables
/// are not so shaped.
inline stepcost::FixedCost fixed_cost_at(const ProfileTable& p, int r, int ph) {
  const std::size_t K = static_cast<std::size_t>(stepcost::kFixedCostSamples);
  const std::size_t n = p.fixed_one_ms.size(), at = (2 * static_cast<std::size_t>(r) + static_cast<std::size_t>(ph)) * K;
  if (p.fixed_unit < 0 || r < 0 || ph < 0 || ph > 1 || p.fixed_two_ms.size() != n || n % (2 * K) != 0 || at + K > n) return {};
  const auto one = p.fixed_one_ms.begin() + static_cast<long>(at), two = p.fixed_two_ms.begin() + static_cast<long>(at);
  return stepcost::fixed_cost_of({one, one + static_cast<long>(K)}, {two, two + static_cast<long>(K)});
}

/// Each rank's forward fixed cost per kind of step (fixed_cost_at), [R][2] (0 prefill, 1
/// decode); empty where the profile timed none.
/// @throws ppb::UserError (naming /profile/step_model) where the two tables disagree in size or
///         are not [R][2][K].
inline std::vector<stepcost::FixedCost> step_fixed_costs(const ProfileTable& p) {
  if (p.fixed_unit < 0 || p.fixed_one_ms.empty()) return {};
  const std::size_t n = p.fixed_one_ms.size(), K = static_cast<std::size_t>(stepcost::kFixedCostSamples);
  if (p.fixed_two_ms.size() != n || n % (2 * K) != 0)
    throw UserError("/profile/step_model: fixed_one_ms and fixed_two_ms must both be [ranks][2][" + std::to_string(K) +
                    "] (" + std::to_string(n) + " and " + std::to_string(p.fixed_two_ms.size()) + " values)");
  std::vector<stepcost::FixedCost> out;
  for (std::size_t i = 0; i < n / K; ++i) out.push_back(fixed_cost_at(p, static_cast<int>(i / 2), static_cast<int>(i % 2)));
  return out;
}

/// The fixed cost (ms) a stage of one rank `r` takes for kind `ph` (0 prefill, 1 decode):
/// FixedCost::applied_ms of fixed_cost_at, 0 where the profile timed none. Does not throw (the
/// reader checks the tables' shape: read_step_model).
inline double applied_fixed_ms(const ProfileTable& p, int r, int ph) {
  return p.fixed_unit < 0 ? 0.0 : fixed_cost_at(p, r, ph).applied_ms();
}

/// What a one-rank stage of `units` units on rank `r` adds to its units' summed timings of kind
/// `ph` (ms): stepcost::stage_fixed_correction_ms of applied_fixed_ms, -(units - 1)·F; 0 where
/// the profile took no F. The one rule of the closed sums, the two-shape model and the step model.
inline double stage_fixed_ms(const ProfileTable& p, int r, int units, int ph) {
  return p.fixed_unit < 0 ? 0.0 : stepcost::stage_fixed_correction_ms(units, applied_fixed_ms(p, r, ph));
}

}  // namespace ppb
