#include "balance/plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "balance/layout.h"
#include "balance/predict.h"
#include "balance/problem.h"
#include "balance/solver.h"
#include "common/error.h"
#include "common/parallel_for.h"
#include "stepcost/step_model.h"

namespace ppb::balance {

std::string plan_label(const std::vector<int>& widths, int groups, int replicas) {
  const int S = static_cast<int>(widths.size());
  const bool all_one = std::all_of(widths.begin(), widths.end(), [](int w) { return w == 1; });
  std::string s = replicas > 1 ? "DP" + std::to_string(replicas) + " " : "";
  if (S == 1 && widths[0] > 1) {
    s += "TP" + std::to_string(widths[0]);
  } else {
    s += "PP" + std::to_string(S);
    if (!all_one) {
      std::string tp = layout_label(widths);
      std::replace(tp.begin(), tp.end(), ',', '-');
      s += " tp" + tp;
    }
  }
  return s + " M" + std::to_string(groups);
}

int machine_size(const RunRecord& run) {
  const std::string m0 = rank_machine(run.ranks[0]);
  int n = 0;
  for (const RankInfo& r : run.ranks) n += rank_machine(r) == m0 ? 1 : 0;
  return std::max(1, n);
}

namespace {

/// Rank 0's [U][2] rows of a [R][U][2] table, repeated `devices` times (empty stays empty).
std::vector<double> rank0_rows(const std::vector<double>& t, size_t U, int devices) {
  if (t.size() < 2 * U) return {};
  std::vector<double> out;
  out.reserve(2 * U * static_cast<size_t>(devices));
  for (int d = 0; d < devices; ++d) out.insert(out.end(), t.begin(), t.begin() + static_cast<long>(2 * U));
  return out;
}

}  // namespace

RunRecord plan_record(const RunRecord& run, int devices, int groups) {
  const ProfileTable& t = run.profile;
  const size_t U = t.unit_name.size();
  if (U == 0 || t.latency_ms.size() < 2 * U || run.ranks.empty())
    throw UserError("the results file has no profile of its units and ranks (/profile/latency_ms, /ranks): nothing to plan from");
  if (run.workload.microbatches < 1 || run.workload.batch < 1 || run.workload.gen_len < 1)
    throw UserError("the results file has no workload (/config/workload batch, gen_len, microbatches): nothing to plan from");
  RunRecord r;
  r.world_size = devices;
  r.workload = run.workload;
  r.workload.microbatches = groups;
  r.model_attrs_num = run.model_attrs_num;
  r.link_latency_s = run.link_latency_s;
  r.link_bandwidth_Bps = run.link_bandwidth_Bps;
  const int m = machine_size(run);
  for (int d = 0; d < devices; ++d) {
    RankInfo k = run.ranks[0];
    k.machine_id = "plan-" + std::to_string(d / m);
    k.local_rank = d % m;
    r.ranks.push_back(k);
  }
  ProfileTable& p = r.profile;
  p.unit_name = t.unit_name;
  p.unit_signature = t.unit_signature;
  p.signature_name = t.signature_name;
  p.unit_params = t.unit_params;
  p.unit_weight_bytes = t.unit_weight_bytes;
  p.unit_flops = t.unit_flops;
  p.unit_bytes = t.unit_bytes;
  p.latency_ms = rank0_rows(t.latency_ms, U, devices);
  p.latency_min_ms = rank0_rows(t.latency_min_ms, U, devices);
  p.latency_max_ms = rank0_rows(t.latency_max_ms, U, devices);
  p.latency_alone_ms = rank0_rows(t.latency_alone_ms, U, devices);
  // Decode by context (the serving step model's, `plan --scenario`): rank 0's [U][C] per device.
  p.decode_contexts = t.decode_contexts;
  const size_t C = t.decode_contexts.size();
  if (C > 0 && t.decode_context_ms.size() >= U * C)
    for (int d = 0; d < devices; ++d)
      p.decode_context_ms.insert(p.decode_context_ms.end(), t.decode_context_ms.begin(),
                                 t.decode_context_ms.begin() + static_cast<long>(U * C));
  // The step model's grid (issue 47): rank 0's medians [S][N] per device, as its tables.
  const std::size_t S = t.step_by_rows.size(), N = t.step_rows.size();
  if (S > 0 && N > 0 && t.step_ms.size() >= S * N) {
    p.step_rows = t.step_rows, p.step_pos = t.step_pos, p.step_tokens = t.step_tokens, p.step_role = t.step_role;
    p.step_by_rows = t.step_by_rows;
    for (int d = 0; d < devices; ++d)
      p.step_ms.insert(p.step_ms.end(), t.step_ms.begin(), t.step_ms.begin() + static_cast<long>(S * N));
  }
  // A forward's fixed cost: rank 0's pairs [2][pairs] per device, as its tables.
  const std::size_t F = 2 * static_cast<std::size_t>(stepcost::kFixedCostSamples);
  if (t.fixed_unit >= 0 && t.fixed_one_ms.size() >= F && t.fixed_two_ms.size() >= F) {
    p.fixed_unit = t.fixed_unit;
    for (int d = 0; d < devices; ++d) {
      p.fixed_one_ms.insert(p.fixed_one_ms.end(), t.fixed_one_ms.begin(), t.fixed_one_ms.begin() + static_cast<long>(F));
      p.fixed_two_ms.insert(p.fixed_two_ms.end(), t.fixed_two_ms.begin(), t.fixed_two_ms.begin() + static_cast<long>(F));
    }
  }
  // The KV cache of M·B sequences from the file's of M_file·B: linear in the groups.
  const double scale = static_cast<double>(groups) / run.workload.microbatches;
  for (int64_t kv : t.unit_kv_bytes) p.unit_kv_bytes.push_back(static_cast<int64_t>(std::ceil(kv * scale)));
  const std::vector<int> classes = rank_device_classes(run.ranks);
  for (const auto& g : t.tp) {
    const bool have = std::any_of(p.tp.begin(), p.tp.end(), [&](const auto& h) { return h.width == g.width; });
    if (have || g.width < 2 || g.width > m || g.width > devices || g.latency_ms.size() != 2 * U) continue;
    if (g.first_rank < 0 || g.first_rank >= static_cast<int>(classes.size()) || classes[g.first_rank] != classes[0]) continue;
    p.tp.push_back(g);
    p.tp.back().first_rank = 0;
  }
  return r;
}

namespace {

/// The widths a stage may have in `rec` (plan_record's): 1 and each profiled width, ascending.
std::vector<int> stage_widths(const RunRecord& rec) {
  std::vector<int> w = {1};
  for (const auto& g : rec.profile.tp) w.push_back(g.width);
  std::sort(w.begin(), w.end());
  w.erase(std::unique(w.begin(), w.end()), w.end());
  return w;
}

/// Whether a group of width w starting at device d stays on one machine of m devices.
bool group_fits(int d, int w, int m) { return d / m == (d + w - 1) / m; }

/// What the layout search knows: units, devices, machine size, widths, the objective.
struct SearchSpace {
  int U = 0, N = 0, m = 1;
  std::vector<int> widths;
  Objective objective = Objective::workload;
};

/// Compositions of N into widths (groups within a machine, at most U stages), saturating.
size_t count_layouts(const SearchSpace& sp) {
  const size_t cap = std::numeric_limits<size_t>::max() / 4;
  // c[s][d]: ways to place s stages on devices 0 .. d - 1.
  std::vector<std::vector<size_t>> c(sp.U + 1, std::vector<size_t>(sp.N + 1, 0));
  c[0][0] = 1;
  size_t total = 0;
  for (int s = 0; s < sp.U; ++s)
    for (int d = 0; d < sp.N; ++d) {
      if (c[s][d] == 0) continue;
      for (int w : sp.widths)
        if (d + w <= sp.N && group_fits(d, w, sp.m)) c[s + 1][d + w] = std::min(cap, c[s + 1][d + w] + c[s][d]);
    }
  for (int s = 1; s <= sp.U; ++s) total = std::min(cap, total + c[s][sp.N]);
  return total;
}

/// Every composition (count_layouts' set), in lexicographic order of the widths.
void enumerate_layouts(const SearchSpace& sp, std::vector<int>& cur, int d, std::vector<std::vector<int>>& out) {
  if (d == sp.N) {
    out.push_back(cur);
    return;
  }
  if (static_cast<int>(cur.size()) >= sp.U) return;
  for (int w : sp.widths) {
    if (d + w > sp.N || !group_fits(d, w, sp.m)) continue;
    cur.push_back(w);
    enumerate_layouts(sp, cur, d + w, out);
    cur.pop_back();
  }
}

/// The stage times of the bottleneck DP: group of width w over units [u, v) with the one link's
/// boundary transfers (the layout problem's) and, at width 1, the forward's fixed cost once
/// (BalanceProblem::stage_fixed_ms), NaN where the units do not fit its memory.
class StageTimes {
 public:
  StageTimes(const RunRecord& rec, const SearchSpace& sp) : sp_(sp) {
    const BalanceProblem p = problem_from_run(rec, sp.objective);
    overlap_ = p.overlap;
    BalanceProblem one = p;
    one.pair_bandwidth_GBps.clear();
    one.pair_latency_us.clear();
    xfer_ = sp.U > 1 ? boundary_transfer_ms(one) : std::vector<double>{};
    for (int u = 0; u < sp.U; ++u) {
      int64_t b = u < static_cast<int>(p.weight_bytes.size()) ? p.weight_bytes[u] : 0;
      b += u < static_cast<int>(p.kv_bytes.size()) ? p.kv_bytes[u] : 0;
      bytes_.push_back(b);
    }
    const int64_t dev = p.device_memory_bytes.empty() ? 0 : p.device_memory_bytes[0];
    for (int w : sp.widths) {
      std::vector<double> row = p.cost[0];
      if (w > 1) {
        const auto* g = group_profile(rec, rank_device_classes(rec.ranks), 0, w);
        for (int u = 0; u < sp.U; ++u)
          row[u] = objective_cost(sp.objective, g->latency_ms[2 * u], g->latency_ms[2 * u + 1], rec.workload.gen_len);
      }
      cost_.push_back(row);
      fixed_.push_back(w == 1 ? p.fixed_of_row(p.row_of(0)) : 0.0);  // a TP group's profile times none
      memory_.push_back(dev > 0 ? dev * w : 0);
    }
  }

  /// Stage time (ms) of width index wi over units [u, v); NaN when they do not fit.
  double time(size_t wi, int u, int v) const {
    double compute = fixed_[wi];
    int64_t bytes = 0;
    for (int x = u; x < v; ++x) {
      compute += cost_[wi][x];
      bytes += bytes_[x];
    }
    if (memory_[wi] > 0 && bytes > memory_[wi]) return std::nan("");
    return stage_time(compute, u > 0 ? xfer_[u - 1] : 0.0, v < sp_.U ? xfer_[v - 1] : 0.0, overlap_);
  }

 private:
  const SearchSpace& sp_;
  bool overlap_ = true;
  std::vector<double> xfer_;
  std::vector<int64_t> bytes_, memory_;
  std::vector<std::vector<double>> cost_;  ///< [widths][U] objective ms
  std::vector<double> fixed_;              ///< [widths] ms a stage pays once (stage_fixed_ms; width 1 only)
};

/// Per stage count S (index S; empty where none fits): the widths whose best split has the
/// smallest bottleneck, ties to the lexicographically smallest widths. A backward DP
///   b[s][d][u] = min over (w, v) of max(time_w(u, v), b[s-1][d+w][v]),  b[0][N][U] = 0,
/// the smallest bottleneck of s more stages on devices d .. N-1 over units u .. U-1; then per S a
/// forward pass keeping every optimal state, taking the smallest width that keeps one.
std::vector<std::vector<int>> best_widths_per_stage_count(const RunRecord& rec, const SearchSpace& sp) {
  const StageTimes st(rec, sp);
  const int Smax = std::min(sp.U, sp.N), N = sp.N, U = sp.U;
  const double inf = std::numeric_limits<double>::infinity();
  const size_t W = sp.widths.size();
  // times[wi][u][v]: memoised stage times (U^2 per width).
  std::vector<std::vector<std::vector<double>>> tm(W, std::vector<std::vector<double>>(U + 1, std::vector<double>(U + 1, std::nan(""))));
  for (size_t wi = 0; wi < W; ++wi)
    for (int u = 0; u < U; ++u)
      for (int v = u + 1; v <= U; ++v) {
        tm[wi][u][v] = st.time(wi, u, v);
        if (std::isnan(tm[wi][u][v])) break;  // more units only need more memory
      }
  auto idx = [&](int s, int d, int u) { return (static_cast<size_t>(s) * (N + 1) + d) * (U + 1) + u; };
  std::vector<double> b(static_cast<size_t>(Smax + 1) * (N + 1) * (U + 1), inf);
  b[idx(0, N, U)] = 0.0;
  const int wmax = sp.widths.back();
  for (int s = 1; s <= Smax; ++s)
    for (int d = 0; d < N; ++d) {
      if (N - d < s || N - d > s * wmax) continue;
      for (int u = 0; u + s <= U; ++u) {
        double best = inf;
        for (size_t wi = 0; wi < W; ++wi) {
          const int w = sp.widths[wi];
          if (d + w > N || !group_fits(d, w, sp.m)) continue;
          for (int v = u + 1; v <= U - (s - 1); ++v) {
            const double t = tm[wi][u][v];
            if (std::isnan(t)) break;
            best = std::min(best, std::max(t, b[idx(s - 1, d + w, v)]));
          }
        }
        b[idx(s, d, u)] = best;
      }
    }
  std::vector<std::vector<int>> out(Smax + 1);
  for (int S = 1; S <= Smax; ++S) {
    const double B = b[idx(S, 0, 0)];
    if (B == inf) continue;
    std::vector<char> cur(U + 1, 0);
    cur[0] = 1;
    int d = 0;
    for (int k = 0; k < S; ++k) {
      const int rem = S - k - 1;
      for (size_t wi = 0; wi < W; ++wi) {
        const int w = sp.widths[wi];
        if (d + w > N || !group_fits(d, w, sp.m)) continue;
        std::vector<char> next(U + 1, 0);
        bool any = false;
        for (int u = 0; u < U; ++u) {
          if (!cur[u]) continue;
          for (int v = u + 1; v <= U; ++v) {
            const double t = tm[wi][u][v];
            if (std::isnan(t)) break;
            if (t <= B && b[idx(rem, d + w, v)] <= B) next[v] = any = true;
          }
        }
        if (!any) continue;
        out[S].push_back(w);
        cur = std::move(next);
        d += w;
        break;
      }
    }
    if (static_cast<int>(out[S].size()) != S || d != N) throw InternalError("plan: the bottleneck DP lost its layout");
  }
  return out;
}

/// Whether every stage of `split` holds its units' weights and KV cache in `rec`'s memory
/// (width x the rank's limit less its scratch; no limit = fits).
bool fits_memory(const RunRecord& rec, const Partition& split) {
  const RankInfo& k = rec.ranks[0];
  if (k.memory_limit_bytes <= 0) return true;
  const int64_t dev = std::max<int64_t>(1, k.memory_limit_bytes - k.stage_scratch_bytes);
  const ProfileTable& t = rec.profile;
  for (int s = 0; s < split.num_stages(); ++s) {
    int64_t bytes = 0;
    for (int u = split.first_unit[s]; u <= split.last_unit[s]; ++u) {
      bytes += u < static_cast<int>(t.unit_weight_bytes.size()) ? t.unit_weight_bytes[u] : 0;
      bytes += u < static_cast<int>(t.unit_kv_bytes.size()) ? t.unit_kv_bytes[u] : 0;
    }
    if (bytes > dev * split.width(s)) return false;
  }
  return true;
}

/// The balanced split of layout `widths` on `rec` (layout_problem + make_layout_split); nullopt
/// when no split fits its memory.
std::optional<Partition> solve_split(const RunRecord& rec, Objective o, const std::vector<int>& widths) {
  try {
    SplitRequest r;
    r.method = Method::balanced;
    return make_layout_split(layout_problem(rec, o, widths), r, widths);
  } catch (const UserError&) {
    return std::nullopt;
  }
}

/// A layout being evaluated M after M: its widths and split (as of the last M), and whether it
/// still fits. In the bottleneck mode the widths are re-chosen when the split stops fitting.
struct Slot {
  int stages = 0;
  std::vector<int> widths;
  std::optional<Partition> split;
  bool alive = true;
};

/// One candidate from the predictor of M = `groups`.
PlanCandidate predict_candidate(const Predictor& pred, const RunRecord& rec, const Slot& slot, int groups, int devices,
                                int beside, std::set<std::string>& warnings) {
  PlanCandidate c;
  c.widths = slot.widths;
  c.groups = groups;
  c.batch = rec.workload.batch;
  c.split = *slot.split;
  c.label = plan_label(c.widths, groups);
  // Its steps with the replicas beside it (PlanRequest::beside): a stage whose twin shares its
  // machine pays the together pass (Predictor::twin_on_machine); its rates stay one replica's.
  Partition with_twins = c.split;
  with_twins.replicas = beside;
  const PhasePrediction ph = pred.predicted_phases(with_twins, rec.profile);
  if (!ph.warning.empty()) warnings.insert(ph.warning);
  const PartitionMetrics m = pred.simulate(c.split, ph.phase_ms);
  c.phase_ms = ph.phase_ms;
  c.tokens_per_s = m.tokens_per_s;
  c.tokens_per_s_per_device = m.tokens_per_s / devices;
  c.ttft_p50_ms = m.ttft_p50_ms;
  c.tpot_p50_ms = m.tpot_p50_ms;
  c.tokens_per_s_per_user = m.tpot_p50_ms > 0 ? 1000.0 / m.tpot_p50_ms : std::numeric_limits<double>::infinity();
  c.bottleneck_stage = m.bottleneck_stage;
  c.bottleneck_bound_tok_s = m.bottleneck_bound_tok_s;
  c.decode_tokens_per_s = m.decode_tokens_per_s;
  return c;
}

/// The layouts to evaluate, and the mode, from the record of M = 1.
std::vector<Slot> initial_slots(const RunRecord& rec1, const SearchSpace& sp, const PlanRequest& req, PlanResult& res) {
  std::vector<Slot> slots;
  res.layouts_possible = count_layouts(sp);
  std::vector<std::vector<int>> layouts;
  if (res.layouts_possible <= req.max_layouts) {
    res.mode = "every layout";
    std::vector<int> cur;
    enumerate_layouts(sp, cur, 0, layouts);
  } else {
    res.mode = "per stage count, the smallest bottleneck";
    for (auto& w : best_widths_per_stage_count(rec1, sp))
      if (!w.empty()) layouts.push_back(std::move(w));
  }
  for (auto& w : layouts) {
    Slot s;
    s.stages = static_cast<int>(w.size());
    s.widths = std::move(w);
    slots.push_back(std::move(s));
  }
  return slots;
}

/// Re-solves `slot` at the record of M where its split does not fit (or has none yet): the same
/// widths in "every layout", the bottleneck DP's widths for its stage count otherwise
/// (`dp_widths`: computed once per M, on demand). Marks it dead when nothing fits.
void refresh_slot(Slot& slot, const RunRecord& rec, const SearchSpace& sp, bool every_layout,
                  std::optional<std::vector<std::vector<int>>>& dp_widths, PlanResult& res) {
  if (slot.split && fits_memory(rec, *slot.split)) return;
  if (!every_layout) {
    if (!dp_widths) dp_widths = best_widths_per_stage_count(rec, sp);
    if ((*dp_widths)[slot.stages].empty()) {
      slot.alive = false;
      return;
    }
    slot.widths = (*dp_widths)[slot.stages];
  }
  ++res.layouts_evaluated;
  slot.split = solve_split(rec, sp.objective, slot.widths);
  if (!slot.split || !fits_memory(rec, *slot.split)) slot.alive = false;
}

/// One (layout, M) to simulate: its split at M and the bounds of its figures.
struct Job {
  size_t slot = 0;
  int groups = 1;
  std::vector<int> widths;
  Partition split;
  double tps_ub = 0, ttft_lb = 0, tpot_lb = 0;
};

}  // namespace

PlanBounds plan_bounds(const Predictor& pred, const RunRecord& rec, const Partition& split) {
  const StageSums sums = pred.pass_sums(split, rec.profile);
  const int S = split.num_stages(), G = rec.workload.gen_len, M = rec.workload.microbatches;
  double sum_p = 0, sum_d = 0;
  std::vector<double> p(S), d(S);
  for (int k = 0; k < S; ++k) {
    p[k] = std::min(sums.alone[2 * k], sums.together[2 * k]);
    d[k] = std::min(sums.alone[2 * k + 1], sums.together[2 * k + 1]);
    sum_p += p[k];
    sum_d += d[k];
  }
  // Every stage serves its M prefills before any decode step (the items' static order). Stage j
  // starts its decode steps once the last group's prefill has left stage i (after i's M
  // prefills) and crossed i + 1 .. j (i <= j), or, for i > j, serves its last (G-1)·M + 1 decode
  // steps once that group's first token came back and its step crossed 0 .. j-1; its last step
  // then crosses the stages after j. i = j is the stage's own fill, work and drain.
  std::vector<double> pp(S + 1, 0.0), dd(S + 1, 0.0);  // prefix sums
  for (int k = 0; k < S; ++k) {
    pp[k + 1] = pp[k] + p[k];
    dd[k + 1] = dd[k] + d[k];
  }
  double wall_ms = sum_p + G * sum_d;
  for (int i = 0; i < S; ++i) {
    const double prefills_done = pp[i] + M * p[i];  // stage i's M-th prefill ends
    for (int j = 0; j < S; ++j) {
      const double drain = dd[S] - dd[j + 1];
      const double t = i <= j ? prefills_done + (pp[j + 1] - pp[i + 1]) + M * G * d[j] + drain
                              : prefills_done + (pp[S] - pp[i + 1]) + dd[j] + ((G - 1.0) * M + 1) * d[j] + drain;
      wall_ms = std::max(wall_ms, t);
    }
  }
  PlanBounds b;
  b.tokens_per_s_max = wall_ms > 0 ? 1000.0 * M * rec.workload.batch * G / wall_ms : std::numeric_limits<double>::infinity();
  b.ttft_min_ms = sum_p;
  b.tpot_min_ms = std::max(sum_d, M * std::min(p[S - 1], d[S - 1]));
  return b;
}

namespace {

/// The relaxation of targets a candidate with these TTFT and TPOT needs (0 without targets).
double relaxation(double ttft, double tpot, double slo_ttft, double slo_tpot) {
  double r = 0.0;
  if (slo_ttft > 0) r = std::max(r, ttft / slo_ttft);
  if (slo_tpot > 0) r = std::max(r, tpot / slo_tpot);
  return r;
}

/// Whether the simulated candidates `done` prove `job` irrelevant (plan_layouts' comment).
bool provably_irrelevant(const Job& job, const std::vector<PlanCandidate>& done, const PlanRequest& req) {
  const double tpu_ub = job.tpot_lb > 0 ? 1000.0 / job.tpot_lb : std::numeric_limits<double>::infinity();
  const double job_relax = relaxation(job.ttft_lb, job.tpot_lb, req.slo_ttft_ms, req.slo_tpot_ms);
  bool dominated = false, outsold = job_relax > 1.0, some_meets = false;
  double min_relax = std::numeric_limits<double>::infinity();
  for (const PlanCandidate& c : done) {
    if (c.tokens_per_s >= job.tps_ub && c.tokens_per_s_per_user >= tpu_ub &&
        (c.tokens_per_s > job.tps_ub || c.tokens_per_s_per_user > tpu_ub))
      dominated = true;
    const double r = relaxation(c.ttft_p50_ms, c.tpot_p50_ms, req.slo_ttft_ms, req.slo_tpot_ms);
    min_relax = std::min(min_relax, r);
    if (r <= 1.0) {
      some_meets = true;
      if (c.tokens_per_s >= job.tps_ub) outsold = true;
    }
  }
  if (!req.need_front) return outsold;
  return dominated && outsold && (some_meets || job_relax > min_relax);
}

/// Simulates `jobs` in order, skipping those provably_irrelevant to the candidates simulated
/// before them, in batches of a few run on the machine's cores (a batch's jobs are checked
/// against the candidates of the batches before it: fewer skips than one by one, the same
/// front and choice).
void simulate_jobs(const std::vector<Job>& jobs, const std::vector<std::unique_ptr<RunRecord>>& recs,
                   const std::vector<std::unique_ptr<Predictor>>& preds, const PlanRequest& req, PlanResult& res,
                   std::set<std::string>& warnings) {
  const size_t threads = parallel_threads();
  const size_t batch_size = threads == 1 ? 1 : 2 * threads;
  for (size_t i = 0; i < jobs.size();) {
    std::vector<const Job*> batch;
    for (; i < jobs.size() && batch.size() < batch_size; ++i) {
      if (req.prune && provably_irrelevant(jobs[i], res.candidates, req)) {
        ++res.pruned;
        continue;
      }
      batch.push_back(&jobs[i]);
    }
    std::vector<PlanCandidate> out(batch.size());
    std::vector<std::set<std::string>> warn(batch.size());
    parallel_for(batch.size(), [&](size_t b) {
      const Job& job = *batch[b];
      Slot at;
      at.stages = static_cast<int>(job.widths.size());
      at.widths = job.widths;
      at.split = job.split;
      out[b] = predict_candidate(*preds[job.groups - 1], *recs[job.groups - 1], at, job.groups, req.devices, req.beside,
                                 warn[b]);
    });
    for (size_t b = 0; b < batch.size(); ++b) {
      res.candidates.push_back(std::move(out[b]));
      warnings.insert(warn[b].begin(), warn[b].end());
    }
  }
}

/// plan_layouts for one pipeline of req.devices devices (req.replicas ignored).
PlanResult plan_one_pipeline(const RunRecord& run, const PlanRequest& req) {
  if (req.devices < 1) throw UserError("--devices must be >= 1, got " + std::to_string(req.devices));
  if (req.groups_per_stage < 1) throw UserError("plan: groups per stage must be >= 1");
  PlanResult res;
  res.devices = req.devices;
  const RunRecord rec1 = plan_record(run, req.devices, 1);
  SearchSpace sp;
  sp.U = static_cast<int>(rec1.profile.unit_name.size());
  sp.N = req.devices;
  sp.m = machine_size(run);
  sp.widths = stage_widths(rec1);
  sp.objective = parse_objective(run.workload.objective.empty() ? "workload" : run.workload.objective);
  if (static_cast<long long>(sp.N) > static_cast<long long>(sp.U) * sp.widths.back())
    throw UserError("--devices " + std::to_string(sp.N) + ": one pipeline uses at most " +
                    std::to_string(sp.U * sp.widths.back()) + " devices (" + std::to_string(sp.U) +
                    " units, each stage at most " + std::to_string(sp.widths.back()) + " device" +
                    (sp.widths.back() == 1 ? "" : "s") + " wide: the widest width profiled); `plan --replicas auto` "
                    "lays out replicas of fewer devices");
  std::vector<Slot> slots = initial_slots(rec1, sp, req, res);
  const bool every = res.mode == "every layout";
  int max_groups = 0;
  for (const Slot& s : slots) max_groups = std::max(max_groups, req.groups_per_stage * s.stages);
  if (req.groups > 0) max_groups = req.groups;
  // Every (layout, M) with its split at M (memory) and its bounds; the records stay alive for
  // their predictors (index M - 1; null for an M not searched).
  std::vector<std::unique_ptr<RunRecord>> recs;
  std::vector<std::unique_ptr<Predictor>> preds;
  std::vector<Job> jobs;
  for (int M = 1; M <= max_groups; ++M) {
    if (req.groups > 0 && M != req.groups) {
      recs.push_back(nullptr);
      preds.push_back(nullptr);
      continue;
    }
    recs.push_back(std::make_unique<RunRecord>(M == 1 ? rec1 : plan_record(run, req.devices, M)));
    preds.push_back(std::make_unique<Predictor>(*recs.back()));
    if (req.beside > 1) preds.back()->set_devices_per_machine(sp.m);  // the replicas' devices, as plan_record places them
    std::optional<std::vector<std::vector<int>>> dp_widths;
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& slot = slots[i];
      const int m_max = req.groups > 0 ? req.groups : std::max(1, req.groups_per_stage * slot.stages);
      if (!slot.alive || M > m_max) continue;
      refresh_slot(slot, *recs.back(), sp, every, dp_widths, res);
      if (!slot.alive) {
        res.infeasible += static_cast<size_t>(m_max - M + 1);
        continue;
      }
      Job job{i, M, slot.widths, *slot.split};
      const PlanBounds b = plan_bounds(*preds.back(), *recs.back(), job.split);
      job.tps_ub = b.tokens_per_s_max;
      job.ttft_lb = b.ttft_min_ms;
      job.tpot_lb = b.tpot_min_ms;
      jobs.push_back(std::move(job));
    }
  }
  // The likeliest dominators first: the highest tokens/s bound.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.tps_ub > b.tps_ub; });
  std::set<std::string> warnings;
  simulate_jobs(jobs, recs, preds, req, res, warnings);
  if (jobs.empty())
    throw UserError("no layout of " + std::to_string(req.devices) +
                    " devices holds the model's weights and one group's KV cache within the memory limit of the file's "
                    "rank 0 (/ranks/memory_limit_bytes less stage_scratch_bytes)");
  res.warnings.assign(warnings.begin(), warnings.end());
  res.front = pareto_front(res.candidates);
  res.replica_counts = {1};
  return res;
}

/// The most devices one pipeline of `run`'s units can use when laid out on `devices` devices:
/// a stage per unit, each as wide as the widest width profiled there (plan_one_pipeline's limit).
/// plan_record keeps the widths <= min(devices, machine size): a record of that many devices has
/// the same widths as one of `devices`, without a copy of rank 0's rows per device.
long long most_devices_per_pipeline(const RunRecord& run, int devices) {
  const RunRecord rec1 = plan_record(run, std::min(devices, machine_size(run)), 1);
  return static_cast<long long>(rec1.profile.unit_name.size()) * stage_widths(rec1).back();
}

}  // namespace

int parse_replicas(const std::string& text, int devices, const std::string& devices_flag) {
  if (text == "auto") return 0;
  int r = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), r);
  if (ec != std::errc() || end != text.data() + text.size() || r < 1)
    throw UserError("--replicas '" + text + "': give auto (every R dividing " + devices_flag + ") or a count R >= 1");
  if (devices % r != 0)
    throw UserError("--replicas " + text + " does not divide " + devices_flag + " " + std::to_string(devices) +
                    ": every replica is the same pipeline of N / R devices");
  return r;
}

int replicas_for(int devices, int replicas) { return replicas > 1 && devices % replicas != 0 ? 0 : replicas; }

std::string replica_counts_text(const PlanResult& r) {
  std::string s;
  for (int R : r.replica_counts) {  // (appends: GCC 12 warns -Wrestrict on "," + to_string)
    if (!s.empty()) s += ',';
    s += std::to_string(R);
  }
  return s;
}

PlanResult plan_layouts(const RunRecord& run, const PlanRequest& req) {
  if (req.replicas == 1) return plan_one_pipeline(run, req);
  if (req.devices < 1) throw UserError("--devices must be >= 1, got " + std::to_string(req.devices));
  if (req.replicas < 0) throw UserError("--replicas must be auto or R >= 1, got " + std::to_string(req.replicas));
  if (req.replicas > 1 && req.devices % req.replicas != 0)
    throw UserError("--replicas " + std::to_string(req.replicas) + " does not divide --devices " +
                    std::to_string(req.devices) + ": every replica is the same pipeline of N / R devices");
  std::vector<int> counts;
  long long most = 0;
  for (int R = 1; R <= req.devices; ++R) {
    if (req.devices % R != 0 || (req.replicas != 0 && R != req.replicas)) continue;
    most = most_devices_per_pipeline(run, req.devices / R);
    if (req.devices / R <= most) counts.push_back(R);
  }
  if (counts.empty())
    throw UserError("--devices " + std::to_string(req.devices) + " --replicas " +
                    (req.replicas == 0 ? std::string("auto") : std::to_string(req.replicas)) +
                    ": a replica of " + std::to_string(req.devices / std::max(1, req.replicas)) +
                    " devices is more than the model can use (at most " + std::to_string(most) + " per pipeline)");
  PlanResult res;
  res.devices = req.devices;
  std::set<std::string> warnings, modes;
  std::string last_error;
  bool any = false;
  for (int R : counts) {
    PlanRequest one = req;
    one.devices = req.devices / R;
    one.replicas = 1;
    one.beside = R;
    PlanResult r;
    try {
      r = plan_one_pipeline(run, one);
    } catch (const UserError& e) {
      last_error = e.what();  // no layout of N / R devices fits memory: fewer replicas may
      continue;
    }
    any = true;
    res.replica_counts.push_back(R);
    modes.insert(r.mode);
    const size_t most_size = std::numeric_limits<size_t>::max();  // layouts_possible saturates
    res.layouts_possible = res.layouts_possible > most_size - r.layouts_possible ? most_size : res.layouts_possible + r.layouts_possible;
    res.layouts_evaluated += r.layouts_evaluated;
    res.infeasible += r.infeasible;
    res.pruned += r.pruned;
    warnings.insert(r.warnings.begin(), r.warnings.end());
    for (PlanCandidate& c : r.candidates) {
      c.replicas = R;
      c.tokens_per_s *= R;
      c.decode_tokens_per_s *= R;
      c.bottleneck_bound_tok_s *= R;
      c.tokens_per_s_per_device = c.tokens_per_s / req.devices;
      c.label = plan_label(c.widths, c.groups, R);
      res.candidates.push_back(std::move(c));
    }
  }
  if (!any) throw UserError(last_error);
  for (const std::string& m : modes) res.mode += (res.mode.empty() ? "" : " / ") + m;
  res.warnings.assign(warnings.begin(), warnings.end());
  res.front = pareto_front(res.candidates);
  return res;
}

LayoutRanking rank_layouts_by_tokens(const RunRecord& run, int devices) {
  PlanRequest req;
  req.devices = devices;
  req.groups = std::max(1, run.workload.microbatches);
  req.max_layouts = std::numeric_limits<std::size_t>::max();
  req.prune = false;
  const PlanResult res = plan_layouts(run, req);
  const std::vector<PlanCandidate>& c = res.candidates;
  auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)); };
  size_t best = 0, low = 0;
  for (size_t i = 1; i < c.size(); ++i) {
    const PlanCandidate &x = c[i], &b = c[best], &l = c[low];
    if (!near(x.tokens_per_s, b.tokens_per_s) ? x.tokens_per_s > b.tokens_per_s
        : x.widths.size() != b.widths.size() ? x.widths.size() < b.widths.size()
                                             : x.split.bottleneck_ms < b.split.bottleneck_ms)
      best = i;
    if (!near(x.split.bottleneck_ms, l.split.bottleneck_ms) ? x.split.bottleneck_ms < l.split.bottleneck_ms
                                                             : x.tokens_per_s > l.tokens_per_s)
      low = i;
  }
  return {c[best], c[low], c.size()};
}

std::vector<size_t> pareto_front(const std::vector<PlanCandidate>& c) {
  std::vector<size_t> order(c.size());
  for (size_t i = 0; i < c.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (c[a].tokens_per_s_per_user != c[b].tokens_per_s_per_user) return c[a].tokens_per_s_per_user > c[b].tokens_per_s_per_user;
    return c[a].tokens_per_s_per_device > c[b].tokens_per_s_per_device;
  });
  // Sweep by tokens/s per user descending: a point survives when it has the most tokens/s per
  // device of its tokens/s-per-user level and more than every point of a higher level.
  std::vector<size_t> front;
  double best_above = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    const double level = c[order[i]].tokens_per_s_per_user, top = c[order[i]].tokens_per_s_per_device;
    for (; j < order.size() && c[order[j]].tokens_per_s_per_user == level; ++j)
      if (c[order[j]].tokens_per_s_per_device == top && top > best_above) front.push_back(order[j]);
    best_above = std::max(best_above, top);
    i = j;
  }
  return front;
}

SloChoice best_under_slo(const std::vector<PlanCandidate>& c, double slo_ttft_ms, double slo_tpot_ms) {
  SloChoice out;
  if (c.empty()) return out;
  double best_relax = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < c.size(); ++i) {
    double relax = 0.0;
    if (slo_ttft_ms > 0) relax = std::max(relax, c[i].ttft_p50_ms / slo_ttft_ms);
    if (slo_tpot_ms > 0) relax = std::max(relax, c[i].tpot_p50_ms / slo_tpot_ms);
    if (relax <= 1.0 && (!out.best || c[i].tokens_per_s > c[*out.best].tokens_per_s)) out.best = i;
    if (relax < best_relax || (relax == best_relax && c[i].tokens_per_s > c[out.closest].tokens_per_s)) {
      best_relax = relax;
      out.closest = i;
    }
  }
  out.relax = best_relax;
  return out;
}

}  // namespace ppb::balance
