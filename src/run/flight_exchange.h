// The flight records of every rank, brought to rank 0 when one rank fails (issue 35, item 9):
// the rank that fails asks every other rank for its record (common/flight_recorder.h); each
// prints its own to its log and sends it to rank 0, which writes them all into the results file.
// The records are taken at the same moment on every rank, as NCCL's flight recorder dumps every
// rank of a communicator when one times out.
//
// The exchange runs on a communicator of its own (MPI_Comm_dup: none of its messages can match
// the run's) and a listener thread that polls it every 0.2 s (MPI_Improbe, matched receives):
// the watchdog thread itself calls no MPI until it must, so an MPI call stuck on a lock cannot
// stop it. Every wait of the exchange is bounded.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mpi/mpi_context.h"

namespace ppb::run {

class FlightExchange {
 public:
  /// Collective over MPI_COMM_WORLD. `on_request(from, why)` runs on the listener thread when
  /// rank `from` asks for this rank's record (once: later requests are ignored).
  FlightExchange(const MpiContext& mpi, std::function<void(int, const std::string&)> on_request);
  ~FlightExchange();
  FlightExchange(const FlightExchange&) = delete;
  FlightExchange& operator=(const FlightExchange&) = delete;

  /// Stops the listener (joins it); idempotent. Call before what on_request touches goes.
  void stop();
  /// Asks every other rank for its record, saying `why` (once; never waits).
  void ask_peers(const std::string& why);
  /// Not rank 0: sends `record` to rank 0, polled for at most `limit_s`.
  void send_record(const std::string& record, double limit_s);
  /// Rank 0: every rank's record ([size]; `mine` at 0): those that arrive within `limit_s`, ""
  /// for the ranks that did not answer.
  std::vector<std::string> collect(const std::string& mine, double limit_s);

 private:
  void listen();

  const MpiContext& mpi_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::function<void(int, const std::string&)> on_request_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> asked_{false};
  std::thread listener_;
};

}  // namespace ppb::run
