// `ppbench run`: start-up, profile, balance, benchmark, validate, write (DESIGN.md §1).
#pragma once

#include <string>
#include <vector>

namespace ppb {

class MpiContext;

/// The options of `ppbench run` (see main.cpp for their help text and defaults).
struct RunOptions {
  std::string model_path;
  int batch = 4;
  int prompt_len = 32;
  int gen_len = 16;
  int microbatches = 0;  ///< 0 = number of stages
  std::string partition = "both";
  std::string objective = "workload";
  std::string order = "rank";  ///< balanced partition's device order: rank | auto
  /// Layouts (issue 14): each a tensor-parallel width for every stage ("2") or per stage
  /// ("2,1,1"); each is measured with the --partition splits. {"1"}: one rank per stage.
  std::vector<std::string> tp = {"1"};
  int warmup = 1;
  int iters = 2;             ///< timed repetitions (rounds) per partition, at least
  double target_ci_pct = 5;  ///< repeat rounds until every gain's 95% CI half-width <= this % (0 = off)
  double max_time_s = 120;   ///< ... or until the benchmark's rounds have taken this many seconds
  bool control = false;      ///< also benchmark uniform a second time as "uniform_control" (A/A)
  /// auto: where a machine's ranks share memory, profile alone and together and predict each
  /// partition with balance/contention.h; off: one profile at every rank's own pace, as is.
  std::string contention = "auto";
  double expert_skew = 0.0;     ///< --expert-skew: Zipf exponent of MoE expert popularity (0 = the router's own)
  bool mtp = false;              ///< run the model's multi-token-prediction modules with the head (model::enable_mtp)
  bool no_cuda_graphs = false;   ///< CUDA: decode forwards run eagerly, not replayed from CUDA graphs
  int profile_warmup = 2;
  int profile_iters = 5;
  int profile_contexts = 3;
  /// --profile-repeats: cycles of the whole profile (alone turns and together pass, or the one
  /// pass), their medians averaged; 0 = auto (RunJob::profile: where the profile has two passes,
  /// repeat until it has taken kProfileSpanS, at most kAutoProfileRepeats cycles; else 1)
  int profile_repeats = 0;
  /// --round-profile: "on" (profile cycles between the benchmark's rounds where the profile has
  /// two passes, and every prediction made again from them after the rounds), "auto" (as on,
  /// unless two or more splits of one rank per stage are measured: they cross-calibrate each
  /// other) or "off"
  std::string round_profile = "auto";
  bool no_overlap = false;
  bool validate = true;
  uint64_t seed = 1234;
  std::string dtype = "auto";
  std::string device = "auto";
  std::string transport = "auto";
  double memory_limit_gib = 0.0;  ///< 0 = the device's free memory (per rank sharing it) less 10%
  double timeout_s = 300.0;
  std::string output;  ///< "" = results/ppbench_<model>_<S>r_<UTC time>.h5
  bool force = false;
  bool quiet = false;
  /// `ppbench profile`: stop after the profile; the file (complete=1, no partitions) feeds
  /// `ppbench balance` / `simulate` offline.
  bool profile_only = false;
  std::string command_line;
};

/// Runs the main job on every rank (or, with opt.profile_only, its steps up to the profile). Returns the process exit status: 0 success, 1 validation
/// mismatch or internal failure, 2 bad input (the same on every rank).
int run_job(const MpiContext& mpi, const RunOptions& opt);

}  // namespace ppb
