// /profile/step_model (step_model_io.h).
#include "results/step_model_io.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/format.h"
#include "stepcost/step_model.h"

namespace ppb {

using h5::Group;
using hs = hsize_t;

namespace {

std::vector<int> to_int(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

/// The forward's fixed cost's pairs and their estimates (stepcost::FixedCost) under `g`.
void write_fixed_cost(Group& g, const ProfileTable& p, hs R) {
  const std::vector<stepcost::FixedCost> f = step_fixed_costs(p);
  if (f.empty()) return;
  const hs K = static_cast<hs>(stepcost::kFixedCostSamples);
  if (f.size() != 2 * R) throw InternalError("write_results: /profile/step_model fixed_one_ms is not [ranks][2][pairs]");
  const char* kinds = "kind 0: a prefill of B rows of P tokens; 1: a decode of B rows at the middle profiled context";
  g.write_dataset("fixed_one_ms", p.fixed_one_ms, {R, 2, K})
      .set_attr("content", format_line("a one-unit stage of unit fixed_unit, each pair's (%d before the grid, %d after); ",
                                       stepcost::kFixedCostPairs, stepcost::kFixedCostPairs) + kinds);
  g.write_dataset("fixed_two_ms", p.fixed_two_ms, {R, 2, K})
      .set_attr("content", std::string("a two-unit stage of units fixed_unit and fixed_unit + 1, each pair's; ") + kinds);
  std::vector<double> ms, lo, hi;
  std::vector<int> taken;
  for (const stepcost::FixedCost& c : f) ms.push_back(c.ms), lo.push_back(c.lo_ms), hi.push_back(c.hi_ms), taken.push_back(c.taken());
  g.write_dataset("fixed_ms", ms, {R, 2})
      .set_attr("content", "a forward's fixed cost: the median over the pairs of 2 x fixed_one_ms - fixed_two_ms (ms)");
  g.write_dataset("fixed_lo_ms", lo, {R, 2}).set_attr("content", "the smallest pair's 2 x one - two (ms)");
  g.write_dataset("fixed_hi_ms", hi, {R, 2}).set_attr("content", "the largest pair's 2 x one - two (ms)");
  g.write_dataset("fixed_taken", taken, {R, 2})
      .set_attr("content", format_line("1 where the predictions take fixed_ms: every pair of both windows of one sign and "
                                       "|fixed_ms| at least %.0f%% of fixed_one_ms's median (stepcost::FixedCost::taken); a "
                                       "one-rank stage of n units then costs the sum of its units less (n - 1) x fixed_ms",
                                       100 * stepcost::FixedCost::kMinShare));
  g.set_attr("fixed_unit", static_cast<int64_t>(p.fixed_unit));
}

}  // namespace

void write_step_model(Group& prof, const RunRecord& run) {
  const auto& p = run.profile;
  if (p.step_rows.empty()) return;
  const hs R = run.ranks.size(), S = p.step_by_rows.size(), N = p.step_rows.size();
  if (p.step_ms.size() != R * S * N) throw InternalError("write_results: /profile/step_model step_ms has the wrong size");
  Group g = prof.create_group("step_model");
  g.set_attr("model", "stepcost/step_model.h: ms = g(x) + prefill_key_ms * prefill keys + decode_key_ms * decode keys, "
                      "x = a step's tokens (its rows where by_rows), g piecewise linear between knot_x");
  g.write_dataset("step_rows", p.step_rows).set_attr("content", "rows of each grid step");
  g.write_dataset("step_pos", p.step_pos).set_attr("content", "each row's cached tokens, the steps' rows in order");
  g.write_dataset("step_tokens", p.step_tokens).set_attr("content", "each row's new tokens, the steps' rows in order");
  g.write_dataset("step_role", p.step_role).set_attr("roles", std::vector<std::string>{"knot", "context", "attention", "held_out"});
  g.write_dataset("by_rows", p.step_by_rows, {S});
  g.write_dataset("step_ms", p.step_ms, {R, S, N}).set_attr("units", "ms");
  g.set_attr("attempts", static_cast<int64_t>(p.step_attempts));
  write_fixed_cost(g, p, R);
  const stepcost::GridFit fit = fit_step_model(p);
  std::vector<double> pre, dec, err, kx, kms;
  hs K = 0;
  const hs H = fit.held_out.front().size();
  for (const auto& m : fit.models) K = std::max<hs>(K, m.knots.size());
  for (hs i = 0; i < R * S; ++i) {
    const stepcost::UnitModel& m = fit.models[i];
    pre.push_back(m.prefill_key_ms);
    dec.push_back(m.decode_key_ms);
    err.insert(err.end(), fit.held_out[i].begin(), fit.held_out[i].end());
    for (hs k = 0; k < K; ++k) {
      kx.push_back(k < m.knots.size() ? m.knots[k] : std::nan(""));
      kms.push_back(k < m.knots.size() ? m.base_ms[k] : std::nan(""));
    }
  }
  g.write_dataset("prefill_key_ms", pre, {R, S}).set_attr("units", "ms per attended key");
  g.write_dataset("decode_key_ms", dec, {R, S}).set_attr("units", "ms per attended key");
  g.write_dataset("knot_x", kx, {R, S, K}).set_attr("content", "g's knots: tokens (rows where by_rows); NaN past the last");
  g.write_dataset("knot_ms", kms, {R, S, K}).set_attr("units", "ms");
  if (H > 0 && err.size() == R * S * H) {
    auto d = g.write_dataset("held_out_error", err, {R, S, H});
    d.set_attr("content", "model / measured - 1 at each held-out step (step_role 3), in grid order");
  }
  // The grid's level against the profile's cycles, per rank (what the predictions pool).
  const std::vector<stepcost::Level> lv = step_model_levels(p, run.workload.batch, run.workload.prompt_len, fit.models);
  if (lv.size() == R) {
    std::vector<double> ld, lp;
    for (const stepcost::Level& l : lv) ld.push_back(l.decode), lp.push_back(l.prefill);
    const char* what = "the profile's cycles over the step model at the cycles' own shapes (B rows; decode at each "
                       "profiled context, prefill of B prompts of P), summed over the units: the grid's level against "
                       "the cycles'; the serving predictions scale the model by its square root (stepcost::pooled_level)";
    g.write_dataset("level_decode", ld, {R}).set_attr("content", what);
    g.write_dataset("level_prefill", lp, {R}).set_attr("content", what);
  }
  // The attributes: over the whole model per rank (each held-out step summed over its units).
  g.set_attr("held_out_abs_error_p50", fit.abs_error_p50);
  g.set_attr("held_out_abs_error_max", fit.abs_error_max);
}

std::string step_model_uncertainty(const ProfileTable& p) {
  if (p.step_rows.empty() || p.step_by_rows.empty()) return "";
  const stepcost::GridFit fit = fit_step_model(p);
  bool any = false;
  for (const std::vector<double>& h : fit.held_out) any = any || !h.empty();
  if (!any) return "grid has no held-out steps (B = 1 and every step's tokens a knot): its error is not measured";
  std::string out = format_line("held-out steps within %.1f%% (p50), %.1f%% (max)", 100 * fit.abs_error_p50,
                                100 * fit.abs_error_max);
  for (const auto& g : p.tp) {
    const stepcost::GridFit gf = fit_step_model(p, g);
    if (!gf.models.empty())
      out += format_line("; width %d (ranks %d..%d) %.1f%%, %.1f%%", g.width, g.first_rank, g.first_rank + g.width - 1,
                         100 * gf.abs_error_p50, 100 * gf.abs_error_max);
  }
  return out;
}

std::string fixed_cost_line(const ProfileTable& p) {
  const std::vector<stepcost::FixedCost> f = step_fixed_costs(p);
  if (f.empty()) return "";
  std::string out = format_line("a forward's fixed cost (2 x one unit - a stage of two, median [min..max] of %d pairs in %d "
                                "windows, ms):", stepcost::kFixedCostSamples,
                                stepcost::kFixedCostWindows);
  auto kind = [](const char* name, const stepcost::FixedCost& c) {
    return format_line(" %s %s [%s..%s] (%+.1f%% of a unit)", name, format_digits(c.ms, true).c_str(),
                       format_digits(c.lo_ms, true).c_str(), format_digits(c.hi_ms, true).c_str(),
                       c.one_ms > 0 ? 100.0 * c.ms / c.one_ms : 0.0);
  };
  int taken = 0;
  for (std::size_t i = 0; i + 1 < f.size(); i += 2) {
    out += format_line("%s rank %zu", i ? ";" : "", i / 2) + kind("prefill", f[i]) + "," + kind("decode", f[i + 1]);
    taken += f[i].taken() + f[i + 1].taken();
  }
  const std::string rule = format_line("every pair of both windows has one sign and it is at least %.0f%% of a unit",
                                       100 * stepcost::FixedCost::kMinShare);
  return out + (taken ? format_line("; taken where %s (%d of %zu): a stage of n units costs its units less (n - 1) x it",
                                    rule.c_str(), taken, f.size())
                      : "; taken by no stage (it is taken where " + rule + ")");
}

double step_model_band_error(const ProfileTable& p) {
  if (p.step_rows.empty() || p.step_by_rows.empty()) return 0.0;
  const double e = fit_step_model(p).abs_error_p50;
  return e < 0.5 ? e : 0.0;
}

void write_tp_step_grids(Group& tp, const ProfileTable& p) {
  const hs N = p.tp.size(), S = p.step_by_rows.size(), steps = p.step_rows.size();
  const bool grids = N > 0 && S > 0 && steps > 0 && std::all_of(p.tp.begin(), p.tp.end(), [&](const auto& g) {
    return g.step_ms.size() == S * steps;
  });
  if (!grids) return;
  std::vector<double> ms;
  for (const auto& g : p.tp) ms.insert(ms.end(), g.step_ms.begin(), g.step_ms.end());
  auto d = tp.write_dataset("step_ms", ms, {N, S, steps});
  d.set_attr("units", "ms");
  d.set_attr("content", "the step model's grid (/profile/step_model's steps) timed on the group's shard of one "
                        "unit of each signature at its width: the group's first rank's medians");
  std::vector<int> attempts;
  for (const auto& g : p.tp) attempts.push_back(g.step_attempts);
  tp.write_dataset("step_attempts", attempts, {N})
      .set_attr("content", "how many times each group timed its grid: one over 3% held out (p50, its first rank) is "
                           "timed again, up to twice, keeping the attempt of the lowest error");
  // The group's fit's held-out error, as the summary prints it (written for h5py; readers refit).
  std::vector<double> p50, mx;
  for (const auto& g : p.tp) {
    const stepcost::GridFit gf = fit_step_model(p, g);
    p50.push_back(gf.models.empty() ? std::nan("") : gf.abs_error_p50);
    mx.push_back(gf.models.empty() ? std::nan("") : gf.abs_error_max);
  }
  for (auto [name, data] : {std::pair<const char*, const std::vector<double>*>{"step_held_out_abs_error_p50", &p50},
                            {"step_held_out_abs_error_max", &mx}})
    tp.write_dataset(name, *data, {N})
        .set_attr("content", "|model / measured - 1| of the group's held-out grid steps (a fraction; p50 or max over "
                             "its signatures' held-out steps), as /profile/step_model held_out_abs_error_* for a rank");
}

void read_step_model(const Group& prof, ProfileTable& p) {
  if (!prof.is_group("step_model")) return;
  {
    Group g = prof.open_group("step_model");
    p.step_rows = to_int(g.open_dataset("step_rows").read<int64_t>());
    p.step_pos = to_int(g.open_dataset("step_pos").read<int64_t>());
    p.step_tokens = to_int(g.open_dataset("step_tokens").read<int64_t>());
    p.step_role = to_int(g.open_dataset("step_role").read<int64_t>());
    p.step_by_rows = to_int(g.open_dataset("by_rows").read<int64_t>());
    p.step_ms = g.open_dataset("step_ms").read<double>();
    if (g.has_attr("attempts")) p.step_attempts = static_cast<int>(g.get_attr<int64_t>("attempts"));
    if (g.has_attr("fixed_unit") && g.exists("fixed_one_ms") && g.exists("fixed_two_ms")) {
      p.fixed_unit = static_cast<int>(g.get_attr<int64_t>("fixed_unit"));
      p.fixed_one_ms = g.open_dataset("fixed_one_ms").read<double>();
      p.fixed_two_ms = g.open_dataset("fixed_two_ms").read<double>();
      (void)step_fixed_costs(p);  // the shape checked here, once: a bad file is named, not ignored later
    }
  }
}

}  // namespace ppb
