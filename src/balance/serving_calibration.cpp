#include "balance/serving_calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "common/stats.h"

namespace ppb::balance {

int step_token_band(long long tokens) {
  int b = 0;
  while (b < static_cast<int>(kStepTokenBands.size()) && tokens > kStepTokenBands[b]) ++b;
  return b;
}

double StepCalibration::factor(const serving::StepShape& s) const {
  return s.prefill_rows > 0 ? prefill_factor.at(step_token_band(s.tokens)) : decode_factor;
}

namespace {

/// The shape of measured step i of `sp`: its recorded prefill rows and attention keys (`steps/`
/// prefill_rows, prefill_keys, decode_keys); in older files without them, its prefill rows as
/// one prompt from position 0.
serving::StepShape measured_shape(const ServingPartitionRecord& sp, size_t i) {
  serving::StepShape s;
  s.prefill_tokens = sp.step_prefill_tokens[i];
  s.prefill_rows = s.prefill_tokens > 0 ? 1 : 0;
  s.decode_rows = sp.step_decode_rows[i];
  s.decode_context_mean = sp.step_decode_context[i];
  s.tokens = s.prefill_tokens + s.decode_rows;
  if (i < sp.step_prefill_keys.size() && i < sp.step_decode_keys.size() && i < sp.step_prefill_rows.size()) {
    s.prefill_rows = sp.step_prefill_rows[i];  // each row at its own position, as recorded
    s.prefill_keys = sp.step_prefill_keys[i];
    s.decode_keys = sp.step_decode_keys[i];
  } else {  // older files: the prefill as one prompt from position 0
    const double t = static_cast<double>(s.prefill_tokens);
    s.prefill_keys = t > 1.0 ? t * (t + 1.0) / 2.0 : 0.0;
    s.decode_keys = s.decode_rows * (s.decode_context_mean + 1.0) + (t == 1.0 ? 1.0 : 0.0);
  }
  s.rows = s.prefill_rows + s.decode_rows;
  return s;
}

/// fn(k, shape, measured, modelled) for every step of `sp` on every stage k where both times are
/// finite and > 0: its measured compute (steps/compute_ms) and `model`'s for its shape (ms). The
/// one walk of the calibrations and the replay.
template <class Fn>
void for_each_measured_step(const ServingPartitionRecord& sp, const ProfileStepCosts& model, Fn&& fn) {
  const int S = sp.stages;
  for (size_t i = 0; i < sp.step_group.size(); ++i) {
    const serving::StepShape s = measured_shape(sp, i);
    for (int k = 0; k < S; ++k) {
      const double meas = sp.step_compute_ms.at(i * static_cast<size_t>(S) + static_cast<size_t>(k)), want = model.compute_ms(k, s);
      if (!(meas > 0) || !(want > 0) || !std::isfinite(meas) || !std::isfinite(want)) continue;
      fn(k, s, meas, want);
    }
  }
}

/// The ratios gathered for one rank: decode-only steps, and steps with prefill per band.
struct Ratios {
  std::vector<double> decode;
  std::vector<std::vector<double>> prefill = std::vector<std::vector<double>>(kStepTokenBands.size() + 1);
  /// Against the step model: decode-only steps, and steps with prefill rows: their counts and
  /// the sums of their measured and modelled compute (ms).
  int model_decode = 0, model_prefill = 0;
  double meas_decode = 0, want_decode = 0, meas_prefill = 0, want_prefill = 0;
};

StepCalibration fit(const Ratios& r) {
  StepCalibration c;
  if (r.model_decode > 0 || r.model_prefill > 0) {
    // The step model carries the shape: a scale for each kind of step, its steps' busy time
    // against the model's, sum measured / sum modelled (a kind without samples takes the
    // other's). Not their median ratio: the rounds' steps' ratios are skewed (a few slow
    // steps), and a queue serves at their mean (docs/MEASUREMENTS.md § 2026-12-07 issue 47's
    // bars again: over 21 partitions the median left the in-sample TPOT p50 4.4% low on average,
    // the busy time 2.4%).
    const double dec = r.model_decode == 0 ? r.meas_prefill / r.want_prefill : r.meas_decode / r.want_decode;
    const double pre = r.model_prefill == 0 ? r.meas_decode / r.want_decode : r.meas_prefill / r.want_prefill;
    c.decode_factor = dec;
    c.prefill_factor.assign(c.prefill_factor.size(), pre);
    c.decode_samples = r.model_decode;
    c.prefill_samples.assign(c.prefill_samples.size(), 0);
    c.prefill_samples[0] = r.model_prefill;
    c.by_kind = true;
    return c;
  }
  c.decode_samples = static_cast<int>(r.decode.size());
  if (!r.decode.empty()) c.decode_factor = percentile(r.decode, 50.0);
  const int n = static_cast<int>(r.prefill.size());
  for (int b = 0; b < n; ++b) c.prefill_samples[b] = static_cast<int>(r.prefill[b].size());
  for (int b = 0; b < n; ++b) {
    // The band's own median, or the nearest band's with samples (below first on a tie).
    for (int d = 0; d < n; ++d) {
      const int lo = b - d, hi = b + d;
      const std::vector<double>* v = lo >= 0 && !r.prefill[lo].empty() ? &r.prefill[lo]
                                     : hi < n && !r.prefill[hi].empty() ? &r.prefill[hi] : nullptr;
      if (v) {
        c.prefill_factor[b] = percentile(*v, 50.0);
        break;
      }
    }
  }
  return c;
}

}  // namespace

namespace {

/// The calibration from the measured steps of the partitions `use` accepts (by name).
template <class Use>
std::vector<StepCalibration> calibrate_from(const RunRecord& run, const Predictor& pred, const std::vector<Partition>& parts,
                                            Use use) {
  std::vector<Ratios> ratios(static_cast<size_t>(run.world_size));
  const auto& sps = run.serving.partitions;
  for (size_t j = 0; j < sps.size() && j < parts.size(); ++j) {
    const ServingPartitionRecord& sp = sps[j];
    if (!use(sp.name) || sp.step_group.empty() || sp.stages != parts[j].num_stages()) continue;
    const ProfileStepCosts model(run, pred, parts[j]);
    for_each_measured_step(sp, model, [&](int k, const serving::StepShape& s, double meas, double want) {
      Ratios& r = ratios.at(static_cast<size_t>(parts[j].device_rank[k]));
      const bool pre = s.prefill_rows > 0;
      if (model.uses_step_model(k)) {
        ++(pre ? r.model_prefill : r.model_decode);
        (pre ? r.meas_prefill : r.meas_decode) += meas;
        (pre ? r.want_prefill : r.want_decode) += want;
      } else {
        (pre ? r.prefill[step_token_band(s.tokens)] : r.decode).push_back(meas / want);
      }
    });
  }
  std::vector<StepCalibration> out;
  for (const Ratios& r : ratios) out.push_back(fit(r));
  return out;
}

}  // namespace

std::vector<StepCalibration> calibrate_steps(const RunRecord& run, const Predictor& pred,
                                             const std::vector<Partition>& parts, const std::string& exclude) {
  return calibrate_from(run, pred, parts, [&](const std::string& n) { return n != exclude; });
}

std::vector<StepCalibration> calibrate_own_steps(const RunRecord& run, const Predictor& pred,
                                                 const std::vector<Partition>& parts, const std::string& name) {
  return calibrate_from(run, pred, parts, [&](const std::string& n) { return n == name; });
}

CalibratedStepCosts::CalibratedStepCosts(const RunRecord& run, const Predictor& pred, const Partition& p,
                                         std::vector<StepCalibration> by_rank)
    : base_(run, pred, p), by_rank_(std::move(by_rank)) {
  for (int k = 0; k < p.num_stages(); ++k) rank_.push_back(p.device_rank[k]);
}

double CalibratedStepCosts::compute_ms(int k, const serving::StepShape& s) const {
  return base_.compute_ms(k, s) * by_rank_.at(static_cast<size_t>(rank_.at(k))).factor(s);
}

ReplayedStepCosts::ReplayedStepCosts(const RunRecord& run, const Predictor& pred, const Partition& p,
                                     const ServingPartitionRecord& sp)
    : base_(run, pred, p) {
  const int S = p.num_stages();
  if (sp.stages != S) throw InternalError("ReplayedStepCosts: partition " + sp.name + " has " + std::to_string(sp.stages) +
                                          " stages in its record, " + std::to_string(S) + " in its split");
  ratios_.assign(static_cast<size_t>(S), {});
  next_.assign(static_cast<size_t>(S), {0, 0});
  for_each_measured_step(sp, base_, [&](int k, const serving::StepShape& s, double meas, double want) {
    ratios_[static_cast<size_t>(k)][s.prefill_rows > 0 ? 0 : 1].push_back(meas / want);
  });
}

double ReplayedStepCosts::compute_ms(int k, const serving::StepShape& s) const {
  const int kind = s.prefill_rows > 0 ? 0 : 1;
  const std::vector<double>& r = ratios_.at(static_cast<size_t>(k))[kind];
  size_t& i = next_.at(static_cast<size_t>(k))[kind];
  const double f = r.empty() ? 1.0 : r[i++ % r.size()];
  return base_.compute_ms(k, s) * f;
}

}  // namespace ppb::balance

namespace ppb::balance {

namespace {

/// The stored scenario's requests and its spec.
struct StoredScenario {
  std::vector<serving::Request> requests;
  serving::ScenarioSpec spec;
};

StoredScenario stored_scenario(const ServingRunRecord& s) {
  if (!s.spec) throw InternalError("serving prediction: the record has no scenario");
  StoredScenario out;
  out.spec = *s.spec;
  for (size_t q = 0; q < s.arrival_s.size(); ++q) out.requests.push_back({s.arrival_s[q], s.prompt_len.at(q), s.gen_len.at(q)});
  return out;
}

/// The figures of one play (ServingPrediction) from its metrics.
ServingPrediction prediction_of(const serving::ServingMetrics& m) {
  ServingPrediction out;
  out.output_tokens_per_s = m.output_tokens_per_s;
  out.ttft_p50_ms = m.ttft.p50_ms, out.ttft_p99_ms = m.ttft.p99_ms;
  out.tpot_p50_ms = m.tpot.p50_ms, out.tpot_p99_ms = m.tpot.p99_ms;
  out.goodput_req_per_s = m.goodput_req_per_s, out.slo_attainment = m.slo_attainment;
  out.preemptions = static_cast<double>(m.preemptions);
  return out;
}

/// The simulator's metrics of `costs` on the stored scenario with p's M and B; `overlap`, where
/// given, gets the play's contention overlap ([S][2] flattened, PipelineSimResult::overlap).
serving::ServingMetrics play(const StoredScenario& sc, const ServingPartitionRecord& p, const serving::StepCostModel& costs,
                             std::vector<double>* overlap = nullptr) {
  serving::PipelineSimConfig cfg;
  cfg.scheduler = sc.spec.scheduler(p.groups, p.step_policy, p.pp_schedule);
  if (cfg.scheduler.kv_blocks == serving::kKvBlocksAuto) {  // the pool auto chose for this split
    if (p.kv_blocks < 0) throw UserError("serving prediction: partition " + p.name + " ran --kv-blocks auto but its record has no kv_blocks");
    cfg.scheduler.kv_blocks = p.kv_blocks;
  }
  const serving::PipelineSimResult r = serving::simulate_serving(sc.requests, costs, cfg);
  if (overlap) {
    overlap->clear();
    for (const auto& f : r.overlap) overlap->insert(overlap->end(), f.begin(), f.end());
  }
  return serving::serving_metrics(r.times, sc.spec.goodput);
}

}  // namespace

std::string predict_serving(RunRecord& run, const Predictor& pred, const std::vector<Partition>& parts) {
  const StoredScenario sc = stored_scenario(run.serving);
  std::string why;
  auto& sps = run.serving.partitions;
  for (size_t j = 0; j < sps.size() && j < parts.size(); ++j) {
    ServingPartitionRecord& p = sps[j];
    try {
      const serving::ServingMetrics m = play(sc, p, ProfileStepCosts(run, pred, parts[j]), &p.simulated_overlap);
      p.simulated = prediction_of(m);
      if (!p.step_group.empty()) {  // the level its own rounds ran at, and the simulator there
        const std::vector<StepCalibration> own = calibrate_own_steps(run, pred, parts, p.name);
        const serving::ServingMetrics o = play(sc, p, CalibratedStepCosts(run, pred, parts[j], own));
        p.self = prediction_of(o);
        p.replayed = prediction_of(play(sc, p, ReplayedStepCosts(run, pred, parts[j], p)));
        p.step_level.clear();
        const double nan = std::numeric_limits<double>::quiet_NaN();
        for (int k = 0; k < parts[j].num_stages(); ++k) {
          const StepCalibration& c = own.at(static_cast<size_t>(parts[j].device_rank[k]));
          int prefill_steps = 0;  // by_kind: all in band 0; else band 0's factor is the nearest band's
          for (int n : c.prefill_samples) prefill_steps += n;
          p.step_level.insert(p.step_level.end(), {c.decode_samples > 0 ? c.decode_factor : nan,
                                                   prefill_steps > 0 ? c.prefill_factor.front() : nan});
        }
      }
      std::string by;
      for (const auto& other : sps)
        if (other.name != p.name && !other.step_group.empty()) by += (by.empty() ? "" : ",") + other.name;
      if (by.empty()) continue;
      const CalibratedStepCosts costs(run, pred, parts[j], calibrate_steps(run, pred, parts, p.name));
      const serving::ServingMetrics c = play(sc, p, costs);
      p.cross_calibrated_by = by;
      p.cross = prediction_of(c);
    } catch (const std::exception& e) {
      why += (why.empty() ? "" : "; ") + p.name + ": " + e.what();
    }
  }
  return why;
}

}  // namespace ppb::balance
