// ppbench: the command line. `ppbench run` is the main job (DESIGN.md §1).
//
// Exit status: 0 success; 1 validation mismatch or internal failure; 2 bad input (flags, model
// config, impossible partition, unwritable output) — the same on every rank, never a hang.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <cmath>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/check.h"
#include "common/error.h"
#include "model/model_spec.h"
#include "app/report_cli.h"
#include "app/offline_cli.h"
#include "app/scenario_flags.h"
#include "mpi/mpi_context.h"
#include "app/run_job.h"
#include "common/version.h"

namespace {

/// True on the rank that should print (rank 0, or a process not launched by MPI/Slurm yet).
bool print_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(var);
    if (v) return std::string(v) == "0";
  }
  return true;
}

std::string join_args(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
  return s;
}

/// Levenshtein edit distance (insertions, deletions, substitutions), O(|a|·|b|).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

/// The closest of `candidates` to `word` when it is close enough to be a typo (at most a third
/// of the word's letters edited, at least 1, at most 3), else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::min<size_t>(3, std::max<size_t>(1, word.size() / 3)) + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

/// Every long (--name) and short (-n) flag of `app`, with its dashes.
std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : o->get_snames()) names.push_back("-" + n);
  }
  return names;
}

/// "; did you mean --gen-len?" for each unexpected flag of `extras` that is close to a flag of
/// the command named by argv[1] (or of the top level), else "".
std::string flag_suggestions(const CLI::App& app, const std::vector<std::string>& extras, int argc, char** argv) {
  const CLI::App* cmd = &app;
  if (argc > 1) {
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      if (sub->get_name() == argv[1]) cmd = sub;
  }
  const std::vector<std::string> names = flag_names(*cmd);
  std::string out;
  for (const std::string& x : extras) {
    if (x.size() < 2 || x[0] != '-') continue;
    const std::string flag = x.substr(0, x.find('='));
    const std::string near = closest(flag, names);
    if (!near.empty()) out += "\n  '" + flag + "': did you mean " + near + "?";
  }
  return out;
}

/// Options of `run` and `profile`: the model, the workload the profile is shaped by, device
/// and output.
void add_common_options(CLI::App& sc, ppb::RunFlags& opt) {
  sc.add_option("-m,--model", opt.model_path, "Hugging Face config.json of a decoder model, dense or mixture-of-experts (inputs/models/*.json; `ppbench describe` lists its units)")
      ->required();
  sc.add_option("-b,--batch", opt.batch, "B: sequences per request group (micro-batch)")->capture_default_str();
  sc.add_option("-p,--prompt-len", opt.prompt_len, "P: prompt tokens per sequence (prefill)")->capture_default_str();
  sc.add_option("-g,--gen-len", opt.gen_len, "G: decode steps per group (autoregressive)")->capture_default_str();
  sc.add_option("-M,--microbatches", opt.microbatches,
                 "M: request groups in flight (0 = number of stages; sizes the KV cache in the memory check)")
      ->capture_default_str();
  sc.add_option("--objective", opt.objective,
                 "stage cost the balancer minimises: workload (prefill + G x decode) | decode | prefill")
      ->capture_default_str();
  sc.add_option("--profile-warmup", opt.profile_warmup, "untimed forwards of each unit, phase and context before it is timed (with the profile's passes taking turns: once per cycle)")
      ->capture_default_str();
  sc.add_option("--profile-iters", opt.profile_iters, "timed forwards of each unit, phase and context per profile pass and cycle (median kept; with the passes taking turns, one per iteration of a cycle)")
      ->capture_default_str();
  sc.add_option("--profile-contexts", opt.profile_contexts, "KV-cache lengths at which decode is profiled")
      ->capture_default_str();
  sc.add_option("--step-grid-iters", opt.step_grid_iters,
                "timed forwards of each step shape of the step model's grid (after the profile's cycles: steps of 1 to "
                "B*P tokens in B rows or one, decodes at the profiled contexts, held-out shapes; /profile/step_model), "
                "the median kept; the serving predictions use the model fitted to it; 0 = no grid (the profile's two "
                "shapes, scaled)")
      ->capture_default_str();
  sc.add_option("--profile-repeats", opt.profile_repeats,
                "cycles of the whole profile, each unit's cost the median of its cycles' medians (the mean of two), so that the profile samples "
                "the machine at several moments as the benchmark's rounds do (CPU ranks sharing a machine's memory "
                "ran a unit up to 1.6x apart from one few-second window to the next); 0 = auto: where the profile "
                "has two passes (--contention), repeat until it has taken 15 s, at least 3 and at most 4 cycles; elsewhere 1")
      ->capture_default_str();
  sc.add_option("--contention", opt.contention,
                "auto | off. auto: where the ranks of a machine (one kernel: a node, or nodes that are "
                "containers or namespaces of one machine) compute from one memory (CPU ranks; not GPUs), "
                "profile every unit twice, alone (the machine's other ranks wait) and together (all ranks time "
                "it at the same moment, streaming their weights at once as the stages do in the pipeline); "
                "the balancer solves on the together times, and each partition's prediction interpolates "
                "between the two by how much of each stage's compute another stage of its machine overlaps in "
                "the simulated pipeline. off: one profile, every rank at its own pace, used as it is")
      ->capture_default_str();
  sc.add_option("--expert-skew", opt.expert_skew,
                "MoE layers: route each token's top-k experts as a sample from a Zipf law of expert popularity "
                "with this exponent (p ~ rank^-A; real routers: ~1.0 DeepSeek-V3, ~1.2 Qwen3-235B), "
                "deterministic from the seed and the token, instead of the random router's near-uniform "
                "choice; 0 = the router's own choice. Profiles and runs see the load; a run's file records the "
                "tokens each expert of each layer received (/moe/expert_tokens)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // CLI::Range lets "nan" through (every comparison with NaN is false).
            try {
              size_t used = 0;
              const double x = std::stod(v, &used);
              if (used == v.size() && std::isfinite(x) && x >= 0.0 && x <= 4.0) return "";
            } catch (const std::exception&) {
            }
            return "must be a number in [0, 4] (a Zipf exponent; 0 = the router's own choice), got '" + v + "'";
          },
          "NUMBER in [0, 4]"))
      ->capture_default_str();
  sc.add_flag("--mtp", opt.mtp,
              "run the model's multi-token-prediction modules (DeepSeek-V3 num_nextn_predict_layers) after the "
              "head, as speculative decoding serves with them: the head unit becomes head+mtp, profiled, placed "
              "and timed with them (drafts are computed, not verified)");
  sc.add_flag("--no-cuda-graphs", opt.no_cuda_graphs,
              "CUDA: run each decode forward eagerly (a launch per kernel) instead of replaying it from a CUDA "
              "graph captured per request group and context bucket, as vLLM and TensorRT-LLM do; the A/B of "
              "what launch overhead costs a small model's decode. No effect on the CPU backend");
  sc.add_option("--seed", opt.seed, "seed of the random weights and prompts (an integer >= 0)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // Digits only, at most 2^63 - 1 (the file stores it as int64; larger values
            // would wrap or saturate into another seed).
            const std::string max = "9223372036854775807";
            const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
            const std::string d = digits ? v.substr(std::min(v.find_first_not_of('0'), v.size() - 1)) : v;
            if (digits && (d.size() < max.size() || (d.size() == max.size() && d <= max))) return {};
            return "must be an integer in [0, 9223372036854775807], got '" + v + "'";
          },
          ""))
      ->capture_default_str();
  sc.add_option("--dtype", opt.dtype, "auto | f32 | f16 | bf16 (auto: f32 on CPU, bf16 on GPUs)")->capture_default_str();
  sc.add_option("--device", opt.device, "auto | cpu | cuda")->capture_default_str();
  sc.add_option("--transport", opt.transport, "auto | mpi | nccl")->capture_default_str();
  sc.add_option("--memory-limit", opt.memory_limit_gib,
                 "GiB of weights + KV cache + scratch allowed per rank (0 = 90% of its share of the free memory: "
                 "the GPU's over the ranks on it, or on CPU the smaller of MemAvailable over the machine's ranks "
                 "and the job's cgroup headroom over the ranks in that cgroup)")
      ->capture_default_str();
  sc.add_option("--timeout", opt.timeout_s, "seconds any single transfer may wait before the run fails")
      ->capture_default_str();
  sc.add_option("-o,--output", opt.output,
                "results file (default results/ppbench_<model>_<ranks>r_<time>.h5; a missing directory is created)");
  sc.add_flag("--force", opt.force, "overwrite an existing --output file");
  sc.add_flag("-q,--quiet", opt.quiet, "no progress lines, only the summary");
}

/// Options of the benchmark itself (`run` only).
void add_benchmark_options(CLI::App& run, ppb::RunFlags& opt, bool& no_validate) {
  run.add_option("--partition", opt.partition,
                  "splits to benchmark: uniform | seed | balanced | both (uniform+balanced) | all | a manual "
                  "split of units per stage, e.g. 9,8,7,8")
      ->capture_default_str();
  run.add_option("--order", opt.order,
                  "device order of the balanced split: rank (stage k on rank k) | auto (search it; "
                  "matters with mixed devices)")
      ->capture_default_str();
  run.add_option("--tp", opt.tp,
                 "layout: tensor-parallel width of every stage (W: ranks/W stages of W consecutive ranks) or of "
                 "each stage (2,1,1: widths summing to the ranks); a stage's ranks split its heads, MLP and "
                 "vocabulary (Megatron-style) and all-reduce twice per layer; must be identical devices of one "
                 "node. Repeat to measure several layouts in one run (--tp 1 --tp 2: PP2 against TP2); each "
                 "layout gets the --partition splits, named e.g. uniform_tp2, balanced_tp2-1-1. auto: the layout with the "
                 "most predicted tokens/s at this run's M (fill and drain included; ranks that differ: the smallest "
                 "bottleneck stage), balanced. GPUs: NCCL all-reduces, one GPU per rank")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  run.add_option("--plan", opt.plan,
                 "K: the deployment planner on this run's own profile (the ranks' layouts: replicas x stages x tensor-parallel "
                 "widths x M groups in flight, M = 1..2S; as `ppbench plan FILE --devices R`), then measure its K "
                 "front points with the most predicted tokens/s (filled from the candidates off the front where it "
                 "has fewer), the best layout at every M (the groups-in-flight "
                 "curve) and the uniform split (the reference) in the interleaved rounds: predicted against "
                 "measured tokens/s, TTFT and TPOT per point, and whether the predicted best measured best (/plan). "
                 "Replaces --partition and --tp; 0 = off")
      ->capture_default_str();
  run.add_option("--replicas", opt.replicas,
                 "with --plan: the replica counts its search lays out (as `ppbench plan --replicas`): auto, every R "
                 "dividing the ranks whose N/R ranks one pipeline can use (R pipelines of N/R ranks, \"DP2 PP1\"), or R; a point with R > 1 is measured as R "
                 "pipelines side by side on the ranks (replica r on ranks r*N/R .. (r+1)*N/R-1), its tokens/s over "
                 "every replica's requests, each replica validated")
      ->capture_default_str();
  run.add_option("--warmup", opt.warmup, "untimed repetitions per partition")->capture_default_str();
  run.add_option("--iters", opt.iters,
                 "timed repetitions per partition, at least: the partitions are measured in interleaved rounds "
                 "(A B, B A, ...), one repetition each per round")
      ->capture_default_str();
  run.add_option("--target-ci", opt.target_ci_pct,
                 "after --iters rounds, add rounds until the 95% confidence interval of every gain against "
                 "uniform (tokens/s and decode tokens/s) is within +-PCT % of the gain (0 = exactly --iters rounds)")
      ->capture_default_str();
  run.add_option("--max-time", opt.max_time_s,
                 "seconds the benchmark's rounds may take in all: no round starts that would end after it "
                 "(--iters rounds always run)")
      ->capture_default_str();
  run.add_option("--round-profile", opt.round_profile,
                "auto | on | off. on: where the profile has two passes (--contention), time every unit again "
                "between the benchmark's rounds (a together cycle, on units built once, while the cycles take "
                "at most 20% of the rounds' time, counted in --max-time) and, after the rounds, predict every "
                "stage and the simulator's tokens/s again from them: the pipeline against the units as the same "
                "minutes saw them (the machine drifts between the profile and the rounds). The split is still "
                "solved from the profile taken before. auto: as on, unless two or more splits of one rank per "
                "stage are measured, which cross-calibrate each other after the rounds at no cost (each "
                "predicted from the others' stages measured in the same rounds). off: none")
      ->capture_default_str();
  run.add_flag("--control", opt.control,
               "A/A control: benchmark the uniform split a second time, built separately (its own stages, "
               "lanes and KV caches; CPU ranks: the rank's one copy of the weights), as partition "
               "uniform_control; its gain against uniform shows what this machine's noise alone makes of two "
               "equal splits (needs uniform in --partition)");
  run.add_flag("--no-overlap", opt.no_overlap, "recv, compute and send on one lane (the A/B baseline)");
  run.add_flag("--no-validate", no_validate, "skip the serialized reference run (validation reported as skipped)");
  ppb::add_scenario_flags(run, opt.scenario, ppb::serving::ScenarioUse::Command::run);
}

/// True when `name` is a command of `app`; else prints (on the printing rank) the error with
/// the closest command and the valid ones: CLI11 would only say "A subcommand is required".
bool known_command(const CLI::App& app, const std::string& name) {
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    commands.push_back(sub->get_name());
  if (std::find(commands.begin(), commands.end(), name) != commands.end()) return true;
  std::string names;
  for (const std::string& c : commands) names += (names.empty() ? "" : ", ") + c;
  const std::string near = closest(name, commands);
  if (print_rank())
    std::cerr << "ppbench: error: unknown command '" << name << "'"
              << (near.empty() ? "; expected" : "; did you mean '" + near + "'? Expected") << " one of: " << names
              << "\nRun with --help for the options." << std::endl;
  return false;
}

}  // namespace

namespace {

/// What the CUDA backend needs set before any CUDA or NCCL call; a user's own setting wins.
/// CUDA_MODULE_LOADING=EAGER: every kernel loaded at context creation (a lazily loaded module
/// takes the context's lock, which a lane held by a host task can keep for the whole wait).
/// CUDA_DEVICE_MAX_CONNECTIONS=32: the lanes' streams on hardware queues of their own (the
/// default 8 can put a stream that waits on the host behind another's work).
/// NCCL_RUNTIME_CONNECT=0: NCCL >= 2.22 connects a communicator's channels lazily, at the first
/// collective of each size class (its default); then a prefill-sized all-reduce would connect
/// inside the first timed forward, or inside a CUDA-graph capture. 0 connects them all when the
/// communicator is made, before any timed or captured work (older NCCL ignores it).
constexpr const char* kAppDescription =
    "ppbench: pipeline-parallel LLM inference benchmark.\n"
    "Launch with one MPI rank per pipeline stage (one per GPU, or per CPU core/socket):\n"
    "  mpirun -np 4 ppbench run --model inputs/models/qwen3-0.6b.json\n"
    "Each run profiles every unit (embed, layers, head) on every rank, solves the stage split,\n"
    "benchmarks the pipelined inference of each requested split, validates it against a\n"
    "serialized run, prints a summary and writes one HDF5 file (see results/README.md).";

void set_cuda_environment() {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
}

/// Makes every line written to stderr one write(2): stderr line-buffered (a 64 KiB buffer, so a
/// line up to that long goes whole) and std::cerr without unitbuf (which flushed after each `<<`).
/// Unbuffered, "ppbench: error in " << phase << ... was several writes, and mpirun, which forwards
/// a rank's stdout and stderr apart, put a progress line from stdout between them (seen in CI:
/// "ppbench: error in [ppbench 1.3s] scenario objective: ...\nKV pools ..."). Every message ends in
/// std::endl, which still flushes; call before anything is written to stderr.
void write_stderr_by_line() {
  static char buffer[1 << 16];
  std::setvbuf(stderr, buffer, _IOLBF, sizeof buffer);
  std::cerr.unsetf(std::ios_base::unitbuf);
}

}  // namespace

int main(int argc, char** argv) {
  write_stderr_by_line();
  set_cuda_environment();
  CLI::App app{kAppDescription};
  app.set_version_flag("--version", ppb::ppbench_version());
  app.require_subcommand(1);

  ppb::RunFlags opt;
  bool no_validate = false;
  auto* run = app.add_subcommand("run", "profile, balance, benchmark and validate; write the HDF5 results file");
  auto* profile = app.add_subcommand(
      "profile",
      "only profile every unit on every rank and write the HDF5 file (no partitions), for `ppbench balance` "
      "and `simulate` offline");
  for (CLI::App* sc : {run, profile}) add_common_options(*sc, opt);
  add_benchmark_options(*run, opt, no_validate);
  profile
      ->add_option("--tp", opt.tp,
                   "also profile the units split over groups of ranks at these tensor-parallel widths (W, a,b,c as "
                   "for run, or auto: every width the heads allow), for `ppbench balance FILE --tp auto`")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();

  ppb::ReportOptions report_opt;
  auto* report = ppb::add_report_command(app, report_opt);
  ppb::add_offline_commands(app);  // balance, simulate: run inside app.parse(), no MPI

  if (argc > 1 && argv[1][0] != '-' && !known_command(app, argv[1])) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (print_rank()) return app.exit(e);
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    if (print_rank()) return app.exit(e);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    if (print_rank()) return app.exit(e);
    return 0;
  } catch (const CLI::ExtrasError& e) {
    // "The following arguments were not expected: 4 --gen-lenn": name the flag it was probably meant to be.
    if (print_rank()) {
      std::vector<std::string> extras;
      for (const CLI::App* a : app.get_subcommands([](const CLI::App*) { return true; })) {
        const std::vector<std::string> r = a->remaining();
        extras.insert(extras.end(), r.begin(), r.end());
      }
      const std::vector<std::string> top = app.remaining();
      extras.insert(extras.end(), top.begin(), top.end());
      // CLI11 lists them last first; name them in the order they were typed.
      std::vector<std::string> typed;
      for (int i = 1; i < argc; ++i) {
        const auto it = std::find(extras.begin(), extras.end(), argv[i]);
        if (it != extras.end()) {
          typed.push_back(*it);
          extras.erase(it);
        }
      }
      typed.insert(typed.end(), extras.begin(), extras.end());
      std::string list;
      for (const std::string& x : typed) list += (list.empty() ? "" : " ") + x;
      std::cerr << "ppbench: error: arguments not expected: " << (list.empty() ? std::string(e.what()) : list)
                << flag_suggestions(app, typed, argc, argv) << "\nRun with --help for the options." << std::endl;
    }
    return 2;
  } catch (const CLI::ParseError& e) {
    if (print_rank()) {
      std::cerr << "ppbench: error: " << e.what() << "\nRun with --help for the options." << std::endl;
    }
    return 2;
  }
  if (report->parsed()) return ppb::run_report_command(report_opt);  // no MPI for report
  for (CLI::App* sc : {run, profile})
    if (sc->parsed() && sc->count("--output") > 0) opt.output_given = true;
  opt.command_line = join_args(argc, argv);
  opt.validate = !no_validate;
  opt.profile_only = profile->parsed();

  std::unique_ptr<ppb::MpiContext> mpi;
  try {
    mpi = std::make_unique<ppb::MpiContext>(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "ppbench: fatal: " << e.what() << std::endl;
    return 1;
  }
  try {
    return ppb::run_job(*mpi, opt);
  } catch (const std::exception& e) {
    // An error that escaped the phases: the other ranks may be inside a collective, so
    // MPI_Finalize could wait forever. Abort the job instead.
    std::cerr << "ppbench: fatal (" << ppb::error_context() << "): " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
