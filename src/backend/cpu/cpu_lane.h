// CPU lanes and events: the stream/event semantics of CUDA on worker threads.
//
// A CpuLane owns one thread that runs enqueued tasks in order. record(ev) enqueues a task that
// completes a fresh event state (so, as with cudaEventRecord, a later record() re-arms the event
// without disturbing waits already enqueued on the previous state); wait(ev) enqueues a task
// that blocks the lane until that state completes. Blocking waits sleep on a condition variable:
// a waiting lane never spins a core away from compute. Each task carries the flight recorder's
// tag of its enqueuer (common/flight_recorder.h); the lane logs the task it runs and its last.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/lane.h"
#include "common/flight_recorder.h"

namespace ppb {

/// Completion state of one record() of a CpuEvent.
struct CpuEventState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  double time_s = 0.0;  ///< monotonic_s() at completion
  flight::Tag tag;      ///< what was enqueued when it was recorded (the flight recorder's)
  int lane = -1;        ///< the recording lane's flight::LaneLog id
  void complete();
  /// Blocks until done; throws InternalError if lane abort was requested meanwhile.
  void wait();
};

class CpuEvent final : public Event {
 public:
  void synchronize() override;
  double time_s() const override;
  std::shared_ptr<CpuEventState> state;  ///< state of the last record(); null if never recorded
};

class CpuLane final : public Lane {
 public:
  explicit CpuLane(std::string name);
  ~CpuLane() override;
  CpuLane(const CpuLane&) = delete;
  CpuLane& operator=(const CpuLane&) = delete;

  const std::string& name() const override { return name_; }
  void record(Event& ev) override;
  void wait(const Event& ev) override;
  void host_task(std::function<void()> fn) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;
  double cpu_time_s() const override;

 private:
  struct Entry {
    std::function<void()> fn;
    flight::Task what;
  };
  void enqueue(std::function<void()> fn, const flight::Task& what);
  void run();
  void set_error(std::exception_ptr err);
  /// The flight recorder's view of the queue (try-lock: never blocks a report).
  flight::QueueView queued(size_t max);

  std::string name_;
  std::shared_ptr<flight::LaneLog> log_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  bool stop_ = false;
  std::exception_ptr error_;  ///< first exception thrown by a task; later tasks are skipped
  clockid_t cpu_clock_{};
  bool have_cpu_clock_ = false;
  std::thread thread_;
};

}  // namespace ppb
