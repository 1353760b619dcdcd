// The backend interface: a Device, its Lanes (streams), Events, Buffers and StageExecutors.
// The pipeline and the profiler only see this interface, so they never say "if cuda"; lane.h
// describes the stream/event model the CPU and CUDA backends implement.
//
// One header per concern; this one declares the Device and includes the rest:
//   dtype.h       DType, dtype_bytes, dtype_name, parse_dtype
//   common/clock.h  monotonic_s, the time base of events
//   lane.h        Event, Lane, Buffer
//   stage.h       StageConfig, StageBytes, StageExecutor
//   lane_abort.h  request_lane_abort, lane_abort_reason, lane_abort_requested
//   memory_pool.h MemoryPool, count_pool_sharers, memory_share
// clock.h and lane_abort.h are not needed by Device; they stay included for the code outside
// backend/ that reaches them through this header. New code includes the narrowest header.
#pragma once

#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/dtype.h"
#include "backend/lane.h"
#include "backend/lane_abort.h"
#include "backend/memory_pool.h"
#include "backend/stage.h"
#include "common/clock.h"

namespace ppb::model {
struct ModelSpec;
}  // namespace ppb::model

namespace ppb {

/// A compute device (one CPU rank's share, or one GPU).
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string backend() const = 0;  ///< "cpu" or "cuda"
  virtual std::string name() const = 0;     ///< e.g. "Intel Xeon ... (1 BLAS thread)", "NVIDIA H200"
  virtual std::string bus_id() const = 0;   ///< PCI bus id, "" on CPU
  virtual size_t free_memory() const = 0;   ///< bytes available for weights + KV cache
  /// The pools this rank's weights + KV cache are allocated from, each with what it has free and
  /// a key naming it within one machine (ranks of a machine whose pools have equal keys draw on
  /// the same memory): memory_share() divides each among its ranks. CPU: the kernel's
  /// MemAvailable ("kernel") and, where a memory cgroup limits the process, its headroom
  /// ("cgroup:<dev>:<inode>" of the limiting directory). Default: free_memory() keyed by the bus id
  /// (a GPU's memory, shared by the ranks on that GPU).
  virtual std::vector<MemoryPool> memory_pools() const { return {{free_memory(), "device:" + bus_id()}}; }
  /// Enqueues work on `lane` that evicts the weights of the last forward from the caches, so
  /// that a profiled unit is timed cold, as it runs inside a stage whose weights exceed the
  /// cache (a 63 MB layer profiled alone would otherwise stay in a 480 MB L3).
  /// resident_bytes: the weights the run keeps on the device's cache domain (all stages of the
  /// ranks sharing it); when they fit in the cache, stages run warm and nothing is flushed.
  /// stage: the stage about to be timed, whose memory (StageExecutor::host_blocks) the CPU
  /// device evicts line by line (backend/cpu/cpu_evict.h: a write stream through the cache does
  /// not evict it); null: a stream through a buffer larger than the cache.
  /// Default: no-op.
  virtual void flush_caches(Lane& lane, size_t resident_bytes, const StageExecutor* stage = nullptr) {}
  /// Whether the ranks of one node compute from one memory (the CPU backend: every rank streams
  /// its weights through the node's memory controllers), so that a stage runs slower while
  /// another stage of its node computes (balance/contention.h). GPUs: false, each has its own
  /// HBM. Decides whether the profile also times every unit alone (ppbench run's two passes).
  virtual bool node_ranks_share_memory() const { return false; }
  /// Streaming read bandwidth of this device in GB/s (1e9 B/s): the memory ceiling of the units'
  /// floors (model::unit_bytes_moved / bandwidth). CPU: cpu::stream_read_GBps over twice the
  /// last-level cache (64..512 MiB) with the rank's threads, i.e. the decode kernel's rate;
  /// CUDA: a 1 GiB device-to-device copy, 2 x bytes / time (HBM serves reads and writes from
  /// one budget). Takes 0.1-1 s and allocates the buffer for the call: run it outside timed
  /// regions. Default: NaN (not measured).
  virtual double measure_read_bandwidth_GBps() { return std::numeric_limits<double>::quiet_NaN(); }
  /// Rate in GFLOP/s (1e9 FLOP/s) of the GEMM the stages run in `dtype`, with their library and
  /// threads: the compute ceiling of the floors. CPU: cpu::gemm_gflops (sgemm 1024^3); CUDA:
  /// the stage's cublasGemmEx at 8192^3 (fp32 accumulation). Default: NaN.
  virtual double measure_gemm_gflops(DType dtype) { return std::numeric_limits<double>::quiet_NaN(); }
  /// Host threads that compute for this device: the CPU backend's BLAS threads; 1 for a GPU
  /// (the thread that launches). For the oversubscription check (results/conditions.h).
  virtual int compute_threads() const { return 1; }
  /// Versions of the libraries the backend computes with ({"openblas": ...}, {"cuda_runtime": ...}).
  virtual std::map<std::string, std::string> library_versions() const { return {}; }
  virtual std::unique_ptr<Lane> create_lane(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual std::unique_ptr<Buffer> allocate(size_t bytes) = 0;
  /// Builds units [first, last] of `model` (inclusive) with deterministic random weights.
  /// It allocates exactly stage_bytes(model, first, last, config) (tested per backend).
  /// @throws ppb::UserError if the dtype is not supported by this backend.
  virtual std::unique_ptr<StageExecutor> create_stage(const model::ModelSpec& model, int first,
                                                      int last, const StageConfig& config) = 0;
  /// The memory model of this backend (the one ppbench uses everywhere, like ggml's
  /// get_alloc_size): bytes a stage of units [first, last] allocates for `config` — weights,
  /// KV cache of config.groups groups, scratch — computed before anything is allocated. The
  /// memory checks, the balancer's per-unit bytes and scratch reserve, and the stage itself
  /// use it. Pure arithmetic; bytes.
  /// @throws ppb::UserError for an invalid unit range or config.
  virtual StageBytes stage_bytes(const model::ModelSpec& model, int first, int last,
                                 const StageConfig& config) const = 0;
};

/// Creates the CPU device. blas_threads > 0 sets OpenBLAS's thread count for this rank;
/// <= 0 keeps OPENBLAS_NUM_THREADS if set, else uses 1 thread (one rank per core is the
/// layout ppbench is launched with on CPUs).
std::unique_ptr<Device> create_cpu_device(int blas_threads = 0);

}  // namespace ppb
