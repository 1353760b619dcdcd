// Writes a RunRecord to an HDF5 results file (layout: results/README.md, DESIGN.md §4).
#pragma once

#include <string>

#include "results/run_record.h"

namespace ppb {

/// Version of the file layout, stored as the root attribute `format_version`.
inline constexpr int kResultsFormatVersion = 1;

/// Writes `run` to `path` atomically: everything goes to `path.tmp.<pid>` with root attribute
/// complete=0, then (if `complete`) complete=1 is set, the file is closed and renamed onto
/// `path`. The run writes a snapshot with complete=0 after each phase, so a run that dies keeps
/// its profile and the partitions already measured; a crash mid-write leaves the previous
/// snapshot, never a `path` that looks complete.
/// @throws InternalError if HDF5 or the rename fails (the temporary file is removed).
void write_results(const std::string& path, const RunRecord& run, bool complete = true);

/// HDF5 library version "1.10.8".
std::string hdf5_version();

}  // namespace ppb
