#include "backend/cpu/cpu_lane.h"

#include <pthread.h>
#include <time.h>

#include <cstring>

#include "common/clock.h"
#include "backend/lane_abort.h"
#include "common/error.h"
#include "common/watchdog.h"

namespace ppb {

void CpuEventState::complete() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    time_s = monotonic_s();
    done = true;
  }
  cv.notify_all();
}

void CpuEventState::wait() {
  std::unique_lock<std::mutex> lock(mutex);
  // Wake up now and then to notice an abort (a failed peer) instead of blocking forever.
  while (!cv.wait_for(lock, std::chrono::milliseconds(20), [this] { return done; })) {
    if (lane_abort_requested()) {
      std::string why = lane_abort_reason();
      throw InternalError(why.empty() ? "lane wait aborted: another lane failed" : why);
    }
  }
}

void CpuEvent::synchronize() {
  if (!state) return;
  flight::Waiting waiting("event synchronize", state->tag, state->lane);
  state->wait();
}

double CpuEvent::time_s() const {
  if (!state) return 0.0;
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->time_s;
}

CpuLane::CpuLane(std::string name)
    : name_(std::move(name)), log_(flight::LaneLog::open(name_, [this](size_t max) { return queued(max); })) {
  thread_ = std::thread([this] {
    log_->bind_thread();
    run();
  });
  // The thread's CPU clock, asked from here: the constructor waits for nothing of the thread.
  // It used to wait for the thread to report its clock through a condition variable on this
  // constructor's stack, notified after the lock was released: a constructor that took the lock
  // in between saw the flag, returned and reused that stack before the notify ran, and the lane
  // thread then blocked for good in pthread_cond_broadcast on the garbage there, never running a
  // task (the rare hang of issue 35, item 9: caught in a stack dump of a run stalled in a profile
  // cycle under load; tests/unit/test_cpu_lane_start.cpp makes that interleaving happen every time).
  have_cpu_clock_ = pthread_getcpuclockid(thread_.native_handle(), &cpu_clock_) == 0;
}

CpuLane::~CpuLane() {
  log_->close();  // first: the report must not call queued() on a lane being destroyed
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CpuLane::enqueue(std::function<void()> fn, const flight::Task& what) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(fn), what});
  }
  cv_.notify_one();
}

flight::QueueView CpuLane::queued(size_t max) {
  flight::QueueView v;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  for (int i = 0; i < 50 && !lock.owns_lock(); ++i) {
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
    lock.try_lock();
  }
  if (!lock.owns_lock()) {
    v.busy = true;
    return v;
  }
  v.count = queue_.size();
  for (size_t i = 0; i < queue_.size() && i < max; ++i) v.first.push_back(queue_[i].what);
  return v;
}

void CpuLane::run() {
  for (;;) {
    Entry task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    log_->start(task.what);
    {
      flight::Scope scope(task.what.tag);  // what the task enqueues or waits for is its item's
      task.fn();
    }
    log_->finish();
    heartbeat();  // a finished task is progress (see common/watchdog.h)
  }
}

void CpuLane::record(Event& ev) {
  auto& cpu_ev = dynamic_cast<CpuEvent&>(ev);
  auto state = std::make_shared<CpuEventState>();
  state->tag = flight::current();
  state->lane = log_->id();
  cpu_ev.state = state;
  // Events always complete, even after a task failed, so that no other lane waits forever.
  enqueue([state] { state->complete(); }, {"record", state->tag});
}

void CpuLane::wait(const Event& ev) {
  const auto& cpu_ev = dynamic_cast<const CpuEvent&>(ev);
  auto state = cpu_ev.state;
  if (!state) return;  // never recorded: nothing to wait for (CUDA semantics)
  enqueue(
      [this, state] {
        if (error_) return;
        try {
          state->wait();
        } catch (...) {
          set_error(std::current_exception());
        }
      },
      {"wait", state->tag, state->lane});
}

void CpuLane::host_task(std::function<void()> fn) {
  enqueue(
      [this, fn = std::move(fn)] {
        if (error_) return;
        run_lane_task(fn, name_, [this](std::exception_ptr e) { set_error(e); });
      },
      {"task", flight::current()});
}

void CpuLane::set_error(std::exception_ptr err) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) error_ = std::move(err);
}

void CpuLane::copy(void* dst, const void* src, size_t bytes) {
  enqueue(
      [this, dst, src, bytes] {
        if (error_) return;
        std::memcpy(dst, src, bytes);
      },
      {"copy", flight::current()});
}

void CpuLane::synchronize() {
  const flight::Tag outer = flight::current();
  CpuEvent ev;
  {
    flight::Tag tag = outer;
    if (!tag.op) tag.op = "synchronize";
    flight::Scope scope(tag);
    record(ev);
  }
  flight::Waiting waiting("lane synchronize", outer, log_->id());
  ev.state->wait();
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    err = error_;
  }
  if (err) std::rethrow_exception(err);
}

double CpuLane::cpu_time_s() const {
  if (!have_cpu_clock_) return -1.0;
  timespec ts;
  if (clock_gettime(cpu_clock_, &ts) != 0) return -1.0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace ppb
