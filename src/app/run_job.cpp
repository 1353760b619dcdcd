#include "app/run_job.h"
#include "app/version.h"

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
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <sstream>

#include "backend/cpu/cpu_gemm.h"
#include "backend/device.h"
#include "backend/tensor_parallel.h"
#include "balance/calibrate.h"
#include "balance/contention.h"
#include "balance/layout.h"
#include "balance/memory_report.h"
#include "balance/partition.h"
#include "balance/predict.h"
#include "balance/problem.h"
#include "balance/simulator.h"
#include "balance/solver.h"
#include "common/cgroup.h"
#include "common/check.h"
#include "common/error.h"
#include "common/format.h"
#include "common/host_conditions.h"
#include "common/roofline.h"
#include "common/watchdog.h"
#include "model/model_spec.h"
#include "pipeline/metrics.h"
#include "pipeline/pipeline.h"
#include "profile/profiler.h"
#include "results/conditions.h"
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
  if (!(o.target_ci_pct >= 0) || !(o.target_ci_pct <= 100))
    throw UserError("--target-ci must be in [0, 100] percent (0 = exactly --iters rounds), got " +
                    std::to_string(o.target_ci_pct));
  if (!(o.max_time_s > 0) || !(o.max_time_s <= 604800))
    throw UserError("--max-time must be > 0 and <= 604800 seconds (a week), got " + std::to_string(o.max_time_s));
  check_range("--profile-warmup", o.profile_warmup, 0, 1000);
  check_range("--profile-iters", o.profile_iters, 1, 100000);
  check_range("--profile-contexts", o.profile_contexts, 1, 64);
  check_range("--profile-repeats", o.profile_repeats, 0, 1000);
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
  if (o.contention != "auto" && o.contention != "off")
    throw UserError("--contention '" + o.contention + "' is unknown; valid: auto (profile alone and together where a "
                    "machine's ranks share memory), off (one profile at each rank's own pace)");
  if (o.round_profile != "auto" && o.round_profile != "on" && o.round_profile != "off")
    throw UserError("--round-profile '" + o.round_profile + "' is unknown; valid: auto (profile cycles between the "
                    "benchmark's rounds where the profile has two passes and fewer than two splits of one rank per "
                    "stage are measured), on (where the profile has two passes), off");
  if (o.transport != "auto" && o.transport != "mpi" && o.transport != "nccl")
    throw UserError("--transport '" + o.transport + "' is unknown; valid: auto, mpi, nccl");
}

/// "7,5,6,6 on ranks 0,1,2,3": a split's unit counts and device order.
std::string split_text(const balance::Partition& p) {
  std::string ranks;
  for (size_t k = 0; k < p.device_rank.size(); ++k) {  // (appends: GCC 12 warns -Wrestrict on "," + to_string)
    if (k) ranks += ',';
    ranks += std::to_string(p.device_rank[k]);
  }
  return p.counts_string() + " on ranks " + ranks;
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

/// Partition names requested by --partition: named solvers, or one manual split.
std::vector<std::string> requested_partitions(const std::string& p) {
  if (p == "both") return {"uniform", "balanced"};
  if (p == "all") return {"uniform", "seed", "balanced"};
  if (p == "uniform" || p == "seed" || p == "balanced") return {p};
  if (p == "adaptive") return {"uniform", "balanced", "adaptive"};
  if (!p.empty() && p.find_first_of("0123456789") != std::string::npos) return {"manual"};
  throw UserError("--partition '" + p +
                  "' is unknown; valid: uniform, seed, balanced, both (uniform+balanced), all, adaptive "
                  "(uniform+balanced, then splits re-solved from what the pipeline measured), or a "
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

namespace {

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

/// `ppbench run` (and `ppbench profile`) as its phases (DESIGN.md §1): start-up, device and
/// transport, run description, memory check, profile, balance, then per partition build,
/// benchmark, validate and gather, and the final write. Each phase runs under run_phase(): a
/// bad input ends the job with status 2 on every rank, an internal error aborts it after rank 0
/// recorded what was measured (the failure policy: record_failure, snapshot).
class RunJob {
 public:
  RunJob(const MpiContext& mpi, const RunOptions& opt)
      : mpi_(mpi),
        opt_(opt),
        S_(mpi.size()),
        root_(mpi.is_root()),
        progress_(root_ && !opt.quiet),
        watchdog_(opt.timeout_s + 15.0, [this](const std::string& phase, double idle) { on_stall(phase, idle); }) {
    // watchdog_ is the last member: built last, destroyed first (before the transport and
    // the device its callback may touch).
    run_.run_start_s = monotonic_s();
    policy_.record = [this](const std::string& why) { record_failure(why); };
    watchdog_.catch_termination([this](const std::string& phase, int sig) { on_termination(phase, sig); });
  }

  /// The whole job; returns the exit status agreed by every rank.
  int run() {
    try {
      start_up();
      open_device();
      open_transport();
      describe_run();
      measure_ceilings();
      check_memory_for_profile();
      profile();
      profile_tp_groups();
      phase("write of the profile", [&] { snapshot("balance"); });
      if (opt_.profile_only) return finish_profile_only();
      balance();
      describe_partitions();
      phase("write of the partitions", [&] { snapshot("benchmark"); });
      check_memory_of_partitions();
      benchmark_partitions();
      return finish();
    } catch (const PhaseFailed& f) {
      return f.status;
    }
  }

 private:
  template <typename Fn>
  void phase(const std::string& name, Fn&& fn) {
    run_phase(mpi_, watchdog_, policy_, name, std::forward<Fn>(fn));
  }

  // ---- failure policy -------------------------------------------------------------------------

  /// Rank 0: the failure goes into the results file (complete=0), with what was measured.
  void record_failure(const std::string& why) {
    if (!root_ || output_.empty() || run_.world_size == 0) return;
    run_.status = "failed";
    run_.failure = why;
    run_.elapsed_s = monotonic_s() - run_.run_start_s;
    write_results(output_, run_, /*complete=*/false);
    if (run_.profile.latency_ms.empty())
      std::cerr << "ppbench: the failure is recorded in " << output_ << " (complete=0, status=failed; nothing measured yet)" << std::endl;
    else
      std::cerr << "ppbench: what was measured before the failure is in " << output_ << " (complete=0)" << std::endl;
  }

  /// Rank 0 keeps the results file up to date phase by phase (complete=0 until the end).
  void snapshot(const std::string& next_phase) {
    if (!root_) return;
    run_.status = "running: " + next_phase;
    run_.elapsed_s = monotonic_s() - run_.run_start_s;
    write_results(output_, run_, /*complete=*/false);
  }

  /// The watchdog: no progress for --timeout + 15 s. The transfers time out first (with the
  /// peer and tag in the message); this catches what they cannot see, e.g. a rank stuck in a
  /// collective.
  void on_stall(const std::string& phase, double idle) {
    std::ostringstream os;
    os << "no progress for " << static_cast<int>(idle) << " s (--timeout " << opt_.timeout_s
       << " s + 15 s): a rank is dead or stuck";
    if (transport_) {
      const std::string async = transport_->async_error();
      if (!async.empty()) os << "; " << async;
      transport_->abort();  // e.g. ncclCommAbort: release streams blocked on a dead peer
    }
    abort_job(mpi_, policy_, phase, os.str());
  }

  /// Another rank died (mpirun/srun then terminate the job) or the job was cancelled.
  void on_termination(const std::string& phase, int sig) {
    const std::string why = "terminated by signal " + std::to_string(sig) + " during " + phase +
                            " (another rank died, or the job was cancelled)";
    std::cerr << "ppbench: " << error_context() << ": " << why << std::endl;
    try {
      if (policy_.record) policy_.record(why);
    } catch (const std::exception&) {
    }
  }

  // ---- 1. options, model, output: every rank checks the same things ---------------------------

  void start_up() {
    phase("start-up", [&] {
      validate_options(opt_);
      objective_ = balance::parse_objective(opt_.objective);
      // srun started N tasks, but MPI was not wired to srun's PMI: every task came up as a
      // 1-rank job that would benchmark alone and race the others for the same output file.
      if (S_ == 1 && std::atoi(env_or("SLURM_STEP_NUM_TASKS").c_str()) > 1 && env_or("OMPI_COMM_WORLD_SIZE").empty())
        throw UserError("srun started " + env_or("SLURM_STEP_NUM_TASKS") +
                        " tasks but MPI sees 1 rank: the MPI library is not wired to srun's process manager; "
                        "use srun --mpi=pmix (see `srun --mpi=list` for what this cluster offers) or mpirun");
      partition_names_ = requested_partitions(opt_.partition);
      adaptive_ = partition_names_.back() == "adaptive";  // solved during the benchmark, not now
      if (adaptive_) partition_names_.pop_back();
      // One rank has one split (all units): benchmarking it twice would only measure noise.
      if (S_ == 1) {
        partition_names_.resize(1);
        adaptive_ = false;
      }
      if (opt_.control && std::find(partition_names_.begin(), partition_names_.end(), "uniform") == partition_names_.end())
        throw UserError("--control benchmarks the uniform split twice, but --partition '" + opt_.partition +
                        "' has no uniform split; use --partition uniform, both or all");
      spec_ = model::load_model_config(opt_.model_path);
      if (opt_.mtp) model::enable_mtp(spec_);  // UserError naming --mtp for a model without MTP
      if (opt_.expert_skew > 0.0 &&
          std::none_of(spec_.layers.begin(), spec_.layers.end(), [](const model::LayerShape& l) { return l.is_moe(); }))
        throw UserError("--expert-skew " + std::to_string(opt_.expert_skew) + ": " + opt_.model_path + " (" +
                        spec_.architecture + ") has no mixture-of-experts layer to route; drop --expert-skew");
      spec_.expert_skew = opt_.expert_skew;
      if (S_ > spec_.num_units())
        throw UserError("the run has " + std::to_string(S_) + " ranks (one stage each) but " + opt_.model_path +
                        " has only " + std::to_string(spec_.num_units()) + " units (embed + " +
                        std::to_string(spec_.n_layers) + " layers + head); use at most " +
                        std::to_string(spec_.num_units()) + " ranks");
      parse_layouts();
      if (partition_names_[0] == "manual")
        for (const auto& widths : layouts_) {
          try {
            balance::parse_manual(opt_.partition, spec_.num_units(), static_cast<int>(widths.size()));
          } catch (const UserError& e) {
            throw UserError(std::string(e.what()) + (widths.size() == static_cast<size_t>(S_) ? "" : " (for --tp " + balance::layout_label(widths) + ")"));
          }
        }
      M_ = opt_.microbatches > 0 ? opt_.microbatches : S_;
      if (opt_.device == "cuda" && !have_cuda_backend())
        throw UserError("--device cuda: this build of ppbench has no CUDA backend (nvcc was not found at build time); use --device cpu");
      if (opt_.transport == "nccl" && opt_.device == "cpu")
        throw UserError("--transport nccl needs --device cuda; CPU ranks use --transport mpi");
      if (opt_.dtype != "auto") dtype_ = parse_dtype(opt_.dtype);
      if (root_) {
        output_ = opt_.output.empty() ? default_output(opt_.model_path, S_) : opt_.output;
        check_output(output_, opt_.force);
      }
    });
    mpi_.bcast_string(output_);
  }

  /// --tp: the layouts to measure (balance/layout.h), each with the --partition splits; "1" is one
  /// rank per stage (what runs without --tp). Each width must split every layer's heads.
  void parse_layouts() {
    layouts_.clear();
    for (const std::string& text : opt_.tp) {
      if (text == "auto") {
        tp_auto_ = true;
        continue;
      }
      std::vector<int> widths = balance::parse_layout(text, S_);
      for (int w : widths)
        if (const std::string why = tp_unsupported_reason(spec_, w); !why.empty())
          throw UserError("--tp " + text + ": width " + std::to_string(w) + ": " + why);
      if (static_cast<int>(widths.size()) > spec_.num_units())
        throw UserError("--tp " + text + ": " + std::to_string(widths.size()) + " stages but " + opt_.model_path +
                        " has only " + std::to_string(spec_.num_units()) + " units");
      if (std::find(layouts_.begin(), layouts_.end(), widths) == layouts_.end()) layouts_.push_back(widths);
    }
    if (layouts_.empty() && !tp_auto_) layouts_.push_back(std::vector<int>(S_, 1));
    for (int w = 2; tp_auto_ && w <= S_; ++w)
      if (tp_unsupported_reason(spec_, w).empty()) auto_widths_.push_back(w);
    if (tp_auto_ && auto_widths_.empty() && S_ >= 2)
      throw UserError("--tp auto: no width from 2 to " + std::to_string(S_) + " splits " + opt_.model_path + " (width 2: " +
                      tp_unsupported_reason(spec_, 2) + "); drop --tp auto, or use --tp 1");
    const bool pp = tp_auto_ || std::any_of(layouts_.begin(), layouts_.end(), [](const std::vector<int>& w) {
      return std::all_of(w.begin(), w.end(), [](int t) { return t == 1; });
    });
    if (adaptive_ && !pp)
      throw UserError("--partition adaptive re-solves the split of one rank per stage; add --tp 1 to the layouts");
  }

  /// Collective over the world: this rank's tensor-parallel group for `color` (-1: none, null),
  /// the NCCL group on GPUs, the MPI group on CPU ranks.
  std::unique_ptr<TpGroup> make_tp_group(int color, int key) {
#if PPBENCH_HAVE_CUDA
    if (use_cuda_) return create_nccl_tp_group(mpi_, color, key, *device_);
#endif
    return create_mpi_tp_group(mpi_, color, key, tp_poll());
  }

  /// Polling of the tensor-parallel all-reduces: on the critical path twice per layer, so the
  /// waiting lane spins (MPI_Test and sched_yield) for up to 200 us before it sleeps, and sleeps
  /// at most 50 us.
  MpiPollConfig tp_poll() const {
    MpiPollConfig poll;
    poll.timeout_s = opt_.timeout_s;
    poll.spin_us = 200.0;
    poll.min_sleep_us = 5.0;
    poll.max_sleep_us = 50.0;
    return poll;
  }

  // ---- device and transport -------------------------------------------------------------------

  void open_device() {
    // auto = CUDA when every rank sees a GPU (agreed collectively, so no rank is left behind).
    use_cuda_ = opt_.device == "cuda" || (opt_.device == "auto" && mpi_.agree(visible_gpus() > 0 ? 0 : 1) == 0);
    phase("device", [&] {
      if (use_cuda_) {
#if PPBENCH_HAVE_CUDA
        device_ = create_cuda_device(mpi_.local_rank());
        if (opt_.dtype == "auto") dtype_ = DType::bf16;
#endif
      } else {
        device_ = create_cpu_device(0);
        if (dtype_ != DType::f32)
          throw UserError("--dtype " + opt_.dtype + ": the CPU backend computes in f32; use --dtype f32 (or auto)");
      }
    });
    if (!use_cuda_) {
      // Every rank timed OpenBLAS against oneDNN on its own; one library for the whole run (oneDNN
      // if any rank found it faster), so that a unit computes the same on every rank and the
      // file's gemm_library holds for all of them.
      const int onednn = mpi_.agree(cpu::gemm_library() == cpu::GemmLibrary::onednn ? 1 : 0);
      cpu::set_gemm_library(onednn ? cpu::GemmLibrary::onednn : cpu::GemmLibrary::openblas);
    }
    // Ranks drawing on the same memory share it: a GPU's by the ranks on that GPU; on CPU the
    // kernel's MemAvailable by every rank of the machine (nodes that are containers or
    // namespaces of one machine included), and a memory cgroup's headroom by the ranks in that
    // cgroup (a container's or a Slurm step's own), each rank taking the smaller share.
    const size_t share = shared_free_memory(mpi_, device_->memory_pools());
    memory_limit_ = opt_.memory_limit_gib > 0 ? static_cast<size_t>(opt_.memory_limit_gib * (1ull << 30))
                                              : static_cast<size_t>(0.9 * static_cast<double>(share));
  }

  void open_transport() {
    phase("transport", [&] {
      if (!use_cuda_ && opt_.transport == "nccl")
        throw UserError("--transport nccl needs GPUs (the CUDA backend on every rank); CPU ranks use --transport mpi");
      MpiPollConfig poll;
      poll.timeout_s = opt_.timeout_s;
#if PPBENCH_HAVE_CUDA
      if (use_cuda_) {
        poll.max_sleep_us = 50.0;  // GPU decode steps are milliseconds: poll tighter
        const bool own = every_rank_has_own_gpu(mpi_, device_->bus_id());
        if (opt_.transport == "nccl" && !own)
          throw UserError("--transport nccl: some ranks share a GPU and NCCL refuses that; use --transport mpi or auto");
        if (opt_.transport == "nccl" || (opt_.transport == "auto" && own)) {
          transport_ = create_nccl_transport(mpi_, *device_, poll);
        } else {
          if (root_ && opt_.transport == "auto")
            std::cerr << "ppbench: ranks share a GPU: NCCL refuses that, so the transport falls back to MPI with "
                         "pinned host staging" << std::endl;
          transport_ = create_staged_mpi_transport(mpi_, poll);
        }
        return;
      }
#endif
      transport_ = create_mpi_transport(mpi_, poll);
    });
  }

  // ---- what runs where: the run's metadata, clocks, link and memory limits --------------------

  void describe_run() {
    run_.ppbench_version = ppbench_version();
    run_.created_utc = utc_now("%Y-%m-%dT%H:%M:%SZ");
    run_.command_line = opt_.command_line;
    run_.backend = device_->backend();
    run_.transport = transport_->name();
    run_.mpi_version = MpiContext::library_version();
    run_.library_versions = device_->library_versions();
    for (const auto& [k, v] : transport_->library_versions()) run_.library_versions[k] = v;
    run_.world_size = S_;
    run_.slurm_job_id = env_or("SLURM_JOB_ID");
    run_.slurm_job_name = env_or("SLURM_JOB_NAME");
    run_.slurm_nodelist = env_or("SLURM_JOB_NODELIST");
    run_.slurm_array_task_id = env_or("SLURM_ARRAY_TASK_ID");
    run_.environment = captured_environment();
    run_.model_source = opt_.model_path;
    run_.model_config_json = spec_.config_json;
    run_.model_attrs_str = {{"architecture", spec_.architecture}, {"model_type", spec_.model_type}};
    run_.model_attrs_num = model_numbers(spec_);
    run_.workload = {opt_.batch, opt_.prompt_len, opt_.gen_len, M_, dtype_name(dtype_), opt_.warmup, opt_.iters,
                     opt_.profile_warmup, opt_.profile_iters, !opt_.no_overlap, opt_.seed, opt_.objective,
                     opt_.target_ci_pct, opt_.max_time_s, !opt_.no_cuda_graphs, "own pace",
                     /*profile_repeats=*/1, opt_.expert_skew, /*profile_order=*/""};

    offsets_ = mpi_.clock_offsets();
    // Every pair's link where the ranks are few, else each neighbouring pair and the token
    // return's. On one node the balancer and the simulator use one link, ranks 0 <-> 1's; on
    // several, each boundary's (balance::node_pair_links).
    const MpiContext::LinkMatrix links = mpi_.link_matrix(link_pairs(S_));
    run_.link_latency_matrix_s = links.latency_s;
    run_.link_bandwidth_matrix_Bps = links.bandwidth_Bps;
    if (S_ > 1) {
      run_.link_latency_s = links.latency_s[1];
      run_.link_bandwidth_Bps = links.bandwidth_Bps[1];
    }
    const auto hosts = mpi_.gather_strings(mpi_.hostname());
    const auto names = mpi_.gather_strings(device_->name());
    const auto buses = mpi_.gather_strings(device_->bus_id());
    const auto local = mpi_.gatherv_ints({mpi_.local_rank()});
    if (root_) {
      for (int r = 0; r < S_; ++r) {
        run_.ranks.push_back({hosts[r], names[r], buses[r], local[r][0], offsets_[r]});
        run_.ranks.back().machine_id = mpi_.machine_ids()[r];  // gathered at start-up
      }
    }
    record_conditions();
    // Device classes: ranks with the same class are identical devices (rank_device_classes). Decided
    // on rank 0, which holds every rank's record, and broadcast: every rank tells the same splits
    // apart.
    // Last entry: whether the ranks span several nodes, where each boundary is charged over its
    // own link (balance::node_pair_links) and the stages' order matters.
    std::vector<int> classes;
    if (root_) {
      classes = balance::rank_device_classes(run_.ranks);
      classes.push_back(std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h != hosts[0]; }));
    }
    mpi_.bcast_ints(classes);
    equivalence_.stage_order_matters = classes.back() != 0;
    classes.pop_back();
    equivalence_.device_class = classes;
    equivalence_.unit_signature.clear();
    for (const auto& unit : spec_.units) equivalence_.unit_signature.push_back(unit.signature);
    memory_limits_ = mpi_.gather_doubles({static_cast<double>(memory_limit_)});
    // The scratch of a stage of every unit bounds any stage's scratch (the balancer keeps it free).
    const auto scratch = mpi_.gather_doubles({static_cast<double>(stage_bytes_of(0, spec_.num_units() - 1, M_).scratch)});
    if (root_) {
      for (int r = 0; r < S_; ++r) {
        run_.ranks[r].memory_limit_bytes = static_cast<int64_t>(memory_limits_[r]);
        run_.ranks[r].stage_scratch_bytes = static_cast<int64_t>(scratch[r]);
      }
      std::ostringstream os;
      os << "model " << opt_.model_path << ": " << spec_.architecture << ", " << spec_.n_layers << " layers, "
         << spec_.num_units() << " units, " << format_fixed(model::total_params(spec_) / 1e9, 2) << " B params; " << S_
         << " ranks (" << run_.backend << ", " << run_.transport << "), B=" << opt_.batch << " P=" << opt_.prompt_len
         << " G=" << opt_.gen_len << " M=" << M_ << (opt_.no_overlap ? ", no overlap" : ", overlap") << "; output "
         << output_;
      progress_.say(os.str());
    }
  }

  /// Every rank's CPU affinity, cgroup CPU quota, governor and compute threads into /ranks;
  /// a node, or a machine of several nodes, with more compute threads than CPUs is said loudly
  /// (its timings measure ranks waiting for a core).
  void record_conditions() {
    const std::vector<int> cpus = cpu_affinity();
    const auto affinity = mpi_.gather_strings(format_cpu_list(cpus));
    const auto governor = mpi_.gather_strings(cpus.empty() ? std::string() : cpu_governor(cpus.front()));
    const auto quota = cgroup_cpu_quota_cores(read_text("/proc/self/cgroup"), "/sys/fs/cgroup");
    const auto nums = mpi_.gather_doubles(
        {quota ? *quota : std::numeric_limits<double>::quiet_NaN(), static_cast<double>(device_->compute_threads())});
    if (!root_) return;
    for (int r = 0; r < S_; ++r) {
      RankInfo& info = run_.ranks[r];
      info.cpu_affinity = affinity[r];
      info.cpu_governor = governor[r];
      info.cpu_quota_cores = nums[2 * r];
      info.compute_threads = static_cast<int>(nums[2 * r + 1]);
    }
    for (const HostLoad& h : host_loads(run_.ranks))
      if (h.oversubscribed()) std::cerr << oversubscription_warning(h) << std::endl;
    for (const HostLoad& m : machine_loads(run_.ranks))  // nodes that are one machine
      if (m.nodes > 1 && m.oversubscribed()) std::cerr << oversubscription_warning(m) << std::endl;
  }

  // ---- ceilings ---------------------------------------------------------------------------------

  /// The hardware's ceilings on every rank (issue 12's floors): read bandwidth and GEMM rate
  /// with the machine's other ranks idle (MpiContext::machine_rank: the ranks under one kernel,
  /// a node's or several namespaces'; they take turns, the waiting ones sleep in a
  /// quiet barrier, so they leave the cores alone), then the read bandwidth with every rank of
  /// the machine reading at once. Gathered into /ranks.
  /// A ceiling, or NaN with a warning when measuring it fails (an allocation, say): the phase's
  /// collectives must not be left by one rank (that would hang the others), and a run without
  /// floors is still a run.
  template <typename Fn>
  double ceiling_or_nan(const char* what, Fn&& measure) {
    try {
      return measure();
    } catch (const std::exception& e) {
      std::cerr << "ppbench: warning: rank " << mpi_.rank() << " could not measure its " << what << " ("
                << e.what() << "); its floors are NaN" << std::endl;
      return std::numeric_limits<double>::quiet_NaN();
    }
  }

  void measure_ceilings() {
    std::vector<double> mine(3, std::numeric_limits<double>::quiet_NaN());
    phase("ceilings", [&] {
      if (root_) progress_.say("ceilings: read bandwidth and GEMM rate of each rank, alone, then all at once");
      const int turns = mpi_.agree(mpi_.machine_size());
      for (int turn = 0; turn < turns; ++turn) {
        mpi_.quiet_barrier();
        if (mpi_.machine_rank() == turn) {
          mine[0] = ceiling_or_nan("read bandwidth", [&] { return device_->measure_read_bandwidth_GBps(); });
          mine[2] = ceiling_or_nan("GEMM rate", [&] { return device_->measure_gemm_gflops(dtype_); });
        }
      }
      mpi_.quiet_barrier();
      mine[1] = ceiling_or_nan("shared read bandwidth", [&] { return device_->measure_read_bandwidth_GBps(); });
    });
    const auto all = mpi_.gather_doubles(mine);
    if (!root_) return;
    std::ostringstream os;
    os << "ceilings (read GB/s alone / all at once, GEMM GFLOP/s):";
    for (int r = 0; r < S_; ++r) {
      RankInfo& info = run_.ranks[r];
      info.read_bandwidth_GBps = all[3 * r];
      info.read_bandwidth_shared_GBps = all[3 * r + 1];
      info.peak_gflops = all[3 * r + 2];
      os << (r ? "; " : " ") << "rank " << r << " " << format_fixed(info.read_bandwidth_GBps, 1) << " / "
         << format_fixed(info.read_bandwidth_shared_GBps, 1) << ", " << format_fixed(info.peak_gflops, 1);
    }
    progress_.say(os.str());
  }

  // ---- memory -----------------------------------------------------------------------------------

  /// What a stage of units [first, last] with `groups` request groups allocates on this
  /// backend (weights, KV cache, scratch), computed before anything is allocated.
  StageBytes stage_bytes_of(int first, int last, int groups, int tp_width = 1, int tp_rank = 0) const {
    return device_->stage_bytes(spec_, first, last, stage_config(groups, tp_width, tp_rank));
  }

  StageConfig stage_config(int groups, int tp_width = 1, int tp_rank = 0, TpGroup* tp = nullptr) const {
    StageConfig sc;
    sc.tp_width = tp_width;
    sc.tp_rank = tp_rank;
    sc.tp = tp;
    sc.batch = opt_.batch;
    sc.max_context = opt_.prompt_len + opt_.gen_len;
    sc.groups = groups;
    sc.dtype = dtype_;
    sc.seed = opt_.seed;
    sc.cuda_graphs = !opt_.no_cuda_graphs;
    sc.expert_skew = opt_.expert_skew;
    return sc;
  }

  /// Weights + KV cache of unit `u` alone for the run's M groups (no scratch): the balancer's
  /// per-unit memory. A stage's weights + KV cache are at most the sum over its units (a tied
  /// embedding shared by embed and head on one stage is counted once there), and its scratch at
  /// most the scratch of a stage of every unit (stage_scratch_bytes): a split within the
  /// limits net of that scratch passes check_memory_of_partitions.
  std::pair<int64_t, int64_t> unit_bytes(int u) const {
    const StageBytes b = stage_bytes_of(u, u, M_);
    return {static_cast<int64_t>(b.weights), static_cast<int64_t>(b.kv_cache)};
  }

  /// Memory, before the profile: a run that cannot fit fails in seconds, not after profiling.
  /// (a) The profile instantiates each unit alone (one group): it must fit this rank's limit.
  /// (b) The model's weights + KV cache must fit the ranks' limits together, and its largest
  ///     unit the largest limit (the balancer's own check, which needs the profile, says which
  ///     split fits; this one says that none can).
  void check_memory_for_profile() {
    phase("memory check of the profile", [&] {
      for (int sig = 0; sig < static_cast<int>(spec_.signatures.size()); ++sig) {
        const int u = spec_.signature_example[sig];
        const StageBytes b = stage_bytes_of(u, u, 1);
        const double w = double(b.weights), rest = double(b.kv_cache + b.scratch);
        if (b.total() > memory_limit_)
          throw UserError("profiling unit " + spec_.units[u].name + " alone needs " + gib(w + rest) + " (weights " +
                          gib(w) + " + KV cache and scratch " + gib(rest) + " for B=" + std::to_string(opt_.batch) +
                          " sequences of P+G=" + std::to_string(opt_.prompt_len + opt_.gen_len) +
                          " tokens) but the limit is " + gib(double(memory_limit_)) +
                          " (--memory-limit, default 90% of the free memory per rank); " +
                          (b.weights > memory_limit_
                               ? "its weights alone exceed the limit: a larger --memory-limit or a device with more memory"
                               : "use a smaller --batch, --prompt-len or --gen-len"));
      }
      // `ppbench profile` holds one unit at a time: the whole model need not fit these ranks
      // (profile on fewer ranks, balance K > R stages offline).
      if (root_ && !opt_.profile_only) check_model_fits_ranks();
    });
  }

  /// (b) above, on rank 0.
  void check_model_fits_ranks() const {
    double need = 0, unit_max = 0, have = 0, have_max = 0;
    std::string unit_name;
    for (int u = 0; u < spec_.num_units(); ++u) {
      const auto [w, kv] = unit_bytes(u);
      need += double(w + kv);
      if (double(w + kv) > unit_max) {
        unit_max = double(w + kv);
        unit_name = spec_.units[u].name;
      }
    }
    for (double l : memory_limits_) {
      have += l;
      have_max = std::max(have_max, l);
    }
    if (need > have)
      throw UserError("the model needs " + gib(need) + " of weights + KV cache (M=" + std::to_string(M_) + " groups of B=" +
                      std::to_string(opt_.batch) + " sequences, " + std::to_string(opt_.prompt_len + opt_.gen_len) +
                      " tokens each, " + dtype_name(dtype_) + ") but the " + std::to_string(S_) + " ranks hold " +
                      gib(have) +
                      " together (--memory-limit, default 90% of the free memory per rank); use more ranks, a "
                      "smaller --batch/--microbatches/--prompt-len/--gen-len, or a smaller model");
    if (unit_max > have_max)
      throw UserError("unit " + unit_name + " alone needs " + gib(unit_max) + " of weights + KV cache but the largest "
                      "rank limit is " + gib(have_max) + " (--memory-limit); use a smaller --batch/--microbatches/"
                      "--prompt-len/--gen-len");
  }

  /// Every rank checks its stage of every partition before anything is allocated, so an
  /// impossible partition fails in seconds instead of after the others were benchmarked.
  void check_memory_of_partitions() {
    phase("memory check", [&] {
      for (const auto& p : parts_) {
        const StagePlacement place = placement(p);
        const int k = place.stage;
        // Exactly what the stage allocates (CUDA or CPU), scratch included: this rank's shard.
        const StageBytes b = stage_bytes_of(p.first_unit[k], p.last_unit[k], M_, place.tp_width, place.tp_rank);
        if (b.total() > memory_limit_) {
          std::ostringstream os;
          os << "partition " << p.solver << ": stage " << k << " (units " << spec_.units[p.first_unit[k]].name << ".."
             << spec_.units[p.last_unit[k]].name << ") needs " << gib(double(b.total())) << " (weights "
             << gib(double(b.weights)) << " + KV cache and scratch " << gib(double(b.kv_cache + b.scratch))
             << ") but the limit is " << gib(double(memory_limit_))
             << " (--memory-limit, default 90% of the free memory per rank); use more ranks, a smaller "
                "--batch/--microbatches/--prompt-len/--gen-len, or a smaller model";
          throw UserError(os.str());
        }
      }
    });
  }

  // ---- 2. profile on every rank, gathered on rank 0 --------------------------------------------

  /// The profile's settings from the options. resident_bytes: this machine's share of the model's
  /// weights (its ranks' stages, in every layout: a tensor-parallel group's ranks split what one
  /// rank would hold), which decides cold or warm timing.
  ProfileConfig profile_config() const {
    ProfileConfig pc;
    pc.batch = opt_.batch;
    pc.prompt_len = opt_.prompt_len;
    pc.gen_len = opt_.gen_len;
    pc.num_contexts = opt_.profile_contexts;
    pc.warmup = opt_.profile_warmup;
    pc.iters = opt_.profile_iters;
    pc.dtype = dtype_;
    pc.seed = opt_.seed;
    pc.cuda_graphs = !opt_.no_cuda_graphs;
    pc.expert_skew = opt_.expert_skew;
    int64_t total = 0;
    for (int u = 0; u < spec_.num_units(); ++u) total += model::unit_resident_params(spec_, u) * dtype_bytes(dtype_);
    pc.resident_bytes = static_cast<size_t>(total / S_ * mpi_.machine_size());
    return pc;
  }

  /// One profile pass of this rank, with progress lines prefixed by `what` (none with `quiet`: a
  /// repeated cycle's signatures were announced in the first).
  ProfileResult profile_pass(const ProfileConfig& pc, const std::string& what, bool quiet = false) {
    const double t_start = monotonic_s();
    return profile_model(*device_, spec_, pc, [&](int done, int all, const std::string& unit) {
      if (done >= all || quiet) return;
      std::string eta;
      if (done > 0) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), " (~%.0f s left)", (monotonic_s() - t_start) / done * (all - done));
        eta = buf;
      }
      progress_.say(what + "signature " + std::to_string(done + 1) + "/" + std::to_string(all) + ": " + unit + eta);
    });
  }

  /// [U][2] (prefill, decode) from a ProfileResult's two [U] columns: a row of the profile tables.
  static std::vector<double> pack_phases(const std::vector<double>& prefill, const std::vector<double>& decode) {
    std::vector<double> v;
    for (size_t u = 0; u < prefill.size() && u < decode.size(); ++u) {
      v.push_back(prefill[u]);
      v.push_back(decode[u]);
    }
    return v;
  }

  /// Elementwise min (fastest) or max (slowest) of two equally long tables.
  static std::vector<double> elementwise(const std::vector<double>& a, const std::vector<double>& b, bool take_min) {
    std::vector<double> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = take_min ? std::min(a[i], b[i]) : std::max(a[i], b[i]);
    return out;
  }

  /// --profile-repeats auto: profile cycles until the profile has taken this long (s) ...
  static constexpr double kProfileSpanS = 15.0;
  /// ... or this many cycles. Why: on the 2-core VM of issue 13 a layer's decode step moved by
  /// +-20% (p10-p90) from one ~4 s window to the next with no memory between windows (lag-1
  /// autocorrelation -0.04..0.11 in 4 of 5 runs), while one cycle times each unit within well
  /// under a second: one sample of that state, which the benchmark's 120 s of rounds average.
  static constexpr int kAutoProfileRepeats = 4;
  /// ... and at least this many where there are two passes: the median of three keeps out one
  /// disturbed cycle. On a slower day of the same VMs (a cycle ~10 s, so two in 15 s) one run in
  /// two or three had one cycle's medians of some unit 1.3-2.7x the other's (a layer's alone
  /// prefill 60.6 ms against 22.2; the head's together decode 62.6 against 44.5): the mean of
  /// two moved that unit's cost by up to 50%, chose 19,11 over 17,13 on a head made heavy, and
  /// made cross-calibrated predictions miss by 5-13% (issue 13, eleven runs of the main job).
  static constexpr int kMinAutoRepeats = 3;

  /// The median of `v` (the mean of the two middle values for an even count); v non-empty.
  static double median_of(std::vector<double> v) {
    const size_t h = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
    if (v.size() % 2 == 1) return v[h];
    const double hi = v[h];
    return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h)));
  }

  /// One table of several profile cycles: each entry the median of the cycles' medians with
  /// three or more cycles (one disturbed cycle kept out, see kMinAutoRepeats), their mean with
  /// two (each cycle's median keeps out a forward's spikes), the fastest and slowest of all.
  /// runs: >= 1, equally shaped.
  static ProfileResult pool_cycles(const std::vector<ProfileResult>& runs) {
    ProfileResult out = runs.front();
    auto pool = [&](std::vector<double> ProfileResult::*table) {
      std::vector<double>& o = out.*table;
      for (size_t i = 0; i < o.size(); ++i) {
        std::vector<double> x;
        for (const ProfileResult& r : runs) x.push_back((r.*table)[i]);
        o[i] = median_of(x);  // with one or two cycles: the value, or the mean of the two
      }
    };
    pool(&ProfileResult::prefill_ms);
    pool(&ProfileResult::decode_ms);
    pool(&ProfileResult::decode_context_ms);
    const size_t C = out.decode_contexts.size();  // decode_ms stays the mean over contexts
    if (C > 0 && out.decode_context_ms.size() == C * out.decode_ms.size())
      for (size_t u = 0; u < out.decode_ms.size(); ++u) {
        double sum = 0.0;
        for (size_t c = 0; c < C; ++c) sum += out.decode_context_ms[u * C + c];
        out.decode_ms[u] = sum / static_cast<double>(C);
      }
    for (size_t c = 1; c < runs.size(); ++c) {
      const ProfileResult& r = runs[c];
      out.prefill_min_ms = elementwise(out.prefill_min_ms, r.prefill_min_ms, true);
      out.decode_min_ms = elementwise(out.decode_min_ms, r.decode_min_ms, true);
      out.prefill_max_ms = elementwise(out.prefill_max_ms, r.prefill_max_ms, false);
      out.decode_max_ms = elementwise(out.decode_max_ms, r.decode_max_ms, false);
    }
    return out;
  }

  /// The profile's two passes interleaved (ResidentProfiler::profile_interleaved): one unit of
  /// every signature built on every rank, where they fit beside nothing else (the profile
  /// precedes the stages) on every rank; else nullptr (each pass then builds one unit at a
  /// time, as profile_model, and the passes are timed one after the other). Collective.
  std::unique_ptr<ResidentProfiler> interleaved_profiler() {
    std::unique_ptr<ResidentProfiler> rp;
    const ProfileConfig pc = profile_config();
    const bool fits = ResidentProfiler::bytes(*device_, spec_, pc) <= device_->free_memory();
    if (mpi_.agree(fits ? 0 : 1) != 0) {
      progress_.say("profile: one unit of every signature does not fit some rank at once: the passes are timed one "
                    "after the other, one unit at a time");
      return rp;
    }
    std::exception_ptr failed;
    phase("units of the profile", [&] {
      try {
        rp = std::make_unique<ResidentProfiler>(*device_, spec_, pc);
      } catch (...) {
        failed = std::current_exception();
      }
      if (mpi_.agree(failed ? 1 : 0) != 0) {
        if (failed) std::rethrow_exception(failed);
        rp.reset();  // a peer failed: run_phase's agreement ends the phase on every rank
      }
    });
    return rp;
  }

  /// One cycle of the interleaved profile: per iteration, a turn alone for each rank of a
  /// machine (the others wait without spinning) and one together (a barrier before every timed
  /// forward), rotated by one per iteration; this rank's alone and together results are appended
  /// to `alones` and `profs`. Collective. `elapsed_s`: the profile's time so far, for the ETA.
  void interleaved_cycle(ResidentProfiler& units, ProfileConfig pc, int cycle, int max_cycles, double elapsed_s,
                         std::vector<ProfileResult>& alones, std::vector<ProfileResult>& profs) {
    const int alone_turns = mpi_.agree(mpi_.machine_size());  // the most ranks of any machine
    std::string eta;
    if (cycle > 1) eta = " (~" + format_fixed(elapsed_s / (cycle - 1), 0) + " s per cycle)";
    progress_.say("profile cycle " + std::to_string(cycle) + (max_cycles > 1 ? " of up to " + std::to_string(max_cycles) : "") +
                  ": each rank of a machine alone, then all together, taking turns forward by forward" + eta);
    pc.align = [this] { mpi_.barrier(); };
    using Turn = ResidentProfiler::Turn;
    const int me = mpi_.machine_rank();
    std::pair<ProfileResult, ProfileResult> r;
    try {
      r = units.profile_interleaved(pc, alone_turns + 1, [&](int t) {
        mpi_.quiet_barrier(1e-3, [] { heartbeat(); });
        if (t == alone_turns) return Turn::together;
        return t == me ? Turn::alone : Turn::wait;
      });
    } catch (const std::exception& e) {
      // The units ran these forwards in their warm-up on every rank, so this is not bad input;
      // and the peers are in the turns' barriers, where no agreement can reach them: end the job.
      throw InternalError(std::string("the interleaved profile failed after its units were built: ") + e.what());
    }
    if (!r.first.decode_contexts.empty()) alones.push_back(std::move(r.first));
    profs.push_back(std::move(r.second));
  }

  /// The profile. Where the ranks of a machine share memory (CPU ranks, --contention auto;
  /// MpiContext::machine_id: one kernel, so also ranks on different MPI nodes that are containers
  /// or namespaces of one machine), two passes (balance/contention.h): alone, the ranks of each
  /// machine taking turns while the others
  /// wait without spinning (quiet_barrier); then together, a barrier of all ranks before every
  /// timed forward so that a machine's ranks stream their weights at the same moment. The together
  /// pass is the profile the balancer solves on (latency_ms); the alone medians are kept for the
  /// contention model; min/max span both passes. Elsewhere one pass, every rank at its own pace.
  /// The passes are cycled --profile-repeats times (auto: kProfileSpanS / kAutoProfileRepeats,
  /// at least kMinAutoRepeats, where there are two passes, else once) and each table is
  /// pool_cycles of its cycles. Where one unit of every signature fits every rank at once
  /// (interleaved_profiler), each cycle's passes take turns forward by forward
  /// (interleaved_cycle) instead of running one after the other.
  void profile() {
    ProfileResult prof, alone;
    std::vector<ProfileResult> profs, alones;  // one per cycle
    const bool two_passes =
        opt_.contention == "auto" && mpi_.agree(device_->node_ranks_share_memory() && mpi_.machine_size() > 1 ? 1 : 0) != 0;
    const int max_cycles = opt_.profile_repeats > 0 ? opt_.profile_repeats : two_passes ? kAutoProfileRepeats : 1;
    std::unique_ptr<ResidentProfiler> units = two_passes ? interleaved_profiler() : nullptr;
    phase("profile", [&] {
      ProfileConfig pc = profile_config();
      const double t_start = monotonic_s();
      for (int cycle = 1;; ++cycle) {
        const std::string of = max_cycles > 1 ? " (cycle " + std::to_string(cycle) + ")" : "";
        if (units) {
          interleaved_cycle(*units, pc, cycle, max_cycles, monotonic_s() - t_start, alones, profs);
          const bool more = cycle < max_cycles && (opt_.profile_repeats > 0 || monotonic_s() - t_start < kProfileSpanS ||
                                                   cycle < kMinAutoRepeats);
          if (mpi_.agree(more ? 0 : 1) != 0) break;
          continue;
        }
        // A failure is kept until every rank's part of the cycle is over and agreed on: no rank
        // may leave the alone turns early, nor enter the together pass's barriers (or the next
        // cycle) alone. A rank that waits for others' turns (a whole profile each) beats the
        // watchdog's heartbeat.
        std::exception_ptr failed;
        if (two_passes) {
          const int turns = mpi_.agree(mpi_.machine_size());
          for (int turn = 0; turn < turns; ++turn) {
            mpi_.quiet_barrier(1e-3, [] { heartbeat(); });
            progress_.say("profile pass 1/2 (alone)" + of + ": rank " + std::to_string(turn) +
                          " of each machine; the others wait");
            if (mpi_.machine_rank() == turn && !failed) {
              try {
                alones.push_back(profile_pass(pc, "profile alone: ", cycle > 1));
              } catch (...) {
                failed = std::current_exception();
              }
            }
          }
          mpi_.quiet_barrier(1e-3, [] { heartbeat(); });
        } else {
          try {
            profs.push_back(profile_pass(pc, "profile" + of + ": ", cycle > 1));
          } catch (...) {
            failed = std::current_exception();
          }
        }
        if (mpi_.agree(failed ? 1 : 0) != 0) {
          if (failed) std::rethrow_exception(failed);
          return;  // a peer failed: run_phase's agreement ends the phase on every rank
        }
        if (two_passes) {
          progress_.say("profile pass 2/2 (together)" + of + ": every rank times each unit at the same moment");
          pc.align = [this] { mpi_.barrier(); };
          try {
            profs.push_back(profile_pass(pc, "profile together: ", cycle > 1));
          } catch (const UserError& e) {
            // The alone pass ran the same forwards, so this is not bad input; and the peers are in
            // the pass's barriers, where no agreement can reach them: end the job.
            throw InternalError(std::string("the together profile pass failed after the alone pass succeeded: ") + e.what());
          }
          pc.align = nullptr;
        }
        const bool more = cycle < max_cycles && (opt_.profile_repeats > 0 || monotonic_s() - t_start < kProfileSpanS ||
                                                 (two_passes && cycle < kMinAutoRepeats));
        if (mpi_.agree(more ? 0 : 1) != 0) break;  // every rank cycles as long as all of them would
      }
    });
    const bool interleaved = units != nullptr;
    units.reset();  // its units' memory, before the stages are built
    if (profs.empty()) return;  // the phase ended on a peer's failure (run_phase rethrows)
    two_passes_ = two_passes;
    if (two_passes) run_.workload.profile_order = interleaved ? "interleaved" : "one pass after the other";
    prof = pool_cycles(profs);
    run_.workload.profile_repeats = static_cast<int>(profs.size());
    if (two_passes) {
      alone = pool_cycles(alones);
      prof.prefill_min_ms = elementwise(prof.prefill_min_ms, alone.prefill_min_ms, true);
      prof.decode_min_ms = elementwise(prof.decode_min_ms, alone.decode_min_ms, true);
      prof.prefill_max_ms = elementwise(prof.prefill_max_ms, alone.prefill_max_ms, false);
      prof.decode_max_ms = elementwise(prof.decode_max_ms, alone.decode_max_ms, false);
      run_.workload.profile_passes = "alone+together";
    }
    const int U = spec_.num_units();
    std::vector<double> cost_mine(U);
    for (int u = 0; u < U; ++u)
      cost_mine[u] = balance::objective_cost(objective_, prof.prefill_ms[u], prof.decode_ms[u], opt_.gen_len);
    const auto pack = pack_phases;
    const auto lat = mpi_.gather_doubles(pack(prof.prefill_ms, prof.decode_ms));
    const auto lat_min = mpi_.gather_doubles(pack(prof.prefill_min_ms, prof.decode_min_ms));
    const auto lat_max = mpi_.gather_doubles(pack(prof.prefill_max_ms, prof.decode_max_ms));
    const auto ctx = mpi_.gather_doubles(prof.decode_context_ms);
    const auto cost_all = mpi_.gather_doubles(cost_mine);
    std::vector<double> lat_alone;
    if (two_passes) lat_alone = mpi_.gather_doubles(pack(alone.prefill_ms, alone.decode_ms));
    std::vector<double> cycles, alone_cycles;  // [K][R][U][2] on rank 0
    for (const ProfileResult& c : profs) {
      const auto all = mpi_.gather_doubles(pack(c.prefill_ms, c.decode_ms));
      cycles.insert(cycles.end(), all.begin(), all.end());
    }
    for (const ProfileResult& c : alones) {
      const auto all = mpi_.gather_doubles(pack(c.prefill_ms, c.decode_ms));
      alone_cycles.insert(alone_cycles.end(), all.begin(), all.end());
    }
    // The profile table goes into the file before the balancer runs: a split that cannot be
    // found (memory) still leaves what was measured.
    if (!root_) return;
    ProfileTable& t = run_.profile;
    for (int u = 0; u < U; ++u) {
      t.unit_name.push_back(spec_.units[u].name);
      t.unit_signature.push_back(spec_.units[u].signature);
      t.unit_params.push_back(model::unit_params(spec_, u));
      const auto [w, kv] = unit_bytes(u);
      t.unit_weight_bytes.push_back(w);
      t.unit_kv_bytes.push_back(kv);
    }
    for (int u = 0; u < U; ++u) {
      const model::UnitWork w = model::unit_work(spec_, u, opt_.batch, opt_.prompt_len, prof.decode_contexts,
                                                 static_cast<int>(dtype_bytes(dtype_)));
      t.unit_flops.insert(t.unit_flops.end(), {w.prefill_flops, w.decode_flops});
      t.unit_bytes.insert(t.unit_bytes.end(), {w.prefill_bytes, w.decode_bytes});
    }
    for (int r = 0; r < S_; ++r) {
      for (int i = 0; i < 2 * U; ++i) {
        t.floor_ms.push_back(roofline_floor_ms(t.unit_flops[i], t.unit_bytes[i], run_.ranks[r].read_bandwidth_GBps,
                                               run_.ranks[r].peak_gflops));
      }
    }
    t.signature_name = spec_.signatures;
    t.latency_ms = lat;
    t.latency_min_ms = lat_min;
    t.latency_max_ms = lat_max;
    t.latency_alone_ms = lat_alone;
    t.latency_cycles_ms = cycles;
    t.latency_alone_cycles_ms = alone_cycles;
    t.decode_contexts = prof.decode_contexts;
    t.decode_context_ms = ctx;
    t.cost_ms = cost_all;
  }

  /// The groups of ranks the layouts run tensor-parallel stages on, (first rank, width), each
  /// once, in layout order.
  std::vector<std::pair<int, int>> tp_groups_needed() const {
    std::vector<std::pair<int, int>> out;
    for (const auto& widths : layouts_)
      for (const auto& g : balance::layout_groups(widths))
        if (g.second > 1 && std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
    // --tp auto: one group per width and device class (identical devices cost the same).
    for (const auto& g : balance::auto_layout_groups(equivalence_.device_class, auto_widths_))
      if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
    return out;
  }

  /// Profiles every group of ranks a --tp layout needs, together at its width (issue 14): the
  /// group's ranks each build their shard of every unit and time the same forwards, the
  /// all-reduces inside. Groups that share no rank are profiled at the same time (one round),
  /// others in later rounds; ranks outside a round's groups wait. Rank 0 keeps each group's
  /// first rank's tables in run_.profile.tp. A group must be ranks of one node with identical
  /// devices (the same device class): the all-reduce would otherwise cross the network and a
  /// stage run at its slowest member's pace.
  void profile_tp_groups() {
    const auto groups = tp_groups_needed();
    if (groups.empty()) return;
    phase("layouts", [&] {
      for (const auto& [first, w] : groups)
        for (int r = first; r < first + w; ++r)
          if (equivalence_.device_class[r] != equivalence_.device_class[first])
            throw UserError("--tp: ranks " + std::to_string(first) + ".." + std::to_string(first + w - 1) +
                            " would form a tensor-parallel stage, but rank " + std::to_string(r) +
                            " is not an identical device of rank " + std::to_string(first) +
                            "'s node (/ranks: hostname, device, CPU quota, threads); a stage's ranks must be "
                            "identical devices of one node");
    });
    std::vector<std::vector<std::pair<int, int>>> rounds;  // greedy: a group joins the first round it fits
    for (const auto& g : groups) {
      auto overlaps = [&](const std::pair<int, int>& h) { return g.first < h.first + h.second && h.first < g.first + g.second; };
      auto it = std::find_if(rounds.begin(), rounds.end(), [&](const auto& round) {
        return std::none_of(round.begin(), round.end(), overlaps);
      });
      if (it == rounds.end()) it = rounds.insert(rounds.end(), std::vector<std::pair<int, int>>{});
      it->push_back(g);
    }
    const int U = spec_.num_units();
    for (const auto& round : rounds) {
      int color = -1, key = 0;
      for (size_t i = 0; i < round.size(); ++i)
        if (mpi_.rank() >= round[i].first && mpi_.rank() < round[i].first + round[i].second) {
          color = static_cast<int>(i);
          key = mpi_.rank() - round[i].first;
        }
      std::vector<double> mine;  // a group's first rank: latency, min, max [U][2] each
      phase("profile at tensor-parallel widths", [&] {
        std::string what;
        for (const auto& [first, w] : round)
          what += (what.empty() ? "" : ", ") + std::string("ranks ") + std::to_string(first) + ".." +
                  std::to_string(first + w - 1) + " at width " + std::to_string(w);
        progress_.say("profile: tensor-parallel groups " + what);
        auto tp = make_tp_group(color, key);
        // Ranks outside the round's groups wait without spinning (a busy wait would take a core
        // from the ranks being timed); a member's failure is rethrown after the meeting, so that
        // every rank reaches run_phase's agreement instead of one waiting for the others.
        std::exception_ptr failed;
        if (tp) {
          try {
            profile_group(*tp, mine);
          } catch (...) {
            failed = std::current_exception();
          }
        }
        mpi_.quiet_barrier(1e-3, [] { heartbeat(); });
        if (failed) std::rethrow_exception(failed);
      });
      std::vector<std::vector<double>> all;
      phase("gather of the tensor-parallel profile", [&] {
        all = mpi_.gatherv_doubles(mine);
        if (!root_) return;
        for (const auto& [first, w] : round) {
          const auto& row = all[first];
          ProfileTable::TpGroupProfile g;
          g.first_rank = first;
          g.width = w;
          if (row.size() != static_cast<size_t>(6 * U))
            throw InternalError("profile of tensor-parallel group at rank " + std::to_string(first) + " is missing");
          g.latency_ms.assign(row.begin(), row.begin() + 2 * U);
          g.latency_min_ms.assign(row.begin() + 2 * U, row.begin() + 4 * U);
          g.latency_max_ms.assign(row.begin() + 4 * U, row.end());
          run_.profile.tp.push_back(std::move(g));
        }
      });
    }
  }

  /// This rank's part of a tensor-parallel group's profile: its shard of every unit timed with
  /// the group; the group's first rank appends [U][2] latency, min and max to `mine`.
  void profile_group(TpGroup& tp, std::vector<double>& mine) {
    const int U = spec_.num_units();
    ProfileConfig pc = profile_config();  // cold or warm as the width-1 profile
    pc.tp_width = tp.width();
    pc.tp_rank = tp.rank();
    pc.tp = &tp;
    // Each rank flushes its caches before a timed forward; without a meeting after the
    // flushes, the first all-reduce of the forward would time a peer's flush.
    pc.align = [group = &tp] { group->barrier(); };
    const ProfileResult prof = profile_model(*device_, spec_, pc);
    if (tp.rank() != 0) return;
    for (const auto* table : {&prof.prefill_ms, &prof.prefill_min_ms, &prof.prefill_max_ms}) {
      const auto& dec = table == &prof.prefill_ms ? prof.decode_ms : table == &prof.prefill_min_ms ? prof.decode_min_ms : prof.decode_max_ms;
      for (int u = 0; u < U; ++u) {
        mine.push_back((*table)[u]);
        mine.push_back(dec[u]);
      }
    }
  }

  /// `ppbench profile`: the file is complete without partitions.
  int finish_profile_only() {
    phase("write", [&] {
      if (!root_) return;
      run_.validation = "n/a";
      run_.validation_ok = false;
      run_.elapsed_s = monotonic_s() - run_.run_start_s;
      run_.status = "complete";
      write_results(output_, run_);
      print_summary(std::cout, run_);
      std::cout << "results: " << output_ << " (profile only: ppbench balance " << output_ << " --stages K)" << std::endl;
    });
    return mpi_.agree(0);
  }

  // ---- 3. balance on rank 0, broadcast ----------------------------------------------------------

  void balance() {
    const int U = spec_.num_units();
    // Per partition: S, then S first units, S first ranks, S tensor-parallel widths.
    std::vector<int> flat;
    std::string names;
    phase("balance", [&] {
      if (!root_) return;
      // The balancer's problem (DESIGN.md §6), built from the run's record exactly as
      // `ppbench balance FILE.h5` rebuilds it from the file: each rank's own profile row, each
      // rank's memory, the activations crossing each boundary per unit of the objective's cost
      // on the link measured at start-up, with or without overlap. A layout with tensor-parallel
      // stages solves over its stages' groups (balance::layout_problem).
      const balance::BalanceProblem prob = balance::problem_from_run(run_, objective_);
      std::vector<std::vector<int>> layouts = layouts_;
      if (tp_auto_) {
        const std::vector<int> widths = choose_layout(prob);
        if (std::find(layouts.begin(), layouts.end(), widths) == layouts.end()) layouts.push_back(widths);
      }
      for (const auto& widths : layouts) {
        const bool pp = std::all_of(widths.begin(), widths.end(), [](int t) { return t == 1; });
        const balance::BalanceProblem lp = pp ? prob : balance::layout_problem(run_, objective_, widths);
        for (const auto& name : partition_names_) {
          balance::SplitRequest req;
          req.method = balance::parse_method(name);
          req.stages = S_;
          req.order = opt_.order == "auto" ? balance::OrderMode::automatic : balance::OrderMode::rank;
          req.manual = opt_.partition;
          balance::Partition p = pp ? balance::make_split(prob, req) : balance::make_layout_split(lp, req, widths);
          p.solver = name + balance::layout_suffix(widths);
          if (p.tp_width.empty()) p.tp_width.assign(p.num_stages(), 1);
          parts_.push_back(p);
          flat.push_back(p.num_stages());
          flat.insert(flat.end(), p.first_unit.begin(), p.first_unit.end());
          flat.insert(flat.end(), p.device_rank.begin(), p.device_rank.end());
          flat.insert(flat.end(), p.tp_width.begin(), p.tp_width.end());
          names += p.solver + "\n";
        }
      }
    });
    mpi_.bcast_ints(flat);
    mpi_.bcast_string(names);
    if (!root_) {
      std::istringstream in(names);
      size_t at = 0;
      for (std::string name; std::getline(in, name);) {
        const int S = flat[at++];
        balance::Partition p;
        p.solver = name;
        for (int k = 0; k < S; ++k) {
          p.first_unit.push_back(flat[at + k]);
          p.last_unit.push_back(k + 1 < S ? flat[at + k + 1] - 1 : U - 1);
          p.device_rank.push_back(flat[at + S + k]);
          p.tp_width.push_back(flat[at + 2 * S + k]);
        }
        at += 3 * static_cast<size_t>(S);
        parts_.push_back(p);
      }
    }
    if (opt_.control) {  // the A/A control: uniform again, benchmarked as a split of its own
      for (size_t i = 0; i < parts_.size(); ++i) {
        if (parts_[i].solver != "uniform") continue;
        balance::Partition c = parts_[i];
        c.solver = kControl;
        parts_.push_back(c);
        break;
      }
    }
  }

  static constexpr const char* kControl = "uniform_control";
  /// Issue 14's bound on the final-hidden-state checksum across layouts (fp32, sums reordered).
  static constexpr double kLayoutChecksumTol = 1e-4;

  /// Rank 0, --tp auto: the widths of the layout the balancer picks over every group of
  /// consecutive identical ranks at width 1 and at the profiled widths (balance::solve_layout:
  /// the smallest bottleneck, then spread, then fewer stages), recorded in run_.tp_auto_layout.
  std::vector<int> choose_layout(const balance::BalanceProblem& prob) {
    std::vector<int> widths = {1};
    widths.insert(widths.end(), auto_widths_.begin(), auto_widths_.end());
    const balance::Partition best = balance::solve_layout(
        prob, balance::layout_candidates(run_, prob, objective_, equivalence_.device_class, widths), S_);
    run_.tp_auto_layout = balance::layout_label(best.tp_width);
    progress_.say("--tp auto: the balancer chose widths " + run_.tp_auto_layout + " (" + best.counts_string() +
                  " units per stage), predicted bottleneck " + format_fixed(best.bottleneck_ms, 2) + " ms");
    return best.tp_width;
  }

  /// Whether partition i is measured by itself (not the same split as an earlier one; the A/A
  /// control always is, that is its point).
  bool measured_alone(size_t i) const {
    return parts_[i].solver == kControl || balance::same_split_as(parts_, i, equivalence_) < 0;
  }

  /// Rank 0: each partition's record (split, predictions, stage bytes) and its memory report.
  void describe_partitions() {
    if (!root_) return;
    predictor_ = std::make_unique<balance::Predictor>(run_);
    for (const auto& p : parts_) run_.partitions.push_back(describe_partition(p, run_.profile));
  }

  /// Prints the predictor's warnings, if any.
  static void warn(const std::vector<std::string>& warnings) {
    for (const std::string& w : warnings) std::cerr << "ppbench: warning: " << w << std::endl;
  }

  /// Rank 0: partition `p`'s record (split and predictions from profile table `prof`,
  /// balance::Predictor::describe; this backend's stage bytes), its memory report and its
  /// progress line.
  PartitionRecord describe_partition(const balance::Partition& p, const ProfileTable& prof) {
    std::string warning;
    PartitionRecord pr = predictor_->describe(p, prof, &warning);
    if (!warning.empty()) warn({warning});
    const int S = p.num_stages();
    for (int k = 0; k < S; ++k) {
      const StageBytes b = stage_bytes_of(p.first_unit[k], p.last_unit[k], M_, p.width(k), 0);  // the group's first shard
      pr.stage_weight_bytes.push_back(static_cast<int64_t>(b.weights));
      pr.stage_kv_bytes.push_back(static_cast<int64_t>(b.kv_cache));
    }
    if (!opt_.quiet && !p.tensor_parallel()) {
      // Each device's limit net of its stage's activation scratch, so that "free" and "KV
      // tokens left" agree with the memory check (which counts the scratch too).
      std::vector<int64_t> net(S_);
      for (int k = 0; k < S; ++k) {
        const int d = p.device_rank[k];
        net[d] = std::max<int64_t>(1, static_cast<int64_t>(memory_limits_[d]) -
                                          static_cast<int64_t>(stage_bytes_of(p.first_unit[k], p.last_unit[k], M_).scratch));
      }
      const auto mr = balance::memory_report(p, prof.unit_weight_bytes, prof.unit_kv_bytes,
                                             int64_t(M_) * opt_.batch * (opt_.prompt_len + opt_.gen_len), net);
      progress_.say("memory of partition " + p.solver + " (limits net of each stage's activation scratch):\n" +
                    balance::format_memory_report(mr));
    }
    progress_.say("partition " + p.solver + ": " + p.counts_string() + " units per stage" +
                  (p.tensor_parallel() ? " on stages of widths " + pr.layout : "") + ", predicted bottleneck " +
                  format_fixed(pr.predicted_bottleneck_ms, 2) + " ms (" + opt_.objective +
                  (prof.latency_alone_ms.empty() ? ")"
                                                 : "; solved on the together profile " + format_fixed(p.bottleneck_ms, 2) +
                                                       " ms, shared-bandwidth model)"));
    return pr;
  }

  // ---- 4./5. benchmark and validate each partition ----------------------------------------------

  StagePlacement placement(const balance::Partition& p) const { return layout_placement(p.stage_ranks(), mpi_.rank()); }

  PipelineConfig pipeline_config() const {
    PipelineConfig pc;
    pc.batch = opt_.batch;
    pc.prompt_len = opt_.prompt_len;
    pc.gen_len = opt_.gen_len;
    pc.groups = M_;
    pc.warmup = opt_.warmup;
    pc.iters = opt_.iters;
    pc.seed = opt_.seed;
    pc.vocab = spec_.vocab;
    pc.mode = opt_.no_overlap ? LaneMode::no_overlap : LaneMode::overlap;
    return pc;
  }

  /// One partition under benchmark, on every rank: its stage here (while built), whether it
  /// stays built between turns, the rounds it took part in and what its timed repetitions (one
  /// per round) and its validation run recorded so far.
  struct Bench {
    size_t pi = 0;
    StagePlacement place;
    std::unique_ptr<TpGroup> tp;  ///< this rank's tensor-parallel group (null at width 1); outlives the stage
    std::unique_ptr<StageExecutor> stage;
    bool resident = true;
    std::vector<int> rounds;
    StageRecord rec, ref;
    bool warmed = false;
  };

  /// Bytes this rank's stage of partition `pi` needs (weights, KV cache and scratch).
  size_t stage_total_bytes(size_t pi) const {
    const StagePlacement place = placement(parts_[pi]);
    const int k = place.stage;
    return stage_bytes_of(parts_[pi].first_unit[k], parts_[pi].last_unit[k], M_, place.tp_width, place.tp_rank).total();
  }

  void build_stage(Bench& b) {
    const balance::Partition& p = parts_[b.pi];
    phase("build of partition " + p.solver, [&] {
      b.stage = device_->create_stage(spec_, p.first_unit[b.place.stage], p.last_unit[b.place.stage],
                                      stage_config(M_, b.place.tp_width, b.place.tp_rank, b.tp.get()));
    });
  }

  /// Appends one run_pipeline record (its timed repetitions) to the partition's record so far.
  static void append_record(StageRecord& to, const StageRecord& one) {
    to.events.insert(to.events.end(), one.events.begin(), one.events.end());
    to.rep_start_s.insert(to.rep_start_s.end(), one.rep_start_s.begin(), one.rep_start_s.end());
    to.tokens = one.tokens;
    to.checksum = one.checksum;
    to.expert_tokens = one.expert_tokens;  // the last repetition's, as the checksum
    to.compute_lane_cpu_s += one.compute_lane_cpu_s;
    to.recv_lane_cpu_s += one.recv_lane_cpu_s;
    to.send_lane_cpu_s += one.send_lane_cpu_s;
    to.timed_wall_s += one.timed_wall_s;
  }

  /// Timed repetitions in a record of this run's shape.
  int reps_of(const StageRecord& rec) const {
    return static_cast<int>(rec.events.size() / (static_cast<size_t>(M_) * (opt_.gen_len + 1) * kNumEvents));
  }

  /// The partition's turn in round `round`: its warm-up (on its first turn when its stage stays
  /// built; on every turn when it is rebuilt), then one timed repetition.
  void take_turn(Bench& b, int round) {
    const balance::Partition& p = parts_[b.pi];
    if (!b.stage) build_stage(b);
    PipelineConfig pc = pipeline_config();
    pc.iters = 1;
    pc.warmup = b.resident && b.warmed ? 0 : opt_.warmup;
    StageRecord one;
    phase("benchmark of partition " + p.solver, [&] { one = run_pipeline(*device_, *transport_, *b.stage, b.place, pc); });
    b.warmed = true;
    append_record(b.rec, one);
    b.rounds.push_back(round);
    if (!b.resident) b.stage.reset();
  }

  /// Adds partition `pi` to the benchmark: resident when this rank and every other can hold its
  /// stage beside the resident ones (collective), built now if so.
  void add_bench(std::vector<Bench>& benches, size_t pi) {
    size_t resident_bytes = stage_total_bytes(pi);
    for (const Bench& b : benches)
      if (b.resident) resident_bytes += stage_total_bytes(b.pi);
    Bench b;
    b.pi = pi;
    b.place = placement(parts_[pi]);
    // Collective (every rank adds the same benches in the same order): the stage's group.
    phase("tensor-parallel group of partition " + parts_[pi].solver, [&] {
      b.tp = make_tp_group(b.place.tp_width > 1 ? b.place.stage : -1, b.place.tp_rank);
    });
    phase("memory check of the partitions side by side",
          [&] { b.resident = mpi_.agree(resident_bytes <= memory_limit_ ? 0 : 1) == 0; });
    if (b.resident) build_stage(b);
    benches.push_back(std::move(b));
  }

  /// Benchmarks every distinct split in interleaved rounds (DESIGN.md §1 step 5): round r gives
  /// each partition one timed repetition, in an order rotated by one each round (A B, B A, A B,
  /// ... for two), so that drift and a neighbour's load fall on every partition alike and the
  /// repetitions of two partitions in one round pair up (the gains' confidence intervals,
  /// common/stats.h). Stages stay built side by side when every rank can hold all of them;
  /// otherwise a partition's turn rebuilds (and warms up) its stage, and the file and the
  /// summary say so. With --partition adaptive, once every partition has --iters rounds, rank 0
  /// calibrates the profile by what the stages measured (balance/calibrate.h), solves again, and
  /// a new split joins the rounds as "adaptive" (then "adaptive_2"), until the solve returns a
  /// split already measured. Rounds continue past --iters until every gain against uniform has a
  /// 95% CI within +-(--target-ci) %, or until another round would end after --max-time. Then
  /// the serialized validation runs and rank 0 gathers each partition's record.
  void benchmark_partitions() {
    std::vector<Bench> benches;
    size_t to_measure = 0;
    for (size_t i = 0; i < parts_.size(); ++i) to_measure += measured_alone(i) ? 1 : 0;
    for (size_t i = 0; i < parts_.size(); ++i)
      if (measured_alone(i)) {
        progress_.say("benchmark: building partition " + parts_[i].solver + "'s stages (" + parts_[i].counts_string() +
                      ")" + (to_measure > 1 ? ", side by side with the others' where memory allows" : ""));
        add_bench(benches, i);
      }
    const auto resident_count = [&] {
      return std::count_if(benches.begin(), benches.end(), [](const Bench& b) { return b.resident; });
    };
    if (benches.size() > 1)
      progress_.say("benchmark: " + std::to_string(benches.size()) + " partitions in interleaved rounds, " +
                    (resident_count() == static_cast<long>(benches.size())
                         ? "all stages built side by side"
                         : "each stage rebuilt (and warmed up) on every turn: memory holds one partition's stages "
                           "at a time, so rounds take longer"));
    std::unique_ptr<ResidentProfiler> round_profiler = round_profiler_for(benches);
    double turns_s = 0, profile_s = 0;  // rank 0: the rounds' turns and the cycles between them so far
    const double t0 = monotonic_s();
    int rounds = 0;
    std::string stop;
    while (stop.empty()) {
      const double round_start = monotonic_s();
      for (size_t j = 0; j < benches.size(); ++j) take_turn(benches[(j + rounds) % benches.size()], rounds);
      ++rounds;
      turns_s += monotonic_s() - round_start;
      if (round_profiler) {
        profile_s += profile_between_rounds(*round_profiler, rounds, turns_s, profile_s);
        run_.round_profile_s = profile_s;
      }
      std::vector<std::vector<double>> events;  // rank 0: each partition's timeline so far
      phase("gather of round " + std::to_string(rounds), [&] {
        for (const Bench& b : benches) {
          gather_partition(b.pi, b.rec, StageRecord{}, b.rounds, /*final=*/false);
          if (root_) events.push_back(run_.partitions[b.pi].events);
        }
      });
      // What the rounds measured so far is in the file if the run fails later (complete=0).
      phase("write after round " + std::to_string(rounds), [&] { snapshot("benchmark"); });
      std::vector<int> split;  // rank 0: a new adaptive split, S first units then S device ranks
      const double now = monotonic_s();
      if (root_) {
        stop = round_verdict(benches, events, rounds, now - t0, now - round_start);
        if (stop.empty() && adaptive_pending() && adaptive_due(benches)) {
          try {
            split = solve_adaptive(benches, events);
          } catch (const std::exception& e) {  // rank 0 alone: never leave the others in the bcast
            adaptive_done_ = true;
            run_.adaptive_status = std::string("the re-solve failed (the rounds go on without it): ") + e.what();
            progress_.say("adaptive: " + run_.adaptive_status);
          }
        }
      }
      mpi_.bcast_string(stop);
      phase("adaptive split", [&] { mpi_.bcast_ints(split); });
      if (!split.empty()) {
        balance::Partition p;
        p.solver = next_adaptive_name();
        for (int k = 0; k < S_; ++k) {
          p.first_unit.push_back(split[k]);
          p.last_unit.push_back(k + 1 < S_ ? split[k + 1] - 1 : spec_.num_units() - 1);
          p.device_rank.push_back(split[S_ + k]);
        }
        parts_.push_back(p);
        phase("memory check of partition " + p.solver, [&] {
          if (stage_total_bytes(parts_.size() - 1) > memory_limit_)
            throw UserError("the adaptive split " + p.counts_string() + " does not fit rank " +
                            std::to_string(mpi_.rank()) + "'s --memory-limit");
        });
        add_bench(benches, parts_.size() - 1);
        progress_.say("benchmark: partition " + p.solver + " (" + p.counts_string() + ") joins the rounds from round " +
                      std::to_string(rounds + 1));
      }
    }
    run_.schedule = resident_count() == static_cast<long>(benches.size()) ? "interleaved, stages resident"
                    : resident_count() == 0 ? "interleaved, stages rebuilt every round"
                                            : "interleaved, some stages rebuilt every round (memory)";
    run_.rounds = rounds;
    run_.stop_reason = stop;
    progress_.say("benchmark: " + std::to_string(rounds) + " round(s), " + stop);
    round_profiler.reset();  // its units' memory, before validation builds stages again
    if (opt_.validate) {
      for (Bench& b : benches) {
        const balance::Partition& p = parts_[b.pi];
        if (!b.stage) build_stage(b);
        phase("validation of partition " + p.solver, [&] {
          PipelineConfig vc = pipeline_config();
          vc.warmup = 0;
          vc.iters = 1;
          vc.mode = LaneMode::serialized;
          b.ref = run_pipeline(*device_, *transport_, *b.stage, b.place, vc);
        });
        b.stage.reset();
        progress_.say("validation " + p.solver + ": serialized reference run done");
      }
    }
    for (Bench& b : benches) b.stage.reset();
    for (const Bench& b : benches) gather_partition(b.pi, b.rec, b.ref, b.rounds, /*final=*/true);
    for (size_t i = 0; i < parts_.size(); ++i)
      if (!measured_alone(i))
        share_measurement(i, static_cast<size_t>(balance::same_split_as(parts_, i, equivalence_)));
    if (root_) compare_partitions();
    if (root_) cross_calibrate_partitions();
    phase("write after the benchmark", [&] { snapshot("write"); });
  }

  /// Share of the rounds' time the profile cycles between rounds may take (20%: the gains' CIs
  /// widen by ~10% for the rounds they take).
  static constexpr double kRoundProfileShare = 0.2;

  /// Collective: the units the profile cycles between rounds time (--round-profile auto: where
  /// the profile had two passes, CPU ranks sharing a machine's memory, whose speed drifts over
  /// seconds to minutes; issue 13), built once beside the partitions' stages; null where off,
  /// or where they would not fit some rank's free memory (said so).
  std::unique_ptr<ResidentProfiler> round_profiler_for(const std::vector<Bench>& benches) {
    std::unique_ptr<ResidentProfiler> rp;
    size_t single = 0;  // splits of one rank per stage measured on their own: cross-calibration's sources
    for (const Bench& b : benches) single += parts_[b.pi].tensor_parallel() ? 0 : 1;
    // With two of them, cross-calibration (after the rounds) sees the rounds' machine at no cost,
    // and predicted the main job's stages within +-3.6% where these cycles left up to +16.6%
    // (issue 13, five runs); the cycles would take 20% of the rounds' time from the gains' CIs.
    const bool crossed = opt_.round_profile == "auto" && single >= 2;
    if (opt_.round_profile == "off") run_.round_profile_status = "off: --round-profile off";
    else if (!two_passes_) run_.round_profile_status = "none: the profile has one pass (no ranks sharing a machine's memory)";
    else if (crossed)
      run_.round_profile_status = "none: two or more splits of one rank per stage are measured, which cross-calibrate "
                                  "each other after the rounds (--round-profile on takes the cycles too)";
    if (opt_.round_profile == "off" || !two_passes_ || benches.empty() || crossed) return rp;
    const ProfileConfig pc = profile_config();
    const bool fits = ResidentProfiler::bytes(*device_, spec_, pc) <= device_->free_memory();
    if (mpi_.agree(fits ? 0 : 1) != 0) {
      run_.round_profile_status = "none: one unit of every signature would not fit beside the stages on some rank";
      progress_.say("benchmark: no profile between rounds (" + run_.round_profile_status + ")");
      return rp;
    }
    phase("units of the profile between rounds", [&] { rp = std::make_unique<ResidentProfiler>(*device_, spec_, pc); });
    run_.round_profile_status = "together cycles between rounds, at most " +
                                format_fixed(100 * kRoundProfileShare, 0) + "% of the rounds' time";
    progress_.say("benchmark: profile cycles (together) between rounds, at most " +
                  format_fixed(100 * kRoundProfileShare, 0) +
                  "% of the rounds' time; every prediction is made again from them after the rounds");
    return rp;
  }

  /// Collective, after round `rounds`: one together cycle of `rp` (every rank times each unit at
  /// the same moment, as the profile's pass 2) when the cycles so far (`profile_s`) have taken at
  /// most kRoundProfileShare of the rounds' turns (`turns_s`; rank 0 decides), gathered into
  /// /profile/latency_rounds_ms. Returns the seconds it took (0 when not due).
  double profile_between_rounds(ResidentProfiler& rp, int rounds, double turns_s, double profile_s) {
    std::vector<int> due{root_ && profile_s <= kRoundProfileShare * turns_s ? 1 : 0};
    mpi_.bcast_ints(due);
    if (due.empty() || due[0] == 0) return 0.0;
    const double start = monotonic_s();
    ProfileResult r;
    phase("profile after round " + std::to_string(rounds), [&] {
      ProfileConfig pc = profile_config();
      pc.align = [this] { mpi_.barrier(); };
      r = rp.profile(pc);
    });
    const auto all = mpi_.gather_doubles(pack_phases(r.prefill_ms, r.decode_ms));
    if (root_) {
      ProfileTable& t = run_.profile;
      t.latency_rounds_ms.insert(t.latency_rounds_ms.end(), all.begin(), all.end());
      t.latency_rounds_after.push_back(rounds);
    }
    return monotonic_s() - start;
  }

  /// Index in `benches` of the partition the others are compared with: uniform if measured,
  /// else the first.
  size_t reference_bench(const std::vector<Bench>& benches) const {
    for (size_t j = 0; j < benches.size(); ++j)
      if (parts_[benches[j].pi].solver == "uniform") return j;
    return 0;
  }

  /// The values of `a` and `b` measured in the same rounds (`ra`, `rb`: each value's round),
  /// in round order: the pairs compare_paired takes.
  static std::pair<std::vector<double>, std::vector<double>> same_rounds(const std::vector<double>& a,
                                                                        const std::vector<int>& ra,
                                                                        const std::vector<double>& b,
                                                                        const std::vector<int>& rb) {
    std::pair<std::vector<double>, std::vector<double>> out;
    for (size_t i = 0; i < a.size() && i < ra.size(); ++i) {
      const auto it = std::find(rb.begin(), rb.end(), ra[i]);
      if (it == rb.end() || static_cast<size_t>(it - rb.begin()) >= b.size()) continue;
      out.first.push_back(a[i]);
      out.second.push_back(b[static_cast<size_t>(it - rb.begin())]);
    }
    return out;
  }

  /// Rank 0, after each round: prints the round's figures and returns why the rounds stop
  /// ("" = another round).
  std::string round_verdict(const std::vector<Bench>& benches, const std::vector<std::vector<double>>& events,
                            int rounds, double elapsed_s, double round_s) const {
    std::vector<PartitionMetrics> ms;
    for (size_t j = 0; j < benches.size(); ++j) {
      const EventShape sh{static_cast<int>(benches[j].rounds.size()), M_, opt_.gen_len + 1,
                          parts_[benches[j].pi].num_stages()};
      ms.push_back(compute_metrics(events[j], sh, opt_.batch, opt_.gen_len));
    }
    const size_t ref = reference_bench(benches);
    std::ostringstream os;
    os << "benchmark round " << rounds << ":";
    for (size_t j = 0; j < benches.size(); ++j)
      os << (j ? "," : "") << " " << parts_[benches[j].pi].solver << " " << format_fixed(ms[j].rep_tokens_per_s.back(), 2);
    os << " tokens/s";
    double worst = 0.0;  // the widest relative CI half-width of the gains (inf while one has none)
    for (size_t j = 0; j < benches.size(); ++j) {
      if (j == ref) continue;
      const auto& rr = benches[ref].rounds;
      const auto& rj = benches[j].rounds;
      auto [ga, gb] = same_rounds(ms[ref].rep_tokens_per_s, rr, ms[j].rep_tokens_per_s, rj);
      auto [da, db] = same_rounds(ms[ref].rep_decode_tokens_per_s, rr, ms[j].rep_decode_tokens_per_s, rj);
      const PairedComparison g = compare_paired(ga, gb);
      const PairedComparison d = compare_paired(da, db);
      os << "; " << parts_[benches[j].pi].solver << "/" << parts_[benches[ref].pi].solver << " so far "
         << format_fixed(g.ratio, 3) << "x";
      for (const PairedComparison* c : {&g, &d}) {
        if (c->n == 0) continue;  // no decode rate (G = 1)
        worst = std::max(worst, std::isnan(c->ci_low) ? std::numeric_limits<double>::infinity() : c->half_width());
      }
      if (!std::isnan(g.ci_low))
        os << " [" << format_fixed(g.ci_low, 3) << ", " << format_fixed(g.ci_high, 3) << "]";
      if (d.n > 0) {  // --target-ci waits for the decode gain's CI too: show it
        os << ", decode " << format_fixed(d.ratio, 3) << "x";
        if (!std::isnan(d.ci_low)) os << " [" << format_fixed(d.ci_low, 3) << ", " << format_fixed(d.ci_high, 3) << "]";
      }
    }
    const double left = opt_.max_time_s - elapsed_s;
    os << " (" << format_fixed(elapsed_s, 0) << " s of --max-time " << format_fixed(opt_.max_time_s, 0) << ")";
    progress_.say(os.str());
    const std::string hw = std::isfinite(worst) ? "+-" + format_fixed(100.0 * worst, 1) + "%"
                                                : "not every gain has one yet (fewer than " +
                                                      std::to_string(kMinPairsForCI) + " paired rounds)";
    int fewest = rounds;  // rounds of the partition that joined last
    for (const Bench& b : benches) fewest = std::min(fewest, static_cast<int>(b.rounds.size()));
    if (fewest < opt_.iters) return "";  // --iters rounds of every partition, whatever the time
    if (adaptive_pending()) {
      if (round_s <= left) return "";
      return "--max-time " + format_fixed(opt_.max_time_s, 0) +
             " s: another round would end after it, before the adaptive split converged; widest gain CI " + hw;
    }
    if (benches.size() < 2) return "--iters rounds done (one split: no gain to narrow)";
    if (opt_.target_ci_pct <= 0) return "--iters rounds done (--target-ci 0); widest gain CI " + hw;
    if (worst <= opt_.target_ci_pct / 100.0)
      return "every gain's 95% CI within " + hw + " (--target-ci " + format_fixed(opt_.target_ci_pct, 1) + "%)";
    if (round_s > left) return "--max-time " + format_fixed(opt_.max_time_s, 0) + " s: another round would end after it; widest gain CI " + hw;
    if (rounds >= kMaxRounds) return std::to_string(kMaxRounds) + " rounds (the most); widest gain CI " + hw;
    return "";
  }

  static constexpr int kMaxRounds = 10000;
  static constexpr int kMaxAdaptiveSolves = 3;

  /// "adaptive" for the first adaptive split, then "adaptive_2", "adaptive_3".
  std::string next_adaptive_name() const {
    const auto n = std::count_if(parts_.begin(), parts_.end(),
                                 [](const balance::Partition& q) { return q.solver.rfind("adaptive", 0) == 0; });
    return n == 0 ? std::string("adaptive") : "adaptive_" + std::to_string(n + 1);
  }

  /// Whether --partition adaptive still has a solve to make.
  bool adaptive_pending() const { return adaptive_ && !adaptive_done_; }

  /// Rank 0: the next adaptive solve is due once every partition has max(--iters, 2) rounds.
  bool adaptive_due(const std::vector<Bench>& benches) const {
    for (const Bench& b : benches)
      if (static_cast<int>(b.rounds.size()) < std::max(opt_.iters, 2)) return false;
    return true;
  }

  /// Rank 0: calibrates the profile by every partition's measured stages (each rank's mean
  /// prefill and decode step against the profile's prediction, balance/calibrate.h), solves
  /// the balanced split from the calibrated table, and returns it (S first units, then S device
  /// ranks) when it is a split not measured yet; else records that the adaptive split converged
  /// and returns {}. The new partition's record (predictions from the calibrated profile) is
  /// appended to run_.partitions.
  std::vector<int> solve_adaptive(const std::vector<Bench>& benches, const std::vector<std::vector<double>>& events) {
    ++adaptive_solves_;
    std::vector<balance::StageMeasurement> stages;
    std::vector<std::string> from;
    for (size_t j = 0; j < benches.size(); ++j) {
      const balance::Partition& p = parts_[benches[j].pi];
      if (p.tensor_parallel()) continue;  // calibrates the ranks' own rows: one rank per stage only
      from.push_back(p.solver);
      const auto m = balance::stage_measurements(*predictor_, p, run_.profile, events[j]);
      stages.insert(stages.end(), m.begin(), m.end());
    }
    const std::vector<double> factors = balance::calibration_factors(stages, S_);
    RunRecord calibrated = run_;
    calibrated.profile = balance::calibrated_profile(run_.profile, factors, objective_, opt_.gen_len);
    std::ostringstream fs;
    for (int r = 0; r < S_; ++r)
      fs << (r ? ", " : "") << "rank " << r << " x" << format_fixed(factors[2 * r], 2) << "/x"
         << format_fixed(factors[2 * r + 1], 2);
    balance::SplitRequest req;
    req.method = balance::Method::balanced;
    req.stages = S_;
    req.order = opt_.order == "auto" ? balance::OrderMode::automatic : balance::OrderMode::rank;
    const balance::BalanceProblem prob = balance::problem_from_run(calibrated, objective_);
    balance::Partition p = balance::make_split(prob, req);
    for (const balance::Partition& q : parts_) {
      if (balance::compare_splits(q, p, equivalence_) != balance::Sameness::different) {
        adaptive_done_ = true;
        run_.adaptive_status = "converged after " + std::to_string(adaptive_solves_) + " solve(s): the profile calibrated by " +
                               "the pipeline (prefill/decode factors: " + fs.str() + ") gives " + q.solver +
                               "'s split " + q.counts_string();
        progress_.say("adaptive: " + run_.adaptive_status);
        return {};
      }
    }
    if (adaptive_solves_ >= kMaxAdaptiveSolves) adaptive_done_ = true;  // this one is the last
    p.solver = next_adaptive_name();
    PartitionRecord pr = describe_partition(p, calibrated.profile);
    pr.calibration_factor = factors;
    pr.calibrated_from = from;
    pr.solved_after_round = static_cast<int>(benches.front().rounds.size());
    run_.partitions.push_back(pr);
    run_.adaptive_status = std::to_string(adaptive_solves_) + " solve(s); the last gave " + p.solver + " " +
                           p.counts_string() + " from the profile calibrated by " + fs.str() +
                           (adaptive_done_ ? " (the most solves)" : "");
    progress_.say("adaptive: calibrated by the pipeline (prefill/decode factors: " + fs.str() + "): split " +
                  p.counts_string() + ", predicted bottleneck " + format_fixed(pr.predicted_bottleneck_ms, 2) + " ms");
    std::vector<int> flat;
    for (int k = 0; k < S_; ++k) flat.push_back(p.first_unit[k]);
    for (int k = 0; k < S_; ++k) flat.push_back(p.device_rank[k]);
    return flat;
  }

  /// Rank 0: every measured partition against uniform (paired by round), and the run's
  /// balanced-vs-uniform gain with its CI and verdict.
  void compare_partitions() {
    const PartitionRecord* uni = nullptr;
    for (const auto& pr : run_.partitions)
      if (pr.name == "uniform" && pr.measured) uni = &pr;
    if (!uni) return;
    for (auto& pr : run_.partitions) {
      if (&pr == uni || !pr.measured) continue;
      if (pr.same_as == "uniform") {
        const int n = static_cast<int>(uni->rep_tokens_per_s.size());
        pr.gain = PairedComparison{1.0, 1.0, 1.0, n};
        pr.decode_gain = PairedComparison{1.0, 1.0, 1.0, n};
        pr.gain_verdict = pr.decode_gain_verdict = "same split";
        continue;
      }
      // A partition sharing another's measurement pairs like that one.
      auto [ga, gb] = same_rounds(uni->rep_tokens_per_s, uni->rep_round, pr.rep_tokens_per_s, pr.rep_round);
      auto [da, db] = same_rounds(uni->rep_decode_tokens_per_s, uni->rep_round, pr.rep_decode_tokens_per_s, pr.rep_round);
      pr.gain = compare_paired(ga, gb);
      pr.decode_gain = compare_paired(da, db);
      pr.gain_verdict = comparison_verdict(pr.gain);
      pr.decode_gain_verdict = comparison_verdict(pr.decode_gain);
    }
  }

  /// Rank 0, after the benchmark: every measured partition of one rank per stage predicted again,
  /// cross-calibrated (issue 13, balance::cross_calibrate); a failure costs only these
  /// predictions (warned).
  void cross_calibrate_partitions() {
    std::vector<std::string> warnings;
    try {
      balance::cross_calibrate(*predictor_, run_, warnings);
    } catch (const std::exception& e) {
      warnings.push_back(std::string("the cross-calibrated predictions failed: ") + e.what());
    }
    warn(warnings);
  }

  /// Partition `pi` is the same split as the earlier partition `of`, identical or equivalent
  /// (the same stages on identical devices in another order: balance::compare_splits): it shares
  /// that measurement (and so a gain of exactly 1) instead of being benchmarked again, which
  /// would only measure the machine's noise between two runs of one split. An equivalent one is
  /// stored as the split that was measured, the solver's own in solver_split.
  void share_measurement(size_t pi, size_t of) {
    const bool identical = balance::compare_splits(parts_[of], parts_[pi], equivalence_) == balance::Sameness::identical;
    if (root_) {
      PartitionRecord shared = run_.partitions[of];
      shared.name = run_.partitions[pi].name;
      shared.solver = run_.partitions[pi].solver;
      shared.same_as = run_.partitions[of].name;
      shared.same_as_reason = identical ? "identical" : "equivalent";
      if (!identical) shared.solver_split = split_text(parts_[pi]);
      run_.partitions[pi] = std::move(shared);
    }
    progress_.say("partition " + parts_[pi].solver + ": " +
                  (identical ? "the same split as " + parts_[of].solver + " (" + parts_[pi].counts_string() + ")"
                             : split_text(parts_[pi]) + " is " + parts_[of].solver + "'s " + split_text(parts_[of]) +
                                   " with identical devices' stages in another order") +
                  ", measured once");
    phase("write after partition " + parts_[pi].solver, [&] { snapshot("benchmark"); });
  }

  /// Gathers partition `pi`'s timeline, tokens and checksums on rank 0 (rank 0's clock, seconds
  /// since the run started), validates and computes its metrics (DESIGN.md §3).
  /// Collective: partition `p`'s events of every stage on rank 0, [reps][M][G+1][S][6] seconds
  /// since the run started on rank 0's clock (empty on the other ranks).
  std::vector<double> gather_events(const balance::Partition& p, const StageRecord& rec) const {
    const auto ev_all = mpi_.gatherv_doubles(rec.events);
    if (!root_) return {};
    const int reps = reps_of(rec);
    const int steps = opt_.gen_len + 1;
    const int S = p.num_stages();
    const EventShape sh{reps, M_, steps, S};
    // A tensor-parallel stage's timeline is its first rank's (the group computes in lockstep).
    std::vector<double> events(static_cast<size_t>(reps) * M_ * steps * S * kNumEvents, std::nan(""));
    for (int k = 0; k < S; ++k) {
      const int r = p.device_rank[k];
      const auto& e = ev_all[r];
      for (int it = 0; it < reps; ++it)
        for (int g = 0; g < M_; ++g)
          for (int t = 0; t < steps; ++t)
            for (int x = 0; x < kNumEvents; ++x) {
              const double v = e[(((static_cast<size_t>(it) * M_ + g) * steps + t) * kNumEvents) + x];
              events[sh.index(it, g, t, k, x)] = v - offsets_[r] - run_.run_start_s;
            }
    }
    return events;
  }

  /// Collective: the tokens each expert of each MoE layer received in partition `p`'s last timed
  /// repetition (StageRecord::expert_tokens of the first rank of each stage), into
  /// run_.expert_tokens on rank 0 ([layers + MTP modules][max experts]).
  void gather_expert_tokens(const balance::Partition& p, const StageRecord& rec) {
    std::vector<double> mine;  // per MoE layer: layer, experts, counts...
    for (const auto& row : rec.expert_tokens) {
      mine.push_back(static_cast<double>(row[0]));
      mine.push_back(static_cast<double>(row.size() - 1));
      for (size_t i = 1; i < row.size(); ++i) mine.push_back(static_cast<double>(row[i]));
    }
    const auto all = mpi_.gatherv_doubles(mine);
    if (!root_) return;
    int cols = 0;
    for (const model::LayerShape& l : spec_.layers) cols = std::max(cols, l.moe.n_experts);
    if (cols == 0) return;
    const int rows = spec_.n_layers + (spec_.mtp ? spec_.mtp_modules : 0);
    run_.expert_rows = rows;
    run_.expert_cols = cols;
    run_.expert_skew = opt_.expert_skew;
    run_.expert_tokens_partition = p.solver;
    run_.expert_tokens.assign(static_cast<size_t>(rows) * cols, 0);
    for (int k = 0; k < p.num_stages(); ++k) {
      const auto& v = all[p.device_rank[k]];
      for (size_t i = 0; i + 1 < v.size();) {
        const int layer = static_cast<int>(v[i]), n = static_cast<int>(v[i + 1]);
        for (int e = 0; e < n && layer < rows && e < cols; ++e)
          run_.expert_tokens[static_cast<size_t>(layer) * cols + e] = static_cast<int64_t>(v[i + 2 + e]);
        i += 2 + static_cast<size_t>(n);
      }
    }
  }

  /// Collective: partition `pi`'s record on rank 0 from every rank's `rec` (its repetitions so
  /// far, one per round in `rounds`) and `ref` (the serialized run). Called after every round
  /// (final = false: no validation yet, nothing printed) and once at the end (final = true).
  void gather_partition(size_t pi, const StageRecord& rec, const StageRecord& ref, const std::vector<int>& rounds,
                        bool final) {
    const balance::Partition& p = parts_[pi];
    std::vector<double> events = gather_events(p, rec);
    const std::vector<int> toks_mine(rec.tokens.begin(), rec.tokens.end());
    const std::vector<int> ref_mine(ref.tokens.begin(), ref.tokens.end());
    const auto toks_all = mpi_.gatherv_ints(toks_mine);
    const auto ref_all = mpi_.gatherv_ints(ref_mine);
    const auto sums = mpi_.gather_doubles({rec.checksum, ref.checksum, rec.compute_lane_cpu_s, rec.recv_lane_cpu_s,
                                           rec.send_lane_cpu_s, rec.timed_wall_s});
    if (final && pi == 0) gather_expert_tokens(p, rec);
    if (!root_) return;
    PartitionRecord& pr = run_.partitions[pi];
    const int S = p.num_stages();
    const EventShape sh{reps_of(rec), M_, opt_.gen_len + 1, S};
    pr.events = std::move(events);
    pr.lane_cpu_s.clear();
    pr.stage_compute_ms.clear();
    pr.measured_stage_ms.clear();
    pr.stage_compute_mean_ms.clear();
    pr.measured_stage_mean_ms.clear();
    for (int k = 0; k < S; ++k) {
      const int r = p.device_rank[k];
      pr.lane_cpu_s.push_back(sums[r * 6 + 2]);
      pr.lane_cpu_s.push_back(sums[r * 6 + 3]);
      pr.lane_cpu_s.push_back(sums[r * 6 + 4]);
    }
    pr.timed_wall_s = sums[p.device_rank[0] * 6 + 5];
    const int lr = p.device_rank[S - 1];
    pr.tokens.assign(toks_all[lr].begin(), toks_all[lr].end());
    pr.reference_tokens.assign(ref_all[lr].begin(), ref_all[lr].end());
    pr.checksum = sums[lr * 6 + 0];
    pr.reference_checksum = sums[lr * 6 + 1];
    // Every rank of a tensor-parallel last stage samples the tokens: they must agree, bit for bit.
    bool group_agrees = true;
    for (int r = lr + 1; r < lr + p.width(S - 1); ++r)
      group_agrees = group_agrees && toks_all[r] == toks_all[lr] && sums[r * 6] == sums[lr * 6];
    if (!group_agrees && final)
      std::cerr << "ppbench: partition " << p.solver << ": the ranks of the last stage sampled different tokens" << std::endl;
    pr.validated = final && opt_.validate;
    pr.tokens_match = pr.validated && pr.tokens == pr.reference_tokens && group_agrees;
    pr.checksum_match = pr.validated && pr.checksum == pr.reference_checksum;
    // Across partitions and layouts: the same tokens, and the same final hidden states but for
    // the order of the tensor-parallel sums (fp32: within kLayoutChecksumTol relative).
    const PartitionRecord& first = run_.partitions[0];
    pr.tokens_differing_first_partition = 0;
    for (size_t i = 0; i < pr.tokens.size(); ++i)
      pr.tokens_differing_first_partition += i >= first.tokens.size() || pr.tokens[i] != first.tokens[i] ? 1 : 0;
    pr.checksum_rel_diff_first_partition = first.checksum != 0.0 ? std::fabs(pr.checksum / first.checksum - 1.0) : 0.0;
    // Judged in f32 and within a layout (the same sums in the same order); across layouts in
    // f16/bf16 the reordered sums round at 2^-8: reported, not judged.
    const bool judged = dtype_ == DType::f32 || pr.layout == first.layout;
    pr.tokens_match_first_partition =
        group_agrees && (!judged || (pr.tokens == first.tokens && pr.checksum_rel_diff_first_partition <= kLayoutChecksumTol));
    const auto m = compute_metrics(pr.events, sh, opt_.batch, opt_.gen_len);
    for (int k = 0; k < S; ++k) {
      pr.stage_compute_ms.push_back(m.stage_prefill_ms[k]);
      pr.stage_compute_ms.push_back(m.stage_decode_ms[k]);
    }
    pr.stage_workload_ms = m.stage_workload_ms;
    for (int k = 0; k < S; ++k)  // measured stage cost in the balancer's objective
      pr.measured_stage_ms.push_back(objective_ == balance::Objective::decode    ? m.stage_decode_ms[k]
                                     : objective_ == balance::Objective::prefill ? m.stage_prefill_ms[k]
                                                                                 : m.stage_workload_ms[k]);
    for (int k = 0; k < S; ++k) {
      pr.stage_compute_mean_ms.push_back(m.stage_prefill_mean_ms[k]);
      pr.stage_compute_mean_ms.push_back(m.stage_decode_mean_ms[k]);
      pr.measured_stage_mean_ms.push_back(
          balance::objective_cost(objective_, m.stage_prefill_mean_ms[k], m.stage_decode_mean_ms[k], opt_.gen_len));
    }
    pr.bubble_fraction = m.bubble_fraction;
    pr.recv_wait_ms = m.recv_wait_ms;
    pr.rep_wall_s = m.rep_wall_s;
    pr.rep_tokens_per_s = m.rep_tokens_per_s;
    pr.rep_round = rounds;
    pr.rep_decode_tokens_per_s = m.rep_decode_tokens_per_s;
    pr.rep_ttft_p50_ms = m.rep_ttft_p50_ms;
    pr.rep_tpot_p50_ms = m.rep_tpot_p50_ms;
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
    {
      std::vector<std::string> warnings;
      balance::add_simulated_metrics(*predictor_, p, pr, m.decode_tokens_per_s, balance::rounds_profile(run_), warnings);
      warn(warnings);
    }
    pr.measured = true;
    if (final)
      progress_.say("benchmark " + p.solver + ": " + format_fixed(m.tokens_per_s, 2) + " tokens/s, validation " +
                  (!pr.validated ? "skipped" : pr.tokens_match && pr.checksum_match ? "OK" : "FAILED"));
  }

  // ---- 6./7. summary and results file -----------------------------------------------------------

  int finish() {
    phase("write", [&] {
      if (!root_) return;
      const PartitionRecord* uni = nullptr;
      const PartitionRecord* bal = nullptr;
      bool failed = false, all_validated = true;
      for (auto& pr : run_.partitions) {
        failed = failed || !pr.tokens_match_first_partition || (pr.validated && !(pr.tokens_match && pr.checksum_match));
        all_validated = all_validated && pr.validated;
        if (pr.name == "uniform") uni = &pr;
        if (pr.name == "balanced") bal = &pr;
      }
      if (uni && bal) {
        run_.balance_gain = bal->metrics.at("tokens_per_s") / uni->metrics.at("tokens_per_s");
        run_.decode_balance_gain = bal->metrics.at("decode_tokens_per_s") / uni->metrics.at("decode_tokens_per_s");
        run_.balance_cmp = bal->gain;
        run_.decode_balance_cmp = bal->decode_gain;
        run_.balance_verdict = bal->gain_verdict;
        run_.decode_balance_verdict = bal->decode_gain_verdict;
      }
      run_.validation = failed ? "failed" : all_validated ? "ok" : "skipped";
      run_.validation_ok = run_.validation == "ok";
      run_.elapsed_s = monotonic_s() - run_.run_start_s;
      run_.status = "complete";
      write_results(output_, run_);
      print_summary(std::cout, run_);
      std::cout << "results: " << output_ << std::endl;
    });
    return mpi_.agree(root_ && run_.validation == "failed" ? 1 : 0);
  }

  const MpiContext& mpi_;
  const RunOptions& opt_;
  const int S_;      ///< ranks (= stages of the layout of one rank per stage)
  const bool root_;  ///< rank 0: solves, gathers, writes
  Progress progress_;
  RunRecord run_;  ///< rank 0's record of the run (what the file holds)
  FailurePolicy policy_;
  model::ModelSpec spec_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Transport> transport_;
  std::vector<std::string> partition_names_;
  /// --tp: the layouts measured, each the widths of its stages (all 1: one rank per stage).
  std::vector<std::vector<int>> layouts_;
  bool tp_auto_ = false;         ///< --tp auto: the balancer adds the layout it picks
  std::vector<int> auto_widths_;  ///< widths > 1 --tp auto may use (profiled; the heads allow them)
  std::vector<balance::Partition> parts_;  ///< in run order, on every rank
  /// Unit signatures and the ranks' device classes, on every rank: splits that are the same up
  /// to swapping identical devices are benchmarked once (balance::compare_splits).
  balance::SplitEquivalence equivalence_;
  std::string output_;
  DType dtype_ = DType::f32;
  balance::Objective objective_ = balance::Objective::workload;
  bool use_cuda_ = false;
  bool adaptive_ = false;       ///< --partition adaptive: calibrate and re-solve during the rounds
  bool two_passes_ = false;     ///< the profile had an alone and a together pass (ranks sharing memory)
  bool adaptive_done_ = false;  ///< the adaptive split converged (or reached the most solves)
  int adaptive_solves_ = 0;
  int M_ = 0;                         ///< request groups in flight
  size_t memory_limit_ = 0;           ///< this rank's bytes
  std::vector<double> memory_limits_;  ///< [R] every rank's, gathered
  std::vector<double> offsets_;        ///< [R] clock offsets to rank 0, s
  std::unique_ptr<balance::Predictor> predictor_;  ///< rank 0, from the partitions on: the run's predictions
  Watchdog watchdog_;  ///< last: see the constructor
};

}  // namespace

int run_job(const MpiContext& mpi, const RunOptions& opt) { return RunJob(mpi, opt).run(); }

}  // namespace ppb
