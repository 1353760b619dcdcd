// The human summary of a run, printed by rank 0 at the end of `ppbench run` (and by
// `ppbench report` from a results file).
#pragma once

#include <ostream>

#include "results/run_record.h"

namespace ppb {

/// Prints, per partition, a stage table (units, predicted and measured ms, bubble) and the
/// partition's metrics (tokens/s, TTFT/TPOT p50/p99, efficiency, validation), then the
/// balance gain.
void print_summary(std::ostream& os, const RunRecord& run);

/// Whether stage k of a measured partition took a time outside the profile's own spread for it:
/// measured_stage_ms[k] (the objective's cost) outside [predicted_stage_min_ms[k],
/// predicted_stage_max_ms[k]] (the objective's compute cost, without transfers, from the
/// fastest and slowest timed forward of each of its units; decode's over all profiled contexts,
/// so the spread also covers the KV cache's growth: a wide, lenient interval). Then the numbers the split was solved from did not hold for that stage (a
/// busy machine while profiling, ranks contending in the pipeline, cold/warm caches...).
/// False when either is missing (older files, unmeasured partitions).
bool outside_profile_spread(const PartitionRecord& p, size_t k);

/// "1.024x [0.991, 1.058]": a ratio and, where it has one, its CI (c.ci_low / c.ci_high, three
/// decimals); "1.024x" without a CI.
std::string ratio_ci_text(double ratio, const PairedComparison& c);


}  // namespace ppb
