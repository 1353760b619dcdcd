#include "balance/plan_serving.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "balance/predict.h"
#include "balance/serving_step_model.h"
#include "common/parallel_for.h"
#include "serving/simulated_rate.h"

namespace ppb::balance {

namespace {

int outcome_rank(serving::RateSearchResult::Outcome o) {
  return o == serving::RateSearchResult::Outcome::unbounded ? 0 : o == serving::RateSearchResult::Outcome::found ? 1 : 2;
}

}  // namespace

std::vector<ServingPlanEntry> rank_by_serving_rate(const RunRecord& run, const PlanResult& plan,
                                                   const std::vector<serving::Request>& unit,
                                                   const serving::ScenarioSpec& spec) {
  const serving::SloTarget slo = spec.slo();
  // One record and predictor per (M, a replica's devices) (plan_record scales the KV bytes with
  // M; the step times not), built before the workers start: they only read them.
  std::map<std::pair<int, int>, std::pair<std::unique_ptr<RunRecord>, std::unique_ptr<Predictor>>> by_groups;
  auto key_of = [&](const PlanCandidate& c) { return std::make_pair(c.groups, plan.devices / std::max(1, c.replicas)); };
  for (const PlanCandidate& c : plan.candidates) {
    auto& slot = by_groups[key_of(c)];
    if (slot.first) continue;
    slot.first = std::make_unique<RunRecord>(plan_record(run, key_of(c).second, c.groups));
    slot.second = std::make_unique<Predictor>(*slot.first);
    // Replicas side by side: a stage whose twin shares its machine pays the together times
    // (Predictor::twin_on_machine), as plan_layouts' closed candidates do.
    if (std::max(1, c.replicas) > 1) slot.second->set_devices_per_machine(machine_size(run));
  }
  const serving::GoodputSpec& limits = spec.goodput;
  std::vector<ServingPlanEntry> out(plan.candidates.size());
  // The candidates on the machine's cores, as plan_layouts simulates them.
  parallel_for(out.size(), [&](std::size_t i) {
    const PlanCandidate& c = plan.candidates[i];
    const auto& slot = by_groups.at(key_of(c));
    Partition with_twins = c.split;  // its machines' contention with the replicas beside it
    with_twins.replicas = std::max(1, c.replicas);
    const ProfileStepCosts costs(*slot.first, *slot.second, with_twins);
    serving::PipelineSimConfig cfg;
    cfg.scheduler = spec.scheduler(c.groups);
    cfg.scheduler.slots = c.batch;  // the candidate's B (the file's)
    ServingPlanEntry& e = out[i];
    e.candidate = i;
    // One replica's search: it serves 1/R of the requests (each at random: Poisson at rate / R).
    e.search = serving::search_simulated_rate(unit, costs, cfg, slo);
    if (e.search.outcome != serving::RateSearchResult::Outcome::none) {
      const int R = std::max(1, c.replicas);
      e.max_rate = R * e.search.rate;
      e.max_rate_per_device = e.max_rate / plan.devices;
      e.at_rate = serving::simulate_at_rate(unit, e.search.rate, costs, cfg, limits);
      e.at_rate.output_tokens_per_s *= R;
      e.at_rate.request_throughput *= R;
      e.at_rate.goodput_req_per_s *= R;
    }
  });
  auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)); };
  std::stable_sort(out.begin(), out.end(), [&](const ServingPlanEntry& a, const ServingPlanEntry& b) {
    const int ra = outcome_rank(a.search.outcome), rb = outcome_rank(b.search.outcome);
    if (ra != rb) return ra < rb;
    if (!near(a.max_rate, b.max_rate)) return a.max_rate > b.max_rate;
    const PlanCandidate &x = plan.candidates[a.candidate], &y = plan.candidates[b.candidate];
    if (x.widths.size() != y.widths.size()) return x.widths.size() < y.widths.size();
    return x.groups < y.groups;
  });
  return out;
}

}  // namespace ppb::balance
