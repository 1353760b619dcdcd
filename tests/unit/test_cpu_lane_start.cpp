// Issue 35, item 9: a CPU lane's start must not depend on its thread's timing. CpuLane's
// constructor used to wait for its thread on a condition variable of its own stack, which the
// thread notified after releasing the lock: when the thread got there first, the constructor
// returned, its stack was reused, and the thread blocked for good in pthread_cond_broadcast on
// the garbage there (a profile that hung ~1 run in 120, both ranks ended by the watchdog).
//
// This binary makes that interleaving happen every time: it interposes pthread_create (the
// creating thread sleeps 5 ms after it, so the new thread runs first) and pthread_cond_broadcast
// (a broadcast waits 20 ms before it runs, so the constructor is long gone), then scribbles over
// the stack the constructor used. The lane must still run its tasks.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "backend/cpu/cpu_lane.h"

namespace {
std::atomic<bool> g_slow{false};  ///< the interposers delay only while a test sets this

void sleep_ms(long ms) {
  timespec ts{0, ms * 1000000};
  nanosleep(&ts, nullptr);
}
}  // namespace

extern "C" int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*), void* arg) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  const int rc = real(t, attr, fn, arg);
  if (g_slow.load()) sleep_ms(5);  // the new thread gets there first
  return rc;
}

extern "C" int pthread_cond_broadcast(pthread_cond_t* cv) {
  using Broadcast = int (*)(pthread_cond_t*);
  static const auto real = reinterpret_cast<Broadcast>(dlvsym(RTLD_NEXT, "pthread_cond_broadcast", "GLIBC_2.3.2"));
  if (g_slow.load()) sleep_ms(20);  // the notifier is late: whoever waited may be gone
  return real(cv);
}

namespace {

/// Overwrites the stack below the caller's frame, where a returned constructor's locals were,
/// with all ones (read as a pthread condition variable: waiters, and its internal lock held:
/// what the hung run's lane thread waited on), and keeps it so for 50 ms, past the delayed
/// broadcast (what it calls while it waits lies below the array).
__attribute__((noinline)) void scribble_stack() {
  volatile unsigned char junk[16384];
  for (size_t i = 0; i < sizeof junk; ++i) junk[i] = 0xFF;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(CpuLaneStart, ALaneWhoseThreadStartsFirstRunsItsTasks) {
  g_slow = true;
  for (int i = 0; i < 5; ++i) {
    auto lane = std::make_unique<ppb::CpuLane>("start");
    scribble_stack();
    std::atomic<bool> ran{false};
    lane->host_task([&] { ran = true; });
    const auto t0 = std::chrono::steady_clock::now();
    while (!ran && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!ran) {
      // The lane's thread is stuck (the old constructor's broadcast): it cannot be joined, so
      // the process ends here rather than hanging in the lane's destructor.
      ADD_FAILURE() << "lane " << i << " never ran its task: its thread is stuck";
      std::fflush(stdout);
      std::_Exit(1);
    }
    lane->synchronize();
    EXPECT_GE(lane->cpu_time_s(), 0.0);  // the thread's CPU clock, known from the constructor on
  }
  g_slow = false;
}

}  // namespace
