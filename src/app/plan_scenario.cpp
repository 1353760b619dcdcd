#include "app/plan_scenario.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "app/offline_io.h"
#include "balance/layout.h"
#include "balance/plan.h"
#include "balance/plan_serving.h"
#include "common/error.h"
#include "results/step_model_io.h"
#include "serving/arrivals.h"

namespace ppb {

using namespace offline;

namespace {

struct Search {
  balance::PlanResult plan;
  std::vector<balance::ServingPlanEntry> ranked;
  double seconds = 0;
};

Search search(const RunRecord& run, int devices, int replicas, const std::vector<serving::Request>& unit,
              const serving::ScenarioSpec& spec) {
  const auto t0 = std::chrono::steady_clock::now();
  balance::PlanRequest req;
  req.devices = devices;
  req.replicas = balance::replicas_for(devices, replicas);
  req.prune = false;  // the closed batch's bounds say nothing of a rate under arrivals
  Search s;
  s.plan = balance::plan_layouts(run, req);
  s.ranked = balance::rank_by_serving_rate(run, s.plan, unit, spec);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

std::string rate_text(const balance::ServingPlanEntry& e) {
  if (e.search.outcome == serving::RateSearchResult::Outcome::none) return "none";
  return sig(e.max_rate) + (e.search.outcome == serving::RateSearchResult::Outcome::unbounded ? "+" : "");
}

void print_table(const Search& s, int top) {
  std::printf("%-18s %-22s %11s %11s %8s %17s %17s %10s %11s\n", "layout", "split", "max req/s", "per device",
              "attain", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "out tok/s", "busiest");
  const size_t n = top > 0 ? std::min<size_t>(static_cast<size_t>(top), s.ranked.size()) : s.ranked.size();
  for (size_t i = 0; i < n; ++i) {
    const balance::ServingPlanEntry& e = s.ranked[i];
    const balance::PlanCandidate& c = s.plan.candidates[e.candidate];
    const bool m = e.search.outcome != serving::RateSearchResult::Outcome::none;
    const serving::ServingMetrics& a = e.at_rate;
    std::printf("%-18s %-22s %11s %11s %8s %8s/%-8s %8s/%-8s %10s %11d\n", c.label.c_str(), c.split.counts_string().c_str(),
                rate_text(e).c_str(), m ? sig(e.max_rate_per_device).c_str() : "-", m ? num(a.slo_attainment, 3).c_str() : "-",
                m ? sig(a.ttft.p50_ms).c_str() : "-", m ? sig(a.ttft.p99_ms).c_str() : "-", m ? sig(a.tpot.p50_ms).c_str() : "-",
                m ? sig(a.tpot.p99_ms).c_str() : "-", m ? sig(a.output_tokens_per_s).c_str() : "-", c.bottleneck_stage);
  }
}

/// The best layout, why, and the best of N + 1 devices.
void print_choice(const RunRecord& run, const PlanOptions& opt, const serving::ScenarioSpec& spec, const Search& s,
                  const std::optional<Search>& more) {
  const balance::ServingPlanEntry& b = s.ranked.front();
  const balance::PlanCandidate& c = s.plan.candidates[b.candidate];
  if (b.search.outcome == serving::RateSearchResult::Outcome::none) {
    std::printf("no layout of %d devices meets the SLO at any rate probed (down to %s req/s)\n", opt.devices,
                sig(b.search.probes.back().rate).c_str());
    return;
  }
  std::printf("best: %s (split %s, M=%d, B=%d): %s req/s (%s per device)", c.label.c_str(), c.split.counts_string().c_str(),
              c.groups, c.batch, rate_text(b).c_str(), sig(b.max_rate_per_device).c_str());
  if (s.ranked.size() > 1 && s.ranked[1].search.outcome != serving::RateSearchResult::Outcome::none)
    std::printf(", x%s the next (%s)", num(b.max_rate / s.ranked[1].max_rate, 3).c_str(),
                s.plan.candidates[s.ranked[1].candidate].label.c_str());
  std::printf("\n");
  const int k = c.bottleneck_stage;
  const std::string units = run.profile.unit_name[c.split.first_unit[k]] +
                            (c.split.first_unit[k] == c.split.last_unit[k] ? "" : ".." + run.profile.unit_name[c.split.last_unit[k]]);
  std::printf("  why: at that rate %s of the requests meet both limits (%s / %s ms; the target: %s of them), TTFT p99 "
              "%s ms and TPOT p99 %s ms; its busiest stage in the closed batch is %d (%s, %d device%s)\n",
              num(b.at_rate.slo_attainment, 3).c_str(), sig(spec.goodput.ttft_ms).c_str(), sig(spec.goodput.tpot_ms).c_str(),
              sig(spec.attainment).c_str(), sig(b.at_rate.ttft.p99_ms).c_str(), sig(b.at_rate.tpot.p99_ms).c_str(), k,
              units.c_str(), c.split.width(k), c.split.width(k) == 1 ? "" : "s");
  if (!more || more->ranked.empty() || more->ranked.front().search.outcome == serving::RateSearchResult::Outcome::none) {
    std::printf("one more device: %s\n", more ? "no layout meets the SLO" : "no layout (more than the model can use)");
    return;
  }
  const balance::ServingPlanEntry& n = more->ranked.front();
  std::printf("one more device (%d): %s, %s req/s (%s per device): x%s the rate\n", opt.devices + 1,
              more->plan.candidates[n.candidate].label.c_str(), rate_text(n).c_str(), sig(n.max_rate_per_device).c_str(),
              num(n.max_rate / b.max_rate, 3).c_str());
}

void print_csv(const Search& s) {
  std::printf("layout,stages,tp_widths,groups,batch,split,outcome,max_rate,max_rate_per_device,attainment,ttft_p50_ms,"
              "ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,output_tokens_per_s,replicas\n");
  for (const balance::ServingPlanEntry& e : s.ranked) {
    const balance::PlanCandidate& c = s.plan.candidates[e.candidate];
    std::string w = balance::layout_label(c.widths), split = c.split.counts_string();
    std::replace(w.begin(), w.end(), ',', '-');
    std::replace(split.begin(), split.end(), ',', '-');
    const serving::ServingMetrics& a = e.at_rate;
    std::printf("%s,%d,%s,%d,%d,%s,%s,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%d\n", c.label.c_str(), c.split.num_stages(),
                w.c_str(), c.groups, c.batch, split.c_str(), serving::outcome_name(e.search.outcome), e.max_rate,
                e.max_rate_per_device, a.slo_attainment, a.ttft.p50_ms, a.ttft.p99_ms, a.tpot.p50_ms, a.tpot.p99_ms,
                a.output_tokens_per_s, c.replicas);
  }
}

json entry_json(const Search& s, const balance::ServingPlanEntry& e) {
  const balance::PlanCandidate& c = s.plan.candidates[e.candidate];
  json j = layout_json(c.split, c.widths);
  const serving::ServingMetrics& a = e.at_rate;
  j.update({{"layout", c.label}, {"replicas", c.replicas}, {"groups", c.groups}, {"batch", c.batch}, {"outcome", serving::outcome_name(e.search.outcome)},
            {"max_rate_req_per_s", e.max_rate}, {"max_rate_per_device", e.max_rate_per_device},
            {"probes", e.search.probes.size()}, {"attainment", a.slo_attainment}, {"ttft_p50_ms", a.ttft.p50_ms},
            {"ttft_p99_ms", a.ttft.p99_ms}, {"tpot_p50_ms", a.tpot.p50_ms}, {"tpot_p99_ms", a.tpot.p99_ms},
            {"output_tokens_per_s", a.output_tokens_per_s}});
  return j;
}

}  // namespace

std::optional<serving::ScenarioSpec> plan_scenario(const PlanOptions& opt, const RunRecord& run) {
  if (opt.scenario.scenario.empty() || opt.scenario.scenario == "closed") {
    serving::ScenarioUse use;
    use.command = serving::ScenarioUse::Command::plan;
    return serving::parse_scenario(opt.scenario, use);  // refuses the flags of a scenario without one
  }
  return offline_scenario(run, opt.scenario, serving::ScenarioUse::Command::plan);
}

int plan_scenario_command(const PlanOptions& opt, const RunRecord& run, const serving::ScenarioSpec& spec, int replicas) {
  const std::vector<serving::Request> unit = serving::generate_requests(spec);
  const Search s = search(run, opt.devices, replicas, unit, spec);
  std::optional<Search> more;
  try {
    more = search(run, opt.devices + 1, replicas, unit, spec);
  } catch (const UserError&) {
    more.reset();  // more devices than the model can use, or none fits
  }
  if (opt.csv) {
    print_csv(s);
  } else {
    std::printf("plan --scenario %s: %d device(s) like rank 0 (%s), replicas %s; %s (seed %llu), SLO for %s of the "
                "requests; %zu candidates (every layout, M = 1..2S) searched in %.2f s\n",
                opt.input.c_str(), opt.devices, run.ranks[0].device_name.c_str(), balance::replica_counts_text(s.plan).c_str(),
                serving::describe_scenario(spec).c_str(), static_cast<unsigned long long>(spec.seed),
                sig(spec.attainment).c_str(), s.ranked.size(), s.seconds);
    const std::string u = step_model_uncertainty(run.profile);
    std::printf("layouts by the highest request rate meeting the SLO (serving simulator on the profile's %s):\n",
                u.empty() ? "two-shape step model: a file without a step-model grid"
                          : ("step model, its " + u + ": the interpolation's error, not the machine's drift since the "
                             "profile").c_str());
    print_table(s, opt.top > 0 ? opt.top : 10);
    print_choice(run, opt, spec, s, more);
  }
  std::fflush(stdout);
  if (!opt.json_out.empty()) {
    json out = {{"devices", opt.devices}, {"replica_counts", s.plan.replica_counts}, {"scenario", serving::arrival_kind_name(spec.kind)}, {"spec", serving::scenario_to_json(spec)},
                {"slo_ttft_ms", spec.goodput.ttft_ms}, {"slo_tpot_ms", spec.goodput.tpot_ms},
                {"attainment", spec.attainment}, {"requests", spec.requests}, {"search_seconds", s.seconds},
                {"ranked", json::array()}};
    for (const auto& e : s.ranked) out["ranked"].push_back(entry_json(s, e));
    out["one_more_device"] = more && !more->ranked.empty() ? entry_json(*more, more->ranked.front()) : json(nullptr);
    write_json_file(opt.json_out, out);
  }
  return 0;
}

}  // namespace ppb
