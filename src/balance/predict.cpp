#include "balance/predict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "balance/calibrate.h"
#include "balance/contention.h"
#include "balance/layout.h"
#include "balance/solver.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/events.h"
#include "common/roofline.h"
#include "common/transfer.h"
#include "results/profile_step_fit.h"

namespace ppb::balance {

Partition partition_of(const PartitionRecord& pr) {
  Partition p;
  p.solver = pr.name;
  p.first_unit = pr.first_unit;
  p.last_unit = pr.last_unit;
  p.device_rank = pr.device_rank;
  p.tp_width = pr.tp_width;
  if (p.tp_width.size() != p.first_unit.size()) p.tp_width.assign(p.first_unit.size(), 1);
  p.groups = pr.groups;
  p.replicas = std::max(1, pr.replicas);
  return p;
}

Predictor::Predictor(const RunRecord& run) : run_(run) {
  const WorkloadInfo& w = run.workload;
  if (w.microbatches < 1 || w.gen_len < 1 || w.batch < 1)
    throw UserError("the run's workload is incomplete (M=" + std::to_string(w.microbatches) + " G=" +
                    std::to_string(w.gen_len) + " B=" + std::to_string(w.batch) + "): nothing to predict");
  objective_ = parse_objective(w.objective.empty() ? "workload" : w.objective);
  sim_.groups = w.microbatches;
  sim_.gen_len = w.gen_len;
  sim_.batch = w.batch;
  sim_.overlap = w.overlap;
  prompt_len_ = w.prompt_len;
  dtype_bytes_ = dtype_bytes(workload_dtype(w));
  const auto hidden = run.model_attrs_num.find("hidden_size");
  hidden_ = hidden != run.model_attrs_num.end() ? hidden->second : 0.0;
  link_latency_s_ = run.link_latency_s;
  link_bandwidth_Bps_ = run.link_bandwidth_Bps;
  pair_links_ = node_pair_links(run);
  device_class_ = rank_device_classes(run.ranks);
  for (const RankInfo& r : run.ranks) machine_.push_back(rank_machine(r));
  if (!run.profile.latency_ms.empty()) {
    problem_ = problem_from_run(run, objective_);
    have_problem_ = true;
  }
}

namespace {

/// A one-rank stage's sums of `units` one-unit timings (pre, dec) less its forward fixed cost
/// counted units - 1 times too many (stepcost::FixedCost; prof's pairs, 0 where it has none).
std::pair<double, double> with_fixed_cost(const ProfileTable& prof, int r, int units, double pre, double dec) {
  if (prof.fixed_unit < 0) return {pre, dec};
  return {std::max(0.0, pre + stage_fixed_ms(prof, r, units, 0)), std::max(0.0, dec + stage_fixed_ms(prof, r, units, 1))};
}

}  // namespace

std::pair<double, double> Predictor::stage_sums(const ProfileTable& prof, const Partition& p, int k,
                                                ProfileStat stat) const {
  const int r = p.device_rank[k], w = p.width(k);
  const size_t U = prof.unit_name.size();
  double pre = 0, dec = 0;
  if (w == 1) {
    const std::vector<double>& t = stat == ProfileStat::median ? prof.latency_ms
                                   : stat == ProfileStat::min  ? prof.latency_min_ms
                                                               : prof.latency_max_ms;
    for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) {
      pre += t[(static_cast<size_t>(r) * U + u) * 2];
      dec += t[(static_cast<size_t>(r) * U + u) * 2 + 1];
    }
    return with_fixed_cost(prof, r, p.last_unit[k] - p.first_unit[k] + 1, pre, dec);
  }
  // The group's own profile, or that of a profiled group of the same width and device class
  // (--tp auto profiles one per class and width).
  RunRecord view;
  view.profile.tp = prof.tp;
  const ProfileTable::TpGroupProfile* g = group_profile(view, device_class_, r, w);
  if (!g) return {std::nan(""), std::nan("")};
  const auto& t = stat == ProfileStat::median ? g->latency_ms : stat == ProfileStat::min ? g->latency_min_ms : g->latency_max_ms;
  for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) {
    pre += t[2 * static_cast<size_t>(u)];
    dec += t[2 * static_cast<size_t>(u) + 1];
  }
  return {pre, dec};
}

StageSums Predictor::pass_sums(const Partition& p, const ProfileTable& prof) const {
  StageSums s;
  const size_t U = prof.unit_name.size();
  for (int k = 0; k < p.num_stages(); ++k) {
    const auto [pre, dec] = stage_sums(prof, p, k);
    s.together.insert(s.together.end(), {pre, dec});
    if (prof.latency_alone_ms.empty() || p.width(k) != 1) {
      s.alone.insert(s.alone.end(), {pre, dec});
      continue;
    }
    double apre = 0, adec = 0;
    const size_t r = static_cast<size_t>(p.device_rank[k]);
    for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) {
      apre += prof.latency_alone_ms[(r * U + u) * 2];
      adec += prof.latency_alone_ms[(r * U + u) * 2 + 1];
    }
    const auto [fpre, fdec] = with_fixed_cost(prof, static_cast<int>(r), p.last_unit[k] - p.first_unit[k] + 1, apre, adec);
    s.alone.insert(s.alone.end(), {fpre, fdec});
  }
  return s;
}

std::vector<int> Predictor::stage_machines(const Partition& p) const {
  const int S = p.num_stages();
  std::vector<int> node(S);
  for (int k = 0; k < S; ++k) {
    node[k] = k;
    for (int j = 0; j < k; ++j)
      if (machine_.at(p.device_rank[j]) == machine_.at(p.device_rank[k])) {
        node[k] = node[j];
        break;
      }
  }
  return node;
}

bool Predictor::same_machine(int a, int b) const {
  const int n = static_cast<int>(machine_.size());
  if (devices_per_machine_ > 0) return a / devices_per_machine_ == b / devices_per_machine_;
  return a < n && b < n && machine_[a] == machine_[b];
}

std::vector<char> Predictor::twin_on_machine(const Partition& p) const {
  std::vector<char> twin(p.num_stages(), 0);
  for (int k = 0; k < p.num_stages(); ++k)
    for (int r = 1; r < p.replicas && !twin[k]; ++r)
      twin[k] = same_machine(p.device_rank[k], p.first_rank(r, k)) ? 1 : 0;
  return twin;
}

Predictor::BoundaryLink Predictor::boundary_link(const Partition& p, int k) const {
  const int S = p.num_stages(), next = (k + 1) % S;
  BoundaryLink l;
  l.copies = handoff_copies(p.width(k), p.width(next));
  // On several nodes each boundary's own link (the balancer's), else the run's one link.
  std::tie(l.latency_s, l.bandwidth_Bps) = pair_links_.measured(p.device_rank[k], p.device_rank[next], device_class_.size())
                                               .value_or(std::make_pair(link_latency_s_, link_bandwidth_Bps_));
  return l;
}

double Predictor::message_bytes(bool last_stage, int rows, double tokens) const {
  // boundary_message_bytes of one sequence of `tokens` tokens: [tokens, hidden] elements.
  return last_stage ? boundary_message_bytes(true, rows, 1, hidden_, dtype_bytes_) : tokens * hidden_ * dtype_bytes_;
}

std::vector<SimStage> Predictor::sim_stages(const Partition& p, const std::vector<double>& phase_ms) const {
  const int S = p.num_stages();
  std::vector<SimStage> st(S);
  for (int k = 0; k < S; ++k) {
    st[k].prefill_ms = phase_ms[2 * k];
    st[k].decode_ms = phase_ms[2 * k + 1];
    if (S == 1) continue;  // one stage: no transfer at all (the token stays on its device)
    const BoundaryLink l = boundary_link(p, k);
    auto xfer_ms = [&](int tokens) {
      return l.copies * link_transfer_ms(l.latency_s, l.bandwidth_Bps,
                                         message_bytes(k == S - 1, sim_.batch, static_cast<double>(sim_.batch) * tokens));
    };
    st[k].send_prefill_ms = xfer_ms(prompt_len_);
    st[k].send_decode_ms = xfer_ms(1);
  }
  return st;
}

PhasePrediction Predictor::contended_phases(const Partition& p, const StageSums& sums) const {
  PhasePrediction out;
  try {
    const auto m = contended_step_times(sim_stages(p, sums.alone), sim_stages(p, sums.together), stage_machines(p), sim_for(p),
                                        twin_on_machine(p));
    if (!m.converged)
      out.warning = "the contention model did not settle for partition " + p.solver + " in " +
                    std::to_string(m.iterations) + " simulations; its predictions are the last iterate's";
    for (const auto& s : m.stages) out.phase_ms.insert(out.phase_ms.end(), {s.prefill_ms, s.decode_ms});
    for (size_t k = 0; k < m.stages.size(); ++k)
      out.overlap.insert(out.overlap.end(), {m.overlap_prefill[k], m.overlap_decode[k]});
  } catch (const std::exception& e) {
    out.warning = "the contention model failed for partition " + p.solver + " (" + e.what() +
                  "); its predictions are the profile's together times";
    out.phase_ms = sums.together;
    out.overlap.assign(sums.together.size(), 1.0);
  }
  return out;
}

PhasePrediction Predictor::predicted_phases(const Partition& p, const ProfileTable& prof) const {
  StageSums sums = pass_sums(p, prof);
  if (prof.latency_alone_ms.empty()) {
    PhasePrediction out;
    out.phase_ms = std::move(sums.together);
    return out;
  }
  return contended_phases(p, sums);
}

std::vector<double> Predictor::stage_costs(const Partition& p, const std::vector<double>& phase_ms) const {
  if (!have_problem_) throw UserError("the run has no profile: no transfers to predict from");
  const std::vector<double> transfers = stage_transfer_ms(problem_, p);
  std::vector<double> cost;
  for (int k = 0; k < p.num_stages(); ++k)
    cost.push_back(with_transfers(objective_cost(objective_, phase_ms[2 * k], phase_ms[2 * k + 1], sim_.gen_len),
                                  transfers[k], sim_.overlap));
  return cost;
}

PartitionMetrics Predictor::simulate(const Partition& p, const std::vector<double>& phase_ms) const {
  PartitionMetrics m = simulate_pipeline(sim_stages(p, phase_ms), sim_for(p)).metrics;
  if (p.replicas > 1) {  // R pipelines side by side, each as one (the planner's model of replicas)
    const double R = p.replicas;
    for (double* rate : {&m.tokens_per_s, &m.decode_tokens_per_s, &m.bottleneck_bound_tok_s}) *rate *= R;
    for (std::vector<double>* rates : {&m.rep_tokens_per_s, &m.rep_decode_tokens_per_s})
      for (double& v : *rates) v *= R;
  }
  return m;
}

PartitionRecord Predictor::describe(const Partition& p, const ProfileTable& prof, std::string* warning) const {
  PartitionRecord pr;
  const int S = p.num_stages();
  pr.name = p.solver;
  pr.solver = p.solver;
  pr.first_unit = p.first_unit;
  pr.last_unit = p.last_unit;
  pr.device_rank = p.device_rank;
  for (int k = 0; k < S; ++k) pr.tp_width.push_back(p.width(k));
  pr.layout = layout_label(pr.tp_width);
  pr.groups = sim_for(p).groups;
  pr.replicas = p.replicas;
  for (int k = 0; k < S; ++k) pr.handoff_copies.push_back(S == 1 ? 0 : handoff_copies(p.width(k), p.width((k + 1) % S)));
  PhasePrediction phases = predicted_phases(p, prof);
  if (warning) *warning = phases.warning;
  pr.predicted_phase_ms = std::move(phases.phase_ms);
  pr.predicted_stage_ms = p.predicted_stage_ms;
  bool fixed = false;  // a forward's fixed cost taken on a width-1 stage's rank: the solver caps it (apply_stage_fixed)
  for (int k = 0; k < S && prof.fixed_unit >= 0; ++k)
    for (int ph = 0; ph < 2; ++ph)
      fixed = fixed || (p.width(k) == 1 && stage_fixed_ms(prof, p.device_rank[k], p.last_unit[k] - p.first_unit[k] + 1, ph) != 0.0);
  if (!prof.latency_alone_ms.empty() || fixed) {
    // The solver's stage time is stage_time(compute on the together table, t_in, t_out); the
    // modelled compute takes the together compute's place, with the solver's own transfers. A
    // tensor-parallel stage keeps the solver's value (its group profile is not modelled).
    const std::vector<double> costs = stage_costs(p, pr.predicted_phase_ms);
    for (int k = 0; k < S; ++k)
      if (p.width(k) == 1) pr.predicted_stage_ms[k] = costs[k];
  }
  pr.predicted_bottleneck_ms = *std::max_element(pr.predicted_stage_ms.begin(), pr.predicted_stage_ms.end());
  const ProfileTable& units = run_.profile;  // FLOPs and bytes per unit (a calibrated copy has the same)
  for (int k = 0; k < S; ++k) {
    const int r = p.device_rank[k], w = p.width(k);
    const auto [pre_lo, dec_lo] = stage_sums(prof, p, k, ProfileStat::min);
    const auto [pre_hi, dec_hi] = stage_sums(prof, p, k, ProfileStat::max);
    pr.predicted_stage_min_ms.push_back(objective_cost(objective_, pre_lo, dec_lo, sim_.gen_len));
    pr.predicted_stage_max_ms.push_back(objective_cost(objective_, pre_hi, dec_hi, sim_.gen_len));
    // The floor with the rank's shared read bandwidth (every stage runs at once in the pipeline);
    // a tensor-parallel stage's: its rank's floor of the whole stage over the width (the ideal
    // split of its work and bytes; the all-reduces are not in it).
    const RankInfo& info = run_.ranks.at(r);
    double floor_pre = 0, floor_dec = 0;
    for (int u = p.first_unit[k]; u <= p.last_unit[k] && units.unit_flops.size() > 2 * static_cast<size_t>(u) + 1; ++u) {
      floor_pre += roofline_floor_ms(units.unit_flops[2 * u], units.unit_bytes[2 * u], info.read_bandwidth_shared_GBps,
                                     info.peak_gflops);
      floor_dec += roofline_floor_ms(units.unit_flops[2 * u + 1], units.unit_bytes[2 * u + 1],
                                     info.read_bandwidth_shared_GBps, info.peak_gflops);
    }
    pr.stage_floor_phase_ms.push_back(floor_pre / w);
    pr.stage_floor_phase_ms.push_back(floor_dec / w);
    pr.stage_floor_ms.push_back(objective_cost(objective_, floor_pre / w, floor_dec / w, sim_.gen_len));
  }
  return pr;
}

std::vector<double> Predictor::predict_again(const Partition& p, const std::vector<double>& phase_ms,
                                             const std::string& prefix, double measured_decode_tok_s,
                                             std::map<std::string, double>& metrics) const {
  std::vector<double> cost = stage_costs(p, phase_ms);
  const PartitionMetrics sim = simulate(p, phase_ms);
  metrics[prefix + "tokens_per_s"] = sim.tokens_per_s;
  metrics[prefix + "decode_tokens_per_s"] = sim.decode_tokens_per_s;
  metrics[prefix + "decode_error"] = measured_decode_tok_s > 0 ? sim.decode_tokens_per_s / measured_decode_tok_s - 1.0 : 0.0;
  metrics[prefix + "ttft_p50_ms"] = sim.ttft_p50_ms;
  metrics[prefix + "tpot_p50_ms"] = sim.tpot_p50_ms;
  return cost;
}

std::optional<ProfileTable> rounds_profile(const RunRecord& run) {
  const ProfileTable& t = run.profile;
  const size_t n = t.latency_ms.size();
  if (n == 0 || t.latency_rounds_ms.empty() || t.latency_rounds_ms.size() % n != 0) return std::nullopt;
  const size_t K = t.latency_rounds_ms.size() / n;
  std::vector<double> mean(n, 0.0);
  for (size_t k = 0; k < K; ++k)
    for (size_t i = 0; i < n; ++i) mean[i] += t.latency_rounds_ms[k * n + i] / static_cast<double>(K);
  return profile_as_rounds_saw_it(t, mean, parse_objective(run.workload.objective), run.workload.gen_len);
}

void add_simulated_metrics(const Predictor& pred, const Partition& p, PartitionRecord& pr, double measured_decode_tok_s,
                           const std::optional<ProfileTable>& seen, std::vector<std::string>& warnings) {
  try {
    const PartitionMetrics sim = pred.simulate(p, pr.predicted_phase_ms);
    pr.metrics["simulated_tokens_per_s"] = sim.tokens_per_s;
    pr.metrics["simulated_decode_tokens_per_s"] = sim.decode_tokens_per_s;
    pr.metrics["simulated_decode_error"] =
        measured_decode_tok_s > 0 ? sim.decode_tokens_per_s / measured_decode_tok_s - 1.0 : 0.0;
    pr.metrics["simulated_ttft_p50_ms"] = sim.ttft_p50_ms;
    pr.metrics["simulated_tpot_p50_ms"] = sim.tpot_p50_ms;
  } catch (const std::exception& e) {
    warnings.push_back("the simulator failed for partition " + p.solver + ": " + e.what());
  }
  // The same predictions from the profile as the rounds saw the units (single-rank stages).
  if (!seen || p.tensor_parallel()) return;
  try {
    PhasePrediction phases = pred.predicted_phases(p, *seen);
    if (!phases.warning.empty()) warnings.push_back(phases.warning);
    pr.predicted_phase_rounds_ms = std::move(phases.phase_ms);
    pr.predicted_stage_rounds_ms.clear();
    pr.predicted_stage_rounds_ms =
        pred.predict_again(p, pr.predicted_phase_rounds_ms, "simulated_rounds_", measured_decode_tok_s, pr.metrics);
  } catch (const std::exception& e) {
    warnings.push_back("the prediction from the profile between rounds failed for partition " + p.solver + ": " + e.what());
  }
}

namespace {

/// Whether partition record `pr` cross-calibrates (and is cross-calibrated by) the others: measured
/// on its own, one rank per stage, with its events and mean steps.
bool cross_source(const PartitionRecord& pr) {
  const Partition p = partition_of(pr);
  return pr.measured && pr.same_as.empty() && !p.tensor_parallel() &&
         pr.stage_compute_mean_ms.size() == 2 * static_cast<size_t>(p.num_stages()) && !pr.events.empty();
}

/// The shape of a record's events: [reps][M][G+1][S][kNumEvents].
EventShape events_shape(const SimConfig& sim, const std::vector<double>& events, int stages) {
  const size_t rep = static_cast<size_t>(sim.groups) * (sim.gen_len + 1) * stages * kNumEvents;
  return EventShape{static_cast<int>(events.size() / rep), sim.groups, sim.gen_len + 1, stages};
}

/// Every measured compute step of partition `pr` as a calibration sample (its profile's alone
/// sum, the share of it another stage of its machine overlapped, its time), and its measured
/// stage_overlap stored in `pr`.
std::vector<StepSample> step_samples(const Predictor& pred, PartitionRecord& pr, const StageSums& sums, bool two_passes) {
  const Partition p = partition_of(pr);
  const int S = p.num_stages();
  const EventShape sh = events_shape(pred.sim_for(p), pr.events, S);
  const std::vector<double> share = step_overlap(pr.events, sh, pred.stage_machines(p));
  const auto [over_pre, over_dec] = overlap_of_steps(pr.events, sh, share);
  pr.stage_overlap.clear();
  for (int k = 0; k < S; ++k) pr.stage_overlap.insert(pr.stage_overlap.end(), {over_pre[k], over_dec[k]});
  std::vector<StepSample> steps;
  for (size_t row = 0; row * S < share.size(); ++row)  // row: [reps][M][G+1] flattened
    for (int k = 0; k < S; ++k) {
      if (!std::isfinite(share[row * S + k])) continue;
      const int ph = row % sh.steps == 0 ? 0 : 1;
      const size_t e = (row * S + k) * kNumEvents;
      // One pass (GPUs, each with its own memory): no contention to fit, the level alone.
      steps.push_back({p.device_rank[k], ph, sums.alone[2 * k + ph], two_passes ? share[row * S + k] : 0.0,
                       1e3 * (pr.events[e + kComputeEnd] - pr.events[e + kComputeStart]),
                       sums.together[2 * k + ph] - sums.alone[2 * k + ph]});
    }
  return steps;
}

/// Partition `pr`'s cross-calibrated prediction from the factors fitted on `others`' steps; false
/// (nothing stored) where some rank of it has no calibration.
bool cross_predict(const Predictor& pred, PartitionRecord& pr, const StageSums& sums, const std::vector<StepSample>& others,
                   const std::string& by, bool two_passes, std::vector<std::string>& warnings) {
  const Partition p = partition_of(pr);
  pr.predicted_phase_cross_ms.clear();
  pr.predicted_stage_cross_ms.clear();
  const ContentionCalibration cal = contention_calibration(others, pred.ranks());
  StageSums calibrated{std::vector<double>(sums.alone.size()), std::vector<double>(sums.alone.size())};
  for (int k = 0; k < p.num_stages(); ++k)
    for (size_t ph = 0; ph < 2; ++ph) {
      const size_t f = 2 * static_cast<size_t>(p.device_rank[k]) + ph, at = 2 * static_cast<size_t>(k) + ph;
      if (cal.fit[f] == CalibrationFit::none) return false;  // a rank no other partition measured
      const double a = sums.alone[at], t = sums.together[at];
      calibrated.alone[at] = cal.level[f] * a;
      calibrated.together[at] = cal.fit[f] == CalibrationFit::contention
                                    ? calibrated.alone[at] + cal.contention[f] * a
                                    : cal.level[f] * (a + std::max(t - a, 0.0));  // the profile's own contention
    }
  pr.cross_level = cal.level;
  pr.cross_contention = cal.contention;
  pr.cross_fit.clear();
  for (const auto f : cal.fit) pr.cross_fit.push_back(static_cast<int>(f));
  if (two_passes) {
    PhasePrediction phases = pred.contended_phases(p, calibrated);
    if (!phases.warning.empty()) warnings.push_back(phases.warning);
    pr.predicted_phase_cross_ms = std::move(phases.phase_ms);
    pr.predicted_overlap_cross = std::move(phases.overlap);
  } else {
    pr.predicted_phase_cross_ms = calibrated.together;
    pr.predicted_overlap_cross.clear();
  }
  pr.cross_calibrated_by = by;
  const double measured = pr.metrics.count("decode_tokens_per_s") ? pr.metrics.at("decode_tokens_per_s") : 0.0;
  pr.predicted_stage_cross_ms = pred.predict_again(p, pr.predicted_phase_cross_ms, "simulated_cross_", measured, pr.metrics);
  return true;
}

/// Whether partition record `pr` is a tensor-parallel split the TP cross-calibration can use: measured on
/// its own, with its mean steps and its predicted steps per stage.
bool tp_cross_source(const PartitionRecord& pr) {
  const size_t S2 = 2 * pr.first_unit.size();
  return pr.measured && pr.same_as.empty() && partition_of(pr).tensor_parallel() && pr.stage_compute_mean_ms.size() == S2 &&
         pr.predicted_phase_ms.size() == S2;
}

/// Whether stage k of `a` and stage l of `b` run the same units on the same group of ranks.
bool same_stage(const PartitionRecord& a, size_t k, const PartitionRecord& b, size_t l) {
  const auto width = [](const PartitionRecord& p, size_t s) { return p.tp_width.size() > s ? p.tp_width[s] : 1; };
  return a.first_unit[k] == b.first_unit[l] && a.last_unit[k] == b.last_unit[l] && a.device_rank[k] == b.device_rank[l] &&
         width(a, k) == width(b, l);
}

/// Cross-calibration of the tensor-parallel splits (the contention model does not cover a group's
/// profile): each stage's predicted prefill and decode step scaled by Σ measured mean step /
/// Σ predicted step of the same stage (same units, same group of ranks) in the *other* measured
/// tensor-parallel splits (e.g. one layout at two M, `run --plan`), which ran in the same rounds;
/// nothing where some stage has no such twin. Fills what cross_predict fills but the contention
/// fit (cross_level / cross_contention / cross_fit stay empty).
void cross_calibrate_tp(const Predictor& pred, RunRecord& run) {
  const size_t N = run.partitions.size();
  for (size_t i = 0; i < N; ++i) {
    PartitionRecord& pr = run.partitions[i];
    if (!tp_cross_source(pr)) continue;
    std::vector<double> phase = pr.predicted_phase_ms;
    std::set<std::string> by;
    bool every_stage = true;
    for (size_t k = 0; k < pr.first_unit.size() && every_stage; ++k)
      for (size_t ph = 0; ph < 2; ++ph) {
        double measured = 0.0, predicted = 0.0;
        for (size_t j = 0; j < N; ++j) {
          const PartitionRecord& o = run.partitions[j];
          if (j == i || !tp_cross_source(o)) continue;
          for (size_t l = 0; l < o.first_unit.size(); ++l)
            if (same_stage(pr, k, o, l) && o.stage_compute_mean_ms[2 * l + ph] > 0) {
              measured += o.stage_compute_mean_ms[2 * l + ph];
              predicted += o.predicted_phase_ms[2 * l + ph];
              by.insert(o.name);
            }
        }
        if (!(predicted > 0)) every_stage = false;
        else phase[2 * k + ph] *= measured / predicted;
      }
    if (!every_stage) continue;
    pr.predicted_phase_cross_ms = phase;
    pr.cross_calibrated_by.clear();
    for (const std::string& n : by) pr.cross_calibrated_by += (pr.cross_calibrated_by.empty() ? "" : ",") + n;
    const double decode = pr.metrics.count("decode_tokens_per_s") ? pr.metrics.at("decode_tokens_per_s") : 0.0;
    pr.predicted_stage_cross_ms = pred.predict_again(partition_of(pr), phase, "simulated_cross_", decode, pr.metrics);
  }
}

}  // namespace

void cross_calibrate(const Predictor& pred, RunRecord& run, std::vector<std::string>& warnings) {
  const bool two_passes = !run.profile.latency_alone_ms.empty();
  const size_t N = run.partitions.size();
  std::vector<std::vector<StepSample>> steps(N);
  std::vector<StageSums> sums(N);
  for (size_t i = 0; i < N; ++i) {
    if (!cross_source(run.partitions[i])) continue;
    sums[i] = pred.pass_sums(partition_of(run.partitions[i]), run.profile);
    steps[i] = step_samples(pred, run.partitions[i], sums[i], two_passes);
  }
  for (size_t i = 0; i < N; ++i) {
    if (!cross_source(run.partitions[i])) continue;
    std::vector<StepSample> others;
    std::string by;
    for (size_t j = 0; j < N; ++j) {
      if (j == i || !cross_source(run.partitions[j])) continue;
      others.insert(others.end(), steps[j].begin(), steps[j].end());
      by += (by.empty() ? "" : ",") + run.partitions[j].name;
    }
    cross_predict(pred, run.partitions[i], sums[i], others, by, two_passes, warnings);
  }
  cross_calibrate_tp(pred, run);
  for (PartitionRecord& pr : run.partitions) {  // a shared measurement: its partition's cross prediction
    if (!pr.measured || pr.same_as.empty()) continue;
    for (const PartitionRecord& o : run.partitions)
      if (o.name == pr.same_as && o.same_as.empty()) {
        pr.predicted_phase_cross_ms = o.predicted_phase_cross_ms;
        pr.predicted_stage_cross_ms = o.predicted_stage_cross_ms;
        pr.predicted_overlap_cross = o.predicted_overlap_cross;
        pr.cross_level = o.cross_level;
        pr.cross_contention = o.cross_contention;
        pr.cross_fit = o.cross_fit;
        pr.stage_overlap = o.stage_overlap;
        pr.cross_calibrated_by = o.cross_calibrated_by;
        for (const char* k : {"simulated_cross_tokens_per_s", "simulated_cross_decode_tokens_per_s",
                              "simulated_cross_decode_error", "simulated_cross_ttft_p50_ms", "simulated_cross_tpot_p50_ms"})
          if (o.metrics.count(k)) pr.metrics[k] = o.metrics.at(k);
      }
  }
}

std::vector<StageMeasurement> stage_measurements(const Predictor& pred, const Partition& p, const ProfileTable& prof,
                                                 const std::vector<double>& events) {
  const int S = p.num_stages();
  const EventShape sh = events_shape(pred.sim_for(p), events, S);
  // Against the profile as measured (an adaptive split's own predictions are from an earlier
  // calibrated table), through the contention model where the profile has two passes: the
  // factors scale both passes of that table.
  const std::vector<double> predicted = pred.predicted_phases(p, prof).phase_ms;
  std::vector<StageMeasurement> stages;
  for (int k = 0; k < S; ++k) {
    double pre = 0, dec = 0;
    int npre = 0, ndec = 0;
    for (int it = 0; it < sh.iters; ++it)
      for (int g = 0; g < sh.groups; ++g)
        for (int t = 0; t < sh.steps; ++t) {
          const double d = 1e3 * (events[sh.index(it, g, t, k, kComputeEnd)] - events[sh.index(it, g, t, k, kComputeStart)]);
          if (!std::isfinite(d)) continue;
          (t == 0 ? pre : dec) += d;
          ++(t == 0 ? npre : ndec);
        }
    StageMeasurement m;
    m.rank = p.device_rank[k];
    m.predicted_prefill_ms = predicted[2 * k];
    m.predicted_decode_ms = predicted[2 * k + 1];
    m.measured_prefill_ms = npre ? pre / npre : 0.0;
    m.measured_decode_ms = ndec ? dec / ndec : 0.0;
    stages.push_back(m);
  }
  return stages;
}

}  // namespace ppb::balance
