// Registration of the offline subcommands `describe`, `balance`, `simulate`, `plan` and `serve-search` (no MPI)
// on the CLI.
#pragma once

#include <CLI/CLI.hpp>

namespace ppb {

/// Registers `ppbench describe`, `balance`, `simulate`, `plan` and `serve-search` on `app`. Each runs from its CLI11
/// callback during app.parse(), before (and without) MPI, prints its result, and ends the
/// process with its exit status: 0 success, 2 bad input (ppb::UserError, message on stderr),
/// 1 internal failure. Call once, before app.parse().
void add_offline_commands(CLI::App& app);

}  // namespace ppb
