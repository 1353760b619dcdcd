// Contiguous stage partitions of a unit list and the solvers that produce them.
//
// A partition of U units into S stages: stage k runs units [first_unit[k], last_unit[k]]
// (inclusive) on pipeline device device_rank[k]; every stage holds >= 1 unit; every unit is in
// exactly one stage; stages are in unit order.
//
// Pure C++: no MPI, CUDA or HDF5 here (DESIGN.md §5).
#pragma once

#include <string>
#include <vector>

namespace ppb::balance {

struct Partition {
  std::string solver;                    ///< "uniform", "seed", "balanced", "manual"
  std::string algorithm;                 ///< how it was found: "dp", "fast", "counts" (uniform/manual)
  std::vector<int> first_unit;           ///< [S]
  std::vector<int> last_unit;            ///< [S] inclusive
  std::vector<int> device_rank;          ///< [S] rank that runs stage k (identity order for now)
  std::vector<double> predicted_stage_ms;  ///< [S] cost of each stage on its device (ms)
  double bottleneck_ms = 0.0;            ///< max of predicted_stage_ms
  double spread_ms = 0.0;                ///< max - min of predicted_stage_ms

  int num_stages() const { return static_cast<int>(first_unit.size()); }
  int units_in(int stage) const { return last_unit[stage] - first_unit[stage] + 1; }
  /// "5,6,5,6" style unit counts per stage.
  std::string counts_string() const;
};

/// Fills predicted_stage_ms, bottleneck_ms and spread_ms of `p` from per-device unit costs:
/// stage k costs sum(cost[device_rank[k]][first..last]).
/// cost: [devices][units] ms. @throws ppb::InternalError on size mismatch.
void evaluate(Partition& p, const std::vector<std::vector<double>>& cost);

/// Index of the first of `parts[0 .. i)` with the same split as parts[i] (first/last units and
/// device order), or -1: a split is benchmarked once, however many solvers return it.
int same_split_as(const std::vector<Partition>& parts, size_t i);

/// Checks the invariants (S >= 1, contiguous, non-empty, covers [0, units)).
/// @throws ppb::InternalError naming the broken invariant.
void check_partition(const Partition& p, int units);

/// Where solve_uniform puts the L % S remainder layers (frameworks disagree).
enum class UniformRemainder {
  first,   ///< one each to the first stages (the default: the last stage carries the head)
  last,    ///< one each to the last stages
  spread,  ///< evenly spaced: layer-stage k gets floor((k+1)L/S) - floor(kL/S) layers
};

/// Parses "first" | "last" | "spread". @throws ppb::UserError naming the valid values.
UniformRemainder parse_uniform_remainder(const std::string& text);

/// The baseline every framework ships: equal decoder-layer counts per stage. Units are
/// embed, L layers, head (units = L + 2). The embed joins stage 0 and the head the last stage;
/// when L % S != 0 the remainder layers go one each to the FIRST stages (the last stage
/// already carries the head, the heaviest unit of modern large-vocabulary models), or as
/// `remainder` says. When S > L, the embed and/or head become stages of their own so that no
/// stage is empty.
/// @throws ppb::UserError if stages < 1 or stages > units.
Partition solve_uniform(int units, int stages, UniformRemainder remainder = UniformRemainder::first);

/// The source article's min–max DP over one latency row:
///   dp[i][k] = min_j max(dp[j][k-1], sum(lat[j:i]))
/// (minimal bottleneck of the first i units on k stages); ties broken towards the
/// smallest max-min spread. lat: [units] ms. O(U^2 S).
/// @throws ppb::UserError if stages < 1 or stages > units.
Partition solve_seed(const std::vector<double>& lat, int stages);

/// Heterogeneous exact solver: stage k runs on device k and costs the sum of row
/// cost[k] over its units; minimises the bottleneck, then, among optimal splits, the max-min
/// spread. cost: [stages][units] ms (one row per pipeline device). O(U^2 S) per spread probe.
/// @throws ppb::UserError if stages < 1 or stages > units, or cost.size() != stages.
Partition solve_balanced(const std::vector<std::vector<double>>& cost, int stages);

/// Parses and validates a manual split "5,6,5,6" (units per stage).
/// @throws ppb::UserError if not a comma-separated list of positive integers, if its length
///         != stages, or its sum != units (the message gives both numbers).
Partition parse_manual(const std::string& text, int units, int stages);

}  // namespace ppb::balance
