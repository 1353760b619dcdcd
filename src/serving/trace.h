// Request traces for `--scenario trace --trace FILE.csv` (issue 37): the requests of a recorded
// workload, replayed on the scenario's clock.
//
// Two CSV formats are read as they are, told apart by their header line:
//  - ppbench's own: header `arrival_s,prompt_len,gen_len`; arrival_s in seconds from the
//    scenario's start (>= 0), the lengths integers.
//  - The Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset,
//    data/AzureLLMInferenceTrace_code.csv and _conv.csv, Patel et al., "Splitwise", ISCA 2024):
//    header `TIMESTAMP,ContextTokens,GeneratedTokens`, rows such as
//    `2023-11-16 18:17:03.9799600,4808,10` (a UTC datetime, fractional seconds of any number of
//    digits up to 9; 'T' accepted in place of the space). arrival_s = seconds since the first
//    row's timestamp; prompt_len = ContextTokens, gen_len = GeneratedTokens. The 2024 week-long
//    traces of the same repository share this header and are read the same way.
// Rows must come in arrival order (non-decreasing times), as both files do. Blank lines are
// skipped; '\r' line ends are accepted.
#pragma once

#include <string>
#include <vector>

#include "serving/arrivals.h"

namespace ppb::serving {

/// A trace as read.
struct Trace {
  enum class Format { ppbench, azure2023 };
  Format format = Format::ppbench;
  std::vector<Request> requests;  ///< in file order (= arrival order)
  int clamped_rows = 0;  ///< rows whose prompt or output length was clamped to [1, max]
};

/// "ppbench" or "azure2023".
const char* format_name(Trace::Format f);

/// Reads `path` (formats above). Each length is clamped to [1, max_prompt_len] /
/// [1, max_gen_len] (the context limit; counted in clamped_rows), as the synthetic lengths are.
/// Throws ppb::UserError naming the file, the line number and the field on: a missing or
/// unreadable file, an unknown header, a row without three fields, a value that does not parse
/// (a negative length, a bad datetime), a time earlier than the row before, or a file without
/// rows.
Trace read_trace(const std::string& path, int max_prompt_len, int max_gen_len);

/// Seconds since 1970-01-01 00:00:00 UTC, as integer nanoseconds, of a datetime
/// `YYYY-MM-DD HH:MM:SS[.f...]` ('T' or ' ' between date and time, up to 9 fractional digits;
/// proleptic Gregorian calendar, no time zone: the Azure trace's are UTC). False if it does not
/// parse or a field is out of range. Exposed for the tests.
bool parse_datetime_ns(const std::string& text, long long& ns);

}  // namespace ppb::serving
