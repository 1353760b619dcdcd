#include "app/report_cli.h"

#include <iostream>

#include "common/error.h"
#include "results/report.h"

namespace ppb {

CLI::App* add_report_command(CLI::App& app, ReportOptions& opt) {
  auto* report = app.add_subcommand(
      "report",
      "print the summary of one results file, or compare several (one row per run and partition); "
      "no MPI needed");
  report->add_option("files", opt.files, "results files written by `ppbench run` (*.h5)")->required();
  report->add_flag("--csv", opt.csv,
                   "write the comparison table as CSV to stdout (header row; pandas.read_csv loads it)");
  report->footer(
      "With several files, those that cannot be read (missing, incomplete: a failed task of a sweep) are\n"
      "listed on stderr with their reason and the others reported (exit 0; 2 when none can be read);\n"
      "a file given twice is reported once. One file that cannot be read: exit 2.\n"
      "Examples:\n"
      "  ppbench report results/run.h5\n"
      "  ppbench report results/*.h5 --csv > runs.csv");
  return report;
}

int run_report_command(const ReportOptions& opt) {
  try {
    return run_report(std::cout, opt.files, opt.csv);
  } catch (const UserError& e) {
    std::cerr << "ppbench report: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ppbench report: fatal: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace ppb
