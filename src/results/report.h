// `ppbench report`: summaries and comparison tables of results files (no MPI needed).
#pragma once

#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "results/run_record.h"

namespace ppb {

/// One row of the comparison table: one partition of one run.
struct ReportRow {
  std::string file, model, backend, partition, counts;  ///< counts: units per stage, "15,15"
  int world_size = 0, batch = 0, prompt_len = 0, gen_len = 0, microbatches = 0;
  double tokens_per_s = 0, decode_tokens_per_s = 0;   ///< tokens/s (DESIGN.md §3)
  double ttft_p50_ms = 0, ttft_p99_ms = 0, tpot_p50_ms = 0, tpot_p99_ms = 0;  ///< ms
  double pipeline_efficiency = 0;  ///< decode tokens/s / bottleneck bound, 0..1
  int bottleneck_stage = 0;
  double max_bubble = 0;      ///< max over stages of bubble_fraction, 0..1
  double balance_gain = 0;    ///< tokens/s of this partition / tokens/s of uniform; NaN when no uniform
  /// The gain's 95% CI over the rounds paired with uniform (NaN without one: no uniform, fewer
  /// than kMinPairsForCI rounds, older files) and its verdict ("" if none).
  double balance_gain_ci_low = 0, balance_gain_ci_high = 0;
  std::string balance_verdict;
  double expert_skew = 0;  ///< --expert-skew of the run (MoE routing)
  int mtp_modules = 0;     ///< MTP modules run with the head (--mtp), else 0
  int repetitions = 0;        ///< timed repetitions (rounds) of this partition
  std::string validation;     ///< "OK", "FAILED" or "skipped" (--no-validate; the partitions agree)
  std::string layout = "1";   ///< --tp layout of the partition ("1": one rank per stage; "2,1,1")
};

/// The rows of `run` (read from `file`): one per measured partition, in run order.
std::vector<ReportRow> report_rows(const std::string& file, const RunRecord& run);

/// Prints `rows` as an aligned text table, one line per row, with a header.
void print_report_table(std::ostream& os, const std::vector<ReportRow>& rows);

/// Prints `rows` as CSV (RFC 4180: header row, fields with commas or quotes quoted; NaN as an
/// empty field) — `pandas.read_csv` loads it as is. Columns: file, model, backend, world_size,
/// batch, prompt_len, gen_len, microbatches, partition, counts, tokens_per_s,
/// decode_tokens_per_s, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, tpot_p99_ms, (...), layout (last),
/// pipeline_efficiency, bottleneck_stage, max_bubble, balance_gain, validation, repetitions,
/// balance_gain_ci_low, balance_gain_ci_high, balance_verdict.
void print_report_csv(std::ostream& os, const std::vector<ReportRow>& rows);

/// The `report` command. One file: print_summary of it (plus its run metadata), or its rows as
/// CSV with `csv`; a file that cannot be read throws. Several files: one table (text, or CSV when
/// `csv`) with the rows of every readable complete file, in the order given, each file once (a
/// path repeated is reported once, with a note on `err`); every file that cannot be read
/// (missing, not HDF5, not ppbench, incomplete) is listed on `err` with its reason after the table.
/// Returns the exit status: 0 when at least one file was reported.
/// @throws UserError for one unreadable file, or when none of several files can be read
///         (the message lists each with its reason) — before anything is printed on `os`.
int run_report(std::ostream& os, const std::vector<std::string>& files, bool csv, std::ostream& err = std::cerr);

}  // namespace ppb
