// What a serving scenario's summary prints (issue 37): the scenario, the latency table per
// partition (as `vllm bench serve` reads: TTFT, TPOT, ITL, E2E mean/p50/p90/p99, throughput,
// goodput), each partition against the reference with 95% CIs, and the validation counts.
#pragma once

#include <ostream>
#include <string>

#include "results/run_record.h"

namespace ppb {

/// The scenario in one line (serving::describe_scenario, with the rate measured and a trace's
/// format); "" for a closed run.
std::string serving_scenario_text(const ServingRunRecord& s);

/// The scenario's part of the summary; nothing for a closed run (no run.serving.spec).
void print_serving_summary(std::ostream& os, const RunRecord& run);

}  // namespace ppb
