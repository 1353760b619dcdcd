// The latency-bandwidth (Hockney, α-β) model of a link fitted to a sweep of message sizes: the
// link probe's (transport/link_probe.h) one fit, whose latency and bandwidth the balancer and
// the simulators charge per message (common/transfer.h link_transfer_ms). Pure arithmetic.
#pragma once

#include <vector>

namespace ppb {

/// One message size of a ping-pong sweep: one-way times, i.e. round trips / 2, in seconds.
struct LinkSample {
  double bytes = 0.0;     ///< message size, bytes
  double min_s = 0.0;     ///< fastest round trip / 2 over the size's repetitions
  double median_s = 0.0;  ///< median round trip / 2 (what fit_link fits)
  int reps = 0;           ///< timed round trips
};

/// A fitted link: one message of n bytes takes latency_s + n / bandwidth_Bps.
struct LinkFit {
  double latency_s = 0.0;      ///< α, s (>= 0)
  double bandwidth_Bps = 0.0;  ///< 1/β, bytes/s; 0 = no size dependence found (infinite, as link_transfer_ms reads it)
  /// The fit's bound: max over the samples of |model − median_s| / median_s. Every sample's
  /// median time is within this fraction of the model's (the figure the tests hold it to).
  double max_rel_error = 0.0;
};

/// Fits t(n) = α + n·β to each sample's median one-way time `median_s` by least squares in
/// relative error: minimises Σ ((α + β n_i − t_i) / t_i)², so that 8 B and 256 MiB weigh alike.
/// (Unweighted least squares lets the largest sizes alone set α: on links of microseconds it
/// comes out negative or as noise of the 100 ms transfers.) α and β are kept >= 0: where the
/// unconstrained optimum has one negative, the other is refitted alone with it at 0. The fit is
/// linear in (α, β) (a 2x2 normal system). Medians, not MpiContext::link_matrix's fastest round
/// trips: through the MPI transport's polling lanes the fastest 8 B round trip caught a message
/// before the first sleep (4 us one way, measured here) where the median paid the sleep the
/// pipeline's messages pay (45 us); on NCCL the two are close.
/// @throws ppb::InternalError when no sample has a positive, finite time and size >= 0.
LinkFit fit_link(const std::vector<LinkSample>& samples);

/// One-way seconds of `bytes` under `fit` (α + bytes / bandwidth; α alone where bandwidth is 0).
double link_fit_time_s(const LinkFit& fit, double bytes);

}  // namespace ppb
