#include "transport/link_probe.h"

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "backend/device.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/error.h"
#include "mpi/mpi_context.h"
#include "transport/transport.h"

namespace ppb {

namespace {

/// One end of a pair while it is probed: its lane, buffer and the transport.
struct ProbeEnd {
  Device& device;
  Transport& transport;
  Lane& lane;
  std::unique_ptr<Buffer>& buf;
  int peer;
  int tag;
  /// The buffer, grown to `bytes` first where smaller (the lane is idle between sizes): a sweep
  /// the budget stops at 64 MiB never allocates (and, on CPU, zeroes) 256 MiB.
  void* data(size_t bytes) const {
    if (!buf || buf->bytes() < bytes) {
      buf.reset();
      buf = device.allocate(bytes);
    }
    return buf->data();
  }
};

/// Leader: one untimed round trip of `bytes`, then `reps` timed ones, back to back on the lane;
/// each timed one between two events (on a GPU, device times: no host launch or wake-up in
/// them). Returns the one-way times, s.
std::vector<double> lead_round_trips(const ProbeEnd& e, size_t bytes, int reps) {
  std::vector<std::unique_ptr<Event>> ev;
  for (int i = 0; i <= reps; ++i) ev.push_back(e.device.create_event());
  void* buf = e.data(bytes);
  for (int i = -1; i < reps; ++i) {
    e.transport.enqueue_send(e.lane, buf, bytes, e.peer, e.tag);
    e.transport.enqueue_recv(e.lane, buf, bytes, e.peer, e.tag);
    e.lane.record(*ev[i + 1]);
  }
  e.lane.synchronize();
  std::vector<double> one_way;
  for (auto& x : ev) x->synchronize();
  for (int i = 0; i < reps; ++i) one_way.push_back((ev[i + 1]->time_s() - ev[i]->time_s()) / 2);
  return one_way;
}

/// Follower: returns `reps` + 1 messages of `bytes`.
void follow_round_trips(const ProbeEnd& e, size_t bytes, int reps) {
  void* buf = e.data(bytes);
  for (int i = -1; i < reps; ++i) {
    e.transport.enqueue_recv(e.lane, buf, bytes, e.peer, e.tag);
    e.transport.enqueue_send(e.lane, buf, bytes, e.peer, e.tag);
  }
  e.lane.synchronize();
}

LinkSample summarise(size_t bytes, std::vector<double> one_way) {
  std::sort(one_way.begin(), one_way.end());
  LinkSample s;
  s.bytes = static_cast<double>(bytes);
  s.reps = static_cast<int>(one_way.size());
  s.min_s = one_way.front();
  const size_t n = one_way.size();
  s.median_s = n % 2 ? one_way[n / 2] : 0.5 * (one_way[n / 2 - 1] + one_way[n / 2]);
  return s;
}

/// Sizes up to this are swept whatever the budget: the fit needs sizes the bandwidth dominates.
constexpr size_t kAlwaysSweptBytes = size_t(1) << 20;

/// Leader's side of one pair: the sweep, sizes upward until the largest or the time budget.
/// Tells the follower each size's round trips (0: done) before it.
LinkSweep lead_sweep(const ProbeEnd& e, const std::vector<size_t>& sizes, const LinkProbeConfig& cfg, double t0) {
  LinkSweep sweep;
  for (size_t bytes : sizes) {
    // The round trip predicted by the fit of the sizes so far (at least the last one's): the
    // previous size's scaled by the size ratio would charge a latency-bound 64 B four times
    // over at 256 B, and on a loaded machine end the sweep before any size saw the bandwidth.
    double est = 0;
    if (!sweep.samples.empty()) {
      est = std::max(2 * sweep.samples.back().median_s, 2 * link_fit_time_s(fit_link(sweep.samples), double(bytes)));
    }
    if (bytes > kAlwaysSweptBytes && est * (cfg.min_reps + 1) > cfg.pair_budget_s - (monotonic_s() - t0)) {
      sweep.budget_stop = true;
      break;
    }
    const int reps = est > 0 ? static_cast<int>(std::clamp(cfg.size_budget_s / est, double(cfg.min_reps), double(cfg.max_reps)))
                             : cfg.max_reps;
    MPI_CHECK(MPI_Send(&reps, 1, MPI_INT, e.peer, e.tag + 1, MPI_COMM_WORLD));
    sweep.samples.push_back(summarise(bytes, lead_round_trips(e, bytes, reps)));
  }
  const int done = 0;
  MPI_CHECK(MPI_Send(&done, 1, MPI_INT, e.peer, e.tag + 1, MPI_COMM_WORLD));
  return sweep;
}

void follow_sweep(const ProbeEnd& e, const std::vector<size_t>& sizes) {
  for (size_t bytes : sizes) {
    int reps = 0;
    MPI_CHECK(MPI_Recv(&reps, 1, MPI_INT, e.peer, e.tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    if (reps == 0) return;
    follow_round_trips(e, bytes, reps);
  }
  int done = -1;  // the leader's closing 0 after the largest size
  MPI_CHECK(MPI_Recv(&done, 1, MPI_INT, e.peer, e.tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
}

/// The sweeps as doubles, for the gather: per sweep src, dst, wall_s, budget_stop, latency,
/// bandwidth, max_rel_error, n, then n x (bytes, min_s, median_s, reps).
constexpr size_t kHead = 8, kPerSample = 4;
void encode(const LinkSweep& s, std::vector<double>& out) {
  out.insert(out.end(), {double(s.src), double(s.dst), s.wall_s, s.budget_stop ? 1.0 : 0.0, s.fit.latency_s,
                         s.fit.bandwidth_Bps, s.fit.max_rel_error, double(s.samples.size())});
  for (const LinkSample& x : s.samples) out.insert(out.end(), {x.bytes, x.min_s, x.median_s, double(x.reps)});
}

std::vector<LinkSweep> decode(const std::vector<double>& in) {
  std::vector<LinkSweep> out;
  for (size_t i = 0; i + kHead <= in.size();) {
    LinkSweep s;
    s.src = static_cast<int>(in[i]);
    s.dst = static_cast<int>(in[i + 1]);
    s.wall_s = in[i + 2];
    s.budget_stop = in[i + 3] != 0;
    s.fit = {in[i + 4], in[i + 5], in[i + 6]};
    const size_t n = static_cast<size_t>(in[i + 7]);
    i += kHead;
    if (i + n * kPerSample > in.size()) throw InternalError("probe_links: a truncated sweep in the gather");
    for (size_t k = 0; k < n; ++k, i += kPerSample) s.samples.push_back({in[i], in[i + 1], in[i + 2], static_cast<int>(in[i + 3])});
    out.push_back(std::move(s));
  }
  return out;
}

/// The largest sweep size every rank can hold: cfg.max_bytes within memory_fraction of each
/// rank's free memory (collective).
size_t agreed_max_bytes(const MpiContext& mpi, const Device& device, const LinkProbeConfig& cfg) {
  const double cap = std::min(static_cast<double>(cfg.max_bytes), cfg.memory_fraction * static_cast<double>(device.free_memory()));
  unsigned long long mine = static_cast<unsigned long long>(std::max(cap, 0.0)), all = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, mpi.comm()));
  const std::vector<size_t> sizes = link_sweep_sizes(static_cast<size_t>(all));
  return sizes.empty() ? 8 : sizes.back();
}

}  // namespace

std::vector<size_t> link_sweep_sizes(size_t max_bytes) {
  std::vector<size_t> sizes;
  if (max_bytes >= 8) sizes.push_back(8);
  for (size_t n = 64; n <= max_bytes && n <= (size_t(1) << 40); n *= 4) sizes.push_back(n);
  return sizes;
}

std::vector<LinkSweep> probe_links(const MpiContext& mpi, Device& device, Transport& transport,
                                   const std::vector<std::pair<int, int>>& pairs, const LinkProbeConfig& cfg) {
  const int me = mpi.rank();
  for (const auto& [a, b] : pairs)
    if (a < 0 || b < 0 || a >= mpi.size() || b >= mpi.size() || a == b)
      throw InternalError("probe_links: pair (" + std::to_string(a) + ", " + std::to_string(b) + ") is not two ranks of " +
                          std::to_string(mpi.size()));
  const std::vector<size_t> sizes = link_sweep_sizes(agreed_max_bytes(mpi, device, cfg));
  const bool in_a_pair = std::any_of(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == me || p.second == me; });
  std::unique_ptr<Lane> lane;
  std::unique_ptr<Buffer> buf;  // grown by the sweeps (ProbeEnd::data)
  if (in_a_pair) lane = device.create_lane("link probe");
  std::vector<double> mine;
  for (const auto& [a, b] : pairs) {
    mpi.quiet_barrier(1e-3);  // the others asleep: no two pairs share a link or a core while timed
    if (me != a && me != b) continue;
    const double t0 = monotonic_s();
    transport.connect({std::minmax(a, b), {std::max(a, b), std::min(a, b)}});  // sorted by (src, dst)
    const ProbeEnd end{device, transport, *lane, buf, me == a ? b : a, cfg.tag};
    if (me == b) {
      follow_sweep(end, sizes);
      continue;
    }
    LinkSweep s = lead_sweep(end, sizes, cfg, monotonic_s());  // the budget counts from the connected link
    s.src = a;
    s.dst = b;
    s.fit = fit_link(s.samples);
    s.wall_s = monotonic_s() - t0;
    encode(s, mine);
  }
  std::vector<double> all;
  for (const auto& part : mpi.gatherv_doubles(mine)) all.insert(all.end(), part.begin(), part.end());
  mpi.bcast_doubles(all);
  std::vector<LinkSweep> got = decode(all), ordered;
  for (const auto& [a, b] : pairs)  // the order of `pairs` (the gather is by leader)
    for (const LinkSweep& s : got)
      if (s.src == a && s.dst == b) {
        ordered.push_back(s);
        break;
      }
  return ordered;
}

LinkFitMatrix link_fit_matrix(const std::vector<LinkSweep>& sweeps, int ranks) {
  const size_t n = static_cast<size_t>(ranks) * ranks;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LinkFitMatrix m{std::vector<double>(n, nan), std::vector<double>(n, nan), std::vector<double>(n, nan)};
  for (const LinkSweep& s : sweeps) {
    if (s.src < 0 || s.dst < 0 || s.src >= ranks || s.dst >= ranks) continue;
    for (size_t idx : {static_cast<size_t>(s.src) * ranks + s.dst, static_cast<size_t>(s.dst) * ranks + s.src}) {
      m.latency_s[idx] = s.fit.latency_s;
      m.bandwidth_Bps[idx] = s.fit.bandwidth_Bps;
      m.max_rel_error[idx] = s.fit.max_rel_error;
    }
  }
  return m;
}

}  // namespace ppb
