#include "run/serving_search.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "balance/serving_calibration.h"
#include "balance/serving_step_model.h"
#include "common/error.h"
#include "common/format.h"
#include "results/step_model_io.h"
#include "run/memory_checks.h"
#include "serving/arrivals.h"
#include "serving/simulated_rate.h"

namespace ppb::run {

namespace {

std::string slo_text(const serving::SloTarget& slo) {
  return "TTFT <= " + format_fixed(slo.ttft_ms, 0) + " ms and TPOT <= " + format_fixed(slo.tpot_ms, 1) + " ms for " +
         format_fixed(100.0 * slo.attainment, 1) + "% of the requests";
}

/// The calibrated simulator's curve of `r` over the rates R* x (0.25, 0.30, ..., 1.50).
void fill_curve(RateSearchPartitionRecord& r, const std::vector<serving::Request>& unit, double max_rate,
                const serving::StepCostModel& costs, const serving::PipelineSimConfig& cfg, const serving::SloTarget& slo) {
  serving::GoodputSpec limits;
  limits.ttft_ms = slo.ttft_ms;
  limits.tpot_ms = slo.tpot_ms;
  for (int k = 0; k <= 25; ++k) {
    const double rate = max_rate * (0.25 + 0.05 * k);
    const serving::ServingMetrics m = serving::simulate_at_rate(unit, rate, costs, cfg, limits);
    r.curve_rate.push_back(rate);
    r.curve_attainment.push_back(m.slo_attainment);
    r.curve_goodput_req_per_s.push_back(m.goodput_req_per_s);
    r.curve_output_tokens_per_s.push_back(m.output_tokens_per_s);
    r.curve_ttft_p50_ms.push_back(m.ttft.p50_ms);
    r.curve_ttft_p99_ms.push_back(m.ttft.p99_ms);
    r.curve_tpot_p50_ms.push_back(m.tpot.p50_ms);
    r.curve_tpot_p99_ms.push_back(m.tpot.p99_ms);
  }
  r.predicted_attainment_below = serving::simulate_at_rate(unit, kRateBelow * max_rate, costs, cfg, limits).slo_attainment;
  r.predicted_attainment_above = serving::simulate_at_rate(unit, kRateAbove * max_rate, costs, cfg, limits).slo_attainment;
}

}  // namespace

serving::PipelineSimConfig serving_sim_config(const RunContext& ctx, const balance::Partition& p) {
  serving::PipelineSimConfig cfg;
  cfg.scheduler = ctx.opt.scenario.spec->scheduler(partition_groups(ctx, p), p.step_policy, p.pp_schedule);
  if (cfg.scheduler.kv_blocks == serving::kKvBlocksAuto) cfg.scheduler.kv_blocks = auto_kv_blocks(ctx, p, cfg.scheduler);
  return cfg;
}

double profile_max_rate(const RunContext& ctx, const balance::Predictor& pred, const balance::Partition& p) {
  const serving::SloTarget slo = ctx.opt.scenario.spec->slo();
  const balance::ProfileStepCosts costs(ctx.record(), pred, p);
  const serving::RateSearchResult r =
      serving::search_simulated_rate(ctx.opt.scenario.drawn.requests, costs, serving_sim_config(ctx, p), slo);
  if (r.outcome == serving::RateSearchResult::Outcome::none)
    throw UserError("--request-rate search: on the profile no rate meets " + slo_text(slo) + " on partition " + p.solver +
                    " (still missed at " + format_fixed(r.probes.back().rate, 4) + " requests/s): loosen --goodput or "
                    "--attainment, or shorten the requests (--prompt-lens, --gen-lens)");
  if (r.outcome == serving::RateSearchResult::Outcome::unbounded)
    throw UserError("--request-rate search: on the profile every rate up to " + format_fixed(r.rate, 1) +
                    " requests/s meets " + slo_text(slo) + " on partition " + p.solver + ": the SLO does not bind; "
                    "tighten --goodput");
  return r.rate;
}

void plan_rate_confirmation(RunContext& ctx, const PartitionSet& set) {
  RunRecord& run = ctx.record();
  RateSearchRecord& rs = run.serving.rate_search;
  const balance::Predictor& pred = ctx.predictor();
  const serving::SloTarget slo = ctx.opt.scenario.spec->slo();
  const std::vector<serving::Request>& unit = ctx.opt.scenario.drawn.requests;
  const std::vector<balance::StepCalibration> calibration = balance::calibrate_steps(run, pred, set.splits, "");
  rs.partitions.clear();
  std::vector<std::unique_ptr<balance::CalibratedStepCosts>> models;
  const double band_error = step_model_band_error(run.profile);  // one fit for every partition
  for (const balance::Partition& p : set.splits) {
    RateSearchPartitionRecord r;
    r.name = p.solver;
    const serving::PipelineSimConfig cfg = serving_sim_config(ctx, p);
    const balance::ProfileStepCosts profile_costs(run, pred, p);
    const serving::RateSearchResult prof = serving::search_simulated_rate(unit, profile_costs, cfg, slo);
    if (prof.outcome == serving::RateSearchResult::Outcome::found) {
      r.profile_max_rate = prof.rate;
      if (band_error > 0.0) {
        const serving::RateBand band = serving::search_rate_band(unit, profile_costs, cfg, slo, band_error);
        if (band.slower.outcome == serving::RateSearchResult::Outcome::found) r.profile_max_rate_low = band.slower.rate;
        if (band.faster.outcome == serving::RateSearchResult::Outcome::found) r.profile_max_rate_high = band.faster.rate;
      }
    }
    models.push_back(std::make_unique<balance::CalibratedStepCosts>(run, pred, p, calibration));
    const serving::RateSearchResult cal = serving::search_simulated_rate(unit, *models.back(), cfg, slo);
    r.outcome = serving::outcome_name(cal.outcome);
    if (cal.outcome == serving::RateSearchResult::Outcome::found) {
      r.calibrated_max_rate = cal.rate;
      if (!(rs.max_rate >= cal.rate)) rs.max_rate = cal.rate, rs.searched_partition = p.solver;
    }
    rs.partitions.push_back(std::move(r));
  }
  if (rs.searched_partition.empty())
    throw UserError("--request-rate search: calibrated by the pilot's steps at " + format_fixed(rs.pilot_rate, 3) +
                    " requests/s, the simulator finds no partition a highest rate that meets " + slo_text(slo) +
                    " (outcomes: " + rs.partitions.front().outcome + " ...): loosen or tighten --goodput");
  rs.rate_below = kRateBelow * rs.max_rate;
  rs.rate_above = kRateAbove * rs.max_rate;
  for (size_t j = 0; j < set.size(); ++j)
    fill_curve(rs.partitions[j], unit, rs.max_rate, *models[j], serving_sim_config(ctx, set.splits[j]), slo);
}

void judge_rate_confirmation(ServingRunRecord& s) {
  RateSearchRecord& rs = s.rate_search;
  for (RateSearchPartitionRecord& r : rs.partitions) {
    for (const ServingPartitionRecord& p : s.partitions)
      if (p.name == r.name) r.measured_attainment_below = p.slo_attainment;
    for (const ServingPartitionRecord& p : rs.above)
      if (p.name == r.name) r.measured_attainment_above = p.slo_attainment;
    if (r.name != rs.searched_partition) continue;
    if (std::isnan(r.measured_attainment_below) || std::isnan(r.measured_attainment_above)) rs.confirmed = -1;
    else
      rs.confirmed = (r.measured_attainment_below >= rs.attainment_target && r.measured_attainment_above < rs.attainment_target)
                         ? 1 : 0;
  }
}

}  // namespace ppb::run
