#include <mpi.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <limits>
#include <sstream>

#include "backend/device.h"
#include "common/check.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "common/watchdog.h"
#include "mpi/mpi_context.h"
#include "transport/transport.h"

namespace ppb {
namespace {

/// Sleeps `us` microseconds (nanosleep: the thread leaves the run queue).
void sleep_us(double us) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(us / 1e6);
  ts.tv_nsec = static_cast<long>((us - ts.tv_sec * 1e6) * 1e3);
  nanosleep(&ts, nullptr);
}

class MpiTransport final : public Transport {
 public:
  MpiTransport(const MpiContext& mpi, const MpiPollConfig& poll) : mpi_(mpi), poll_(poll) {}
  std::string name() const override { return "mpi"; }
  bool mpi_host_messages() const override { return true; }

  void enqueue_send(Lane& lane, const void* buf, size_t bytes, int peer, int tag) override {
    check_size(bytes);
    flight::Scope scope(flight::transfer("send", peer, tag, static_cast<long long>(bytes)));
    lane.host_task([buf, bytes, peer, tag, poll = poll_] {
      MPI_Request req;
      MPI_CHECK(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &req));
      poll_mpi_request(&req, poll, describe("send", bytes, peer, tag), MpiRequestKind::send);
    });
  }

  void enqueue_recv(Lane& lane, void* buf, size_t bytes, int peer, int tag) override {
    check_size(bytes);
    flight::Scope scope(flight::transfer("recv", peer, tag, static_cast<long long>(bytes)));
    lane.host_task([buf, bytes, peer, tag, poll = poll_] {
      MPI_Request req;
      MPI_CHECK(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &req));
      poll_mpi_request(&req, poll, describe("recv", bytes, peer, tag), MpiRequestKind::recv);
    });
  }

  void enqueue_barrier(Lane& lane) override {
    flight::Tag tag = flight::current();
    tag.op = "barrier";
    flight::Scope scope(tag);
    lane.host_task([poll = poll_] {
      MPI_Request req;
      MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
      poll_mpi_request(&req, poll, "barrier of the serialized run", MpiRequestKind::collective);
    });
  }

 private:
  static std::string describe(const char* op, size_t bytes, int peer, int tag) {
    std::ostringstream os;
    os << op << " of " << bytes << " bytes " << (op[0] == 's' ? "to" : "from") << " rank " << peer
       << " (tag " << tag << ")";
    return os.str();
  }
  static void check_size(size_t bytes) {
    if (bytes > static_cast<size_t>(std::numeric_limits<int>::max()))
      throw InternalError("message of " + std::to_string(bytes) + " bytes exceeds MPI's int count");
  }
  const MpiContext& mpi_;
  MpiPollConfig poll_;
};

/// Withdraws a pending point-to-point request. A receive is cancelled and then completed with
/// MPI_Wait, which MPI 4.0 §3.8.4 makes local once a request is marked for cancellation, so the
/// process never reaches MPI_Finalize holding a freed receive whose cancellation may still be in
/// flight (Open MPI has hung in finalize on cancelled receives: open-mpi/ompi#1175). A send cannot
/// be cancelled reliably (deprecated in MPI 4.1; MPI_Wait on a cancelled send has hung in Open MPI
/// until the peer matched it: open-mpi/ompi#9626), so it is cancelled and freed: MPI completes it,
/// or the job is being aborted.
void withdraw(MPI_Request& req, MpiRequestKind kind) {
  MPI_Cancel(&req);
  if (kind == MpiRequestKind::recv)
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  else
    MPI_Request_free(&req);
}

}  // namespace

void poll_mpi_request(void* request, const MpiPollConfig& cfg, const std::string& what, MpiRequestKind kind) {
  MPI_Request& req = *static_cast<MPI_Request*>(request);
  // What the flight recorder lists as pending on this thread: the task's tag says which transfer.
  flight::Waiting waiting(kind == MpiRequestKind::send ? "MPI_Isend" : kind == MpiRequestKind::recv ? "MPI_Irecv" : "MPI collective");
  const double start = monotonic_s();
  double sleep = cfg.min_sleep_us;
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) {
      heartbeat();
      return;
    }
    if (lane_abort_requested()) {
      if (kind != MpiRequestKind::collective) withdraw(req, kind);
      throw InternalError(what + " abandoned: " + lane_abort_reason());
    }
    const double waited = monotonic_s() - start;
    if (waited > cfg.timeout_s) {
      // Withdraw a message so that it cannot land late in a buffer that is gone.
      if (kind != MpiRequestKind::collective) withdraw(req, kind);
      std::ostringstream os;
      os << error_context() << ": " << what << " timed out after " << waited
         << " s (--timeout); the peer is dead, stuck, or never posted the matching operation";
      throw InternalError(os.str());
    }
    if (waited * 1e6 < cfg.spin_us) {
      sched_yield();
      continue;
    }
    sleep_us(sleep);
    sleep = std::min(sleep * 2.0, cfg.max_sleep_us);
  }
}

std::unique_ptr<Transport> create_mpi_transport(const MpiContext& mpi, const MpiPollConfig& poll) {
  return std::make_unique<MpiTransport>(mpi, poll);
}

}  // namespace ppb
