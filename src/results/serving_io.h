// A serving scenario in the results file (issue 37; results/README.md, "/scenario" and
// "/benchmark/<name>" of a scenario run): one owner for writing and reading it back.
#pragma once

#include "results/h5.h"
#include "results/run_record.h"

namespace ppb {

/// Writes /scenario (attribute spec: the serving::ScenarioSpec as JSON, read back whole; each of its
/// keys also an attribute of its own: kind, burstiness, requests, seed, the length specs, trace,
/// step_policy, slots, goodput, attainment, ...; request_rate, the rate measured; trace_format and, for a trace, trace_rows,
/// trace_clamped_rows, trace_dropped_rows, trace_rows_outside_window, trace_prefix_blocks,
/// trace_reused_prefix_blocks;
/// rounds, stop_reason; datasets arrival_s, prompt_len, gen_len) and, for
/// every partition of run.serving, /benchmark/<name>: attributes (ttft_p50_ms, ttft_p99_ms,
/// tpot_p50_ms, tpot_p99_ms, goodput_req_per_s, slo_attainment, output_tokens_per_s, ..., the
/// gains against the reference with their CIs, the validation counts), the per-round datasets
/// (rep_*), and the group requests/ (one row per request of the last round: arrival_s,
/// admitted_s, first_token_s, finish_s, prompt_len, gen_len, group, slot; token_s and tokens with
/// token_offset). Nothing without run.serving.spec (a closed run).
/// @throws InternalError if HDF5 fails.
void write_serving(h5::Group& root, const RunRecord& run);

/// Reads what write_serving wrote into run.serving; a file without /scenario leaves it empty. The
/// spec is read back whole (a file written before it had one: from its attributes).
/// @throws ppb::UserError when the stored spec names what this binary cannot play (an unknown step
///         policy or kind: serving::scenario_from_json), never a silent substitute.
void read_serving(const h5::Group& root, RunRecord& run);

}  // namespace ppb
