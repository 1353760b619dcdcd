// The tensor-parallel group of a CPU stage over MPI (backend/tensor_parallel.h, transport.h).
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/tensor_parallel.h"
#include "common/check.h"
#include "common/error.h"
#include "mpi/mpi_context.h"
#include "transport/transport.h"

namespace ppb {
namespace {

class MpiTpGroup final : public TpGroup {
 public:
  MpiTpGroup(MPI_Comm comm, const MpiPollConfig& poll) : comm_(comm), poll_(poll) {
    MPI_CHECK(MPI_Comm_size(comm_, &width_));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  }
  ~MpiTpGroup() override { MPI_Comm_free(&comm_); }
  MpiTpGroup(const MpiTpGroup&) = delete;
  MpiTpGroup& operator=(const MpiTpGroup&) = delete;

  int width() const override { return width_; }
  int rank() const override { return rank_; }

  void allreduce_sum(float* data, size_t n) override {
    if (n > static_cast<size_t>(INT32_MAX)) throw InternalError("tensor-parallel all-reduce of " + std::to_string(n) + " floats exceeds MPI's int count");
    gathered_.resize(n * width_);  // grows on the first forward of each size (the warm-up's)
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(data, static_cast<int>(n), MPI_FLOAT, gathered_.data(), static_cast<int>(n), MPI_FLOAT,
                             comm_, &req));
    poll_mpi_request(&req, poll_, "tensor-parallel all-reduce of " + std::to_string(n) + " floats",
                     MpiRequestKind::collective);
    parts_.resize(width_);
    for (int r = 0; r < width_; ++r) parts_[r] = gathered_.data() + static_cast<size_t>(r) * n;
    tp_sum_in_rank_order(data, parts_.data(), width_, n);
  }

  void allreduce_argmax(float* value, int32_t* id, int rows) override {
    // Every rank's (value, id) pairs, then tp_argmax_in_rank_order: the rule ThreadTpGroups and
    // the CUDA head apply (a NaN never wins), not MPI_MAXLOC's (which leaves NaN undefined).
    mine_.resize(2 * static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) {
      std::memcpy(&mine_[2 * i], &value[i], sizeof(float));
      std::memcpy(&mine_[2 * i + 1], &id[i], sizeof(int32_t));
    }
    pairs_.resize(mine_.size() * width_);
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(mine_.data(), 2 * rows, MPI_INT32_T, pairs_.data(), 2 * rows, MPI_INT32_T, comm_, &req));
    poll_mpi_request(&req, poll_, "tensor-parallel argmax of " + std::to_string(rows) + " rows",
                     MpiRequestKind::collective);
    values_.assign(static_cast<size_t>(rows) * width_, 0.0f);
    ids_.assign(static_cast<size_t>(rows) * width_, 0);
    std::vector<const float*> vp(width_);
    std::vector<const int32_t*> ip(width_);
    for (int r = 0; r < width_; ++r) {
      for (int i = 0; i < rows; ++i) {
        const size_t at = (static_cast<size_t>(r) * rows + i) * 2;
        std::memcpy(&values_[static_cast<size_t>(r) * rows + i], &pairs_[at], sizeof(float));
        ids_[static_cast<size_t>(r) * rows + i] = pairs_[at + 1];
      }
      vp[r] = values_.data() + static_cast<size_t>(r) * rows;
      ip[r] = ids_.data() + static_cast<size_t>(r) * rows;
    }
    tp_argmax_in_rank_order(value, id, vp.data(), ip.data(), width_, rows);
  }

 private:
  MPI_Comm comm_;
  MpiPollConfig poll_;
  int width_ = 1;
  int rank_ = 0;
  // Members, not locals: a collective abandoned on abort may still write into them.
  std::vector<float> gathered_;
  std::vector<const float*> parts_;
  std::vector<int32_t> mine_, pairs_;
  std::vector<float> values_;
  std::vector<int32_t> ids_;
};

}  // namespace

std::unique_ptr<TpGroup> create_mpi_tp_group(const MpiContext& mpi, int color, int key, const MpiPollConfig& poll) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(mpi.comm(), color < 0 ? MPI_UNDEFINED : color, key, &comm));
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiTpGroup>(comm, poll);
}

}  // namespace ppb
