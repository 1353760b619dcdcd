// Transport: point-to-point messages between pipeline stages, enqueued on a lane.
//
// The MPI transport (host buffers) runs MPI_Isend/MPI_Irecv inside a lane task and polls
// MPI_Test with a short sleep: Open MPI's MPI_Wait busy-polls, which on a CPU rank would take
// the core away from the compute lane. The NCCL transport (CUDA backend) will implement the
// same interface with ncclSend/ncclRecv on the communication stream.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/device.h"

namespace ppb {

class MpiContext;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;  ///< "mpi" or "nccl"
  /// Enqueues a send of `bytes` at `buf` to world rank `peer` with `tag`; the lane's later work
  /// starts after the send buffer may be reused. @throws (from the lane) on timeout/failure.
  virtual void enqueue_send(Lane& lane, const void* buf, size_t bytes, int peer, int tag) = 0;
  /// Enqueues a receive of exactly `bytes` into `buf` from `peer` with `tag`.
  virtual void enqueue_recv(Lane& lane, void* buf, size_t bytes, int peer, int tag) = 0;
  /// Enqueues a barrier over all ranks (used by the serialized reference run).
  virtual void enqueue_barrier(Lane& lane) = 0;
  /// Sets up the links (src, dst) of world ranks that this rank is an end of, before their
  /// first message: no communicator is then made inside a timed loop, or while another's
  /// kernels are in flight. Blocks until the other end of each link has called it too. Every
  /// rank must pass its links sorted ascending by (src, dst): pairwise rendezvous taken in one
  /// global order cannot deadlock (the smallest link not yet made always has both ends at it).
  /// Default: nothing to set up (MPI).
  virtual void connect(const std::vector<std::pair<int, int>>& links) { (void)links; }
  /// An asynchronous error of the transport ("" if none), e.g. ncclCommGetAsyncError: what a
  /// watchdog reports when the job stops making progress. Callable from any thread.
  virtual std::string async_error() const { return ""; }
  /// Abandons every operation in flight so that blocked streams/threads can return
  /// (ncclCommAbort); the transport is unusable afterwards. Callable from any thread.
  virtual void abort() {}
  /// Library versions behind the transport ({"nccl": "2.21.5"}), for the results file.
  virtual std::map<std::string, std::string> library_versions() const { return {}; }
  /// Whether the pipeline's messages are MPI messages of host memory, what
  /// MpiContext::link_matrix's host ping-pong times (less the lanes' polling): the MPI
  /// transport of CPU ranks. Where false (NCCL on device memory; MPI staged through pinned host
  /// buffers), the run's link model comes from the link probe through this transport
  /// (transport/link_probe.h).
  virtual bool mpi_host_messages() const { return false; }
};

/// Polling behaviour of the MPI transport.
struct MpiPollConfig {
  double timeout_s = 300.0;   ///< a single wait longer than this fails, naming the peer
  double min_sleep_us = 20.0;   ///< first sleep between MPI_Test calls
  /// Sleep doubles up to this. It bounds the latency added to a message (<= 1 ms against CPU
  /// compute steps of 5-500 ms) and the CPU a waiting lane burns: each MPI_Test runs Open MPI's
  /// progress engine (~10-20 us), so 1 ms keeps a waiting lane near 1-2% of a core.
  double max_sleep_us = 1000.0;
  /// Polls without sleeping (MPI_Test, then sched_yield) for this long before the first sleep:
  /// for waits on the critical path of every layer (the tensor-parallel all-reduce), where a
  /// sleep (>= ~50 us with Linux's default timer slack) would cost more than the wait itself.
  double spin_us = 0.0;
};

/// What an MPI request is, for withdrawing it when a wait is given up.
enum class MpiRequestKind { send, recv, collective };

/// Polls `req` until it completes: MPI_Test, spinning for cfg.spin_us, then with an exponential
/// sleep back-off (cfg.min_sleep_us doubling up to cfg.max_sleep_us), never blocking in MPI.
/// `req` is an MPI_Request (a void* here so that this header needs no mpi.h).
/// @throws ppb::InternalError on timeout (cfg.timeout_s) or a lane abort, naming `what`; a
///         receive is cancelled and completed first (MPI_Cancel, then MPI_Wait, local once
///         cancelled), so that a late message cannot land in a buffer that is gone; a send is
///         cancelled and freed (send cancellation is unreliable: MPI 4.1 deprecates it); a
///         nonblocking collective cannot be cancelled (MPI 4.0 §3.8.4): it is left pending, its
///         buffers must outlive the process's abort (the job is being aborted).
void poll_mpi_request(void* req, const MpiPollConfig& cfg, const std::string& what, MpiRequestKind kind);

class TpGroup;
/// Collective over MPI_COMM_WORLD: splits the world into tensor-parallel groups, one per
/// distinct `color` >= 0 (ranks ordered by `key`), and returns this rank's group, or null for
/// color < 0. The group's all-reduce is an MPI_Iallgather of every rank's part followed by a
/// sum in group-rank order on each rank: every rank gets the same bits, the same bits as
/// ThreadTpGroups (backend/tensor_parallel.h), and the bits do not depend on which algorithm
/// the MPI library picks for a size. Cost: each rank receives (t - 1) n floats, against
/// 2 (t - 1) n / t for a ring all-reduce: at most 1.5x (t = 4) more bytes over shared memory
/// for a reproducible order (measured: bench/tp_allreduce_bench.cpp). The argmax all-gathers
/// every rank's (value, id) pairs and applies tp_argmax_in_rank_order (no rounding; ties to the
/// lowest id; a NaN never wins). Polls with `poll`; a collective is never cancelled.
std::unique_ptr<TpGroup> create_mpi_tp_group(const MpiContext& mpi, int color, int key, const MpiPollConfig& poll);

/// MPI transport over MPI_COMM_WORLD with host buffers. `what` names the phase for messages.
std::unique_ptr<Transport> create_mpi_transport(const MpiContext& mpi, const MpiPollConfig& poll);

}  // namespace ppb
