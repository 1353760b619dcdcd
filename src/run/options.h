// The options of `ppbench run` and `ppbench profile`: RunFlags as the command line gives them
// (src/app/main.cpp binds CLI11 to it, with the help text and defaults), and RunOptions, the same
// typed and checked once by parse_run_options, the one validator of every flag. Later phases
// read enums and numbers, never flag strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "balance/problem.h"
#include "balance/solver.h"
#include "common/dtype.h"
#include "common/workload.h"
#include "serving/scenario.h"

namespace ppb {

/// The flags of `ppbench run` / `ppbench profile` as given (see main.cpp for their help text and
/// defaults); parse_run_options checks and types them.
struct RunFlags {
  std::string model_path;
  int batch = 4;
  int prompt_len = 32;
  int gen_len = 16;
  int microbatches = 0;  ///< 0 = number of stages
  std::string partition = "both";
  std::string objective = "workload";
  std::string order = "rank";
  std::vector<std::string> tp = {"1"};
  int plan = 0;  ///< --plan K: measure the planner's K best front points (0 = off)
  std::string replicas = "auto";  ///< --replicas auto|R with --plan: the replica counts it searches
  int warmup = 1;
  int iters = 2;
  double target_ci_pct = 5;
  double max_time_s = 120;
  bool control = false;
  std::string contention = "auto";
  double expert_skew = 0.0;
  bool mtp = false;
  bool no_cuda_graphs = false;
  int profile_warmup = 2;
  int profile_iters = 5;
  int profile_contexts = 3;
  int profile_repeats = 0;
  int step_grid_iters = 9;
  std::string round_profile = "auto";
  bool no_overlap = false;
  bool validate = true;
  uint64_t seed = kDefaultSeed;
  std::string dtype = "auto";
  std::string device = "auto";
  std::string transport = "auto";
  double memory_limit_gib = 0.0;
  double timeout_s = 300.0;
  std::string output;
  bool output_given = false;  ///< -o was on the command line (an empty one is refused)
  bool force = false;
  bool quiet = false;
  bool profile_only = false;  ///< `ppbench profile`
  std::string command_line;
  serving::ScenarioFlags scenario;  ///< --scenario and its flags (app/scenario_flags.h)
};

namespace run {

/// --contention: where a machine's ranks share memory, profile alone and together and predict
/// each partition with balance/contention.h (automatic), or one profile at every rank's own pace.
enum class Contention { automatic, off };

/// --round-profile: profile cycles between the benchmark's rounds where the profile has two
/// passes (on), as on unless two or more splits of one rank per stage cross-calibrate each other
/// (automatic), or none (off).
enum class RoundProfile { automatic, on, off };

/// --transport: NCCL where every rank has its own GPU, else MPI (automatic), or forced.
enum class TransportChoice { automatic, mpi, nccl };

/// --partition: the splits to measure, in order, and whether --partition adaptive re-solves
/// during the rounds.
struct PartitionRequest {
  std::vector<balance::Method> methods;  ///< uniform, seed, balanced, or manual
  std::string manual;                    ///< Method::manual: units per stage ("9,8,7,8")
  bool adaptive = false;
  std::string text;                      ///< the flag as given, for messages
};

/// The serving scenario of a run (issue 37; pipeline/serving_pipeline.h runs it): its spec and
/// its requests, drawn (poisson, gamma: from --seed; at 1 request/s with --request-rate search,
/// then scaled to each rate measured) or read (trace) once, the same on every rank: prompts
/// clamped to [1, -p], outputs to [1, -g].
struct ScenarioOptions {
  std::optional<serving::ScenarioSpec> spec;  ///< nullopt: closed batches
  serving::ScenarioRequests drawn;
  bool on() const { return spec.has_value(); }
};

/// The typed, checked options of one run.
struct RunOptions {
  std::string model_path;
  // The workload as asked (the resolved Workload, with M and the dtype, is the run context's).
  int batch = 4, prompt_len = 32, gen_len = 16;
  int microbatches = 0;              ///< 0 = one group per stage
  std::optional<DType> dtype;        ///< nullopt = auto: the backend's default
  uint64_t seed = kDefaultSeed;
  PartitionRequest partition;
  balance::Objective objective = balance::Objective::workload;
  balance::OrderMode order = balance::OrderMode::rank;
  /// --tp: each layout's text as given ("1", "2", "2,1,1"), parsed against the ranks and the model
  /// at start-up; tp_auto: --tp auto (the balancer adds the layout it picks).
  std::vector<std::string> layouts = {"1"};
  bool tp_auto = false;
  /// --plan K (issue 36): the planner's search on this run's profile for its ranks (every layout,
  /// M = 1 .. 2S), and the K front points with the most predicted tokens/s, the chosen layout's
  /// curve over M and the uniform split measured in the rounds; 0 = off.
  int plan_points = 0;
  /// --replicas with --plan: "auto" (every R dividing the ranks) or R; checked against the ranks
  /// at start-up (MeasurePlan::plan_replicas).
  std::string plan_replicas = "auto";
  int warmup = 1, iters = 2;         ///< untimed and (at least) timed repetitions per partition
  double target_ci_pct = 5;          ///< 0 = exactly --iters rounds
  double max_time_s = 120;
  bool control = false;
  Contention contention = Contention::automatic;
  RoundProfile round_profile = RoundProfile::automatic;
  double expert_skew = 0.0;
  bool mtp = false;
  bool cuda_graphs = true;
  int profile_warmup = 2, profile_iters = 5, profile_contexts = 3;
  int profile_repeats = 0;           ///< 0 = auto (profile_phase.h)
  /// Timed forwards per step of the step model's grid (0 = no grid). 9, not 3: four interleaved
  /// pairs of Qwen3-0.6B profiles, 2 ranks, put the layer's grid level at a sd of 1.2% between
  /// profiles against 2.4%, for 7-10 s more (docs/MEASUREMENTS.md § 2026-12-07 the pooled rounds).
  int step_grid_iters = 9;
  bool overlap = true;
  bool validate = true;
  std::string device = "auto";       ///< "auto" or a backend's name (backend registry)
  TransportChoice transport = TransportChoice::automatic;
  double memory_limit_gib = 0.0;     ///< 0 = 90% of the rank's share of the free memory
  double timeout_s = 300.0;
  std::string output;                ///< "" = the default name (results/ppbench_<model>_<R>r_<UTC>.h5)
  bool force = false, quiet = false, profile_only = false;
  std::string command_line;
  std::string objective_text = "workload";  ///< as given, for the record and messages
  /// --scenario. With requests that arrive, -p and -g are the longest prompt and output a request
  /// may have, and prompt_len / gen_len (what the profile times and the balancer balances) are the
  /// scenario's mean prompt and output lengths, rounded.
  ScenarioOptions scenario;
};

/// The --scenario flags of `flags` typed and checked (run/scenario_options.cpp); for a scenario
/// of requests that arrive, their requests drawn or read.
/// @throws ppb::UserError naming the flag, the value and what would be valid.
ScenarioOptions parse_scenario_options(const RunFlags& flags);

/// Checks and types every flag of `flags` (ranges, names, their combinations), the same way on
/// every rank: what needs the model or the devices is checked at start-up.
/// @throws ppb::UserError naming the flag, the value and what would be valid.
RunOptions parse_run_options(const RunFlags& flags);

}  // namespace run
}  // namespace ppb
