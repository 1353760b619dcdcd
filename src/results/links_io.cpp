#include "results/links_io.h"

#include <limits>
#include <string>
#include <vector>

namespace ppb {

namespace {

using h5::Group;
using hs = hsize_t;

const char* kHostHow =
    "ping-pong of the pair alone (MpiContext::link_matrix, blocking MPI_Send/MPI_Recv of host buffers): latency = min "
    "round trip of 20 x 8 B / 2, bandwidth = 4 MiB / (min round trip of 5 x 4 MiB / 2); symmetric; NaN = not measured";
const char* kProbeHow =
    "ping-pong of the pair alone through the run's transport, device buffers, on a lane (transport/link_probe.h): "
    "sizes 8 B, 64 B x 4^k up to 256 MiB (capped by 1/16 of free memory and a 0.5 s budget per pair), one-way time = "
    "median round trip / 2 per size, fitted t = latency + bytes / bandwidth by least squares in relative error "
    "(common/link_fit.h); symmetric; NaN = not probed";

/// A [R][R] matrix with its units and how it was measured; nothing when it is not R x R.
void write_matrix(Group& ranks, const char* name, const std::vector<double>& m, hs R, const char* units, const char* how) {
  if (R == 0 || m.size() != R * R) return;
  auto d = ranks.write_dataset(name, m, {R, R});
  d.set_attr("units", units);
  d.set_attr("measured", how);
}

template <h5::DatasetElement T>
std::vector<T> dataset_or_empty(const Group& g, const std::string& name) {
  return g.exists(name) ? g.open_dataset(name).read<T>() : std::vector<T>{};
}

void write_sweep(Group& ranks, const RunRecord& run) {
  const auto& rows = run.link_sweep;
  if (rows.empty()) return;
  const size_t R = run.ranks.size();
  std::vector<int32_t> src, dst, reps;
  std::vector<double> bytes, min_s, median_s, fit_s;
  for (const LinkSweepRow& r : rows) {
    src.push_back(r.src);
    dst.push_back(r.dst);
    reps.push_back(r.sample.reps);
    bytes.push_back(r.sample.bytes);
    min_s.push_back(r.sample.min_s);
    median_s.push_back(r.sample.median_s);
    const size_t idx = static_cast<size_t>(r.src) * R + r.dst;
    const bool fitted = run.link_probe_latency_matrix_s.size() == R * R && idx < R * R;
    fit_s.push_back(fitted ? link_fit_time_s({run.link_probe_latency_matrix_s[idx], run.link_probe_bandwidth_matrix_Bps[idx]},
                                             r.sample.bytes)
                           : std::numeric_limits<double>::quiet_NaN());
  }
  Group g = ranks.create_group("link_sweep");
  g.set_attr("content", std::string("one row per probed pair and message size: ") + kProbeHow);
  g.write_dataset("src", src).set_attr("content", "the rank that sent first (led the ping-pong)");
  g.write_dataset("dst", dst).set_attr("content", "the rank that returned each message");
  g.write_dataset("bytes", bytes).set_attr("units", "bytes");
  g.write_dataset("reps", reps).set_attr("content", "timed round trips (one more untimed before them)");
  g.write_dataset("min_s", min_s).set_attr("units", "s, fastest round trip / 2");
  g.write_dataset("median_s", median_s).set_attr("units", "s, median round trip / 2");
  g.write_dataset("fit_s", fit_s).set_attr("units", "s, the pair's fit at this size (link_probe_latency_s + bytes / link_probe_bandwidth_Bps)");
}

}  // namespace

void write_links(Group& root, const RunRecord& run) {
  if (!run.link_measured_by.empty()) root.set_attr("link_measured_by", run.link_measured_by);
  if (run.link_probe_s > 0) root.set_attr("link_probe_s", run.link_probe_s);
  const hs R = run.ranks.size();
  if (R == 0) return;
  Group ranks = root.require_group("ranks");
  const bool probe = run.link_measured_by == kLinkByTransportProbe;
  const char* model_how = probe ? "the link model, from the transport probe: see link_probe_latency_s" : kHostHow;
  write_matrix(ranks, "link_latency_s", run.link_latency_matrix_s, R, "s", model_how);
  write_matrix(ranks, "link_bandwidth_Bps", run.link_bandwidth_matrix_Bps, R, "bytes/s", model_how);
  write_matrix(ranks, "link_host_latency_s", run.link_host_latency_matrix_s, R, "s", kHostHow);
  write_matrix(ranks, "link_host_bandwidth_Bps", run.link_host_bandwidth_matrix_Bps, R, "bytes/s", kHostHow);
  write_matrix(ranks, "link_probe_latency_s", run.link_probe_latency_matrix_s, R, "s", kProbeHow);
  write_matrix(ranks, "link_probe_bandwidth_Bps", run.link_probe_bandwidth_matrix_Bps, R, "bytes/s (0 = no size dependence)",
               kProbeHow);
  write_matrix(ranks, "link_probe_max_rel_error", run.link_probe_max_rel_error, R,
               "fraction: max over the pair's sizes of |fit - min_s| / min_s", kProbeHow);
  write_sweep(ranks, run);
}

void read_links(const Group& root, RunRecord& run) {
  run.link_measured_by = root.has_attr("link_measured_by") ? root.get_attr<std::string>("link_measured_by") : "";
  run.link_probe_s = root.has_attr("link_probe_s") ? root.get_attr<double>("link_probe_s") : 0.0;
  if (!root.is_group("ranks")) return;
  Group ranks = root.open_group("ranks");
  run.link_latency_matrix_s = dataset_or_empty<double>(ranks, "link_latency_s");  // files before issue 16: none
  run.link_bandwidth_matrix_Bps = dataset_or_empty<double>(ranks, "link_bandwidth_Bps");
  run.link_host_latency_matrix_s = dataset_or_empty<double>(ranks, "link_host_latency_s");  // before issue 35: none
  run.link_host_bandwidth_matrix_Bps = dataset_or_empty<double>(ranks, "link_host_bandwidth_Bps");
  run.link_probe_latency_matrix_s = dataset_or_empty<double>(ranks, "link_probe_latency_s");
  run.link_probe_bandwidth_matrix_Bps = dataset_or_empty<double>(ranks, "link_probe_bandwidth_Bps");
  run.link_probe_max_rel_error = dataset_or_empty<double>(ranks, "link_probe_max_rel_error");
  run.link_sweep.clear();
  if (!ranks.is_group("link_sweep")) return;
  Group g = ranks.open_group("link_sweep");
  const auto src = g.open_dataset("src").read<int32_t>(), dst = g.open_dataset("dst").read<int32_t>(),
             reps = g.open_dataset("reps").read<int32_t>();
  const auto bytes = g.open_dataset("bytes").read<double>(), min_s = g.open_dataset("min_s").read<double>(),
             median_s = g.open_dataset("median_s").read<double>();
  for (size_t i = 0; i < src.size() && i < dst.size() && i < reps.size() && i < bytes.size() && i < min_s.size() &&
                     i < median_s.size();
       ++i)
    run.link_sweep.push_back({src[i], dst[i], {bytes[i], min_s[i], median_s[i], reps[i]}});
}

}  // namespace ppb
