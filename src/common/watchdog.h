// Progress heartbeats and a per-rank watchdog: a phase that makes no progress for longer than
// its limit ends the job instead of hanging the allocation (issue: "no hangs").
//
// Anything that proves the run is moving calls heartbeat(): a lane finishing a task, a message
// completing, a profiled signature, a repetition. The watchdog thread checks the age of the last
// heartbeat; past the limit it calls the expiry handler once (the runtime's: report, record the
// failure in the results file, MPI_Abort).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ppb {

/// Marks progress now (lock-free; callable from any thread).
void heartbeat();
/// Seconds since the last heartbeat.
double seconds_since_heartbeat();

class Watchdog {
 public:
  /// on_expire(phase, idle_seconds) runs on the watchdog thread, at most once.
  Watchdog(double limit_s, std::function<void(const std::string&, double)> on_expire);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  /// Catches SIGTERM and SIGINT (what mpirun/srun send when another rank died or the job is
  /// cancelled): the watchdog thread then calls on_signal(phase, signal) (e.g. to record the
  /// failure in the results file) and ends the process with status 128 + signal.
  void catch_termination(std::function<void(const std::string&, int)> on_signal);
  /// Names the phase now running (and counts as a heartbeat).
  void set_phase(const std::string& phase);
  std::string phase() const;

 private:
  void run();
  double limit_s_;
  std::function<void(const std::string&, double)> on_expire_;
  std::function<void(const std::string&, int)> on_signal_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::string phase_ = "start-up";
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ppb
