// Unit tests of src/balance/solver: the general exact DP and the fast solver against brute force
// on thousands of random small instances (heterogeneous rows, memory limits, transfer costs,
// both overlap modes), the fast solver against the DP on larger ones, the order search, and
// the "no feasible split" diagnosis; the prepared transfer rows (one per distinct link).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "balance/solver.h"
#include "balance/solver_detail.h"
#include "common/error.h"

namespace ppb::balance {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Optimum {
  bool feasible = false;
  double bottleneck = kInf;
  double spread = kInf;
};

/// Transfer time (ms) of unit boundary b from device d to device e, computed independently of
/// the solvers: the pair's link where the problem has one (NaN: the default link).
double brute_xfer(const BalanceProblem& p, int b, int d, int e) {
  double bw = p.link_bandwidth_GBps, lat = p.link_latency_us;
  const std::size_t i = static_cast<std::size_t>(d) * p.devices() + e;
  if (!p.pair_bandwidth_GBps.empty() && !std::isnan(p.pair_bandwidth_GBps[i])) bw = p.pair_bandwidth_GBps[i];
  if (!p.pair_latency_us.empty() && !std::isnan(p.pair_latency_us[i])) lat = p.pair_latency_us[i];
  const double bytes = p.activation_bytes.empty() ? 0.0 : p.activation_bytes[b];
  return p.messages_per_boundary * lat / 1000.0 + (bw > 0 ? bytes / bw / 1e6 : 0.0);
}

/// Stage time computed independently of the solvers (plain loops, no prefix sums).
double brute_stage_time(const BalanceProblem& p, const std::vector<int>& order, int k, int a, int b) {
  const int S = static_cast<int>(order.size()), device = order[k];
  double c = p.stage_fixed_ms.empty() ? 0.0 : p.stage_fixed_ms[p.row_of(device)];
  for (int u = a; u <= b; ++u) c += p.cost[p.row_of(device)][u];
  const double tin = k > 0 ? brute_xfer(p, a - 1, order[k - 1], device) : 0.0;
  const double tout = k < S - 1 ? brute_xfer(p, b, device, order[k + 1]) : 0.0;
  return p.overlap ? std::max({c, tin, tout}) : c + tin + tout;
}

bool brute_fits(const BalanceProblem& p, int a, int b, int device) {
  if (p.device_memory_bytes.empty() || p.device_memory_bytes[device] <= 0) return true;
  int64_t m = 0;
  for (int u = a; u <= b; ++u)
    m += (p.weight_bytes.empty() ? 0 : p.weight_bytes[u]) + (p.kv_bytes.empty() ? 0 : p.kv_bytes[u]);
  return m <= p.device_memory_bytes[device];
}

/// Every composition of U units into S non-empty stages on `order`.
Optimum brute_force(const BalanceProblem& p, const std::vector<int>& order) {
  const int U = p.units(), S = static_cast<int>(order.size());
  std::vector<std::pair<double, double>> all;
  std::vector<double> t(S);
  std::function<void(int, int)> rec = [&](int k, int start) {
    const int max_end = k == S - 1 ? U - 1 : U - 1 - (S - 1 - k);
    for (int end = (k == S - 1 ? U - 1 : start); end <= max_end; ++end) {
      if (!brute_fits(p, start, end, order[k])) continue;
      t[k] = brute_stage_time(p, order, k, start, end);
      if (k == S - 1) {
        const auto [lo, hi] = std::minmax_element(t.begin(), t.end());
        all.emplace_back(*hi, *lo);
      } else {
        rec(k + 1, end + 1);
      }
    }
  };
  rec(0, 0);
  Optimum o;
  if (all.empty()) return o;
  o.feasible = true;
  for (const auto& [hi, lo] : all) o.bottleneck = std::min(o.bottleneck, hi);
  const double tol = 1e-9 * std::max(1.0, o.bottleneck);
  for (const auto& [hi, lo] : all)
    if (hi <= o.bottleneck + tol) o.spread = std::min(o.spread, hi - lo);
  return o;
}

std::vector<double> random_row(std::mt19937& rng, int U, int kind) {
  std::vector<double> row(U);
  std::uniform_int_distribution<int> small(0, 4);
  std::uniform_int_distribution<int> wide(1, 100);
  std::uniform_real_distribution<double> real(0.01, 10.0);
  for (double& x : row) x = kind == 0 ? small(rng) : kind == 1 ? wide(rng) : kind == 2 ? real(rng) : 1.0;
  return row;
}

/// A random instance: D device rows (some shared), optional memory limits, transfers, overlap;
/// with `fixed`, in a third of them a stage's fixed cost per row, of either sign.
BalanceProblem random_problem(std::mt19937& rng, int U, int D, bool uniform_xfer, bool fixed = false) {
  BalanceProblem p;
  std::uniform_int_distribution<int> coin(0, 1), kinds(0, 3), bytes(0, 9);
  const int kind = kinds(rng);
  const int rows = std::uniform_int_distribution<int>(1, D)(rng);
  for (int r = 0; r < rows; ++r) p.cost.push_back(random_row(rng, U, kind == 3 ? r % 3 : kind));
  for (int d = 0; d < D; ++d) p.device_row.push_back(std::uniform_int_distribution<int>(0, rows - 1)(rng));
  if (coin(rng)) {
    for (int u = 0; u < U; ++u) {
      p.weight_bytes.push_back(bytes(rng));
      p.kv_bytes.push_back(bytes(rng) / 3);
    }
    for (int d = 0; d < D; ++d)
      p.device_memory_bytes.push_back(std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? 0 : 4 + bytes(rng) * 3);
  }
  if (coin(rng)) {
    p.link_bandwidth_GBps = 1e-3 * std::uniform_int_distribution<int>(1, 8)(rng);  // 1e3..8e3 bytes/ms
    p.link_latency_us = 1000.0 * bytes(rng) / 4;
    const double a = 1000.0 * bytes(rng);
    for (int b = 0; b + 1 < U; ++b) p.activation_bytes.push_back(uniform_xfer ? a : 1000.0 * bytes(rng) * 2);
  }
  p.overlap = coin(rng);
  if (fixed && std::uniform_int_distribution<int>(0, 2)(rng) == 0) {  // a forward's fixed cost per stage
    for (const auto& row : p.cost) {
      const double least = *std::min_element(row.begin(), row.end());
      p.stage_fixed_ms.push_back(coin(rng) ? -least * std::uniform_real_distribution<double>(0.0, 1.0)(rng)
                                           : std::uniform_real_distribution<double>(0.0, 5.0)(rng));
    }
  }
  return p;
}

void expect_optimal(const BalanceProblem& p, const std::vector<int>& order, const Partition& part, const Optimum& o,
                    const std::string& what) {
  ASSERT_NO_THROW(check_partition(part, p.units())) << what;
  ASSERT_EQ(part.device_rank, order) << what;
  const double tol = 1e-9 * std::max(1.0, o.bottleneck);
  EXPECT_NEAR(part.bottleneck_ms, o.bottleneck, tol) << what << " split " << part.counts_string();
  EXPECT_NEAR(part.spread_ms, o.spread, tol) << what << " split " << part.counts_string();
  const auto mem = stage_memory_bytes(p, part);
  for (int k = 0; k < part.num_stages(); ++k)
    if (!p.device_memory_bytes.empty() && p.device_memory_bytes[order[k]] > 0)
      EXPECT_LE(mem[k], p.device_memory_bytes[order[k]]) << what << " stage " << k;
}

TEST(BalanceSolver, DpAndFastMatchBruteForceOnRandomInstances) {
  std::mt19937 rng(4242);
  int optimal = 0, infeasible = 0, fast_checked = 0, with_fixed = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int U = std::uniform_int_distribution<int>(1, 10)(rng);
    const int S = std::uniform_int_distribution<int>(1, std::min(U, 5))(rng);
    const int D = S + std::uniform_int_distribution<int>(0, 1)(rng);
    const bool uniform_xfer = trial % 2 == 0;
    const BalanceProblem p = random_problem(rng, U, D, uniform_xfer, true);
    std::vector<int> order(S);
    std::iota(order.begin(), order.end(), 0);
    if (D > S) std::shuffle(order.begin(), order.end(), rng), order[0] = D - 1;  // a non-identity order
    const std::string what = "trial " + std::to_string(trial) + " U=" + std::to_string(U) + " S=" +
                             std::to_string(S) + (p.overlap ? " overlap" : " no-overlap");
    const Optimum o = brute_force(p, order);
    if (!o.feasible) {
      ++infeasible;
      EXPECT_THROW(solve_dp(p, order), UserError) << what;
      if (uniform_transfers(p)) EXPECT_THROW(solve_fast(p, order), UserError) << what;
      EXPECT_FALSE(diagnose_infeasible(p, order).empty()) << what;
      continue;
    }
    const Partition dp = solve_dp(p, order);
    EXPECT_EQ(dp.algorithm, "dp");
    expect_optimal(p, order, dp, o, what + " dp");
    ++optimal;
    with_fixed += !p.stage_fixed_ms.empty();
    if (uniform_transfers(p)) {
      const Partition fast = solve_fast(p, order);
      EXPECT_EQ(fast.algorithm, "fast");
      expect_optimal(p, order, fast, o, what + " fast");
      EXPECT_EQ(fast.bottleneck_ms, dp.bottleneck_ms) << what << " (bit-identical B*)";
      ++fast_checked;
    } else {
      EXPECT_THROW(solve_fast(p, order), UserError) << what;
    }
  }
  EXPECT_GE(optimal, 2500);
  EXPECT_GE(infeasible, 100);
  EXPECT_GE(fast_checked, 1500);
  EXPECT_GE(with_fixed, 600);  // a third of them pay a stage's fixed cost
}

/// Issue 16: a link per device pair (shared memory inside a node, the network between nodes).
/// Random pair links on random instances, some entries NaN (the default link): the DP against
/// brute force over every split; the fast solver refuses unequal links; the order search against
/// every permutation, with devices in two "nodes" whose links it must tell apart.
TEST(BalanceSolver, ALinkPerBoundaryMatchesBruteForce) {
  std::mt19937 rng(1616);
  int optimal = 0, order_checked = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    const int U = std::uniform_int_distribution<int>(2, 9)(rng);
    const int S = std::uniform_int_distribution<int>(2, std::min(U, 4))(rng);
    const int D = S;
    BalanceProblem p = random_problem(rng, U, D, trial % 2 == 0, true);
    if (p.activation_bytes.empty()) p.activation_bytes.assign(U - 1, 4000.0 * (1 + trial % 3));
    p.link_bandwidth_GBps = 1e-3 * (1 + trial % 4);
    // Two nodes: devices [0, D/2) and [D/2, D); a fast link inside, a slow one between, with
    // the odd random pair (or NaN: the default link) on a third of the trials.
    std::vector<int> node(D);
    for (int d = 0; d < D; ++d) node[d] = d < (D + 1) / 2 ? 0 : 1;
    const double inside = 1e-2, between = 2e-4;
    p.pair_bandwidth_GBps.assign(static_cast<std::size_t>(D) * D, 0.0);
    p.pair_latency_us.assign(static_cast<std::size_t>(D) * D, 0.0);
    for (int d = 0; d < D; ++d)
      for (int e = 0; e < D; ++e) {
        const std::size_t i = static_cast<std::size_t>(d) * D + e;
        p.pair_bandwidth_GBps[i] = node[d] == node[e] ? inside : between;
        p.pair_latency_us[i] = node[d] == node[e] ? 1.0 : 500.0;
        if (trial % 3 == 0 && std::uniform_int_distribution<int>(0, 3)(rng) == 0)
          p.pair_bandwidth_GBps[i] = std::uniform_int_distribution<int>(0, 1)(rng) ? std::nan("") : 5e-4;
      }
    std::vector<int> order(S);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const std::string what = "trial " + std::to_string(trial) + " U=" + std::to_string(U) + " S=" + std::to_string(S);
    const Optimum o = brute_force(p, order);
    if (!o.feasible) {
      EXPECT_THROW(solve_dp(p, order), UserError) << what;
      continue;
    }
    const Partition dp = solve_dp(p, order);
    expect_optimal(p, order, dp, o, what + " dp");
    ++optimal;
    // evaluate() gives the same stage times as the brute force's independent formula.
    for (int k = 0; k < S; ++k)
      EXPECT_NEAR(dp.predicted_stage_ms[k], brute_stage_time(p, order, k, dp.first_unit[k], dp.last_unit[k]),
                  1e-9 * std::max(1.0, o.bottleneck))
          << what << " stage " << k;
    // A stage's time decomposes into its compute and its transfers (stage_transfer_ms), with and
    // without overlap: how a run puts a modelled compute in the profile's place
    // (balance/contention.h).
    for (const bool overlap : {true, false}) {
      BalanceProblem q = p;
      q.overlap = overlap;
      Partition e = dp;
      evaluate(q, e);
      const std::vector<double> xfer = stage_transfer_ms(q, e);
      ASSERT_EQ(xfer.size(), static_cast<size_t>(S));
      for (int k = 0; k < S; ++k) {
        double compute = q.fixed_of_row(q.row_of(e.device_rank[k]));  // the stage's fixed cost and its units
        for (int u = e.first_unit[k]; u <= e.last_unit[k]; ++u) compute += q.cost[q.row_of(e.device_rank[k])][u];
        EXPECT_GE(xfer[k], 0.0);
        EXPECT_NEAR(with_transfers(compute, xfer[k], overlap), e.predicted_stage_ms[k],
                    1e-9 * std::max(1.0, e.predicted_stage_ms[k]))
            << what << " stage " << k << " overlap " << overlap;
      }
    }
    if (!uniform_transfers(p)) EXPECT_THROW(solve_fast(p, order), UserError) << what;
    // The order search: the best of every permutation.
    double best = kInf;
    std::vector<int> perm(D);
    std::iota(perm.begin(), perm.end(), 0);
    do {
      const Optimum op = brute_force(p, std::vector<int>(perm.begin(), perm.begin() + S));
      if (op.feasible) best = std::min(best, op.bottleneck);
    } while (std::next_permutation(perm.begin(), perm.end()));
    const Partition found = solve_with_order(p, S, OrderMode::automatic);
    EXPECT_NEAR(found.bottleneck_ms, best, 1e-9 * std::max(1.0, best)) << what;
    ++order_checked;
  }
  EXPECT_GE(optimal, 800);
  EXPECT_GE(order_checked, 800);
}

/// Issue 34: prepare() holds one transfer row per distinct link, not one per stage boundary.
/// One link on the size (100,000 units on 1,024 stages, 4 MiB per boundary at 10 GB/s
/// + 20 us): one row of U-1 that every boundary maps to, equal to boundary_transfer_ms and to
/// the independent formula; the solved split's stage times equal the brute-force stage times.
TEST(BalanceSolver, OneLinkPreparesOneTransferRow) {
  constexpr int U = 100000, S = 1024;
  std::mt19937 rng(34);
  BalanceProblem p;
  p.cost = {random_row(rng, U, 2)};
  p.device_row.assign(S, 0);
  p.activation_bytes.assign(U - 1, 4194304.0);
  p.link_bandwidth_GBps = 10.0;
  p.link_latency_us = 20.0;
  const std::vector<int> order = rank_order(p, S);
  const detail::Prepared pp = detail::prepare(p, order);
  ASSERT_EQ(pp.xfer_rows.size(), 1u);
  ASSERT_EQ(pp.xfer_rows[0].size(), static_cast<std::size_t>(U - 1));
  EXPECT_EQ(pp.xfer_slot_of, std::vector<int>(S - 1, 0));
  const std::vector<double> row = boundary_transfer_ms(p);
  EXPECT_EQ(pp.xfer_rows[0], row);
  EXPECT_NEAR(row[0], brute_xfer(p, 0, 0, 1), 1e-12);
  EXPECT_GT(row[0], 0.0);
  // Every boundary reads the row: t_out of stage k at unit i and t_in of stage k+1 from i.
  for (int k = 0; k + 1 < S; k += 31)
    for (int i = k + 1; i < U; i += 4999) {
      EXPECT_EQ(pp.t_out(k, i), row[i - 1]) << "stage " << k << " unit " << i;
      EXPECT_EQ(pp.t_in(k + 1, i), row[i - 1]) << "stage " << k + 1 << " unit " << i;
    }
  // The fast solver on it (the automatic choice with one link): its stage times are the
  // brute-force formula's, over plain sums of the units.
  const Partition part = solve(p, order);
  EXPECT_EQ(part.algorithm, "fast");
  ASSERT_EQ(part.num_stages(), S);
  for (int k = 0; k < S; ++k)
    EXPECT_NEAR(part.predicted_stage_ms[k], brute_stage_time(p, order, k, part.first_unit[k], part.last_unit[k]),
                1e-9 * part.bottleneck_ms)
        << "stage " << k;
}

/// A link per device pair on up to three nodes (a link inside each node, one between nodes,
/// NaN pairs on the default link): prepare() holds exactly one row per distinct link the
/// order's boundaries cross, every boundary maps to its own link's row (boundary_transfer_ms
/// of that pair, and the independent formula), and boundaries share a row only over one link.
TEST(BalanceSolver, DistinctLinksPrepareOneRowEach) {
  std::mt19937 rng(3434);
  int several = 0, three_or_more = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int D = std::uniform_int_distribution<int>(2, 8)(rng);
    const int U = std::uniform_int_distribution<int>(D, 40)(rng);
    BalanceProblem p = random_problem(rng, U, D, trial % 2 == 0);
    if (p.activation_bytes.empty()) p.activation_bytes.assign(U - 1, 4000.0 * (1 + trial % 3));
    p.link_bandwidth_GBps = 1e-3 * (1 + trial % 4);
    p.link_latency_us = 3.0;
    const int nodes = std::uniform_int_distribution<int>(1, 3)(rng);
    std::vector<int> node(D);
    for (int& n : node) n = std::uniform_int_distribution<int>(0, nodes - 1)(rng);
    p.pair_bandwidth_GBps.assign(static_cast<std::size_t>(D) * D, 0.0);
    p.pair_latency_us.assign(static_cast<std::size_t>(D) * D, 0.0);
    for (int d = 0; d < D; ++d)
      for (int e = 0; e < D; ++e) {
        const std::size_t i = static_cast<std::size_t>(d) * D + e;
        p.pair_bandwidth_GBps[i] = node[d] == node[e] ? 1e-2 * (1 + node[d]) : 2e-4;
        p.pair_latency_us[i] = node[d] == node[e] ? 1.0 : 500.0;
        if (std::uniform_int_distribution<int>(0, 5)(rng) == 0) p.pair_bandwidth_GBps[i] = std::nan("");
      }
    const int S = std::uniform_int_distribution<int>(1, D)(rng);
    std::vector<int> order(D);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(S);
    const std::string what = "trial " + std::to_string(trial) + " D=" + std::to_string(D) + " S=" + std::to_string(S);

    // The link of each boundary, from the matrices (NaN: the default link), and the distinct ones.
    std::vector<std::pair<double, double>> link_of, links;
    for (int k = 0; k + 1 < S; ++k) {
      const std::size_t i = static_cast<std::size_t>(order[k]) * D + order[k + 1];
      const double bw = std::isnan(p.pair_bandwidth_GBps[i]) ? p.link_bandwidth_GBps : p.pair_bandwidth_GBps[i];
      link_of.emplace_back(bw, p.pair_latency_us[i]);
      if (std::find(links.begin(), links.end(), link_of.back()) == links.end()) links.push_back(link_of.back());
    }
    const detail::Prepared pp = detail::prepare(p, order);
    EXPECT_EQ(pp.xfer_rows.size(), links.size()) << what;
    ASSERT_EQ(pp.xfer_slot_of.size(), static_cast<std::size_t>(S - 1)) << what;
    for (int k = 0; k + 1 < S; ++k) {
      ASSERT_LT(pp.xfer_slot_of[k], static_cast<int>(pp.xfer_rows.size())) << what;
      const std::vector<double>& row = pp.xfer_rows[pp.xfer_slot_of[k]];
      EXPECT_EQ(row, boundary_transfer_ms(p, order[k], order[k + 1])) << what << " boundary " << k;
      for (int b = 0; b + 1 < U; ++b) {
        const double want = brute_xfer(p, b, order[k], order[k + 1]);
        EXPECT_NEAR(row[b], want, 1e-12 * std::max(1.0, want)) << what << " boundary " << k << " unit " << b;
        EXPECT_EQ(pp.t_out(k, b + 1), row[b]) << what;
        EXPECT_EQ(pp.t_in(k + 1, b + 1), row[b]) << what;
      }
      for (int m = 0; m < k; ++m)
        EXPECT_EQ(pp.xfer_slot_of[m] == pp.xfer_slot_of[k], link_of[m] == link_of[k]) << what << " boundaries " << m << ", " << k;
    }
    several += links.size() >= 2;
    three_or_more += links.size() >= 3;
  }
  EXPECT_GE(several, 100);
  EXPECT_GE(three_or_more, 30);
}

TEST(BalanceSolver, FastEqualsDpOnLargerInstances) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int U = std::uniform_int_distribution<int>(20, 160)(rng);
    const int S = std::uniform_int_distribution<int>(1, 12)(rng);
    BalanceProblem p = random_problem(rng, U, S, true, true);
    if (trial % 3 == 0) {  // tight memory: holes in the reachable sets
      p.weight_bytes.assign(U, 0);
      p.kv_bytes.assign(U, 0);
      for (auto& w : p.weight_bytes) w = std::uniform_int_distribution<int>(1, 10)(rng);
      const int64_t total = std::accumulate(p.weight_bytes.begin(), p.weight_bytes.end(), int64_t{0});
      p.device_memory_bytes.assign(S, 0);
      for (auto& m : p.device_memory_bytes) m = std::max<int64_t>(8, 3 * total / (2 * S) + std::uniform_int_distribution<int>(-5, 5)(rng));
    }
    const std::vector<int> order = rank_order(p, S);
    const std::string what = "trial " + std::to_string(trial) + " U=" + std::to_string(U) + " S=" + std::to_string(S);
    Partition dp, fast;
    bool dp_ok = true, fast_ok = true;
    try { dp = solve_dp(p, order); } catch (const UserError&) { dp_ok = false; }
    try { fast = solve_fast(p, order); } catch (const UserError&) { fast_ok = false; }
    ASSERT_EQ(dp_ok, fast_ok) << what;
    if (!dp_ok) continue;
    EXPECT_EQ(fast.bottleneck_ms, dp.bottleneck_ms) << what;
    EXPECT_NEAR(fast.spread_ms, dp.spread_ms, 1e-9 * std::max(1.0, dp.bottleneck_ms)) << what;
  }
}

TEST(BalanceSolver, OverlapTakesMaxAndNoOverlapTakesSum) {
  BalanceProblem p;
  p.cost = {{1, 1, 1, 1}};
  p.device_row = {0, 0};
  p.activation_bytes = {2000, 2000, 2000};
  p.link_bandwidth_GBps = 1e-3;  // 1000 bytes per ms: 2 ms per boundary
  p.overlap = true;
  Partition a = solve(p, {0, 1});
  EXPECT_EQ(a.counts_string(), "2,2");
  EXPECT_DOUBLE_EQ(a.bottleneck_ms, 2.0);  // max(2 compute, 2 transfer)
  p.overlap = false;
  Partition b = solve(p, {0, 1});
  EXPECT_DOUBLE_EQ(b.bottleneck_ms, 4.0);  // 2 compute + 2 transfer
  p.activation_bytes = {0, 2000, 9000};    // non-uniform: dp only; cut at the cheap boundary
  Partition c = solve(p, {0, 1});
  EXPECT_EQ(c.algorithm, "dp");
  EXPECT_EQ(c.counts_string(), "1,3");
  EXPECT_DOUBLE_EQ(c.bottleneck_ms, 3.0);
  EXPECT_THROW(solve(p, {0, 1}, SolverKind::fast), UserError);
}

TEST(BalanceSolver, OrderSearchFindsTheBestPermutation) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 120; ++trial) {
    const int S = std::uniform_int_distribution<int>(2, 4)(rng);
    const int U = std::uniform_int_distribution<int>(S, 9)(rng);
    BalanceProblem p = random_problem(rng, U, S, true, true);
    std::vector<int> perm(S);
    std::iota(perm.begin(), perm.end(), 0);
    double best = kInf;
    do {
      const Optimum o = brute_force(p, perm);
      if (o.feasible) best = std::min(best, o.bottleneck);
    } while (std::next_permutation(perm.begin(), perm.end()));
    const std::string what = "trial " + std::to_string(trial);
    if (best == kInf) {
      EXPECT_THROW(solve_with_order(p, S, OrderMode::automatic), UserError) << what;
      continue;
    }
    const Partition auto_p = solve_with_order(p, S, OrderMode::automatic);
    EXPECT_NEAR(auto_p.bottleneck_ms, best, 1e-9 * std::max(1.0, best)) << what;
    try {
      const Partition rank_p = solve_with_order(p, S, OrderMode::rank);
      EXPECT_LE(auto_p.bottleneck_ms, rank_p.bottleneck_ms + 1e-9) << what;
      EXPECT_EQ(rank_p.device_rank, rank_order(p, S)) << what;
    } catch (const UserError&) {
    }
  }
}

TEST(BalanceSolver, OrderSearchByClassBeyondEightDevices) {
  // 12 devices of 2 classes: 6 fast ones and 6 slow ones (3x). Blocks: fast first or slow first.
  BalanceProblem p;
  p.cost = {std::vector<double>(60, 1.0), std::vector<double>(60, 3.0)};
  for (int d = 0; d < 12; ++d) p.device_row.push_back(d % 2);
  const Partition rank_p = solve_with_order(p, 12, OrderMode::rank);
  const Partition auto_p = solve_with_order(p, 12, OrderMode::automatic);
  EXPECT_LE(auto_p.bottleneck_ms, rank_p.bottleneck_ms);
  // 6 fast stages of 8 units (8 ms) and 6 slow stages of 2 units (6 ms) cover the 60 units.
  EXPECT_NEAR(auto_p.bottleneck_ms, 8.0, 1e-12);
}

TEST(BalanceSolver, InfeasibleSaysWhichLimitBinds) {
  BalanceProblem p;
  p.cost = {{1, 1, 1, 1}};
  p.device_row = {0, 0};
  p.unit_names = {"embed", "layer.0", "layer.1", "head"};
  p.weight_bytes = {1, 1, 1, 50};
  p.device_memory_bytes = {40, 40};
  try {
    solve(p, {0, 1});
    FAIL();
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no feasible split"), std::string::npos) << m;
    EXPECT_NE(m.find("unit 3 (head)"), std::string::npos) << m;
  }
  p.weight_bytes = {30, 30, 30, 30};
  p.device_memory_bytes = {60, 50};
  try {
    solve(p, {0, 1});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("hold"), std::string::npos) << e.what();  // total 120 > 110
  }
  p.weight_bytes = {10, 10, 10, 40};
  p.device_memory_bytes = {60, 30};  // 70 <= 90 in total, but the head needs the big device last
  EXPECT_THROW(solve(p, {0, 1}), UserError);
  EXPECT_NE(diagnose_infeasible(p, {0, 1}).find("order"), std::string::npos) << diagnose_infeasible(p, {0, 1});
  const Partition swapped = solve_with_order(p, 2, OrderMode::automatic);
  EXPECT_EQ(swapped.device_rank, (std::vector<int>{1, 0}));
}

TEST(BalanceSolver, ValidationNamesTheField) {
  BalanceProblem p;
  p.cost = {{1, 2, 3}};
  p.weight_bytes = {1, 2};
  try {
    validate_problem(p);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("weight_bytes"), std::string::npos);
  }
  p.weight_bytes.clear();
  p.activation_bytes = {1};
  EXPECT_THROW(validate_problem(p), UserError);
  p.activation_bytes = {1, 2, 3};  // one per unit: accepted
  EXPECT_NO_THROW(validate_problem(p));
  p.cost = {{1, -2, 3}};
  EXPECT_THROW(validate_problem(p), UserError);
  p.cost = {{1, 2, 3}};
  EXPECT_THROW(rank_order(p, 2), UserError);  // 1 device, 2 stages
  EXPECT_THROW(solve(p, {0, 0}), UserError);
  // A stage's fixed cost: one per row, finite, and no lower than minus the row's cheapest unit.
  p.stage_fixed_ms = {-1.0};
  EXPECT_NO_THROW(validate_problem(p));
  for (const std::vector<double>& bad : {std::vector<double>{-1.5}, std::vector<double>{0.5, 0.5},
                                         std::vector<double>{std::nan("")}}) {
    p.stage_fixed_ms = bad;
    try {
      validate_problem(p);
      ADD_FAILURE() << bad.size();
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("stage_fixed_ms"), std::string::npos) << e.what();
    }
  }
}

/// A stage's fixed cost (issue 47), paid once per stage. On one row it adds F to every stage
/// (the split stays, the bottleneck moves by F): 4 units of 1 ms and a 6 ms head over 2 stages,
/// 4,1 costs 4 + F and 6 + F (3,2: 3 + F, 7 + F); over 3 stages 2,2,1 and 3,1,1 share the
/// bottleneck 6 + F and the spread picks 2,2,1 (4 against 5). The fast solver and the DP agree
/// with these sums. On rows that differ only in F it decides the device order.
TEST(BalanceSolver, AStagesFixedCostIsPaidOncePerStage) {
  BalanceProblem p;
  p.cost = {{1, 1, 1, 1, 6}};
  p.device_row = {0, 0, 0};
  for (double f : {0.0, 3.0}) {
    p.stage_fixed_ms = {f};
    for (const Partition& two : {solve_dp(p, {0, 1}), solve_fast(p, {0, 1})}) {
      EXPECT_EQ(two.counts_string(), "4,1");
      EXPECT_DOUBLE_EQ(two.predicted_stage_ms[0], 4 + f);
      EXPECT_DOUBLE_EQ(two.predicted_stage_ms[1], 6 + f);
    }
    const Partition three = solve_dp(p, {0, 1, 2});
    EXPECT_EQ(three.counts_string(), "2,2,1");
    EXPECT_DOUBLE_EQ(three.bottleneck_ms, 6 + f);
    EXPECT_DOUBLE_EQ(solve_fast(p, {0, 1, 2}).bottleneck_ms, three.bottleneck_ms);
  }
  // Two rows that differ only in their fixed cost are two device classes: the cheaper-per-stage
  // device takes the head.
  p.cost = {{1, 1, 1, 1, 6}, {1, 1, 1, 1, 6}};
  p.device_row.clear();
  p.stage_fixed_ms = {0.0, 2.0};
  const Partition ordered = solve_with_order(p, 2, OrderMode::automatic);
  EXPECT_EQ(ordered.device_rank, (std::vector<int>{1, 0}));  // 4 + 2, 6 + 0 = 6, against 4, 8
  EXPECT_DOUBLE_EQ(ordered.bottleneck_ms, 6.0);
  // The transfers alone leave the fixed cost out.
  Partition q = ordered;
  for (double t : stage_transfer_ms(p, q)) EXPECT_EQ(t, 0.0);
}

}  // namespace
}  // namespace ppb::balance
