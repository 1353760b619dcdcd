// RunRecord: everything one `ppbench run` measured, as assembled on rank 0. The HDF5 writer
// stores it (results/README.md documents the layout) and the summary prints it. Pure data.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/link_fit.h"
#include "common/stats.h"
#include "results/serving_record.h"

namespace ppb {

/// One level of a rank's cgroups that sets a CPU quota (common/host_conditions.h
/// cgroup_cpu_quotas).
struct QuotaLevel {
  std::string cgroup_id{};  ///< cgroup_identity of its directory, "<st_dev>:<st_ino>" ("" = stat failed)
  double cores = 0.0;       ///< quota / period
  std::string cgroup{};     ///< its directory, as the rank's mounts show it
  bool operator==(const QuotaLevel&) const = default;
};

struct RankInfo {
  std::string hostname, device_name, bus_id;
  int local_rank = 0;
  double clock_offset_s = 0.0;
  int64_t memory_limit_bytes = 0;  ///< weights + KV cache + scratch allowed on the rank (0 = unknown)
  /// Scratch of a stage holding every unit on the rank's backend, an upper bound of any stage's
  /// scratch: the balancer keeps it free out of memory_limit_bytes (0 = unknown, older files).
  int64_t stage_scratch_bytes = 0;
  /// Bytes the default limit keeps free for the tensor-parallel groups' communicators
  /// (run/memory_checks.h reserve_tp_communicators): already out of memory_limit_bytes; 0 = none.
  int64_t tp_reserve_bytes = 0;
  /// Ceilings measured at start-up (Device::measure_*; NaN = not measured, older files):
  /// streaming read GB/s with the machine's other ranks idle, and with every rank reading at
  /// once (what holds while every stage runs); GEMM GFLOP/s in the run's dtype.
  double read_bandwidth_GBps = std::numeric_limits<double>::quiet_NaN();
  double read_bandwidth_shared_GBps = std::numeric_limits<double>::quiet_NaN();
  double peak_gflops = std::numeric_limits<double>::quiet_NaN();
  /// Conditions (common/host_conditions.h): the CPUs the rank may run on as a cpulist ("" =
  /// not recorded), its cgroups' CPU quota in cores (NaN = none) and the CFS period it is
  /// enforced over in ms (NaN = none, or a file before it), the governor of its first CPU
  /// ("" = not exposed), and its compute threads (BLAS threads; 1 on a GPU; 0 = not recorded).
  std::string cpu_affinity{};
  double cpu_quota_cores = std::numeric_limits<double>::quiet_NaN();
  double cpu_quota_period_ms = std::numeric_limits<double>::quiet_NaN();
  /// The cgroup whose quota binds, as the rank's mounts show its directory, and its identity on
  /// the machine (cgroup_identity: "<dev>:<inode>"): ranks of one machine with one identity share
  /// one quota. "" = no quota, or a file before them.
  std::string cpu_quota_cgroup{};
  std::string cpu_quota_cgroup_id{};
  /// Every level of the rank's cgroups that sets a CPU quota (cgroup_cpu_quotas), the binding one
  /// (cpu_quota_cgroup) first: a level above it is shared with every rank below it, each held to its own
  /// tighter quota. Empty = no quota, or a file before them (then only the binding one is known).
  std::vector<QuotaLevel> cpu_quota_levels{};
  std::string cpu_governor{};
  int compute_threads = 0;
  /// The machine (MpiContext::machine_id: the kernel's boot id, or "host:<hostname>"); "" in
  /// files before it. Ranks of one machine share its memory bandwidth even on different MPI
  /// nodes (containers, network namespaces); see rank_machine.
  std::string machine_id{};
};

/// The machine a rank's memory traffic contends on: its machine_id, or for files before it
/// "host:<hostname>" (one machine per node, as MpiContext falls back to).
inline std::string rank_machine(const RankInfo& r) { return r.machine_id.empty() ? "host:" + r.hostname : r.machine_id; }

struct WorkloadInfo {
  int batch = 0, prompt_len = 0, gen_len = 0, microbatches = 0;
  std::string dtype;
  int warmup = 0, iters = 0, profile_warmup = 0, profile_iters = 0;
  bool overlap = true;
  uint64_t seed = 0;
  std::string objective;
  double target_ci_pct = 0.0, max_time_s = 0.0;  ///< --target-ci, --max-time (0: older files)
  bool cuda_graphs = true;       ///< CUDA decode replayed from graphs (--no-cuda-graphs: false; CPU: unused)
  /// How the profile was taken: "alone+together" (each unit timed with the machine's other ranks
  /// waiting, then with all ranks timing it at the same moment: --contention auto where a machine's
  /// ranks share memory, balance/contention.h) or "own pace" (one pass, every rank at its own
  /// pace: GPUs, one rank per machine, --contention off, and older files; "aligned" for older
  /// files made with --profile-aligned).
  std::string profile_passes = "own pace";
  /// Cycles of the whole profile whose medians latency_ms (and latency_alone_ms) average
  /// (--profile-repeats; 1 in older files).
  int profile_repeats = 1;
  double expert_skew = 0.0;      ///< --expert-skew (MoE routing; 0 = the router's own choice)
  /// In what order a two-pass profile timed its passes: "interleaved" (each cycle's iterations
  /// take turns forward by forward: every rank of a machine alone, then all together,
  /// ResidentProfiler::profile_interleaved) or "one pass after the other" (each pass times every
  /// unit's series before the next pass: where one unit of every signature did not fit at once);
  /// "" for a profile of one pass and in older files.
  std::string profile_order;
};

struct ProfileTable {
  std::vector<std::string> unit_name;       ///< [U]
  std::vector<int> unit_signature;          ///< [U]
  std::vector<std::string> signature_name;  ///< [signatures]
  std::vector<double> latency_ms;           ///< [world][U][2] median, phases prefill, decode
  std::vector<double> latency_min_ms;       ///< [world][U][2]
  std::vector<double> latency_max_ms;       ///< [world][U][2]
  /// [world][U][2] median with the machine's other ranks waiting (the profile's first pass where a
  /// machine's ranks share memory, balance/contention.h); latency_ms is then the second pass, every
  /// rank timing each unit at the same moment, and min/max span both passes. Empty for a profile
  /// of one pass (workload profile_passes "own pace") and in older files.
  std::vector<double> latency_alone_ms;
  /// [K][world][U][2] each profile cycle's medians (K = workload profile_repeats): latency_ms is
  /// their mean; latency_alone_cycles_ms the same of latency_alone_ms. Empty in older files.
  std::vector<double> latency_cycles_ms, latency_alone_cycles_ms;
  /// [K][world][U][2] profile cycles taken between the benchmark's rounds (issue 13; ppbench run
  /// --round-profile), every rank timing each unit at the same moment as in the together pass;
  /// latency_rounds_after[k]: the rounds done before cycle k. Empty without them (and in older
  /// files).
  std::vector<double> latency_rounds_ms;
  std::vector<int> latency_rounds_after;
  std::vector<int> decode_contexts;         ///< [C]
  std::vector<double> decode_context_ms;    ///< [world][U][C]
  std::vector<double> cost_ms;              ///< [world][U] the balancer's objective per unit
  std::vector<int64_t> unit_params;         ///< [U]
  std::vector<int64_t> unit_weight_bytes;   ///< [U] resident on the stage holding the unit
  std::vector<int64_t> unit_kv_bytes;       ///< [U] KV cache for M*B sequences of P+G tokens
  std::vector<double> unit_flops;           ///< [U][2] FLOP of one forward (model::unit_work)
  std::vector<double> unit_bytes;           ///< [U][2] bytes one forward moves (model::unit_work)
  /// [world][U][2] roofline_floor_ms of each unit with the rank's ceilings alone (the profile
  /// times units with the machine's other ranks idle); empty in older files.
  std::vector<double> floor_ms;
  /// Tensor parallelism (issue 14): each group of ranks a layout of the run needs, profiled
  /// together (the all-reduces inside every unit's forward): the ranks first_rank ..
  /// first_rank + width - 1, and the group's tables [U][2] (prefill, decode; rank first_rank's
  /// timings, the group's ranks run the same forwards in lockstep). Empty without --tp > 1.
  struct TpGroupProfile {
    int first_rank = 0;
    int width = 1;
    std::vector<double> latency_ms, latency_min_ms, latency_max_ms;  ///< [U][2]
    /// [signatures][N]: the step model's grid (step_rows ... below, the same N steps) timed on
    /// the group's shard of one unit of each signature at this width (rank first_rank's
    /// medians); empty where the profile timed no grid (and in older files).
    std::vector<double> step_ms;
    /// How many times the group timed its grid (one over kGridDisturbedError held out on its
    /// first rank is timed again, up to twice, keeping the attempt of the lowest error); 0
    /// without a grid and in older files.
    int step_attempts = 0;
  };
  std::vector<TpGroupProfile> tp;
  /// The step model's grid (issue 47, stepcost/step_model.h), timed after the cycles in the
  /// profile's together pass (or its one pass): N steps in stepcost::FlatGrid form (step n has
  /// step_rows[n] rows; their positions and token counts in step_pos / step_tokens, all steps'
  /// rows in order; step_role[n]: 0 knot, 1 context, 2 attention, 3 held out), step_ms
  /// [world][signatures][N] each rank's median of each step on one unit of each signature,
  /// step_by_rows [signatures] 1 where the signature's cost goes by rows (the head). Empty in
  /// older files and with --step-grid off.
  std::vector<int> step_rows, step_pos, step_tokens, step_role, step_by_rows;
  std::vector<double> step_ms;
  /// How many times the grid was timed (a disturbed grid is timed again: run/profile_phase.cpp
  /// time_step_grid; each rank kept its attempt of the lowest held-out error); 0 in older files.
  int step_attempts = 0;
  /// A forward's fixed cost (issue 47, stepcost::FixedCost; profile/profiler.h time_fixed_cost),
  /// timed before and after the grid: fixed_one_ms / fixed_two_ms [world][2][pairs] (per kind the
  /// first window's kFixedCostPairs pairs, then the second's) a one-unit stage of unit
  /// fixed_unit and a two-unit stage of it and the next, in pairs, kind 0 prefill (B rows of P
  /// tokens), 1 decode (B rows at the middle profiled context). Empty (fixed_unit -1) in older
  /// files, with --step-grid-iters 0, and for a model without two adjacent units of one signature.
  int fixed_unit = -1;
  std::vector<double> fixed_one_ms, fixed_two_ms;
};

struct PartitionRecord {
  std::string name;      ///< "uniform", "seed", "balanced", "manual"
  std::string solver;
  std::vector<int> first_unit, last_unit, device_rank;  ///< [S]; device_rank: the first rank of each stage
  /// [S] tensor-parallel width of each stage (its ranks: device_rank[k] .. + tp_width[k] - 1);
  /// all 1 without tensor parallelism (and in older files).
  std::vector<int> tp_width;
  /// The layout as --tp spells it: "1" (one rank per stage), "2", "2,1,1".
  std::string layout = "1";
  /// M request groups in flight this partition ran (/partitions/<name> attribute microbatches):
  /// the workload's, or its own for `run --plan`'s points (issue 36); the events' and tokens'
  /// group axis. 0 only before it is filled (the reader fills the workload's for older files).
  int groups = 0;
  /// R replicas of this layout measured side by side (balance::Partition::replicas; `run --plan`'s
  /// replicated points): the rates and latencies below are all R's (every replica's requests),
  /// the per-stage figures and `events` replica 0's. 1 = one pipeline (and in older files).
  int replicas = 1;
  /// R > 1: [reps][R][M][G+1][S][6] every replica's events (replica r's stage k on its own
  /// rank, rank 0's clock); empty with one replica.
  std::vector<double> replica_events;
  /// [S] copies of each item's output that one sending rank of stage k sends (the hand-off to
  /// stage k + 1; for the last stage, the token return to stage 0): ceil(width(k+1) / width(k))
  /// (pipeline.h layout_placement); each link carries one copy. Empty in older files.
  std::vector<int> handoff_copies;
  std::vector<double> predicted_stage_ms;               ///< [S] objective cost
  /// [S] the same cost from each unit's fastest / slowest timed forward (latency_min_ms /
  /// latency_max_ms): the profile's own spread for the stage; empty in older files.
  std::vector<double> predicted_stage_min_ms, predicted_stage_max_ms;
  std::vector<double> predicted_phase_ms;               ///< [S][2] prefill, decode per step
  /// [S] and [S][2]: predicted_stage_ms and predicted_phase_ms again, from the profile as the
  /// rounds saw the units (balance::profile_as_rounds_saw_it of ProfileTable::latency_rounds_ms);
  /// empty without profile cycles between rounds.
  std::vector<double> predicted_stage_rounds_ms, predicted_phase_rounds_ms;
  /// [S] and [S][2]: predicted_stage_ms and predicted_phase_ms cross-calibrated (issue 13):
  /// the profile's alone sums scaled per rank and phase by factors fitted on the *other*
  /// partitions' steps on that rank, measured in the same rounds
  /// (balance::contention_calibration), through the contention model; empty where
  /// no other partition was measured on every rank this one uses, or for tensor-parallel
  /// partitions. cross_calibrated_by: the partitions the factors came from, comma-separated.
  std::vector<double> predicted_stage_cross_ms, predicted_phase_cross_ms;
  std::string cross_calibrated_by;
  /// [S][2] the contention model's share of each stage's prefill and decode steps overlapped by
  /// another stage of its machine, in the cross-calibrated prediction (vs stage_overlap); empty
  /// with a profile of one pass.
  std::vector<double> predicted_overlap_cross;
  /// [R][2] the cross-calibration's factors per rank and phase (balance::ContentionCalibration):
  /// a stage's alone time is cross_level x the profile's alone sum, its together time
  /// (cross_level + cross_contention) x that sum; cross_fit: 2 both fitted, 1 the level alone
  /// (on the profile's alone and together sums alike; contention NaN), 0 none (no steps there).
  std::vector<double> cross_level, cross_contention;
  std::vector<int> cross_fit;
  std::vector<int64_t> stage_weight_bytes, stage_kv_bytes;  ///< [S]
  /// [S] the stage's floor in the objective (sum of its units' roofline floors with the rank's
  /// shared read bandwidth: all stages run at once); efficiency = stage_floor_ms / measured.
  std::vector<double> stage_floor_ms;
  std::vector<double> stage_floor_phase_ms;  ///< [S][2] prefill, one decode step
  double predicted_bottleneck_ms = 0.0;
  /// The earlier partition of the run with the same split, whose measurement this one shares
  /// instead of being benchmarked again; "" if none. same_as_reason: "identical" (units and
  /// device order) or "equivalent" (the same stages on identical devices in another order,
  /// balance::compare_splits); an equivalent partition is stored as the split that was measured,
  /// and solver_split says what its solver returned ("7,5,6,6 on ranks 0,1,2,3"; "" otherwise).
  std::string same_as;
  std::string same_as_reason, solver_split;

  // benchmark
  bool measured = false;
  std::vector<double> events;            ///< [reps][M][G+1][S][6] seconds since run start (rank 0 clock); one rep per round
  std::vector<double> stage_compute_ms;  ///< [S][2] median prefill, decode compute per step
  /// [S][2] mean prefill, decode compute per step (what the rates follow); empty in older files
  std::vector<double> stage_compute_mean_ms;
  /// [S] measured_stage_ms from the mean steps (vs predicted_stage_cross_ms); empty in older files
  std::vector<double> measured_stage_mean_ms;
  /// [S][2] the measured share of each stage's prefill and decode compute time during which
  /// another stage of its machine computed (balance::compute_overlap of events); empty where
  /// the partition was not cross-calibrated, and in older files
  std::vector<double> stage_overlap;
  std::vector<double> stage_workload_ms; ///< [S] prefill + G * decode, measured
  std::vector<double> measured_stage_ms; ///< [S] measured cost in the objective's terms (vs predicted_stage_ms)
  std::vector<double> bubble_fraction;   ///< [S]
  std::vector<double> recv_wait_ms;      ///< [S]
  std::vector<double> rep_wall_s, rep_tokens_per_s;  ///< [reps] one per round
  std::vector<double> rep_decode_tokens_per_s, rep_ttft_p50_ms, rep_tpot_p50_ms;  ///< [reps]
  /// Against the run's reference partition (RunRecord::reference_partition), paired by round
  /// (common/stats.h compare_paired): tokens/s and decode tokens/s; n = 0 where there is no such
  /// comparison (this partition is the reference, or the run has none). gain_verdict:
  /// comparison_verdict, or "same split".
  PairedComparison gain, decode_gain;
  std::string gain_verdict, decode_gain_verdict;
  std::vector<int> rep_round;  ///< [reps] the round of each repetition (pairs with other partitions')
  /// An adaptive split (--partition adaptive): the [R][2] factors (prefill, decode) by which
  /// each rank's profile row was scaled before it was solved (predictions above are from the
  /// scaled table), the partitions whose measured stages gave them, and the rounds they had.
  std::vector<double> calibration_factor;
  std::vector<std::string> calibrated_from;
  int solved_after_round = 0;
  std::vector<double> lane_cpu_s;        ///< [S][3] compute, recv, send lane CPU seconds
  double timed_wall_s = 0.0;             ///< wall seconds of the timed repetitions (stage 0's rank)
  std::map<std::string, double> metrics; ///< DESIGN.md §3 scalars
  int bottleneck_stage = 0;

  // validation
  std::vector<int32_t> tokens;             ///< [M][G+1][B] pipelined run, last repetition
  std::vector<int32_t> reference_tokens;   ///< [M][G+1][B] serialized run
  double checksum = 0.0, reference_checksum = 0.0;
  bool validated = true;  ///< false with --no-validate (then tokens_match/checksum_match are 0)
  bool tokens_match = false, checksum_match = false;
  bool tokens_match_first_partition = true;  ///< same tokens as the first partition of the run
  /// Across layouts (issue 14): how many of the M x (G+1) x B tokens differ from the first
  /// partition's, and |checksum / first partition's checksum - 1| (the same bits across splits
  /// of one-rank stages; a tensor-parallel layout sums in another order: within kLayoutChecksumTol).
  int tokens_differing_first_partition = 0;
  /// R > 1: the tokens of replicas 1..R-1 that differ from replica 0's (each replica runs the same
  /// prompts: 0 is required for tokens_match); 0 with one replica.
  int replica_tokens_differing = 0;
  double checksum_rel_diff_first_partition = 0.0;
};

/// Values of RunRecord::link_measured_by.
inline constexpr const char* kLinkByHostPingPong = "mpi_host_ping_pong";
inline constexpr const char* kLinkByTransportProbe = "transport_probe";

/// One size of the link probe between ranks src and dst (src led the ping-pong).
struct LinkSweepRow {
  int src = 0, dst = 0;
  LinkSample sample;
};

/// The reference partition of a file without the root attribute reference_partition (written
/// before it existed): those runs compared every partition with uniform, by name.
inline constexpr const char* kLegacyReferencePartition = "uniform";
/// The name of --control's second measurement of the uniform split (an A/A comparison: its gain
/// against uniform is what the machine's noise alone makes of two identical splits).
inline constexpr const char* kControlPartition = "uniform_control";

/// `run --plan K` (issue 36): the planner's search on the run's own profile for its ranks, every
/// candidate it evaluated, its Pareto front, the points measured and the verdict (/plan).
struct PlanRecord {
  int devices = 0;  ///< N searched (the run's ranks); 0 = no plan in this run
  int points = 0;   ///< K asked for (--plan K)
  std::string mode;  ///< balance::PlanResult::mode
  int64_t layouts_possible = 0, layouts_evaluated = 0, infeasible = 0, pruned = 0;
  /// One row per (layout, M) candidate simulated, in search order.
  struct Candidate {
    std::string label;   ///< "PP2 M4", "TP2 M1" (balance::plan_label)
    std::string widths;  ///< the layout as --tp spells it: "1,1", "2"
    std::string counts;  ///< units per stage: "15,15"
    int groups = 0, batch = 0;
    int replicas = 1;  ///< R pipelines like this one ("DP2 ..."); tokens/s is all R's
    /// The layout as curve_layout names it: the widths, "DP{R} " before them with R > 1.
    std::string layout() const { return (replicas > 1 ? "DP" + std::to_string(replicas) + " " : std::string()) + widths; }
    double tokens_per_s = 0, tokens_per_s_per_device = 0, ttft_p50_ms = 0, tpot_p50_ms = 0, tokens_per_s_per_user = 0;
    int bottleneck_stage = 0;
    bool on_front = false;
    std::string measured_as;  ///< the partition that measured it ("" = not measured)
    /// Why it was measured: "front" (one of the K), "next" (off the front, filling the K),
    /// "curve" (the best layout at another M); "" = not measured.
    std::string role;
  };
  std::vector<Candidate> candidates;
  std::vector<int> front;   ///< indices into candidates, tokens/s per user descending
  /// The layout whose M curve was measured (strategy 3): its widths, "DP{R} " before them with
  /// R > 1 replicas ("DP2 1").
  std::string curve_layout;
  /// The verdict: the measured point the planner predicted best (most tokens/s), the one that
  /// measured best, and whether they are the same or the predicted best's tokens/s is within the
  /// paired 95% CI of the measured best's (1/0; -1 = not decided: fewer than two points).
  std::string predicted_best, measured_best;
  int best_within_ci = -1;
  PairedComparison best_cmp;  ///< predicted best / measured best, paired by round
};

struct RunRecord {
  std::string ppbench_version, created_utc, command_line, backend, transport, mpi_version, hdf5_version;
  std::string slurm_job_id, slurm_job_name, slurm_nodelist, slurm_array_task_id;
  std::map<std::string, std::string> environment;  ///< behaviour-changing variables
  /// Versions of the libraries that did the work, when used: key -> version, e.g.
  /// "cuda_runtime" -> "12.4", "cuda_driver", "cublas", "nccl" -> "2.21.5", "openblas". Stored as
  /// root attributes `<key>_version`; empty on a CPU build except what the CPU backend reports.
  std::map<std::string, std::string> library_versions;
  int world_size = 0;
  /// The link model the balancer and the simulators charge every message with: rank 0 <-> 1's
  /// latency (s) and bandwidth (bytes/s), measured as link_measured_by says.
  double link_latency_s = 0.0;
  double link_bandwidth_Bps = 0.0;
  /// [R][R] each measured pair's link of that model (/ranks/link_latency_s,
  /// /ranks/link_bandwidth_Bps), symmetric, NaN where not measured; empty in older files.
  std::vector<double> link_latency_matrix_s, link_bandwidth_matrix_Bps;
  /// What measured the link model: kLinkByHostPingPong (MpiContext::link_matrix: the MPI
  /// transport on CPU ranks, whose messages are MPI messages of host memory) or
  /// kLinkByTransportProbe (transport/link_probe.h through the run's transport: NCCL, or MPI
  /// staged through pinned memory, on device buffers). "" in older files (the host ping-pong).
  std::string link_measured_by;
  /// [R][R] the MPI host ping-pong (MpiContext::link_matrix) and the transport probe's fit
  /// (latency, bandwidth, max relative error), whichever the model took; empty in older files.
  std::vector<double> link_host_latency_matrix_s, link_host_bandwidth_matrix_Bps;
  std::vector<double> link_probe_latency_matrix_s, link_probe_bandwidth_matrix_Bps, link_probe_max_rel_error;
  /// The probe's sweeps, one row per pair and size (/ranks/link_sweep), and the seconds the
  /// whole probe took on rank 0 (0: not probed, older files).
  std::vector<LinkSweepRow> link_sweep;
  double link_probe_s = 0.0;
  double run_start_s = 0.0;  ///< rank 0 monotonic time all event times are relative to
  double elapsed_s = 0.0;
  std::string model_source, model_config_json;
  std::map<std::string, std::string> model_attrs_str;
  std::map<std::string, double> model_attrs_num;
  WorkloadInfo workload;
  std::vector<RankInfo> ranks;
  ProfileTable profile;
  std::vector<PartitionRecord> partitions;
  /// The partition every gain is against (root attribute reference_partition; "" = none;
  /// kLegacyReferencePartition in older files, which compared with uniform by name).
  std::string reference_partition = kLegacyReferencePartition;
  std::string status = "running";  ///< "running: <phase>", "failed: <phase>", or "complete"
  std::string failure;              ///< the error that ended the run, "" if none
  /// The ranks' flight records when the run failed ([world_size], common/flight_recorder.h: phase,
  /// lanes, waits, threads' stacks; "" for a rank whose record did not reach rank 0): /failure/
  /// flight_record. Empty when none was taken (no failure, or bad input).
  std::vector<std::string> flight_records;
  /// Every partition validated against its serialized run and all matched ("ok"); the run's
  /// verdict in `validation`: "ok", "failed" (a mismatch, or partitions' tokens differ),
  /// "skipped" (--no-validate; a closed run's partitions' tokens agree with each other, a serving
  /// run compares none), "pending" (incomplete file).
  bool validation_ok = false;
  std::string validation = "pending";
  double balance_gain = 0.0;         ///< tokens_per_s(balanced) / tokens_per_s(uniform), 0 if n/a
  double decode_balance_gain = 0.0;  ///< same with decode_tokens_per_s
  /// The two gains as paired comparisons (balanced's gain / decode_gain; n = 0 if n/a) and
  /// their verdicts ("" if n/a).
  PairedComparison balance_cmp, decode_balance_cmp;
  std::string balance_verdict, decode_balance_verdict;
  /// How the partitions were benchmarked: "interleaved, stages resident" or "interleaved,
  /// stages rebuilt every round" ("" before the benchmark); rounds run; why they stopped.
  std::string schedule;
  int rounds = 0;
  std::string stop_reason;
  /// [rounds finished] entry r: the seconds rank 0 spent after round r's last turn before round
  /// r + 1's first turn (after the last round: before the rounds ended): gathering the round,
  /// the results file, the verdict, and the profile cycle between rounds where one was taken
  /// (round_profile_s counts those alone). /rounds/gap_s; empty before the first round and in
  /// older files.
  std::vector<double> round_gap_s;
  /// --partition adaptive: how the re-solving ended ("" without it).
  /// The profile cycles between rounds (ppbench run --round-profile): what they were ("together
  /// cycles between rounds, ..."), why there were none ("none: ..."; "off: ..." with
  /// --round-profile off), or "" (an older file). round_profile_s: the seconds the cycles took
  /// on rank 0 (they count toward --max-time; 0 without cycles).
  std::string round_profile_status;
  double round_profile_s = 0.0;
  std::string adaptive_status;
  /// --tp auto: the widths the balancer chose ("2,1,1"; "" without it).
  std::string tp_auto_layout;
  PlanRecord plan;  ///< --plan K (plan.devices = 0 without it)
  ServingRunRecord serving;  ///< --scenario poisson|gamma|trace (no serving.spec in a closed run)
  /// MoE (/moe): tokens routed to each expert [layers][experts] row-major (rows: the model's
  /// layers, then its MTP modules when run; dense layers 0) in partition expert_tokens_partition's
  /// last timed repetition; empty without MoE layers. expert_skew: --expert-skew.
  std::vector<int64_t> expert_tokens;
  int expert_rows = 0, expert_cols = 0;
  std::string expert_tokens_partition;
  double expert_skew = 0.0;
};

/// Metric `key` of partition `p` (its /benchmark/<name> attribute), NaN where it has none.
inline double metric_or_nan(const PartitionRecord& p, const std::string& key) {
  const auto it = p.metrics.find(key);
  return it != p.metrics.end() ? it->second : std::numeric_limits<double>::quiet_NaN();
}

/// The M partition `p` of `run` ran: its own (PartitionRecord::groups) or the workload's.
inline int partition_groups(const RunRecord& run, const PartitionRecord& p) {
  return p.groups > 0 ? p.groups : run.workload.microbatches;
}

}  // namespace ppb
