// The link probe (issue 35 item 3): ping-pongs between pairs of ranks through the pipeline's own
// Transport, from the backend's device buffers on one of its lanes, over a sweep of message
// sizes (8 B .. 256 MiB), each pair's times fitted by the latency-bandwidth model
// (common/link_fit.h). On CPU ranks it is the MPI transport on host memory, polling lanes
// included; on GPUs with --transport nccl it is ncclSend/ncclRecv on device memory, which
// MpiContext::link_matrix's host ping-pong cannot see (NVLink priced at host-MPI speed).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "common/link_fit.h"

namespace ppb {

class Device;
class MpiContext;
class Transport;

/// How far and how long the probe sweeps.
struct LinkProbeConfig {
  size_t max_bytes = size_t(256) << 20;  ///< largest message (the issue's 256 MiB)
  /// The largest message is also at most this fraction of the smallest Device::free_memory()
  /// over the ranks (each end holds one buffer of it while its pair is probed).
  double memory_fraction = 1.0 / 16;
  /// A pair's sweep stops before a size above 1 MiB whose min_reps + 1 round trips, predicted
  /// by the fit of the sizes before it, would end past this many seconds after the pair's links
  /// were connected. Up to 1 MiB every size is swept (the fit needs sizes the bandwidth rules).
  double pair_budget_s = 0.5;
  /// Timed round trips of a size: this many seconds over its predicted round trip (at least
  /// the previous size's), within [min_reps, max_reps]; one more, untimed, before them.
  double size_budget_s = 0.05;
  int min_reps = 3, max_reps = 20;
  int tag = 7400;  ///< the probe's messages (tag + 1: its control messages, MPI, host)
};

/// One pair's sweep: the sizes it reached, their one-way times, the fit, what it cost.
struct LinkSweep {
  int src = 0, dst = 0;  ///< the pair (src: the leader, the lower rank of the pair as given)
  std::vector<LinkSample> samples;  ///< ascending sizes
  LinkFit fit;
  double wall_s = 0.0;  ///< seconds the pair's sweep took on its leader (connect and buffers included)
  bool budget_stop = false;  ///< the time budget ended it before the largest size
};

/// The sizes a sweep may take up to `max_bytes`: 8 B, then 64 B x 4^k (64, 256, 1 KiB, ...,
/// 256 MiB): 13 sizes to 256 MiB, 4 MiB (link_matrix's size) among them.
std::vector<size_t> link_sweep_sizes(size_t max_bytes);

/// Collective over the world: for each pair (a, b) of `pairs` (a != b, in [0, size)), one pair
/// at a time with the others asleep in a quiet barrier (as MpiContext::link_matrix), connects
/// the pair's two links (Transport::connect: the NCCL transport makes and warms their
/// communicators here, the ones the pipeline then uses), then sweeps link_sweep_sizes upward:
/// rank a sends, b returns the message, timed on a's lane by events between round trips;
/// every size's one-way times (round trip / 2) kept as their min and median, the medians fitted
/// by fit_link.
/// Rank a decides each size's round trips and tells b (an MPI message on the host), so the
/// time budget needs no agreement in advance. Each rank holds one device buffer, grown to the
/// largest size its sweeps reached, while the probe runs. Returns every pair's sweep, in the order of `pairs`, on every
/// rank. @throws ppb::InternalError for a bad pair, a transport failure or timeout (its lane's).
std::vector<LinkSweep> probe_links(const MpiContext& mpi, Device& device, Transport& transport,
                                   const std::vector<std::pair<int, int>>& pairs, const LinkProbeConfig& cfg = {});

/// The sweeps' fits as [ranks][ranks] row-major matrices, symmetric, NaN where not probed
/// (and on the diagonal): latency s, bandwidth bytes/s (0 = infinite), the fit's max relative
/// error.
struct LinkFitMatrix {
  std::vector<double> latency_s, bandwidth_Bps, max_rel_error;
};
LinkFitMatrix link_fit_matrix(const std::vector<LinkSweep>& sweeps, int ranks);

}  // namespace ppb
