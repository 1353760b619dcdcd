#include "results/reader.h"

#include <hdf5.h>

#include <algorithm>
#include <limits>
#include <set>

#include "common/error.h"
#include "results/conditions.h"
#include "results/h5.h"
#include "results/links_io.h"
#include "results/plan_io.h"
#include "results/serving_io.h"
#include "results/step_model_io.h"
#include "results/writer.h"

namespace ppb {
namespace {

using h5::Group;

/// HDF5 class of attribute `name` of `obj` (H5T_STRING, H5T_INTEGER, H5T_FLOAT, ...).
H5T_class_t attr_class(const h5::Object& obj, const std::string& name) {
  h5::Handle attr(H5Aopen(obj.id(), name.c_str(), H5P_DEFAULT));
  if (!attr.valid()) throw InternalError("cannot open attribute '" + name + "' of " + obj.path());
  h5::Handle type(H5Aget_type(attr.id()));
  if (!type.valid()) throw InternalError("cannot get the type of attribute '" + name + "' of " + obj.path());
  return H5Tget_class(type.id());
}

template <h5::AttrValue T>
T attr_or(const h5::Object& obj, const std::string& name, T fallback) {
  return obj.has_attr(name) ? obj.get_attr<T>(name) : fallback;
}

template <h5::DatasetElement T>
std::vector<T> dataset_or_empty(const Group& g, const std::string& name) {
  return g.exists(name) ? g.open_dataset(name).read<T>() : std::vector<T>{};
}

std::vector<int> to_int(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

/// Partition names in run order: the root attribute when present, else (older files) the
/// `reference` partition first, then the others by name.
std::vector<std::string> partition_names(const Group& root, const std::string& reference) {
  if (root.has_attr("partition_order")) return root.get_attr<std::vector<std::string>>("partition_order");
  std::vector<std::string> names;
  if (root.is_group("partitions")) names = root.open_group("partitions").children();
  std::stable_partition(names.begin(), names.end(), [&](const std::string& n) { return n == reference; });
  return names;
}

/// The attributes write_comparison stored (NaN / 0 where absent: older files).
PairedComparison read_comparison(const h5::Object& obj, const std::string& name) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  PairedComparison c;
  c.ratio = attr_or<double>(obj, name, nan);
  c.ci_low = attr_or<double>(obj, name + "_ci_low", nan);
  c.ci_high = attr_or<double>(obj, name + "_ci_high", nan);
  c.n = attr_or<int>(obj, name + "_n", 0);
  return c;
}

PartitionRecord read_partition(const Group& root, const std::string& name) {
  PartitionRecord p;
  p.name = name;
  Group part = root.open_group("partitions/" + name);
  p.solver = attr_or<std::string>(part, "solver", name);
  p.same_as = attr_or<std::string>(part, "same_as", "");
  p.same_as_reason = attr_or<std::string>(part, "same_as_reason", p.same_as.empty() ? "" : "identical");
  p.solver_split = attr_or<std::string>(part, "solver_split", "");
  p.calibration_factor = dataset_or_empty<double>(part, "calibration_factor");
  if (part.has_attr("calibrated_from")) p.calibrated_from = part.get_attr<std::vector<std::string>>("calibrated_from");
  p.solved_after_round = attr_or<int>(part, "solved_after_round", 0);
  p.first_unit = to_int(part.open_dataset("first_unit").read<int64_t>());
  p.last_unit = to_int(part.open_dataset("last_unit").read<int64_t>());
  p.device_rank = to_int(part.open_dataset("device_rank").read<int64_t>());
  p.tp_width = to_int(dataset_or_empty<int64_t>(part, "tp_width"));
  if (p.tp_width.size() != p.first_unit.size()) p.tp_width.assign(p.first_unit.size(), 1);  // older files
  p.layout = attr_or<std::string>(part, "layout", "1");
  p.groups = attr_or<int>(part, "microbatches", 0);  // 0 in older files: the workload's (read_run)
  p.replicas = attr_or<int>(part, "replicas", 1);
  p.handoff_copies = to_int(dataset_or_empty<int64_t>(part, "handoff_copies"));
  auto pred = part.open_dataset("predicted_stage_ms");
  p.predicted_stage_ms = pred.read<double>();
  p.predicted_bottleneck_ms = attr_or<double>(pred, "bottleneck_ms", 0.0);
  p.predicted_phase_ms = dataset_or_empty<double>(part, "predicted_phase_ms");
  p.predicted_stage_rounds_ms = dataset_or_empty<double>(part, "predicted_stage_rounds_ms");
  p.predicted_phase_rounds_ms = dataset_or_empty<double>(part, "predicted_phase_rounds_ms");
  p.predicted_stage_cross_ms = dataset_or_empty<double>(part, "predicted_stage_cross_ms");
  p.predicted_phase_cross_ms = dataset_or_empty<double>(part, "predicted_phase_cross_ms");
  p.predicted_overlap_cross = dataset_or_empty<double>(part, "predicted_overlap_cross");
  p.cross_level = dataset_or_empty<double>(part, "cross_level");
  p.cross_contention = dataset_or_empty<double>(part, "cross_contention");
  p.cross_fit = to_int(dataset_or_empty<int64_t>(part, "cross_fit"));
  if (part.exists("predicted_stage_cross_ms"))
    p.cross_calibrated_by = attr_or<std::string>(part.open_dataset("predicted_stage_cross_ms"), "calibrated_by", "");
  p.stage_weight_bytes = dataset_or_empty<int64_t>(part, "stage_weight_bytes");
  p.stage_kv_bytes = dataset_or_empty<int64_t>(part, "stage_kv_bytes");
  p.stage_floor_ms = dataset_or_empty<double>(part, "stage_floor_ms");
  p.predicted_stage_min_ms = dataset_or_empty<double>(part, "predicted_stage_min_ms");
  p.predicted_stage_max_ms = dataset_or_empty<double>(part, "predicted_stage_max_ms");
  p.stage_floor_phase_ms = dataset_or_empty<double>(part, "stage_floor_phase_ms");

  const std::string bench_path = "benchmark/" + name;
  // A serving scenario's /benchmark/<name> holds its requests, not closed-batch repetitions
  // (results/serving_io.h reads it).
  p.measured = root.is_group(bench_path) && !root.exists("scenario");
  if (!p.measured) return p;
  Group bench = root.open_group(bench_path);
  p.events = bench.open_dataset("events").read<double>();
  if (bench.exists("replica_events")) p.replica_events = bench.open_dataset("replica_events").read<double>();
  p.stage_compute_ms = dataset_or_empty<double>(bench, "stage_compute_ms");  // none in a group append_results made
  p.stage_workload_ms = dataset_or_empty<double>(bench, "stage_workload_ms");
  p.measured_stage_ms = dataset_or_empty<double>(bench, "measured_stage_ms");
  p.stage_compute_mean_ms = dataset_or_empty<double>(bench, "stage_compute_mean_ms");
  p.stage_overlap = dataset_or_empty<double>(bench, "stage_overlap");
  p.measured_stage_mean_ms = dataset_or_empty<double>(bench, "measured_stage_mean_ms");
  p.bubble_fraction = dataset_or_empty<double>(bench, "bubble_fraction");
  p.recv_wait_ms = dataset_or_empty<double>(bench, "recv_wait_ms");
  p.rep_wall_s = dataset_or_empty<double>(bench, "rep_wall_s");
  p.rep_tokens_per_s = dataset_or_empty<double>(bench, "rep_tokens_per_s");
  p.rep_decode_tokens_per_s = dataset_or_empty<double>(bench, "rep_decode_tokens_per_s");
  for (int64_t r : dataset_or_empty<int64_t>(bench, "rep_round")) p.rep_round.push_back(static_cast<int>(r));
  p.rep_ttft_p50_ms = dataset_or_empty<double>(bench, "rep_ttft_p50_ms");
  p.rep_tpot_p50_ms = dataset_or_empty<double>(bench, "rep_tpot_p50_ms");
  p.gain = read_comparison(bench, "balance_gain");
  p.decode_gain = read_comparison(bench, "decode_balance_gain");
  p.gain_verdict = attr_or<std::string>(bench, "balance_verdict", "");
  p.decode_gain_verdict = attr_or<std::string>(bench, "decode_balance_verdict", "");
  p.lane_cpu_s = dataset_or_empty<double>(bench, "lane_cpu_s");
  p.timed_wall_s = attr_or<double>(bench, "timed_wall_s", 0.0);
  p.bottleneck_stage = attr_or<int>(bench, "bottleneck_stage", 0);
  static const std::set<std::string> not_metrics{"timed_wall_s", "bottleneck_stage", "balance_gain"};
  for (const auto& key : bench.attr_names()) {
    if (not_metrics.count(key) || key.find("balance_gain") != std::string::npos || attr_class(bench, key) != H5T_FLOAT)
      continue;
    p.metrics[key] = bench.get_attr<double>(key);
  }

  const std::string val_path = "validation/" + name;
  if (root.is_group(val_path)) {
    Group val = root.open_group(val_path);
    p.validated = attr_or<bool>(val, "validated", true);
    p.tokens_match = attr_or<bool>(val, "tokens_match", false);
    p.checksum_match = attr_or<bool>(val, "checksum_match", false);
    p.tokens_match_first_partition = attr_or<bool>(val, "tokens_match_first_partition", true);
    p.tokens_differing_first_partition = attr_or<int>(val, "tokens_differing_first_partition", 0);
    p.replica_tokens_differing = attr_or<int>(val, "replica_tokens_differing", 0);
    p.checksum_rel_diff_first_partition = attr_or<double>(val, "checksum_rel_diff_first_partition", 0.0);
    p.checksum = attr_or<double>(val, "checksum", 0.0);
    p.reference_checksum = attr_or<double>(val, "reference_checksum", 0.0);
    p.tokens = dataset_or_empty<int32_t>(val, "tokens");
    p.reference_tokens = dataset_or_empty<int32_t>(val, "reference_tokens");
  }
  return p;
}

/// The root attributes: versions, Slurm, status, the link, the gains and their verdicts.
void read_root_attrs(const Group& root, RunRecord& run) {
  run.ppbench_version = root.get_attr<std::string>("ppbench_version");
  run.created_utc = attr_or<std::string>(root, "created_utc", "");
  run.command_line = attr_or<std::string>(root, "command_line", "");
  run.world_size = root.get_attr<int>("world_size");
  run.backend = attr_or<std::string>(root, "backend", "");
  run.transport = attr_or<std::string>(root, "transport", "");
  run.mpi_version = attr_or<std::string>(root, "mpi_version", "");
  run.hdf5_version = attr_or<std::string>(root, "hdf5_version", "");
  static const std::set<std::string> own_versions{"ppbench_version", "format_version", "mpi_version",
                                                  "hdf5_version"};
  const std::string suffix = "_version";
  for (const auto& key : root.attr_names()) {
    if (own_versions.count(key) || key.size() <= suffix.size() ||
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    run.library_versions[key.substr(0, key.size() - suffix.size())] = root.get_attr<std::string>(key);
  }
  run.slurm_job_id = attr_or<std::string>(root, "slurm_job_id", "");
  run.slurm_job_name = attr_or<std::string>(root, "slurm_job_name", "");
  run.slurm_nodelist = attr_or<std::string>(root, "slurm_nodelist", "");
  run.slurm_array_task_id = attr_or<std::string>(root, "slurm_array_task_id", "");
  run.elapsed_s = attr_or<double>(root, "elapsed_s", 0.0);
  run.status = attr_or<std::string>(root, "status", "complete");
  run.failure = attr_or<std::string>(root, "failure", "");
  run.link_latency_s = attr_or<double>(root, "link_latency_s", 0.0);
  run.link_bandwidth_Bps = attr_or<double>(root, "link_bandwidth_Bps", 0.0);
  run.validation_ok = attr_or<bool>(root, "validation_ok", false);
  // Files before the `validation` attribute: validation_ok alone (1 also with --no-validate).
  run.validation = attr_or<std::string>(root, "validation", run.validation_ok ? "ok" : "failed");
  run.balance_gain = attr_or<double>(root, "balance_gain", 0.0);
  run.decode_balance_gain = attr_or<double>(root, "decode_balance_gain", 0.0);
  run.balance_cmp = read_comparison(root, "balance_gain");
  run.decode_balance_cmp = read_comparison(root, "decode_balance_gain");
  run.balance_verdict = attr_or<std::string>(root, "balance_verdict", "");
  run.decode_balance_verdict = attr_or<std::string>(root, "decode_balance_verdict", "");
  run.schedule = attr_or<std::string>(root, "benchmark_schedule", "");
  run.reference_partition = attr_or<std::string>(root, "reference_partition", kLegacyReferencePartition);
  run.rounds = attr_or<int>(root, "benchmark_rounds", 0);
  run.stop_reason = attr_or<std::string>(root, "benchmark_stop_reason", "");
  run.adaptive_status = attr_or<std::string>(root, "adaptive_status", "");
  run.round_profile_status = attr_or<std::string>(root, "round_profile", "");
  run.round_profile_s = attr_or<double>(root, "round_profile_s", 0.0);
  run.tp_auto_layout = attr_or<std::string>(root, "tp_auto_layout", "");
}

/// /config/model: the config's source and text, and its attributes (strings and numbers).
void read_model(const Group& root, RunRecord& run) {
  Group model = root.open_group("config/model");
  run.model_source = attr_or<std::string>(model, "source", "");
  if (model.exists("config_json")) run.model_config_json = model.open_dataset("config_json").read_string();
  for (const auto& key : model.attr_names()) {
    if (key == "source") continue;
    if (attr_class(model, key) == H5T_STRING)
      run.model_attrs_str[key] = model.get_attr<std::string>(key);
    else
      run.model_attrs_num[key] = model.get_attr<double>(key);
  }
}

/// /moe, where the run had a mixture-of-experts model.
void read_moe(const Group& root, RunRecord& run) {
  if (!root.exists("moe")) return;
  Group moe = root.open_group("moe");
  run.expert_skew = attr_or<double>(moe, "expert_skew", 0.0);
  run.expert_tokens_partition = attr_or<std::string>(moe, "partition", "");
  auto ds = moe.open_dataset("expert_tokens");
  const auto dims = ds.dims();
  if (dims.size() == 2) {
    run.expert_rows = static_cast<int>(dims[0]);
    run.expert_cols = static_cast<int>(dims[1]);
    run.expert_tokens = ds.read<int64_t>();
  }
}

/// /config/workload and /config/environment. Format 1 files kept the profile's warm-up and
/// iterations on /profile/latency_ms only.
void read_workload(const Group& root, RunRecord& run) {
  Group wl = root.open_group("config/workload");
  auto& w = run.workload;
  w.batch = wl.get_attr<int>("batch");
  w.prompt_len = wl.get_attr<int>("prompt_len");
  w.gen_len = wl.get_attr<int>("gen_len");
  w.microbatches = wl.get_attr<int>("microbatches");
  w.dtype = attr_or<std::string>(wl, "dtype", "");
  w.warmup = attr_or<int>(wl, "warmup", 0);
  w.iters = wl.get_attr<int>("iters");
  w.overlap = attr_or<bool>(wl, "overlap", true);
  w.seed = static_cast<uint64_t>(attr_or<int64_t>(wl, "seed", 0));
  w.objective = attr_or<std::string>(wl, "objective", "");
  w.target_ci_pct = attr_or<double>(wl, "target_ci_pct", 0.0);
  w.max_time_s = attr_or<double>(wl, "max_time_s", 0.0);
  w.cuda_graphs = attr_or<bool>(wl, "cuda_graphs", false);  // older files: decode ran eagerly
  // Files before profile_passes: "aligned" with --profile-aligned (a barrier before every timed
  // forward, one pass), else "own pace".
  w.profile_passes = attr_or<std::string>(wl, "profile_passes",
                                          attr_or<bool>(wl, "profile_aligned", false) ? "aligned" : "own pace");
  w.profile_repeats = static_cast<int>(attr_or<int64_t>(wl, "profile_repeats", 1));
  w.profile_order = attr_or<std::string>(wl, "profile_order", "");
  w.expert_skew = attr_or<double>(wl, "expert_skew", 0.0);
  if (root.is_group("config/environment")) {
    Group env = root.open_group("config/environment");
    for (const auto& key : env.attr_names()) run.environment[key] = env.get_attr<std::string>(key);
  }
  const auto lat = root.open_group("profile").open_dataset("latency_ms");
  w.profile_warmup = wl.has_attr("profile_warmup") ? wl.get_attr<int>("profile_warmup") : attr_or<int>(lat, "warmup", 0);
  w.profile_iters = wl.has_attr("profile_iters") ? wl.get_attr<int>("profile_iters") : attr_or<int>(lat, "iters", 0);
}

/// /ranks: one RankInfo per rank, with the defaults of files before each dataset (the links:
/// results/links_io.h).
void read_ranks(const Group& root, RunRecord& run) {
  Group ranks = root.open_group("ranks");
  auto host = ranks.open_dataset("hostname").read_strings();
  auto dev = ranks.exists("device_name") ? ranks.open_dataset("device_name").read_strings()
                                         : std::vector<std::string>(host.size());
  auto bus = ranks.exists("bus_id") ? ranks.open_dataset("bus_id").read_strings() : std::vector<std::string>(host.size());
  auto local = dataset_or_empty<int64_t>(ranks, "local_rank");
  auto offset = dataset_or_empty<double>(ranks, "clock_offset_s");
  auto memory = dataset_or_empty<int64_t>(ranks, "memory_limit_bytes");  // files before it: 0 = unknown
  auto scratch = dataset_or_empty<int64_t>(ranks, "stage_scratch_bytes");  // files before it: 0 = unknown
  auto tp_reserve = dataset_or_empty<int64_t>(ranks, "tp_reserve_bytes");   // files before it: 0
  auto bw = dataset_or_empty<double>(ranks, "read_bandwidth_GBps");  // files before ceilings: NaN
  auto bw_shared = dataset_or_empty<double>(ranks, "read_bandwidth_shared_GBps");
  auto gflops = dataset_or_empty<double>(ranks, "peak_gflops");
  auto quota = dataset_or_empty<double>(ranks, "cpu_quota_cores");  // files before conditions: none
  auto quota_period = dataset_or_empty<double>(ranks, "cpu_quota_period_ms");  // files before it: NaN
  auto threads = dataset_or_empty<int64_t>(ranks, "compute_threads");
  auto affinity = ranks.exists("cpu_affinity") ? ranks.open_dataset("cpu_affinity").read_strings()
                                               : std::vector<std::string>();
  auto governor = ranks.exists("cpu_governor") ? ranks.open_dataset("cpu_governor").read_strings()
                                               : std::vector<std::string>();
  auto quota_cgroup = ranks.exists("cpu_quota_cgroup") ? ranks.open_dataset("cpu_quota_cgroup").read_strings()
                                                       : std::vector<std::string>();  // files before it: ""
  auto quota_cgroup_id = ranks.exists("cpu_quota_cgroup_id") ? ranks.open_dataset("cpu_quota_cgroup_id").read_strings()
                                                             : std::vector<std::string>();
  auto quota_levels = ranks.exists("cpu_quota_levels") ? ranks.open_dataset("cpu_quota_levels").read_strings()
                                                       : std::vector<std::string>();  // files before it: none
  auto machine = ranks.exists("machine_id") ? ranks.open_dataset("machine_id").read_strings()
                                            : std::vector<std::string>();  // files before it: ""
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t r = 0; r < host.size(); ++r) {
    RankInfo info{host[r], r < dev.size() ? dev[r] : "", r < bus.size() ? bus[r] : "",
                  r < local.size() ? static_cast<int>(local[r]) : 0, r < offset.size() ? offset[r] : 0.0,
                  r < memory.size() ? memory[r] : 0, r < scratch.size() ? scratch[r] : 0};
    info.tp_reserve_bytes = r < tp_reserve.size() ? tp_reserve[r] : 0;
    info.read_bandwidth_GBps = r < bw.size() ? bw[r] : nan;
    info.read_bandwidth_shared_GBps = r < bw_shared.size() ? bw_shared[r] : nan;
    info.peak_gflops = r < gflops.size() ? gflops[r] : nan;
    info.cpu_quota_cores = r < quota.size() ? quota[r] : nan;
    info.cpu_quota_period_ms = r < quota_period.size() ? quota_period[r] : nan;
    info.compute_threads = r < threads.size() ? static_cast<int>(threads[r]) : 0;
    info.cpu_affinity = r < affinity.size() ? affinity[r] : "";
    info.cpu_governor = r < governor.size() ? governor[r] : "";
    info.cpu_quota_cgroup = r < quota_cgroup.size() ? quota_cgroup[r] : "";
    info.cpu_quota_cgroup_id = r < quota_cgroup_id.size() ? quota_cgroup_id[r] : "";
    if (r < quota_levels.size()) {
      try {
        info.cpu_quota_levels = parse_quota_levels(quota_levels[r]);
      } catch (const UserError& e) {  // read_results names the file
        throw InternalError("rank " + std::to_string(r) + ": " + e.what());
      }
    }
    info.machine_id = r < machine.size() ? machine[r] : "";
    run.ranks.push_back(info);
  }
}

/// /profile, with /profile/tp's groups.
void read_profile(const Group& root, RunRecord& run) {
  Group prof = root.open_group("profile");
  auto& p = run.profile;
  p.unit_name = prof.open_dataset("unit_name").read_strings();
  p.unit_signature = to_int(prof.open_dataset("unit_signature").read<int64_t>());
  if (prof.exists("signature_name")) p.signature_name = prof.open_dataset("signature_name").read_strings();
  p.unit_params = dataset_or_empty<int64_t>(prof, "unit_params");
  p.unit_weight_bytes = dataset_or_empty<int64_t>(prof, "unit_weight_bytes");
  p.unit_kv_bytes = dataset_or_empty<int64_t>(prof, "unit_kv_bytes");
  auto lat = prof.open_dataset("latency_ms");
  p.latency_ms = lat.read<double>();
  p.latency_min_ms = dataset_or_empty<double>(prof, "latency_min_ms");
  p.latency_max_ms = dataset_or_empty<double>(prof, "latency_max_ms");
  p.latency_alone_ms = dataset_or_empty<double>(prof, "latency_alone_ms");
  p.latency_cycles_ms = dataset_or_empty<double>(prof, "latency_cycles_ms");
  p.latency_alone_cycles_ms = dataset_or_empty<double>(prof, "latency_alone_cycles_ms");
  p.latency_rounds_ms = dataset_or_empty<double>(prof, "latency_rounds_ms");
  p.latency_rounds_after = to_int(dataset_or_empty<int64_t>(prof, "latency_rounds_after"));
  p.decode_contexts = to_int(dataset_or_empty<int64_t>(prof, "decode_contexts"));
  p.decode_context_ms = dataset_or_empty<double>(prof, "decode_context_ms");
  p.cost_ms = dataset_or_empty<double>(prof, "cost_ms");
  p.unit_flops = dataset_or_empty<double>(prof, "unit_flops");
  p.unit_bytes = dataset_or_empty<double>(prof, "unit_bytes");
  p.floor_ms = dataset_or_empty<double>(prof, "floor_ms");
  read_step_model(prof, p);
  if (prof.is_group("tp")) {
    Group tp = prof.open_group("tp");
    const auto first = to_int(tp.open_dataset("first_rank").read<int64_t>());
    const auto width = to_int(tp.open_dataset("width").read<int64_t>());
    const auto lat = tp.open_dataset("latency_ms").read<double>();
    const auto lo = dataset_or_empty<double>(tp, "latency_min_ms");
    const auto hi = dataset_or_empty<double>(tp, "latency_max_ms");
    const auto grid_ms = dataset_or_empty<double>(tp, "step_ms");  // [G][S][N]; older files: none
    const auto attempts = to_int(dataset_or_empty<int64_t>(tp, "step_attempts"));  // [G]; older files: none
    const size_t grid_n = p.step_by_rows.size() * p.step_rows.size();
    const size_t n = 2 * p.unit_name.size();
    for (size_t i = 0; i < first.size() && i < width.size() && (i + 1) * n <= lat.size(); ++i) {
      ProfileTable::TpGroupProfile g;
      g.first_rank = first[i];
      g.width = width[i];
      g.latency_ms.assign(lat.begin() + i * n, lat.begin() + (i + 1) * n);
      if ((i + 1) * n <= lo.size()) g.latency_min_ms.assign(lo.begin() + i * n, lo.begin() + (i + 1) * n);
      if ((i + 1) * n <= hi.size()) g.latency_max_ms.assign(hi.begin() + i * n, hi.begin() + (i + 1) * n);
      if (grid_n > 0 && (i + 1) * grid_n <= grid_ms.size())
        g.step_ms.assign(grid_ms.begin() + i * grid_n, grid_ms.begin() + (i + 1) * grid_n);
      if (i < attempts.size()) g.step_attempts = attempts[i];
      p.tp.push_back(std::move(g));
    }
  }
}

/// The whole file into `run`, section by section (results/README.md's layout).
void read_all(const Group& root, RunRecord& run) {
  read_root_attrs(root, run);
  read_model(root, run);
  read_moe(root, run);
  read_workload(root, run);
  read_ranks(root, run);
  read_links(root, run);
  read_plan(root, run);
  read_serving(root, run);
  read_profile(root, run);
  for (const auto& name : partition_names(root, run.reference_partition)) run.partitions.push_back(read_partition(root, name));
  for (PartitionRecord& p : run.partitions)
    if (p.groups <= 0) p.groups = run.workload.microbatches;
  run.round_gap_s = dataset_or_empty<double>(root, "rounds/gap_s");
}

}  // namespace

RunRecord read_results(const std::string& path) {
  h5::File file = h5::File::open(path);  // UserError: missing, directory, not HDF5
  Group root = file.root();
  if (!root.has_attr("format_version") || !root.has_attr("ppbench_version"))
    throw UserError("'" + path +
                    "' is not a ppbench results file: it is HDF5 but has no root attributes "
                    "format_version and ppbench_version");
  RunRecord run;
  try {
    const int64_t format = root.get_attr<int64_t>("format_version");
    if (format > kResultsFormatVersion)
      throw UserError("'" + path + "' has results format_version " + std::to_string(format) +
                      "; this ppbench reads up to " + std::to_string(kResultsFormatVersion) +
                      ": use a newer ppbench");
    const int64_t complete = root.has_attr("complete") ? root.get_attr<int64_t>("complete") : 0;
    if (complete != 1) {
      // Say how far the run got: the snapshot's status ("running: <phase>" when the run died
      // without a final write, e.g. rank 0 was killed) and the recorded failure, if any.
      std::string how;
      const std::string status = attr_or<std::string>(root, "status", "");
      const std::string failure = attr_or<std::string>(root, "failure", "");
      if (!status.empty()) how += "; last status '" + status + "'";
      if (!failure.empty()) how += "; failure: " + failure;
      if (root.exists("failure/flight_record"))
        how += "; the ranks' flight records are in /failure/flight_record (h5dump -d /failure/flight_record)";
      throw UserError("'" + path +
                      "' is an incomplete ppbench results file (root attribute complete=" +
                      std::to_string(complete) +
                      "): the run failed, crashed or was killed before its final write, or is still running" +
                      how);
    }
    read_all(root, run);
  } catch (const InternalError& e) {
    // A missing group/dataset or a mistyped attribute: the file is not what the layout says.
    throw UserError("'" + path + "' does not have the ppbench results layout: " + e.what());
  }
  return run;
}

}  // namespace ppb
