// The backend interface: a Device, its Lanes (streams), Events, Buffers and StageExecutors.
//
// Modelled on ggml-backend and CUDA streams: work is *enqueued* on a Lane and runs in order on
// it; an Event recorded on one lane can be waited on by another. The CPU backend implements
// lanes as worker threads, the CUDA backend as cudaStreamNonBlocking streams. The pipeline and
// the profiler only see this header, so they never say "if cuda".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "model/model_spec.h"

namespace ppb {

enum class DType { f32, f16, bf16 };

/// Bytes of one element of `t`.
int dtype_bytes(DType t);
/// "f32", "f16", "bf16".
std::string dtype_name(DType t);
/// Parses "f32"/"fp32"/"float32", "f16"/"fp16"/"float16", "bf16"/"bfloat16".
/// @throws ppb::UserError naming the valid values.
DType parse_dtype(const std::string& s);

/// Seconds on this process's monotonic clock (CLOCK_MONOTONIC); the common time base of
/// events before they are mapped onto rank 0's clock.
double monotonic_s();

/// A point in a lane's work. Like cudaEvent_t: record() on a lane captures "everything enqueued
/// so far"; the event completes when that work is done.
class Event {
 public:
  virtual ~Event() = default;
  /// Blocks the calling host thread until the last recorded work is done.
  virtual void synchronize() = 0;
  /// Monotonic time (monotonic_s() base) at which the event completed; valid after synchronize().
  virtual double time_s() const = 0;
};

/// An in-order work queue (a CUDA stream, or a CPU worker thread).
class Lane {
 public:
  virtual ~Lane() = default;
  virtual const std::string& name() const = 0;
  /// Enqueues `ev` completing when all work enqueued so far on this lane is done.
  virtual void record(Event& ev) = 0;
  /// Work enqueued after this call starts only once `ev`'s last record() has completed.
  virtual void wait(const Event& ev) = 0;
  /// Enqueues a host function, stream-ordered (CPU: runs on the lane's thread; CUDA: on the
  /// lane's worker thread while the stream waits for it, see cuda_lane.h).
  virtual void host_task(std::function<void()> fn) = 0;
  /// Enqueues a copy of `bytes` from `src` to `dst` (device or host pointers of this device).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  /// Blocks until everything enqueued so far is done; rethrows the first exception a task threw.
  virtual void synchronize() = 0;
  /// CPU seconds the lane's own thread has consumed (CLOCK_THREAD_CPUTIME_ID), -1 if unknown.
  virtual double cpu_time_s() const = 0;
};

/// A device-memory (or host-memory on CPU) allocation, freed on destruction.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  /// Copies host memory into the buffer (synchronous).
  virtual void upload(const void* host, size_t bytes, size_t offset = 0) = 0;
  /// Copies the buffer into host memory (synchronous).
  virtual void download(void* host, size_t bytes, size_t offset = 0) const = 0;
};

/// Shape of the work a stage is built for.
struct StageConfig {
  int batch = 1;        ///< B sequences per request group (micro-batch)
  int max_context = 0;  ///< KV-cache capacity per sequence (prompt_len + gen_len)
  int groups = 1;       ///< request groups in flight, each with its own KV cache
  DType dtype = DType::f32;
  uint64_t seed = 0;    ///< weights are a pure function of (seed, unit index)
};

/// Bytes a stage allocates (cpu_stage_bytes, cuda_stage_bytes): computed before anything is
/// allocated, to check --memory-limit.
struct StageBytes {
  size_t weights = 0;
  size_t kv_cache = 0;
  size_t scratch = 0;  ///< activations, attention and library workspace
  size_t total() const { return weights + kv_cache + scratch; }
};

/// The units [first, last] of a model, instantiated on a device with weights and KV caches.
///
/// Input of a forward: int32 token ids [B, T] if the stage holds `embed`, else activations
/// [B, T, hidden] in the stage dtype. Output: int32 greedy token ids [B] if it holds `head`
/// (the last position of each sequence), else activations [B, T, hidden].
class StageExecutor {
 public:
  virtual ~StageExecutor() = default;
  virtual int first_unit() const = 0;
  virtual int last_unit() const = 0;
  /// Bytes of the input / output of one forward of T tokens per sequence.
  virtual size_t input_bytes(int tokens) const = 0;
  virtual size_t output_bytes(int tokens) const = 0;
  /// Enqueues one forward on `lane`: group `group` (its own KV cache), T = `tokens` new tokens
  /// per sequence at positions [pos, pos + T). Prefill: pos = 0, T = prompt_len. Decode:
  /// pos = current length, T = 1. Writes K/V of the new positions into the group's cache.
  /// `in`/`out` are device pointers that stay valid until the enqueued work completes.
  virtual void enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos,
                               int tokens) = 0;
  /// Sum (in double) of the final hidden states entering the head, over every forward since
  /// the last reset_checksum(); 0 if the stage has no head. Call after the lane synchronised.
  virtual double checksum() const = 0;
  virtual void reset_checksum() = 0;
  /// Resident weight bytes and KV-cache bytes of the stage.
  virtual size_t weight_bytes() const = 0;
  virtual size_t kv_cache_bytes() const = 0;
};

/// A compute device (one CPU rank's share, or one GPU).
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string backend() const = 0;  ///< "cpu" or "cuda"
  virtual std::string name() const = 0;     ///< e.g. "Intel Xeon ... (1 BLAS thread)", "NVIDIA H200"
  virtual std::string bus_id() const = 0;   ///< PCI bus id, "" on CPU
  virtual size_t free_memory() const = 0;   ///< bytes available for weights + KV cache
  /// Enqueues work on `lane` that evicts the weights of the last forward from the caches, so
  /// that a profiled unit is timed cold, as it runs inside a stage whose weights exceed the
  /// cache (a 63 MB layer profiled alone would otherwise stay in a 480 MB L3).
  /// resident_bytes: the weights the run keeps on the device's cache domain (all stages of the
  /// ranks sharing it); when they fit in the cache, stages run warm and nothing is flushed.
  /// Default: no-op.
  virtual void flush_caches(Lane& lane, size_t resident_bytes) {}
  /// Versions of the libraries the backend computes with ({"openblas": ...}, {"cuda_runtime": ...}).
  virtual std::map<std::string, std::string> library_versions() const { return {}; }
  virtual std::unique_ptr<Lane> create_lane(const std::string& name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual std::unique_ptr<Buffer> allocate(size_t bytes) = 0;
  /// Builds units [first, last] of `model` (inclusive) with deterministic random weights.
  /// @throws ppb::UserError if the dtype is not supported by this backend.
  virtual std::unique_ptr<StageExecutor> create_stage(const model::ModelSpec& model, int first,
                                                      int last, const StageConfig& config) = 0;
};

/// Creates the CPU device. blas_threads > 0 sets OpenBLAS's thread count for this rank;
/// <= 0 keeps OPENBLAS_NUM_THREADS if set, else uses 1 thread (one rank per core is the
/// layout ppbench is launched with on CPUs).
std::unique_ptr<Device> create_cpu_device(int blas_threads = 0);

/// Asks every lane of this process to stop waiting (a lane or peer failed); waits then throw.
/// The first call's `reason` is kept and quoted by the waits it interrupts.
void request_lane_abort(const std::string& reason = "");
/// The reason given to the first request_lane_abort(), "" if none.
std::string lane_abort_reason();
/// True once request_lane_abort() was called.
bool lane_abort_requested();

}  // namespace ppb
