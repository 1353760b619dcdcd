// The run's links in the results file (results/README.md, "/ranks/link_*"): the link model the
// balancer and the simulators use, the MPI host ping-pong and the transport probe behind it,
// and the probe's sweeps. One owner for writing and reading them back.
#pragma once

#include "results/h5.h"
#include "results/run_record.h"

namespace ppb {

/// Writes /ranks/link_latency_s, link_bandwidth_Bps (the model), link_host_*, link_probe_*
/// [R][R] and the group /ranks/link_sweep (one column per field, one row per pair and size),
/// each when the record has it, and the root attributes link_measured_by and link_probe_s.
/// @throws InternalError if HDF5 fails.
void write_links(h5::Group& root, const RunRecord& run);

/// Reads what write_links wrote; files before a dataset leave its field empty ("" / 0).
void read_links(const h5::Group& root, RunRecord& run);

}  // namespace ppb
