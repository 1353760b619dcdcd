// The tensor-parallel group of a CPU stage over MPI (backend/tensor_parallel.h, transport.h).
#include <mpi.h>

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
    poll_mpi_request(&req, poll_, "tensor-parallel all-reduce of " + std::to_string(n) + " floats");
    parts_.resize(width_);
    for (int r = 0; r < width_; ++r) parts_[r] = gathered_.data() + static_cast<size_t>(r) * n;
    tp_sum_in_rank_order(data, parts_.data(), width_, n);
  }

  void allreduce_argmax(float* value, int32_t* id, int rows) override {
    struct Pair {
      float value;
      int id;
    };
    std::vector<Pair> pairs(rows);
    for (int i = 0; i < rows; ++i) pairs[i] = {value[i], id[i]};
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, pairs.data(), rows, MPI_FLOAT_INT, MPI_MAXLOC, comm_, &req));
    poll_mpi_request(&req, poll_, "tensor-parallel argmax of " + std::to_string(rows) + " rows");
    for (int i = 0; i < rows; ++i) {
      value[i] = pairs[i].value;
      id[i] = pairs[i].id;
    }
  }

 private:
  MPI_Comm comm_;
  MpiPollConfig poll_;
  int width_ = 1;
  int rank_ = 0;
  std::vector<float> gathered_;
  std::vector<const float*> parts_;
};

}  // namespace

std::unique_ptr<TpGroup> create_mpi_tp_group(const MpiContext& mpi, int color, int key, const MpiPollConfig& poll) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(mpi.comm(), color < 0 ? MPI_UNDEFINED : color, key, &comm));
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiTpGroup>(comm, poll);
}

}  // namespace ppb
