// A serving scenario as one value (issue 48): how requests arrive (a process or a trace), how
// long they are, how the engine schedules them and what they are judged by. Parsed once from the
// flags (parse_scenario; `ppbench run`, `plan` and `serve-search` register the same flags,
// app/scenario_flags.h), stored whole in the results file (/scenario: results/serving_io.h) and
// read back as it was (scenario_from_json, which refuses what this binary cannot play), and
// handed as it is to the scheduler (scheduler()), the serving simulator and the calibration:
// no later phase re-parses a flag or rebuilds a scheduler configuration from loose fields.
//
// A new arrival process or step policy is a field here (with its to_json / from_json key and its
// flag in parse_scenario and app/scenario_flags.cpp), and its own code in arrivals.cpp or
// scheduler.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/workload.h"
#include "serving/arrivals.h"
#include "serving/rate_search.h"
#include "serving/request_metrics.h"
#include "serving/scheduler.h"
#include "serving/trace.h"

namespace ppb::serving {

/// Where the arrivals come from: a Poisson or Gamma process (arrivals.h), or a trace (trace.h).
enum class ArrivalKind { poisson, gamma, trace };

/// "poisson", "gamma" or "trace" (the --scenario value; /scenario's kind).
const char* arrival_kind_name(ArrivalKind k);

/// The whole serving scenario.
struct ScenarioSpec {
  ArrivalKind kind = ArrivalKind::poisson;
  /// R (requests/s, may be +inf) and the Gamma shape K (poisson: 1). With rate_search R = 1: the
  /// requests are drawn at 1 request/s and scaled to each rate measured (scale_arrivals).
  ArrivalSpec arrivals;
  /// The rate is searched: the highest one meeting slo() (`run --request-rate search`, measured
  /// around it: run/serving_search.h; always in `plan --scenario` and `serve-search`).
  bool rate_search = false;
  int requests = 1;                  ///< N (poisson, gamma), >= 1
  LengthSpec prompt_lens, gen_lens;  ///< token counts (poisson, gamma); .text as given
  /// Every prompt and output clamped to [1, these] (run: -p and -g, the longest request the
  /// stages hold; the caller keeps max_prompt_len + max_gen_len within the context).
  int max_prompt_len = 1, max_gen_len = 1;
  uint64_t seed = 0;                 ///< arrivals and lengths (generate_requests)
  std::string trace;                 ///< kind trace: the file (trace.h's formats)
  TraceOptions trace_options;        ///< kind trace: --trace-speedup, --trace-window
  StepPolicy policy = StepPolicy::mixed;  ///< scheduler.h
  /// `run --step-policy A,B,...`: the policies after the first, each measured on every split in the
  /// same rounds, paired with the first (run/plan.h policy_variants); empty: one policy.
  std::vector<StepPolicy> compared_policies;
  PpSchedule pp_schedule = PpSchedule::groups;  ///< scheduler.h
  /// `run --pp-schedule A,B`: the schedules after the first, measured alike (with every policy).
  std::vector<PpSchedule> compared_schedules;
  int max_concurrency = 0;           ///< the client's limit on requests in flight (scheduler.h; 0: none)
  int max_batched_tokens = 2048;     ///< vllm-v1: tokens per step at most (scheduler.h)
  int kv_block_size = 16;            ///< tokens per KV block (scheduler.h)
  /// Blocks of each group's KV pool (0: every slot at the longest request; kKvBlocksAuto: `run`
  /// sizes it per split from its stages' free memory, run/memory_checks.h auto_kv_blocks).
  int kv_blocks = 0;
  int slots = 1;                     ///< B: requests per group at once (the groups are the layout's M)
  GoodputSpec goodput;               ///< each request's limits, ms (NaN: none)
  double attainment = 0.9;           ///< the share of requests that must meet them, (0, 1]

  /// The scheduler of a layout with `groups` groups in flight (M >= 1), under `policy_name` and
  /// `schedule_name` (their names, "" = `policy`, `pp_schedule`; @throws ppb::UserError on an
  /// unknown name).
  SchedulerConfig scheduler(int groups, const std::string& policy_name = "", const std::string& schedule_name = "") const {
    const StepPolicy p = policy_name.empty() ? policy : parse_step_policy(policy_name);
    const PpSchedule q = schedule_name.empty() ? pp_schedule : parse_pp_schedule(schedule_name);
    return {groups, slots, p, max_concurrency, max_batched_tokens, kv_block_size, kv_blocks, q};
  }
  /// Whether some policy of the run (the first or a compared one) is `p`.
  bool runs_policy(StepPolicy p) const;
  /// goodput's TTFT and TPOT limits with `attainment` (the rate searches' SLO).
  SloTarget slo() const;
};

/// The scenario's requests, the same on every rank that reads the same spec: drawn from the seed
/// (generate_requests) or read from the trace (clamped to the maxima).
/// What reading a trace found (trace.h Trace): its format, its rows, those clamped, dropped
/// (BurstGPT's failed requests) and outside the window; Mooncake's prompt blocks and those an
/// earlier request had. Empty format: not a trace.
struct TraceCounts {
  std::string format;
  int rows = 0, clamped = 0, dropped = 0, outside_window = 0;
  long long prefix_blocks = 0, reused_prefix_blocks = 0;
};

struct ScenarioRequests {
  std::vector<Request> requests;  ///< in arrival order
  TraceCounts trace;              ///< kind trace
};

/// Draws or reads `spec`'s requests. @throws ppb::UserError from the trace reader or the
/// generator (naming the file and line, or the flag).
ScenarioRequests scenario_requests(const ScenarioSpec& spec);

/// The N requests of a poisson or gamma `spec`, in arrival order. Three independent streams, so
/// that changing one distribution leaves the others' draws as they were: the gaps from
/// std::mt19937_64(seed), prompt lengths from std::mt19937_64(seed + 1), output lengths from
/// std::mt19937_64(seed + 2), request i taking the i-th draw of each. Deterministic for a seed
/// (same binary). Throws ppb::UserError on N < 1, a maximum < 1 or an invalid arrival spec.
std::vector<Request> generate_requests(const ScenarioSpec& spec);

/// The spec as one flat JSON object (the results file's /scenario attributes; keys: kind,
/// request_rate, burstiness, rate_search, requests, prompt_lens, gen_lens, max_prompt_len,
/// max_gen_len, seed, trace, trace_speedup, trace_window_start_s, trace_window_end_s,
/// step_policy, compared_step_policies, pp_schedule, compared_pp_schedules, max_batched_tokens, kv_block_size, kv_blocks (-1: auto), max_concurrency, ramp_up_strategy, ramp_up_start_rps, ramp_up_end_rps, slots,
/// goodput, attainment).
nlohmann::json scenario_to_json(const ScenarioSpec& spec);

/// The spec `j` describes (scenario_to_json's keys; a key missing takes the default of a file
/// written before it existed). @throws ppb::UserError naming `where` and the key when a value is
/// unknown to this binary (a step policy or kind it cannot play) or malformed: a stored scenario
/// is never played as something else.
ScenarioSpec scenario_from_json(const nlohmann::json& j, const std::string& where);

/// One line for summaries: "poisson at 4 requests/s, 64 requests, prompts lognormal:8,0.5, ...".
std::string describe_scenario(const ScenarioSpec& spec);

/// The scenario's flags as given (app/scenario_flags.h registers them, the same on every command).
struct ScenarioFlags {
  std::string scenario;      ///< closed | poisson | gamma | trace; "" = the command's default
  std::string request_rate;  ///< `run`: R, inf or search; "" = not given
  double burstiness = 1.0;  ///< 1 = not given (poisson)
  int requests = -1;         ///< -1 = the command's default
  std::string prompt_lens, gen_lens, trace;
  double trace_speedup = 1.0;  ///< `run --scenario trace`: arrivals divided by this
  std::string trace_window;    ///< `run --scenario trace`: START:END (s of the trace; "" = all, END may be empty)
  std::vector<std::string> goodput;     ///< ttft:MS tpot:MS e2e:MS
  double slo_ttft_ms = 0, slo_tpot_ms = 0;  ///< --slo-ttft / --slo-tpot (0: not given)
  double attainment = 0.9;  ///< 0.9 = not given
  std::string step_policy = "mixed";  ///< one name, or (run) several comma-separated
  std::string pp_schedule = "groups";  ///< --pp-schedule: one name, or (run) several comma-separated
  int max_concurrency = 0;   ///< --max-concurrency N (0: none)
  int max_batched_tokens = 2048;  ///< --max-batched-tokens T (with --step-policy vllm-v1)
  int kv_block_size = 16;   ///< --kv-block-size TOKENS
  std::string kv_blocks = "0";  ///< --kv-blocks N | auto (0: every slot at the longest request)
  std::string ramp_up_strategy;  ///< `run`: linear | exponential ("" = none)
  double ramp_up_start_rps = 0, ramp_up_end_rps = 0;
  uint64_t seed = kDefaultSeed;  ///< the offline commands' --seed (`run` passes its own, of the same default)
};

/// Which command parses the flags, and what it fills in.
struct ScenarioUse {
  enum class Command { run, plan, serve_search };
  Command command = Command::run;
  int prompt_len = 1, gen_len = 1;          ///< P and G: the default fixed lengths
  int max_prompt_len = 1, max_gen_len = 1;  ///< the clamps
  int slots = 1;                            ///< B
  uint64_t seed = 0;                        ///< `run`'s --seed (the offline commands take ScenarioFlags::seed)
};

/// The spec the flags give for `use`'s command; nullopt for closed batches (run and plan without
/// --scenario, or with --scenario closed). Rules: run takes closed | poisson | gamma | trace
/// with --request-rate (poisson, gamma) or --trace; plan takes closed | poisson | gamma and
/// serve-search poisson | gamma (default poisson; --burstiness alone means gamma there), both
/// with the TTFT and TPOT limits required (the rate is what they search); --slo-ttft MS and
/// --slo-tpot MS are --goodput ttft:MS tpot:MS. @throws ppb::UserError naming the flag, the value
/// and what would be valid.
std::optional<ScenarioSpec> parse_scenario(const ScenarioFlags& flags, const ScenarioUse& use);

}  // namespace ppb::serving
