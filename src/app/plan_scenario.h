// `ppbench plan FILE.h5 --devices N --scenario poisson|gamma` (issue 38): the planner's layouts
// ranked by the highest request rate each serves within the SLO (balance/plan_serving.h).
#pragma once

#include "app/offline_commands.h"
#include "results/run_record.h"

namespace ppb {

/// --scenario's flags checked (exit 2 naming the flag) before the file is read.
/// @throws ppb::UserError.
void check_plan_scenario_flags(const PlanOptions& opt);

/// The search and its output for `run` (read from opt.input): a table of the --top (default 10)
/// layouts with the highest rate, the best and why, what N + 1 devices give; --csv, --json.
/// Returns the exit status (0). @throws ppb::UserError as plan_layouts.
int plan_scenario_command(const PlanOptions& opt, const RunRecord& run);

}  // namespace ppb
