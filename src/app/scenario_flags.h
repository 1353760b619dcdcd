// The serving scenario's flags, registered once for every command that takes a scenario
// (`ppbench run`, `plan`, `serve-search`): the same names, forms, help and defaults, bound to one
// serving::ScenarioFlags that serving::parse_scenario types and checks (serving/scenario.h).
#pragma once

#include <CLI/CLI.hpp>

#include "serving/scenario.h"

namespace ppb {

/// Adds the scenario's flags to `cmd`, bound to `flags`: --scenario, --requests, --prompt-lens,
/// --gen-lens, --burstiness, --step-policy, --goodput, --slo-ttft, --slo-tpot, --attainment on
/// every command; --request-rate and --trace on `run` (the offline commands search the rate on
/// requests drawn at 1 request/s); --seed on the offline commands (`run` has its own).
void add_scenario_flags(CLI::App& cmd, serving::ScenarioFlags& flags, serving::ScenarioUse::Command command);

}  // namespace ppb
