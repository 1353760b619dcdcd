// The general exact balancer: problem validation, stage times, the O(U^2 S) DP, the choice of
// algorithm and the "no feasible split" diagnosis. The fast solver is in fast_solver.cpp, the
// device-order search in order.cpp.
#include "balance/solver.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "balance/solver_detail.h"
#include "common/error.h"

namespace ppb::balance {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
constexpr double kMaxCostMs = 1e12;                   ///< per unit and per transfer (31 years)
constexpr int64_t kMaxTotalBytes = int64_t{1} << 62;  ///< weights + KV cache of all units

std::string unit_label(const BalanceProblem& p, int u) {
  if (u >= 0 && u < static_cast<int>(p.unit_names.size())) return "unit " + std::to_string(u) + " (" + p.unit_names[u] + ")";
  return "unit " + std::to_string(u);
}

std::string bytes_text(int64_t b) {
  std::ostringstream os;
  os.precision(4);
  os << static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0) << " GiB (" << b << " bytes)";
  return os.str();
}

int64_t unit_mem(const BalanceProblem& p, int u) {
  return (p.weight_bytes.empty() ? 0 : p.weight_bytes[u]) + (p.kv_bytes.empty() ? 0 : p.kv_bytes[u]);
}

int64_t device_cap(const BalanceProblem& p, int d) {
  if (p.device_memory_bytes.empty() || p.device_memory_bytes[d] <= 0) return kUnlimited;
  return p.device_memory_bytes[d];
}

std::string g_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

/// Transfer time (ms) of `bytes` sent as `messages` messages over `link` = {bandwidth GB/s,
/// latency us} as pair_link returns it: messages x latency + bytes / bandwidth (bandwidth <= 0:
/// latency only). The balancer's transfer formula (its units: GB/s and us; the simulators'
/// one-message form is common/transfer.h link_transfer_ms).
double transfer_ms(double messages, const std::pair<double, double>& link, double bytes) {
  const auto [bandwidth, latency_us] = link;
  const double latency_ms = messages * latency_us * 1e-3;
  // bytes / (GB/s * 1e9 bytes/GB) seconds = bytes / (GB/s * 1e6) ms.
  const double wire = bandwidth > 0 ? bytes / (bandwidth * 1e6) : 0.0;
  return latency_ms + wire;
}

/// Transfer time (ms) of unit boundary b (between units b and b+1) over `link`: transfer_ms of
/// its activation bytes and the problem's messages per boundary. The one formula of
/// boundary_transfer_ms, uniform_transfers and evaluate, so that all of them (and the solvers'
/// rows, built by boundary_transfer_ms) give bit-identical times.
double boundary_ms(const BalanceProblem& p, const std::pair<double, double>& link, int b) {
  return transfer_ms(p.messages_per_boundary, link, p.activation_bytes.empty() ? 0.0 : p.activation_bytes[b]);
}

/// A link's identity for sharing transfer rows: its bits, so that links differing in any bit
/// (even 0.0 and -0.0) keep rows of their own and sharing never changes a transfer time.
std::pair<uint64_t, uint64_t> link_key(const std::pair<double, double>& link) {
  return {std::bit_cast<uint64_t>(link.first), std::bit_cast<uint64_t>(link.second)};
}

}  // namespace

void validate_problem(const BalanceProblem& p) {
  if (p.cost.empty() || p.cost[0].empty())
    throw UserError("latency_ms: empty cost table; need >= 1 device row of >= 1 unit");
  const std::size_t U = p.cost[0].size();
  for (std::size_t r = 0; r < p.cost.size(); ++r) {
    if (p.cost[r].size() != U)
      throw UserError("latency_ms: row " + std::to_string(r) + " has " + std::to_string(p.cost[r].size()) +
                      " units but row 0 has " + std::to_string(U));
    for (std::size_t u = 0; u < U; ++u)
      if (!std::isfinite(p.cost[r][u]) || p.cost[r][u] < 0.0 || p.cost[r][u] > kMaxCostMs)
        throw UserError("latency_ms[" + std::to_string(r) + "][" + std::to_string(u) + "] is " +
                        g_text(p.cost[r][u]) + " ms; costs must be finite, >= 0 and <= " + g_text(kMaxCostMs) +
                        " ms (so that sums over units stay finite)");
  }
  if (!p.stage_fixed_ms.empty() && p.stage_fixed_ms.size() != p.cost.size())
    throw UserError("stage_fixed_ms has " + std::to_string(p.stage_fixed_ms.size()) +
                    " entries; need one per cost row (" + std::to_string(p.cost.size()) + ") or none");
  for (std::size_t r = 0; r < p.stage_fixed_ms.size(); ++r) {
    const double least = *std::min_element(p.cost[r].begin(), p.cost[r].end());
    if (!std::isfinite(p.stage_fixed_ms[r]) || p.stage_fixed_ms[r] < -least || p.stage_fixed_ms[r] > kMaxCostMs)
      throw UserError("stage_fixed_ms[" + std::to_string(r) + "] is " + g_text(p.stage_fixed_ms[r]) +
                      " ms; must be finite, <= " + g_text(kMaxCostMs) + " ms and >= -" + g_text(least) +
                      " ms (minus the row's cheapest unit: a one-unit stage costs >= 0)");
  }
  for (std::size_t d = 0; d < p.device_row.size(); ++d)
    if (p.device_row[d] < 0 || p.device_row[d] >= static_cast<int>(p.cost.size()))
      throw UserError("device_row[" + std::to_string(d) + "] = " + std::to_string(p.device_row[d]) +
                      " is not a row of the " + std::to_string(p.cost.size()) + "-row cost table");
  auto check_bytes = [&](const std::vector<int64_t>& v, const char* name) {
    if (!v.empty() && v.size() != U)
      throw UserError(std::string(name) + " has " + std::to_string(v.size()) + " entries; need one per unit (" +
                      std::to_string(U) + ")");
    for (std::size_t u = 0; u < v.size(); ++u)
      if (v[u] < 0) throw UserError(std::string(name) + "[" + std::to_string(u) + "] is negative");
  };
  check_bytes(p.weight_bytes, "weight_bytes");
  check_bytes(p.kv_bytes, "kv_bytes");
  // Every per-stage sum of bytes must fit int64 (summed in double: exact enough for the check).
  double total_bytes = 0;
  for (std::size_t u = 0; u < p.weight_bytes.size(); ++u) total_bytes += static_cast<double>(p.weight_bytes[u]);
  for (std::size_t u = 0; u < p.kv_bytes.size(); ++u) total_bytes += static_cast<double>(p.kv_bytes[u]);
  if (total_bytes > static_cast<double>(kMaxTotalBytes))
    throw UserError("weight_bytes + kv_bytes total " + g_text(total_bytes) +
                    " bytes over all units; must be <= 2^62 (sums of bytes are int64)");
  if (!p.device_memory_bytes.empty() && static_cast<int>(p.device_memory_bytes.size()) != p.devices())
    throw UserError("device_memory_bytes has " + std::to_string(p.device_memory_bytes.size()) +
                    " entries; need one per device (" + std::to_string(p.devices()) + ")");
  if (!p.activation_bytes.empty() && p.activation_bytes.size() + 1 != U && p.activation_bytes.size() != U)
    throw UserError("activation_bytes has " + std::to_string(p.activation_bytes.size()) +
                    " entries; need one per unit boundary (" + std::to_string(U - 1) + ") or per unit (" +
                    std::to_string(U) + ", the last ignored)");
  for (std::size_t b = 0; b < p.activation_bytes.size(); ++b)
    if (!std::isfinite(p.activation_bytes[b]) || p.activation_bytes[b] < 0)
      throw UserError("activation_bytes[" + std::to_string(b) + "] must be finite and >= 0");
  if (!std::isfinite(p.link_bandwidth_GBps)) throw UserError("link_bandwidth_GBps must be finite (<= 0 = infinite)");
  if (!std::isfinite(p.link_latency_us) || p.link_latency_us < 0 || p.link_latency_us > kMaxCostMs)
    throw UserError("link_latency_us is " + g_text(p.link_latency_us) + "; must be finite, >= 0 and <= " +
                    g_text(kMaxCostMs) + " microseconds");
  if (!std::isfinite(p.messages_per_boundary) || p.messages_per_boundary < 0)
    throw UserError("messages_per_boundary must be finite and >= 0");
  if (!p.unit_names.empty() && p.unit_names.size() != U)
    throw UserError("units has " + std::to_string(p.unit_names.size()) + " names but latency_ms has " +
                    std::to_string(U) + " units per row");
  const std::size_t D = static_cast<std::size_t>(p.devices());
  for (const auto* m : {&p.pair_bandwidth_GBps, &p.pair_latency_us}) {
    const char* name = m == &p.pair_bandwidth_GBps ? "pair_bandwidth_GBps" : "pair_latency_us";
    if (!m->empty() && m->size() != D * D)
      throw UserError(std::string(name) + " has " + std::to_string(m->size()) + " entries; need devices x devices (" +
                      std::to_string(D * D) + ")");
    for (std::size_t i = 0; i < m->size(); ++i)
      if (std::isinf((*m)[i]) || (m == &p.pair_latency_us && (*m)[i] < 0))
        throw UserError(std::string(name) + "[" + std::to_string(i / D) + "][" + std::to_string(i % D) + "] is " +
                        g_text((*m)[i]) + "; must be finite (NaN = the default link)" +
                        (m == &p.pair_latency_us ? " and >= 0" : ""));
  }
  // Transfer times must stay finite too (a tiny bandwidth or huge latency would make them inf):
  // the largest boundary over the default link and over every pair's (O(U + D^2): prepare()
  // validates once per device order of an --order auto search).
  double max_bytes = 0.0;
  for (double b : p.activation_bytes) max_bytes = std::max(max_bytes, b);
  const bool pairs = !p.pair_bandwidth_GBps.empty() || !p.pair_latency_us.empty();
  for (int from = -1; from < (pairs ? static_cast<int>(D) : 0); ++from)
    for (int to = from < 0 ? -1 : 0; to < (from < 0 ? 0 : static_cast<int>(D)); ++to) {
      const double worst = transfer_ms(p.messages_per_boundary, pair_link(p, from, to), max_bytes);
      if (!(worst <= kMaxCostMs))
        throw UserError("the transfer time of the largest boundary" +
                        (from >= 0 ? " over the link " + std::to_string(from) + " -> " + std::to_string(to) : std::string()) +
                        " is " + g_text(worst) +
                        " ms (activation_bytes / link bandwidth + messages x link latency); must be <= " +
                        g_text(kMaxCostMs) + " ms: raise the bandwidth or lower activation_bytes/the latency");
    }
}

std::pair<double, double> pair_link(const BalanceProblem& p, int from, int to) {
  double bandwidth = p.link_bandwidth_GBps, latency_us = p.link_latency_us;
  if (from >= 0 && to >= 0) {
    const std::size_t i = static_cast<std::size_t>(from) * p.devices() + to;
    if (i < p.pair_bandwidth_GBps.size() && !std::isnan(p.pair_bandwidth_GBps[i])) bandwidth = p.pair_bandwidth_GBps[i];
    if (i < p.pair_latency_us.size() && !std::isnan(p.pair_latency_us[i])) latency_us = p.pair_latency_us[i];
  }
  return {bandwidth, latency_us};
}

std::vector<double> boundary_transfer_ms(const BalanceProblem& p, int from, int to) {
  const int U = p.units();
  std::vector<double> t(U > 0 ? U - 1 : 0);
  const auto link = pair_link(p, from, to);
  for (int b = 0; b + 1 < U; ++b) t[b] = boundary_ms(p, link, b);
  return t;
}

bool uniform_transfers(const BalanceProblem& p) {
  const int U = p.units();
  if (U < 2) return true;  // no unit boundary
  const auto base = pair_link(p, -1, -1);
  const double t0 = boundary_ms(p, base, 0);
  auto same = [&](const std::pair<double, double>& link) {
    for (int b = 0; b + 1 < U; ++b)
      if (!(boundary_ms(p, link, b) == t0)) return false;
    return true;
  };
  if (!same(base)) return false;
  if (p.pair_bandwidth_GBps.empty() && p.pair_latency_us.empty()) return true;
  // Each distinct link once: the D^2 pairs share a few links (inside a node, between nodes),
  // and a row per pair was O(D^2 U) work.
  std::set<std::pair<uint64_t, uint64_t>> checked{link_key(base)};
  for (int d = 0; d < p.devices(); ++d)
    for (int e = 0; e < p.devices(); ++e) {
      if (d == e) continue;
      const auto link = pair_link(p, d, e);
      if (checked.insert(link_key(link)).second && !same(link)) return false;
    }
  return true;
}

std::vector<int> rank_order(const BalanceProblem& problem, int stages) {
  const int U = problem.units();
  if (stages < 1 || stages > U)
    throw UserError("--stages " + std::to_string(stages) + " is invalid for " + std::to_string(U) +
                    " units: need 1 <= stages <= " + std::to_string(U) + " (every stage needs >= 1 unit)");
  if (stages > problem.devices())
    throw UserError("--stages " + std::to_string(stages) + " needs " + std::to_string(stages) +
                    " devices but the profile has " + std::to_string(problem.devices()) +
                    " (one device per stage; give one latency row to mean identical devices)");
  std::vector<int> order(stages);
  for (int k = 0; k < stages; ++k) order[k] = k;
  return order;
}

namespace detail {

Prepared prepare(const BalanceProblem& problem, const std::vector<int>& order) {
  validate_problem(problem);
  Prepared pp;
  pp.U = problem.units();
  pp.S = static_cast<int>(order.size());
  pp.overlap = problem.overlap;
  pp.order = order;
  if (pp.S < 1 || pp.S > pp.U)
    throw UserError(std::to_string(pp.S) + " stages are invalid for " + std::to_string(pp.U) +
                    " units: need 1 <= stages <= units (every stage needs >= 1 unit)");
  const int D = problem.devices();
  std::vector<int> row_slot(problem.cost.size(), -1);
  for (int k = 0; k < pp.S; ++k) {
    const int d = order[k];
    if (d < 0 || d >= D)
      throw UserError("device order: stage " + std::to_string(k) + " names device " + std::to_string(d) +
                      " but there are " + std::to_string(D) + " devices");
    for (int m = 0; m < k; ++m)
      if (order[m] == d)
        throw UserError("device order: device " + std::to_string(d) + " runs stages " + std::to_string(m) +
                        " and " + std::to_string(k));
    const int r = problem.row_of(d);
    if (row_slot[r] < 0) row_slot[r] = 0;  // mark; slots numbered below in row order
  }
  int slots = 0;
  for (auto& s : row_slot)
    if (s >= 0) s = slots++;
  pp.prefix.assign(slots, std::vector<double>(pp.U + 1, 0.0));
  pp.fixed.assign(slots, 0.0);
  double scale = 0.0;
  for (std::size_t r = 0; r < problem.cost.size(); ++r) {
    if (row_slot[r] < 0) continue;
    auto& pre = pp.prefix[row_slot[r]];
    for (int u = 0; u < pp.U; ++u) pre[u + 1] = pre[u] + problem.cost[r][u];
    pp.fixed[row_slot[r]] = problem.fixed_of_row(static_cast<int>(r));
    scale = std::max(scale, pre[pp.U] + std::fabs(pp.fixed[row_slot[r]]));
  }
  for (int k = 0; k < pp.S; ++k) {
    pp.slot_of.push_back(row_slot[problem.row_of(order[k])]);
    pp.mem_cap.push_back(device_cap(problem, order[k]));
  }
  pp.mem_prefix.assign(pp.U + 1, 0);
  for (int u = 0; u < pp.U; ++u) pp.mem_prefix[u + 1] = pp.mem_prefix[u] + unit_mem(problem, u);
  // One transfer row per distinct link that a stage boundary crosses, shared by all of them:
  // O(U) per link, not per boundary (a problem with one link holds one row).
  std::map<std::pair<uint64_t, uint64_t>, int> link_slot;
  double max_xfer = 0.0;
  for (int k = 0; k + 1 < pp.S; ++k) {
    const auto key = link_key(pair_link(problem, order[k], order[k + 1]));
    const auto [it, added] = link_slot.emplace(key, static_cast<int>(pp.xfer_rows.size()));
    if (added) {
      pp.xfer_rows.push_back(boundary_transfer_ms(problem, order[k], order[k + 1]));
      for (double x : pp.xfer_rows.back()) max_xfer = std::max(max_xfer, x);
    }
    pp.xfer_slot_of.push_back(it->second);
  }
  // Prefix-sum rounding is ~1e-16 relative; 1e-12 of the largest possible stage time keeps
  // splits tied with B* in exact arithmetic inside the spread pass (as in partition.cpp).
  pp.eps = 1e-12 * (scale + 2.0 * max_xfer);
  return pp;
}

Partition make_partition(const BalanceProblem& problem, const Prepared& pp, const std::vector<int>& starts,
                         const std::string& algorithm) {
  Partition p;
  p.solver = "balanced";
  p.algorithm = algorithm;
  for (int k = 0; k < pp.S; ++k) {
    p.first_unit.push_back(starts[k]);
    p.last_unit.push_back((k + 1 < pp.S ? starts[k + 1] : pp.U) - 1);
    p.device_rank.push_back(pp.order[k]);
  }
  evaluate(problem, p);
  return p;
}

void throw_infeasible(const BalanceProblem& problem, const std::vector<int>& order) {
  std::string why = diagnose_infeasible(problem, order);
  if (why.empty()) why = "no split satisfies the memory limits";
  throw UserError("no feasible split: " + why);
}

}  // namespace detail

void evaluate(const BalanceProblem& problem, Partition& p) {
  const int U = problem.units();
  check_partition(p, U);
  const int S = p.num_stages();
  for (int k = 0; k < S; ++k)
    if (p.device_rank[k] >= problem.devices())
      throw InternalError("evaluate: stage " + std::to_string(k) + " runs on device " + std::to_string(p.device_rank[k]) +
                          " of " + std::to_string(problem.devices()));
  p.predicted_stage_ms.assign(S, 0.0);
  // The same prefix-sum differences as the solvers, so that predictions equal their optimum;
  // one prefix array per row in use (O(U) per distinct row, not per stage).
  std::vector<std::vector<double>> prefix(problem.cost.size());
  for (int k = 0; k < S; ++k) {
    const int d = p.device_rank[k];
    auto& pre = prefix[problem.row_of(d)];
    if (pre.empty()) {
      const auto& row = problem.cost[problem.row_of(d)];
      pre.assign(U + 1, 0.0);
      for (int u = 0; u < U; ++u) pre[u + 1] = pre[u] + row[u];
    }
    const double pre_a = pre[p.first_unit[k]], pre_b = pre[p.last_unit[k] + 1];
    const double fixed = problem.fixed_of_row(problem.row_of(d));
    // Only the two boundaries the stage touches, each over its own link: O(1) per stage
    // instead of a [U-1] row per stage boundary (issue 34); the same formula as the solvers'.
    const double t_in = k > 0 ? boundary_ms(problem, pair_link(problem, p.device_rank[k - 1], d), p.first_unit[k] - 1) : 0.0;
    const double t_out = k < S - 1 ? boundary_ms(problem, pair_link(problem, d, p.device_rank[k + 1]), p.last_unit[k]) : 0.0;
    p.predicted_stage_ms[k] = stage_time((pre_b - pre_a) + fixed, t_in, t_out, problem.overlap);
  }
  const auto [lo, hi] = std::minmax_element(p.predicted_stage_ms.begin(), p.predicted_stage_ms.end());
  p.bottleneck_ms = *hi;
  p.spread_ms = *hi - *lo;
}

std::vector<double> stage_transfer_ms(const BalanceProblem& problem, const Partition& p) {
  BalanceProblem links_only = problem;
  for (auto& row : links_only.cost) std::fill(row.begin(), row.end(), 0.0);
  links_only.stage_fixed_ms.clear();
  Partition q = p;
  evaluate(links_only, q);
  return q.predicted_stage_ms;
}

std::vector<int64_t> stage_memory_bytes(const BalanceProblem& problem, const Partition& p) {
  std::vector<int64_t> m;
  for (int k = 0; k < p.num_stages(); ++k) {
    int64_t b = 0;
    for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) b += unit_mem(problem, u);
    m.push_back(b);
  }
  return m;
}

std::string diagnose_infeasible(const BalanceProblem& problem, const std::vector<int>& order) {
  const int U = problem.units(), S = static_cast<int>(order.size());
  // 1. A unit larger than every device of the pipeline.
  int64_t largest_cap = 0;
  int largest_dev = order[0];
  for (int d : order)
    if (device_cap(problem, d) > largest_cap) {
      largest_cap = device_cap(problem, d);
      largest_dev = d;
    }
  for (int u = 0; u < U; ++u)
    if (unit_mem(problem, u) > largest_cap) {
      std::ostringstream os;
      os << unit_label(problem, u) << " alone needs " << bytes_text(unit_mem(problem, u)) << " (weights "
         << (problem.weight_bytes.empty() ? 0 : problem.weight_bytes[u]) << " + KV cache "
         << (problem.kv_bytes.empty() ? 0 : problem.kv_bytes[u]) << " bytes) but the largest device memory is "
         << bytes_text(largest_cap) << " (device " << largest_dev
         << "); reduce the batch, micro-batches or context (KV cache), or use devices with more memory";
      return os.str();
    }
  // 2. The total.
  int64_t total = 0, total_cap = 0;
  for (int u = 0; u < U; ++u) total += unit_mem(problem, u);
  bool unlimited = false;
  for (int d : order) {
    if (device_cap(problem, d) == kUnlimited) unlimited = true;
    else total_cap += device_cap(problem, d);
  }
  if (!unlimited && total > total_cap) {
    std::ostringstream os;
    os << "the model needs " << bytes_text(total) << " (weights + KV cache) but the " << S
       << " devices hold " << bytes_text(total_cap) << " together; use more stages/devices or a smaller "
       << "batch, micro-batch count or context";
    return os.str();
  }
  // 3. Contiguity and order: fill every stage in order as far as its memory allows.
  int pos = 0;
  for (int k = 0; k < S && pos < U; ++k) {
    const int64_t cap = device_cap(problem, order[k]);
    int64_t used = 0;
    const int start = pos;
    const int max_end = U - (S - 1 - k);  // leave one unit for each later stage
    while (pos < max_end && (cap == kUnlimited || used + unit_mem(problem, pos) <= cap)) used += unit_mem(problem, pos++);
    if (pos == start) {
      std::ostringstream os;
      os << "with this device order, stage " << k << " (device " << order[k] << ", " << bytes_text(cap)
         << ") cannot hold " << unit_label(problem, pos) << " (" << bytes_text(unit_mem(problem, pos))
         << ") even when every earlier stage is filled to its memory; try --order auto, more stages, or a smaller "
            "KV cache";
      return os.str();
    }
  }
  if (pos < U) {
    std::ostringstream os;
    os << "filling every stage to its device memory in this order covers only units 0.." << pos - 1 << " of " << U
       << " (the last units, from " << unit_label(problem, pos)
       << ", do not fit); try --order auto, more stages, or a smaller KV cache";
    return os.str();
  }
  return "";
}

Partition solve_dp(const BalanceProblem& problem, const std::vector<int>& order) {
  const detail::Prepared pp = detail::prepare(problem, order);
  const int S = pp.S, U = pp.U;
  // Pass 1: f[k][i] = minimal bottleneck of units [0, i) on stages 0..k-1.
  std::vector<std::vector<double>> f(S + 1, std::vector<double>(U + 1, kInf));
  f[0][0] = 0.0;
  for (int k = 1; k <= S; ++k)
    for (int i = k; i <= U - (S - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        if (f[k - 1][j] == kInf || !pp.mem_ok(k - 1, j, i)) continue;
        f[k][i] = std::min(f[k][i], std::max(f[k - 1][j], pp.time(k - 1, j, i)));
      }
  if (f[S][U] == kInf) detail::throw_infeasible(problem, order);
  const double limit = f[S][U] + pp.eps;

  // Pass 2: g[k][i] = largest minimum stage time with every stage <= limit; cut = argmax.
  std::vector<std::vector<double>> g(S + 1, std::vector<double>(U + 1, -kInf));
  std::vector<std::vector<int>> cut(S + 1, std::vector<int>(U + 1, -1));
  g[0][0] = kInf;
  for (int k = 1; k <= S; ++k)
    for (int i = k; i <= U - (S - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        if (g[k - 1][j] == -kInf || !pp.mem_ok(k - 1, j, i)) continue;
        const double t = pp.time(k - 1, j, i);
        if (t > limit) continue;
        const double v = std::min(g[k - 1][j], t);
        if (v > g[k][i]) {
          g[k][i] = v;
          cut[k][i] = j;
        }
      }
  if (cut[S][U] < 0) throw InternalError("solve_dp: no split within the optimal bottleneck");
  std::vector<int> starts(S);
  for (int k = S, i = U; k >= 1; --k) {
    starts[k - 1] = cut[k][i];
    i = cut[k][i];
  }
  return detail::make_partition(problem, pp, starts, "dp");
}

Partition solve(const BalanceProblem& problem, const std::vector<int>& order, SolverKind kind) {
  validate_problem(problem);
  if (kind == SolverKind::dp || (kind == SolverKind::automatic && !uniform_transfers(problem)))
    return solve_dp(problem, order);
  return solve_fast(problem, order);
}

}  // namespace ppb::balance
