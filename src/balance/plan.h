// The deployment planner (issue 36, offline part): for N devices like a results file's rank 0,
// every layout (stage count S, the tensor-parallel width of each stage, the layout's exact
// split, M groups in flight), each predicted by the run's own model (balance::Predictor: the
// profile's step times, through the contention model where ranks share a machine, played by
// the pipeline simulator, fill and drain included), their Pareto front of tokens/s per device
// against tokens/s per user, and the best layout under latency targets.
//
// Pure C++ (no MPI, device or HDF5): functions of a RunRecord.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "balance/partition.h"
#include "results/run_record.h"

namespace ppb::balance {

/// What plan_layouts searches.
struct PlanRequest {
  int devices = 1;  ///< N identical devices (like the file's rank 0); >= 1
  /// Largest M as a multiple of the stage count: M = 1 .. max(1, groups_per_stage x S).
  int groups_per_stage = 2;
  /// > 0: only M = groups, for every layout (groups_per_stage ignored): `--tp auto` ranks the
  /// layouts at the run's own M.
  int groups = 0;
  /// Every composition of N into stage widths is evaluated when there are at most this many
  /// (mode "every layout"); beyond, per stage count only the widths with the smallest bottleneck
  /// (mode "per stage count, the smallest bottleneck"; plan_layouts' comment).
  std::size_t max_layouts = 256;
  /// Latency targets (ms; <= 0 = none) best_under_slo will be asked about: a candidate is not
  /// simulated when bounds prove it is neither on the front, nor the best under them, nor the
  /// closest to them (plan_layouts' comment). prune = false simulates every candidate.
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  bool prune = true;
  /// false: only the best under the targets is wanted (not the front, not the closest), and the
  /// pruning keeps only what could be it (`plan`'s N + 1 devices).
  bool need_front = true;
  /// Replicas R (data parallelism, issue 49): the N devices as R identical pipelines of N / R
  /// devices each, the requests spread over them round-robin, so that every replica runs the
  /// same layout at the same load: the layout's tokens/s (and decode tokens/s) times R; tokens/s
  /// per device and per user, TTFT and TPOT are one replica's. Ranks of two replicas on one
  /// machine contend for its memory where the profile has two passes (CPU ranks sharing a machine;
  /// GPUs have one pass, their own memory): a stage whose twin in another replica shares its
  /// machine takes its together times (PlanRequest::beside, Predictor::twin_on_machine).
  /// 1: one pipeline of N devices (what `run --plan` and `--tp auto` measure); 0: every R that
  /// divides N and leaves each replica devices the model can use (`plan`'s default); > 1: that R
  /// only (it must divide N).
  int replicas = 1;
  /// The replicas this search's one pipeline runs beside (plan_layouts sets it to each R it
  /// searches): its stages' steps are predicted with their twins on the machines plan_record
  /// lays the N devices out on (device d on machine d / the file's ranks per machine); the
  /// candidates' figures stay one pipeline's. 1 = alone.
  int beside = 1;
};

/// One candidate deployment: a layout, its split and M, as predicted.
struct PlanCandidate {
  std::vector<int> widths;  ///< [S] tensor-parallel width of each stage (sum = N)
  int groups = 1;           ///< M groups in flight
  int batch = 1;            ///< B sequences per group (the file's)
  Partition split;          ///< first/last unit, device (first device of the stage), tp_width, stage costs (ms)
  double tokens_per_s = 0;  ///< simulated M·B·G / wall time of a repetition (DESIGN.md §3)
  double tokens_per_s_per_device = 0;  ///< tokens_per_s / N
  double ttft_p50_ms = 0, tpot_p50_ms = 0;  ///< simulated medians, ms
  double tokens_per_s_per_user = 0;    ///< 1000 / tpot_p50_ms: one sequence's decode rate
  int bottleneck_stage = 0;            ///< the simulated timeline's busiest stage (compute_metrics)
  double bottleneck_bound_tok_s = 0;   ///< the simulated decode bound (DESIGN.md §3)
  double decode_tokens_per_s = 0;      ///< simulated decode tokens/s
  std::vector<double> phase_ms;        ///< [S][2] predicted prefill and decode step per stage, ms
  std::string label;                   ///< plan_label(widths, groups, replicas): "PP2 M4", "TP2 M1", "DP2 PP2 tp2-1 M2"
  int replicas = 1;                    ///< R pipelines like this one (widths sum to N / R); figures above are all R's
};

/// What plan_layouts found.
struct PlanResult {
  int devices = 0;
  std::string mode;                       ///< "every layout" | "per stage count, the smallest bottleneck"
  std::size_t layouts_possible = 0;       ///< compositions of N into profiled widths (saturates at SIZE_MAX)
  std::size_t layouts_evaluated = 0;      ///< layouts whose split was solved
  std::size_t infeasible = 0;             ///< (layout, M) pairs that fit no split within memory
  std::size_t pruned = 0;                 ///< (layout, M) pairs not simulated: dominated by their bounds
  std::vector<PlanCandidate> candidates;  ///< every (layout, M) evaluated, in search order
  std::vector<std::size_t> front;         ///< indices of the Pareto front, tokens/s per user descending
  std::vector<std::string> warnings;      ///< the contention model's (distinct messages)
  std::vector<int> replica_counts;        ///< the R searched (PlanRequest::replicas), ascending
};

/// "PP{S}" (every stage width 1), "TP{w}" (one stage of width w), "PP{S} tp{w}" (every stage
/// width w), "PP{S} tp{w0}-{w1}-..." (mixed), then " M{groups}"; with replicas > 1, "DP{R} " first.
std::string plan_label(const std::vector<int>& widths, int groups, int replicas = 1);

/// The record of `devices` devices like `run`'s rank 0 running M = `groups` groups: rank 0's
/// RankInfo on every device (one device class), the devices in machines of as many as the file
/// has ranks on rank 0's machine (machine_id "plan-<k>": stages on one machine contend for its
/// memory as the file's did), each device's profile rows (together, alone, min, max, decode by
/// context, the step model's grid medians) rank 0's,
/// one profile per tensor-parallel width (the first of the file's groups of that width on rank
/// 0's class; widths above the machine size dropped), the KV bytes of every unit scaled from
/// the file's M to `groups` (ceil), the file's one link on every boundary (no link matrix).
/// @throws ppb::UserError when `run` has no profile, no ranks or no workload.
RunRecord plan_record(const RunRecord& run, int devices, int groups);

/// Ranks of `run` on rank 0's machine (at least 1): the devices per machine the planner lays
/// replicas out on (Predictor::set_devices_per_machine).
int machine_size(const RunRecord& run);

/// The search (issue 36). Layouts: compositions (w_0, ..., w_{S-1}) of N with every w_k in {1}
/// ∪ the profiled widths, a group never across two machines, S <= units. Split: the exact
/// balanced split of the layout's problem (layout_problem + make_layout_split: the run's
/// `--tp a,b --partition balanced`), within each group's memory (width x the rank's limit less
/// its scratch) for the weights and the KV cache of M·B sequences of P+G tokens; re-solved at an
/// M where the smaller M's split does not fit, and the layout dropped from the first M none fits.
/// M = 1 .. groups_per_stage x S. Each candidate: Predictor::predicted_phases on plan_record's
/// profile, then Predictor::simulate (the functions `ppbench simulate` uses).
/// With more compositions than req.max_layouts, per stage count S only the widths whose best
/// split has the smallest bottleneck stage time (objective ms, stage_time with the one link),
/// ties to the lexicographically smallest widths: a DP over (stages, devices, units placed); the
/// others are not simulated (pruned by the balancer's objective, not by simulated dominance).
/// Then, with req.prune, the (layout, M) pairs are simulated in order of their tokens/s bound,
/// and one is skipped when a simulated one beats its bounds: tokens/s <= M·B·G / wall, wall >=
/// Σ p_k + G·Σ d_k (one group's steps cross every stage in turn) and, for every pair of stages
/// i, j (every stage serves its M prefills before any decode step: the items' static order),
/// Σ_{l<i} p_l + M·p_i + Σ_{i<l<=j} p_l + M·G·d_j + Σ_{l>j} d_l for i <= j (stage j's decode
/// steps wait for the last prefill to leave stage i and reach j), Σ_{l<i} p_l + M·p_i +
/// Σ_{l>i} p_l + Σ_{l<j} d_l + ((G-1)·M + 1)·d_j + Σ_{l>j} d_l for i > j (its last group's
/// decode steps wait for its first token), TTFT >= Σ p_k, TPOT >=
/// max(Σ d_k, M · min(p_last, d_last)) (a token's next step crosses every stage; the last stage
/// computes M items between two tokens of one group), p_k, d_k the stage's profile sums (the
/// smaller of its two passes: the contention model's step lies between them). Skipped when some
/// simulated candidate is >= its tokens/s bound and its tokens/s-per-user bound (> in one: the
/// front loses nothing), one meeting the targets has at least its tokens/s bound or its bounds
/// miss them (not the best), and one meets them or its bounds' relaxation exceeds the smallest
/// so far (not the closest). Exact: the front and the choice are those of every candidate.
/// With replicas (req.replicas != 1): the search above for N / R devices, once per R, each
/// candidate scaled as PlanRequest::replicas says, every R's candidates in one list and one
/// front. Exact as well: tokens/s per device and per user, TTFT, TPOT and the relaxation are the
/// same for R replicas as for one, and tokens/s orders a replica count's candidates as it orders
/// them scaled, so what one R's search proves irrelevant is irrelevant among all.
/// @throws ppb::UserError on N < 1, no layout that fits memory, a record without a profile;
///         req.replicas < 0 or not dividing N; no R leaving each replica devices the model can use.
PlanResult plan_layouts(const RunRecord& run, const PlanRequest& req);

/// `text` ("auto" or a count R >= 1 dividing `devices`) as PlanRequest::replicas: auto 0, else R.
/// `devices_flag` names the device count in messages ("--devices", "the ranks").
/// @throws ppb::UserError naming --replicas, what it got and what is valid.
int parse_replicas(const std::string& text, int devices, const std::string& devices_flag);

/// PlanRequest::replicas for a search of `devices` devices asked with `replicas`: as asked, or 0
/// (every R) where a fixed R > 1 does not divide them (`plan`'s search of N + 1 devices).
int replicas_for(int devices, int replicas);

/// r.replica_counts as "1,2,4" (the header lines of `plan` and `plan --scenario`).
std::string replica_counts_text(const PlanResult& r);

/// The layout `run --tp auto` deploys (issue 36: the planner's ranking, not the bottleneck's).
struct LayoutRanking {
  PlanCandidate best;            ///< the most predicted tokens/s
  PlanCandidate min_bottleneck;  ///< the smallest bottleneck stage (what the balancer alone picks)
  std::size_t evaluated = 0;     ///< layouts simulated
};
/// Every layout of `devices` devices like `run`'s rank 0 at the run's own M (plan_layouts with
/// groups = M, every layout, unpruned), ranked by predicted tokens/s, fill and drain included:
/// the most wins; ties (relative 1e-9) to fewer stages, then the smaller bottleneck. The
/// bottleneck stage alone misranks where the fill and drain of M groups are a large share of a
/// repetition (issue 36: Qwen3-0.6B at M = 2, PP2's bottleneck 1641 ms < TP2's 2014 ms, yet TP2
/// measured 1.20x PP2's tokens/s). min_bottleneck: the smallest split.bottleneck_ms (ties to the
/// most tokens/s).
/// @throws ppb::UserError as plan_layouts (no layout fits memory, no profile).
LayoutRanking rank_layouts_by_tokens(const RunRecord& run, int devices);

class Predictor;
/// Bounds of what the simulator can predict for `split` on `rec` (plan_record's, at its M):
/// plan_layouts' comment says why they hold. tokens/s at most, TTFT and TPOT p50 at least (ms).
struct PlanBounds {
  double tokens_per_s_max = 0, ttft_min_ms = 0, tpot_min_ms = 0;
};
PlanBounds plan_bounds(const Predictor& pred, const RunRecord& rec, const Partition& split);

/// Indices of the candidates no other candidate dominates in (tokens/s per device, tokens/s per
/// user), both maximised: c is dominated when some d is >= in both and > in one. Equal points are
/// all kept. Sorted by tokens/s per user descending (then tokens/s per device descending). O(n log n).
std::vector<std::size_t> pareto_front(const std::vector<PlanCandidate>& c);

/// The best candidate under latency targets (ms; <= 0 = no target).
struct SloChoice {
  std::optional<std::size_t> best;  ///< most tokens/s among those meeting every target
  std::size_t closest = 0;          ///< without one: the smallest factor by which the targets would have to be relaxed
  double relax = 1.0;               ///< that factor: max(TTFT / target, TPOT / target) of `closest`
};
/// Empty `c`: no best, closest 0 (to be ignored).
SloChoice best_under_slo(const std::vector<PlanCandidate>& c, double slo_ttft_ms, double slo_tpot_ms);

}  // namespace ppb::balance
