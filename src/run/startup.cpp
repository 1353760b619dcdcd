#include "run/startup.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "backend/memory_pool.h"
#include "balance/plan.h"
#include "backend/tensor_parallel.h"
#include "balance/layout.h"
#include "common/cgroup.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/format.h"
#include "common/host_conditions.h"
#include "common/version.h"
#include "results/conditions.h"
#include "run/memory_checks.h"
#include "transport/link_probe.h"

namespace ppb::run {

namespace {

std::string utc_now(const char* fmt) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), fmt, &tm);
  return buf;
}

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

/// Default output name: results/ppbench_<model>_<R>r_<UTC or job>.h5, never an existing file.
std::string default_output(const std::string& model_path, int ranks) {
  std::string stem = std::filesystem::path(model_path).stem().string();
  std::string job = env_or("SLURM_JOB_ID");
  std::string base = "results/ppbench_" + stem + "_" + std::to_string(ranks) + "r_" +
                     (job.empty() ? utc_now("%Y%m%dT%H%M%SZ") : "job" + job);
  std::string path = base + ".h5";
  for (int i = 1; std::filesystem::exists(path); ++i) path = base + "_" + std::to_string(i) + ".h5";
  return path;
}

/// Checks on rank 0 that `path` can be written: parent directory exists (created if missing)
/// and accepts a file; an existing file needs --force.
void check_output(const std::string& path, bool force) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (fs::is_directory(p)) throw UserError("output '" + path + "' is a directory; give a file name such as " + (p / "run.h5").string());
  // Only a regular file is ever replaced: as root, `-o /dev/null --force` would otherwise
  // rename an HDF5 file over the device node.
  if (fs::exists(p) && !fs::is_regular_file(p))
    throw UserError("output '" + path + "' exists and is not a regular file (a device, FIFO or socket); give a file name");
  if (fs::exists(p) && !force) throw UserError("output '" + path + "' exists; pass --force to overwrite it");
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string probe = (dir / (".ppbench_write_test_" + std::to_string(getpid()))).string();
  FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) throw UserError("output '" + path + "' cannot be written: directory '" + dir.string() + "' is not writable");
  std::fclose(f);
  std::remove(probe.c_str());
}

/// The model of --model with --mtp and --expert-skew applied; checked against the ranks.
model::ModelSpec load_model(const RunOptions& opt, int ranks) {
  model::ModelSpec spec = model::load_model_config(opt.model_path);
  if (opt.mtp) model::enable_mtp(spec);  // UserError naming --mtp for a model without MTP
  if (opt.expert_skew > 0.0 &&
      std::none_of(spec.layers.begin(), spec.layers.end(), [](const model::LayerShape& l) { return l.is_moe(); }))
    throw UserError("--expert-skew " + std::to_string(opt.expert_skew) + ": " + opt.model_path + " (" + spec.architecture +
                    ") has no mixture-of-experts layer to route; drop --expert-skew");
  spec.expert_skew = opt.expert_skew;
  if (ranks > spec.num_units())
    throw UserError("the run has " + std::to_string(ranks) + " ranks (one stage each) but " + opt.model_path +
                    " has only " + std::to_string(spec.num_units()) + " units (embed + " + std::to_string(spec.n_layers) +
                    " layers + head); use at most " + std::to_string(spec.num_units()) + " ranks");
  return spec;
}

/// --tp: the layouts to measure (balance/layout.h), each with the --partition splits; "1" is one
/// rank per stage (what runs without --tp). Each width must split every layer's heads.
void resolve_layouts(const RunOptions& opt, const model::ModelSpec& spec, int ranks, MeasurePlan& plan) {
  plan.layouts.clear();
  plan.tp_auto = opt.tp_auto;
  for (const std::string& text : opt.layouts) {
    std::vector<int> widths = balance::parse_layout(text, ranks);
    for (int w : widths)
      if (const std::string why = tp_unsupported_reason(spec, w); !why.empty())
        throw UserError("--tp " + text + ": width " + std::to_string(w) + ": " + why);
    if (static_cast<int>(widths.size()) > spec.num_units())
      throw UserError("--tp " + text + ": " + std::to_string(widths.size()) + " stages but " + opt.model_path +
                      " has only " + std::to_string(spec.num_units()) + " units");
    if (std::find(plan.layouts.begin(), plan.layouts.end(), widths) == plan.layouts.end()) plan.layouts.push_back(widths);
  }
  if (plan.layouts.empty() && !plan.tp_auto) plan.layouts.push_back(std::vector<int>(ranks, 1));
  // --plan profiles every width the heads allow, as --tp auto does, for the planner's layouts.
  const bool widths_wanted = plan.tp_auto || opt.plan_points > 0;
  for (int w = 2; widths_wanted && w <= ranks; ++w)
    if (tp_unsupported_reason(spec, w).empty()) plan.auto_widths.push_back(w);
  if (plan.tp_auto && plan.auto_widths.empty() && ranks >= 2)
    throw UserError("--tp auto: no width from 2 to " + std::to_string(ranks) + " splits " + opt.model_path + " (width 2: " +
                    tp_unsupported_reason(spec, 2) + "); drop --tp auto, or use --tp 1");
  const bool pp = plan.tp_auto || std::any_of(plan.layouts.begin(), plan.layouts.end(), [](const std::vector<int>& w) {
                    return std::all_of(w.begin(), w.end(), [](int t) { return t == 1; });
                  });
  if (plan.adaptive && !pp)
    throw UserError("--partition adaptive re-solves the split of one rank per stage; add --tp 1 to the layouts");
}

/// Collective: this rank's share of its device's free memory in bytes (memory_share): each of
/// `pools` divided among the ranks of this machine that draw on it (count_pool_sharers over every
/// rank's pool keys, prefixed with its machine id and exchanged as 64-bit hashes in one
/// MPI_Allgather of kSlots per rank, so that ranks with different pool counts still make the same
/// call). Throws InternalError if a device lists more than kSlots pools.
size_t shared_free_memory(const MpiContext& mpi, const std::vector<MemoryPool>& pools) {
  constexpr size_t kSlots = 4;
  if (pools.size() > kSlots) throw InternalError("a device lists " + std::to_string(pools.size()) + " memory pools");
  std::vector<unsigned long long> mine(kSlots, 0), all(kSlots * mpi.size(), 0);
  for (size_t i = 0; i < pools.size(); ++i)  // 0 marks an empty slot
    mine[i] = std::max<unsigned long long>(1, std::hash<std::string>{}(mpi.machine_id() + "/" + pools[i].key));
  MPI_CHECK(MPI_Allgather(mine.data(), kSlots, MPI_UNSIGNED_LONG_LONG, all.data(), kSlots, MPI_UNSIGNED_LONG_LONG,
                          mpi.comm()));
  std::vector<std::vector<std::string>> keys(mpi.size());
  for (int r = 0; r < mpi.size(); ++r)
    for (size_t i = 0; i < kSlots; ++i)
      if (all[r * kSlots + i] != 0) keys[r].push_back(std::to_string(all[r * kSlots + i]));
  return memory_share(pools, count_pool_sharers(keys[mpi.rank()], keys));  // keys[rank]: pools' order
}

/// Launcher internals (contact URIs, per-process ids) change nothing and may hold addresses.
bool launcher_internal(const std::string& kv) {
  for (const char* p : {"OMPI_MCA_orte_", "OMPI_COMM_WORLD_", "OMPI_FILE_LOCATION", "OMPI_ARGV", "OMPI_MCA_ess_base_",
                        "OMPI_MCA_pmix"})
    if (kv.rfind(p, 0) == 0) return true;
  return false;
}

/// The behaviour-changing environment variables of this process (CUDA, NCCL, MPI, OpenMP,
/// OpenBLAS, Slurm CPU binding, ppbench's own), name -> value.
std::map<std::string, std::string> captured_environment() {
  std::map<std::string, std::string> env;
  for (const char* prefix : {"CUDA_VISIBLE_DEVICES", "NCCL_", "OMPI_", "OMP_", "OPENBLAS_", "SLURM_CPUS", "PPBENCH_"}) {
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (launcher_internal(kv) || kv.rfind(prefix, 0) != 0) continue;
      const auto eq = kv.find('=');
      env[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    }
  }
  return env;
}

/// The model's attributes stored in /config/model (numbers).
std::map<std::string, double> model_numbers(const model::ModelSpec& spec) {
  const auto& l0 = spec.layers.at(0);
  int local_layers = 0;
  for (const auto& l : spec.layers) local_layers += l.sliding_window > 0;
  return {{"hidden_size", spec.hidden},
          {"num_hidden_layers", spec.n_layers},
          {"vocab_size", spec.vocab},
          {"num_attention_heads", l0.n_heads},
          {"num_key_value_heads", l0.n_kv_heads},
          {"head_dim", l0.head_dim},
          {"intermediate_size", l0.intermediate},
          {"tie_word_embeddings", spec.tie_embeddings ? 1.0 : 0.0},
          {"sliding_window_layers", local_layers},
          {"total_params", static_cast<double>(model::total_params(spec))},
          {"active_params", static_cast<double>(model::active_params(spec))},
          {"moe_layers", static_cast<double>(std::count_if(spec.layers.begin(), spec.layers.end(),
                                                           [](const model::LayerShape& l) { return l.is_moe(); }))},
          {"mtp_modules_run", spec.mtp ? spec.mtp_modules : 0},
          {"num_units", spec.num_units()},
          {"num_signatures", static_cast<double>(spec.signatures.size())}};
}

/// The rank pairs whose links a run measures: every pair up to kAllLinksRanks ranks, else each
/// neighbouring pair (k, k + 1) and the token return's (R - 1, 0).
constexpr int kAllLinksRanks = 8;
std::vector<std::pair<int, int>> link_pairs(int ranks) {
  std::vector<std::pair<int, int>> pairs;
  if (ranks <= kAllLinksRanks) {
    for (int a = 0; a < ranks; ++a)
      for (int b = a + 1; b < ranks; ++b) pairs.emplace_back(a, b);
  } else {
    for (int a = 0; a + 1 < ranks; ++a) pairs.emplace_back(a, a + 1);
    pairs.emplace_back(0, ranks - 1);
  }
  return pairs;
}

/// Rank 0: the record's metadata (versions, command line, Slurm, environment, model, workload).
void describe_metadata(RunContext& ctx) {
  RunRecord& run = ctx.record();
  const RunOptions& opt = ctx.opt;
  run.ppbench_version = ppbench_version();
  run.created_utc = utc_now("%Y-%m-%dT%H:%M:%SZ");
  run.command_line = opt.command_line;
  run.backend = ctx.device->backend();
  run.transport = ctx.transport->name();
  run.mpi_version = MpiContext::library_version();
  run.library_versions = ctx.device->library_versions();
  for (const auto& [k, v] : ctx.transport->library_versions()) run.library_versions[k] = v;
  run.world_size = ctx.ranks;
  run.slurm_job_id = env_or("SLURM_JOB_ID");
  run.slurm_job_name = env_or("SLURM_JOB_NAME");
  run.slurm_nodelist = env_or("SLURM_JOB_NODELIST");
  run.slurm_array_task_id = env_or("SLURM_ARRAY_TASK_ID");
  run.environment = captured_environment();
  run.model_source = opt.model_path;
  run.model_config_json = ctx.spec.config_json;
  run.model_attrs_str = {{"architecture", ctx.spec.architecture}, {"model_type", ctx.spec.model_type}};
  run.model_attrs_num = model_numbers(ctx.spec);
  const Workload& w = ctx.workload;
  run.workload = {w.batch, w.prompt_len, w.gen_len, w.groups, dtype_name(w.dtype), opt.warmup, opt.iters,
                  opt.profile_warmup, opt.profile_iters, opt.overlap, w.seed, opt.objective_text,
                  opt.target_ci_pct, opt.max_time_s, opt.cuda_graphs, "own pace",
                  /*profile_repeats=*/1, opt.expert_skew, /*profile_order=*/""};
}

/// Every rank's CPU affinity, cgroup CPU quota, governor and compute threads into /ranks;
/// a node, or a machine of several nodes, with more compute threads than CPUs, or ranks sharing
/// one quota (at any level of their cgroups) that they would run past, is said loudly (its
/// timings measure ranks waiting for a core).
void record_conditions(RunContext& ctx) {
  const MpiContext& mpi = ctx.mpi;
  const std::vector<int> cpus = cpu_affinity();
  const auto affinity = mpi.gather_strings(format_cpu_list(cpus));
  const auto governor = mpi.gather_strings(cpus.empty() ? std::string() : cpu_governor(cpus.front()));
  const std::vector<CpuQuota> quotas = cgroup_cpu_quotas(read_text("/proc/self/cgroup"), "/sys/fs/cgroup");
  const std::optional<CpuQuota> quota = quotas.empty() ? std::nullopt : std::optional<CpuQuota>(quotas.front());
  std::vector<QuotaLevel> my_levels;  // the binding one first, as quotas; each level once
  for (const CpuQuota& q : quotas) {   // (a v1 hierarchy mounted as cpu and as cpu,cpuacct)
    QuotaLevel l{cgroup_identity(q.dir), q.cores, q.dir.string()};
    const auto same = [&](const QuotaLevel& m) { return m.cgroup_id == l.cgroup_id; };
    if (l.cgroup_id.empty() || std::none_of(my_levels.begin(), my_levels.end(), same)) my_levels.push_back(std::move(l));
  }
  const auto quota_levels = mpi.gather_strings(quota_levels_text(my_levels));
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  const auto nums = mpi.gather_doubles({quota ? quota->cores : nan, quota ? quota->period_ms : nan,
                                        static_cast<double>(ctx.device->compute_threads())});
  if (!ctx.root) return;
  RunRecord& run = ctx.record();
  for (int r = 0; r < ctx.ranks; ++r) {
    RankInfo& info = run.ranks[r];
    info.cpu_affinity = affinity[r];
    info.cpu_governor = governor[r];
    info.cpu_quota_cores = nums[3 * r];
    info.cpu_quota_period_ms = nums[3 * r + 1];
    info.cpu_quota_levels = parse_quota_levels(quota_levels[r]);
    if (!info.cpu_quota_levels.empty()) {  // the binding level, also stored on its own
      info.cpu_quota_cgroup = info.cpu_quota_levels.front().cgroup;
      info.cpu_quota_cgroup_id = info.cpu_quota_levels.front().cgroup_id;
    }
    info.compute_threads = static_cast<int>(nums[3 * r + 2]);
  }
  for (int r = 0; r < ctx.ranks; ++r)
    if (const std::string w = quota_period_warning(r, run.ranks[r]); !w.empty()) std::cerr << "ppbench: " << w << std::endl;
  for (const HostLoad& h : host_loads(run.ranks))
    if (h.oversubscribed()) std::cerr << oversubscription_warning(h) << std::endl;
  for (const HostLoad& m : machine_loads(run.ranks))  // nodes that are one machine
    if (m.nodes > 1 && m.oversubscribed()) std::cerr << oversubscription_warning(m) << std::endl;
  for (const SharedQuota& q : shared_quotas(run.ranks)) std::cerr << "ppbench: " << shared_quota_warning(q) << std::endl;
}

/// Device classes (ranks with the same class are identical devices: rank_device_classes),
/// decided on rank 0, which holds every rank's record, and broadcast: every rank tells the same
/// splits apart. With them whether the ranks span several nodes, where each boundary is charged
/// over its own link (balance::node_pair_links) and the stages' order matters.
void share_equivalence(RunContext& ctx, const std::vector<std::string>& hosts) {
  std::vector<int> classes;
  if (ctx.root) {
    classes = balance::rank_device_classes(ctx.record().ranks);
    classes.push_back(std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h != hosts[0]; }));
  }
  ctx.mpi.bcast_ints(classes);
  balance::SplitEquivalence& eq = ctx.cluster.equivalence;
  eq.stage_order_matters = classes.back() != 0;
  classes.pop_back();
  eq.device_class = classes;
  eq.unit_signature.clear();
  for (const auto& unit : ctx.spec.units) eq.unit_signature.push_back(unit.signature);
}

/// A ceiling, or NaN with a warning when measuring it fails (an allocation, say): the phase's
/// collectives must not be left by one rank (that would hang the others), and a run without
/// floors is still a run.
template <typename Fn>
double ceiling_or_nan(const MpiContext& mpi, const char* what, Fn&& measure) {
  try {
    return measure();
  } catch (const std::exception& e) {
    std::cerr << "ppbench: warning: rank " << mpi.rank() << " could not measure its " << what << " (" << e.what()
              << "); its floors are NaN" << std::endl;
    return std::numeric_limits<double>::quiet_NaN();
  }
}

/// Rank 0: the links into the record: the MPI host ping-pong, the transport probe, and the link
/// model the balancer and the simulators charge (RunRecord::link_measured_by): the host
/// ping-pong where the pipeline's messages are MPI messages of host memory (CPU ranks: the
/// files of those runs keep their figures), else the probe's fit through the run's own
/// transport on device buffers (NCCL over NVLink would otherwise be priced at host-MPI speed).
void record_links(RunContext& ctx, const MpiContext::LinkMatrix& host, const std::vector<LinkSweep>& sweeps, double probe_s) {
  RunRecord& run = ctx.record();
  const LinkFitMatrix fit = link_fit_matrix(sweeps, ctx.ranks);
  const bool by_host = ctx.transport->mpi_host_messages();
  run.link_measured_by = by_host ? kLinkByHostPingPong : kLinkByTransportProbe;
  run.link_host_latency_matrix_s = host.latency_s;
  run.link_host_bandwidth_matrix_Bps = host.bandwidth_Bps;
  run.link_probe_latency_matrix_s = fit.latency_s;
  run.link_probe_bandwidth_matrix_Bps = fit.bandwidth_Bps;
  run.link_probe_max_rel_error = fit.max_rel_error;
  run.link_latency_matrix_s = by_host ? host.latency_s : fit.latency_s;
  run.link_bandwidth_matrix_Bps = by_host ? host.bandwidth_Bps : fit.bandwidth_Bps;
  if (ctx.ranks > 1) {
    run.link_latency_s = run.link_latency_matrix_s[1];
    run.link_bandwidth_Bps = run.link_bandwidth_matrix_Bps[1];
  }
  run.link_probe_s = probe_s;
  run.link_sweep.clear();
  for (const LinkSweep& s : sweeps)
    for (const LinkSample& x : s.samples) run.link_sweep.push_back({s.src, s.dst, x});
  if (sweeps.empty() || sweeps.front().samples.empty()) return;
  const LinkSweep& s = sweeps.front();
  // Where the model is the host ping-pong, its own figures for the same pair: the probe's above
  // are through the transport's lanes (their polling and hand-offs), another measurement.
  const std::size_t at = static_cast<std::size_t>(s.src) * static_cast<std::size_t>(ctx.ranks) + static_cast<std::size_t>(s.dst);
  const std::string host_figures =
      at < host.latency_s.size() && at < host.bandwidth_Bps.size()
          ? " (" + format_fixed(1e6 * host.latency_s[at], 1) + " us, " + format_fixed(host.bandwidth_Bps[at] / 1e9, 2) +
                " GB/s), not this probe"
          : "";
  ctx.progress.say("link probe (" + run.transport + " transport, " + run.backend + " buffers): " +
                   std::to_string(sweeps.size()) + " pair(s) in " + format_fixed(probe_s, 2) + " s; ranks " +
                   std::to_string(s.src) + " <-> " + std::to_string(s.dst) + " " + format_fixed(1e6 * s.fit.latency_s, 1) +
                   " us + bytes / " + format_fixed(s.fit.bandwidth_Bps / 1e9, 2) + " GB/s over 8 B.." +
                   format_bytes(s.samples.back().bytes) + " (within " + format_fixed(100 * s.fit.max_rel_error, 0) +
                   "% of every size; " + format_fixed(s.wall_s, 2) + " s); the link model: " +
                   (by_host ? "the MPI host ping-pong" + host_figures : std::string("this probe")));
}

/// This rank's memory limit: --memory-limit, or 90% of its share of the free memory (ranks
/// drawing on the same memory share it: a GPU's by the ranks on that GPU; on CPU the kernel's
/// MemAvailable by every rank of the machine, nodes that are containers or namespaces of one
/// machine included, and a memory cgroup's headroom by the ranks in that cgroup), measured now
/// (issue 35 item 6): after the transport exists and the link probe has connected its links,
/// so that NCCL's communicators and their buffers (NVLS's can take gigabytes) are allocated
/// and what they leave is what the stages get. The tensor-parallel groups' communicators come
/// later: reserve_tp_communicators (run/memory_checks.h) takes them out of the limit.
void set_memory_limit(RunContext& ctx) {
  const size_t share = shared_free_memory(ctx.mpi, ctx.device->memory_pools());
  ctx.cluster.memory_limit = ctx.opt.memory_limit_gib > 0 ? static_cast<size_t>(ctx.opt.memory_limit_gib * (1ull << 30))
                                                           : static_cast<size_t>(0.9 * static_cast<double>(share));
  // What the transport took, as free memory tells it (on CPU ranks MemAvailable also moves with
  // everything else the machine does).
  const double took = static_cast<double>(ctx.cluster.free_share_at_open) - static_cast<double>(share);
  const auto all = ctx.mpi.gather_doubles({took});
  if (!ctx.root || ctx.opt.memory_limit_gib > 0) return;
  const double most = *std::max_element(all.begin(), all.end());
  ctx.progress.say("memory: each rank's limit is 90% of its share of the free memory after the transport was set up (" +
                   (most > 0 ? "up to " + format_bytes(most) + " less than" : std::string("no less than")) +
                   " at device open)");
}

}  // namespace

void start_up(RunContext& ctx) {
  const RunOptions& opt = ctx.opt;
  ctx.phase("start-up", [&] {
    // srun started N tasks, but MPI was not wired to srun's PMI: every task came up as a
    // 1-rank job that would benchmark alone and race the others for the same output file.
    if (ctx.ranks == 1 && std::atoi(env_or("SLURM_STEP_NUM_TASKS").c_str()) > 1 && env_or("OMPI_COMM_WORLD_SIZE").empty())
      throw UserError("srun started " + env_or("SLURM_STEP_NUM_TASKS") +
                      " tasks but MPI sees 1 rank: the MPI library is not wired to srun's process manager; "
                      "use srun --mpi=pmix (see `srun --mpi=list` for what this cluster offers) or mpirun");
    MeasurePlan& plan = ctx.plan;
    plan.methods = opt.partition.methods;
    plan.adaptive = opt.partition.adaptive;  // solved during the benchmark, not now
    plan.plan_points = opt.plan_points;
    if (plan.plan_points > 0) {  // the reference: uniform at the default layout; the rest from the planner
      plan.methods = {balance::Method::uniform};
      plan.adaptive = false;
      plan.plan_replicas = balance::parse_replicas(opt.plan_replicas, ctx.ranks, "the ranks");
    }
    // One rank has one split (all units): benchmarking it twice would only measure noise.
    if (ctx.ranks == 1) {
      plan.methods.resize(1);
      plan.adaptive = false;
    }
    ctx.spec = load_model(opt, ctx.ranks);
    resolve_layouts(opt, ctx.spec, ctx.ranks, plan);
    if (plan.methods[0] == balance::Method::manual)
      for (const auto& widths : plan.layouts) {
        try {
          balance::parse_manual(opt.partition.manual, ctx.spec.num_units(), static_cast<int>(widths.size()));
        } catch (const UserError& e) {
          throw UserError(std::string(e.what()) +
                          (widths.size() == static_cast<size_t>(ctx.ranks) ? "" : " (for --tp " + balance::layout_label(widths) + ")"));
        }
      }
    Workload& w = ctx.workload;
    w.batch = opt.batch;
    w.prompt_len = opt.prompt_len;
    w.gen_len = opt.gen_len;
    w.groups = opt.microbatches > 0 ? opt.microbatches : ctx.ranks;
    w.seed = opt.seed;
    if (opt.dtype) w.dtype = *opt.dtype;
    if (opt.device != "auto") ctx.backend = &find_backend(opt.device);  // UserError for a backend not built
    if (ctx.root) {
      ctx.output = opt.output.empty() ? default_output(opt.model_path, ctx.ranks) : opt.output;
      check_output(ctx.output, opt.force);
    }
  });
  ctx.mpi.bcast_string(ctx.output);
}

void open_device(RunContext& ctx) {
  const RunOptions& opt = ctx.opt;
  // auto = the first backend (most capable first) every rank can use, agreed collectively so
  // that no rank is left behind.
  if (!ctx.backend) {
    for (const BackendReg& b : backend_registry())
      if (ctx.mpi.agree(b.visible_devices() > 0 ? 0 : 1) == 0) {
        ctx.backend = &b;
        break;
      }
  }
  ctx.phase("device", [&] {
    if (!ctx.backend) throw UserError("no backend of this build can run on every rank (--device)");
    ctx.device = ctx.backend->make_device(ctx.mpi.local_rank());
    if (!opt.dtype) ctx.workload.dtype = ctx.backend->default_dtype;
    const std::vector<DType>& ok = ctx.backend->dtypes;
    if (std::find(ok.begin(), ok.end(), ctx.workload.dtype) == ok.end()) {
      std::string names;
      for (DType t : ok) names += (names.empty() ? "" : ", ") + dtype_name(t);
      throw UserError("--dtype " + dtype_name(ctx.workload.dtype) + ": the " + ctx.backend->name + " backend computes in " +
                      names + "; use --dtype " + dtype_name(ok.front()) + " (or auto)");
    }
  });
  if (ctx.backend->agree_on_libraries) ctx.backend->agree_on_libraries(ctx.mpi);
  // The memory limit is taken later, once the transport's communicators exist (describe_run);
  // the share now is kept to say what they took.
  ctx.cluster.free_share_at_open = shared_free_memory(ctx.mpi, ctx.device->memory_pools());
}

void open_transport(RunContext& ctx) {
  ctx.phase("transport", [&] {
    MpiPollConfig poll;
    poll.timeout_s = ctx.opt.timeout_s;
    const TransportRequest request = ctx.opt.transport == TransportChoice::nccl  ? TransportRequest::nccl
                                     : ctx.opt.transport == TransportChoice::mpi ? TransportRequest::mpi
                                                                                 : TransportRequest::automatic;
    std::string note;
    ctx.transport = ctx.backend->make_transport(ctx.mpi, *ctx.device, request, poll, note);
    if (ctx.root && !note.empty()) std::cerr << "ppbench: " << note << std::endl;
  });
}

void describe_run(RunContext& ctx) {
  const MpiContext& mpi = ctx.mpi;
  if (ctx.root) describe_metadata(ctx);
  ctx.cluster.clock_offsets_s = mpi.clock_offsets();
  // Every pair's link where the ranks are few, else each neighbouring pair and the token
  // return's. On one node the balancer and the simulator use one link, ranks 0 <-> 1's; on
  // several, each boundary's (balance::node_pair_links).
  const MpiContext::LinkMatrix links = mpi.link_matrix(link_pairs(ctx.ranks));
  std::vector<LinkSweep> sweeps;
  const double probe_t0 = monotonic_s();
  ctx.phase("link probe", [&] { sweeps = probe_links(mpi, *ctx.device, *ctx.transport, link_pairs(ctx.ranks)); });
  const double probe_s = monotonic_s() - probe_t0;
  const auto hosts = mpi.gather_strings(mpi.hostname());
  const auto names = mpi.gather_strings(ctx.device->name());
  const auto buses = mpi.gather_strings(ctx.device->bus_id());
  const auto local = mpi.gatherv_ints({mpi.local_rank()});
  if (ctx.root) {
    RunRecord& run = ctx.record();
    record_links(ctx, links, sweeps, probe_s);
    for (int r = 0; r < ctx.ranks; ++r) {
      run.ranks.push_back({hosts[r], names[r], buses[r], local[r][0], ctx.cluster.clock_offsets_s[r]});
      run.ranks.back().machine_id = mpi.machine_ids()[r];  // gathered at start-up
    }
  }
  record_conditions(ctx);
  share_equivalence(ctx, hosts);
  set_memory_limit(ctx);
  share_memory_limits(ctx);
  // The scratch of a stage of every unit bounds any stage's scratch (the balancer keeps it free).
  const auto scratch =
      mpi.gather_doubles({static_cast<double>(stage_bytes(ctx, 0, ctx.spec.num_units() - 1, ctx.workload.groups).scratch)});
  if (!ctx.root) return;
  RunRecord& run = ctx.record();
  for (int r = 0; r < ctx.ranks; ++r) {
    run.ranks[r].memory_limit_bytes = static_cast<int64_t>(ctx.cluster.memory_limits[r]);
    run.ranks[r].stage_scratch_bytes = static_cast<int64_t>(scratch[r]);
  }
  const Workload& w = ctx.workload;
  std::ostringstream os;
  os << "model " << ctx.opt.model_path << ": " << ctx.spec.architecture << ", " << ctx.spec.n_layers << " layers, "
     << ctx.spec.num_units() << " units, " << format_fixed(model::total_params(ctx.spec) / 1e9, 2) << " B params; "
     << ctx.ranks << " ranks (" << run.backend << ", " << run.transport << "), B=" << w.batch << " P=" << w.prompt_len
     << " G=" << w.gen_len << (ctx.opt.scenario.on() ? " (the scenario's mean prompt and output)" : "")
     << " M=" << w.groups << (ctx.opt.overlap ? ", overlap" : ", no overlap") << "; output "
     << ctx.output;
  ctx.progress.say(os.str());
}

void measure_ceilings(RunContext& ctx) {
  const MpiContext& mpi = ctx.mpi;
  std::vector<double> mine(3, std::numeric_limits<double>::quiet_NaN());
  ctx.phase("ceilings", [&] {
    ctx.progress.say("ceilings: read bandwidth and GEMM rate of each rank, alone, then all at once");
    const int turns = mpi.agree(mpi.machine_size());
    for (int turn = 0; turn < turns; ++turn) {
      mpi.quiet_barrier();
      if (mpi.machine_rank() == turn) {
        mine[0] = ceiling_or_nan(mpi, "read bandwidth", [&] { return ctx.device->measure_read_bandwidth_GBps(); });
        mine[2] = ceiling_or_nan(mpi, "GEMM rate", [&] { return ctx.device->measure_gemm_gflops(ctx.workload.dtype); });
      }
    }
    mpi.quiet_barrier();
    mine[1] = ceiling_or_nan(mpi, "shared read bandwidth", [&] { return ctx.device->measure_read_bandwidth_GBps(); });
  });
  const auto all = mpi.gather_doubles(mine);
  if (!ctx.root) return;
  std::ostringstream os;
  os << "ceilings (read GB/s alone / all at once, GEMM GFLOP/s):";
  for (int r = 0; r < ctx.ranks; ++r) {
    RankInfo& info = ctx.record().ranks[r];
    info.read_bandwidth_GBps = all[3 * r];
    info.read_bandwidth_shared_GBps = all[3 * r + 1];
    info.peak_gflops = all[3 * r + 2];
    os << (r ? "; " : " ") << "rank " << r << " " << format_fixed(info.read_bandwidth_GBps, 1) << " / "
       << format_fixed(info.read_bandwidth_shared_GBps, 1) << ", " << format_fixed(info.peak_gflops, 1);
  }
  ctx.progress.say(os.str());
}

}  // namespace ppb::run
