// One unit's step-cost model: the grid, the fit, the held-out error (step_model.h).
#include "stepcost/step_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "common/error.h"
#include "common/stats.h"

namespace ppb::stepcost {

StepWork step_work(const std::vector<int>& pos, const std::vector<int>& tokens) {
  if (pos.size() != tokens.size())
    throw InternalError("step_work: " + std::to_string(pos.size()) + " positions for " + std::to_string(tokens.size()) +
                        " rows");
  StepWork w;
  for (std::size_t i = 0; i < pos.size(); ++i) {
    if (tokens[i] < 1 || pos[i] < 0)
      throw InternalError("step_work: row " + std::to_string(i) + " has tokens " + std::to_string(tokens[i]) +
                          " and position " + std::to_string(pos[i]) + " (tokens >= 1, position >= 0)");
    const double t = tokens[i], p = pos[i];
    w.tokens += t;
    w.rows += 1.0;
    if (tokens[i] == 1)
      w.decode_keys += p + 1.0;
    else
      w.prefill_keys += t * p + t * (t + 1.0) / 2.0;
  }
  return w;
}

const char* role_name(Role r) {
  switch (r) {
    case Role::knot: return "knot";
    case Role::context: return "context";
    case Role::attention: return "attention";
    case Role::held_out: return "held_out";
  }
  return "?";
}

namespace {

void check_spec(const GridSpec& s) {
  if (s.max_rows < 1 || s.max_tokens < 1 || s.max_context < 1)
    throw InternalError("plan_grid: B " + std::to_string(s.max_rows) + ", max tokens " + std::to_string(s.max_tokens) +
                        " and max context " + std::to_string(s.max_context) + " must each be >= 1");
  if (static_cast<long long>(s.max_tokens) > static_cast<long long>(s.max_rows) * s.max_context)
    throw InternalError("plan_grid: a step of " + std::to_string(s.max_tokens) + " tokens does not fit " +
                        std::to_string(s.max_rows) + " rows of " + std::to_string(s.max_context) + " positions");
  for (int c : s.contexts)
    if (c < 0 || c + 1 > s.max_context)
      throw InternalError("plan_grid: decode context " + std::to_string(c) + " outside [0, " +
                          std::to_string(s.max_context - 1) + "]");
}

/// `T` tokens over `rows` rows at position 0, split evenly (the first T % rows rows one more).
GridStep split_step(int T, int rows, Role role) {
  GridStep g;
  g.role = role;
  for (int r = 0; r < rows; ++r) {
    g.pos.push_back(0);
    g.tokens.push_back(T / rows + (r < T % rows ? 1 : 0));
  }
  return g;
}

/// `rows` decode rows at position c.
GridStep decode_step(int rows, int c, Role role) {
  GridStep g;
  g.role = role;
  g.pos.assign(static_cast<std::size_t>(rows), c);
  g.tokens.assign(static_cast<std::size_t>(rows), 1);
  return g;
}

/// Linear interpolation of y over ascending x at v (clamped below, the last slope above).
double piecewise(const std::vector<double>& x, const std::vector<double>& y, double v) {
  const std::size_t K = x.size();
  if (K == 0) return 0.0;
  if (K == 1) return v > x[0] && x[0] > 0.0 ? y[0] * v / x[0] : y[0];
  if (v <= x[0]) return y[0];
  if (v >= x[K - 1]) {
    const double slope = std::max(0.0, (y[K - 1] - y[K - 2]) / (x[K - 1] - x[K - 2]));
    return y[K - 1] + slope * (v - x[K - 1]);
  }
  const std::size_t i = static_cast<std::size_t>(std::upper_bound(x.begin(), x.end(), v) - x.begin()) - 1;
  const double f = (v - x[i]) / (x[i + 1] - x[i]);
  return y[i] + f * (y[i + 1] - y[i]);
}

/// The pooled least-squares slope of y on k within groups (sum of within-group covariances over
/// the sum of within-group variances); 0 where k does not vary within any group.
double pooled_slope(const std::map<double, std::vector<std::pair<double, double>>>& groups) {
  double num = 0.0, den = 0.0;
  for (const auto& [key, pts] : groups) {
    if (pts.size() < 2) continue;
    double mk = 0.0, my = 0.0;
    for (const auto& [k, y] : pts) mk += k, my += y;
    mk /= static_cast<double>(pts.size()), my /= static_cast<double>(pts.size());
    for (const auto& [k, y] : pts) num += (k - mk) * (y - my), den += (k - mk) * (k - mk);
  }
  return den > 0.0 ? std::max(0.0, num / den) : 0.0;
}

}  // namespace

std::vector<int> knot_tokens(const GridSpec& spec) {
  check_spec(spec);
  std::set<int> k;
  for (int t = 1; t <= std::min(kEveryTokenKnotsUpTo, spec.max_tokens); ++t) k.insert(t);
  for (long long t = 1; t <= spec.max_tokens; t *= 2) {
    k.insert(static_cast<int>(t));
    if (t >= 8 && t + 1 <= spec.max_tokens) k.insert(static_cast<int>(t + 1));
  }
  if (spec.max_rows <= spec.max_tokens) k.insert(spec.max_rows);
  k.insert(spec.max_tokens);
  return {k.begin(), k.end()};
}

std::vector<GridStep> plan_grid(const GridSpec& spec) {
  const std::vector<int> knots = knot_tokens(spec);
  const int B = spec.max_rows;
  std::vector<GridStep> grid;
  for (int T : knots) grid.push_back(split_step(T, std::min(B, T), Role::knot));
  for (int c : spec.contexts) grid.push_back(decode_step(B, c, Role::context));
  // One row of the longest prompt that fits, and of half of it: against the knot step of as
  // many tokens over min(B, T) rows, the same GEMMs and other keys (a_pre).
  const int longest = std::min(spec.max_context, spec.max_tokens);
  for (int T : {longest, longest / 2})
    if (T >= 2 && std::min(B, T) > 1 && std::find(knots.begin(), knots.end(), T) != knots.end())
      grid.push_back(split_step(T, 1, Role::attention));
    else if (T >= 2 && std::min(B, T) > 1) {  // not a knot: time its even split as well
      grid.push_back(split_step(T, std::min(B, T), Role::attention));
      grid.push_back(split_step(T, 1, Role::attention));
    }
  // Held out: between knots (geometric middle) split into half the rows, at most six of them.
  std::vector<int> mids;
  for (std::size_t i = 0; i + 1 < knots.size(); ++i)
    if (knots[i + 1] - knots[i] >= 2) mids.push_back(static_cast<int>(std::lround(std::sqrt(1.0 * knots[i] * knots[i + 1]))));
  const std::size_t keep = std::min<std::size_t>(6, mids.size());
  for (std::size_t j = 0; j < keep; ++j) {
    const int T = mids[mids.size() <= 6 ? j : j * (mids.size() - 1) / (keep - 1)];
    const int rows = std::max(1, std::min(B, T) / 2);
    if ((T + rows - 1) / rows <= spec.max_context) grid.push_back(split_step(T, rows, Role::held_out));
  }
  // Among the every-count knots: a prompt of 3 tokens in one row (the knot at 3 runs 3 rows of
  // one: the same GEMM, other keys), where a small-M kernel's passes make the cost step.
  if (B >= 2 && spec.max_tokens >= 3 && spec.max_context >= 3) grid.push_back(split_step(3, 1, Role::held_out));
  if (B >= 2 && !spec.contexts.empty()) {
    const int c = spec.contexts[spec.contexts.size() / 2];
    grid.push_back(decode_step(B / 2, c, Role::held_out));
    // A mixed step: one prompt and B - 1 decodes in one forward.
    const int L = std::min(spec.max_context, spec.max_tokens - (B - 1));
    if (L >= 2) {
      GridStep g = decode_step(B, c, Role::held_out);
      g.pos[0] = 0;
      g.tokens[0] = L;
      grid.push_back(g);
    }
  }
  return grid;
}

double UnitModel::ms(const StepWork& w) const {
  if (knots.empty()) return 0.0;
  if (by_rows) return std::max(0.0, piecewise(knots, base_ms, w.rows));
  const double x = w.tokens;
  return std::max(0.0, piecewise(knots, base_ms, x) + prefill_key_ms * w.prefill_keys + decode_key_ms * w.decode_keys);
}

UnitModel fit_unit(const std::vector<Sample>& samples, bool by_rows) {
  UnitModel m;
  m.by_rows = by_rows;
  auto x_of = [&](const StepWork& w) { return by_rows ? w.rows : w.tokens; };
  std::set<double> knot_x;
  for (const Sample& s : samples)
    if (s.role == Role::knot) knot_x.insert(x_of(s.work));
  if (knot_x.empty()) throw InternalError("fit_unit: no knot sample");
  // The head has no attention: its cost goes by rows alone.
  std::map<double, std::vector<std::pair<double, double>>> dec, pre;
  if (by_rows) {
    for (const Sample& s : samples)
      if (s.role != Role::held_out) pre[s.work.rows].emplace_back(s.ms, 0.0);
    for (const auto& [x, pts] : pre) {
      double total = 0.0;
      for (const auto& [y, unused] : pts) total += y;
      m.knots.push_back(x);
      m.base_ms.push_back(total / static_cast<double>(pts.size()));
    }
    return m;
  }
  // a_dec: steps of decode rows only, of equal (T, R), at several contexts (a knot step of
  // one-token rows at position 0 among them)
  for (const Sample& s : samples)
    if (s.role != Role::held_out && s.work.prefill_keys == 0.0 && s.work.tokens == s.work.rows)
      dec[s.work.tokens].emplace_back(s.work.decode_keys, s.ms);
  m.decode_key_ms = pooled_slope(dec);
  // a_pre: steps of equal x, their tokens in other rows (knot and attention samples)
  std::set<double> attention_x;
  for (const Sample& s : samples)
    if (s.role == Role::attention) attention_x.insert(x_of(s.work));
  for (const Sample& s : samples)
    if ((s.role == Role::knot || s.role == Role::attention) && attention_x.count(x_of(s.work)))
      pre[x_of(s.work)].emplace_back(s.work.prefill_keys, s.ms - m.decode_key_ms * s.work.decode_keys);
  m.prefill_key_ms = pooled_slope(pre);
  // g at each knot: its knot samples, less their attention terms (the context and attention
  // samples fit the slopes only: a noisy one then moves the steps with many keys, not g)
  std::map<double, std::pair<double, int>> sum;
  for (const Sample& s : samples) {
    if (s.role != Role::knot) continue;
    auto& [total, n] = sum[x_of(s.work)];
    total += s.ms - m.prefill_key_ms * s.work.prefill_keys - m.decode_key_ms * s.work.decode_keys;
    ++n;
  }
  for (const auto& [x, tn] : sum) {
    m.knots.push_back(x);
    m.base_ms.push_back(std::max(0.0, tn.first / tn.second));
  }
  return m;
}

Level level_against(const std::vector<UnitModel>& models, const std::vector<int>& unit_signature, int B, int P,
                    const std::vector<int>& contexts, const std::vector<double>& prefill_ms,
                    const std::vector<double>& decode_ms) {
  const std::size_t U = unit_signature.size(), C = contexts.size();
  if (prefill_ms.size() != U || decode_ms.size() != U * C || B < 1 || P < 1)
    throw InternalError("level_against: " + std::to_string(prefill_ms.size()) + " prefill and " +
                        std::to_string(decode_ms.size()) + " decode times for " + std::to_string(U) + " units and " +
                        std::to_string(C) + " contexts (B=" + std::to_string(B) + ", P=" + std::to_string(P) + ")");
  const StepWork prefill = step_work(std::vector<int>(static_cast<std::size_t>(B), 0), std::vector<int>(static_cast<std::size_t>(B), P));
  std::vector<StepWork> decode;
  for (int c : contexts) decode.push_back(step_work(std::vector<int>(static_cast<std::size_t>(B), c), std::vector<int>(static_cast<std::size_t>(B), 1)));
  double pre_meas = 0, pre_model = 0, dec_meas = 0, dec_model = 0;
  for (std::size_t u = 0; u < U; ++u) {
    const UnitModel& m = models.at(static_cast<std::size_t>(unit_signature[u]));
    pre_meas += prefill_ms[u];
    pre_model += m.ms(prefill);
    for (std::size_t c = 0; c < C; ++c) dec_meas += decode_ms[u * C + c], dec_model += m.ms(decode[c]);
  }
  auto ratio = [](double meas, double model) {
    const double r = meas / model;
    return meas > 0 && model > 0 && std::isfinite(r) ? r : 1.0;
  };
  return {ratio(dec_meas, dec_model), ratio(pre_meas, pre_model)};
}

double pooled_level(const Level& l, bool prefill) { return std::pow(prefill ? l.prefill : l.decode, kCyclesLevelWeight); }

std::vector<double> held_out_errors(const UnitModel& model, const std::vector<Sample>& samples) {
  std::vector<double> out;
  for (const Sample& s : samples)
    if (s.role == Role::held_out && s.ms > 0.0) out.push_back(model.ms(s.work) / s.ms - 1.0);
  return out;
}

FixedCost fixed_cost_of(const std::vector<double>& one_ms, const std::vector<double>& two_ms) {
  if (one_ms.size() != two_ms.size())
    throw InternalError("fixed_cost_of: " + std::to_string(one_ms.size()) + " one-unit timings against " +
                        std::to_string(two_ms.size()) + " two-unit ones");
  FixedCost f;
  if (one_ms.empty()) return f;
  std::vector<double> d;
  for (std::size_t i = 0; i < one_ms.size(); ++i) d.push_back(2.0 * one_ms[i] - two_ms[i]);
  f.pairs = static_cast<int>(d.size());
  f.ms = median(d);
  f.lo_ms = *std::min_element(d.begin(), d.end());
  f.hi_ms = *std::max_element(d.begin(), d.end());
  f.one_ms = median(one_ms);
  return f;
}

FlatGrid flatten(const std::vector<GridStep>& grid) {
  FlatGrid f;
  for (const GridStep& g : grid) {
    f.rows.push_back(static_cast<int>(g.pos.size()));
    f.pos.insert(f.pos.end(), g.pos.begin(), g.pos.end());
    f.tokens.insert(f.tokens.end(), g.tokens.begin(), g.tokens.end());
    f.role.push_back(static_cast<int>(g.role));
  }
  return f;
}

std::vector<GridStep> unflatten(const FlatGrid& f) {
  long long total = 0;
  for (int r : f.rows) total += r;
  if (f.role.size() != f.rows.size() || f.pos.size() != f.tokens.size() || static_cast<long long>(f.pos.size()) != total)
    throw UserError("/profile/step_model: " + std::to_string(f.rows.size()) + " steps with " + std::to_string(total) +
                    " rows in all, but " + std::to_string(f.role.size()) + " roles, " + std::to_string(f.pos.size()) +
                    " positions and " + std::to_string(f.tokens.size()) + " token counts");
  std::vector<GridStep> out;
  std::size_t at = 0;
  for (std::size_t n = 0; n < f.rows.size(); ++n) {
    if (f.role[n] < 0 || f.role[n] > static_cast<int>(Role::held_out) || f.rows[n] < 1)
      throw UserError("/profile/step_model: step " + std::to_string(n) + " has role " + std::to_string(f.role[n]) +
                      " and " + std::to_string(f.rows[n]) + " rows (roles 0..3, rows >= 1)");
    GridStep g;
    g.role = static_cast<Role>(f.role[n]);
    g.pos.assign(f.pos.begin() + static_cast<std::ptrdiff_t>(at), f.pos.begin() + static_cast<std::ptrdiff_t>(at + f.rows[n]));
    g.tokens.assign(f.tokens.begin() + static_cast<std::ptrdiff_t>(at),
                    f.tokens.begin() + static_cast<std::ptrdiff_t>(at + f.rows[n]));
    at += static_cast<std::size_t>(f.rows[n]);
    out.push_back(std::move(g));
  }
  return out;
}

std::vector<Sample> samples_of(const std::vector<GridStep>& grid, const double* ms) {
  std::vector<Sample> out;
  for (std::size_t n = 0; n < grid.size(); ++n) out.push_back({grid[n].work(), ms[n], grid[n].role});
  return out;
}

GridFit fit_grid(const std::vector<GridStep>& grid, const std::vector<int>& by_rows, const std::vector<double>& ms,
                 const std::vector<int>& units) {
  const std::size_t S = by_rows.size(), N = grid.size();
  if (S == 0 || N == 0 || ms.size() % (S * N) != 0)
    throw UserError("/profile/step_model: step_ms holds " + std::to_string(ms.size()) + " values, not ranks x " +
                    std::to_string(S) + " signatures x " + std::to_string(N) + " steps");
  if (!units.empty() && units.size() != S)
    throw UserError("/profile/step_model: " + std::to_string(S) + " signatures, but unit counts of " +
                    std::to_string(units.size()));
  GridFit f;
  std::vector<double> all;
  for (std::size_t i = 0; i < ms.size() / N; ++i) {
    const std::vector<Sample> samples = samples_of(grid, &ms[i * N]);
    f.models.push_back(fit_unit(samples, by_rows[i % S] != 0));
    f.held_out.push_back(held_out_errors(f.models.back(), samples));
    if (units.empty())
      for (double e : f.held_out.back()) all.push_back(std::abs(e));
  }
  if (!units.empty())
    for (std::size_t r = 0; r < ms.size() / (S * N); ++r)
      for (std::size_t n = 0; n < N; ++n) {
        if (grid[n].role != Role::held_out) continue;
        double model = 0.0, measured = 0.0;
        for (std::size_t s = 0; s < S; ++s) {
          model += units[s] * f.models[r * S + s].ms(grid[n].work());
          measured += units[s] * ms[(r * S + s) * N + n];
        }
        if (measured > 0.0) all.push_back(std::abs(model / measured - 1.0));
      }
  if (!all.empty()) {
    std::sort(all.begin(), all.end());
    const std::size_t n = all.size();
    f.abs_error_p50 = n % 2 ? all[n / 2] : 0.5 * (all[n / 2 - 1] + all[n / 2]);
    f.abs_error_max = all.back();
  }
  return f;
}

GridFit fit_profile_grid(const FlatGrid& flat, const std::vector<int>& by_rows, const std::vector<double>& ms,
                         const std::vector<int>& unit_signature) {
  std::vector<int> units(by_rows.size(), 0);
  for (int s : unit_signature) {
    if (s < 0 || static_cast<std::size_t>(s) >= units.size())
      throw UserError("/profile/step_model: a unit of signature " + std::to_string(s) + ", but " +
                      std::to_string(units.size()) + " signatures timed");
    ++units[static_cast<std::size_t>(s)];
  }
  return fit_grid(unflatten(flat), by_rows, ms, units);
}

}  // namespace ppb::stepcost
