// A stage's step time for a ragged serving batch (the model and its assumptions are in
// serving_step_model.h).
#include "balance/serving_step_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "balance/layout.h"
#include "common/error.h"
#include "common/transfer.h"
#include "results/profile_step_fit.h"

namespace ppb::balance {

double decode_step_ms(const StageStepProfile& s, double context) {
  const std::size_t C = s.contexts.size();
  if (C < 2 || s.decode_ms.size() < 2) return s.decode_ms.at(0);
  if (context <= s.contexts.front()) return s.decode_ms.front();
  if (context >= s.contexts.back()) return s.decode_ms.back();
  std::size_t i = 0;
  while (i + 2 < C && context > s.contexts[i + 1]) ++i;
  const double c0 = s.contexts[i], c1 = s.contexts[i + 1];
  if (!(c1 > c0)) return s.decode_ms[i];
  const double f = (context - c0) / (c1 - c0);
  return s.decode_ms[i] + f * (s.decode_ms[i + 1] - s.decode_ms[i]);
}

double stage_step_ms(const StageStepProfile& s, const serving::StepShape& shape) {
  if (shape.decode_rows > s.decode_rows)
    throw InternalError("serving step model: a step of " + std::to_string(shape.decode_rows) +
                        " decode rows, more than the profiled " + std::to_string(s.decode_rows));
  const double prefill = static_cast<double>(shape.prefill_tokens) / s.prefill_tokens * s.prefill_ms;
  const double decode = shape.decode_rows > 0 ? decode_step_ms(s, shape.decode_context_mean) : 0.0;
  return prefill + decode;
}

namespace {

/// [C] the sum over units first..last of rank r's decode step at each profiled context.
std::vector<double> context_curve(const ProfileTable& prof, std::size_t r, int first, int last) {
  const std::size_t U = prof.unit_name.size(), C = prof.decode_contexts.size();
  std::vector<double> curve(C, 0.0);
  for (int u = first; u <= last; ++u)
    for (std::size_t c = 0; c < C; ++c) curve[c] += prof.decode_context_ms[(r * U + static_cast<std::size_t>(u)) * C + c];
  return curve;
}

/// Checks stage k of `p` against the profile's units and ranks.
void check_stage(const Partition& p, int k, std::size_t units, std::size_t ranks) {
  const int first = p.first_unit.at(k), last = p.last_unit.at(k), r = p.device_rank.at(k);
  if (first < 0 || last < first || static_cast<std::size_t>(last) >= units || r < 0 ||
      static_cast<std::size_t>(r + p.width(k)) > ranks)
    throw UserError("partition " + p.solver + ", stage " + std::to_string(k) + ": units " + std::to_string(first) +
                    ".." + std::to_string(last) + " on rank " + std::to_string(r) + " (width " +
                    std::to_string(p.width(k)) + ") are outside the profile's " + std::to_string(units) +
                    " units and " + std::to_string(ranks) + " ranks");
}

}  // namespace

std::vector<StageStepProfile> stage_step_profiles(const RunRecord& run, const Predictor& pred, const Partition& p) {
  const ProfileTable& prof = run.profile;
  const WorkloadInfo& w = run.workload;
  if (w.batch < 1 || w.prompt_len < 1)
    throw UserError("the run's workload lacks B or P (B=" + std::to_string(w.batch) + ", P=" +
                    std::to_string(w.prompt_len) + "): no profiled step to scale");
  const std::size_t U = prof.unit_name.size();
  const std::size_t R = U > 0 ? prof.latency_ms.size() / (2 * U) : 0;
  const std::size_t C = prof.decode_contexts.size();
  const bool have_contexts = C > 0 && prof.decode_context_ms.size() == R * U * C;
  std::vector<StageStepProfile> out;
  for (int k = 0; k < p.num_stages(); ++k) {
    check_stage(p, k, U, R);
    const auto [pre, dec] = pred.stage_sums(prof, p, k);  // latency_ms: the together table
    if (!std::isfinite(pre) || !std::isfinite(dec))
      throw UserError("partition " + p.solver + ", stage " + std::to_string(k) + " is tensor-parallel of width " +
                      std::to_string(p.width(k)) + " and the file has no group profile at that width");
    StageStepProfile s;
    s.prefill_ms = pre;
    s.prefill_tokens = static_cast<double>(w.batch) * w.prompt_len;
    s.decode_rows = w.batch;
    if (!have_contexts) {
      s.decode_ms = {dec};  // assumption 6: constant in context
      out.push_back(std::move(s));
      continue;
    }
    for (int c : prof.decode_contexts) s.contexts.push_back(c);
    s.decode_ms = context_curve(prof, static_cast<std::size_t>(p.device_rank[k]), p.first_unit[k], p.last_unit[k]);
    if (p.width(k) == 1) {  // a forward's fixed cost once per stage, as stage_sums' decode
      const double fix = stage_fixed_ms(prof, p.device_rank[k], p.last_unit[k] - p.first_unit[k] + 1, 1);
      for (double& d : s.decode_ms) d = std::max(0.0, d + fix);
    } else {  // assumption 5: the group's mean, the first rank's shape
      double mean = 0.0;
      for (double d : s.decode_ms) mean += d / static_cast<double>(C);
      for (double& d : s.decode_ms) d = mean > 0.0 ? d * (dec / mean) : dec;
    }
    out.push_back(std::move(s));
  }
  return out;
}

ProfileStepCosts::ProfileStepCosts(const RunRecord& run, const Predictor& pred, const Partition& p)
    : pred_(pred), stages_(stage_step_profiles(run, pred, p)), fits_(fit_step_model(run.profile).models) {
  const std::size_t sigs = run.profile.step_by_rows.size();
  const std::size_t rank_fits = fits_.size();  // [R][signatures]; a group's fits follow them
  const int B = run.workload.batch, P = run.workload.prompt_len;
  const std::vector<stepcost::Level> rank_levels = step_model_levels(run.profile, B, P, fits_);
  std::vector<const ProfileTable::TpGroupProfile*> fitted;  // the groups whose fits are appended, in order
  std::vector<stepcost::Level> group_levels;                // theirs
  for (int k = 0; k < p.num_stages(); ++k) {
    links_.push_back(pred.boundary_link(p, k));
    std::size_t first = static_cast<std::size_t>(p.device_rank[k]) * sigs;  // the stage's fits: [first, first + sigs)
    bool have = rank_fits > 0 && p.width(k) == 1 && first + sigs <= rank_fits;
    stepcost::Level level = have ? rank_levels.at(static_cast<std::size_t>(p.device_rank[k])) : stepcost::Level{};
    if (rank_fits > 0 && p.width(k) > 1) {  // its group's grid at its width, fitted once per group
      const ProfileTable::TpGroupProfile* g = group_profile(run, pred.device_class(), p.device_rank[k], p.width(k));
      const auto at = std::find(fitted.begin(), fitted.end(), g);
      if (at != fitted.end()) {
        first = rank_fits + static_cast<std::size_t>(at - fitted.begin()) * sigs;
        level = group_levels.at(static_cast<std::size_t>(at - fitted.begin()));
        have = true;
      } else if (g) {
        const std::vector<stepcost::UnitModel> m = fit_step_model(run.profile, *g).models;
        if (m.size() == sigs) {
          first = fits_.size();
          fits_.insert(fits_.end(), m.begin(), m.end());
          fitted.push_back(g);
          group_levels.push_back(level = group_step_level(run.profile, B, P, *g, m));
          have = true;
        }
      }
    }
    levels_.push_back(level);
    std::vector<std::pair<int, int>> units;  // (fit, count) of each signature the stage holds
    if (have) {
      std::vector<int> count(sigs, 0);
      for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) ++count.at(static_cast<std::size_t>(run.profile.unit_signature.at(u)));
      for (std::size_t g = 0; g < sigs; ++g)
        if (count[g] > 0) units.emplace_back(static_cast<int>(first + g), count[g]);
    }
    stage_units_.push_back(std::move(units));
    // A width-1 stage's units each carry a forward's fixed cost; the stage pays it once. A TP
    // stage's group timed no pairs (its forwards all-reduce): none taken there.
    const int n = p.last_unit[k] - p.first_unit[k] + 1, r = p.device_rank[k];
    const bool one_rank = p.width(k) == 1;
    fixed_ms_.push_back({one_rank ? stage_fixed_ms(run.profile, r, n, 0) : 0.0, one_rank ? stage_fixed_ms(run.profile, r, n, 1) : 0.0});
  }
  // The profile's two passes per stage, for the simulator's contention model (one pass: 1).
  const StageSums sums = pred.pass_sums(p, run.profile);
  const std::vector<int> machine = pred.stage_machines(p);
  const std::vector<char> twin = pred.twin_on_machine(p);
  for (int k = 0; k < p.num_stages(); ++k) {
    serving::StageContention c;
    c.machine = machine.at(static_cast<std::size_t>(k));
    c.always_overlapped = !twin.empty() && twin.at(static_cast<std::size_t>(k)) != 0;
    for (std::size_t q = 0; q < 2; ++q) {
      const double alone = sums.alone.at(2 * static_cast<std::size_t>(k) + q);
      const double together = sums.together.at(2 * static_cast<std::size_t>(k) + q);
      if (p.width(k) == 1 && alone > 0.0 && together > 0.0 && std::isfinite(alone / together))
        c.alone_share[q] = alone / together;
    }
    contention_.push_back(c);
  }
}

stepcost::StepWork step_work_of(const serving::StepShape& s) {
  stepcost::StepWork w;
  w.tokens = static_cast<double>(s.tokens);
  w.rows = s.rows;
  w.prefill_keys = s.prefill_keys;
  w.decode_keys = s.decode_keys;
  return w;
}

StepMixCosts step_mix_costs(const RunRecord& run, const std::vector<serving::StepShape>& shapes, double scale) {
  if (shapes.empty()) return {};  // no mix (the simulator recorded none): the objective's own costs stand
  const ProfileTable& t = run.profile;
  const std::vector<stepcost::UnitModel> fits = fit_step_model(t).models;
  const std::size_t S = t.step_by_rows.size(), U = t.unit_name.size();
  if (fits.empty() || S == 0) return {};
  const std::size_t R = fits.size() / S;
  const std::vector<stepcost::Level> levels = step_model_levels(t, run.workload.batch, run.workload.prompt_len, fits);
  std::vector<double> per_fit(fits.size(), 0.0);  // [R][S] summed over the shapes
  for (const serving::StepShape& sh : shapes) {
    const stepcost::StepWork w = step_work_of(sh);
    for (std::size_t i = 0; i < fits.size(); ++i)
      per_fit[i] += fits[i].ms(w) * stepcost::pooled_level(levels.at(i / S), sh.prefill_rows > 0);
  }
  StepMixCosts out;
  out.unit_ms.resize(R * U);
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t u = 0; u < U; ++u)
      out.unit_ms[r * U + u] = scale * per_fit[r * S + static_cast<std::size_t>(t.unit_signature.at(u))];
  // The forward's fixed cost of each step's kind, at the same level, where the profile took one.
  bool any = false;
  std::vector<double> fixed(R, 0.0);
  for (std::size_t r = 0; r < R && t.fixed_unit >= 0; ++r) {
    const double pre = applied_fixed_ms(t, static_cast<int>(r), 0), dec = applied_fixed_ms(t, static_cast<int>(r), 1);
    any = any || pre != 0.0 || dec != 0.0;
    for (const serving::StepShape& sh : shapes)
      fixed[r] += (sh.prefill_rows > 0 ? pre : dec) * stepcost::pooled_level(levels.at(r), sh.prefill_rows > 0);
    fixed[r] *= scale;
  }
  if (any) out.stage_fixed_ms = std::move(fixed);
  return out;
}

double ProfileStepCosts::compute_ms(int k, const serving::StepShape& s) const {
  const auto& units = stage_units_.at(static_cast<std::size_t>(k));
  if (units.empty()) return stage_step_ms(stages_.at(k), s);
  const stepcost::StepWork w = step_work_of(s);
  double ms = 0.0;
  for (const auto& [fit, count] : units) ms += count * fits_[static_cast<std::size_t>(fit)].ms(w);
  ms = std::max(0.0, ms + fixed_ms_.at(static_cast<std::size_t>(k))[s.prefill_rows > 0 ? 0 : 1]);
  return ms * stepcost::pooled_level(levels_.at(static_cast<std::size_t>(k)), s.prefill_rows > 0);
}

double ProfileStepCosts::transfer_ms(int k, const serving::StepShape& s) const {
  const int S = stages();
  if (S == 1) return 0.0;  // one stage: the token stays on its device
  const Predictor::BoundaryLink& l = links_.at(k);
  const double bytes = pred_.message_bytes(k == S - 1, s.rows, static_cast<double>(s.tokens));
  return l.copies * link_transfer_ms(l.latency_s, l.bandwidth_Bps, bytes);
}

}  // namespace ppb::balance
