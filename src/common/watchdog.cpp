#include "common/watchdog.h"

#include <signal.h>
#include <time.h>

#include <chrono>
#include <cstdlib>

namespace ppb {
namespace {

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::atomic<double> g_last_heartbeat{now_s()};
std::atomic<int> g_signal{0};

extern "C" void on_termination_signal(int sig) { g_signal.store(sig); }  // async-signal-safe

}  // namespace

void Watchdog::catch_termination(std::function<void(const std::string&, int)> on_signal) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    on_signal_ = std::move(on_signal);
  }
  struct sigaction sa {};
  sa.sa_handler = on_termination_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void heartbeat() { g_last_heartbeat.store(now_s(), std::memory_order_relaxed); }

double seconds_since_heartbeat() { return now_s() - g_last_heartbeat.load(std::memory_order_relaxed); }

Watchdog::Watchdog(double limit_s, std::function<void(const std::string&, double)> on_expire)
    : limit_s_(limit_s), on_expire_(std::move(on_expire)) {
  heartbeat();
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = phase;
  heartbeat();
}

std::string Watchdog::phase() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return phase_;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (stop_) return;
    if (int sig = g_signal.load(); sig != 0) {
      std::string phase = phase_;
      auto on_signal = on_signal_;
      lock.unlock();
      if (on_signal) on_signal(phase, sig);
      std::_Exit(128 + sig);
    }
    double idle = seconds_since_heartbeat();
    if (idle > limit_s_) {
      std::string phase = phase_;
      lock.unlock();
      on_expire_(phase, idle);  // normally does not return (MPI_Abort)
      return;
    }
  }
}

}  // namespace ppb
