#include "app/run_job.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>

#include "backend/cpu/cpu_stage.h"
#include "backend/device.h"
#include "balance/memory_report.h"
#include "balance/partition.h"
#include "balance/problem.h"
#include "balance/simulator.h"
#include "balance/solver.h"
#include "common/check.h"
#include "common/error.h"
#include "common/format.h"
#include "common/watchdog.h"
#include "model/model_spec.h"
#include "pipeline/metrics.h"
#include "pipeline/pipeline.h"
#include "profile/profiler.h"
#include "results/run_record.h"
#include "results/summary.h"
#include "results/writer.h"
#include "mpi/mpi_context.h"
#include "transport/transport.h"

#if PPBENCH_HAVE_CUDA
#include "backend/cuda/cuda_device.h"
#include "transport/nccl/nccl_transport.h"
#endif

namespace ppb {
namespace {

/// A phase failed on some rank; every rank leaves run_job with `status`.
struct PhaseFailed {
  int status;
};

/// What a rank does when a phase fails with an internal error (a timeout, a dead peer, a
/// failing library call): other ranks may be blocked in a transfer or a collective that will
/// never complete, so there is no agreeing. Rank 0 records the failure in the results file
/// (which keeps the phases already done, complete=0); the others give rank 0 a moment to do
/// so. Then MPI_Abort ends the whole job with a non-zero status.
struct FailurePolicy {
  std::function<void(const std::string&)> record;  ///< rank 0: write the failure to the file
};

[[noreturn]] void abort_job(const MpiContext& mpi, const FailurePolicy& policy, const std::string& phase,
                            const std::string& message) {
  request_lane_abort(message);
  std::cerr << "ppbench: error in " << phase << " (" << error_context() << "): " << message << std::endl;
  if (mpi.is_root()) {
    try {
      if (policy.record) policy.record("failed in " + phase + ": " + message);
    } catch (const std::exception& e) {
      std::cerr << "ppbench: could not record the failure in the results file: " << e.what() << std::endl;
    }
  } else {
    timespec ts{2, 0};  // let rank 0 record the failure first
    nanosleep(&ts, nullptr);
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

/// Runs `fn` on every rank. A user error (bad input: the same on every rank, or local to a
/// rank but raised before any collective of the phase) is agreed on: rank 0 prints each distinct
/// message with the ranks that raised it and every rank throws PhaseFailed(2). Any other error
/// aborts the job (abort_job). Never leaves a rank behind in a collective.
template <typename Fn>
void run_phase(const MpiContext& mpi, Watchdog& watchdog, const FailurePolicy& policy, const std::string& phase,
               Fn&& fn) {
  watchdog.set_phase(phase);
  int status = 0;
  std::string message;
  try {
    fn();
  } catch (const UserError& e) {
    status = 2;
    message = e.what();
  } catch (const std::exception& e) {
    abort_job(mpi, policy, phase, e.what());
  }
  int global = mpi.agree(status);
  if (global == 0) return;
  auto messages = mpi.gather_strings(message);
  if (mpi.is_root()) {
    std::vector<std::pair<std::string, std::vector<int>>> distinct;
    for (int r = 0; r < mpi.size(); ++r) {
      if (messages[r].empty()) continue;
      auto it = std::find_if(distinct.begin(), distinct.end(), [&](auto& d) { return d.first == messages[r]; });
      if (it == distinct.end()) distinct.push_back({messages[r], {r}});
      else it->second.push_back(r);
    }
    for (auto& [msg, ranks] : distinct) {
      std::ostringstream who;
      if (static_cast<int>(ranks.size()) == mpi.size()) who << "all ranks";
      else {
        who << "rank" << (ranks.size() > 1 ? "s " : " ");
        for (size_t i = 0; i < ranks.size(); ++i) who << (i ? "," : "") << ranks[i];
      }
      std::cerr << "ppbench: error in " << phase << " (" << who.str() << "): " << msg << std::endl;
    }
    if (policy.record) {
      try {
        policy.record("failed in " + phase + ": " + (distinct.empty() ? std::string("?") : distinct[0].first));
      } catch (const std::exception&) {
      }
    }
  }
  throw PhaseFailed{global};
}

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

void check_range(const char* flag, long long value, long long lo, long long hi) {
  if (value < lo || value > hi) {
    std::ostringstream os;
    os << flag << " must be in [" << lo << ", " << hi << "], got " << value;
    throw UserError(os.str());
  }
}

void validate_options(const RunOptions& o) {
  check_range("--batch", o.batch, 1, 4096);
  check_range("--prompt-len", o.prompt_len, 1, 1 << 20);
  check_range("--gen-len", o.gen_len, 1, 1 << 20);
  check_range("--microbatches", o.microbatches, 0, 4096);
  check_range("--warmup", o.warmup, 0, 1000);
  check_range("--iters", o.iters, 1, 100000);
  check_range("--profile-warmup", o.profile_warmup, 0, 1000);
  check_range("--profile-iters", o.profile_iters, 1, 100000);
  check_range("--profile-contexts", o.profile_contexts, 1, 64);
  // A bounded timeout: inf would disable the transfer timeouts and the watchdog alike.
  if (!(o.timeout_s > 0) || !(o.timeout_s <= 604800))
    throw UserError("--timeout must be > 0 and <= 604800 seconds (a week)");
  if (!(o.memory_limit_gib >= 0) || !(o.memory_limit_gib <= 1048576))
    throw UserError("--memory-limit must be >= 0 and <= 1048576 GiB (2^50 bytes); 0 = 90% of the device's free memory per rank");
  if (o.order != "rank" && o.order != "auto")
    throw UserError("--order '" + o.order + "' is unknown; valid: rank (stage k on rank k), auto (search the device order)");
  balance::parse_objective(o.objective);  // UserError naming --objective
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    throw UserError("--device '" + o.device + "' is unknown; valid: auto, cpu, cuda");
  if (o.transport != "auto" && o.transport != "mpi" && o.transport != "nccl")
    throw UserError("--transport '" + o.transport + "' is unknown; valid: auto, mpi, nccl");
}

/// Partition names requested by --partition: named solvers, or one manual split.
std::vector<std::string> requested_partitions(const std::string& p) {
  if (p == "both") return {"uniform", "balanced"};
  if (p == "all") return {"uniform", "seed", "balanced"};
  if (p == "uniform" || p == "seed" || p == "balanced") return {p};
  if (!p.empty() && p.find_first_of("0123456789") != std::string::npos) return {"manual"};
  throw UserError("--partition '" + p +
                  "' is unknown; valid: uniform, seed, balanced, both (uniform+balanced), all, or a "
                  "manual split of unit counts per stage such as 5,6,5,6");
}

/// Default output name: results/ppbench_<model>_<S>r_<UTC>.h5, never an existing file.
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

/// Stage bytes (weights, KV cache) of units [first, last] for the workload.
std::pair<int64_t, int64_t> stage_bytes(const model::ModelSpec& m, int first, int last, int sequences, int context,
                                        int dtype_b) {
  int64_t w = 0, kv = 0;
  for (int u = first; u <= last; ++u) {
    w += model::unit_resident_params(m, u) * dtype_b;
    // What the stages allocate: a full-context cache per layer, sliding window or not (a ring
    // buffer of `window` positions would need less; model::kv_cache_bytes gives that minimum).
    kv += model::kv_bytes_per_token(m, u, dtype_b) * sequences * context;
  }
  return {w, kv};
}

std::string gib(double bytes) {
  std::ostringstream os;
  os.precision(5);  // enough to tell a need from a limit just below it
  os << bytes / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return os.str();
}

/// True when this binary has the CUDA backend.
bool have_cuda_backend() {
#if PPBENCH_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

/// GPUs this process sees (0 without the CUDA backend).
int visible_gpus() {
#if PPBENCH_HAVE_CUDA
  return cuda_visible_device_count();
#else
  return 0;
#endif
}

/// Collective: how many ranks have the same `key` (host + device bus id) as this one.
int ranks_sharing(const MpiContext& mpi, const std::string& key) {
  unsigned long long mine = std::hash<std::string>{}(key);
  std::vector<unsigned long long> all(mpi.size());
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, mpi.comm()));
  return static_cast<int>(std::count(all.begin(), all.end(), mine));
}

class Progress {
 public:
  Progress(bool enabled) : enabled_(enabled) {}
  void say(const std::string& s) const {
    if (enabled_) std::cout << "[ppbench " << stamp() << "] " << s << std::endl;
  }
  std::string stamp() const {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%7.1fs", monotonic_s() - t0_);
    return buf;
  }

 private:
  bool enabled_;
  double t0_ = monotonic_s();
};

}  // namespace

int run_job(const MpiContext& mpi, const RunOptions& opt) {
  const int S = mpi.size();
  const bool root = mpi.is_root();
  Progress progress(root && !opt.quiet);
  RunRecord run;
  run.run_start_s = monotonic_s();
  model::ModelSpec spec;
  std::unique_ptr<Device> device;
  std::unique_ptr<Transport> transport;
  std::vector<std::string> partition_names;
  std::string output;
  DType dtype = DType::f32;
  int M = 0;
  size_t memory_limit = 0;

  // Rank 0 keeps the results file up to date phase by phase (complete=0 until the end), and
  // records a failure in it before the job is aborted.
  FailurePolicy policy;
  policy.record = [&](const std::string& why) {
    if (!root || output.empty() || run.world_size == 0) return;
    run.status = "failed";
    run.failure = why;
    run.elapsed_s = monotonic_s() - run.run_start_s;
    write_results(output, run, /*complete=*/false);
    if (run.profile.latency_ms.empty())
      std::cerr << "ppbench: the failure is recorded in " << output << " (complete=0, status=failed; nothing measured yet)" << std::endl;
    else
      std::cerr << "ppbench: what was measured before the failure is in " << output << " (complete=0)" << std::endl;
  };
  auto snapshot = [&](const std::string& next_phase) {
    if (!root) return;
    run.status = "running: " + next_phase;
    run.elapsed_s = monotonic_s() - run.run_start_s;
    write_results(output, run, /*complete=*/false);
  };
  // The transfers time out first (--timeout, with the peer and tag in the message); the
  // watchdog catches what they cannot see, e.g. a rank stuck in a collective.
  Watchdog watchdog(opt.timeout_s + 15.0, [&](const std::string& phase, double idle) {
    std::ostringstream os;
    os << "no progress for " << static_cast<int>(idle) << " s (--timeout " << opt.timeout_s
       << " s + 15 s): a rank is dead or stuck";
    if (transport) {
      std::string async = transport->async_error();
      if (!async.empty()) os << "; " << async;
      transport->abort();  // e.g. ncclCommAbort: release streams blocked on a dead peer
    }
    abort_job(mpi, policy, phase, os.str());
  });
  watchdog.catch_termination([&](const std::string& phase, int sig) {
    // Another rank died (mpirun/srun then terminate the job) or the job was cancelled.
    const std::string why = "terminated by signal " + std::to_string(sig) + " during " + phase +
                            " (another rank died, or the job was cancelled)";
    std::cerr << "ppbench: " << error_context() << ": " << why << std::endl;
    try {
      if (policy.record) policy.record(why);
    } catch (const std::exception&) {
    }
  });

  try {
    // ---- 1. options, model, output: every rank checks the same things ----------------------
    run_phase(mpi, watchdog, policy, "start-up", [&] {
      validate_options(opt);
      // srun started N tasks, but MPI was not wired to srun's PMI: every task came up as a
      // 1-rank job that would benchmark alone and race the others for the same output file.
      if (S == 1 && std::atoi(env_or("SLURM_STEP_NUM_TASKS").c_str()) > 1 && env_or("OMPI_COMM_WORLD_SIZE").empty())
        throw UserError("srun started " + env_or("SLURM_STEP_NUM_TASKS") +
                        " tasks but MPI sees 1 rank: the MPI library is not wired to srun's process manager; "
                        "use srun --mpi=pmix (see `srun --mpi=list` for what this cluster offers) or mpirun");
      partition_names = requested_partitions(opt.partition);
      // One rank has one split (all units): benchmarking it twice would only measure noise.
      if (S == 1) partition_names.resize(1);
      spec = model::load_model_config(opt.model_path);
      if (S > spec.num_units())
        throw UserError("the run has " + std::to_string(S) + " ranks (one stage each) but " + opt.model_path +
                        " has only " + std::to_string(spec.num_units()) + " units (embed + " +
                        std::to_string(spec.n_layers) + " layers + head); use at most " +
                        std::to_string(spec.num_units()) + " ranks");
      if (partition_names[0] == "manual") balance::parse_manual(opt.partition, spec.num_units(), S);
      M = opt.microbatches > 0 ? opt.microbatches : S;
      if (opt.device == "cuda" && !have_cuda_backend())
        throw UserError("--device cuda: this build of ppbench has no CUDA backend (nvcc was not found at build time); use --device cpu");
      if (opt.transport == "nccl" && opt.device == "cpu")
        throw UserError("--transport nccl needs --device cuda; CPU ranks use --transport mpi");
      if (opt.dtype != "auto") dtype = parse_dtype(opt.dtype);
      if (root) {
        output = opt.output.empty() ? default_output(opt.model_path, S) : opt.output;
        check_output(output, opt.force);
      }
    });
    mpi.bcast_string(output);

    // ---- device and transport --------------------------------------------------------------
    // auto = CUDA when every rank sees a GPU (agreed collectively, so no rank is left behind).
    const bool use_cuda = opt.device == "cuda" || (opt.device == "auto" && mpi.agree(visible_gpus() > 0 ? 0 : 1) == 0);
    run_phase(mpi, watchdog, policy, "device", [&] {
      if (use_cuda) {
#if PPBENCH_HAVE_CUDA
        device = create_cuda_device(mpi.local_rank());
        if (opt.dtype == "auto") dtype = DType::bf16;
#endif
      } else {
        device = create_cpu_device(0);
        if (dtype != DType::f32)
          throw UserError("--dtype " + opt.dtype + ": the CPU backend computes in f32; use --dtype f32 (or auto)");
      }
    });
    {
      // Ranks sharing a device share its free memory (CPU: the node's; GPU: the GPU's).
      const int sharing = ranks_sharing(mpi, mpi.hostname() + "/" + device->bus_id());
      memory_limit = opt.memory_limit_gib > 0 ? static_cast<size_t>(opt.memory_limit_gib * (1ull << 30))
                                              : static_cast<size_t>(0.9 * device->free_memory() / sharing);
    }
    run_phase(mpi, watchdog, policy, "transport", [&] {
      if (!use_cuda && opt.transport == "nccl")
        throw UserError("--transport nccl needs GPUs (the CUDA backend on every rank); CPU ranks use --transport mpi");
      MpiPollConfig poll;
      poll.timeout_s = opt.timeout_s;
#if PPBENCH_HAVE_CUDA
      if (use_cuda) {
        poll.max_sleep_us = 50.0;  // GPU decode steps are milliseconds: poll tighter
        const bool own = every_rank_has_own_gpu(mpi, device->bus_id());
        if (opt.transport == "nccl" && !own)
          throw UserError("--transport nccl: some ranks share a GPU and NCCL refuses that; use --transport mpi or auto");
        if (opt.transport == "nccl" || (opt.transport == "auto" && own)) {
          transport = create_nccl_transport(mpi, *device, poll);
        } else {
          if (root && opt.transport == "auto")
            std::cerr << "ppbench: ranks share a GPU: NCCL refuses that, so the transport falls back to MPI with "
                         "pinned host staging" << std::endl;
          transport = create_staged_mpi_transport(mpi, poll);
        }
        return;
      }
#endif
      transport = create_mpi_transport(mpi, poll);
    });

    // ---- run metadata ---------------------------------------------------------------------
    run.ppbench_version = PPBENCH_VERSION_STRING;
    run.created_utc = utc_now("%Y-%m-%dT%H:%M:%SZ");
    run.command_line = opt.command_line;
    run.backend = device->backend();
    run.transport = transport->name();
    run.mpi_version = MpiContext::library_version();
    run.library_versions = device->library_versions();
    for (const auto& [k, v] : transport->library_versions()) run.library_versions[k] = v;
    run.world_size = S;
    run.slurm_job_id = env_or("SLURM_JOB_ID");
    run.slurm_job_name = env_or("SLURM_JOB_NAME");
    run.slurm_nodelist = env_or("SLURM_JOB_NODELIST");
    run.slurm_array_task_id = env_or("SLURM_ARRAY_TASK_ID");
    for (const char* prefix : {"CUDA_VISIBLE_DEVICES", "NCCL_", "OMPI_", "OMP_", "OPENBLAS_", "SLURM_CPUS", "PPBENCH_"}) {
      for (char** e = environ; *e; ++e) {
        std::string kv = *e;
        // Launcher internals (contact URIs, per-process ids) change nothing and may hold addresses.
        if (kv.rfind("OMPI_MCA_orte_", 0) == 0 || kv.rfind("OMPI_COMM_WORLD_", 0) == 0 ||
            kv.rfind("OMPI_FILE_LOCATION", 0) == 0 || kv.rfind("OMPI_ARGV", 0) == 0 ||
            kv.rfind("OMPI_MCA_ess_base_", 0) == 0 || kv.rfind("OMPI_MCA_pmix", 0) == 0)
          continue;
        if (kv.rfind(prefix, 0) == 0) {
          auto eq = kv.find('=');
          run.environment[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
        }
      }
    }
    run.model_source = opt.model_path;
    run.model_config_json = spec.config_json;
    run.model_attrs_str = {{"architecture", spec.architecture}, {"model_type", spec.model_type}};
    {
      const auto& l0 = spec.layers.at(0);
      int local_layers = 0;
      for (const auto& l : spec.layers) local_layers += l.sliding_window > 0;
      run.model_attrs_num = {{"hidden_size", spec.hidden},
                             {"num_hidden_layers", spec.n_layers},
                             {"vocab_size", spec.vocab},
                             {"num_attention_heads", l0.n_heads},
                             {"num_key_value_heads", l0.n_kv_heads},
                             {"head_dim", l0.head_dim},
                             {"intermediate_size", l0.intermediate},
                             {"tie_word_embeddings", spec.tie_embeddings ? 1.0 : 0.0},
                             {"sliding_window_layers", local_layers},
                             {"total_params", static_cast<double>(model::total_params(spec))},
                             {"num_units", spec.num_units()},
                             {"num_signatures", static_cast<double>(spec.signatures.size())}};
    }
    run.workload = {opt.batch, opt.prompt_len, opt.gen_len, M, dtype_name(dtype), opt.warmup, opt.iters,
                    opt.profile_warmup, opt.profile_iters, !opt.no_overlap, opt.seed, opt.objective};

    auto offsets = mpi.clock_offsets();
    const auto [link_latency_s, link_bandwidth] = mpi.link_model();
    run.link_latency_s = link_latency_s;
    run.link_bandwidth_Bps = link_bandwidth;
    {
      auto hosts = mpi.gather_strings(mpi.hostname());
      auto names = mpi.gather_strings(device->name());
      auto buses = mpi.gather_strings(device->bus_id());
      auto local = mpi.gatherv_ints({mpi.local_rank()});
      if (root) {
        for (int r = 0; r < S; ++r) run.ranks.push_back({hosts[r], names[r], buses[r], local[r][0], offsets[r]});
      }
    }
    if (root) {
      std::ostringstream os;
      os << "model " << opt.model_path << ": " << spec.architecture << ", " << spec.n_layers << " layers, "
         << spec.num_units() << " units, " << format_fixed(model::total_params(spec) / 1e9, 2) << " B params; " << S
         << " ranks (" << run.backend << ", " << run.transport << "), B=" << opt.batch << " P=" << opt.prompt_len
         << " G=" << opt.gen_len << " M=" << M << (opt.no_overlap ? ", no overlap" : ", overlap") << "; output "
         << output;
      progress.say(os.str());
    }

    // Bytes a stage of units [first, last] allocates on this backend (weights, and KV cache +
    // scratch), computed before anything is allocated.
    auto stage_bytes_of = [&](int first, int last, int groups) -> StageBytes {
      StageConfig sc{opt.batch, opt.prompt_len + opt.gen_len, groups, dtype, opt.seed};
#if PPBENCH_HAVE_CUDA
      if (use_cuda) return cuda_stage_bytes(spec, first, last, sc);
#endif
      return cpu_stage_bytes(spec, first, last, sc);
    };
    auto stage_plan = [&](int first, int last, int groups) -> std::pair<int64_t, int64_t> {
      const auto b = stage_bytes_of(first, last, groups);
      return {static_cast<int64_t>(b.weights), static_cast<int64_t>(b.kv_cache + b.scratch)};
    };

    // Memory, before the profile: a run that cannot fit fails in seconds, not after profiling.
    // (a) The profile instantiates each unit alone (one group): it must fit this rank's limit.
    // (b) The model's weights + KV cache must fit the ranks' limits together, and its largest
    //     unit the largest limit (the balancer's own check, which needs the profile, says which
    //     split fits; this one says that none can).
    auto memory_limits = mpi.gather_doubles({static_cast<double>(memory_limit)});
    if (root)
      for (int r = 0; r < S; ++r) run.ranks[r].memory_limit_bytes = static_cast<int64_t>(memory_limits[r]);
    run_phase(mpi, watchdog, policy, "memory check of the profile", [&] {
      for (int sig = 0; sig < static_cast<int>(spec.signatures.size()); ++sig) {
        const int u = spec.signature_example[sig];
        auto [w, rest] = stage_plan(u, u, 1);
        if (static_cast<size_t>(w + rest) > memory_limit)
          throw UserError("profiling unit " + spec.units[u].name + " alone needs " + gib(double(w + rest)) +
                          " (weights " + gib(double(w)) + " + KV cache and scratch " + gib(double(rest)) + " for B=" +
                          std::to_string(opt.batch) + " sequences of P+G=" + std::to_string(opt.prompt_len + opt.gen_len) +
                          " tokens) but the limit is " + gib(double(memory_limit)) +
                          " (--memory-limit, default 90% of the free memory per rank); " +
                          (static_cast<size_t>(w) > memory_limit
                               ? "its weights alone exceed the limit: a larger --memory-limit or a device with more memory"
                               : "use a smaller --batch, --prompt-len or --gen-len"));
      }
      // `ppbench profile` holds one unit at a time: the whole model need not fit these ranks
      // (profile on fewer ranks, balance K > R stages offline).
      if (!root || opt.profile_only) return;
      double need = 0, unit_max = 0, have = 0, have_max = 0;
      std::string unit_name;
      for (int u = 0; u < spec.num_units(); ++u) {
        auto [w, kv] = stage_bytes(spec, u, u, M * opt.batch, opt.prompt_len + opt.gen_len, dtype_bytes(dtype));
        need += double(w + kv);
        if (double(w + kv) > unit_max) {
          unit_max = double(w + kv);
          unit_name = spec.units[u].name;
        }
      }
      for (double l : memory_limits) {
        have += l;
        have_max = std::max(have_max, l);
      }
      if (need > have)
        throw UserError("the model needs " + gib(need) + " of weights + KV cache (M=" + std::to_string(M) + " groups of B=" +
                        std::to_string(opt.batch) + " sequences, " + std::to_string(opt.prompt_len + opt.gen_len) +
                        " tokens each, " + dtype_name(dtype) + ") but the " + std::to_string(S) + " ranks hold " + gib(have) +
                        " together (--memory-limit, default 90% of the free memory per rank); use more ranks, a "
                        "smaller --batch/--microbatches/--prompt-len/--gen-len, or a smaller model");
      if (unit_max > have_max)
        throw UserError("unit " + unit_name + " alone needs " + gib(unit_max) + " of weights + KV cache but the largest "
                        "rank limit is " + gib(have_max) + " (--memory-limit); use a smaller --batch/--microbatches/"
                        "--prompt-len/--gen-len");
    });

    // ---- 2. profile on every rank ---------------------------------------------------------
    ProfileResult prof;
    run_phase(mpi, watchdog, policy, "profile", [&] {
      ProfileConfig pc;
      pc.batch = opt.batch;
      pc.prompt_len = opt.prompt_len;
      pc.gen_len = opt.gen_len;
      pc.num_contexts = opt.profile_contexts;
      pc.warmup = opt.profile_warmup;
      pc.iters = opt.profile_iters;
      pc.dtype = dtype;
      pc.seed = opt.seed;
      {
        // This node's share of the model's weights (its ranks' stages), for cold/warm timing.
        int64_t total = 0;
        for (int u = 0; u < spec.num_units(); ++u) total += model::unit_resident_params(spec, u) * dtype_bytes(dtype);
        pc.resident_bytes = static_cast<size_t>(total / S * mpi.local_size());
      }
      const double t_start = monotonic_s();
      prof = profile_model(*device, spec, pc, [&](int done, int total, const std::string& what) {
        if (done >= total) return;
        std::string eta;
        if (done > 0) {
          char buf[64];
          std::snprintf(buf, sizeof(buf), " (~%.0f s left)", (monotonic_s() - t_start) / done * (total - done));
          eta = buf;
        }
        progress.say("profile: signature " + std::to_string(done + 1) + "/" + std::to_string(total) + ": " + what + eta);
      });
    });
    const int U = spec.num_units();
    const balance::Objective objective = balance::parse_objective(opt.objective);
    std::vector<double> cost_mine(U);
    for (int u = 0; u < U; ++u)
      cost_mine[u] = balance::objective_cost(objective, prof.prefill_ms[u], prof.decode_ms[u], opt.gen_len);
    auto pack = [&](const std::vector<double>& a, const std::vector<double>& b) {
      std::vector<double> v;
      for (int u = 0; u < U; ++u) {
        v.push_back(a[u]);
        v.push_back(b[u]);
      }
      return v;
    };
    auto lat = mpi.gather_doubles(pack(prof.prefill_ms, prof.decode_ms));
    auto lat_min = mpi.gather_doubles(pack(prof.prefill_min_ms, prof.decode_min_ms));
    auto lat_max = mpi.gather_doubles(pack(prof.prefill_max_ms, prof.decode_max_ms));
    auto ctx = mpi.gather_doubles(prof.decode_context_ms);
    auto cost_all = mpi.gather_doubles(cost_mine);

    // ---- 3. balance on rank 0, broadcast --------------------------------------------------
    std::vector<balance::Partition> parts;
    std::vector<int> flat;  // per partition: S first units
    // The profile table goes into the file before the balancer runs: a split that cannot be
    // found (memory) still leaves what was measured.
    if (root) {
      ProfileTable& t = run.profile;
      for (int u = 0; u < U; ++u) {
        t.unit_name.push_back(spec.units[u].name);
        t.unit_signature.push_back(spec.units[u].signature);
        t.unit_params.push_back(model::unit_params(spec, u));
        t.unit_weight_bytes.push_back(model::unit_resident_params(spec, u) * dtype_bytes(dtype));
        t.unit_kv_bytes.push_back(stage_bytes(spec, u, u, M * opt.batch, opt.prompt_len + opt.gen_len, dtype_bytes(dtype)).second);
      }
      t.signature_name = spec.signatures;
      t.latency_ms = lat;
      t.latency_min_ms = lat_min;
      t.latency_max_ms = lat_max;
      t.decode_contexts = prof.decode_contexts;
      t.decode_context_ms = ctx;
      t.cost_ms = cost_all;
    }
    run_phase(mpi, watchdog, policy, "write of the profile", [&] { snapshot("balance"); });

    if (opt.profile_only) {  // `ppbench profile`: the file is complete without partitions
      run_phase(mpi, watchdog, policy, "write", [&] {
        if (!root) return;
        run.validation = "n/a";
        run.validation_ok = false;
        run.elapsed_s = monotonic_s() - run.run_start_s;
        run.status = "complete";
        write_results(output, run);
        print_summary(std::cout, run);
        std::cout << "results: " << output << " (profile only: ppbench balance " << output << " --stages K)" << std::endl;
      });
      return mpi.agree(0);
    }

    run_phase(mpi, watchdog, policy, "balance", [&] {
      if (!root) return;
      // The balancer's problem (DESIGN.md §6), built from the run's record exactly as
      // `ppbench balance FILE.h5` rebuilds it from the file: each rank's own profile row, each
      // rank's memory, the activations crossing each boundary per unit of the objective's cost
      // on the link measured at start-up, with or without overlap.
      const balance::BalanceProblem prob = balance::problem_from_run(run, objective);
      for (const auto& name : partition_names) {
        balance::Partition p;
        if (name == "uniform") p = balance::solve_uniform(U, S);
        else if (name == "seed") p = balance::solve_seed(prob.cost[0], S);
        else if (name == "balanced")
          p = balance::solve_with_order(prob, S, opt.order == "auto" ? balance::OrderMode::automatic
                                                                     : balance::OrderMode::rank);
        else p = balance::parse_manual(opt.partition, U, S);
        p.solver = name;
        balance::evaluate(prob, p);
        parts.push_back(p);
        for (int k = 0; k < S; ++k) flat.push_back(p.first_unit[k]);
        for (int k = 0; k < S; ++k) flat.push_back(p.device_rank[k]);
      }
    });
    mpi.bcast_ints(flat);
    if (!root) {
      for (size_t i = 0; i < partition_names.size(); ++i) {
        balance::Partition p;
        p.solver = partition_names[i];
        for (int k = 0; k < S; ++k) {
          p.first_unit.push_back(flat[2 * i * S + k]);
          p.last_unit.push_back(k + 1 < S ? flat[2 * i * S + k + 1] - 1 : U - 1);
          p.device_rank.push_back(flat[2 * i * S + S + k]);
        }
        parts.push_back(p);
      }
    }

    // Profile table and partition predictions for the file and the summary.
    if (root) {
      for (auto& p : parts) {
        PartitionRecord pr;
        pr.name = p.solver;
        pr.solver = p.solver;
        pr.first_unit = p.first_unit;
        pr.last_unit = p.last_unit;
        pr.device_rank = p.device_rank;
        pr.predicted_stage_ms = p.predicted_stage_ms;
        pr.predicted_bottleneck_ms = p.bottleneck_ms;
        for (int k = 0; k < S; ++k) {
          double pre = 0, dec = 0;
          int r = p.device_rank[k];
          for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) {
            pre += lat[(static_cast<size_t>(r) * U + u) * 2 + 0];
            dec += lat[(static_cast<size_t>(r) * U + u) * 2 + 1];
          }
          pr.predicted_phase_ms.push_back(pre);
          pr.predicted_phase_ms.push_back(dec);
          auto [w, kv] = stage_bytes(spec, p.first_unit[k], p.last_unit[k], M * opt.batch, opt.prompt_len + opt.gen_len, dtype_bytes(dtype));
          pr.stage_weight_bytes.push_back(w);
          pr.stage_kv_bytes.push_back(kv);
        }
        run.partitions.push_back(pr);
        if (!opt.quiet) {
          // Each device's limit net of its stage's activation scratch, so that "free" and "KV
          // tokens left" agree with the memory check (which counts the scratch too).
          std::vector<int64_t> net(S);
          for (int k = 0; k < S; ++k) {
            const int d = p.device_rank[k];
            net[d] = std::max<int64_t>(1, static_cast<int64_t>(memory_limits[d]) -
                                              static_cast<int64_t>(stage_bytes_of(p.first_unit[k], p.last_unit[k], M).scratch));
          }
          auto mr = balance::memory_report(p, run.profile.unit_weight_bytes, run.profile.unit_kv_bytes,
                                           int64_t(M) * opt.batch * (opt.prompt_len + opt.gen_len), net);
          progress.say("memory of partition " + p.solver + " (limits net of each stage's activation scratch):\n" +
                       balance::format_memory_report(mr));
        }
        progress.say("partition " + p.solver + ": " + p.counts_string() + " units per stage, predicted bottleneck " +
                     format_fixed(p.bottleneck_ms, 2) + " ms (" + opt.objective + ")");
      }
    }

    run_phase(mpi, watchdog, policy, "write of the partitions", [&] { snapshot("benchmark"); });

    // Memory: every rank checks its stage of every partition before anything is allocated, so
    // an impossible partition fails in seconds instead of after the others were benchmarked.
    run_phase(mpi, watchdog, policy, "memory check", [&] {
      for (const auto& p : parts) {
        const int k = static_cast<int>(std::find(p.device_rank.begin(), p.device_rank.end(), mpi.rank()) - p.device_rank.begin());
        // Exactly what the stage allocates (CUDA or CPU), scratch included.
        auto [w, kv] = stage_plan(p.first_unit[k], p.last_unit[k], M);
        if (static_cast<size_t>(w + kv) > memory_limit) {
          std::ostringstream os;
          os << "partition " << p.solver << ": stage " << k << " (units " << spec.units[p.first_unit[k]].name << ".."
             << spec.units[p.last_unit[k]].name << ") needs " << gib(double(w + kv)) << " (weights " << gib(double(w))
             << " + KV cache and scratch " << gib(double(kv)) << ") but the limit is " << gib(double(memory_limit))
             << " (--memory-limit, default 90% of the free memory per rank); use more ranks, a smaller "
                "--batch/--microbatches/--prompt-len/--gen-len, or a smaller model";
          throw UserError(os.str());
        }
      }
    });

    // ---- 4./5. benchmark and validate each partition ---------------------------------------
    for (size_t pi = 0; pi < parts.size(); ++pi) {
      const auto& p = parts[pi];
      // My stage: the one whose device rank is me.
      int my_stage = static_cast<int>(std::find(p.device_rank.begin(), p.device_rank.end(), mpi.rank()) - p.device_rank.begin());
      StagePlacement place;
      place.rank = mpi.rank();
      place.stage = my_stage;
      place.num_stages = S;
      place.prev_rank = my_stage > 0 ? p.device_rank[my_stage - 1] : -1;
      place.next_rank = my_stage + 1 < S ? p.device_rank[my_stage + 1] : -1;
      place.first_rank = p.device_rank[0];
      place.last_rank = p.device_rank[S - 1];

      std::unique_ptr<StageExecutor> stage;
      run_phase(mpi, watchdog, policy, "build of partition " + p.solver, [&] {
        StageConfig sc;
        sc.batch = opt.batch;
        sc.max_context = opt.prompt_len + opt.gen_len;
        sc.groups = M;
        sc.dtype = dtype;
        sc.seed = opt.seed;
        stage = device->create_stage(spec, p.first_unit[my_stage], p.last_unit[my_stage], sc);
      });

      PipelineConfig pc;
      pc.batch = opt.batch;
      pc.prompt_len = opt.prompt_len;
      pc.gen_len = opt.gen_len;
      pc.groups = M;
      pc.warmup = opt.warmup;
      pc.iters = opt.iters;
      pc.seed = opt.seed;
      pc.vocab = spec.vocab;
      pc.mode = opt.no_overlap ? LaneMode::no_overlap : LaneMode::overlap;
      StageRecord rec, ref;
      run_phase(mpi, watchdog, policy, "benchmark of partition " + p.solver, [&] {
        const double t_start = monotonic_s();
        rec = run_pipeline(*device, *transport, *stage, place, pc, [&](int done, int total) {
          // Estimate: the mean repetition so far for what is left, plus one for validation.
          const double per_rep = (monotonic_s() - t_start) / done;
          const double left = per_rep * (total - done + (opt.validate ? 1 : 0));
          char eta[64];
          std::snprintf(eta, sizeof(eta), ", %.1f s per repetition, ~%.0f s left", per_rep, left);
          progress.say("benchmark " + p.solver + ": repetition " + std::to_string(done) + "/" + std::to_string(total) +
                       (done <= opt.warmup ? " (warm-up)" : "") + eta);
        });
      });
      if (opt.validate) {
        run_phase(mpi, watchdog, policy, "validation of partition " + p.solver, [&] {
          PipelineConfig vc = pc;
          vc.warmup = 0;
          vc.iters = 1;
          vc.mode = LaneMode::serialized;
          ref = run_pipeline(*device, *transport, *stage, place, vc);
          progress.say("validation " + p.solver + ": serialized reference run done");
        });
      }
      stage.reset();

      // Gather the timeline on rank 0 and convert to rank 0's clock, seconds since run start.
      auto ev_all = mpi.gatherv_doubles(rec.events);
      std::vector<int> toks_mine(rec.tokens.begin(), rec.tokens.end());
      std::vector<int> ref_mine(ref.tokens.begin(), ref.tokens.end());
      auto toks_all = mpi.gatherv_ints(toks_mine);
      auto ref_all = mpi.gatherv_ints(ref_mine);
      auto sums = mpi.gather_doubles({rec.checksum, ref.checksum, rec.compute_lane_cpu_s, rec.recv_lane_cpu_s,
                                      rec.send_lane_cpu_s, rec.timed_wall_s});
      if (root) {
        PartitionRecord& pr = run.partitions[pi];
        const int steps = opt.gen_len + 1;
        EventShape sh{opt.iters, M, steps, S};
        pr.events.assign(static_cast<size_t>(opt.iters) * M * steps * S * kNumEvents, std::nan(""));
        for (int k = 0; k < S; ++k) {
          int r = p.device_rank[k];
          const auto& e = ev_all[r];
          for (int it = 0; it < opt.iters; ++it)
            for (int g = 0; g < M; ++g)
              for (int t = 0; t < steps; ++t)
                for (int x = 0; x < kNumEvents; ++x) {
                  double v = e[(((static_cast<size_t>(it) * M + g) * steps + t) * kNumEvents) + x];
                  pr.events[sh.index(it, g, t, k, x)] = v - offsets[r] - run.run_start_s;
                }
          pr.lane_cpu_s.push_back(sums[r * 6 + 2]);
          pr.lane_cpu_s.push_back(sums[r * 6 + 3]);
          pr.lane_cpu_s.push_back(sums[r * 6 + 4]);
        }
        pr.timed_wall_s = sums[p.device_rank[0] * 6 + 5];
        int lr = p.device_rank[S - 1];
        pr.tokens.assign(toks_all[lr].begin(), toks_all[lr].end());
        pr.reference_tokens.assign(ref_all[lr].begin(), ref_all[lr].end());
        pr.checksum = sums[lr * 6 + 0];
        pr.reference_checksum = sums[lr * 6 + 1];
        pr.validated = opt.validate;
        pr.tokens_match = opt.validate && pr.tokens == pr.reference_tokens;
        pr.checksum_match = opt.validate && pr.checksum == pr.reference_checksum;
        pr.tokens_match_first_partition = pr.tokens == run.partitions[0].tokens;
        auto m = compute_metrics(pr.events, sh, opt.batch, opt.gen_len);
        for (int k = 0; k < S; ++k) {
          pr.stage_compute_ms.push_back(m.stage_prefill_ms[k]);
          pr.stage_compute_ms.push_back(m.stage_decode_ms[k]);
        }
        pr.stage_workload_ms = m.stage_workload_ms;
        for (int k = 0; k < S; ++k)  // measured stage cost in the balancer's objective
          pr.measured_stage_ms.push_back(objective == balance::Objective::decode    ? m.stage_decode_ms[k]
                                         : objective == balance::Objective::prefill ? m.stage_prefill_ms[k]
                                                                      : m.stage_workload_ms[k]);
        pr.bubble_fraction = m.bubble_fraction;
        pr.recv_wait_ms = m.recv_wait_ms;
        pr.rep_wall_s = m.rep_wall_s;
        pr.rep_tokens_per_s = m.rep_tokens_per_s;
        pr.bottleneck_stage = m.bottleneck_stage;
        pr.metrics = {{"tokens_per_s", m.tokens_per_s},
                      {"decode_tokens_per_s", m.decode_tokens_per_s},
                      {"ttft_p50_ms", m.ttft_p50_ms},
                      {"ttft_p99_ms", m.ttft_p99_ms},
                      {"tpot_p50_ms", m.tpot_p50_ms},
                      {"tpot_p99_ms", m.tpot_p99_ms},
                      {"bottleneck_bound_tok_s", m.bottleneck_bound_tok_s},
                      {"pipeline_efficiency", m.pipeline_efficiency},
                      {"predicted_bottleneck_ms", pr.predicted_bottleneck_ms},
                      {"measured_bottleneck_ms", *std::max_element(pr.measured_stage_ms.begin(), pr.measured_stage_ms.end())}};
        // The simulator's prediction from the profile (predicted step times + the measured link),
        // beside the measurement (issue: "run stores the simulator's prediction").
        {
          std::vector<balance::SimStage> st(S);
          for (int k = 0; k < S; ++k) {
            st[k].prefill_ms = pr.predicted_phase_ms[2 * k];
            st[k].decode_ms = pr.predicted_phase_ms[2 * k + 1];
            const bool last_stage = k == S - 1;
            auto xfer_ms = [&](int tokens) {
              if (S == 1) return 0.0;
              double bytes = last_stage ? 4.0 * opt.batch
                                        : double(model::boundary_bytes(spec, p.last_unit[k], opt.batch, tokens, dtype_bytes(dtype)));
              return 1e3 * (link_latency_s + (link_bandwidth > 0 ? bytes / link_bandwidth : 0.0));
            };
            st[k].send_prefill_ms = xfer_ms(opt.prompt_len);
            st[k].send_decode_ms = xfer_ms(1);
          }
          balance::SimConfig simc;
          simc.groups = M;
          simc.gen_len = opt.gen_len;
          simc.batch = opt.batch;
          simc.overlap = !opt.no_overlap;
          try {
            auto sim = balance::simulate_pipeline(st, simc).metrics;
            pr.metrics["simulated_tokens_per_s"] = sim.tokens_per_s;
            pr.metrics["simulated_decode_tokens_per_s"] = sim.decode_tokens_per_s;
            pr.metrics["simulated_decode_error"] =
                m.decode_tokens_per_s > 0 ? sim.decode_tokens_per_s / m.decode_tokens_per_s - 1.0 : 0.0;
          } catch (const std::exception& e) {  // a prediction must never cost the measurement
            std::cerr << "ppbench: warning: the simulator failed for partition " << p.solver << ": " << e.what() << std::endl;
          }
        }
        pr.measured = true;
        progress.say("benchmark " + p.solver + ": " + format_fixed(m.tokens_per_s, 2) + " tokens/s, validation " +
                     (!pr.validated ? "skipped" : pr.tokens_match && pr.checksum_match ? "OK" : "FAILED"));
      }
      run_phase(mpi, watchdog, policy, "write after partition " + p.solver, [&] { snapshot("benchmark"); });
    }

    // ---- 6./7. summary and results file ---------------------------------------------------
    int status = 0;
    run_phase(mpi, watchdog, policy, "write", [&] {
      if (!root) return;
      const PartitionRecord* uni = nullptr;
      const PartitionRecord* bal = nullptr;
      bool failed = false, all_validated = true;
      for (auto& pr : run.partitions) {
        failed = failed || !pr.tokens_match_first_partition || (pr.validated && !(pr.tokens_match && pr.checksum_match));
        all_validated = all_validated && pr.validated;
        if (pr.name == "uniform") uni = &pr;
        if (pr.name == "balanced") bal = &pr;
      }
      if (uni && bal) {
        run.balance_gain = bal->metrics.at("tokens_per_s") / uni->metrics.at("tokens_per_s");
        run.decode_balance_gain = bal->metrics.at("decode_tokens_per_s") / uni->metrics.at("decode_tokens_per_s");
      }
      run.validation = failed ? "failed" : all_validated ? "ok" : "skipped";
      run.validation_ok = run.validation == "ok";
      run.elapsed_s = monotonic_s() - run.run_start_s;
      run.status = "complete";
      write_results(output, run);
      print_summary(std::cout, run);
      std::cout << "results: " << output << std::endl;
    });
    if (root && run.validation == "failed") status = 1;
    return mpi.agree(status);
  } catch (const PhaseFailed& f) {
    return f.status;
  }
}

}  // namespace ppb
