#include "mpi/mpi_context.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "common/check.h"
#include "common/clock.h"
#include "common/error.h"

namespace ppb {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

MpiContext::MpiContext(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  finalize_ = true;
  // Errors come back as return codes (checked by MPI_CHECK) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  hostname_ = host;
  set_error_context(rank_, hostname_);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw InternalError("the MPI library does not provide MPI_THREAD_MULTIPLE (got level " +
                        std::to_string(provided) + "); ppbench's recv/send lanes need it");
  }
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &local_size_));
  MPI_Comm_free(&local);
}

MpiContext::~MpiContext() {
  if (finalize_) MPI_Finalize();
}

int MpiContext::agree(int local_status) const {
  int global = 0;
  MPI_CHECK(MPI_Allreduce(&local_status, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return global;
}

void MpiContext::barrier() const { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

void MpiContext::quiet_barrier(double poll_s) const {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
  int done = 0;
  const auto pause = std::chrono::duration<double>(poll_s);
  while (true) {
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(pause);
  }
}

std::vector<std::string> MpiContext::gather_strings(const std::string& mine) const {
  std::vector<int> chars(mine.begin(), mine.end());
  auto all = gatherv_ints(chars);
  std::vector<std::string> out;
  for (const auto& v : all) out.emplace_back(v.begin(), v.end());
  return out;
}

std::vector<double> MpiContext::gather_doubles(const std::vector<double>& mine) const {
  std::vector<double> all(rank_ == 0 ? mine.size() * size_ : 0);
  MPI_CHECK(MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                       static_cast<int>(mine.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD));
  return all;
}

namespace {
template <typename T>
std::vector<std::vector<T>> gatherv(const std::vector<T>& mine, MPI_Datatype type, int rank, int size) {
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(size), displs(size);
  MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<T> flat;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += counts[r];
    }
    flat.resize(total);
  }
  MPI_CHECK(MPI_Gatherv(mine.data(), count, type, flat.data(), counts.data(), displs.data(), type, 0,
                        MPI_COMM_WORLD));
  std::vector<std::vector<T>> out;
  if (rank == 0) {
    for (int r = 0; r < size; ++r)
      out.emplace_back(flat.begin() + displs[r], flat.begin() + displs[r] + counts[r]);
  }
  return out;
}
}  // namespace

std::vector<std::vector<double>> MpiContext::gatherv_doubles(const std::vector<double>& mine) const {
  return gatherv(mine, MPI_DOUBLE, rank_, size_);
}

std::vector<std::vector<int>> MpiContext::gatherv_ints(const std::vector<int>& mine) const {
  return gatherv(mine, MPI_INT, rank_, size_);
}

void MpiContext::bcast_ints(std::vector<int>& data) const {
  int n = static_cast<int>(data.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD));
  data.resize(n);
  MPI_CHECK(MPI_Bcast(data.data(), n, MPI_INT, 0, MPI_COMM_WORLD));
}

void MpiContext::bcast_doubles(std::vector<double>& data) const {
  int n = static_cast<int>(data.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD));
  data.resize(n);
  MPI_CHECK(MPI_Bcast(data.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD));
}

void MpiContext::bcast_string(std::string& s) const {
  int n = static_cast<int>(s.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD));
  s.resize(n);
  MPI_CHECK(MPI_Bcast(s.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD));
}

std::vector<double> MpiContext::clock_offsets() const {
  constexpr int kRounds = 20;
  constexpr int kTag = 7001;
  std::vector<double> offsets(size_, 0.0);
  for (int peer = 1; peer < size_; ++peer) {
    if (rank_ == 0) {
      double best_rtt = std::numeric_limits<double>::infinity();
      for (int i = 0; i < kRounds; ++i) {
        double t_send = monotonic_s();
        double t_peer = 0.0;
        MPI_CHECK(MPI_Send(&t_send, 1, MPI_DOUBLE, peer, kTag, MPI_COMM_WORLD));
        MPI_CHECK(MPI_Recv(&t_peer, 1, MPI_DOUBLE, peer, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        double t_recv = monotonic_s();
        if (t_recv - t_send < best_rtt) {
          best_rtt = t_recv - t_send;
          offsets[peer] = t_peer - 0.5 * (t_send + t_recv);
        }
      }
    } else if (rank_ == peer) {
      for (int i = 0; i < kRounds; ++i) {
        double t = 0.0;
        MPI_CHECK(MPI_Recv(&t, 1, MPI_DOUBLE, 0, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        t = monotonic_s();
        MPI_CHECK(MPI_Send(&t, 1, MPI_DOUBLE, 0, kTag, MPI_COMM_WORLD));
      }
    }
  }
  return offsets;
}

std::pair<double, double> MpiContext::link_model(size_t big_bytes) const {
  std::vector<double> result{0.0, 0.0};
  if (size_ > 1 && rank_ <= 1) {
    constexpr int kTag = 7002;
    const int peer = 1 - rank_;
    std::vector<char> buf(big_bytes, 1);
    auto min_rtt = [&](size_t bytes, int rounds) {
      double best = 1e300;
      for (int i = 0; i < rounds; ++i) {
        double t0 = monotonic_s();
        if (rank_ == 0) {
          MPI_CHECK(MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, kTag, MPI_COMM_WORLD));
          MPI_CHECK(MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        } else {
          MPI_CHECK(MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
          MPI_CHECK(MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, kTag, MPI_COMM_WORLD));
        }
        best = std::min(best, monotonic_s() - t0);
      }
      return best;
    };
    const double small = min_rtt(8, 20);
    const double big = min_rtt(big_bytes, 5);
    const double latency = small / 2;
    result = {latency, static_cast<double>(big_bytes) / std::max(big / 2 - latency, 1e-9)};
  }
  bcast_doubles(result);
  return {result[0], result[1]};
}

std::string MpiContext::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string v(text, len);
  auto nl = v.find_first_of("\n,");
  return nl == std::string::npos ? v : v.substr(0, nl);
}

}  // namespace ppb
