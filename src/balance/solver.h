// The general exact balancer (DESIGN.md §6): heterogeneous devices, memory limits, boundary
// transfers, device order, spread tie-break — as an O(U^2 S) DP and as a fast probe-based
// parametric search that returns the same optimum.
//
// Model. U units, S stages, D devices. Stage k runs the non-empty contiguous units [a, b] on
// device order[k]; its time is
//     stage_time(compute, t_in, t_out) = max(compute, t_in, t_out)   with overlap
//                                      = compute + t_in + t_out      without
// where compute = sum of the device's cost row over [a, b] (ms), t_in = transfer time of
// boundary a-1 (0 for stage 0) and t_out = transfer time of boundary b (0 for the last stage):
// with overlap the recv, compute and send lanes run concurrently (DESIGN.md §2), without it they
// share one lane. transfer(boundary) = messages * latency + activation bytes / bandwidth.
// Its memory is sum(weight_bytes + kv_bytes) over [a, b] and must be <= the device's memory.
// Objective: minimise the bottleneck max_k stage time; among optimal splits, minimise the
// spread max_k - min_k (by maximising the minimum stage time under the optimal bottleneck).
//
// Pure C++: no MPI, CUDA or HDF5 here (DESIGN.md §5).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "balance/partition.h"

namespace ppb::balance {

/// Everything the balancer knows about one model on one set of devices.
struct BalanceProblem {
  /// [R][U] ms: cost of every unit on a device of row r (e.g. prefill + G x decode). R >= 1.
  std::vector<std::vector<double>> cost;
  /// [R] ms a stage on a device of row r costs once, besides its units' `cost` (a forward's fixed
  /// cost, issue 47: kernel launches, a CUDA graph's replay, the lane's events): a stage of units
  /// [a, b] on row r costs stage_fixed_ms[r] + sum cost[r][a..b]. Empty = 0. Entry r must be
  /// finite and >= -min_u cost[r][u] (a one-unit stage costs >= 0); problem_from_run fills it with
  /// the profile's fixed cost and takes it off each unit's cost (apply_stage_fixed).
  std::vector<double> stage_fixed_ms;
  /// [D] row of `cost` used by device d (device classes: identical devices share a row).
  /// Empty: D = R and device d uses row d.
  std::vector<int> device_row;
  /// [U] bytes of weights resident on the stage holding unit u; empty = 0.
  std::vector<int64_t> weight_bytes;
  /// [U] bytes of KV cache of unit u for the workload; empty = 0.
  std::vector<int64_t> kv_bytes;
  /// [D] bytes available on device d for weights + KV cache; empty or <= 0 = unlimited.
  std::vector<int64_t> device_memory_bytes;
  /// [U-1] bytes crossing the boundary after unit u (between u and u+1) per unit of cost
  /// (e.g. prefill + G decode steps); a [U] vector is accepted and its last entry ignored.
  /// Empty = 0 bytes (only latency is paid).
  std::vector<double> activation_bytes;
  double link_bandwidth_GBps = 0.0;  ///< GB/s (1e9 bytes/s) of a stage-to-stage link; <= 0 = infinite
  double link_latency_us = 0.0;      ///< per message, microseconds
  /// [D][D] the link from device d to device e (row-major, d * D + e), where boundaries differ
  /// (issue 16: shared memory inside a node, the network between nodes): the boundary between a
  /// stage on d and the next on e costs its bytes over pair_bandwidth_GBps[d][e] (<= 0 =
  /// infinite) plus messages x pair_latency_us[d][e]. NaN entries, or empty vectors, take
  /// link_bandwidth_GBps / link_latency_us.
  std::vector<double> pair_bandwidth_GBps, pair_latency_us;
  double messages_per_boundary = 1;  ///< messages per unit of cost (e.g. G + 1 steps); scales latency
  bool overlap = true;               ///< transfers on their own lanes (max) or on the compute lane (sum)
  std::vector<std::string> unit_names;  ///< [U] for messages ("embed", "layer.3"); empty = "unit u"

  int units() const { return cost.empty() ? 0 : static_cast<int>(cost[0].size()); }
  int devices() const { return device_row.empty() ? static_cast<int>(cost.size()) : static_cast<int>(device_row.size()); }
  int row_of(int device) const { return device_row.empty() ? device : device_row[device]; }
  /// stage_fixed_ms of row r; 0 where empty.
  double fixed_of_row(int r) const { return stage_fixed_ms.empty() ? 0.0 : stage_fixed_ms[r]; }
};

/// Which exact algorithm to run.
enum class SolverKind {
  automatic,  ///< fast when its precondition holds (uniform boundary transfers), else dp
  dp,         ///< O(U^2 S) dynamic programme
  fast,       ///< probe-based parametric search, O(S log U) per probe (see solve_fast)
};

/// Stage time of a stage (see the file comment). The single definition every solver and
/// evaluator uses, so that all of them compare bit-identical values. ms.
inline double stage_time(double compute, double t_in, double t_out, bool overlap) {
  if (overlap) {
    const double t = t_in > t_out ? t_in : t_out;
    return compute > t ? compute : t;
  }
  return (compute + t_in) + t_out;
}

/// Checks shapes and values; names the offending field and index.
/// @throws ppb::UserError (ragged rows, negative/NaN costs, bad sizes, bad device_row index,
///         negative bytes, negative latency).
void validate_problem(const BalanceProblem& p);

/// The link from device `from` to device `to` as the transfers see it: {bandwidth GB/s, latency
/// us}, the pair's where the problem gives one (not NaN), else link_bandwidth_GBps /
/// link_latency_us (also when from or to is < 0). The one lookup of every solver and evaluator.
std::pair<double, double> pair_link(const BalanceProblem& p, int from, int to);

/// [U-1] ms: transfer time of each boundary = messages * latency + bytes / bandwidth, over the
/// link from device `from` to device `to` (pair_bandwidth_GBps / pair_latency_us where given),
/// or over link_bandwidth_GBps / link_latency_us when from or to is < 0.
std::vector<double> boundary_transfer_ms(const BalanceProblem& p, int from = -1, int to = -1);

/// True when every boundary costs the same transfer time (bit-identical) over every link, the
/// precondition of solve_fast; always true with U <= 2 or without activation bytes and latency.
bool uniform_transfers(const BalanceProblem& p);

/// Fills p.predicted_stage_ms (stage_time on device p.device_rank[k], with transfers and the
/// row's stage_fixed_ms),
/// p.bottleneck_ms and p.spread_ms. @throws ppb::InternalError on a malformed partition.
void evaluate(const BalanceProblem& problem, Partition& p);

/// [S] ms: each stage's boundary transfers as evaluate() counts them, without its compute (its
/// units and its stage_fixed_ms):
/// stage_time(0, t_in, t_out, overlap), i.e. max(t_in, t_out) with overlap, t_in + t_out
/// without. evaluate()'s stage time is then with_transfers(compute, this, overlap): a modelled
/// compute (balance/contention.h) takes the profile's place in it.
/// @throws ppb::InternalError on a malformed partition (as evaluate).
std::vector<double> stage_transfer_ms(const BalanceProblem& problem, const Partition& p);

/// A stage's time from its compute and its stage_transfer_ms entry (ms): max with overlap,
/// sum without; equal to stage_time(compute, t_in, t_out, overlap).
inline double with_transfers(double compute, double transfers, bool overlap) {
  return overlap ? (compute > transfers ? compute : transfers) : compute + transfers;
}

/// [S] bytes (weights + KV cache) of each stage of `p`.
std::vector<int64_t> stage_memory_bytes(const BalanceProblem& problem, const Partition& p);

/// The identity order 0..S-1 after checking S against units and devices.
/// @throws ppb::UserError if stages < 1, stages > units or stages > devices.
std::vector<int> rank_order(const BalanceProblem& problem, int stages);

/// Exact min–max split for the device order `order` ([S] distinct device indices): minimal
/// bottleneck, then minimal spread, every stage within its device's memory.
/// kind = automatic picks fast when uniform_transfers() holds, else dp; Partition::algorithm
/// says which ran ("dp" or "fast"); Partition::solver is "balanced".
/// @throws ppb::UserError if no split fits the memory limits (the message says which limit
///         binds: one unit larger than a device, the total, or the order of the devices), for a
///         malformed problem, or for kind = fast without uniform transfers.
Partition solve(const BalanceProblem& problem, const std::vector<int>& order,
                SolverKind kind = SolverKind::automatic);

/// The exact DP for any boundary transfers:
///   f[k][i] = min_{j<i} max(f[k-1][j], time_k(j, i))   (infeasible memory: +inf), B* = f[S][U];
///   g[k][i] = max_{j<i, time_k(j,i) <= B*+eps} min(g[k-1][j], time_k(j, i))  (spread pass),
/// the source article's min–max DP extended as in partition.h. O(U^2 S) time, O(U S) memory.
Partition solve_dp(const BalanceProblem& problem, const std::vector<int>& order);

/// Fast exact solver (uniform boundary transfers). Parametric search on the bottleneck B over
/// prefix sums, after Pinar & Aykanat, "Fast optimal load balancing algorithms for 1D
/// partitioning", JPDC 64(8), 2004 (exact bisection, "EBS"): a probe(B) computes the set of
/// unit positions reachable after each stage when every stage time is <= B (an interval list:
/// with heterogeneous rows, memory limits and non-empty stages it may have holes), in
/// O(S log U) when it has none; an infeasible probe raises the lower bound to the smallest
/// stage time that exceeded B during the probe (the next breakpoint), a feasible one lowers
/// the upper bound to the bottleneck of the split found, so the bounds meet at B* exactly.
/// The spread pass runs the same search on the smallest stage time L with every stage in
/// [L, B*+eps]. Same B* (bit-identical) and same minimal spread as solve_dp.
/// @throws ppb::UserError without uniform transfers, or as solve.
Partition solve_fast(const BalanceProblem& problem, const std::vector<int>& order);

/// Explains why no split of `order` fits the memory limits: the binding limit (a unit larger
/// than every device of the order, total bytes over total memory, or the devices' order and
/// contiguity). Returns "" when a split exists.
std::string diagnose_infeasible(const BalanceProblem& problem, const std::vector<int>& order);

/// How the device order of the pipeline is chosen.
enum class OrderMode {
  rank,  ///< stage k on device k
  automatic,  ///< search: every distinct permutation of device classes when D <= 8, else
              ///< every permutation of contiguous blocks of identical devices (up to 8 classes)
};

/// Solves `stages` stages over the problem's devices, choosing the order by `mode`; the result's
/// device_rank is the order found. Among orders with the same bottleneck and spread (within
/// 1e-12 relative), the one closest to rank order (first enumerated) wins. Devices are
/// identical (one class) when their cost row and memory are equal and, with pair links, their links
/// to every other device (the devices of one node).
/// @throws ppb::UserError as solve(), when stages > devices, or when no order is feasible.
Partition solve_with_order(const BalanceProblem& problem, int stages, OrderMode mode,
                           SolverKind kind = SolverKind::automatic);

}  // namespace ppb::balance
