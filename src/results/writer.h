// Writes a RunRecord to an HDF5 results file (layout: results/README.md, DESIGN.md §4).
#pragma once

#include <string>

#include "results/run_record.h"

namespace ppb {

/// Version of the file layout, stored as the root attribute `format_version`.
inline constexpr int kResultsFormatVersion = 1;

/// Writes `run` to `path` atomically: everything goes to `path.tmp.<pid>` with root attribute
/// complete=0, then complete=1 is set, the file is closed and renamed onto `path`. A crash
/// leaves at most the temporary file, never a `path` that looks complete.
/// @throws InternalError if HDF5 or the rename fails (the temporary file is removed).
void write_results(const std::string& path, const RunRecord& run);

/// HDF5 library version "1.10.8".
std::string hdf5_version();

}  // namespace ppb
