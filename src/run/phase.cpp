#include "run/phase.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <vector>

#include "backend/lane_abort.h"
#include "common/check.h"
#include "common/clock.h"

namespace ppb::run {

Progress::Progress(bool enabled) : enabled_(enabled), t0_(monotonic_s()) {}

void Progress::say(const std::string& text) const {
  if (enabled_) std::cout << "[ppbench " << stamp() << "] " << text << std::endl;
}

std::string Progress::stamp() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%7.1fs", monotonic_s() - t0_);
  return buf;
}

PhaseRunner::PhaseRunner(const MpiContext& mpi, double timeout_s)
    : mpi_(mpi),
      timeout_s_(timeout_s),
      watchdog_(timeout_s + 15.0, [this](const std::string& phase, double idle) { on_stall(phase, idle); }) {
  watchdog_.catch_termination([this](const std::string& phase, int sig) { on_termination(phase, sig); });
}

void PhaseRunner::set_failure_recorder(std::function<void(const std::string&)> record) { record_ = std::move(record); }

void PhaseRunner::set_stall_handler(std::function<std::string()> on_stall) { on_stall_ = std::move(on_stall); }

void PhaseRunner::record(const std::string& why) const {
  if (!mpi_.is_root() || !record_) return;
  try {
    record_(why);
  } catch (const std::exception& e) {
    std::cerr << "ppbench: could not record the failure in the results file: " << e.what() << std::endl;
  }
}

void PhaseRunner::abort(const std::string& phase, const std::string& message) {
  request_lane_abort(message);
  std::cerr << "ppbench: error in " << phase << " (" << error_context() << "): " << message << std::endl;
  if (mpi_.is_root()) {
    record("failed in " + phase + ": " + message);
  } else {
    timespec ts{2, 0};  // let rank 0 record the failure first
    nanosleep(&ts, nullptr);
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void PhaseRunner::agree_or_fail(const std::string& phase, const std::string& message) {
  const int global = mpi_.agree(message.empty() ? 0 : 2);
  if (global == 0) return;
  const auto messages = mpi_.gather_strings(message);
  if (mpi_.is_root()) {
    std::vector<std::pair<std::string, std::vector<int>>> distinct;
    for (int r = 0; r < mpi_.size(); ++r) {
      if (messages[r].empty()) continue;
      auto it = std::find_if(distinct.begin(), distinct.end(), [&](auto& d) { return d.first == messages[r]; });
      if (it == distinct.end()) distinct.push_back({messages[r], {r}});
      else it->second.push_back(r);
    }
    for (auto& [msg, ranks] : distinct) {
      std::ostringstream who;
      if (static_cast<int>(ranks.size()) == mpi_.size()) {
        who << "all ranks";
      } else {
        who << "rank" << (ranks.size() > 1 ? "s " : " ");
        for (size_t i = 0; i < ranks.size(); ++i) who << (i ? "," : "") << ranks[i];
      }
      std::cerr << "ppbench: error in " << phase << " (" << who.str() << "): " << msg << std::endl;
    }
    record("failed in " + phase + ": " + (distinct.empty() ? std::string("?") : distinct[0].first));
  }
  throw PhaseFailed{global};
}

void PhaseRunner::on_stall(const std::string& phase, double idle_s) {
  std::ostringstream os;
  os << "no progress for " << static_cast<int>(idle_s) << " s (--timeout " << timeout_s_
     << " s + 15 s): a rank is dead or stuck";
  if (on_stall_) {
    const std::string more = on_stall_();
    if (!more.empty()) os << "; " << more;
  }
  abort(phase, os.str());
}

void PhaseRunner::on_termination(const std::string& phase, int signal) const {
  const std::string why = "terminated by signal " + std::to_string(signal) + " during " + phase +
                          " (another rank died, or the job was cancelled)";
  std::cerr << "ppbench: " << error_context() << ": " << why << std::endl;
  record(why);
}

}  // namespace ppb::run
