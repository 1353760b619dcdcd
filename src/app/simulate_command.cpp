// `ppbench simulate`: the pipelined loop played from per-stage step times (balance/simulator.h),
// from a stage JSON or from a results file, whose partitions, or any split of its profile, are
// predicted by the run's own model (balance/predict.h). No MPI, no device. docs/OFFLINE.md.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>

#include "app/offline_commands.h"
#include "app/offline_io.h"
#include "balance/calibrate.h"
#include "balance/partition.h"
#include "balance/predict.h"
#include "balance/problem.h"
#include "balance/serving_calibration.h"
#include "balance/simulator.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/transfer.h"
#include "results/run_record.h"
#include "results/serving_summary.h"

namespace ppb {

using namespace offline;

namespace {

/// one_decode_step: M x G = 1, so no time lies between a first and a last decode token and decode
/// tokens/s is undefined (null in JSON, "n/a" printed).
json metrics_json(const PartitionMetrics& m, bool one_decode_step) {
  return {{"tokens_per_s", m.tokens_per_s},
          {"decode_tokens_per_s", one_decode_step ? json(nullptr) : json(m.decode_tokens_per_s)},
          {"ttft_p50_ms", m.ttft_p50_ms},     {"ttft_p99_ms", m.ttft_p99_ms},
          {"tpot_p50_ms", m.tpot_p50_ms},     {"tpot_p99_ms", m.tpot_p99_ms},
          {"bubble_fraction", m.bubble_fraction}, {"bottleneck_bound_tok_s", m.bottleneck_bound_tok_s}};
}

void print_metrics(const std::string& label, const PartitionMetrics& m, bool one_decode_step) {
  std::printf("  %-26s tokens/s %10s  decode tokens/s %10s  TTFT p50 %9s ms  TPOT p50 %9s ms  bubble", label.c_str(),
              num(m.tokens_per_s, 2).c_str(),
              one_decode_step ? "n/a (one decode step)" : num(m.decode_tokens_per_s, 2).c_str(), sig(m.ttft_p50_ms).c_str(),
              sig(m.tpot_p50_ms).c_str());
  for (double b : m.bubble_fraction) std::printf(" %.3f", b);
  std::printf("\n");
}

/// Refuses a simulation whose timeline would not fit memory (~0.5 KB per simulated step).
void check_sim_size(const balance::SimConfig& cfg, std::size_t stages) {
  const double steps = static_cast<double>(cfg.groups) * (static_cast<double>(cfg.gen_len) + 1) * static_cast<double>(stages);
  if (steps > kMaxSimSteps)
    throw UserError("-M/--microbatches " + std::to_string(cfg.groups) + " x (-g/--gen-len " + std::to_string(cfg.gen_len) +
                    " + 1) x " + std::to_string(stages) + " stages = " + num(steps, 0) +
                    " simulated steps; at most " + num(kMaxSimSteps, 0) +
                    " (~0.5 KB of memory each): lower -M or -g (the input's microbatches/gen_len when not given)");
}

/// Stage times of the stage JSON: finite, >= 0, <= 1e12 ms; a stage needs prefill_ms and decode_ms.
std::vector<balance::SimStage> read_sim_stages(const json& j, const std::string& path) {
  std::vector<balance::SimStage> st;
  double total = 0;
  for (std::size_t k = 0; k < j["stages"].size(); ++k) {
    const json& s = j["stages"][k];
    const std::string where = "stages[" + std::to_string(k) + "]";
    if (!s.is_object()) throw UserError("input '" + path + "': " + where + " must be an object {\"prefill_ms\", \"decode_ms\", ...}");
    check_keys(s, {"prefill_ms", "decode_ms", "send_prefill_ms", "send_decode_ms"}, path, where);
    for (const char* key : {"prefill_ms", "decode_ms"})
      if (!s.contains(key)) throw UserError("input '" + path + "': " + where + "." + key + " is missing (ms per step; every stage needs prefill_ms and decode_ms)");
    auto ms = [&](const char* key) { return s.contains(key) ? bounded(s[key], where + "." + key, path, kMaxMs, "ms") : 0.0; };
    balance::SimStage x;
    x.prefill_ms = ms("prefill_ms");
    x.decode_ms = ms("decode_ms");
    x.send_prefill_ms = ms("send_prefill_ms");
    x.send_decode_ms = ms("send_decode_ms");
    total += x.decode_ms + x.send_decode_ms;
    st.push_back(x);
  }
  // All-zero decode steps: every token leaves at once, tokens/s would be inf or NaN.
  if (!(total > 0))
    throw UserError("input '" + path + "': every stage has decode_ms = send_decode_ms = 0; at least one decode time must be > 0 "
                    "(a decode step that takes no time gives no meaningful tokens/s)");
  return st;
}

/// `simulate` of a stage JSON (per-stage step and transfer times): prints the prediction and
/// fills `out`. cfg.eager_sends is set; the workload comes from the flags or the JSON.
void simulate_stage_json(const SimulateOptions& opt, balance::SimConfig& cfg, json& out) {
  const json j = read_json(opt.input);
  if (!j.is_object() || !j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
    throw UserError("input '" + opt.input + "': field 'stages' must be a non-empty list of {\"prefill_ms\", \"decode_ms\"[, \"send_prefill_ms\", \"send_decode_ms\"]}");
  check_keys(j, {"stages", "microbatches", "gen_len", "batch", "overlap"}, opt.input, "top level");
  const std::vector<balance::SimStage> st = read_sim_stages(j, opt.input);
  cfg.groups = opt.microbatches > 0 ? opt.microbatches : positive_int(j, "microbatches", opt.input, 1);
  cfg.gen_len = opt.gen_len > 0 ? opt.gen_len : positive_int(j, "gen_len", opt.input, 1);
  cfg.batch = opt.batch > 0 ? opt.batch : positive_int(j, "batch", opt.input, 1);
  const bool overlap = j.contains("overlap") ? field<bool>(j, "overlap", opt.input, "true or false") : true;
  cfg.overlap = !opt.no_overlap && overlap;
  check_sim_size(cfg, st.size());
  const auto r = balance::simulate_pipeline(st, cfg);
  std::printf("simulate: %zu stages, M=%d G=%d B=%d, %s\n", st.size(), cfg.groups, cfg.gen_len, cfg.batch,
              cfg.overlap ? "overlap" : "no overlap");
  const bool one_step = static_cast<long long>(cfg.groups) * cfg.gen_len == 1;
  print_metrics("predicted", r.metrics, one_step);
  out["predicted"] = metrics_json(r.metrics, one_step);
}

/// The record the simulation of a results file plays: `run` with the flags' workload (-M, -g,
/// -b, --no-overlap) and, with --link-bandwidth / --link-latency, that one link on every
/// boundary (its per-pair matrix dropped). Fills `cfg` (M, G, B, overlap) and `link` (the
/// link's description for the header line).
RunRecord simulated_record(const SimulateOptions& opt, const RunRecord& run, balance::SimConfig& cfg, std::string& link) {
  RunRecord sim = run;
  WorkloadInfo& w = sim.workload;
  cfg.groups = w.microbatches = opt.microbatches > 0 ? opt.microbatches : run.workload.microbatches;
  cfg.gen_len = w.gen_len = opt.gen_len > 0 ? opt.gen_len : run.workload.gen_len;
  cfg.batch = w.batch = opt.batch > 0 ? opt.batch : run.workload.batch;
  cfg.overlap = w.overlap = !opt.no_overlap && run.workload.overlap;
  // The link: the run's measured one (as its balancer and its stored simulation used) unless
  // --link-bandwidth / --link-latency override it (0 0 = free transfers).
  const bool run_link = opt.link_bandwidth_GBps < 0 && opt.link_latency_us < 0;
  const double bw_GBps = opt.link_bandwidth_GBps >= 0 ? opt.link_bandwidth_GBps : run.link_bandwidth_Bps / 1e9;
  const double lat_us = opt.link_latency_us >= 0 ? opt.link_latency_us : run.link_latency_s * 1e6;
  if (!run_link) {
    sim.link_latency_s = lat_us * 1e-6;
    sim.link_bandwidth_Bps = bw_GBps * 1e9;
    sim.link_latency_matrix_s.clear();
    sim.link_bandwidth_matrix_Bps.clear();
  }
  // Before anything is printed: the transfer times of a prefill's activations and of the tokens.
  const double hidden = run.model_attrs_num.count("hidden_size") ? run.model_attrs_num.at("hidden_size") : 0.0;
  const int dtype_size = dtype_bytes(balance::workload_dtype(run.workload));
  for (const bool last : {false, true}) {
    const double bytes = boundary_message_bytes(last, cfg.batch, run.workload.prompt_len, hidden, dtype_size);
    const double t = link_transfer_ms(sim.link_latency_s, sim.link_bandwidth_Bps, bytes);
    if (!(t <= kMaxMs)) {
      char msg[256];
      std::snprintf(msg, sizeof(msg), "--link-bandwidth %g GB/s and --link-latency %g us give a transfer of %g ms; "
                    "at most 1e12 ms: raise the bandwidth or lower the latency", bw_GBps, lat_us, t);
      throw UserError(msg);
    }
  }
  link = "free";
  if (bw_GBps > 0 || lat_us > 0) {
    char b[96];
    std::snprintf(b, sizeof b, "%.4g us + bytes / ", lat_us);
    link = b;
    if (bw_GBps > 0) {
      std::snprintf(b, sizeof b, "%.4g GB/s", bw_GBps);
      link += b;
    } else {
      link += "inf";
    }
  }
  if (run_link && run.link_bandwidth_Bps == 0 && run.link_latency_s == 0) link += " (none measured: 1-rank run)";
  else if (run_link && !balance::node_pair_links(run).latency_s.empty()) link = "each boundary's own (the run's, per pair of nodes)";
  else if (run_link) link += " (the run's)";
  return sim;
}

/// One partition `simulate` plays: its name in the output, its split, and the run's record of
/// it (null for a --partition split the run did not measure).
struct SimTarget {
  std::string name;
  balance::Partition split;
  const PartitionRecord* record = nullptr;
};

/// What `simulate FILE.h5` plays: every partition of the run in run order, --partition-name's,
/// or --partition's split (stage k on rank k; named and measured as the run's first partition of
/// the same split, if any, else "manual").
/// @throws ppb::UserError for an unknown name, a malformed split, or a file without partitions
///         and no --partition.
std::vector<SimTarget> simulation_targets(const SimulateOptions& opt, const RunRecord& run) {
  std::vector<SimTarget> out;
  if (!opt.partition.empty()) {
    const int U = static_cast<int>(run.profile.unit_name.size());
    const int R = std::max<int>(1, static_cast<int>(run.ranks.size()));
    const int S = static_cast<int>(std::count(opt.partition.begin(), opt.partition.end(), ',')) + 1;
    if (S > R)
      throw UserError("--partition " + opt.partition + ": " + std::to_string(S) + " stages but " + opt.input + " profiled " +
                      std::to_string(R) + " rank(s); give at most " + std::to_string(R) + " unit counts (stage k runs on rank k)");
    SimTarget t{"manual", balance::parse_manual(opt.partition, U, S), nullptr};
    t.split.device_rank.resize(S);
    for (int k = 0; k < S; ++k) t.split.device_rank[k] = k;
    t.split.tp_width.assign(S, 1);
    t.split.groups = run.workload.microbatches;
    for (const PartitionRecord& pr : run.partitions)
      if (pr.measured && balance::compare_splits(balance::partition_of(pr), t.split) == balance::Sameness::identical) {
        t.name = pr.name;
        t.record = &pr;
        break;
      }
    t.split.solver = t.name;
    out.push_back(std::move(t));
    return out;
  }
  if (run.partitions.empty())
    throw UserError("results file '" + opt.input + "' has no partitions (a `ppbench profile` run?): give a split to "
                    "predict with --partition, e.g. --partition 9,8 (units per stage), or a stage JSON (docs/OFFLINE.md)");
  for (const PartitionRecord& pr : run.partitions)
    if (opt.partition_name.empty() || pr.name == opt.partition_name) out.push_back({pr.name, balance::partition_of(pr), &pr});
  if (out.empty()) {
    std::string list;
    for (const PartitionRecord& pr : run.partitions) list += (list.empty() ? "" : ", ") + pr.name;
    throw UserError("--partition-name '" + opt.partition_name + "' is not in " + opt.input + " (it has: " + list + ")");
  }
  return out;
}

/// The measured metrics of a partition's record (its /benchmark/<name> attributes).
PartitionMetrics measured_metrics(const PartitionRecord& pr, const std::string& input) {
  auto metric = [&](const char* key) {
    const auto it = pr.metrics.find(key);
    if (it == pr.metrics.end()) throw UserError("results file '" + input + "': /benchmark/" + pr.name + " lacks attribute " + key);
    return it->second;
  };
  PartitionMetrics meas;
  meas.tokens_per_s = metric("tokens_per_s");
  meas.decode_tokens_per_s = metric("decode_tokens_per_s");
  meas.ttft_p50_ms = metric("ttft_p50_ms");
  meas.tpot_p50_ms = metric("tpot_p50_ms");
  meas.ttft_p99_ms = metric("ttft_p99_ms");
  meas.tpot_p99_ms = metric("tpot_p99_ms");
  meas.bottleneck_bound_tok_s = metric("bottleneck_bound_tok_s");
  meas.bubble_fraction = pr.bubble_fraction;
  return meas;
}

/// Prints and returns the rows of one target: the prediction from the profile (through the
/// run's own model, balance::Predictor, from the profile as the run solved it: an adaptive
/// split's from the table calibrated by its factors), the cross-calibrated one where stored,
/// the replay of the measured steps and the measurement with the errors (the run's workload only).
json simulate_target(const SimTarget& t, const balance::Predictor& pred, const RunRecord& run, bool same_workload,
                     const std::string& run_workload, const std::string& input) {
  const balance::SimConfig cfg = pred.sim_for(t.split);  // the partition's own M unless -M was given
  const PartitionRecord* pr = t.record;
  const ProfileTable profile =
      pr && !pr->calibration_factor.empty()
          ? balance::calibrated_profile(run.profile, pr->calibration_factor, pred.objective(), cfg.gen_len)
          : run.profile;
  const balance::PhasePrediction phases = pred.predicted_phases(t.split, profile);
  if (!phases.warning.empty()) std::cerr << "ppbench simulate: warning: " << phases.warning << std::endl;
  std::printf("partition %s%s:\n", t.name.c_str(), pr ? "" : (" " + t.split.counts_string() + " (not measured)").c_str());
  const PartitionMetrics predicted = pred.simulate(t.split, phases.phase_ms);
  const bool one_step = static_cast<long long>(cfg.groups) * cfg.gen_len == 1;
  print_metrics("predicted (profile)", predicted, one_step);
  json entry{{"predicted", metrics_json(predicted, one_step)}, {"counts", t.split.counts_string()},
             {"predicted_phase_ms", phases.phase_ms}};
  if (!pr) return entry;
  std::optional<PartitionMetrics> cross;
  if (pr->predicted_phase_cross_ms.size() == phases.phase_ms.size()) {
    cross = pred.simulate(t.split, pr->predicted_phase_cross_ms);
    print_metrics("cross-calibrated", *cross, one_step);
    entry["cross_calibrated"] = metrics_json(*cross, one_step);
    entry["cross_calibrated_by"] = pr->cross_calibrated_by;
  }
  if (!pr->measured || pr->stage_compute_ms.empty()) return entry;
  // The mean steps where the file has them: a rate follows the mean step, not the median.
  const bool means = pr->stage_compute_mean_ms.size() == pr->stage_compute_ms.size();
  const PartitionMetrics replay = pred.simulate(t.split, means ? pr->stage_compute_mean_ms : pr->stage_compute_ms);
  print_metrics(means ? "replayed (mean steps)" : "replayed (median steps)", replay, one_step);
  entry["replayed_steps"] = means ? "mean" : "median";
  const PartitionMetrics meas = measured_metrics(*pr, input);
  const bool run_one_step = static_cast<long long>(run.workload.microbatches) * run.workload.gen_len == 1;
  entry["replayed"] = metrics_json(replay, one_step);
  entry["measured"] = metrics_json(meas, run_one_step);
  if (!same_workload) {
    print_metrics("measured (" + run_workload + ")", meas, run_one_step);
    return entry;
  }
  print_metrics("measured", meas, run_one_step);
  if (one_step) return entry;  // no decode tokens/s to compare
  const double err = predicted.decode_tokens_per_s / meas.decode_tokens_per_s - 1.0;
  std::printf("  decode tokens/s: predicted / measured - 1 = %+.1f%%  (", 100 * err);
  if (cross) {
    const double cross_err = cross->decode_tokens_per_s / meas.decode_tokens_per_s - 1.0;
    std::printf("cross-calibrated by %s: %+.1f%%; ", pr->cross_calibrated_by.c_str(), 100 * cross_err);
    entry["cross_calibrated_decode_tokens_per_s_error"] = cross_err;
  }
  std::printf("replayed: %+.1f%%)\n", 100 * (replay.decode_tokens_per_s / meas.decode_tokens_per_s - 1.0));
  entry["decode_tokens_per_s_error"] = err;
  return entry;
}

/// `simulate` of a results file: per partition (run order, --partition-name, or the --partition
/// split), the prediction computed from the profile by the run's own model, the replay of the
/// measured steps and the measurement, on the run's links unless --link-* override them; prints
/// them and fills `out`.
void simulate_results_file(const SimulateOptions& opt, balance::SimConfig& cfg, json& out) {
  const RunRecord run = read_run(opt.input);
  const WorkloadInfo& wl = run.workload;  // the run's workload
  std::string link;
  const RunRecord sim = simulated_record(opt, run, cfg, link);
  // The run's measurements compare only with a simulation of the run's own workload.
  const bool same_workload = cfg.groups == wl.microbatches && cfg.gen_len == wl.gen_len && cfg.batch == wl.batch &&
                             cfg.overlap == wl.overlap;
  char run_workload[96];
  std::snprintf(run_workload, sizeof(run_workload), "M=%d G=%d B=%d%s", wl.microbatches, wl.gen_len, wl.batch,
                wl.overlap ? "" : " no-overlap");
  if (cfg.batch != wl.batch)
    std::cerr << "ppbench simulate: note: -b " << cfg.batch << " differs from the run's B=" << wl.batch
              << ": the simulation uses the step times profiled and measured at B=" << wl.batch
              << " (the step time of a B=" << cfg.batch << " step is not measured); -b scales only the tokens "
              << "per step and the activation bytes" << std::endl;
  std::vector<SimTarget> targets = simulation_targets(opt, run);
  balance::Predictor pred(sim);
  for (SimTarget& t : targets) {
    if (opt.microbatches > 0) t.split.groups = 0;  // -M for every partition; else each its own (run --plan)
    check_sim_size(pred.sim_for(t.split), static_cast<size_t>(t.split.num_stages()));
  }
  pred.set_eager_sends(cfg.eager_sends);
  std::printf("simulate: %s, M=%d G=%d B=%d, %s, link %s\n", opt.input.c_str(), cfg.groups, cfg.gen_len, cfg.batch,
              cfg.overlap ? "overlap" : "no overlap", link.c_str());
  if (!same_workload)
    std::printf("  (the run measured %s, not the simulated workload: its measured row is labelled with the run's "
                "workload and not compared with the prediction, which holds only for the run's own M, G, B and "
                "overlap)\n", run_workload);
  for (const SimTarget& t : targets)
    out["partitions"][t.name] = simulate_target(
        t, pred, sim, same_workload && (!t.record || pred.sim_for(t.split).groups == t.record->groups), run_workload, opt.input);
  out["link_bandwidth_GBps"] = sim.link_bandwidth_Bps / 1e9;
  out["link_latency_us"] = sim.link_latency_s * 1e6;
  out["run_workload"] = {{"microbatches", wl.microbatches}, {"gen_len", wl.gen_len}, {"batch", wl.batch},
                         {"overlap", wl.overlap}};
}

}  // namespace

/// A serving scenario's file (`run --scenario`): its scenario played again by the serving
/// simulator on each partition, from the profile and cross-calibrated by the other partitions'
/// measured steps (balance::predict_serving), printed against the measurement.
int simulate_scenario_file(const SimulateOptions& opt, RunRecord run) {
  if (opt.microbatches > 0 || opt.batch > 0 || !opt.partition.empty())
    throw UserError(opt.input + " is a serving scenario's file: simulate replays its scenario on its partitions "
                    "as they ran; drop -M, -b and --partition");
  if (opt.no_step_model) {  // as a file without the grid: the profile's two shapes, scaled
    ProfileTable& t = run.profile;
    t.step_rows.clear(), t.step_pos.clear(), t.step_tokens.clear(), t.step_role.clear(), t.step_by_rows.clear();
    t.step_ms.clear();
    for (auto& g : t.tp) g.step_ms.clear();
  }
  const balance::Predictor pred(run);
  std::vector<balance::Partition> parts;
  for (const ServingPartitionRecord& sp : run.serving.partitions)
    for (const PartitionRecord& pr : run.partitions)
      if (pr.name == sp.name) parts.push_back(balance::partition_of(pr));
  const std::string why = balance::predict_serving(run, pred, parts);
  if (!why.empty()) std::cerr << "ppbench simulate: note: not predicted: " << why << std::endl;
  print_serving_summary(std::cout, run);
  json out;
  for (const ServingPartitionRecord& p : run.serving.partitions) {
    json entry{{"name", p.name}, {"cross_calibrated_by", p.cross_calibrated_by}, {"step_level", p.step_level},
               {"simulated_overlap", p.simulated_overlap}};
    ServingPartitionRecord::for_each_prediction(p, [&](const std::string& k, double v) { entry[k] = v; });
    out["partitions"].push_back(entry);
  }
  if (!opt.json_out.empty()) write_json_file(opt.json_out, out);
  return 0;
}

int simulate_command(const SimulateOptions& opt) {
  balance::SimConfig cfg;
  cfg.eager_sends = opt.eager_sends;
  json out;
  const bool results = is_hdf5(opt.input);
  if (!results) {
    // The stage JSON carries the transfer times itself and has no partitions.
    if (opt.link_bandwidth_GBps >= 0 || opt.link_latency_us >= 0)
      throw UserError("--link-bandwidth/--link-latency apply to results files only; a stage JSON gives the transfer "
                      "times itself (stages[].send_prefill_ms, send_decode_ms): drop the flag or edit the JSON");
    if (!opt.partition_name.empty() || !opt.partition.empty())
      throw UserError(std::string(opt.partition.empty() ? "--partition-name" : "--partition") +
                      " applies to results files only; a stage JSON describes one partition: drop it");
  }
  if (!opt.partition_name.empty() && !opt.partition.empty())
    throw UserError("--partition and --partition-name: give one (a split to predict, or a partition of the run)");
  check_json_out(opt.json_out, opt.input, opt.force);
  if (results) {
    RunRecord run = read_run(opt.input);
    if (run.serving.spec) return simulate_scenario_file(opt, std::move(run));
  }
  if (!results) simulate_stage_json(opt, cfg, out);
  else simulate_results_file(opt, cfg, out);
  std::cout.flush();
  out["microbatches"] = cfg.groups;
  out["gen_len"] = cfg.gen_len;
  out["batch"] = cfg.batch;
  out["overlap"] = cfg.overlap;
  if (!opt.json_out.empty()) write_json_file(opt.json_out, out);
  return 0;
}

}  // namespace ppb
