// Request traces for `--scenario trace --trace FILE` (issues 37, 49): the requests of a recorded
// workload, replayed on the scenario's clock. The formats are read as published, told apart by
// their first line:
//  - ppbench's own CSV: header `arrival_s,prompt_len,gen_len`; arrival_s in seconds from the
//    scenario's start (>= 0), the lengths integers.
//  - The Azure LLM inference traces (github.com/Azure/AzurePublicDataset): 2023
//    (data/AzureLLMInferenceTrace_code.csv and _conv.csv, Patel et al., "Splitwise", ISCA 2024)
//    and 2024 (the week-long AzureLLMInferenceTrace_*_1week.csv, Stojkovic et al., "DynamoLLM",
//    HPCA 2025): header `TIMESTAMP,ContextTokens,GeneratedTokens`, rows such as
//    `2023-11-16 18:17:03.9799600,4808,10` (2023: UTC, no offset) or
//    `2024-05-10 00:00:00.009930+00:00,2162,5` (2024: an ISO 8601 offset; whole seconds without a
//    fraction where it is 0). Fractions of 1 to 9 digits, 'T' or ' ' between date and time, the
//    offset `+HH:MM`, `-HH:MM`, `+HHMM` or `Z`, applied to give UTC. "azure2024" where a row has an
//    offset, else "azure2023". prompt_len = ContextTokens, gen_len = GeneratedTokens.
//  - BurstGPT (github.com/HPMLL/BurstGPT, Wang et al., 2024): a CSV whose header names the
//    columns `Timestamp` (seconds from the collection's start), `Request tokens` and `Response
//    tokens` among others (`Model`, `Total tokens`, `Log Type`, and in later releases `Session
//    ID`, `Elapsed time`: read by name, ignored), e.g. `5,ChatGPT,472,18,490,Conversation log`.
//    Rows with 0 response tokens (failed requests) are dropped, as vLLM's BurstGPT loader does
//    (counted in dropped_rows).
//  - Mooncake's JSON lines (github.com/kvcache-ai/Mooncake, FAST'25 traces): one object a line,
//    `{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}`:
//    timestamp in ms, hash_ids the request's prompt blocks (512 tokens each there). The blocks
//    are counted and so are those an earlier request of the replay already had (what a prefix
//    cache could reuse): read and reported, not modelled (no prefix caching here).
// arrival_s = seconds since the first row's time (ppbench's own: as given); rows must come in
// arrival order (non-decreasing times), as the published files do. Blank lines are skipped; '\r' line ends accepted.
// TraceOptions then keep the rows of a window of the trace's own clock and divide the times by
// a speedup: a production trace replayed at a testbed's rate.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "serving/arrivals.h"

namespace ppb::serving {

/// Which rows to replay, and how fast.
struct TraceOptions {
  double speedup = 1.0;  ///< every arrival divided by this (> 0, finite): 2 = twice the trace's rate
  /// Keep the rows arriving in [window_start_s, window_end_s) of the trace's own clock (seconds
  /// since its first row), their times then from window_start_s: 0 and +inf keep every row.
  double window_start_s = 0.0;
  double window_end_s = std::numeric_limits<double>::infinity();
};

/// A trace as read.
struct Trace {
  enum class Format { ppbench, azure2023, azure2024, burstgpt, mooncake };
  Format format = Format::ppbench;
  std::vector<Request> requests;  ///< in file order (= arrival order), after the window and the speedup
  int rows = 0;                   ///< rows read
  int clamped_rows = 0;  ///< rows kept whose prompt or output length was clamped to [1, max]
  int dropped_rows = 0;  ///< BurstGPT rows with 0 response tokens (failed requests), dropped
  int outside_window = 0;  ///< rows outside TraceOptions' window
  long long prefix_blocks = 0;         ///< Mooncake: the kept requests' hash_ids
  long long reused_prefix_blocks = 0;  ///< those an earlier kept request already had
};

/// "ppbench", "azure2023", "azure2024", "burstgpt" or "mooncake".
const char* format_name(Trace::Format f);

/// Reads `path` (formats above). Each length is clamped to [1, max_prompt_len] /
/// [1, max_gen_len] (the context limit; counted in clamped_rows), as the synthetic lengths are.
/// Throws ppb::UserError naming the file, the line number and the field on: a missing or
/// unreadable file, an unknown header, a row without its fields, a value that does not parse
/// (a negative length, a bad datetime or offset, bad JSON), a time earlier than the row before,
/// a file without rows, no row in the window, or a bad speedup or window (naming --trace-speedup
/// or --trace-window).
Trace read_trace(const std::string& path, int max_prompt_len, int max_gen_len, const TraceOptions& options = {});

/// Seconds since 1970-01-01 00:00:00 UTC, as integer nanoseconds, of a datetime
/// `YYYY-MM-DD HH:MM:SS[.f...][offset]` ('T' or ' ' between date and time, 1 to 9 fractional
/// digits; proleptic Gregorian calendar; offset `Z`, `+HH:MM`, `-HH:MM` or `+HHMM`, subtracted
/// to give UTC; none: the time is UTC). `zoned` (optional): whether it had an offset. False if it
/// does not parse or a field is out of range. Exposed for the tests.
bool parse_datetime_ns(const std::string& text, long long& ns, bool* zoned = nullptr);

}  // namespace ppb::serving
