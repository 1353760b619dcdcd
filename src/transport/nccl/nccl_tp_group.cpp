// The tensor-parallel group of a CUDA stage (issue 14): one NCCL communicator per group.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/lane_abort.h"
#include "backend/tensor_parallel.h"
#include "common/check.h"
#include "common/error.h"
#include "mpi/mpi_context.h"
#include "transport/nccl/nccl_transport.h"

namespace ppb {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
  }
  throw InternalError("no NCCL type for dtype " + std::string(dtype_name(t)));
}

/// A group's communicator: its collectives are enqueued on the caller's stream; the host
/// collectives of TpGroup (the CPU stage's) are refused.
class NcclTpGroup final : public TpGroup {
 public:
  /// host_comm: the group's ranks as an MPI communicator (owned; MPI_COMM_NULL for groups of
  /// one process), for barrier().
  NcclTpGroup(ncclComm_t comm, int width, int rank, MPI_Comm host_comm)
      : comm_(comm), host_comm_(host_comm), width_(width), rank_(rank) {}
  ~NcclTpGroup() override {
    if (host_comm_ != MPI_COMM_NULL) MPI_Comm_free(&host_comm_);
    if (!comm_) return;
    if (lane_abort_requested())
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
  }
  NcclTpGroup(const NcclTpGroup&) = delete;
  NcclTpGroup& operator=(const NcclTpGroup&) = delete;

  int width() const override { return width_; }
  int rank() const override { return rank_; }
  size_t device_bytes() const override { return device_bytes_; }
  void set_device_bytes(size_t bytes) { device_bytes_ = bytes; }
  void allreduce_sum(float*, size_t) override { refuse("allreduce_sum"); }
  void allreduce_argmax(float*, int32_t*, int) override { refuse("allreduce_argmax"); }
  /// The profile's meeting after each rank's cache flush (MPI over the group's ranks).
  void barrier() override {
    if (host_comm_ == MPI_COMM_NULL) refuse("barrier");
    MPI_CHECK(MPI_Barrier(host_comm_));
  }

  void enqueue_allreduce_sum(void* data, size_t n, DType dtype, void* stream) override {
    NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type(dtype), ncclSum, comm_, static_cast<cudaStream_t>(stream)));
  }
  void enqueue_allgather(const void* send, void* recv, size_t bytes, void* stream) override {
    NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)));
  }

 private:
  [[noreturn]] static void refuse(const char* what) {
    throw InternalError(std::string("the NCCL tensor-parallel group has no host ") + what +
                        " (device memory only: enqueue_allreduce_sum, enqueue_allgather)");
  }
  ncclComm_t comm_ = nullptr;
  MPI_Comm host_comm_ = MPI_COMM_NULL;
  int width_ = 1, rank_ = 0;
  size_t device_bytes_ = 0;
};

/// The device's free memory now, bytes (cudaMemGetInfo).
size_t device_free_bytes() {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

}  // namespace


namespace {

/// Connects every channel the stage's collectives will use, now, not inside a timed forward
/// while the transport's kernels may spin on this GPU (NcclTransport::connect's reason) and
/// never inside a CUDA-graph capture: NCCL >= 2.22 connects lazily per size class unless
/// NCCL_RUNTIME_CONNECT=0 (which main sets; a test or library user may not). All-reduces of
/// 4 B (a decode step's LL protocol), 256 KiB (LL128) and 64 MiB (Simple, a prefill's
/// activations: B=8 x P=2048 x 4096 bf16 is 64 MiB) and an all-gather (the argmax pairs),
/// on a private stream, waited for.
void warm_up(TpGroup& group) {
  cudaStream_t st = nullptr;
  void* buf = nullptr;
  const size_t big = size_t{64} << 20;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(&buf, big + static_cast<size_t>(group.width()) * 8));
  CUDA_CHECK(cudaMemsetAsync(buf, 0, big + static_cast<size_t>(group.width()) * 8, st));
  for (size_t bytes : {size_t{4}, size_t{256} << 10, big}) group.enqueue_allreduce_sum(buf, bytes / 4, DType::f32, st);
  group.enqueue_allgather(buf, static_cast<char*>(buf) + 8, 8, st);
  const cudaError_t done = cudaStreamSynchronize(st);
  cudaFree(buf);
  cudaStreamDestroy(st);
  CUDA_CHECK(done);
}

}  // namespace

std::unique_ptr<TpGroup> create_nccl_tp_group(const MpiContext& mpi, int color, int key, const Device& device) {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(mpi.comm(), color < 0 ? MPI_UNDEFINED : color, key, &sub));
  ncclResult_t rc = ncclSuccess;
  ncclComm_t comm = nullptr;
  int width = 1, rank = 0;
  size_t free_before = 0;
  if (sub != MPI_COMM_NULL) {
    MPI_CHECK(MPI_Comm_size(sub, &width));
    MPI_CHECK(MPI_Comm_rank(sub, &rank));
    CUDA_CHECK(cudaSetDevice(cuda_device_ordinal(device)));
    free_before = device_free_bytes();
    ncclUniqueId id{};
    if (rank == 0) rc = ncclGetUniqueId(&id);
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, sub));
    if (rc == ncclSuccess) rc = ncclCommInitRank(&comm, width, id, rank);
  }
  // Agree on every rank before going on: a rank whose init failed must not leave the others in
  // a later collective.
  if (mpi.agree(rc == ncclSuccess ? 0 : 1) != 0) {
    if (comm) ncclCommDestroy(comm);
    if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
    throw UserError(std::string("--tp: NCCL could not make a tensor-parallel group (") +
                    (rc == ncclSuccess ? "failed on another rank" : ncclGetErrorString(rc)) +
                    "); every rank of a tensor-parallel stage needs its own GPU");
  }
  if (!comm) return nullptr;
  auto group = std::make_unique<NcclTpGroup>(comm, width, rank, sub);
  warm_up(*group);  // its scratch is freed again: what stays is the communicator's
  const size_t free_after = device_free_bytes();
  group->set_device_bytes(free_before > free_after ? free_before - free_after : 0);
  return group;
}

std::vector<std::unique_ptr<TpGroup>> create_local_nccl_tp_groups(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::unique_ptr<TpGroup>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclTpGroup>(comms[r], n, r, MPI_COMM_NULL));
  return out;
}

}  // namespace ppb
