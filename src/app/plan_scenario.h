// `ppbench plan FILE.h5 --devices N --scenario poisson|gamma` (issue 38): the planner's layouts
// ranked by the highest request rate each serves within the SLO (balance/plan_serving.h).
#pragma once

#include <optional>

#include "app/offline_commands.h"
#include "results/run_record.h"

namespace ppb {

/// The scenario of opt.scenario's flags against `run` (read from opt.input); nullopt without
/// --scenario (the closed-batch front). @throws ppb::UserError naming the flag (exit 2).
std::optional<serving::ScenarioSpec> plan_scenario(const PlanOptions& opt, const RunRecord& run);

/// The search of `spec` and its output for `run`: a table of the --top (default 10) layouts with
/// the highest rate, the best and why, what N + 1 devices give; --csv, --json. Returns the exit
/// status (0). @throws ppb::UserError as plan_layouts.
/// replicas: balance::PlanRequest::replicas (0 = every R dividing N).
int plan_scenario_command(const PlanOptions& opt, const RunRecord& run, const serving::ScenarioSpec& spec, int replicas);

}  // namespace ppb
