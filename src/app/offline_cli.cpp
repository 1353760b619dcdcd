#include "app/offline_cli.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "common/error.h"
#include "app/offline_commands.h"
#include "app/scenario_flags.h"

namespace ppb {

namespace {

/// ">= 0" check with a short message (CLI::NonNegativeNumber prints the range up to DBL_MAX).
const CLI::Validator kNonNegative(
    [](std::string& value) -> std::string {
      try {
        std::size_t used = 0;
        const double v = std::stod(value, &used);
        if (used == value.size() && v >= 0) return {};
      } catch (const std::exception&) {
      }
      return "must be a number >= 0, got '" + value + "'";
    },
    ">= 0");

/// Runs `fn` and exits with its status; UserError -> 2, anything else -> 1.
template <class Fn>
[[noreturn]] void run_and_exit(Fn&& fn) {
  int status = 1;
  try {
    status = fn();
  } catch (const UserError& e) {
    std::cerr << "ppbench: error: " << e.what() << std::endl;
    status = 2;
  } catch (const std::exception& e) {
    std::cerr << "ppbench: fatal: " << e.what() << std::endl;
    status = 1;
  }
  std::cout.flush();
  std::exit(status);
}

/// `ppbench plan` (issue 36): its flags and help.
void add_plan_command(CLI::App& app) {
  static PlanOptions plan;
  auto* pl = app.add_subcommand("plan", "the deployment planner: every layout of N devices (stages, tensor-parallel "
                                        "widths, split, groups in flight) predicted from a profile; the Pareto front "
                                        "and the best under latency targets (no MPI)");
  pl->add_option("input", plan.input, "results .h5 of `ppbench run` or `ppbench profile` (tensor-parallel widths: "
                                      "profile with --tp auto or run --tp 1 --tp 2)")
      ->required();
  pl->add_option("--devices", plan.devices, "N devices like the file's rank 0 (N may exceed the ranks profiled)")
      ->required();
  pl->add_option("--batch", plan.batch, "B sequences per group, a list such as 4: only the file's B (the step time of "
                                        "another B is not measured, and plan has no batch-scaling model)");
  pl->add_option("--replicas", plan.replicas,
                 "auto | R: the N devices as R identical pipelines of N/R devices, the requests spread over them "
                 "round-robin (data parallel x pipeline x tensor parallel): tokens/s x R, per device, per user, TTFT "
                 "and TPOT a replica's; auto: every R dividing N whose N/R devices one pipeline can use (R = 1: one "
                 "pipeline); with --scenario each replica serves the requests sent to it at random (rate / R)")
      ->capture_default_str();
  pl->add_option("--top", plan.top, "print the K front points with the most tokens/s (0 = all)")->check(kNonNegative);
  pl->add_flag("--csv", plan.csv, "every candidate as CSV on stdout (columns front, meets_slo) instead of the tables");
  pl->add_option("--json", plan.json_out, "write every candidate, the front and the choice as JSON to this file (not "
                                          "the input; an existing file only with --force)");
  pl->add_flag("--force", plan.force, "overwrite an existing --json file");
  add_scenario_flags(*pl, plan.scenario, serving::ScenarioUse::Command::plan);
  pl->footer(
      "Layouts: S stages on consecutive devices, each of width 1 or a width the file profiled (a group within one\n"
      "machine of as many devices as the file's rank 0 shared), the balanced split of that layout, M = 1..2S groups.\n"
      "Every layout while there are at most 256, else per S the widths with the smallest bottleneck.\n"
      "Replicas (--replicas auto): each R dividing N searched for N/R devices, tokens/s x R (\"DP2 PP2 M4\").\n"
      "Each predicted by the run's own model (as `ppbench simulate`). B: only the file's. docs/OFFLINE.md.\n"
      "With --scenario: every layout (unpruned) searched for its highest request rate within the SLO.\n"
      "Example: ppbench plan results/profile.h5 --devices 4 --slo-tpot 200\n"
      "Example: ppbench plan results/profile.h5 --devices 8 --scenario poisson --slo-ttft 2000 --slo-tpot 200");
  pl->callback([] { run_and_exit([] { return plan_command(plan); }); });
}

/// `ppbench serve-search` (issue 38): its flags and help.
void add_serve_search_command(CLI::App& app) {
  static ServeSearchOptions ss;
  auto* c = app.add_subcommand("serve-search", "the highest request rate each partition serves within TTFT/TPOT "
                                               "limits, by bisection on the serving simulator from a profile (no MPI)");
  c->add_option("input", ss.input, "results .h5 of `ppbench run` (its partitions) or `ppbench profile` (the uniform "
                                   "split of its ranks)")
      ->required();
  add_scenario_flags(*c, ss.scenario, serving::ScenarioUse::Command::serve_search);
  c->add_flag("--mlperf", ss.mlperf, "MLPerf's Server rule instead: p99 TTFT and p99 TPOT each within its limit, "
                                     "with LoadGen's early stopping and at least 100 queries");
  c->add_option("-M,--microbatches", ss.microbatches, "groups in flight (0 = each partition's own)")
      ->capture_default_str();
  c->add_option("-b,--batch", ss.batch, "slots per group (0 = the file's B; at most the file's B)")
      ->capture_default_str();
  c->add_option("--partition-name", ss.partition_name, "only this partition of the file");
  c->add_flag("--calibrated", ss.calibrated,
              "a file of `ppbench run --scenario`: scale the step model per rank by the steps its scenario measured "
              "(a scale per kind of step, decode or with prefill, where the profile timed the step model's grid; else per band of step tokens: the two-shape "
              "model misses small-prefill GEMM costs: DESIGN.md)");
  c->add_option("--json", ss.json_out, "write every search's probes and answer as JSON to this file (not the input; "
                                       "an existing file only with --force)");
  c->add_flag("--force", ss.force, "overwrite an existing --json file");
  c->footer(
      "One scenario for every rate: N requests drawn from the seed at 1 request/s, their arrivals divided by R.\n"
      "The rate is bracketed by doubling (halving) from a light load, then bisected to 1% of the rate.\n"
      "Step times: the step model fitted to the profile's grid (/profile/step_model), or in files without one prefill\n"
      "linear in tokens and decode at the rows' mean context (docs/OFFLINE.md). With the grid, each answer comes with\n"
      "a band: the rate again with every step slower and faster by the model's held-out error (the interpolation's\n"
      "uncertainty; not the machine's drift between the profile and a later run).\n"
      "Example: ppbench serve-search results/run.h5 --slo-ttft 2000 --slo-tpot 200 --attainment 0.99");
  c->callback([] { run_and_exit([] { return serve_search_command(ss); }); });
}

}  // namespace

void add_offline_commands(CLI::App& app) {
  // Options live as long as the process: the callbacks run inside app.parse().
  static BalanceOptions bal;
  static DescribeOptions desc;

  auto* d = app.add_subcommand("describe", "print the model's units as ppbench splits them: parameters, weight bytes, "
                                           "KV-cache bytes and FLOPs per token (no MPI)");
  d->add_option("--model", desc.model, "HF config.json")->required();
  d->add_option("--dtype", desc.dtype, "bytes of a weight and a KV element: f32 | bf16 | f16")->capture_default_str();
  d->add_option("--context", desc.context, "attended positions of the decode step whose FLOPs per token are shown")
      ->capture_default_str();
  d->add_option("--json", desc.json_out, "also write it as JSON to this file (an existing file only with --force)");
  d->add_flag("--force", desc.force, "overwrite an existing --json file");
  d->callback([] { run_and_exit([] { return describe_command(desc); }); });
  static SimulateOptions sim;

  auto* b = app.add_subcommand("balance", "solve the stage split offline from a results file or a latency JSON (no MPI)");
  b->add_option("input", bal.input, "results .h5 of `ppbench run`, or a latency JSON: {\"latency_ms\" [devices][units] "
                                    "or one row (ms), optional units, weight_bytes, kv_bytes, device_memory_bytes, "
                                    "activation_bytes, link_bandwidth_GBps, link_latency_us, overlap} (docs/OFFLINE.md)")
      ->required();
  b->add_option("-k,--stages", bal.stages, "pipeline stages (0 = one per device row)")
      ->check(kNonNegative)
      ->capture_default_str();
  b->add_option("--solver", bal.solver, "auto | dp | fast (exact balanced) | uniform | seed")->capture_default_str();
  b->add_option("--order", bal.order, "device order: rank | auto (search which device runs which stage; exact "
                                      "solvers only, refused with --solver uniform/seed or --partition)")
      ->capture_default_str();
  b->add_option("--partition", bal.partition, "evaluate a manual split instead, e.g. 5,6,5,6 (units per stage; "
                                              "refused with --solver other than auto)");
  b->add_option("--uniform-remainder", bal.uniform_remainder,
                "--solver uniform only: leftover layers go to first (default) | last | spread");
  b->add_option("--objective", bal.objective, "results files only: stage cost = workload (prefill + G x decode) | decode | "
                                              "prefill (default: the run's objective)");
  b->add_option("--memory-limit", bal.memory_limit_gib, "GiB of weights + KV cache per device (0 = from the input)")
      ->check(kNonNegative)
      ->capture_default_str();
  b->add_option("--link-bandwidth", bal.link_bandwidth_GBps, "GB/s between stages (overrides the input; 0 = free)")
      ->check(kNonNegative);
  b->add_option("--link-latency", bal.link_latency_us, "microseconds per message (overrides the input)")
      ->check(kNonNegative);
  b->add_flag("--no-overlap", bal.no_overlap, "transfers on the compute lane (sum, not max)");
  b->add_option("--tp", bal.tp, "auto: choose the tensor-parallel widths, the stages and the split together, from a "
                                "results file profiled at several widths (`ppbench run --tp 1 --tp 2`)");
  b->add_option("--devices", bal.devices, "with --tp auto: lay out this many devices like the file's (default: its "
                                          "ranks) and say what they buy against the file's rank count")
      ->check(kNonNegative);
  b->add_option("--json", bal.json_out, "write the split as JSON to this file (not the input; an existing file only with --force)");
  b->add_flag("--force", bal.force, "overwrite an existing --json file");
  b->footer(
      "A results file of R ranks gives R device rows: --stages K <= R, or any K when the R ranks ran on identical\n"
      "devices (their mean row is used). Input formats, limits and output: docs/OFFLINE.md.\n"
      "Example: ppbench balance results/run.h5 --stages 4 --json split.json\n"
      "         ppbench balance results/tp.h5 --tp auto --devices 3   (one more device: widen a stage, or add one?)");
  b->callback([] { run_and_exit([] { return balance_command(bal); }); });

  auto* s = app.add_subcommand("simulate", "predict tokens/s, TTFT, TPOT and bubbles of the pipelined loop (no MPI)");
  s->add_option("input", sim.input, "results .h5 (each partition; with measurements when benchmarked) or a stage JSON "
                                    "{\"stages\": [{\"prefill_ms\", \"decode_ms\"[, \"send_prefill_ms\", "
                                    "\"send_decode_ms\"]}], optional \"microbatches\", \"gen_len\", \"batch\", "
                                    "\"overlap\"} (docs/OFFLINE.md)")
      ->required();
  s->add_option("--partition-name", sim.partition_name, "results files: only this partition");
  s->add_option("--partition", sim.partition,
                "results files (a run's, or a `ppbench profile` file's): predict this split instead, units per stage "
                "such as 17,13 (stage k on rank k), from the profile by the run's own model; a split the run "
                "measured is compared with its measurement");
  s->add_option("-M,--microbatches", sim.microbatches, "M request groups (0 = from the input)")
      ->check(kNonNegative)
      ->capture_default_str();
  s->add_option("-g,--gen-len", sim.gen_len, "G decode steps (0 = from the input)")
      ->check(kNonNegative)
      ->capture_default_str();
  s->add_option("-b,--batch", sim.batch, "B sequences per group (0 = from the input)")
      ->check(kNonNegative)
      ->capture_default_str();
  s->add_option("--link-bandwidth", sim.link_bandwidth_GBps,
                "results files: GB/s of activation transfers (default: the run's measured link; 0 = infinite)")
      ->check(kNonNegative);
  s->add_option("--link-latency", sim.link_latency_us,
                "results files: microseconds per message (default: the run's; --link-bandwidth 0 --link-latency 0 = free)")
      ->check(kNonNegative);
  s->add_flag("--no-overlap", sim.no_overlap, "recv, compute and send on one lane");
  s->add_flag("--eager", sim.eager_sends, "eager sends (the sender does not wait for the recv to be posted)");
  s->add_flag("--no-step-model", sim.no_step_model,
              "serving files: predict from the profile's two shapes (prefill of B*P tokens scaled, decode of B rows) "
              "instead of the step model fitted to /profile/step_model, as files without the grid are");
  s->add_option("--json", sim.json_out, "write the predictions as JSON to this file (not the input; an existing file only with --force)");
  s->add_flag("--force", sim.force, "overwrite an existing --json file");
  s->footer(
      "Prints per partition: predicted (from the profile), replayed (the run's measured step times played through the\n"
      "same simulator) and measured; the predicted / measured error only when -M/-g/-b match the run's workload.\n"
      "-b scales the tokens per step, not the step times (measured at the run's B). M x (G+1) x stages <= 2^21.\n"
      "Formats and every printed column: docs/OFFLINE.md.");
  s->callback([] { run_and_exit([] { return simulate_command(sim); }); });

  add_plan_command(app);
  add_serve_search_command(app);
}

}  // namespace ppb
