// The failure machinery of `ppbench run` (DESIGN.md §1, "Failures"): every phase runs under
// PhaseRunner::run, which agrees on a bad input (exit status 2 on every rank, each distinct
// message printed once by rank 0 with the ranks that raised it) and aborts the job on an
// internal error (after rank 0 recorded it in the results file); a watchdog ends a job that
// makes no progress; a termination signal is recorded. Progress lines, stamped with the run's
// elapsed time, are printed by rank 0.
//
// A rank that ends the job (the watchdog, an internal error, a termination signal) first takes
// its flight record (common/flight_recorder.h: its lanes, waits and threads' stacks, before its
// lanes are told to abort) and prints it to its log; the rank that fails asks every other rank
// for theirs (run/flight_exchange.h), and rank 0 writes them all into the results file
// (/failure/flight_record) before the job is aborted.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/watchdog.h"
#include "mpi/mpi_context.h"
#include "run/flight_exchange.h"

namespace ppb::run {

/// A phase failed on some rank; every rank leaves the run with `status` (2: bad input; 1: other).
struct PhaseFailed {
  int status;
};

/// Rank 0's progress lines: "[ppbench    12.3s] text" on stdout (none with --quiet, none on
/// other ranks).
class Progress {
 public:
  explicit Progress(bool enabled);
  void say(const std::string& text) const;
  /// The run's elapsed time as the lines show it ("   12.3s").
  std::string stamp() const;

 private:
  bool enabled_;
  double t0_;
};

/// Runs the phases of one run on every rank, with the failure policy above.
class PhaseRunner {
 public:
  /// `timeout_s`: --timeout; the watchdog ends the job after timeout_s + 15 s without progress.
  /// Collective (the flight records' communicator is made here).
  PhaseRunner(const MpiContext& mpi, double timeout_s);
  ~PhaseRunner();
  PhaseRunner(const PhaseRunner&) = delete;
  PhaseRunner& operator=(const PhaseRunner&) = delete;

  /// Rank 0: how a failure is written to the results file: the message ("failed in <phase>:
  /// ...") and the ranks' flight records ([size], "" for a rank that sent none; empty when none
  /// was taken, e.g. bad input). Set once the output path is known; may throw (caught, warned).
  void set_failure_recorder(std::function<void(const std::string&, const std::vector<std::string>&)> record);
  /// What a stall adds to its message and does before the abort (e.g. the transport's
  /// asynchronous error, then ncclCommAbort to release streams blocked on a dead peer); returns
  /// the text to add ("" for none).
  void set_stall_handler(std::function<std::string()> on_stall);

  /// Runs `fn` on every rank as phase `name`. A UserError (bad input: the same on every rank, or
  /// local to a rank but raised before any collective of the phase) is agreed on: rank 0 prints
  /// each distinct message with the ranks that raised it, records the first, and every rank
  /// throws PhaseFailed{2}. Any other exception aborts the job (abort()). Never leaves a rank
  /// behind in a collective.
  template <typename Fn>
  void run(const std::string& name, Fn&& fn) {
    watchdog_.set_phase(name);
    std::string message;
    try {
      hang_if_injected(name);
      fn();
    } catch (const UserError& e) {
      message = e.what();
      if (message.empty()) message = "bad input";
    } catch (const std::exception& e) {
      abort(name, e.what());
    }
    agree_or_fail(name, message);
  }

  /// Ends the job from phase `phase` with an internal error: other ranks may be blocked in a
  /// transfer or collective that will never complete, so there is no agreeing. This rank's
  /// flight record is taken and printed, every other rank is asked for its own; rank 0 records
  /// the failure with the records that came within a few seconds (the file keeps the phases
  /// already done, complete=0), the others send theirs and give it a moment; then MPI_Abort
  /// ends the whole job with a non-zero status.
  [[noreturn]] void abort(const std::string& phase, const std::string& message);

 private:
  /// Collective: throws PhaseFailed when any rank's `message` is not empty (see run()).
  void agree_or_fail(const std::string& phase, const std::string& message);
  void record(const std::string& why, const std::vector<std::string>& flight_records = {});
  /// The failure path of abort(): `before_abort` runs after the record is taken, before the
  /// lanes are told to abort (a stall's transport abort), and returns text for the message.
  [[noreturn]] void fail(const std::string& phase, std::string message, const std::function<std::string()>& before_abort);
  /// This rank's flight record now, printed to stderr with every line prefixed "[rank R] ".
  std::string take_flight_record(const std::string& phase, const std::string& why) const;
  /// Rank `from` failed and asks for this rank's record (the listener thread).
  void on_peer_failure(int from, const std::string& why);
  void on_stall(const std::string& phase, double idle_s);
  void on_termination(const std::string& phase, int signal);
  /// A fault injected for the tests of the watchdog: PPBENCH_FAULT=hang:RANK:PHASE makes world
  /// rank RANK (-1: every rank) stop at the start of phase PHASE, its main thread asleep in a
  /// wait nothing polls, until the job is aborted (no transfer times out: the watchdog ends it).
  void hang_if_injected(const std::string& phase) const;
  /// Another thread of this rank is failing the job: wait for its abort (bounded).
  [[noreturn]] void wait_for_the_abort() const;

  const MpiContext& mpi_;
  double timeout_s_;
  std::function<void(const std::string&, const std::vector<std::string>&)> record_;
  std::function<std::string()> on_stall_;
  std::atomic<bool> failing_{false};   ///< a thread of this rank is ending the job
  std::atomic<bool> recorded_{false};  ///< rank 0 wrote the failure into the file
  FlightExchange exchange_;  ///< before the watchdog, whose callbacks use it (its listener is stopped first)
  Watchdog watchdog_;  ///< last: built last, destroyed first (before what its callbacks touch)
};

}  // namespace ppb::run
