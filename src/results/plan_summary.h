// `run --plan K` in words (issue 36): the planner's front with each measured point's prediction
// beside its measurement, the groups-in-flight curve and the verdict. Printed by the run's
// summary and by `ppbench report`.
#pragma once

#include <ostream>

#include "results/run_record.h"

namespace ppb {

/// Prints the plan of `run` (nothing when run.plan.devices == 0): the front (layout, M, units per
/// stage, predicted tokens/s, per device, TTFT/TPOT p50, tokens/s per user); per measured point
/// the predicted and measured tokens/s, TTFT p50 and TPOT p50 with the error (predicted /
/// measured - 1) and the tokens/s gain over the reference with its CI; the best layout's
/// tokens/s and latencies against M, predicted and measured; and the verdict (predicted best,
/// measured best, the predicted best's paired ratio to the measured best with its 95% CI).
void print_plan(std::ostream& os, const RunRecord& run);

}  // namespace ppb
