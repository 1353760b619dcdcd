// Lanes, events and buffers: the stream/event half of the backend interface (backend/device.h).
//
// Modelled on ggml-backend and CUDA streams: work is *enqueued* on a Lane and runs in order on
// it; an Event recorded on one lane can be waited on by another. The CPU backend implements
// lanes as worker threads, the CUDA backend as cudaStreamNonBlocking streams.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace ppb {

/// A point in a lane's work. Like cudaEvent_t: record() on a lane captures "everything enqueued
/// so far"; the event completes when that work is done.
class Event {
 public:
  virtual ~Event() = default;
  /// Blocks the calling host thread until the last recorded work is done.
  virtual void synchronize() = 0;
  /// Monotonic time (monotonic_s() base, common/clock.h) at which the event completed; valid
  /// after synchronize().
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

}  // namespace ppb
