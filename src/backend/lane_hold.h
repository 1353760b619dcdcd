// Holding a lane while its work is enqueued, so that events around that work time the device
// alone: a one-layer GPU decode is ~15 launches of a few µs of host time against ~100-150 µs of
// device work, and timed while it is being enqueued the device would wait for the host between
// kernels, which a pipelined stage (the host enqueues ahead) never does.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <utility>

#include "backend/lane.h"

namespace ppb {

/// The most launches a held lane may take (StageExecutor::launches_per_forward): CUDA lets
/// about a thousand launches wait in a stream before the launching call blocks the host, and a
/// held stream never drains, so a forward of more launches would deadlock its own hold. Half of
/// that, for the launches libraries add. A forward that large is device-bound (long prefill
/// GEMMs): it is timed without a hold, and the host's launch gaps hide behind its kernels.
inline constexpr size_t kMaxHeldLaunches = 512;

/// Enqueues a host task on `lane` that waits until `enqueue()` has returned (or thrown), then
/// calls `enqueue()`: everything it enqueues on `lane` starts back to back once it returns.
/// `enqueue()` must put at most kMaxHeldLaunches launches on a device queue.
/// The host never waits. Call it only for work whose kernels have run before (after a
/// warm-up): a kernel's first launch may load its module lazily, which can wait for the whole
/// context, held lane included, while the thread that would release the hold is the waiter.
template <typename Fn>
void enqueue_held(Lane& lane, Fn&& enqueue) {
  auto go = std::make_shared<std::atomic<bool>>(false);  // outlives the task: it owns a copy
  struct Release {  // even if `enqueue` throws: a held lane would never drain
    std::atomic<bool>& go;
    ~Release() { go.store(true, std::memory_order_release); }
  } release{*go};
  lane.host_task([go] {
    while (!go->load(std::memory_order_acquire)) std::this_thread::yield();
  });
  std::forward<Fn>(enqueue)();
}

}  // namespace ppb
