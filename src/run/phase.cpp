#include "run/phase.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <vector>

#include "backend/lane_abort.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/flight_recorder.h"
#include "common/thread_stacks.h"

namespace ppb::run {

namespace {

/// Rank 0 waits this long for the other ranks' flight records, a failing rank this long for its
/// record to leave, and then this long for rank 0 to write the file before it aborts the job.
constexpr double kCollectS = 5.0, kSendS = 3.0, kGraceS = 8.0;

void sleep_s(double s) {
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  nanosleep(&ts, nullptr);
}

}  // namespace

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
      exchange_(mpi, [this](int from, const std::string& why) { on_peer_failure(from, why); }),
      watchdog_(timeout_s + 15.0, [this](const std::string& phase, double idle) { on_stall(phase, idle); }) {
  flight::install_stack_handler();  // now: not first inside a report
  watchdog_.catch_termination([this](const std::string& phase, int sig) { on_termination(phase, sig); });
}

PhaseRunner::~PhaseRunner() { exchange_.stop(); }  // first: its requests call into the watchdog

void PhaseRunner::set_failure_recorder(std::function<void(const std::string&, const std::vector<std::string>&)> record) {
  record_ = std::move(record);
}

void PhaseRunner::set_stall_handler(std::function<std::string()> on_stall) { on_stall_ = std::move(on_stall); }

void PhaseRunner::record(const std::string& why, const std::vector<std::string>& flight_records) {
  if (!mpi_.is_root() || !record_) return;
  recorded_.store(true);
  try {
    record_(why, flight_records);
  } catch (const std::exception& e) {
    std::cerr << "ppbench: could not record the failure in the results file: " << e.what() << std::endl;
  }
}

std::string PhaseRunner::take_flight_record(const std::string& phase, const std::string& why) const {
  std::ostringstream header;
  header << "rank " << mpi_.rank() << " of " << mpi_.size() << " (" << error_context() << ", pid " << ::getpid()
         << "), phase '" << phase << "', " << static_cast<int>(seconds_since_heartbeat()) << " s since the last progress: "
         << why;
  const std::string prefix = "[rank " + std::to_string(mpi_.rank()) + "] ";
  auto print = [&](const std::string& text) {
    std::string out;
    for (size_t at = 0; at < text.size();) {
      const size_t nl = std::min(text.find('\n', at), text.size());
      out += prefix + text.substr(at, nl - at) + "\n";
      at = nl + 1;
    }
    std::cerr << out << std::flush;
  };
  // The lanes and waits first, printed at once: a termination signal leaves ~1 s (mpirun's
  // SIGKILL follows), and the stacks take a few ms per thread.
  const std::string lanes = flight::report(header.str(), /*stacks=*/false);
  print(lanes);
  const std::string stacks = flight::thread_stacks();
  print(stacks);
  return lanes + stacks;
}

void PhaseRunner::abort(const std::string& phase, const std::string& message) { fail(phase, message, {}); }

void PhaseRunner::fail(const std::string& phase, std::string message, const std::function<std::string()>& before_abort) {
  if (failing_.exchange(true)) wait_for_the_abort();
  // The record first: the lane abort below makes every wait throw and the lanes unwind.
  const std::string mine = take_flight_record(phase, message);
  if (before_abort) {
    const std::string more = before_abort();
    if (!more.empty()) message += "; " + more;
  }
  request_lane_abort(message);
  std::cerr << "ppbench: error in " << phase << " (" << error_context() << "): " << message << std::endl;
  exchange_.ask_peers("failed in " + phase + " on rank " + std::to_string(mpi_.rank()) + ": " + message);
  if (mpi_.is_root()) {
    record("failed in " + phase + ": " + message, exchange_.collect(mine, kCollectS));
  } else {
    exchange_.send_record(mine, kSendS);
    sleep_s(kGraceS);  // let rank 0 gather the records and write the file (it aborts the job once it has)
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void PhaseRunner::on_peer_failure(int from, const std::string& why) {
  if (failing_.exchange(true)) return;  // this rank is ending the job already: its record is on its way
  const std::string mine = take_flight_record(watchdog_.phase(), "asked by rank " + std::to_string(from) + ", which " + why);
  if (!mpi_.is_root()) {
    exchange_.send_record(mine, kSendS);
    return;  // rank `from` or rank 0 aborts the job
  }
  record(why, exchange_.collect(mine, kCollectS));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void PhaseRunner::hang_if_injected(const std::string& phase) const {
  const char* env = std::getenv("PPBENCH_FAULT");
  int rank = -2;
  char name[128] = {};
  if (!env || std::sscanf(env, "hang:%d:%127[^\n]", &rank, name) != 2) return;
  if ((rank != -1 && rank != mpi_.rank()) || phase != name) return;
  flight::Tag tag;
  tag.op = "injected hang (PPBENCH_FAULT)";
  flight::Waiting waiting("sleep", tag);
  for (;;) sleep_s(0.1);
}

void PhaseRunner::wait_for_the_abort() const {
  sleep_s(kCollectS + kGraceS + 20.0);  // the failing thread aborts the job well before
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
  fail(phase, os.str(), on_stall_);
}

void PhaseRunner::on_termination(const std::string& phase, int signal) {
  const std::string why = "terminated by signal " + std::to_string(signal) + " during " + phase +
                          " (another rank died, or the job was cancelled)";
  std::cerr << "ppbench: " << error_context() << ": " << why << std::endl;
  if (!failing_.exchange(true)) {
    std::vector<std::string> records(static_cast<size_t>(mpi_.size()));
    records[0] = take_flight_record(phase, why);  // rank 0's is the one the file can hold
    record(why, records);
  } else if (!recorded_.load()) {
    record(why);  // rank 0 was still gathering the records of a failure
  }
}

}  // namespace ppb::run
