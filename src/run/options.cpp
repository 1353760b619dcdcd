#include "run/options.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/error.h"
#include "transport/backend_registry.h"

namespace ppb::run {

namespace {

void check_range(const char* flag, long long value, long long lo, long long hi) {
  if (value < lo || value > hi) {
    std::ostringstream os;
    os << flag << " must be in [" << lo << ", " << hi << "], got " << value;
    throw UserError(os.str());
  }
}

/// --partition: named solvers, or one manual split.
PartitionRequest parse_partition(const std::string& p) {
  using balance::Method;
  PartitionRequest r;
  r.text = p;
  if (p == "both") r.methods = {Method::uniform, Method::balanced};
  else if (p == "all") r.methods = {Method::uniform, Method::seed, Method::balanced};
  else if (p == "uniform" || p == "seed" || p == "balanced") r.methods = {balance::parse_method(p)};
  else if (p == "adaptive") {
    r.methods = {Method::uniform, Method::balanced};
    r.adaptive = true;
  } else if (!p.empty() && p.find_first_of("0123456789") != std::string::npos) {
    r.methods = {Method::manual};
    r.manual = p;
  } else {
    throw UserError("--partition '" + p +
                    "' is unknown; valid: uniform, seed, balanced, both (uniform+balanced), all, adaptive "
                    "(uniform+balanced, then splits re-solved from what the pipeline measured), or a "
                    "manual split of unit counts per stage such as 5,6,5,6");
  }
  return r;
}

void check_workload_flags(const RunFlags& f) {
  check_range("--batch", f.batch, 1, 4096);
  check_range("--prompt-len", f.prompt_len, 1, 1 << 20);
  check_range("--gen-len", f.gen_len, 1, 1 << 20);
  check_range("--microbatches", f.microbatches, 0, 4096);
  check_range("--warmup", f.warmup, 0, 1000);
  check_range("--iters", f.iters, 1, 100000);
  if (!(f.target_ci_pct >= 0) || !(f.target_ci_pct <= 100))
    throw UserError("--target-ci must be in [0, 100] percent (0 = exactly --iters rounds), got " +
                    std::to_string(f.target_ci_pct));
  if (!(f.max_time_s > 0) || !(f.max_time_s <= 604800))
    throw UserError("--max-time must be > 0 and <= 604800 seconds (a week), got " + std::to_string(f.max_time_s));
  check_range("--profile-warmup", f.profile_warmup, 0, 1000);
  check_range("--profile-iters", f.profile_iters, 1, 100000);
  check_range("--step-grid-iters", f.step_grid_iters, 0, 100000);
  check_range("--profile-contexts", f.profile_contexts, 1, 64);
  check_range("--profile-repeats", f.profile_repeats, 0, 1000);
  // A bounded timeout: inf would disable the transfer timeouts and the watchdog alike.
  if (!(f.timeout_s > 0) || !(f.timeout_s <= 604800)) throw UserError("--timeout must be > 0 and <= 604800 seconds (a week)");
  if (!(f.memory_limit_gib >= 0) || !(f.memory_limit_gib <= 1048576))
    throw UserError("--memory-limit must be >= 0 and <= 1048576 GiB (2^50 bytes); 0 = 90% of the device's free memory per rank");
  if (!(std::isfinite(f.expert_skew) && f.expert_skew >= 0.0 && f.expert_skew <= 4.0))
    throw UserError("--expert-skew must be a number in [0, 4] (a Zipf exponent; 0 = the router's own choice), got " +
                    std::to_string(f.expert_skew));
  if (f.output_given && f.output.empty()) throw UserError("--output is empty; give a file name, or omit -o for the default");
}

}  // namespace

RunOptions parse_run_options(const RunFlags& f) {
  check_workload_flags(f);
  RunOptions o;
  o.model_path = f.model_path;
  o.batch = f.batch;
  o.prompt_len = f.prompt_len;
  o.gen_len = f.gen_len;
  o.microbatches = f.microbatches;
  if (f.dtype != "auto") o.dtype = parse_dtype(f.dtype);
  o.seed = f.seed;
  o.partition = parse_partition(f.partition);
  o.objective = balance::parse_objective(f.objective);  // UserError naming --objective
  o.objective_text = balance::objective_name(o.objective);
  if (f.order == "rank") o.order = balance::OrderMode::rank;
  else if (f.order == "auto") o.order = balance::OrderMode::automatic;
  else throw UserError("--order '" + f.order + "' is unknown; valid: rank (stage k on rank k), auto (search the device order)");
  o.layouts.clear();
  for (const std::string& t : f.tp) {
    if (t == "auto") o.tp_auto = true;
    else o.layouts.push_back(t);
  }
  check_range("--plan", f.plan, 0, 16);
  o.plan_points = f.plan;
  o.plan_replicas = f.replicas;
  if (o.plan_points == 0 && f.replicas != "auto")
    throw UserError("--replicas " + f.replicas + " chooses the replica counts of --plan's search; give --plan K too");
  if (o.plan_points > 0 && (f.partition != "both" || f.tp != std::vector<std::string>{"1"}))
    throw UserError("--plan " + std::to_string(f.plan) + " chooses the partitions itself (the planner's front points "
                    "and the uniform split as the reference): drop --partition and --tp");
  o.warmup = f.warmup;
  o.iters = f.iters;
  o.target_ci_pct = f.target_ci_pct;
  o.max_time_s = f.max_time_s;
  o.control = f.control;
  if (o.control && o.partition.methods.front() != balance::Method::uniform)
    throw UserError("--control benchmarks the uniform split twice, but --partition '" + f.partition +
                    "' has no uniform split; use --partition uniform, both or all");
  if (f.contention == "auto") o.contention = Contention::automatic;
  else if (f.contention == "off") o.contention = Contention::off;
  else throw UserError("--contention '" + f.contention + "' is unknown; valid: auto (profile alone and together where a "
                       "machine's ranks share memory), off (one profile at each rank's own pace)");
  if (f.round_profile == "auto") o.round_profile = RoundProfile::automatic;
  else if (f.round_profile == "on") o.round_profile = RoundProfile::on;
  else if (f.round_profile == "off") o.round_profile = RoundProfile::off;
  else throw UserError("--round-profile '" + f.round_profile + "' is unknown; valid: auto (profile cycles between the "
                       "benchmark's rounds where the profile has two passes and fewer than two splits of one rank per "
                       "stage are measured), on (where the profile has two passes), off");
  o.expert_skew = f.expert_skew;
  o.mtp = f.mtp;
  o.cuda_graphs = !f.no_cuda_graphs;
  o.profile_warmup = f.profile_warmup;
  o.profile_iters = f.profile_iters;
  o.step_grid_iters = f.step_grid_iters;
  o.profile_contexts = f.profile_contexts;
  o.profile_repeats = f.profile_repeats;
  o.overlap = !f.no_overlap;
  o.validate = f.validate;
  if (f.device != "auto") (void)find_backend(f.device);  // the registry's names, or its error naming --device
  o.device = f.device;
  if (f.transport == "auto") o.transport = TransportChoice::automatic;
  else if (f.transport == "mpi") o.transport = TransportChoice::mpi;
  else if (f.transport == "nccl") o.transport = TransportChoice::nccl;
  else throw UserError("--transport '" + f.transport + "' is unknown; valid: auto, mpi, nccl");
  if (o.transport == TransportChoice::nccl && o.device == "cpu")
    throw UserError("--transport nccl needs --device cuda; CPU ranks use --transport mpi");
  o.memory_limit_gib = f.memory_limit_gib;
  o.timeout_s = f.timeout_s;
  o.output = f.output;
  o.force = f.force;
  o.quiet = f.quiet;
  o.profile_only = f.profile_only;
  o.command_line = f.command_line;
  o.scenario = parse_scenario_options(f);
  if (o.scenario.on()) {
    // The profile and the balancer take the scenario's mean request (RunOptions::scenario).
    double prompt = 0, gen = 0;
    for (const serving::Request& r : o.scenario.drawn.requests) {
      prompt += r.prompt_len;
      gen += r.gen_len;
    }
    const double n = static_cast<double>(o.scenario.drawn.requests.size());
    o.prompt_len = std::max(1, static_cast<int>(std::lround(prompt / n)));
    o.gen_len = std::max(1, static_cast<int>(std::lround(gen / n)));
  }
  return o;
}

}  // namespace ppb::run
