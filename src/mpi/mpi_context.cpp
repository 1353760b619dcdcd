#include "mpi/mpi_context.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

#include "common/check.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/flight_recorder.h"

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
  split_by_machine();
}

std::string MpiContext::read_machine_id(const std::string& boot_id_path, const std::string& hostname) {
  std::ifstream in(boot_id_path);
  std::string id;
  if (in && std::getline(in, id)) {
    while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back()))) id.pop_back();
  }
  if (id.empty()) return "host:" + hostname;
  return id;
}

std::vector<int> MpiContext::machine_colours(const std::vector<std::string>& ids) {
  std::map<std::string, int> first;  // O(R log R): start-up of jobs of many thousand ranks
  std::vector<int> colours(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) colours[r] = first.emplace(ids[r], static_cast<int>(r)).first->second;
  return colours;
}

void MpiContext::split_by_machine() {
  machine_id_ = read_machine_id("/proc/sys/kernel/random/boot_id", hostname_);
  // Every rank's id, fixed width (a boot id is 36 characters, a hostname at most 64 + "host:").
  constexpr int kWidth = 128;
  std::vector<char> mine(kWidth, '\0'), all(static_cast<size_t>(kWidth) * size_, '\0');
  std::copy_n(machine_id_.begin(), std::min<size_t>(machine_id_.size(), kWidth - 1), mine.begin());
  MPI_CHECK(MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, MPI_COMM_WORLD));
  machine_ids_.clear();
  for (int r = 0; r < size_; ++r) machine_ids_.emplace_back(all.data() + static_cast<size_t>(r) * kWidth);
  MPI_Comm machine;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, machine_colours(machine_ids_)[rank_], rank_, &machine));
  MPI_CHECK(MPI_Comm_rank(machine, &machine_rank_));
  MPI_CHECK(MPI_Comm_size(machine, &machine_size_));
  MPI_Comm_free(&machine);
}

MpiContext::~MpiContext() {
  if (finalize_) MPI_Finalize();
}

int MpiContext::agree(int local_status) const {
  int global = 0;
  flight::Waiting waiting("MPI_Allreduce (agree)");
  MPI_CHECK(MPI_Allreduce(&local_status, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return global;
}

void MpiContext::barrier() const {
  flight::Waiting waiting("MPI_Barrier");
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

void MpiContext::quiet_barrier(double poll_s, const std::function<void()>& on_poll) const {
  MPI_Request req = MPI_REQUEST_NULL;
  flight::Waiting waiting("MPI_Ibarrier (quiet barrier)");
  MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
  int done = 0;
  const auto pause = std::chrono::duration<double>(poll_s);
  while (true) {
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (on_poll) on_poll();
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
  flight::Waiting waiting("MPI_Gather");
  MPI_CHECK(MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                       static_cast<int>(mine.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD));
  return all;
}

namespace {
template <typename T>
std::vector<std::vector<T>> gatherv(const std::vector<T>& mine, MPI_Datatype type, int rank, int size) {
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(size), displs(size);
  flight::Waiting waiting("MPI_Gatherv");
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
  flight::Waiting waiting("MPI_Bcast");
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD));
  data.resize(n);
  MPI_CHECK(MPI_Bcast(data.data(), n, MPI_INT, 0, MPI_COMM_WORLD));
}

void MpiContext::bcast_doubles(std::vector<double>& data) const {
  int n = static_cast<int>(data.size());
  flight::Waiting waiting("MPI_Bcast");
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD));
  data.resize(n);
  MPI_CHECK(MPI_Bcast(data.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD));
}

void MpiContext::bcast_string(std::string& s) const {
  int n = static_cast<int>(s.size());
  flight::Waiting waiting("MPI_Bcast");
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

namespace {

/// Latency (s) and bandwidth (B/s) of the link to `peer` from blocking ping-pongs with host
/// buffers: min round trip of 20 x 8 B and of 5 x big_bytes; latency = rtt_small / 2, bandwidth
/// = big_bytes / (rtt_big / 2). The latency is not subtracted from the large transfer: it is
/// under 2% of 4 MiB on any host link up to 25 GB/s with microseconds of latency, and a latency
/// inflated by a busy core (2-4 ms measured inside a node of the two-node test, tests/e2e) made
/// big_bytes / (rtt_big / 2 - latency) blow up to 4e15 B/s; a slope between two large sizes was
/// no steadier (+23% on the shaped link). `leader`: this rank sends first.
std::pair<double, double> ping_pong(int peer, bool leader, size_t big_bytes) {
  constexpr int kTag = 7002;
  std::vector<char> buf(big_bytes, 1);
  auto min_rtt = [&](size_t bytes, int rounds) {
    double best = 1e300;
    for (int i = 0; i < rounds; ++i) {
      double t0 = monotonic_s();
      if (leader) {
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
  return {small / 2, static_cast<double>(big_bytes) / std::max(big / 2, 1e-9)};
}

}  // namespace

std::pair<double, double> MpiContext::link_model(size_t big_bytes) const {
  if (size_ < 2) return {0.0, 0.0};
  const LinkMatrix m = link_matrix({{0, 1}}, big_bytes);
  return {m.latency_s[1], m.bandwidth_Bps[1]};
}

MpiContext::LinkMatrix MpiContext::link_matrix(const std::vector<std::pair<int, int>>& pairs, size_t big_bytes) const {
  const size_t n = static_cast<size_t>(size_) * size_;
  // Measured values on the pair's leader, -1 elsewhere; a max-reduction gives every rank all.
  std::vector<double> mine(2 * n, -1.0), all(2 * n, -1.0);
  for (const auto& [a, b] : pairs) {
    if (a < 0 || b < 0 || a >= size_ || b >= size_ || a == b)
      throw InternalError("link_matrix: pair (" + std::to_string(a) + ", " + std::to_string(b) + ") is not two ranks of " +
                          std::to_string(size_));
    // The ranks not in the pair wait in the next quiet barrier, asleep: spinning in MPI they
    // would take the pair's cores on an oversubscribed node (4 ranks on 2 cores timed 2-4 ms
    // "latencies" within a node that way).
    quiet_barrier(1e-3);
    if (rank_ != a && rank_ != b) continue;
    const auto [lat, bw] = ping_pong(rank_ == a ? b : a, rank_ == a, big_bytes);
    if (rank_ == a) {
      for (size_t idx : {static_cast<size_t>(a) * size_ + b, static_cast<size_t>(b) * size_ + a}) {
        mine[idx] = lat;
        mine[n + idx] = bw;
      }
    }
  }
  MPI_CHECK(MPI_Allreduce(mine.data(), all.data(), static_cast<int>(2 * n), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  LinkMatrix m;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < n; ++i) {
    m.latency_s.push_back(all[i] < 0 ? nan : all[i]);
    m.bandwidth_Bps.push_back(all[n + i] < 0 ? nan : all[n + i]);
  }
  return m;
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
