// Reads an HDF5 results file back into a RunRecord: the inverse of writer.cpp (layout:
// results/README.md). Used by `ppbench report` and by the round-trip test.
#pragma once

#include <string>

#include "results/run_record.h"

namespace ppb {

/// Reads the results file at `path` into a RunRecord, field for field as write_results stored
/// it. Fields the file does not hold come back empty/zero: run_start_s (never stored), and
/// anything an older format_version lacked.
///
/// Partitions come back in run order (root attribute `partitions`; for files without it,
/// `uniform` first, then the others by name). A partition's `metrics` are the float attributes
/// of /benchmark/<name> other than timed_wall_s, bottleneck_stage and balance_gain.
///
/// @throws UserError naming `path` when the file does not exist, is not HDF5, is not a ppbench
///         file (no `format_version` / `ppbench_version` root attribute), is incomplete
///         (root `complete` != 1: the run crashed or is still writing), comes from a newer
///         format_version than this build reads, or lacks a group/dataset the layout requires.
RunRecord read_results(const std::string& path);

}  // namespace ppb
