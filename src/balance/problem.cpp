#include "balance/problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "common/dtype.h"
#include "common/error.h"
#include "common/stats.h"
#include "common/transfer.h"
#include "results/profile_step_fit.h"

namespace ppb::balance {

Objective parse_objective(const std::string& name) {
  if (name == "workload") return Objective::workload;
  if (name == "decode") return Objective::decode;
  if (name == "prefill") return Objective::prefill;
  throw UserError("--objective '" + name + "' is unknown; valid: workload, decode, prefill");
}

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::workload: return "workload";
    case Objective::decode: return "decode";
    case Objective::prefill: return "prefill";
  }
  return "workload";
}

double objective_cost(Objective o, double prefill_ms, double decode_ms, int gen_len) {
  switch (o) {
    case Objective::workload: return prefill_ms + gen_len * decode_ms;
    case Objective::decode: return decode_ms;
    case Objective::prefill: return prefill_ms;
  }
  return prefill_ms + gen_len * decode_ms;
}

int objective_tokens(Objective o, int prompt_len, int gen_len) {
  return o == Objective::workload ? prompt_len + gen_len : o == Objective::decode ? 1 : prompt_len;
}

int objective_messages(Objective o, int gen_len) { return o == Objective::workload ? gen_len + 1 : 1; }

DType workload_dtype(const WorkloadInfo& w) { return parse_dtype(w.dtype, "/config/workload dtype"); }

PairLinks node_pair_links(const RunRecord& run) {
  const size_t R = run.ranks.size();
  PairLinks out;
  if (R < 2 || run.link_latency_matrix_s.size() != R * R || run.link_bandwidth_matrix_Bps.size() != R * R) return out;
  std::vector<std::string> hosts;
  for (const RankInfo& k : run.ranks) hosts.push_back(k.hostname);
  if (std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts[0]; })) return out;
  // Measured pairs per unordered node pair.
  std::map<std::pair<std::string, std::string>, std::pair<std::vector<double>, std::vector<double>>> by_nodes;
  auto key = [&](size_t a, size_t b) { return std::minmax(hosts[a], hosts[b]); };
  for (size_t a = 0; a < R; ++a)
    for (size_t b = 0; b < R; ++b) {
      const double lat = run.link_latency_matrix_s[a * R + b], bw = run.link_bandwidth_matrix_Bps[a * R + b];
      if (a == b || !(lat >= 0) || !(bw > 0)) continue;
      auto& v = by_nodes[key(a, b)];
      v.first.push_back(lat);
      v.second.push_back(bw);
    }
  // A pair of nodes without a measured rank pair (beyond 8 ranks only neighbours are measured)
  // takes the slowest measured pair of nodes, not the default link (ranks 0 <-> 1, often
  // shared memory): an unmeasured network crossing must not look free to --order auto.
  double slow_lat = 0.0, slow_bw = std::numeric_limits<double>::infinity();
  for (const auto& [nodes, v] : by_nodes) {
    if (nodes.first == nodes.second) continue;
    slow_lat = std::max(slow_lat, median(v.first));
    slow_bw = std::min(slow_bw, median(v.second));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  out.latency_s.assign(R * R, nan);
  out.bandwidth_Bps.assign(R * R, nan);
  for (size_t a = 0; a < R; ++a)
    for (size_t b = 0; b < R; ++b) {
      if (a == b) continue;
      const auto it = by_nodes.find(key(a, b));
      if (it != by_nodes.end()) {
        out.latency_s[a * R + b] = median(it->second.first);
        out.bandwidth_Bps[a * R + b] = median(it->second.second);
      } else if (hosts[a] != hosts[b] && std::isfinite(slow_bw)) {
        out.latency_s[a * R + b] = slow_lat;
        out.bandwidth_Bps[a * R + b] = slow_bw;
      }
    }
  return out;
}

std::optional<std::pair<double, double>> PairLinks::measured(int from, int to, size_t ranks) const {
  if (from < 0 || to < 0 || static_cast<size_t>(from) >= ranks || static_cast<size_t>(to) >= ranks) return std::nullopt;
  const size_t pair = static_cast<size_t>(from) * ranks + static_cast<size_t>(to);
  if (pair >= latency_s.size() || pair >= bandwidth_Bps.size() || std::isnan(latency_s[pair])) return std::nullopt;
  return std::make_pair(latency_s[pair], bandwidth_Bps[pair]);
}

int handoff_copies(int from_width, int to_width) { return (to_width + from_width - 1) / from_width; }

void apply_stage_fixed(BalanceProblem& p, const std::vector<double>& fixed_per_row) {
  if (std::all_of(fixed_per_row.begin(), fixed_per_row.end(), [](double f) { return f == 0.0; })) return;
  if (fixed_per_row.size() != p.cost.size())
    throw InternalError("apply_stage_fixed: " + std::to_string(fixed_per_row.size()) + " fixed costs for " +
                        std::to_string(p.cost.size()) + " cost rows");
  p.stage_fixed_ms.assign(p.cost.size(), 0.0);
  for (size_t r = 0; r < p.cost.size(); ++r) {
    if (p.cost[r].empty()) continue;
    const double f = std::min(fixed_per_row[r], *std::min_element(p.cost[r].begin(), p.cost[r].end()));
    for (double& c : p.cost[r]) c = std::max(0.0, c - f);  // >= 0 already but for rounding
    p.stage_fixed_ms[r] = f;
  }
}

BalanceProblem problem_from_run(const RunRecord& run, Objective o) {
  const ProfileTable& t = run.profile;
  const WorkloadInfo& w = run.workload;
  const size_t U = t.unit_name.size();
  if (U == 0 || t.latency_ms.empty() || t.latency_ms.size() % (2 * U) != 0)
    throw UserError("the run has no profile of its " + std::to_string(U) + " units (/profile/latency_ms [R][U][2])");
  const size_t R = t.latency_ms.size() / (2 * U);
  BalanceProblem p;
  p.cost.assign(R, std::vector<double>(U));
  for (size_t r = 0; r < R; ++r)
    for (size_t u = 0; u < U; ++u)
      p.cost[r][u] = objective_cost(o, t.latency_ms[(r * U + u) * 2], t.latency_ms[(r * U + u) * 2 + 1], w.gen_len);
  if (t.fixed_unit >= 0) {
    std::vector<double> fixed(R);
    for (size_t r = 0; r < R; ++r)
      fixed[r] = objective_cost(o, applied_fixed_ms(t, static_cast<int>(r), 0), applied_fixed_ms(t, static_cast<int>(r), 1), w.gen_len);
    apply_stage_fixed(p, fixed);
  }
  p.unit_names = t.unit_name;
  p.weight_bytes = t.unit_weight_bytes;
  p.kv_bytes = t.unit_kv_bytes;
  // Each rank's limit net of the largest scratch any stage can need there (the limit's last
  // byte counts: 0 would mean unlimited), so that a split within these limits passes the
  // run's memory check of weights + KV cache + scratch.
  if (run.ranks.size() == R &&
      std::all_of(run.ranks.begin(), run.ranks.end(), [](const RankInfo& k) { return k.memory_limit_bytes > 0; }))
    for (const RankInfo& k : run.ranks)
      p.device_memory_bytes.push_back(std::max<int64_t>(1, k.memory_limit_bytes - k.stage_scratch_bytes));
  const auto hidden = run.model_attrs_num.find("hidden_size");
  if (hidden != run.model_attrs_num.end() && hidden->second > 0 && U > 1)
    p.activation_bytes.assign(U - 1, boundary_message_bytes(false, w.batch, objective_tokens(o, w.prompt_len, w.gen_len),
                                                            hidden->second, dtype_bytes(workload_dtype(w))));
  p.messages_per_boundary = objective_messages(o, w.gen_len);
  p.link_bandwidth_GBps = run.link_bandwidth_Bps / 1e9;
  p.link_latency_us = run.link_latency_s * 1e6;
  const PairLinks links = node_pair_links(run);
  if (!links.latency_s.empty() && links.latency_s.size() == R * R) {  // several nodes: a link per boundary
    for (size_t i = 0; i < R * R; ++i) {
      p.pair_latency_us.push_back(links.latency_s[i] * 1e6);
      p.pair_bandwidth_GBps.push_back(links.bandwidth_Bps[i] / 1e9);
    }
  }
  p.overlap = w.overlap;
  validate_problem(p);
  return p;
}

Method parse_method(const std::string& name) {
  if (name == "uniform") return Method::uniform;
  if (name == "seed") return Method::seed;
  if (name == "balanced") return Method::balanced;
  if (name == "manual") return Method::manual;
  throw UserError("partition method '" + name + "' is unknown; valid: uniform, seed, balanced, manual");
}

const char* method_name(Method m) {
  switch (m) {
    case Method::uniform: return "uniform";
    case Method::seed: return "seed";
    case Method::balanced: return "balanced";
    case Method::manual: return "manual";
  }
  return "balanced";
}

Partition make_split(const BalanceProblem& problem, const SplitRequest& r) {
  const int U = problem.units();
  Partition p;
  switch (r.method) {
    case Method::uniform:
      p = solve_uniform(U, r.stages, r.remainder);
      p.device_rank = rank_order(problem, r.stages);
      break;
    case Method::seed: {  // the article's DP on the one-unit timings, each with its fixed cost
      std::vector<double> row = problem.cost[problem.row_of(0)];
      for (double& c : row) c += problem.fixed_of_row(problem.row_of(0));
      p = solve_seed(row, r.stages);
      p.device_rank = rank_order(problem, r.stages);
      break;
    }
    case Method::balanced:
      p = solve_with_order(problem, r.stages, r.order, r.kind);
      break;
    case Method::manual:
      p = parse_manual(r.manual, U, r.stages);
      p.device_rank = rank_order(problem, r.stages);
      break;
  }
  p.solver = method_name(r.method);
  evaluate(problem, p);
  return p;
}

}  // namespace ppb::balance
