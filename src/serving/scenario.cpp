// The serving scenario as one value: its requests, its record in the results file, and the one
// parser of its flags (scenario.h).
#include "serving/scenario.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "serving/trace.h"

namespace ppb::serving {

namespace {

using json = nlohmann::json;
using Command = ScenarioUse::Command;

constexpr int kMaxRequests = 1000000;

struct KindRow {
  ArrivalKind kind;
  const char* name;
};
constexpr KindRow kKinds[] = {{ArrivalKind::poisson, "poisson"}, {ArrivalKind::gamma, "gamma"}, {ArrivalKind::trace, "trace"}};

/// "vllm-v1,prefill-first": the values' names (`name`), comma-separated; "" for none.
template <class T>
std::string list_text(const std::vector<T>& values, const char* (*name)(T)) {
  std::string out;
  for (T v : values) {
    if (!out.empty()) out += ',';
    out += name(v);
  }
  return out;
}

std::string policy_list_text(const std::vector<StepPolicy>& ps) { return list_text(ps, step_policy_name); }
std::string schedule_list_text(const std::vector<PpSchedule>& ss) { return list_text(ss, pp_schedule_name); }

/// "a,b,c" as {"a", "b", "c"}; "" as {}; "a," as {"a", ""} (an empty name is refused by its parser).
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  for (std::size_t b = 0;;) {
    std::size_t e = text.find(',', b);
    if (e == std::string::npos) e = text.size();
    out.push_back(text.substr(b, e - b));
    if (e == text.size()) break;
    b = e + 1;
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// A rate or shape that may be +inf: JSON has no infinity, so "inf" stands for it.
json number_or_inf(double v) { return std::isinf(v) && v > 0 ? json("inf") : json(v); }

double number_or_inf(const json& j, const char* key, double fallback) {
  if (!j.contains(key)) return fallback;
  const json& v = j.at(key);
  if (v.is_string() && v.get<std::string>() == "inf") return std::numeric_limits<double>::infinity();
  return v.get<double>();
}

const char* command_name(Command c) {
  return c == Command::run ? "run" : c == Command::plan ? "plan" : "serve-search";
}

/// A --step-policy or --pp-schedule list parsed by `parse`: each name once, more than one only on run.
template <class T, class Parse, class Name>
std::vector<T> parse_list(const std::string& flag, const std::string& text, Command c, Parse parse, Name name) {
  std::vector<T> out;
  for (const std::string& item : split_list(text.empty() ? std::string(" ") : text)) {
    const T v = parse(item);
    if (std::find(out.begin(), out.end(), v) != out.end())
      throw UserError(flag + " '" + text + "' names " + name(v) + " twice; give each once, the first the one the "
                      "others are paired with (e.g. " + (flag == "--step-policy" ? "mixed,vllm-v1" : "groups,batch-queue") + ")");
    out.push_back(v);
  }
  if (out.size() > 1 && c != Command::run)
    throw UserError(flag + " '" + text + "': a list is `ppbench run`'s (each measured on every split in the same "
                    "rounds); " + command_name(c) + " takes one");
  return out;
}


/// The kinds a command takes, for its error message.
std::string valid_kinds(Command c) {
  switch (c) {
    case Command::run:
      return "closed (closed batches, the default), poisson (--request-rate R), gamma (--request-rate R --burstiness "
             "K), trace (--trace FILE.csv)";
    case Command::plan:
      return "closed (the closed-batch front, the default), poisson, gamma (with --burstiness)";
    case Command::serve_search:
      break;
  }
  return "poisson (the default), gamma (with --burstiness)";
}

/// --request-rate R: a number of requests/s (> 0; "inf": every request at t = 0).
double parse_rate(const std::string& text) {
  double r = 0;
  std::size_t used = 0;
  try {
    r = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(r > 0))
    throw UserError("--request-rate '" + text + "' is not a rate; valid: requests/s > 0 (e.g. 4 or 0.5), inf (every "
                    "request at t = 0), or search");
  return r;
}

/// The flags that describe requests that arrive, refused on closed batches (the first given).
void refuse_on_closed(const ScenarioFlags& f, Command c) {
  const char* flag = !f.request_rate.empty()   ? "--request-rate"
                     : !f.trace.empty()        ? "--trace"
                     : !f.prompt_lens.empty()  ? "--prompt-lens"
                     : !f.gen_lens.empty()     ? "--gen-lens"
                     : !f.goodput.empty()      ? "--goodput"
                     : f.trace_speedup != 1.0  ? "--trace-speedup"
                     : f.max_concurrency != 0  ? "--max-concurrency"
                     : !f.ramp_up_strategy.empty() ? "--ramp-up-strategy"
                     : !f.trace_window.empty() ? "--trace-window"
                     : f.burstiness != 1.0     ? "--burstiness"
                     : f.attainment != 0.9     ? "--attainment"
                     : f.requests != -1        ? "--requests"
                     : f.step_policy != "mixed" ? "--step-policy"
                     : f.pp_schedule != "groups" ? "--pp-schedule"
                     : f.max_batched_tokens != 2048 ? "--max-batched-tokens"
                     : f.kv_blocks != "0"      ? "--kv-blocks"
                     : f.kv_block_size != 16   ? "--kv-block-size"
                                               : nullptr;
  if (c == Command::run && !flag && (f.slo_ttft_ms > 0 || f.slo_tpot_ms > 0)) flag = f.slo_ttft_ms > 0 ? "--slo-ttft" : "--slo-tpot";
  if (!flag) return;
  if (c == Command::run)
    throw UserError(std::string(flag) + " describes requests that arrive; add --scenario poisson, gamma or trace "
                    "(the default --scenario closed runs closed batches of B sequences of P and G tokens)");
  throw UserError(std::string(flag) + " describes requests that arrive; add --scenario poisson or gamma (without it "
                  "plan ranks the layouts by closed batches)");
}

/// --goodput with --slo-ttft / --slo-tpot folded in (each limit given once).
GoodputSpec limits_of(const ScenarioFlags& f) {
  GoodputSpec g = parse_goodput(f.goodput);
  const std::pair<const char*, double> shorthand[] = {{"--slo-ttft", f.slo_ttft_ms}, {"--slo-tpot", f.slo_tpot_ms}};
  for (const auto& [flag, ms] : shorthand) {
    if (ms == 0) continue;
    if (!(ms > 0) || !(ms <= 1e12))
      throw UserError(std::string(flag) + " " + num(ms) + ": a limit in ms, > 0 and <= 1e12");
    double& slot = std::string(flag) == "--slo-ttft" ? g.ttft_ms : g.tpot_ms;
    if (!std::isnan(slot))
      throw UserError(std::string(flag) + " and --goodput both give the " + (flag + 6) + " limit: give it once");
    slot = ms;
  }
  return g;
}

/// The rate searches' SLO (run --request-rate search, plan --scenario, serve-search): both limits,
/// no e2e, an attainment in (0, 1].
void check_search_slo(const ScenarioSpec& s, Command c) {
  const std::string who = c == Command::run ? "--request-rate search" : std::string(command_name(c)) +
                                                                          (c == Command::plan ? " --scenario" : "");
  if (std::isnan(s.goodput.ttft_ms) || std::isnan(s.goodput.tpot_ms) || !std::isnan(s.goodput.e2e_ms))
    throw UserError(who + " needs a TTFT and a TPOT limit (--slo-ttft MS --slo-tpot MS, or --goodput ttft:MS tpot:MS; "
                    "no e2e): each request's limits, whose highest rate is searched");
  if (!(s.goodput.ttft_ms > 0) || !(s.goodput.tpot_ms > 0))
    throw UserError(who + ": the TTFT and TPOT limits must be > 0 ms");
  if (!(s.attainment > 0) || !(s.attainment <= 1))
    throw UserError("--attainment " + num(s.attainment) + ": the share of requests that must meet both limits, in "
                    "(0, 1], e.g. 0.9 or 0.99");
}

/// The lengths and arrivals of a poisson or gamma scenario.
void parse_process(const ScenarioFlags& f, const ScenarioUse& use, ScenarioSpec& s) {
  if (s.requests < 1 || s.requests > kMaxRequests)
    throw UserError("--requests " + std::to_string(s.requests) + ": between 1 and " + std::to_string(kMaxRequests));
  if (s.kind == ArrivalKind::poisson && f.burstiness != 1.0)
    throw UserError("--scenario poisson has burstiness 1 (exponential gaps); for --burstiness " + num(f.burstiness) +
                    " use --scenario gamma");
  s.arrivals.burstiness = f.burstiness;
  validate(s.arrivals);
  s.prompt_lens = parse_length_spec(f.prompt_lens.empty() ? "fixed:" + std::to_string(use.prompt_len) : f.prompt_lens,
                                    "--prompt-lens");
  s.gen_lens = parse_length_spec(f.gen_lens.empty() ? "fixed:" + std::to_string(use.gen_len) : f.gen_lens, "--gen-lens");
}

/// `run`'s rate: R, inf, or search (then the requests are drawn at 1 request/s).
void parse_run_rate(const ScenarioFlags& f, ScenarioSpec& s) {
  const std::string kind = arrival_kind_name(s.kind);
  if (!f.ramp_up_strategy.empty()) {  // vLLM's ramp: the rates of the first and the last request
    if (!f.request_rate.empty())
      throw UserError("--ramp-up-strategy sets each request's rate from --ramp-up-start-rps to --ramp-up-end-rps; "
                      "drop --request-rate");
    s.arrivals.ramp = parse_ramp_up(f.ramp_up_strategy);
    s.arrivals.ramp_start_rps = f.ramp_up_start_rps;
    s.arrivals.ramp_end_rps = f.ramp_up_end_rps;
    s.arrivals.request_rate = std::max(f.ramp_up_start_rps, f.ramp_up_end_rps);  // unused with a ramp
    validate(s.arrivals);
    return;
  }
  if (f.ramp_up_start_rps != 0 || f.ramp_up_end_rps != 0)
    throw UserError("--ramp-up-start-rps and --ramp-up-end-rps go with --ramp-up-strategy linear|exponential");
  if (f.request_rate.empty())
    throw UserError("--scenario " + kind + " needs --request-rate R (requests/s, > 0; inf: all at t = 0; search: the "
                    "highest rate that meets --goodput's TTFT and TPOT limits, predicted and measured)");
  s.rate_search = f.request_rate == "search";
  s.arrivals.request_rate = s.rate_search ? 1.0 : parse_rate(f.request_rate);
  if (s.rate_search) check_search_slo(s, Command::run);
  else if (f.attainment != 0.9)
    throw UserError("--attainment goes with --request-rate search (the share of requests the searched rate must serve "
                    "within --goodput's limits)");
}

/// --trace-speedup X and --trace-window START:END (END may be empty: to the end).
TraceOptions trace_options_of(const ScenarioFlags& f) {
  TraceOptions o;
  o.speedup = f.trace_speedup;
  if (!(o.speedup > 0) || !std::isfinite(o.speedup))
    throw UserError("--trace-speedup " + num(o.speedup) + ": a factor > 0 (2: the trace's arrivals at twice its rate)");
  if (f.trace_window.empty()) return o;
  const auto colon = f.trace_window.find(':');
  auto seconds = [&](const std::string& t, double& out) {
    std::size_t used = 0;
    try {
      out = std::stod(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    return used == t.size() && !t.empty() && std::isfinite(out) && out >= 0;
  };
  const std::string a = f.trace_window.substr(0, colon), b = colon == std::string::npos ? "" : f.trace_window.substr(colon + 1);
  if (colon == std::string::npos || !seconds(a, o.window_start_s) || (!b.empty() && !seconds(b, o.window_end_s)) ||
      !(o.window_end_s > o.window_start_s))
    throw UserError("--trace-window '" + f.trace_window + "': START:END in seconds of the trace's own clock (from its "
                    "first row), 0 <= START < END; END may be left out (to the end), e.g. 3600:7200 or 600:");
  return o;
}

ArrivalKind kind_of(const std::string& text, Command c) {
  for (const KindRow& r : kKinds)
    if (text == r.name && (c == Command::run || r.kind != ArrivalKind::trace)) return r.kind;
  throw UserError("--scenario '" + text + "' is unknown" + (c == Command::run ? "" : std::string(" for ") + command_name(c)) +
                  "; valid: " + valid_kinds(c));
}

}  // namespace

const char* arrival_kind_name(ArrivalKind k) {
  for (const KindRow& r : kKinds)
    if (r.kind == k) return r.name;
  throw InternalError("arrival_kind_name: a kind without a row");
}

SloTarget ScenarioSpec::slo() const {
  SloTarget t;
  t.ttft_ms = goodput.ttft_ms;
  t.tpot_ms = goodput.tpot_ms;
  t.attainment = attainment;
  return t;
}

std::vector<Request> generate_requests(const ScenarioSpec& spec) {
  if (spec.requests < 1) throw UserError("--requests " + std::to_string(spec.requests) + ": must be >= 1");
  if (spec.max_prompt_len < 1 || spec.max_gen_len < 1)
    throw UserError("the context leaves no room for a request: prompt limit " + std::to_string(spec.max_prompt_len) +
                    ", output limit " + std::to_string(spec.max_gen_len) + " (each must be >= 1)");
  std::mt19937_64 gap_rng(spec.seed), prompt_rng(spec.seed + 1), gen_rng(spec.seed + 2);
  const std::vector<double> t = arrival_times(spec.arrivals, draw_gaps(spec.arrivals, spec.requests, gap_rng));
  std::vector<Request> out(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    out[i].arrival_s = t[i];
    out[i].prompt_len = draw_length(spec.prompt_lens, spec.max_prompt_len, prompt_rng);
    out[i].gen_len = draw_length(spec.gen_lens, spec.max_gen_len, gen_rng);
  }
  return out;
}

ScenarioRequests scenario_requests(const ScenarioSpec& spec) {
  ScenarioRequests out;
  if (spec.kind != ArrivalKind::trace) {
    out.requests = generate_requests(spec);
    return out;
  }
  Trace t = read_trace(spec.trace, spec.max_prompt_len, spec.max_gen_len, spec.trace_options);
  out.requests = std::move(t.requests);
  out.trace = {format_name(t.format), t.rows, t.clamped_rows, t.dropped_rows, t.outside_window, t.prefix_blocks,
               t.reused_prefix_blocks};
  return out;
}

json scenario_to_json(const ScenarioSpec& s) {
  return {{"kind", arrival_kind_name(s.kind)},
          {"request_rate", number_or_inf(s.arrivals.request_rate)},
          {"burstiness", number_or_inf(s.arrivals.burstiness)},
          {"rate_search", s.rate_search},
          {"requests", s.requests},
          {"prompt_lens", s.prompt_lens.text},
          {"gen_lens", s.gen_lens.text},
          {"max_prompt_len", s.max_prompt_len},
          {"max_gen_len", s.max_gen_len},
          {"seed", s.seed},
          {"trace", s.trace},
          {"trace_speedup", s.trace_options.speedup},
          {"trace_window_start_s", s.trace_options.window_start_s},
          {"trace_window_end_s", number_or_inf(s.trace_options.window_end_s)},
          {"step_policy", step_policy_name(s.policy)},
          {"compared_step_policies", policy_list_text(s.compared_policies)},
          {"pp_schedule", pp_schedule_name(s.pp_schedule)},
          {"compared_pp_schedules", schedule_list_text(s.compared_schedules)},
          {"max_batched_tokens", s.max_batched_tokens},
          {"kv_block_size", s.kv_block_size},
          {"kv_blocks", s.kv_blocks},
          {"max_concurrency", s.max_concurrency},
          {"ramp_up_strategy", ramp_up_name(s.arrivals.ramp)},
          {"ramp_up_start_rps", s.arrivals.ramp_start_rps},
          {"ramp_up_end_rps", s.arrivals.ramp_end_rps},
          {"slots", s.slots},
          {"goodput", goodput_text(s.goodput)},
          {"attainment", s.attainment}};
}

ScenarioSpec scenario_from_json(const json& j, const std::string& where) {
  ScenarioSpec s;
  const std::string at = where + " ";
  try {
    const std::string kind = j.at("kind").get<std::string>();
    bool known = false;
    for (const KindRow& r : kKinds)
      if (kind == r.name) s.kind = r.kind, known = true;
    if (!known)
      throw UserError(at + "kind '" + kind + "' is unknown to this ppbench; valid: poisson, gamma, trace");
    s.policy = parse_step_policy(j.value("step_policy", std::string("mixed")), at + "step_policy");
    for (const std::string& name : split_list(j.value("compared_step_policies", std::string())))
      s.compared_policies.push_back(parse_step_policy(name, at + "compared_step_policies"));
    s.pp_schedule = parse_pp_schedule(j.value("pp_schedule", std::string("groups")), at + "pp_schedule");
    for (const std::string& name : split_list(j.value("compared_pp_schedules", std::string())))
      s.compared_schedules.push_back(parse_pp_schedule(name, at + "compared_pp_schedules"));
    s.arrivals.request_rate = number_or_inf(j, "request_rate", 1.0);
    s.arrivals.burstiness = number_or_inf(j, "burstiness", 1.0);
    s.rate_search = j.value("rate_search", false);
    s.requests = j.value("requests", 1);
    s.max_prompt_len = j.value("max_prompt_len", 1);
    s.max_gen_len = j.value("max_gen_len", 1);
    s.seed = j.value("seed", uint64_t{0});
    s.trace = j.value("trace", std::string());
    s.trace_options.speedup = j.value("trace_speedup", 1.0);
    s.trace_options.window_start_s = j.value("trace_window_start_s", 0.0);
    s.trace_options.window_end_s = number_or_inf(j, "trace_window_end_s", std::numeric_limits<double>::infinity());
    s.slots = j.value("slots", 1);
    s.max_concurrency = j.value("max_concurrency", 0);
    s.max_batched_tokens = j.value("max_batched_tokens", 2048);
    s.kv_block_size = j.value("kv_block_size", 16);
    s.kv_blocks = j.value("kv_blocks", 0);
    s.arrivals.ramp = parse_ramp_up(j.value("ramp_up_strategy", std::string("none")));
    s.arrivals.ramp_start_rps = j.value("ramp_up_start_rps", 0.0);
    s.arrivals.ramp_end_rps = j.value("ramp_up_end_rps", 0.0);
    s.attainment = j.value("attainment", 0.9);
    const std::string goodput = j.value("goodput", std::string());
    if (!goodput.empty()) s.goodput = parse_goodput({goodput});
    const std::string prompt = j.value("prompt_lens", std::string()), gen = j.value("gen_lens", std::string());
    if (!prompt.empty()) s.prompt_lens = parse_length_spec(prompt, at + "prompt_lens");
    if (!gen.empty()) s.gen_lens = parse_length_spec(gen, at + "gen_lens");
  } catch (const json::exception& e) {
    throw UserError(at + "is not a scenario this ppbench reads: " + e.what());
  }
  return s;
}

bool ScenarioSpec::runs_policy(StepPolicy p) const {
  return policy == p || std::find(compared_policies.begin(), compared_policies.end(), p) != compared_policies.end();
}

std::string describe_scenario(const ScenarioSpec& s) {
  std::string out = arrival_kind_name(s.kind);
  if (s.kind == ArrivalKind::trace) {
    out += " " + s.trace;
    if (s.trace_options.window_start_s > 0 || std::isfinite(s.trace_options.window_end_s))
      out += " [" + num(s.trace_options.window_start_s) + ", " + num(s.trace_options.window_end_s) + ") s";
    if (s.trace_options.speedup != 1.0) out += " at " + num(s.trace_options.speedup) + "x its rate";
  } else {
    out += s.rate_search                    ? " at the searched rates"
           : s.arrivals.ramp != RampUp::none ? " ramped " + std::string(ramp_up_name(s.arrivals.ramp)) + " from " +
                                                   num(s.arrivals.ramp_start_rps) + " to " + num(s.arrivals.ramp_end_rps) +
                                                   " requests/s"
                                             : " at " + num(s.arrivals.request_rate) + " requests/s";
    if (s.kind == ArrivalKind::gamma) out += ", burstiness " + num(s.arrivals.burstiness);
    out += ", " + std::to_string(s.requests) + " requests, prompts " + s.prompt_lens.text + ", outputs " + s.gen_lens.text;
  }
  out += "; " + std::string(step_policy_name(s.policy)) + " steps of B=" + std::to_string(s.slots) + " slots";
  if (s.policy == StepPolicy::vllm_v1) out += " and at most " + std::to_string(s.max_batched_tokens) + " tokens";
  if (!s.compared_policies.empty())
    out += " (against " + policy_list_text(s.compared_policies) + " steps" +
           (s.policy != StepPolicy::vllm_v1 && s.runs_policy(StepPolicy::vllm_v1)
                ? " (vllm-v1's of at most " + std::to_string(s.max_batched_tokens) + " tokens)"
                : "") +
           " on every split, in the same rounds)";
  if (s.pp_schedule == PpSchedule::batch_queue) out += "; one batch queue over the groups' slots (vLLM V1's PP)";
  if (!s.compared_schedules.empty())
    out += "; against the " + schedule_list_text(s.compared_schedules) + " schedule on every split, in the same rounds";
  if (s.kv_blocks != 0)
    out += (s.kv_blocks == kKvBlocksAuto ? std::string("; a KV pool per split of as many blocks of ") +
                                               std::to_string(s.kv_block_size) +
                                               " tokens per group as its stages' free memory holds (auto; "
                                         : "; a KV pool of " + std::to_string(s.kv_blocks) + " blocks of " +
                                               std::to_string(s.kv_block_size) + " tokens per group (") +
           (s.pp_schedule == PpSchedule::batch_queue ||
                    std::find(s.compared_schedules.begin(), s.compared_schedules.end(), PpSchedule::batch_queue) !=
                        s.compared_schedules.end()
                ? "the batch queue: one pool of M x that; "
                : "") +
           "preemption by recompute)";
  if (s.max_concurrency > 0) out += "; at most " + std::to_string(s.max_concurrency) + " requests in flight (client)";
  const std::string g = goodput_text(s.goodput);
  if (!g.empty()) out += "; SLO " + g;
  return out;
}

std::optional<ScenarioSpec> parse_scenario(const ScenarioFlags& f, const ScenarioUse& use) {
  const Command c = use.command;
  std::string kind = f.scenario;
  if (kind.empty())  // serve-search always simulates arrivals; --burstiness alone means gamma there
    kind = c != Command::serve_search ? "closed" : f.burstiness != 1.0 ? "gamma" : "poisson";
  if (kind == "closed" && c != Command::serve_search) {
    refuse_on_closed(f, c);
    return std::nullopt;
  }
  ScenarioSpec s;
  s.kind = kind_of(kind, c);
  {
    const auto policies = parse_list<StepPolicy>("--step-policy", f.step_policy, c,
                                                 [](const std::string& t) { return parse_step_policy(t); }, step_policy_name);
    s.policy = policies.front();
    s.compared_policies.assign(policies.begin() + 1, policies.end());
    const auto schedules = parse_list<PpSchedule>("--pp-schedule", f.pp_schedule, c,
                                                  [](const std::string& t) { return parse_pp_schedule(t); }, pp_schedule_name);
    s.pp_schedule = schedules.front();
    s.compared_schedules.assign(schedules.begin() + 1, schedules.end());
  }
  if (f.max_concurrency < 0)
    throw UserError("--max-concurrency " + std::to_string(f.max_concurrency) + ": requests in flight at most, >= 1 "
                    "(0: no limit)");
  s.max_concurrency = f.max_concurrency;
  if (f.max_batched_tokens < 1)
    throw UserError("--max-batched-tokens " + std::to_string(f.max_batched_tokens) + ": the tokens a step runs at most "
                    "(with --step-policy vllm-v1), >= 1");
  if (f.max_batched_tokens != 2048 && !s.runs_policy(StepPolicy::vllm_v1))
    throw UserError("--max-batched-tokens goes with --step-policy vllm-v1 (the other policies run whole prompts)");
  s.max_batched_tokens = f.max_batched_tokens;
  s.kv_blocks = parse_kv_blocks(f.kv_blocks, c == Command::run);
  check_kv_pool(f.kv_block_size, std::max(s.kv_blocks, 0));
  s.kv_block_size = f.kv_block_size;
  s.goodput = limits_of(f);
  s.attainment = f.attainment;
  s.slots = use.slots;
  s.max_prompt_len = use.max_prompt_len;
  s.max_gen_len = use.max_gen_len;
  s.seed = c == Command::run ? use.seed : f.seed;
  s.requests = f.requests != -1 ? f.requests : c == Command::run ? 64 : c == Command::plan ? 256 : 1000;
  if (c != Command::run) {
    if (!f.request_rate.empty() || !f.trace.empty() || f.trace_speedup != 1.0 || !f.trace_window.empty() ||
        !f.ramp_up_strategy.empty())
      throw UserError(std::string(!f.trace.empty() ? "--trace" : "--request-rate") + " is `ppbench run`'s: " +
                      command_name(c) + " searches the rate on requests drawn at 1 request/s");
    check_search_slo(s, c);
    parse_process(f, use, s);
    s.rate_search = true;  // drawn at 1 request/s, searched over rates
    return s;
  }
  if (s.kind == ArrivalKind::trace) {
    if (f.trace.empty()) throw UserError("--scenario trace needs --trace FILE.csv (arrival_s,prompt_len,gen_len, or an Azure 2023 trace)");
    if (!f.request_rate.empty() || !f.prompt_lens.empty() || !f.gen_lens.empty() || f.burstiness != 1.0 ||
        f.attainment != 0.9 || f.requests != -1 || !f.ramp_up_strategy.empty())
      throw UserError("--scenario trace takes arrivals and lengths from --trace; drop --request-rate, --burstiness, "
                      "--requests, --prompt-lens, --gen-lens and --attainment");
    s.trace = f.trace;
    s.trace_options = trace_options_of(f);
    return s;
  }
  if (!f.trace.empty()) throw UserError("--trace goes with --scenario trace, not " + kind);
  if (f.trace_speedup != 1.0 || !f.trace_window.empty())
    throw UserError(std::string(f.trace_speedup != 1.0 ? "--trace-speedup" : "--trace-window") +
                    " goes with --scenario trace, not " + kind);
  parse_run_rate(f, s);
  parse_process(f, use, s);
  return s;
}

}  // namespace ppb::serving
