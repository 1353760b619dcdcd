// Internal to src/balance: the prefix sums and per-stage constants that solve_dp, solve_fast and
// the evaluators share, so that all of them compute bit-identical stage times.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "balance/solver.h"

namespace ppb::balance::detail {

/// A problem prepared for one device order: stage k uses row row_of[k] and memory cap[k].
struct Prepared {
  int U = 0, S = 0;
  bool overlap = true;
  std::vector<int> order;                     ///< [S] device per stage
  std::vector<int> slot_of;                   ///< [S] index into `prefix` of stage k's row
  std::vector<std::vector<double>> prefix;    ///< [distinct rows in use][U+1]
  std::vector<double> fixed;                  ///< [distinct rows in use] the row's stage_fixed_ms
  std::vector<int64_t> mem_prefix;            ///< [U+1] weights + KV cache
  std::vector<int64_t> mem_cap;               ///< [S] bytes; INT64_MAX = unlimited
  /// [distinct links in use][U-1] ms: the transfer time of every unit boundary over one link
  /// (one {bandwidth, latency} of pair_link). One row per distinct link, not per stage boundary:
  /// a row per boundary held [S-1][U-1] doubles, 0.8 GB at 100,000 units on 1,024 stages, even
  /// when every boundary crosses the same link (issue 34).
  std::vector<std::vector<double>> xfer_rows;
  /// [S-1] index into `xfer_rows` of the boundary after stage k (link order[k] -> order[k+1])
  std::vector<int> xfer_slot_of;
  double eps = 0.0;                           ///< tolerance of the spread pass (1e-12 * scale)

  /// Compute of stage k over units [j, i): the prefix-sum difference plus the row's fixed cost.
  double compute(int k, int j, int i) const { return (prefix[slot_of[k]][i] - prefix[slot_of[k]][j]) + fixed[slot_of[k]]; }
  /// Transfer in of stage k starting at unit j (boundary j-1 over the link from stage k-1), ms.
  double t_in(int k, int j) const { return k > 0 ? xfer_rows[xfer_slot_of[k - 1]][j - 1] : 0.0; }
  /// Transfer out of stage k ending before unit i (boundary i-1 over the link to stage k+1), ms.
  double t_out(int k, int i) const { return k < S - 1 ? xfer_rows[xfer_slot_of[k]][i - 1] : 0.0; }
  /// Stage time of stage k over units [j, i) (j < i).
  double time(int k, int j, int i) const { return stage_time(compute(k, j, i), t_in(k, j), t_out(k, i), overlap); }
  bool mem_ok(int k, int j, int i) const { return mem_prefix[i] - mem_prefix[j] <= mem_cap[k]; }
};

/// Validates the problem and the order, and builds the prefix sums.
/// @throws ppb::UserError on a malformed problem or order.
Prepared prepare(const BalanceProblem& problem, const std::vector<int>& order);

/// A partition from stage start positions ([S], starts[0] = 0) on `order`, evaluated.
Partition make_partition(const BalanceProblem& problem, const Prepared& pp, const std::vector<int>& starts,
                         const std::string& algorithm);

/// Throws the UserError of diagnose_infeasible (a split must not exist).
[[noreturn]] void throw_infeasible(const BalanceProblem& problem, const std::vector<int>& order);

}  // namespace ppb::balance::detail
