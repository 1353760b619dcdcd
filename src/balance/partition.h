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

  /// [S] tensor-parallel width of each stage (issue 14): stage k runs on the ranks
  /// device_rank[k], ..., device_rank[k] + width(k) - 1 (a group of one node); empty = width 1
  /// everywhere, one rank per stage.
  std::vector<int> tp_width;

  /// M request groups in flight this split runs (issue 36: `run --plan` measures one layout at
  /// several M); 0 = the run's (workload M). Splits of different M are different measurements.
  int groups = 0;

  /// The serving scenario's step policy this measurement runs (`run --step-policy A,B`: every
  /// split again under each further policy, serving/scheduler.h's names); "" = the scenario's.
  /// Splits under different policies are different measurements.
  std::string step_policy;
  /// Likewise its pipeline schedule (`run --pp-schedule groups,batch-queue`); "" = the scenario's.
  std::string pp_schedule;

  /// R pipelines of this layout side by side (issue 49: `run --plan` measures the planner's
  /// replicated points): replica r runs on the ranks r x ranks_per_replica() .. (r + 1) x
  /// ranks_per_replica() - 1, each stage on device_rank[k] + r x ranks_per_replica() (device_rank
  /// and tp_width are replica 0's). 1 = one pipeline. Splits of different R are different
  /// measurements.
  int replicas = 1;

  int num_stages() const { return static_cast<int>(first_unit.size()); }
  /// The ranks one replica spans: the widths' sum (a pipeline's ranks are contiguous).
  int ranks_per_replica() const;
  int width(int stage) const { return tp_width.empty() ? 1 : tp_width[stage]; }
  /// Whether some stage is wider than one rank.
  bool tensor_parallel() const;
  /// The first rank of stage k of replica `replica`: replica x ranks_per_replica() + device_rank[k].
  int first_rank(int replica, int stage) const { return replica * ranks_per_replica() + device_rank[stage]; }
  /// [S] the ranks of each stage of replica `replica` (in [0, replicas)), in group-rank order.
  std::vector<std::vector<int>> stage_ranks(int replica = 0) const;
  int units_in(int stage) const { return last_unit[stage] - first_unit[stage] + 1; }
  /// "5,6,5,6" style unit counts per stage.
  std::string counts_string() const;
};

/// Fills predicted_stage_ms, bottleneck_ms and spread_ms of `p` from per-device unit costs:
/// stage k costs sum(cost[device_rank[k]][first..last]).
/// cost: [devices][units] ms. @throws ppb::InternalError on size mismatch.
void evaluate(Partition& p, const std::vector<std::vector<double>>& cost);

/// What makes two stages interchangeable: the signature of every unit (units of one signature
/// cost the same; model::ModelSpec) and a class per device rank (ranks of one class are
/// identical devices: same node, device model, CPU quota and compute threads). Empty vectors:
/// nothing is interchangeable, only identical splits are the same.
struct SplitEquivalence {
  std::vector<int> unit_signature;  ///< [U]
  std::vector<int> device_class;    ///< [R] equal values = identical devices
  /// Each boundary has its own link (several nodes): a stage's position then decides which link
  /// its boundaries cross, so only swaps of identical devices in place are equivalent (stage k of
  /// one split and stage k of the other: the same device class and signature counts).
  bool stage_order_matters = false;
};

enum class Sameness {
  different,
  identical,   ///< the same units on the same device order
  equivalent,  ///< the same stages up to order: equal up to swapping identical devices
};

/// Whether splits `a` and `b` run the same stages (issue 13, "say what is the same") at the same
/// M and replica count (Partition::groups, replicas: a different one is always different):
/// identical (first/last units, device order and tensor-parallel widths), or, without tensor
/// parallelism in either, with `eq` filled, equivalent: a one-to-one
/// matching of their stages such that matched stages hold the same number of units of every
/// signature on devices of one class. Then every stage of one split has a twin in the other with
/// the same predicted cost (e.g. 7,6,5,6 and 7,5,6,6 of identical layers on identical cores), and
/// under the run's one-link transfer model (every boundary carries the same activation bytes over
/// one measured link) the pipelines differ only in which identical device runs which stage.
/// Decided by sorting each split's stages by (device class, signature counts) and comparing
/// (stage by stage, unsorted, with eq.stage_order_matters).
/// @throws ppb::InternalError if eq's vectors are too short for the splits' units or ranks.
Sameness compare_splits(const Partition& a, const Partition& b, const SplitEquivalence& eq = {});

/// Index of the first of `parts[0 .. i)` that is the same split as parts[i] (compare_splits:
/// identical, or equivalent given `eq`), or -1: a split is benchmarked once, however many
/// solvers return it.
int same_split_as(const std::vector<Partition>& parts, size_t i, const SplitEquivalence& eq = {});

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
