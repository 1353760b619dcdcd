// MPI start-up and the communicator facts every phase needs: rank, world size, node-local rank,
// hostname; plus the small collectives ppbench uses (error agreement, gather of strings/doubles).
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ppb {

/// Owns MPI_Init_thread/MPI_Finalize (MPI_THREAD_MULTIPLE: the recv and send lanes call MPI
/// from their own threads). One per process.
class MpiContext {
 public:
  /// Initialises MPI. @throws InternalError if MPI_THREAD_MULTIPLE is not provided.
  MpiContext(int* argc, char*** argv);
  ~MpiContext();
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Rank within this node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), and ranks on this node.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& hostname() const { return hostname_; }
  /// The machine this rank runs on: the running kernel's boot id
  /// (/proc/sys/kernel/random/boot_id, a random UUID drawn at every boot), or "host:<hostname>"
  /// where it cannot be read. Ranks in containers or network/UTS namespaces of one machine are
  /// different MPI nodes (different hostnames, no shared-memory transport) yet share this id,
  /// and with it the machine's memory bandwidth, caches and free memory. (A VM cloned from a
  /// running snapshot keeps its source's boot id: such clones would count as one machine.)
  const std::string& machine_id() const { return machine_id_; }
  /// Every rank's machine_id ([size], index = rank; at most 127 characters each), gathered once
  /// at start-up. Valid on every rank.
  const std::vector<std::string>& machine_ids() const { return machine_ids_; }
  /// Rank among the ranks with this rank's machine_id, and their count: the ranks whose memory
  /// traffic contends (a superset of the node's, local_rank/local_size).
  int machine_rank() const { return machine_rank_; }
  int machine_size() const { return machine_size_; }
  MPI_Comm comm() const { return MPI_COMM_WORLD; }
  bool is_root() const { return rank_ == 0; }

  /// Collective: every rank passes its local status (0 = ok); returns the maximum over ranks.
  /// Used after each phase that can fail on some ranks only, so that all ranks stop together
  /// (exit status 2 for user errors) instead of leaving peers blocked in a later collective.
  int agree(int local_status) const;

  /// Collective: a barrier that waits without spinning a core (MPI_Ibarrier polled every
  /// `poll_s` seconds with a sleep between), for ranks that wait while another rank of their
  /// node measures something alone: a spinning MPI_Barrier would take that rank's core.
  /// `on_poll`, when set, runs at every poll (e.g. the watchdog's heartbeat of a rank that waits
  /// for another's long measurement).
  void quiet_barrier(double poll_s = 1e-3, const std::function<void()>& on_poll = {}) const;
  /// Collective: MPI_Barrier (spins while it waits: for aligning short timed work across ranks).
  void barrier() const;

  /// Collective: gathers one string per rank on rank 0 (other ranks get an empty vector).
  std::vector<std::string> gather_strings(const std::string& mine) const;
  /// Collective: gathers `mine` (same length on every rank) on rank 0, rank-major.
  std::vector<double> gather_doubles(const std::vector<double>& mine) const;
  /// Collective: gathers variable-length vectors on rank 0 (MPI_Gatherv); [rank] -> data.
  std::vector<std::vector<double>> gatherv_doubles(const std::vector<double>& mine) const;
  std::vector<std::vector<int>> gatherv_ints(const std::vector<int>& mine) const;
  /// Collective: broadcasts from rank 0.
  void bcast_ints(std::vector<int>& data) const;
  void bcast_doubles(std::vector<double>& data) const;
  void bcast_string(std::string& s) const;

  /// Collective: offset of each rank's CLOCK_MONOTONIC to rank 0's, estimated by ping-pong
  /// (20 round trips per rank, the one with the smallest round trip kept: offset =
  /// t_peer - (t_send + t_recv) / 2, as in NTP/Cristian's algorithm). Valid on rank 0;
  /// [size] seconds; subtract from a rank's time to get rank 0's clock.
  std::vector<double> clock_offsets() const;

  /// Collective: latency (s) and bandwidth (bytes/s) of the link rank 0 <-> rank 1, from
  /// blocking ping-pongs with host buffers (min round trip of 20 x 8 B and 5 x `big_bytes`;
  /// latency = rtt_small / 2, bandwidth = big_bytes / (rtt_big / 2), see link_matrix). {0, 0}
  /// with one rank. Valid on every rank. What the MPI
  /// transport's messages see, less the lanes' polling delay.
  std::pair<double, double> link_model(size_t big_bytes = 4 << 20) const;

  /// Links measured pair by pair: [size * size] row-major, symmetric, NaN where not measured
  /// (and on the diagonal).
  struct LinkMatrix {
    std::vector<double> latency_s, bandwidth_Bps;
  };
  /// Collective: link_model's ping-pongs between each pair (a, b) of `pairs` (ranks, a != b), one
  /// pair at a time (a quiet barrier between pairs: no two pairs share a link or a core while
  /// timed, and the other ranks sleep instead of spinning).
  /// Valid on every rank. Issue 16: a boundary inside a node crosses shared memory, one between
  /// nodes the network; the balancer's one link (ranks 0 <-> 1) sees only one of them.
  /// @throws ppb::InternalError for a pair outside [0, size) or with a == b.
  LinkMatrix link_matrix(const std::vector<std::pair<int, int>>& pairs, size_t big_bytes = 4 << 20) const;

  /// "Open MPI v4.1.4, ..." (MPI_Get_library_version, first line).
  static std::string library_version();

  /// machine_id's value from a boot id file (first line, trailing space dropped), or
  /// "host:<hostname>" where the file is missing or empty. Pure: tested without MPI.
  static std::string read_machine_id(const std::string& boot_id_path, const std::string& hostname);
  /// The MPI_Comm_split colour of each rank from every rank's machine id ([size]): the first
  /// rank with an equal id, so the ranks of one machine share a colour and others differ. Pure.
  static std::vector<int> machine_colours(const std::vector<std::string>& ids);

 private:
  /// Collective (constructor): machine_id, machine_rank, machine_size.
  void split_by_machine();

  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::string hostname_;
  std::string machine_id_;
  std::vector<std::string> machine_ids_;
  int machine_rank_ = 0;
  int machine_size_ = 1;
  bool finalize_ = false;
};

}  // namespace ppb
