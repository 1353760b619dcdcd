// CUDA lanes and events: Lane = a cudaStreamNonBlocking stream, Event = a cudaEvent_t.
//
// record/wait are cudaEventRecord/cudaStreamWaitEvent, so cross-lane dependencies never touch
// the host. host_task(fn) is stream-ordered but does NOT run fn inside cudaLaunchHostFunc: CUDA
// may serialise the host functions of all streams on one internal thread, so a host function
// that blocks (an MPI receive polling for its peer) would stall every other lane's host
// functions, and the send that the peer is waiting for never leaves: a deadlock. Instead the
// lane owns a worker thread (like CpuLane): a cudaLaunchHostFunc trampoline only hands fn to the
// worker (never blocks), and the stream then waits (cuStreamWaitValue32 on a mapped pinned
// counter; a one-thread spin kernel where stream memory operations are unavailable) until the
// worker has run fn and published its sequence number. Later work of the stream starts after fn.
//
// Event times: cudaEventElapsedTime from a reference event recorded at a known host time
// (ClockAnchor), mapped onto monotonic_s(). The anchor is made when the device is created and
// refreshed (older than 10 s: the float milliseconds stay precise to ~1 µs) only in
// synchronize(), never inside record(): a record may run inside a held lane, and the anchor's
// own event could queue behind the held stream (more streams than hardware queues). An anchor
// replaces the current one when its event completed within kMaxAnchorGapS of being recorded,
// or when its error bound (half that gap) is below the current one's, which grows with age
// (half its gap + the float milliseconds' rounding, 2^-24 of the elapsed time).
//
// The flight recorder (common/flight_recorder.h) sees a CUDA lane's host tasks (running, queued
// on the worker, the last ones); the stream's kernels, copies and event waits are not recorded
// (knowing which has run would need an event per operation), nor host tasks still waiting in
// the stream for their trampoline: a report says the lane's host side is idle while its stream
// may still be busy.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_raii.h"
#include "backend/lane.h"
#include "common/flight_recorder.h"

namespace ppb::cuda {

/// A reference event and the monotonic_s() time at which it completed (±~2 µs).
struct ClockAnchor {
  EventHandle event;
  double host_s = 0.0;
};

/// The widest accepted gap between recording an anchor's event and seeing it complete: the
/// anchor's error is at most half of it.
inline constexpr double kMaxAnchorGapS = 50e-6;

/// Makes and refreshes clock anchors of one device (thread-safe).
class DeviceClock {
 public:
  /// Makes the first anchor (tries until one is within kMaxAnchorGapS, up to a second; then the
  /// tightest seen). @throws ppb::InternalError on a failing CUDA call.
  explicit DeviceClock(int device);
  /// The current anchor; never synchronizes (record() calls it).
  std::shared_ptr<const ClockAnchor> anchor();
  /// Re-anchors when the current anchor is older than `max_age_s` and a new one is within
  /// kMaxAnchorGapS (else the current one stays). Call where the host waits anyway
  /// (CudaLane::synchronize), never inside a held lane.
  void refresh(double max_age_s = 10.0);
  /// Gap of the current anchor (its error is at most half of it), seconds.
  double gap_s();

 private:
  /// The tightest of up to `tries` anchors, stopping at the first within kMaxAnchorGapS.
  std::shared_ptr<ClockAnchor> make_anchor(int tries, double* gap);
  int device_ = 0;
  Stream stream_;  ///< idle stream used only to time anchors
  std::mutex mutex_;
  std::shared_ptr<const ClockAnchor> current_;
  double current_gap_s_ = 0.0;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int device, std::shared_ptr<DeviceClock> clock);
  void synchronize() override;
  double time_s() const override;
  cudaEvent_t get() const { return event_.get(); }
  /// Called by CudaLane::record: the anchor this record is timed against.
  void set_anchor(std::shared_ptr<const ClockAnchor> a) {
    anchor_ = std::move(a);
    recorded_ = true;
  }
  bool recorded() const { return recorded_; }

 private:
  int device_ = 0;
  std::shared_ptr<DeviceClock> clock_;
  EventHandle event_;
  std::shared_ptr<const ClockAnchor> anchor_;
  bool recorded_ = false;
};

class CudaLane final : public Lane {
 public:
  CudaLane(int device, std::string name, std::shared_ptr<DeviceClock> clock);
  ~CudaLane() override;
  CudaLane(const CudaLane&) = delete;
  CudaLane& operator=(const CudaLane&) = delete;

  const std::string& name() const override { return name_; }
  void record(Event& ev) override;
  void wait(const Event& ev) override;
  void host_task(std::function<void()> fn) override;
  /// cudaMemcpyAsync(cudaMemcpyDefault). Pageable host memory is staged through a pinned buffer
  /// of the lane (a direct async copy to pageable memory would block the enqueuing thread).
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;
  double cpu_time_s() const override { return -1.0; }

  /// The stream, for kernels, cuBLAS and NCCL.
  cudaStream_t stream() const { return stream_.get(); }
  int device() const { return device_; }

 private:
  struct Task {
    uint32_t seq = 0;
    std::function<void()> fn;
    flight::Task what;
  };
  /// The worker's queue, shared with the trampolines still pending in the stream, so that one
  /// firing after the lane was destroyed (on abort) queues into live memory.
  struct TaskQueue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Task> tasks;
    bool stop = false;
  };
  static void CUDART_CB trampoline(void* arg);
  void worker();
  void set_error(std::exception_ptr err);
  void stream_wait_counter(uint32_t value);
  void* staging(size_t bytes);
  /// The flight recorder's view of the worker's queue (try-lock: never blocks a report).
  flight::QueueView queued(size_t max);

  int device_ = 0;
  std::string name_;
  std::shared_ptr<DeviceClock> clock_;
  Stream stream_;
  PinnedMemory counter_;              ///< uint32, mapped: the last finished host task
  void* counter_dev_ = nullptr;
  uint32_t issued_ = 0;               ///< last host task sequence number enqueued
  std::vector<PinnedMemory> staging_; ///< back() is current; older ones may still be in flight

  std::shared_ptr<TaskQueue> queue_ = std::make_shared<TaskQueue>();
  std::shared_ptr<flight::LaneLog> log_;
  std::mutex mutex_;  ///< guards error_
  std::exception_ptr error_;
  std::thread thread_;
};

/// The CudaLane behind `lane`. @throws ppb::InternalError if `lane` is not a CUDA lane.
CudaLane& as_cuda_lane(Lane& lane);

}  // namespace ppb::cuda
