#include "backend/cuda/cuda_lane.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/clock.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/lane_abort.h"
#include "common/error.h"
#include "common/watchdog.h"

namespace ppb::cuda {
namespace {

void sleep_us(double us) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(us / 1e6);
  ts.tv_nsec = static_cast<long>((us - static_cast<double>(ts.tv_sec) * 1e6) * 1e3);
  nanosleep(&ts, nullptr);
}

/// Polls `query` (cudaStreamQuery / cudaEventQuery) with a sleep back-off of 5..100 µs, so a
/// waiting host thread leaves the core; stops when a lane abort is requested.
template <typename Query>
void poll_until_done(Query query, const char* what) {
  double sleep = 5.0;
  for (;;) {
    const cudaError_t rc = query();
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) PPB_CHECK_CALL("CUDA", what, false, cudaGetErrorString(rc));
    if (lane_abort_requested()) {
      const std::string why = lane_abort_reason();
      throw InternalError(why.empty() ? "CUDA wait aborted: another lane failed" : why);
    }
    sleep_us(sleep);
    sleep = std::min(sleep * 2.0, 100.0);
  }
}

/// cuStreamWaitValue32 from the driver, fetched at run time (linking libcuda would make the
/// binaries unloadable on machines without a driver, where the tests must still run and skip).
PFN_cuStreamWaitValue32_v11070 stream_wait_value32() {
  static PFN_cuStreamWaitValue32_v11070 fn = [] {
    // PPB_CUDA_SPIN_WAIT=1 forces the spin-kernel fallback: a switch for a machine where stream
    // memory operations on mapped host memory are refused or never see the host's write (a
    // virtualised GPU), tried by scripts/gpu_check.sh when the lane test hangs.
    if (const char* e = std::getenv("PPB_CUDA_SPIN_WAIT"); e && *e && *e != '0')
      return static_cast<PFN_cuStreamWaitValue32_v11070>(nullptr);
    void* p = nullptr;
    cudaDriverEntryPointQueryResult res{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &res) != cudaSuccess ||
        res != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // clear
      return static_cast<PFN_cuStreamWaitValue32_v11070>(nullptr);
    }
    return reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(p);
  }();
  return fn;
}

}  // namespace

// ---- clock ----------------------------------------------------------------------------------

DeviceClock::DeviceClock(int device) : device_(device) {
  CUDA_CHECK(cudaSetDevice(device_));
  double gap = 0.0;
  current_ = make_anchor(2000, &gap);  // nothing else runs yet: a tight anchor comes quickly
  current_gap_s_ = gap;
}

std::shared_ptr<ClockAnchor> DeviceClock::make_anchor(int tries, double* gap) {
  // The stream is idle, so the event completes as soon as the GPU sees it: between t0 and t1.
  // The try with the tightest [t0, t1] wins; its midpoint is the anchor (error <= (t1-t0)/2).
  std::shared_ptr<ClockAnchor> best;
  double best_gap = 1e9;
  for (int i = 0; i < tries && best_gap > kMaxAnchorGapS; ++i) {
    auto a = std::make_shared<ClockAnchor>();
    const double t0 = monotonic_s();
    CUDA_CHECK(cudaEventRecord(a->event.get(), stream_.get()));
    CUDA_CHECK(cudaEventSynchronize(a->event.get()));
    const double t1 = monotonic_s();
    if (t1 - t0 < best_gap) {
      best_gap = t1 - t0;
      a->host_s = 0.5 * (t0 + t1);
      best = std::move(a);
    }
  }
  *gap = best_gap;
  return best;
}

std::shared_ptr<const ClockAnchor> DeviceClock::anchor() {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

void DeviceClock::refresh(double max_age_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_ && monotonic_s() - current_->host_s <= max_age_s) return;
  CUDA_CHECK(cudaSetDevice(device_));
  double gap = 0.0;
  auto a = make_anchor(20, &gap);
  // Keep the old anchor only while its error bound stays below the new one's: half its gap plus
  // the rounding of the float milliseconds cudaEventElapsedTime returns (2^-24 relative: ~6 µs
  // at 100 s, ~60 µs at 1,000 s), which grows with the anchor's age; half the new gap otherwise.
  const double age_s = current_ ? monotonic_s() - current_->host_s : 0.0;
  if (!current_ || gap <= kMaxAnchorGapS || 0.5 * gap <= 0.5 * current_gap_s_ + age_s * 0x1p-24) {
    current_ = std::move(a);
    current_gap_s_ = gap;
  }
}

double DeviceClock::gap_s() {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_gap_s_;
}

// ---- events ---------------------------------------------------------------------------------

CudaEvent::CudaEvent(int device, std::shared_ptr<DeviceClock> clock)
    : device_(device), clock_(std::move(clock)), event_(cudaEventDefault) {}

void CudaEvent::synchronize() {
  if (!recorded_) return;
  poll_until_done([this] { return cudaEventQuery(event_.get()); }, "cudaEventQuery(event)");
}

double CudaEvent::time_s() const {
  if (!recorded_ || !anchor_) return 0.0;
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_->event.get(), event_.get()));
  return anchor_->host_s + 1e-3 * static_cast<double>(ms);
}

// ---- lanes ----------------------------------------------------------------------------------

CudaLane::CudaLane(int device, std::string name, std::shared_ptr<DeviceClock> clock)
    : device_(device), name_(std::move(name)), clock_(std::move(clock)),
      counter_(sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable) {
  std::memset(counter_.get(), 0, sizeof(uint32_t));
  CUDA_CHECK(cudaHostGetDevicePointer(&counter_dev_, counter_.get(), 0));
  log_ = flight::LaneLog::open(name_, [this](size_t max) { return queued(max); });
  thread_ = std::thread([this] { worker(); });
}

flight::QueueView CudaLane::queued(size_t max) {
  flight::QueueView v;
  TaskQueue& q = *queue_;
  std::unique_lock<std::mutex> lock(q.mutex, std::try_to_lock);
  for (int i = 0; i < 50 && !lock.owns_lock(); ++i) {
    sleep_us(1000.0);
    lock.try_lock();
  }
  if (!lock.owns_lock()) {
    v.busy = true;
    return v;
  }
  v.count = q.tasks.size();
  for (size_t i = 0; i < q.tasks.size() && i < max; ++i) v.first.push_back(q.tasks[i].what);
  return v;
}

CudaLane::~CudaLane() {
  log_->close();  // first: the report must not call queued() on a lane being destroyed
  // Drain the stream unless the run is being aborted (a peer may never complete a receive).
  bool drained = false;
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(stream_.get());
    if (rc != cudaErrorNotReady) {
      drained = rc == cudaSuccess;
      break;
    }
    if (lane_abort_requested()) break;
    sleep_us(50.0);
  }
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stop = true;
  }
  queue_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!drained) {
    // Aborting with work still queued: the stream waits on the mapped counter for host tasks
    // the stopped worker will never run. Publish the last task's number so every such wait
    // passes (the skipped tasks' copies move stale staging bytes, harmless in an abort) and
    // the stream can drain: a stream left waiting would block every later cudaFree or
    // cudaDeviceSynchronize of the process. Give it a moment to drain; what then still runs
    // (a kernel waiting on a dead peer) keeps its memory: the stream, the counter and the
    // staging buffers are given up rather than freed under it (the process is about to end).
    __atomic_store_n(static_cast<uint32_t*>(counter_.get()), issued_, __ATOMIC_RELEASE);
    const double deadline = monotonic_s() + 2.0;
    while (cudaStreamQuery(stream_.get()) == cudaErrorNotReady && monotonic_s() < deadline) sleep_us(50.0);
    if (cudaStreamQuery(stream_.get()) == cudaSuccess) return;
    (void)stream_.release();
    (void)counter_.release();
    for (PinnedMemory& s : staging_) (void)s.release();
  }
}

void CudaLane::record(Event& ev) {
  auto& cev = dynamic_cast<CudaEvent&>(ev);
  cev.set_anchor(clock_->anchor());
  CUDA_CHECK(cudaEventRecord(cev.get(), stream_.get()));
}

void CudaLane::wait(const Event& ev) {
  const auto& cev = dynamic_cast<const CudaEvent&>(ev);
  if (!cev.recorded()) return;  // never recorded: nothing to wait for (CUDA semantics)
  CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), cev.get(), 0));
}

void CUDART_CB CudaLane::trampoline(void* arg) {
  // Runs on CUDA's callback thread: must not call CUDA and must not block; it only queues. It
  // touches only the shared queue, never the lane (which may be gone when aborting).
  std::unique_ptr<std::pair<std::shared_ptr<TaskQueue>, Task>> item(
      static_cast<std::pair<std::shared_ptr<TaskQueue>, Task>*>(arg));
  TaskQueue& q = *item->first;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    q.tasks.push_back(std::move(item->second));
  }
  q.cv.notify_one();
}

void CudaLane::stream_wait_counter(uint32_t value) {
  if (auto fn = stream_wait_value32()) {
    const CUresult rc = fn(reinterpret_cast<CUstream>(stream_.get()), reinterpret_cast<CUdeviceptr>(counter_dev_),
                           value, CU_STREAM_WAIT_VALUE_GEQ);
    if (rc == CUDA_SUCCESS) return;
  }
  launch_wait_counter(static_cast<const uint32_t*>(counter_dev_), value, stream_.get());
}

void CudaLane::host_task(std::function<void()> fn) {
  const uint32_t seq = ++issued_;
  auto* item = new std::pair<std::shared_ptr<TaskQueue>, Task>(queue_, Task{seq, std::move(fn), {"task", flight::current()}});
  const cudaError_t rc = cudaLaunchHostFunc(stream_.get(), &CudaLane::trampoline, item);
  if (rc != cudaSuccess) {
    delete item;
    PPB_CHECK_CALL("CUDA", "cudaLaunchHostFunc(stream, trampoline, task)", false, cudaGetErrorString(rc));
  }
  stream_wait_counter(seq);
}

void CudaLane::worker() {
  cudaSetDevice(device_);
  log_->bind_thread();
  for (;;) {
    Task task;
    {
      TaskQueue& q = *queue_;
      std::unique_lock<std::mutex> lock(q.mutex);
      q.cv.wait(lock, [&q] { return q.stop || !q.tasks.empty(); });
      if (q.tasks.empty()) return;
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
    }
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failed = static_cast<bool>(error_);
    }
    log_->start(task.what);
    if (!failed) {
      flight::Scope scope(task.what.tag);
      run_lane_task(task.fn, name_, [this](std::exception_ptr e) { set_error(e); });
    }
    log_->finish();
    // Always publish, even after a failure, so the stream (and lanes waiting on it) move on.
    __atomic_store_n(static_cast<uint32_t*>(counter_.get()), task.seq, __ATOMIC_RELEASE);
    heartbeat();  // a finished task is progress, as on CpuLane (see common/watchdog.h)
  }
}

void CudaLane::set_error(std::exception_ptr err) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) error_ = std::move(err);
}

void* CudaLane::staging(size_t bytes) {
  if (staging_.empty() || staging_.back().bytes() < bytes) {
    // Older buffers stay alive: copies already enqueued may still use them.
    staging_.emplace_back(std::max<size_t>(bytes, 1 << 16));
  }
  return staging_.back().get();
}

void CudaLane::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  cudaPointerAttributes da{}, sa{};
  CUDA_CHECK(cudaPointerGetAttributes(&da, dst));
  CUDA_CHECK(cudaPointerGetAttributes(&sa, src));
  const bool dst_pageable = da.type == cudaMemoryTypeUnregistered;
  const bool src_pageable = sa.type == cudaMemoryTypeUnregistered;
  if (dst_pageable && src_pageable) {
    host_task([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  } else if (dst_pageable) {
    // In stream order the staging buffer is reused only after the previous host memcpy ran.
    void* st = staging(bytes);
    CUDA_CHECK(cudaMemcpyAsync(st, src, bytes, cudaMemcpyDefault, stream_.get()));
    host_task([dst, st, bytes] { std::memcpy(dst, st, bytes); });
  } else if (src_pageable) {
    void* st = staging(bytes);
    host_task([st, src, bytes] { std::memcpy(st, src, bytes); });
    CUDA_CHECK(cudaMemcpyAsync(dst, st, bytes, cudaMemcpyDefault, stream_.get()));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_.get()));
  }
}

void CudaLane::synchronize() {
  auto own_error = [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  };
  try {
    poll_until_done([this] { return cudaStreamQuery(stream_.get()); }, "cudaStreamQuery(lane stream)");
  } catch (const std::exception&) {
    // A task of this lane that threw raised the lane abort itself, a few µs before its counter
    // is published and the stream drains: a poll in between sees "not ready + abort". Report
    // the task's own exception then (as CpuLane does), not the abort it caused.
    if (std::exception_ptr err = own_error()) std::rethrow_exception(err);
    throw;
  }
  if (std::exception_ptr err = own_error()) std::rethrow_exception(err);
  clock_->refresh();  // the host waits here anyway; never inside record() (see cuda_lane.h)
}

CudaLane& as_cuda_lane(Lane& lane) {
  auto* l = dynamic_cast<CudaLane*>(&lane);
  if (!l) throw InternalError("lane '" + lane.name() + "' is not a CUDA lane (mixing backends?)");
  return *l;
}

}  // namespace ppb::cuda
