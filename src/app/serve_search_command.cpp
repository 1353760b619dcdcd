// `ppbench serve-search FILE.h5 --slo-ttft MS --slo-tpot MS` (issue 38, offline part): the
// highest request rate each partition of a results file serves within the SLO, found by
// bisection on the serving simulator (serving/pipeline_sim.h) with step costs from the file's
// profile (balance/serving_step_model.h). No MPI, no device. docs/OFFLINE.md.
//
// One scenario for every rate: N requests drawn once from the seed at rate 1 request/s
// (generate_requests), and at rate R the same requests with every arrival divided by R
// (scale_arrivals: equal to drawing at R, Gamma's scale property), so a probe differs from
// another only by the rate.
#include <algorithm>
#include <chrono>
#include <memory>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/offline_commands.h"
#include "app/offline_io.h"
#include "balance/partition.h"
#include "balance/predict.h"
#include "balance/serving_calibration.h"
#include "balance/serving_step_model.h"
#include "common/error.h"
#include "results/run_record.h"
#include "results/step_model_io.h"
#include "serving/arrivals.h"
#include "serving/pipeline_sim.h"
#include "serving/rate_search.h"
#include "serving/simulated_rate.h"
#include "serving/request_metrics.h"

namespace ppb {

using namespace offline;

namespace {

constexpr int kMaxRequests = 1000000;

/// Flags of serve-search's own checked before the file is read (exit 2, naming the flag); the
/// scenario's are parse_scenario's (offline_scenario).
void check_serve_flags(const ServeSearchOptions& opt) {
  if (opt.microbatches < 0 || opt.microbatches > 65536)
    throw UserError("-M " + std::to_string(opt.microbatches) + ": groups in flight, 1..65536 (0 = each partition's own)");
  if (opt.batch < 0) throw UserError("-b " + std::to_string(opt.batch) + ": slots per group, >= 1 (0 = the file's B)");
}

/// With --mlperf, LoadGen's minimum query count.
void check_mlperf(const ServeSearchOptions& opt, const serving::ScenarioSpec& spec) {
  if (opt.mlperf && spec.requests < serving::kMlperfMinQueries)
    throw UserError("--requests " + std::to_string(spec.requests) + " with --mlperf: MLPerf's Server runs need at least " +
                    std::to_string(serving::kMlperfMinQueries) + " queries (LoadGen's min_query_count), and its early "
                    "stopping at least " + std::to_string(serving::mlperf_min_queries(0)) + " to pass at all");
}

/// The partitions to search: the file's (or the one named), else the uniform split of its ranks.
std::vector<balance::Partition> partitions_to_search(const RunRecord& run, const ServeSearchOptions& opt) {
  std::vector<balance::Partition> out;
  std::string names;
  for (const PartitionRecord& pr : run.partitions) {
    names += (names.empty() ? "" : ", ") + pr.name;
    if (opt.partition_name.empty() || pr.name == opt.partition_name) out.push_back(balance::partition_of(pr));
  }
  if (!opt.partition_name.empty() && out.empty())
    throw UserError("--partition-name '" + opt.partition_name + "': " + opt.input + " has " +
                    (names.empty() ? std::string("no partitions") : "the partitions " + names));
  if (out.empty()) {  // a `ppbench profile` file: the uniform split of its ranks
    const int U = static_cast<int>(run.profile.unit_name.size());
    const int R = static_cast<int>(run.profile.latency_ms.size() / (2 * static_cast<std::size_t>(U)));
    balance::Partition p = balance::solve_uniform(U, std::min(U, R));
    p.solver = "uniform (not measured)";
    out.push_back(p);
  }
  return out;
}

/// One partition's search and the metrics at its answer.
struct SearchOutcome {
  std::string name;
  int devices = 1, groups = 1, slots = 1;
  serving::RateSearchResult search;
  serving::ServingMetrics at_rate;  ///< at search.rate (found or unbounded)
  bool have_metrics = false;
  /// The rate at the ends of the step model's held-out error (serving::search_rate_band); only
  /// where the file's profile timed the step model's grid and the search found a rate.
  serving::RateBand band;
  bool have_band = false;
  double seconds = 0.0;
};

/// --calibrated: the step model of every partition scaled per rank by the steps the file's
/// serving scenario measured (balance::calibrate_steps over all its partitions).
/// @throws UserError when the file has no measured serving steps.
std::vector<balance::StepCalibration> file_calibration(const RunRecord& run, const balance::Predictor& pred,
                                                       const ServeSearchOptions& opt) {
  bool steps = false;
  std::vector<balance::Partition> parts;
  for (const ServingPartitionRecord& sp : run.serving.partitions) {
    steps = steps || !sp.step_group.empty();
    for (const PartitionRecord& pr : run.partitions)
      if (pr.name == sp.name) parts.push_back(balance::partition_of(pr));
  }
  if (!steps || parts.size() != run.serving.partitions.size())
    throw UserError("--calibrated: " + opt.input + " has no measured serving steps (it is not a file of `ppbench run "
                    "--scenario`); drop --calibrated to search on the profile alone");
  return balance::calibrate_steps(run, pred, parts, "");
}

SearchOutcome search_partition(const RunRecord& run, const balance::Predictor& pred, const balance::Partition& p,
                               const std::vector<serving::Request>& unit, const ServeSearchOptions& opt,
                               const serving::ScenarioSpec& spec,
                               const std::vector<balance::StepCalibration>& calibration, double rel_error) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchOutcome out;
  out.name = p.solver;
  out.devices = 0;
  for (int k = 0; k < p.num_stages(); ++k) out.devices += p.width(k);
  out.groups = opt.microbatches > 0 ? opt.microbatches : (p.groups > 0 ? p.groups : run.workload.microbatches);
  out.slots = spec.slots;
  std::unique_ptr<serving::StepCostModel> model;
  if (calibration.empty()) model = std::make_unique<balance::ProfileStepCosts>(run, pred, p);
  else model = std::make_unique<balance::CalibratedStepCosts>(run, pred, p, calibration);
  const serving::StepCostModel& costs = *model;
  serving::PipelineSimConfig cfg;
  cfg.scheduler = spec.scheduler(out.groups);
  cfg.overlap = run.workload.overlap;
  serving::SloTarget slo = spec.slo();
  slo.mlperf = opt.mlperf;
  out.search = serving::search_simulated_rate(unit, costs, cfg, slo);
  if (out.search.outcome != serving::RateSearchResult::Outcome::none) {
    out.at_rate = serving::simulate_at_rate(unit, out.search.rate, costs, cfg, spec.goodput);
    out.have_metrics = true;
  }
  if (rel_error > 0.0 && out.search.outcome == serving::RateSearchResult::Outcome::found) {
    out.band = serving::search_rate_band(unit, costs, cfg, slo, rel_error);
    out.have_band = true;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void print_outcome(const SearchOutcome& o) {
  const auto& s = o.search;
  const auto& m = o.at_rate;
  if (!o.have_metrics) {
    const serving::RateVerdict& v = s.probes.back().verdict;  // the lowest rate probed
    std::printf("%-24s %7d %4d x %-3d  no rate meets the SLO: at %s req/s still attainment %.4f, TTFT p99 %s ms, "
                "TPOT p99 %s ms\n", o.name.c_str(), o.devices, o.groups, o.slots, sig(s.probes.back().rate).c_str(),
                v.attainment, sig(v.ttft_p99_ms).c_str(), sig(v.tpot_p99_ms).c_str());
    return;
  }
  std::printf("%-24s %7d %4d x %-3d %11s%s %11s %8.4f %8s/%-8s %8s/%-8s %9s %10s %4zu %6.2f\n", o.name.c_str(), o.devices,
              o.groups, o.slots, sig(s.rate).c_str(), s.outcome == serving::RateSearchResult::Outcome::unbounded ? "+" : " ",
              sig(s.rate / o.devices).c_str(), m.slo_attainment, sig(m.ttft.p50_ms).c_str(),
              sig(m.ttft.p99_ms).c_str(), sig(m.tpot.p50_ms).c_str(), sig(m.tpot.p99_ms).c_str(),
              sig(m.goodput_req_per_s).c_str(), sig(m.output_tokens_per_s).c_str(), s.probes.size(), o.seconds);
}

json outcome_json(const SearchOutcome& o) {
  json probes = json::array();
  for (const auto& p : o.search.probes)
    probes.push_back({{"rate", p.rate}, {"pass", p.verdict.pass}, {"attainment", p.verdict.attainment},
                      {"ttft_p99_ms", p.verdict.ttft_p99_ms}, {"tpot_p99_ms", p.verdict.tpot_p99_ms},
                      {"early_stopping", p.verdict.early_stopping}});
  json j = {{"name", o.name}, {"devices", o.devices}, {"groups", o.groups}, {"slots", o.slots},
            {"outcome", serving::outcome_name(o.search.outcome)}, {"failing_rate", o.search.failing_rate},
            {"non_monotone_probes", o.search.non_monotone}, {"search_seconds", o.seconds}, {"probes", probes}};
  if (o.have_metrics) {
    const auto& m = o.at_rate;
    j["max_rate_req_per_s"] = o.search.rate;
    j["max_rate_per_device"] = o.search.rate / o.devices;
    j["at_max_rate"] = {{"attainment", m.slo_attainment},   {"goodput_req_per_s", m.goodput_req_per_s},
                        {"ttft_p50_ms", m.ttft.p50_ms},     {"ttft_p99_ms", m.ttft.p99_ms},
                        {"tpot_p50_ms", m.tpot.p50_ms},     {"tpot_p99_ms", m.tpot.p99_ms},
                        {"request_throughput", m.request_throughput}, {"output_tokens_per_s", m.output_tokens_per_s},
                        {"duration_s", m.duration_s}};
  }
  if (o.have_band) {
    auto end = [](const serving::RateSearchResult& r) {
      return json{{"outcome", serving::outcome_name(r.outcome)},
                  {"max_rate_req_per_s", r.outcome == serving::RateSearchResult::Outcome::none ? json(nullptr) : json(r.rate)}};
    };
    j["max_rate_band"] = {{"step_rel_error", o.band.rel_error}, {"slower_steps", end(o.band.slower)},
                          {"faster_steps", end(o.band.faster)}};
  }
  return j;
}

void print_header(const RunRecord& run, const ServeSearchOptions& opt, const serving::ScenarioSpec& spec,
                  const std::vector<serving::Request>& unit) {
  std::printf("serve-search %s: TTFT <= %s ms, TPOT <= %s ms, ", opt.input.c_str(), sig(spec.goodput.ttft_ms).c_str(),
              sig(spec.goodput.tpot_ms).c_str());
  if (opt.mlperf)
    std::printf("MLPerf Server rule (p99 of each within its limit, early stopping, >= %d queries)\n",
                serving::kMlperfMinQueries);
  else
    std::printf("attainment >= %s (requests meeting both)\n", sig(spec.attainment).c_str());
  long long prompt = 0, out = 0;
  for (const auto& r : unit) prompt += r.prompt_len, out += r.gen_len;
  std::printf("scenario: %d requests, Gamma gaps of shape %s (1 = Poisson), seed %llu, %s steps, mean prompt %.1f, mean "
              "output %.1f tokens; at rate R the arrivals of rate 1 divided by R\n",
              spec.requests, sig(spec.arrivals.burstiness).c_str(), static_cast<unsigned long long>(spec.seed),
              serving::step_policy_name(spec.policy),
              static_cast<double>(prompt) / unit.size(), static_cast<double>(out) / unit.size());
  if (!run.profile.step_rows.empty())
    std::printf("step model: fitted to the profile's grid of %zu step shapes (/profile/step_model: piecewise linear in a "
                "step's tokens plus its attention keys, stepcost/step_model.h; %s: the interpolation's error, not the "
                "machine's drift since the profile); bisection to 1%% of the rate\n",
                run.profile.step_rows.size(), step_model_uncertainty(run.profile).c_str());
  else
    std::printf("step model: the profile's %s table (B=%d P=%d), prefill linear in tokens, decode at the rows' mean "
                "context (balance/serving_step_model.h); bisection to 1%% of the rate\n",
                run.profile.latency_alone_ms.empty() ? "one-pass" : "together", run.workload.batch, run.workload.prompt_len);
  std::printf("%-24s %7s %-10s %12s %11s %8s %17s %17s %9s %10s %4s %6s\n", "partition", "devices", "M x B",
              "max req/s", "per device", "attain", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "goodput", "out tok/s",
              "prob", "s");
}

/// Notes under the table: monotonicity, MLPerf's minimum duration.
void print_notes(const std::vector<SearchOutcome>& all, const ServeSearchOptions& opt, int requests) {
  for (const SearchOutcome& o : all) {
    if (o.have_band) {
      auto end = [](const serving::RateSearchResult& r) {
        if (r.outcome == serving::RateSearchResult::Outcome::none) return std::string("none");
        return sig(r.rate) + (r.outcome == serving::RateSearchResult::Outcome::unbounded ? "+" : "");
      };
      std::printf("band: %s: %s .. %s req/s with every step %.1f%% slower .. faster (the step model's held-out error, "
                  "p50): the rate's uncertainty from the model's interpolation alone\n", o.name.c_str(),
                  end(o.band.slower).c_str(), end(o.band.faster).c_str(), 100.0 * o.band.rel_error);
    }
    if (o.search.non_monotone > 0)
      std::printf("note: %s: %d probe(s) passed above a failing rate: attainment is not monotone in the rate at N = %d "
                  "(which requests share a step moves with the rate); the answer is a pass with a failure within 1%% "
                  "above it\n", o.name.c_str(), o.search.non_monotone, requests);
    if (o.search.outcome == serving::RateSearchResult::Outcome::unbounded)
      std::printf("note: %s: every probed rate passed (up to %s req/s): the SLO does not bind\n", o.name.c_str(),
                  sig(o.search.rate).c_str());
    // LoadGen's min duration: the last query scheduled at >= 600 s (results.cc MinDurationMet); the
    // last arrival here is N / R (the arrivals rescaled to the rate, arrivals.h).
    const double last_arrival_s = requests / o.search.rate;
    if (opt.mlperf && o.have_metrics && last_arrival_s < 600.0)
      std::printf("note: %s: MLPerf's minimum duration (the last query scheduled at >= 600 s) is not met: the last "
                  "arrives at %s s at %s req/s; --requests %s or more would meet it\n", o.name.c_str(),
                  sig(last_arrival_s).c_str(), sig(o.search.rate).c_str(), num(std::ceil(600.0 * o.search.rate), 0).c_str());
  }
}

}  // namespace

int serve_search_command(const ServeSearchOptions& opt) {
  check_serve_flags(opt);
  check_json_out(opt.json_out, opt.input, opt.force);
  const RunRecord run = read_run(opt.input);
  if (opt.batch > run.workload.batch)
    throw UserError("-b " + std::to_string(opt.batch) + ": " + opt.input + " profiled decode steps of B=" +
                    std::to_string(run.workload.batch) + " rows only; the step model does not extrapolate past them: "
                    "give -b 1.." + std::to_string(run.workload.batch) + ", or profile at a larger B");
  const balance::Predictor pred(run);
  const std::vector<balance::Partition> parts = partitions_to_search(run, opt);
  const serving::ScenarioSpec spec = offline_scenario(run, opt.scenario, serving::ScenarioUse::Command::serve_search, opt.batch);
  check_mlperf(opt, spec);
  const std::vector<serving::Request> unit = serving::generate_requests(spec);
  const std::vector<balance::StepCalibration> calibration =
      opt.calibrated ? file_calibration(run, pred, opt) : std::vector<balance::StepCalibration>{};
  print_header(run, opt, spec, unit);
  if (opt.calibrated)
    std::printf("step model calibrated per rank by the file's measured serving steps (%s; "
                "balance/serving_calibration.h)\n",
                run.profile.step_rows.empty() ? "per kind and band of step tokens" : "a scale per kind of step on the step model");
  const double rel_error = step_model_band_error(run.profile);
  std::vector<SearchOutcome> all;
  json out = json::array();
  for (const balance::Partition& p : parts) {
    all.push_back(search_partition(run, pred, p, unit, opt, spec, calibration, rel_error));
    print_outcome(all.back());
    out.push_back(outcome_json(all.back()));
  }
  print_notes(all, opt, spec.requests);
  if (!opt.json_out.empty())
    write_json_file(opt.json_out,
                    {{"input", opt.input},
                     {"slo", {{"ttft_ms", spec.goodput.ttft_ms}, {"tpot_ms", spec.goodput.tpot_ms}, {"attainment", spec.attainment},
                              {"rule", opt.mlperf ? "mlperf" : "attainment"}}},
                     {"scenario", serving::scenario_to_json(spec)},
                     {"partitions", out}});
  return 0;
}

}  // namespace ppb
