// The balancer's problem, built in one place: what `ppbench run` solves on rank 0 and what
// `ppbench balance FILE.h5` rebuilds offline from the run's file are the same function of the
// same RunRecord (the run's in-memory record, or the one read back by results/reader), so the
// two cannot disagree (DESIGN.md §6).
//
// Pure C++ (no MPI, device or HDF5): depends on model-free data only.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "balance/solver.h"
#include "common/dtype.h"
#include "common/transfer.h"  // boundary_message_bytes, link_transfer_ms
#include "results/run_record.h"

namespace ppb::balance {

/// What one unit of stage cost is (`--objective`).
enum class Objective {
  workload,  ///< a group's whole life: prefill + G decode steps (default)
  decode,    ///< one decode step (steady-state throughput)
  prefill,   ///< one prefill step (TTFT)
};

/// "workload" | "decode" | "prefill" -> Objective.
/// @throws ppb::UserError naming --objective and the valid values.
Objective parse_objective(const std::string& name);

/// The name parse_objective() reads.
const char* objective_name(Objective o);

/// Cost of one unit in the objective's terms, ms: prefill_ms + gen_len·decode_ms (workload),
/// decode_ms, or prefill_ms. The one definition the run's profile table (cost_ms) and every
/// problem use.
double objective_cost(Objective o, double prefill_ms, double decode_ms, int gen_len);

/// Tokens per sequence that cross a stage boundary per unit of cost: P + G (workload), 1
/// (decode), P (prefill).
int objective_tokens(Objective o, int prompt_len, int gen_len);

/// Messages per boundary per unit of cost: G + 1 (workload: the prefill and each decode step),
/// else 1.
int objective_messages(Objective o, int gen_len);

/// The run's element type, from its record's dtype name (WorkloadInfo::dtype, as parse_dtype
/// reads it). @throws ppb::UserError naming /config/workload dtype and the valid names.
DType workload_dtype(const WorkloadInfo& w);

/// A run's links as the balancer and the simulator use them (issue 16): [R][R] row-major,
/// latency (s) and bandwidth (bytes/s) of each rank pair, one value per pair of nodes (nodes:
/// /ranks/hostname): the median over that node pair's measured rank pairs (within a node
/// likewise), so that ranks of one node stay interchangeable (--order auto) and one noisy pair
/// does not steer the split. A pair of nodes without a measurement takes the slowest measured
/// pair of nodes; NaN only within a node without one. Empty when the ranks
/// share one node or the record has no link matrix: then the one link (ranks 0 <-> 1) serves
/// every boundary, as before the matrix.
struct PairLinks {
  std::vector<double> latency_s, bandwidth_Bps;
  /// The link from rank `from` to rank `to` of `ranks` ranks, {latency s, bandwidth B/s}, where
  /// measured; nullopt where not (NaN, a rank out of range, or no matrix: one node), and the
  /// caller's one link serves. The one lookup of the run's and the offline simulators.
  std::optional<std::pair<double, double>> measured(int from, int to, size_t ranks) const;
};
PairLinks node_pair_links(const RunRecord& run);

/// Copies of each item's output one sending rank of a stage of width `from_width` sends to the
/// next stage of width `to_width`: ceil(to / from) (pipeline.h layout_placement: a narrower
/// sender gives every receiver a full copy, one after the other; each link carries one copy).
int handoff_copies(int from_width, int to_width);

/// The balancer's problem of `run` for objective `o`:
///  - cost [R][U] = objective_cost of each rank's own profile row (/profile/latency_ms); where
///    the profile took a forward's fixed cost (/profile/step_model fixed_taken), its
///    objective_cost of the prefill and decode F apart: apply_stage_fixed (stage_fixed_ms [R]);
///  - weight_bytes, kv_bytes [U] = /profile/unit_weight_bytes, unit_kv_bytes;
///  - device_memory_bytes [R] = each rank's memory limit (when every rank has one > 0) less its
///    stage_scratch_bytes (the scratch of the largest possible stage), at least 1;
///  - activation_bytes [U-1] = B · objective_tokens · hidden_size · dtype bytes (the hidden
///    states of every sequence of a group crossing the boundary per unit of cost);
///  - messages_per_boundary = objective_messages; link = the run's measured latency (s -> us)
///    and bandwidth (B/s -> GB/s); on several nodes, pair links = node_pair_links (each
///    boundary over its own devices' link); overlap as the run.
/// Needs run.profile (unit names, latency_ms, byte tables), run.workload, run.ranks,
/// run.model_attrs_num["hidden_size"] (0 or absent: no activation bytes) and the link.
/// @throws ppb::UserError when the record lacks a profile or its tables disagree in size.
BalanceProblem problem_from_run(const RunRecord& run, Objective o);

/// Takes a forward's fixed cost apart from the units' costs (issue 47; stepcost::FixedCost):
/// `p.cost` holds one-unit timings, each of which carries the fixed cost once. For each row r
/// with F = min(fixed_per_row[r], min_u p.cost[r][u]) (the cap keeps every unit's cost less F
/// >= 0, so stage times stay monotone in their units: the solvers' precondition), every
/// p.cost[r][u] -= F and p.stage_fixed_ms[r] = F, replacing what it held. A stage of n units on
/// row r then costs sum(its timings) - (n - 1)·F, the closed predictions' rule
/// (results/profile_step_fit.h stage_fixed_ms), wherever F is below the row's cheapest unit.
/// An empty or all-zero `fixed_per_row` leaves `p` as it is.
/// @throws ppb::InternalError when fixed_per_row is neither empty nor one value per cost row.
void apply_stage_fixed(BalanceProblem& p, const std::vector<double>& fixed_per_row);

/// How a split is made: `run --partition` and `ppbench balance --solver/--partition`, and the
/// name a partition carries in the results file.
enum class Method {
  uniform,   ///< equal layer counts (solve_uniform)
  seed,      ///< the source article's DP over one latency row (solve_seed)
  balanced,  ///< the exact solver: per-device rows, memory, transfers, device order
  manual,    ///< a given split "5,6,5,6"
};

/// "uniform" | "seed" | "balanced" | "manual" -> Method. @throws ppb::UserError naming the valid values.
Method parse_method(const std::string& name);

/// The name parse_method() reads.
const char* method_name(Method m);

/// What make_split() makes.
struct SplitRequest {
  Method method = Method::balanced;
  int stages = 1;
  OrderMode order = OrderMode::rank;                       ///< balanced only
  SolverKind kind = SolverKind::automatic;                 ///< balanced only
  UniformRemainder remainder = UniformRemainder::first;    ///< uniform only
  std::string manual;                                      ///< manual only: units per stage
};

/// Makes the split `r` asks for on `problem` and evaluates it (predicted stage times with the
/// problem's transfers, bottleneck, spread); Partition::solver = method_name(r.method). Stage k
/// runs on device k except for balanced with OrderMode::automatic. Seed uses the row of device 0.
/// @throws ppb::UserError as the solver it calls (stages out of range, no split fits memory,
///         a malformed manual split).
Partition make_split(const BalanceProblem& problem, const SplitRequest& r);

}  // namespace ppb::balance
