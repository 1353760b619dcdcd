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

}  // namespace ppb
