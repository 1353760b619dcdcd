// Unit tests of src/balance/partition: the exact solvers against brute force, the uniform
// baseline's invariants, manual splits and their error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "balance/partition.h"
#include "common/error.h"

namespace ppb::balance {
namespace {

using Table = std::vector<std::vector<double>>;

struct Optimum {
  double bottleneck = INFINITY;
  double spread = INFINITY;
};

/// Every composition of U units into S non-empty contiguous stages (stage k on row k): the
/// minimal bottleneck and, among splits within `rel` of it, the minimal spread.
Optimum brute_force(const Table& cost, int stages) {
  const int U = static_cast<int>(cost[0].size());
  std::vector<std::pair<double, double>> all;  // (max, min) per composition
  std::vector<double> stage_cost(stages);
  std::function<void(int, int)> rec = [&](int k, int start) {
    if (k == stages - 1) {
      double s = 0;
      for (int u = start; u < U; ++u) s += cost[k][u];
      stage_cost[k] = s;
      const auto [lo, hi] = std::minmax_element(stage_cost.begin(), stage_cost.end());
      all.emplace_back(*hi, *lo);
      return;
    }
    // Leave at least one unit for each of the remaining stages.
    for (int end = start + 1; end <= U - (stages - 1 - k); ++end) {
      double s = 0;
      for (int u = start; u < end; ++u) s += cost[k][u];
      stage_cost[k] = s;
      rec(k + 1, end);
    }
  };
  rec(0, 0);
  Optimum o;
  for (const auto& [hi, lo] : all) o.bottleneck = std::min(o.bottleneck, hi);
  double total = 0;
  for (const auto& row : cost)
    total = std::max(total, std::accumulate(row.begin(), row.end(), 0.0));
  const double tol = 1e-12 * total;
  for (const auto& [hi, lo] : all)
    if (hi <= o.bottleneck + tol) o.spread = std::min(o.spread, hi - lo);
  return o;
}

void expect_matches(const Partition& p, const Optimum& o, const Table& cost, int stages,
                    const std::string& what) {
  const int U = static_cast<int>(cost[0].size());
  ASSERT_NO_THROW(check_partition(p, U)) << what;
  ASSERT_EQ(p.num_stages(), stages) << what;
  double total = 0;
  for (const auto& row : cost)
    total = std::max(total, std::accumulate(row.begin(), row.end(), 0.0));
  const double tol = 1e-9 * std::max(total, 1.0);
  EXPECT_NEAR(p.bottleneck_ms, o.bottleneck, tol) << what << " split " << p.counts_string();
  EXPECT_NEAR(p.spread_ms, o.spread, tol) << what << " split " << p.counts_string();
  // The reported numbers are those of the returned split.
  Partition q = p;
  evaluate(q, cost);
  EXPECT_DOUBLE_EQ(q.bottleneck_ms, p.bottleneck_ms) << what;
  EXPECT_DOUBLE_EQ(q.spread_ms, p.spread_ms) << what;
}

std::vector<double> random_row(std::mt19937& rng, int U, int kind) {
  std::vector<double> row(U);
  std::uniform_int_distribution<int> small(0, 4);      // many ties and zeros
  std::uniform_int_distribution<int> wide(1, 100);
  std::uniform_real_distribution<double> real(0.01, 10.0);
  for (double& x : row) {
    switch (kind) {
      case 0: x = small(rng); break;
      case 1: x = wide(rng); break;
      case 2: x = real(rng); break;
      default: x = 1.0; break;  // all equal: maximal ties
    }
  }
  if (kind == 2 && U >= 3) row.back() *= 4.0;  // heavy head, as with large vocabularies
  return row;
}

TEST(BalanceSolvers, MatchBruteForceOnRandomInstances) {
  std::mt19937 rng(20240601);
  int checked = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::uniform_int_distribution<int> du(1, 12);
    const int U = du(rng);
    std::uniform_int_distribution<int> ds(1, std::min(U, 5));
    const int S = ds(rng);
    const int kind = trial % 4;
    const std::string what = "trial " + std::to_string(trial) + " U=" + std::to_string(U) +
                             " S=" + std::to_string(S) + " kind=" + std::to_string(kind);

    // Homogeneous: solve_seed and solve_balanced with the row repeated must both be optimal.
    const std::vector<double> lat = random_row(rng, U, kind);
    const Table same(S, lat);
    const Optimum o = brute_force(same, S);
    const Partition seed = solve_seed(lat, S);
    EXPECT_EQ(seed.solver, "seed");
    expect_matches(seed, o, same, S, what + " seed");
    expect_matches(solve_balanced(same, S), o, same, S, what + " balanced(same rows)");

    // Heterogeneous: one row per device, e.g. a faster and a slower GPU type.
    Table mixed(S);
    for (int k = 0; k < S; ++k) mixed[k] = random_row(rng, U, kind == 3 ? k % 3 : kind);
    const Partition bal = solve_balanced(mixed, S);
    EXPECT_EQ(bal.solver, "balanced");
    expect_matches(bal, brute_force(mixed, S), mixed, S, what + " balanced(mixed rows)");

    // Scaled rows: device k is (1 + k/2) times slower on every unit.
    Table scaled(S);
    for (int k = 0; k < S; ++k) {
      scaled[k] = lat;
      for (double& x : scaled[k]) x *= 1.0 + 0.5 * k;
    }
    expect_matches(solve_balanced(scaled, S), brute_force(scaled, S), scaled, S,
                   what + " balanced(scaled rows)");
    checked += 4;
  }
  EXPECT_GE(checked, 2000);
}

TEST(BalanceSolvers, SpreadTieBreak) {
  // The unit of cost 4 forces bottleneck 4, reached by three splits: [4 | 1 | 1 1 1]
  // (spread 3), [4 | 1 1 | 1 1] (spread 2) and [4 | 1 1 1 | 1] (spread 3).
  const std::vector<double> lat = {4, 1, 1, 1, 1};
  const Partition p = solve_seed(lat, 3);
  EXPECT_DOUBLE_EQ(p.bottleneck_ms, 4.0);
  EXPECT_DOUBLE_EQ(p.spread_ms, 2.0);
  EXPECT_EQ(p.counts_string(), "1,2,2");
}

TEST(BalanceSolvers, ZeroCostsAndOneUnitPerStage) {
  const Partition z = solve_seed({0, 0, 0, 0}, 3);
  EXPECT_NO_THROW(check_partition(z, 4));
  EXPECT_DOUBLE_EQ(z.bottleneck_ms, 0.0);
  const Partition every = solve_seed({1, 2, 3}, 3);
  EXPECT_EQ(every.counts_string(), "1,1,1");
  const Partition one = solve_seed({1, 2, 3}, 1);
  EXPECT_EQ(one.counts_string(), "3");
  EXPECT_DOUBLE_EQ(one.bottleneck_ms, 6.0);
  EXPECT_DOUBLE_EQ(one.spread_ms, 0.0);
}

TEST(BalanceSolvers, Errors) {
  EXPECT_THROW(solve_seed({1, 2, 3}, 0), UserError);
  EXPECT_THROW(solve_seed({1, 2, 3}, 4), UserError);
  EXPECT_THROW(solve_seed({}, 1), UserError);
  EXPECT_THROW(solve_seed({1, -2, 3}, 2), UserError);
  EXPECT_THROW(solve_seed({1, NAN, 3}, 2), UserError);
  EXPECT_THROW(solve_balanced({{1, 2, 3}}, 2), UserError);              // 1 row, 2 stages
  EXPECT_THROW(solve_balanced({{1, 2, 3}, {1, 2}}, 2), UserError);      // ragged rows
  EXPECT_THROW(solve_balanced({}, 1), UserError);
  try {
    solve_seed({1, 2, 3, 4}, 7);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--stages 7"), std::string::npos) << m;
    EXPECT_NE(m.find("4 units"), std::string::npos) << m;
  }
}

// ---- uniform ------------------------------------------------------------------------------

TEST(BalanceUniform, CoversEveryUnitOnceForAllShapes) {
  for (int L = 1; L <= 80; ++L) {
    const int U = L + 2;
    for (int S = 1; S <= std::min(U, 20); ++S) {
      const Partition p = solve_uniform(U, S);
      const std::string what = "L=" + std::to_string(L) + " S=" + std::to_string(S);
      ASSERT_NO_THROW(check_partition(p, U)) << what;
      ASSERT_EQ(p.num_stages(), S) << what;
      EXPECT_EQ(p.solver, "uniform");
      // Layer counts per stage (embed = unit 0, head = unit U-1) differ by at most one and
      // are non-increasing: the remainder goes to the first layer-carrying stages.
      std::vector<int> layers;
      for (int k = 0; k < S; ++k) {
        const int n = p.units_in(k) - (k == 0 ? 1 : 0) - (k == S - 1 ? 1 : 0);
        if (n > 0) layers.push_back(n);
      }
      ASSERT_EQ(static_cast<int>(layers.size()), std::min(S, L)) << what;
      EXPECT_EQ(std::accumulate(layers.begin(), layers.end(), 0), L) << what;
      EXPECT_TRUE(std::is_sorted(layers.rbegin(), layers.rend())) << what;
      EXPECT_LE(layers.front() - layers.back(), 1) << what;
      for (int k = 0; k < S; ++k) EXPECT_EQ(p.device_rank[k], k) << what;
    }
  }
}

TEST(BalanceUniform, SpecificSplits) {
  EXPECT_EQ(solve_uniform(32, 4).counts_string(), "9,8,7,8");  // layers 8,8,7,7
  const Partition p = solve_uniform(42, 16);                  // 40 layers: 8 x 3 then 8 x 2
  EXPECT_EQ(p.counts_string(), "4,3,3,3,3,3,3,3,2,2,2,2,2,2,2,3");
  EXPECT_EQ(solve_uniform(34, 4).counts_string(), "9,8,8,9");  // Llama 32 layers
  EXPECT_EQ(solve_uniform(34, 1).counts_string(), "34");
  EXPECT_EQ(solve_uniform(5, 4).counts_string(), "1,1,1,2");   // S = L+1: embed alone
  EXPECT_EQ(solve_uniform(5, 5).counts_string(), "1,1,1,1,1"); // S = L+2: every unit alone
  EXPECT_EQ(solve_uniform(5, 3).counts_string(), "2,1,2");     // S = L
  EXPECT_EQ(solve_uniform(2, 2).counts_string(), "1,1");
  EXPECT_EQ(solve_uniform(2, 1).counts_string(), "2");
  EXPECT_EQ(solve_uniform(1, 1).counts_string(), "1");
}

TEST(BalanceUniform, Errors) {
  EXPECT_THROW(solve_uniform(34, 0), UserError);
  EXPECT_THROW(solve_uniform(34, 35), UserError);
  EXPECT_THROW(solve_uniform(0, 1), UserError);
  try {
    solve_uniform(34, 35);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--stages 35"), std::string::npos) << m;
    EXPECT_NE(m.find("34 units"), std::string::npos) << m;
  }
}

// ---- evaluate / check_partition --------------------------------------------------------------

TEST(BalanceEvaluate, UsesEachStagesDeviceRow) {
  Partition p = solve_uniform(5, 2);  // "3,2"
  ASSERT_EQ(p.counts_string(), "3,2");
  evaluate(p, {{1, 1, 1, 1, 1}, {2, 2, 2, 2, 2}});
  EXPECT_DOUBLE_EQ(p.predicted_stage_ms[0], 3.0);
  EXPECT_DOUBLE_EQ(p.predicted_stage_ms[1], 4.0);
  EXPECT_DOUBLE_EQ(p.bottleneck_ms, 4.0);
  EXPECT_DOUBLE_EQ(p.spread_ms, 1.0);
  EXPECT_THROW(evaluate(p, {{1, 1, 1, 1, 1}}), InternalError);            // no row for rank 1
  EXPECT_THROW(evaluate(p, {{1, 1, 1, 1}, {1, 1, 1, 1}}), InternalError);  // wrong unit count
  EXPECT_THROW(evaluate(p, {}), InternalError);
}

TEST(BalanceCheck, RejectsBrokenPartitions) {
  const Partition good = solve_uniform(6, 3);
  EXPECT_NO_THROW(check_partition(good, 6));
  EXPECT_THROW(check_partition(good, 7), InternalError);  // does not cover the last unit
  Partition gap = good;
  gap.first_unit[1] += 1;
  EXPECT_THROW(check_partition(gap, 6), InternalError);
  Partition empty = good;
  empty.last_unit[0] = empty.first_unit[0] - 1;
  EXPECT_THROW(check_partition(empty, 6), InternalError);
  Partition shared = good;
  shared.device_rank[2] = 0;
  EXPECT_THROW(check_partition(shared, 6), InternalError);
  EXPECT_THROW(check_partition(Partition{}, 6), InternalError);
}

// ---- manual -------------------------------------------------------------------------------

TEST(BalanceManual, ParsesValidSplits) {
  const Partition p = parse_manual("5,6,5,6", 22, 4);
  EXPECT_EQ(p.solver, "manual");
  EXPECT_EQ(p.counts_string(), "5,6,5,6");
  EXPECT_EQ(p.first_unit, (std::vector<int>{0, 5, 11, 16}));
  EXPECT_EQ(p.last_unit, (std::vector<int>{4, 10, 15, 21}));
  EXPECT_EQ(parse_manual(" 9 , 8,8 ,9 ", 34, 4).counts_string(), "9,8,8,9");
  EXPECT_EQ(parse_manual("34", 34, 1).counts_string(), "34");
}

std::string manual_error(const std::string& text, int units, int stages) {
  try {
    parse_manual(text, units, stages);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError for '" << text << "'";
  return "";
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

TEST(BalanceManual, ErrorMessages) {
  expect_has(manual_error("", 34, 4), "empty");
  expect_has(manual_error("   ", 34, 4), "empty");
  expect_has(manual_error("9,8,x,9", 34, 4), "'x' is not an integer");
  expect_has(manual_error("9,8,8.5,9", 34, 4), "'8.5' is not an integer");
  expect_has(manual_error("9,8,,9", 34, 4), "empty");
  expect_has(manual_error("9,8,8,", 34, 4), "empty");
  expect_has(manual_error("9,8,17,0", 34, 4), "stage 3 would be empty");
  expect_has(manual_error("9,-1,17,9", 34, 4), "stage 1 would be empty");
  expect_has(manual_error("10,12,12", 34, 4), "--partition has 3 stages but the run has 4");
  const std::string sum = manual_error("9,8,8,5", 34, 4);
  expect_has(sum, "--partition covers 30 units but the model has 34 units");
  expect_has(sum, "embed + 32 layers + head");
}

// ---- the case for balancing -----------------------------------------------------------------

TEST(BalanceExample, HeavyHeadOnTwoStages) {
  // Embed 0.5 ms, 28 layers of 1 ms, a head of 9 ms (large vocabulary, decode).
  std::vector<double> lat = {0.5};
  lat.insert(lat.end(), 28, 1.0);
  lat.push_back(9.0);
  const int U = static_cast<int>(lat.size());
  const Table rows(2, lat);
  Partition uniform = solve_uniform(U, 2);
  evaluate(uniform, rows);
  const Partition balanced = solve_balanced(rows, 2);
  std::cout << "heavy head, 2 stages: uniform " << uniform.counts_string() << " bottleneck "
            << uniform.bottleneck_ms << " ms; balanced " << balanced.counts_string()
            << " bottleneck " << balanced.bottleneck_ms << " ms (spread " << balanced.spread_ms
            << " ms)\n";
  RecordProperty("uniform_bottleneck_ms", std::to_string(uniform.bottleneck_ms));
  RecordProperty("balanced_bottleneck_ms", std::to_string(balanced.bottleneck_ms));
  EXPECT_DOUBLE_EQ(uniform.bottleneck_ms, 23.0);   // [embed + 14 | 14 + head]
  EXPECT_DOUBLE_EQ(balanced.bottleneck_ms, 19.0);  // [embed + 18 | 10 + head]
  EXPECT_DOUBLE_EQ(balanced.spread_ms, 0.5);
  EXPECT_LT(balanced.bottleneck_ms, uniform.bottleneck_ms);
  EXPECT_EQ(solve_seed(lat, 2).counts_string(), balanced.counts_string());
}

}  // namespace
}  // namespace ppb::balance

namespace {

/// A split returned by two solvers (or twice) is recognised as the same: same units per stage
/// and the same device order; a different order or split is not.
TEST(SameSplit, FindsTheFirstEqualSplit) {
  using ppb::balance::Partition;
  auto split = [](std::vector<int> first, std::vector<int> last, std::vector<int> dev) {
    Partition p;
    p.first_unit = std::move(first);
    p.last_unit = std::move(last);
    p.device_rank = std::move(dev);
    return p;
  };
  const std::vector<Partition> parts = {split({0, 3}, {2, 5}, {0, 1}),  // uniform
                                        split({0, 4}, {3, 5}, {0, 1}),  // seed: another split
                                        split({0, 3}, {2, 5}, {0, 1}),  // balanced: uniform's split
                                        split({0, 3}, {2, 5}, {1, 0})}; // same units, other device order
  EXPECT_EQ(ppb::balance::same_split_as(parts, 0), -1);
  EXPECT_EQ(ppb::balance::same_split_as(parts, 1), -1);
  EXPECT_EQ(ppb::balance::same_split_as(parts, 2), 0);
  EXPECT_EQ(ppb::balance::same_split_as(parts, 3), -1);
}

/// Issue 13's "equal up to swapping identical devices": 7,6,5,6 and 7,5,6,6 of one layer
/// signature on four identical cores are the same stages in another order; not if one core
/// differs, nor where the swapped stages hold other signatures; identical splits stay identical.
TEST(SameSplit, EquivalentUpToSwappingIdenticalDevices) {
  using ppb::balance::Partition;
  using ppb::balance::Sameness;
  auto counts = [](std::vector<int> c, std::vector<int> dev) {
    Partition p;
    int u = 0;
    for (int n : c) {
      p.first_unit.push_back(u);
      u += n;
      p.last_unit.push_back(u - 1);
    }
    p.device_rank = std::move(dev);
    return p;
  };
  ppb::balance::SplitEquivalence eq;
  eq.unit_signature.assign(24, 1);  // embed, 22 layers of one shape, head
  eq.unit_signature.front() = 0;
  eq.unit_signature.back() = 2;
  eq.device_class = {0, 0, 0, 0};
  const Partition a = counts({7, 6, 5, 6}, {0, 1, 2, 3}), b = counts({7, 5, 6, 6}, {0, 1, 2, 3});
  EXPECT_EQ(ppb::balance::compare_splits(a, b, eq), Sameness::equivalent);
  EXPECT_EQ(ppb::balance::compare_splits(a, a, eq), Sameness::identical);
  EXPECT_EQ(ppb::balance::compare_splits(a, b), Sameness::different);  // no equivalence given
  EXPECT_EQ(ppb::balance::compare_splits(a, counts({6, 7, 5, 6}, {0, 1, 2, 3}), eq), Sameness::different);
  EXPECT_EQ(ppb::balance::same_split_as({a, counts({8, 5, 5, 6}, {0, 1, 2, 3}), b}, 2, eq), 0);
  EXPECT_EQ(ppb::balance::same_split_as({a, b}, 1), -1);
  // The same split at another M (run --plan) is another measurement, identical or equivalent.
  Partition a4 = a, b4 = b;
  a4.groups = b4.groups = 4;
  EXPECT_EQ(ppb::balance::compare_splits(a, a4, eq), Sameness::different);
  EXPECT_EQ(ppb::balance::compare_splits(a, b4, eq), Sameness::different);
  EXPECT_EQ(ppb::balance::compare_splits(a4, b4, eq), Sameness::equivalent);
  // So is the same split under another step policy (run --step-policy A,B).
  Partition av1 = a, bv1 = b;
  av1.step_policy = bv1.step_policy = "vllm-v1";
  EXPECT_EQ(ppb::balance::compare_splits(a, av1, eq), Sameness::different);
  EXPECT_EQ(ppb::balance::compare_splits(av1, bv1, eq), Sameness::equivalent);
  // And R replicas of a split side by side (run --plan --replicas) another again.
  Partition a2 = a;
  a2.replicas = 2;
  EXPECT_EQ(ppb::balance::compare_splits(a, a2, eq), Sameness::different);
  EXPECT_EQ(ppb::balance::compare_splits(a2, a2, eq), Sameness::identical);
  // Rank 2 is another kind of device (a CPU quota, an older GPU): its 5 layers are not rank 1's.
  ppb::balance::SplitEquivalence mixed = eq;
  mixed.device_class = {0, 0, 1, 0};
  EXPECT_EQ(ppb::balance::compare_splits(a, b, mixed), Sameness::different);
  // Stage order of identical devices: the same split on ranks 1, 0 instead of 0, 1.
  const Partition r01 = counts({12, 12}, {0, 1}), r10 = counts({12, 12}, {1, 0});
  ppb::balance::SplitEquivalence two = eq;
  two.device_class = {0, 0};
  EXPECT_EQ(ppb::balance::compare_splits(r01, r10, two), Sameness::equivalent);
  two.device_class = {0, 1};
  EXPECT_EQ(ppb::balance::compare_splits(r01, r10, two), Sameness::different);
  // Two layer shapes (Gemma's local and global), units 12 and 13 global: 7,6,5,6's middle
  // stages hold 5 local + 1 global and 4 + 1, 7,5,6,6's 5 + 0 and 4 + 2: not the same stages.
  ppb::balance::SplitEquivalence gemma = eq;
  gemma.unit_signature[12] = gemma.unit_signature[13] = 3;
  EXPECT_EQ(ppb::balance::compare_splits(a, b, gemma), Sameness::different);
  // Several nodes (a link per boundary): stage positions decide the links crossed, so only
  // in-place swaps of identical devices are the same. Two nodes of two ranks: [0,1,2,3] crosses
  // the network once, [0,2,1,3] three times.
  ppb::balance::SplitEquivalence nodes = eq;
  nodes.device_class = {0, 0, 1, 1};
  nodes.stage_order_matters = true;
  const Partition even = counts({6, 6, 6, 6}, {0, 1, 2, 3});
  EXPECT_EQ(ppb::balance::compare_splits(even, counts({6, 6, 6, 6}, {0, 2, 1, 3}), nodes), Sameness::different);
  EXPECT_EQ(ppb::balance::compare_splits(even, counts({6, 6, 6, 6}, {1, 0, 3, 2}), nodes), Sameness::equivalent);
  EXPECT_EQ(ppb::balance::compare_splits(a, b, nodes), Sameness::different);
  nodes.stage_order_matters = false;  // one link: the same stages in another order
  EXPECT_EQ(ppb::balance::compare_splits(even, counts({6, 6, 6, 6}, {0, 2, 1, 3}), nodes), Sameness::equivalent);
  // A class or signature table too short for the split is a caller's bug.
  ppb::balance::SplitEquivalence short_eq = eq;
  short_eq.device_class = {0, 0};
  EXPECT_THROW(ppb::balance::compare_splits(a, b, short_eq), ppb::InternalError);
}

TEST(SameSplit, ReplicasRunOnConsecutiveRankBlocks) {
  // Two replicas of a 3-rank layout (a TP2 stage, then one rank): replica 1 on ranks 3..5.
  ppb::balance::Partition p;
  p.first_unit = {0, 4};
  p.last_unit = {3, 7};
  p.device_rank = {0, 2};
  p.tp_width = {2, 1};
  p.replicas = 2;
  EXPECT_EQ(p.ranks_per_replica(), 3);
  EXPECT_EQ(p.stage_ranks(), (std::vector<std::vector<int>>{{0, 1}, {2}}));
  EXPECT_EQ(p.stage_ranks(1), (std::vector<std::vector<int>>{{3, 4}, {5}}));
  EXPECT_THROW(p.stage_ranks(2), ppb::InternalError);
  EXPECT_THROW(p.stage_ranks(-1), ppb::InternalError);
}

/// compare_splits against the definition: some one-to-one matching of the stages (tried over
/// every permutation) with the same device class and the same count of every signature.
TEST(SameSplit, EquivalenceMatchesBruteForceOverStagePermutations) {
  using ppb::balance::Partition;
  using ppb::balance::Sameness;
  std::mt19937 rng(13);
  int seen[3] = {0, 0, 0};
  for (int trial = 0; trial < 3000; ++trial) {
    const int S = 2 + static_cast<int>(rng() % 3), U = S + static_cast<int>(rng() % 6);
    ppb::balance::SplitEquivalence eq;
    eq.unit_signature.resize(U);
    for (int u = 0; u < U; ++u) eq.unit_signature[u] = u == 0 ? 0 : u == U - 1 ? 3 : 1 + static_cast<int>(rng() % 2);
    if (trial % 2) std::fill(eq.unit_signature.begin() + 1, eq.unit_signature.end() - 1, 1);  // dense: one layer shape
    for (int r = 0; r < S; ++r) eq.device_class.push_back(trial % 3 == 0 ? static_cast<int>(rng() % 2) : 0);
    auto random_split = [&] {
      std::vector<int> cuts(U - 1);
      std::iota(cuts.begin(), cuts.end(), 1);
      std::shuffle(cuts.begin(), cuts.end(), rng);
      cuts.resize(S - 1);
      std::sort(cuts.begin(), cuts.end());
      Partition p;
      for (int k = 0; k < S; ++k) {
        p.first_unit.push_back(k == 0 ? 0 : cuts[k - 1]);
        p.last_unit.push_back(k + 1 < S ? cuts[k] - 1 : U - 1);
        p.device_rank.push_back(k);
      }
      if (rng() % 2) std::shuffle(p.device_rank.begin(), p.device_rank.end(), rng);
      return p;
    };
    const Partition a = random_split();
    const Partition b = rng() % 4 == 0 ? a : random_split();
    auto sig_counts = [&](const Partition& p, int k) {
      std::vector<int> c(4, 0);
      for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) ++c[eq.unit_signature[u]];
      return c;
    };
    std::vector<int> perm(S);
    std::iota(perm.begin(), perm.end(), 0);
    bool matched = false;
    do {
      bool ok = true;
      for (int k = 0; k < S && ok; ++k)
        ok = eq.device_class[a.device_rank[k]] == eq.device_class[b.device_rank[perm[k]]] &&
             sig_counts(a, k) == sig_counts(b, perm[k]);
      matched = matched || ok;
    } while (!matched && std::next_permutation(perm.begin(), perm.end()));
    const bool identical = a.first_unit == b.first_unit && a.device_rank == b.device_rank;
    const Sameness want = identical ? Sameness::identical : matched ? Sameness::equivalent : Sameness::different;
    const Sameness got = ppb::balance::compare_splits(a, b, eq);
    ASSERT_EQ(static_cast<int>(got), static_cast<int>(want)) << "trial " << trial;
    ++seen[static_cast<int>(got)];
  }
  // Every outcome occurred often enough for the comparison to mean something.
  for (int k = 0; k < 3; ++k) EXPECT_GE(seen[k], 100) << "outcome " << k;
}

}  // namespace
