// The offline commands `ppbench balance` and `ppbench simulate`: no MPI, no device. They read a
// profile (a results file of `ppbench run`, or a latency JSON), solve or simulate, print, and
// optionally write JSON. The CLI registration is in src/app/offline_cli.h; the input formats
// and the output are documented in docs/OFFLINE.md.
#pragma once

#include <cstdint>
#include <string>

#include "balance/solver.h"
#include "serving/scenario.h"

namespace ppb {

/// Options of `ppbench balance INPUT --stages K ...`.
struct BalanceOptions {
  std::string input;       ///< results .h5 or latency .json (see load_balance_problem)
  int stages = 0;          ///< K; 0 = one stage per device of the input
  std::string solver = "auto";  ///< auto | dp | fast (exact) | uniform | seed (one row, article DP)
  std::string order = "rank";   ///< rank | auto (exact solvers only; refused with uniform, seed, --partition)
  std::string partition;        ///< manual split "5,6,5,6": validated and evaluated instead of solving
  std::string uniform_remainder;  ///< first | last | spread; "" = first. Refused unless solver == "uniform"
  std::string objective;   ///< results files: workload | decode | prefill; "" = the run's (/config/workload objective)
  double memory_limit_gib = 0;  ///< per device (GiB of weights + KV cache); 0 = from the input / unlimited
  double link_bandwidth_GBps = -1;  ///< overrides the input's; < 0 = keep
  double link_latency_us = -1;      ///< overrides the input's; < 0 = keep
  bool no_overlap = false;          ///< transfers serialised with compute (overrides the input)
  std::string json_out;             ///< --json FILE (never the input; an existing file only with force)
  bool force = false;               ///< --force: overwrite an existing --json file
  /// --tp auto (results files with /profile/tp): choose the tensor-parallel widths and the split
  /// for `devices` devices like the profiled ones, and compare with the file's rank count.
  std::string tp;
  int devices = 0;  ///< --devices N with --tp auto; 0 = the file's ranks
};

/// Options of `ppbench simulate INPUT ...`.
struct SimulateOptions {
  std::string input;       ///< results .h5 (every partition, or --partition-name) or stage JSON
  std::string partition_name;  ///< results files: simulate only this partition
  /// results files: predict this split (units per stage, stage k on rank k) from the profile
  /// instead of the run's partitions; "" = the run's
  std::string partition;
  int microbatches = 0;    ///< M; 0 = from the input (results) or 1 (JSON)
  int gen_len = 0;         ///< G; 0 = from the input (results) or 1 (JSON)
  int batch = 0;           ///< B; 0 = from the input (results) or 1 (JSON)
  double link_bandwidth_GBps = -1;  ///< results files: link for activation transfers; < 0 = the run's (0 = infinite)
  double link_latency_us = -1;      ///< results files: per message; < 0 = the run's
  bool no_overlap = false;
  bool eager_sends = false;
  bool no_step_model = false;       ///< serving files: the two-shape model instead of /profile/step_model's
  std::string json_out;             ///< --json FILE (never the input; an existing file only with force)
  bool force = false;               ///< --force: overwrite an existing --json file
};

/// Options of `ppbench plan FILE.h5 --devices N ...` (issue 36, offline).
struct PlanOptions {
  std::string input;        ///< results .h5 of `ppbench run` or `ppbench profile`
  int devices = 0;          ///< N devices like the file's rank 0; required (>= 1)
  std::string batch;        ///< --batch LIST "4" or "1,2,4": each must be the file's B (no batch-scaling model)
  int top = 0;              ///< front rows printed (the most tokens/s first); 0 = all
  bool csv = false;         ///< every candidate as CSV on stdout instead of the tables
  std::string json_out;     ///< --json FILE (never the input; an existing file only with force)
  bool force = false;
  /// --replicas: "auto" (every R dividing N, balance::PlanRequest::replicas = 0) or R >= 1.
  std::string replicas = "auto";
  /// --scenario and its flags (app/scenario_flags.h). Without a scenario, --slo-ttft and
  /// --slo-tpot (scenario.slo_ttft_ms, slo_tpot_ms; 0 = none) are the closed batch's p50 targets;
  /// with --scenario poisson|gamma (issue 38) every layout is ranked by the highest request rate
  /// meeting them (then per-request limits) for --attainment of the requests (balance/plan_serving.h).
  serving::ScenarioFlags scenario;
};

/// `ppbench plan` (issue 36, offline; no MPI): every layout of N devices like the file's rank 0
/// (stages, tensor-parallel widths, the balanced split, M = 1 .. 2S groups in flight),
/// predicted by the run's own model (balance/plan.h), printed as the Pareto front of tokens/s
/// per device against tokens/s per user, the best layout under --slo-ttft/--slo-tpot and why
/// (its busiest stage; the best of N + 1 devices). Returns the exit status (0).
/// @throws ppb::UserError (exit 2) naming the flag: --devices < 1 or more than the model can
///         use, a --batch other than the file's B, a negative target or --top, an unusable --json.
int plan_command(const PlanOptions& opt);

/// Options of `ppbench serve-search FILE.h5 --slo-ttft MS --slo-tpot MS ...` (issue 38, offline).
struct ServeSearchOptions {
  std::string input;           ///< results .h5 of `ppbench run` or `ppbench profile`
  /// The scenario's flags (app/scenario_flags.h): --slo-ttft, --slo-tpot (required), --attainment,
  /// --requests (default 1000), --prompt-lens, --gen-lens, --burstiness, --seed, --step-policy.
  serving::ScenarioFlags scenario;
  bool mlperf = false;         ///< MLPerf's Server rule (p99 of each, early stopping) instead
  int microbatches = 0;        ///< -M groups; 0 = each partition's own (or the workload's)
  int batch = 0;               ///< -b slots per group; 0 = the file's B (at most the file's B)
  std::string partition_name;  ///< only this partition; "" = every partition of the file
  /// --calibrated: a serving scenario's file: the step model scaled per rank by its measured
  /// steps (balance/serving_calibration.h)
  bool calibrated = false;
  std::string json_out;        ///< --json FILE (never the input; an existing file only with force)
  bool force = false;
};

/// `ppbench serve-search` (issue 38, offline; no MPI): for each measured partition of the file
/// (or the one named; a file without partitions: the uniform split of its ranks), the highest
/// request rate whose simulated scenario meets the SLO (serving/rate_search.h: attainment, or
/// MLPerf's rule), by bracket and bisection over the serving simulator
/// (serving/pipeline_sim.h) with step costs from the profile (balance/serving_step_model.h);
/// printed per partition and per device, with TTFT/TPOT p50/p99, goodput and output tokens/s at
/// that rate. Returns the exit status (0).
/// @throws ppb::UserError (exit 2) naming the flag: a missing or non-positive --slo-ttft or
///         --slo-tpot, --attainment outside (0, 1], --requests out of range (or < 100 with
///         --mlperf), a bad --prompt-lens / --gen-lens / --burstiness, -M < 0, -b < 0 or above
///         the file's B, an unknown --partition-name, an unusable --json.
int serve_search_command(const ServeSearchOptions& opt);

/// Options of `ppbench describe --model M.json ...`.
struct DescribeOptions {
  std::string model;            ///< HF config.json
  std::string dtype = "bf16";   ///< bytes per weight and KV element: f32 | bf16 | f16
  int context = 4096;           ///< attended positions for the per-token FLOPs (a decode step at this context)
  std::string json_out;         ///< --json FILE (an existing file only with force)
  bool force = false;
};

/// `ppbench describe` (issue 15; no MPI, no device): the model's units as ppbench splits them,
/// what a user checks before a run. Per unit: name, signature, parameters, resident weight
/// bytes in `dtype`, KV-cache bytes per token and sequence, FLOPs of one token's decode step
/// at `context` attended positions (model::unit_flops, Kaplan et al. 2020 §2.1 counts); the
/// totals: parameters (total and active per token: equal for dense models), weight bytes and
/// KV bytes per token. JSON: {"model", "architecture", "dtype", "context", "total_params",
/// "active_params", "weight_bytes", "kv_bytes_per_token", "units": [{"name", "kind",
/// "signature", "params", "weight_bytes", "kv_bytes_per_token", "flops_per_token"}]}.
/// Returns the exit status (0). @throws ppb::UserError on an unreadable or unsupported config, a
///         bad --dtype or --context.
int describe_command(const DescribeOptions& opt);

/// Reads a balance problem from `path`: a results file (.h5: /profile/latency_ms [world][U][2]
/// combined by `objective` with G from /config/workload, unit names/weight/KV bytes from
/// /profile, activation bytes B*(P+G)*hidden*dtype from the config) or a latency JSON:
///   {"units": [names] | count, "latency_ms": [[U] per device] | [U],
///    "stage_fixed_ms": [rows] | x, "weight_bytes": [U], "kv_bytes": [U],
///    "device_memory_bytes": [D] | n, "activation_bytes": [U-1] | n, "link_bandwidth_GBps": x,
///    "link_latency_us": x, "overlap": bool}   (all but latency_ms optional; any other key is
///    refused). A results file's problem is problem_from_run's (a forward's fixed cost apart
///    where the profile took one).
/// Latencies are finite ms in [0, 1e12]; byte counts whole numbers in [0, 2^50]; device memory
/// 0 = unlimited; link_bandwidth_GBps >= 0 (0 = infinite). docs/OFFLINE.md has the details.
/// @throws ppb::UserError naming the file and the field that is missing or malformed.
/// objective "" = the run's (/config/workload attribute objective; "workload" when absent).
/// Duplicate keys in a JSON object are refused (naming the key).
balance::BalanceProblem load_balance_problem(const std::string& path, const std::string& objective = "");

/// Runs `ppbench balance`; prints the split (and writes --json). Returns the exit status (0).
/// A results file of R ranks solves K <= R stages; K > R only when the R ranks ran on devices of
/// one name (their mean profile row is used, with a note on stderr).
/// @throws ppb::UserError on bad input, flags that do not apply together (--order auto or
///         --uniform-remainder with a solver that ignores them) or an infeasible split (exit 2).
int balance_command(const BalanceOptions& opt);

/// Runs `ppbench simulate`; prints predicted tokens/s, decode tokens/s, TTFT, TPOT and bubble
/// per stage, and, for results files with a benchmark, the replay of the measured step times,
/// the measured values and the error (only when M, G and B are the run's: otherwise the
/// measured row is labelled with the run's workload and no error is computed).
/// Stage JSON: {"stages": [{"prefill_ms", "decode_ms"[, "send_prefill_ms", "send_decode_ms"]}],
/// "microbatches", "gen_len", "batch", "overlap"} (docs/OFFLINE.md); M x (G+1) x S <= 2^21.
/// Returns the exit status (0). @throws ppb::UserError on bad input.
int simulate_command(const SimulateOptions& opt);

}  // namespace ppb
