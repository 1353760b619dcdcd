// The `report` subcommand of ppbench: reads results files, prints a summary or a comparison
// table (text or CSV). Runs without MPI: main() must dispatch it before MPI init.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ppb {

/// Options of `ppbench report`.
struct ReportOptions {
  std::vector<std::string> files;  ///< results files (.h5), in the order given
  bool csv = false;                ///< CSV table on stdout instead of text
};

/// Registers `report FILE.h5 [FILE.h5 ...] [--csv]` on `app`, filling `opt` when parsed.
/// Returns the subcommand, so that main() can test `->parsed()` and call run_report_command
/// instead of initialising MPI.
CLI::App* add_report_command(CLI::App& app, ReportOptions& opt);

/// Runs the parsed report command: prints to stdout, errors to stderr. Returns the exit status:
/// 0 success (with several files: at least one reported; the others are listed on stderr with
/// their reason), 2 the one file, or every one of several, cannot be reported (missing, not
/// HDF5, not ppbench, incomplete), 1 an internal failure.
int run_report_command(const ReportOptions& opt);

}  // namespace ppb
