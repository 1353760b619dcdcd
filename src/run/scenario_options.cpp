// --scenario and its flags (issue 37), typed and checked for parse_run_options.
#include <cmath>
#include <exception>
#include <string>
#include <sstream>

#include "common/error.h"
#include "run/options.h"
#include "serving/trace.h"

namespace ppb::run {

namespace {

bool given(const std::string& rate) { return !rate.empty(); }

/// What the flags of a closed run may not carry.
void refuse_serving_flags_on_closed(const RunFlags& f) {
  const char* flag = given(f.request_rate) ? "--request-rate"
                     : !f.trace.empty()     ? "--trace"
                     : !f.prompt_lens.empty() ? "--prompt-lens"
                     : !f.gen_lens.empty()  ? "--gen-lens"
                     : !f.goodput.empty()   ? "--goodput"
                     : f.burstiness != 1.0  ? "--burstiness"
                     : f.attainment != 0.9  ? "--attainment"
                                            : nullptr;
  if (flag)
    throw UserError(std::string(flag) + " describes requests that arrive; add --scenario poisson, gamma or trace "
                    "(the default --scenario closed runs closed batches of B sequences of P and G tokens)");
}

/// The flags the serving engine does not take (yet), each refused with why.
void refuse_unsupported(const RunFlags& f) {
  if (f.plan > 0) throw UserError("--plan ranks layouts by closed batches; it does not take --scenario yet");
  if (f.tp != std::vector<std::string>{"1"})
    throw UserError("--scenario runs one rank per stage (--tp 1): a tensor-parallel stage's ranks would need each "
                    "step's schedule broadcast to them, which the serving engine does not do yet");
  if (f.mtp) throw UserError("--scenario does not run the MTP modules (--mtp) yet");
  if (f.control) throw UserError("--control is a closed-batch A/A check; it does not take --scenario");
  if (f.partition == "adaptive")
    throw UserError("--partition adaptive re-solves from closed-batch rounds; with --scenario use uniform, seed, "
                    "balanced, both, all or a manual split");
  if (f.no_overlap) throw UserError("--no-overlap is a closed-batch A/B; the serving engine always overlaps");
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

/// What --request-rate search needs: --goodput with a TTFT and a TPOT limit (no E2E limit: the
/// search's SLO is TTFT and TPOT, MLPerf's and DistServe's), an attainment in (0, 1].
void check_rate_search(const RunFlags& f, const serving::GoodputSpec& g) {
  if (std::isnan(g.ttft_ms) || std::isnan(g.tpot_ms) || !std::isnan(g.e2e_ms))
    throw UserError("--request-rate search needs --goodput ttft:MS tpot:MS (both limits, no e2e: the SLO whose highest "
                    "rate is searched, as `ppbench serve-search --slo-ttft --slo-tpot`)");
  if (!(f.attainment > 0) || !(f.attainment <= 1))
    throw UserError("--attainment " + std::to_string(f.attainment) + ": the share of requests that must meet both "
                    "limits, in (0, 1], e.g. 0.9 or 0.99");
}

}  // namespace

ScenarioOptions parse_scenario_options(const RunFlags& f) {
  ScenarioOptions s;
  s.kind_text = f.scenario;
  if (f.scenario == "closed") {
    refuse_serving_flags_on_closed(f);
    return s;
  }
  if (f.scenario == "poisson") s.kind = ScenarioKind::poisson;
  else if (f.scenario == "gamma") s.kind = ScenarioKind::gamma;
  else if (f.scenario == "trace") s.kind = ScenarioKind::trace;
  else
    throw UserError("--scenario '" + f.scenario + "' is unknown; valid: closed (closed batches, the default), poisson "
                    "(--request-rate R), gamma (--request-rate R --burstiness K), trace (--trace FILE.csv)");
  refuse_unsupported(f);
  s.max_prompt_len = f.prompt_len;
  s.max_gen_len = f.gen_len;
  s.policy = serving::parse_step_policy(f.step_policy);
  s.policy_text = f.step_policy;
  s.goodput = serving::parse_goodput(f.goodput);
  for (const std::string& g : f.goodput) s.goodput_text += (s.goodput_text.empty() ? "" : " ") + g;
  if (s.kind == ScenarioKind::trace) {
    if (f.trace.empty()) throw UserError("--scenario trace needs --trace FILE.csv (arrival_s,prompt_len,gen_len, or an Azure 2023 trace)");
    if (given(f.request_rate) || !f.prompt_lens.empty() || !f.gen_lens.empty() || f.burstiness != 1.0 ||
        f.attainment != 0.9)
      throw UserError("--scenario trace takes arrivals and lengths from --trace; drop --request-rate, --burstiness, "
                      "--prompt-lens, --gen-lens and --attainment");
    serving::Trace t = serving::read_trace(f.trace, s.max_prompt_len, s.max_gen_len);
    s.trace_path = f.trace;
    s.trace_format = serving::format_name(t.format);
    s.trace_clamped_rows = t.clamped_rows;
    s.requests = std::move(t.requests);
    s.spec.requests = static_cast<int>(s.requests.size());
    s.spec.seed = f.seed;
    return s;
  }
  if (!given(f.request_rate))
    throw UserError("--scenario " + f.scenario + " needs --request-rate R (requests/s, > 0; inf: all at t = 0; search: "
                    "the highest rate that meets --goodput's TTFT and TPOT limits, predicted and measured)");
  s.rate_search = f.request_rate == "search";
  const double rate = s.rate_search ? 1.0 : parse_rate(f.request_rate);
  if (s.rate_search) check_rate_search(f, s.goodput);
  else if (f.attainment != 0.9)
    throw UserError("--attainment goes with --request-rate search (the share of requests the searched rate must serve "
                    "within --goodput's limits)");
  s.attainment = f.attainment;
  if (s.kind == ScenarioKind::poisson && f.burstiness != 1.0)
    throw UserError("--scenario poisson has burstiness 1 (exponential gaps); for --burstiness " +
                    std::to_string(f.burstiness) + " use --scenario gamma");
  if (!f.trace.empty()) throw UserError("--trace goes with --scenario trace, not " + f.scenario);
  if (f.requests < 1 || f.requests > 1000000)
    throw UserError("--requests must be in [1, 1000000], got " + std::to_string(f.requests));
  s.spec.arrivals.request_rate = rate;
  s.spec.arrivals.burstiness = f.burstiness;
  serving::validate(s.spec.arrivals);
  s.spec.requests = f.requests;
  s.spec.prompt_lens = serving::parse_length_spec(f.prompt_lens.empty() ? "fixed:" + std::to_string(f.prompt_len) : f.prompt_lens, "--prompt-lens");
  s.spec.gen_lens = serving::parse_length_spec(f.gen_lens.empty() ? "fixed:" + std::to_string(f.gen_len) : f.gen_lens, "--gen-lens");
  s.spec.max_prompt_len = s.max_prompt_len;
  s.spec.max_gen_len = s.max_gen_len;
  s.spec.seed = f.seed;
  s.requests = serving::generate_requests(s.spec);
  return s;
}

}  // namespace ppb::run
