#include "transport/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <time.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_lane.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/lane_abort.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/error.h"
#include "mpi/mpi_context.h"

namespace ppb {
namespace {

/// An ncclComm_t: destroyed normally, aborted if the run is being aborted (a peer may be gone).
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t c) : c_(c) {}
  ~NcclComm() {
    if (!c_) return;
    if (lane_abort_requested()) {
      ncclCommAbort(c_);
    } else {
      ncclCommDestroy(c_);
    }
  }
  NcclComm(NcclComm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  NcclComm& operator=(NcclComm&& o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return c_; }
  /// ncclCommAbort now; the destructor then has nothing left to free (no double abort).
  void abort() {
    if (c_) ncclCommAbort(std::exchange(c_, nullptr));
  }

 private:
  ncclComm_t c_ = nullptr;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(const MpiContext& mpi, int device, const MpiPollConfig& poll)
      : mpi_(mpi), device_(device), timeout_s_(poll.timeout_s), mpi_transport_(create_mpi_transport(mpi, poll)) {
    CUDA_CHECK(cudaSetDevice(device_));
    MPI_CHECK(MPI_Comm_dup(mpi.comm(), &id_comm_));
    ncclUniqueId id{};
    if (mpi.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi.comm()));
    ncclComm_t c = nullptr;
    const ncclResult_t rc = ncclCommInitRank(&c, mpi.size(), id, mpi.rank());
    // Agree before anyone goes on: a rank whose init failed must not leave others in a later
    // collective.
    const int bad = mpi.agree(rc == ncclSuccess ? 0 : 1);
    if (rc == ncclSuccess) world_ = NcclComm(c);
    if (bad) {
      throw UserError(std::string("--transport nccl: NCCL could not initialise (") +
                      (rc == ncclSuccess ? "failed on another rank" : ncclGetErrorString(rc)) +
                      "); two ranks on one GPU cannot use NCCL: use --transport mpi");
    }
  }
  ~NcclTransport() override {
    pairs_.clear();
    world_ = NcclComm();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && id_comm_ != MPI_COMM_NULL) MPI_Comm_free(&id_comm_);
  }
  std::string name() const override { return "nccl"; }

  std::string async_error() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ncclComm_t> comms{world_.get()};
    for (const auto& [key, comm] : pairs_) comms.push_back(comm.get());
    for (ncclComm_t c : comms) {
      ncclResult_t async = ncclSuccess;
      if (c && ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        return std::string("NCCL asynchronous error: ") + ncclGetErrorString(async);
    }
    return "";
  }

  void abort() override {
    // ncclCommAbort makes kernels blocked on a dead peer return, so the process can exit.
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, comm] : pairs_) comm.abort();
    world_.abort();
  }

  std::map<std::string, std::string> library_versions() const override {
    int v = 0;
    ncclGetVersion(&v);
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    return {{"nccl", std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100)}};
  }

  void enqueue_send(Lane& lane, const void* buf, size_t bytes, int peer, int tag) override {
    cudaStream_t st = cuda::as_cuda_lane(lane).stream();
    ncclComm_t c = pair(mpi_.rank(), peer);
    NCCL_CHECK(ncclSend(buf, bytes, ncclUint8, /*peer in the pair=*/1, c, st));
    (void)tag;
  }

  void enqueue_recv(Lane& lane, void* buf, size_t bytes, int peer, int tag) override {
    cudaStream_t st = cuda::as_cuda_lane(lane).stream();
    ncclComm_t c = pair(peer, mpi_.rank());
    NCCL_CHECK(ncclRecv(buf, bytes, ncclUint8, /*peer in the pair=*/0, c, st));
    (void)tag;
  }

  void enqueue_barrier(Lane& lane) override { mpi_transport_->enqueue_barrier(lane); }

  /// Makes each link's communicator and finishes its setup, in the given (sorted) order, which
  /// both ends of every link share: NCCL connects a pair lazily on its first ncclSend/ncclRecv,
  /// which would otherwise happen in repetition 0 while another communicator's kernel spins on
  /// the same GPU, and with two stages that can close a cycle. A 1-byte exchange on a stream of
  /// the transport's own, waited for here (polled, bounded by --timeout), connects it now.
  void connect(const std::vector<std::pair<int, int>>& links) override {
    for (const auto& [src, dst] : links) {
      if (src != mpi_.rank() && dst != mpi_.rank())
        throw InternalError("NCCL transport: connect() given a link this rank is no end of");
      ncclComm_t c = pair(src, dst);
      if (!connect_buf_) {
        CUDA_CHECK(cudaSetDevice(device_));
        connect_stream_ = std::make_unique<cuda::Stream>();
        connect_buf_ = std::make_unique<cuda::DeviceMemory>(1);
      }
      if (mpi_.rank() == src)
        NCCL_CHECK(ncclSend(connect_buf_->get(), 1, ncclUint8, /*peer in the pair=*/1, c, connect_stream_->get()));
      else
        NCCL_CHECK(ncclRecv(connect_buf_->get(), 1, ncclUint8, /*peer in the pair=*/0, c, connect_stream_->get()));
      wait_connected(src, dst);
    }
  }

 private:
  /// The communicator of messages src -> dst (src is its rank 0, dst its rank 1), made by
  /// connect() ahead of the pipeline (or, failing that, on first use) by both ends. Only the enqueuing thread calls this; mutex_ guards the map
  /// against async_error()/abort() from the watchdog, and is NOT held while the communicator
  /// is made: that blocks until the peer joins (forever if it died), and a watchdog stuck on
  /// the mutex could then never abort the job.
  ncclComm_t pair(int src, int dst) {
    if (src == dst) throw InternalError("NCCL transport: a rank cannot message itself");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pairs_.find({src, dst});
      if (it != pairs_.end()) return it->second.get();
    }
    CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    const int me = mpi_.rank();
    if (me == src) {
      NCCL_CHECK(ncclGetUniqueId(&id));
      MPI_CHECK(MPI_Send(&id, sizeof id, MPI_BYTE, dst, 0, id_comm_));
    } else {
      MPI_CHECK(MPI_Recv(&id, sizeof id, MPI_BYTE, src, 0, id_comm_, MPI_STATUS_IGNORE));
    }
    ncclComm_t c = nullptr;
    NCCL_CHECK(ncclCommInitRank(&c, 2, id, me == src ? 0 : 1));
    std::lock_guard<std::mutex> lock(mutex_);
    return pairs_.emplace(std::make_pair(src, dst), NcclComm(c)).first->second.get();
  }

  /// Polls the connect stream until the exchange of link (src, dst) is done; throws after
  /// --timeout or when a lane abort is requested (a peer failed), naming the link.
  void wait_connected(int src, int dst) const {
    const double t0 = monotonic_s();
    double sleep_us = 5.0;
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(connect_stream_->get());
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) CUDA_CHECK(rc);
      const std::string link = "link " + std::to_string(src) + " -> " + std::to_string(dst);
      if (lane_abort_requested()) throw InternalError("NCCL transport: connecting " + link + " aborted: " + lane_abort_reason());
      if (monotonic_s() - t0 > timeout_s_)
        throw InternalError("NCCL transport: connecting " + link + " did not finish within --timeout " +
                            std::to_string(static_cast<int>(timeout_s_)) + " s (is rank " +
                            std::to_string(mpi_.rank() == src ? dst : src) + " alive?)");
      timespec ts{0, static_cast<long>(sleep_us * 1e3)};
      nanosleep(&ts, nullptr);
      sleep_us = std::min(sleep_us * 2.0, 1000.0);
    }
  }

  const MpiContext& mpi_;
  int device_ = 0;
  double timeout_s_ = 300.0;
  std::unique_ptr<cuda::Stream> connect_stream_;       ///< connect()'s exchanges
  std::unique_ptr<cuda::DeviceMemory> connect_buf_;    ///< their 1-byte message
  std::unique_ptr<Transport> mpi_transport_;  // for the barrier
  MPI_Comm id_comm_ = MPI_COMM_NULL;
  NcclComm world_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, int>, NcclComm> pairs_;
};

class StagedMpiTransport final : public Transport {
 public:
  StagedMpiTransport(const MpiContext& mpi, const MpiPollConfig& poll) : inner_(create_mpi_transport(mpi, poll)) {}
  std::string name() const override { return "mpi"; }

  void enqueue_send(Lane& lane, const void* buf, size_t bytes, int peer, int tag) override {
    void* st = staging(lane, 0, bytes);
    lane.copy(st, buf, bytes);
    inner_->enqueue_send(lane, st, bytes, peer, tag);
  }
  void enqueue_recv(Lane& lane, void* buf, size_t bytes, int peer, int tag) override {
    void* st = staging(lane, 1, bytes);
    inner_->enqueue_recv(lane, st, bytes, peer, tag);
    lane.copy(buf, st, bytes);
  }
  void enqueue_barrier(Lane& lane) override { inner_->enqueue_barrier(lane); }

 private:
  /// The pinned buffer of (lane, direction), grown as needed; outgrown buffers stay alive until
  /// the transport goes, since work already enqueued may still use them.
  void* staging(Lane& lane, int dir, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<cuda::PinnedMemory>& v = buffers_[{&lane, dir}];
    if (v.empty() || v.back().bytes() < bytes) v.emplace_back(std::max<size_t>(bytes, 1 << 16), cudaHostAllocPortable);
    return v.back().get();
  }

  std::unique_ptr<Transport> inner_;
  std::mutex mutex_;
  std::map<std::pair<const Lane*, int>, std::vector<cuda::PinnedMemory>> buffers_;
};

}  // namespace

bool every_rank_has_own_gpu(const MpiContext& mpi, const std::string& bus_id) {
  const std::vector<std::string> all = mpi.gather_strings(mpi.machine_id() + "/" + bus_id);
  std::vector<int> ok{1};
  if (mpi.is_root()) {
    std::set<std::string> seen(all.begin(), all.end());
    ok[0] = seen.size() == all.size() ? 1 : 0;
  }
  mpi.bcast_ints(ok);
  return ok[0] == 1;
}

std::unique_ptr<Transport> create_nccl_transport(const MpiContext& mpi, const Device& device, const MpiPollConfig& poll) {
  return std::make_unique<NcclTransport>(mpi, cuda_device_ordinal(device), poll);
}

std::unique_ptr<Transport> create_staged_mpi_transport(const MpiContext& mpi, const MpiPollConfig& poll) {
  return std::make_unique<StagedMpiTransport>(mpi, poll);
}

}  // namespace ppb
