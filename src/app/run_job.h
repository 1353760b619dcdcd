// `ppbench run` and `ppbench profile`: the sequence of phases of src/run (DESIGN.md §1, §5).
#pragma once

#include "run/options.h"

namespace ppb {

class MpiContext;

/// Runs the main job on every rank (or, with flags.profile_only, its phases up to the profile).
/// Returns the process exit status: 0 success, 1 validation mismatch or internal failure, 2 bad
/// input (the same on every rank).
int run_job(const MpiContext& mpi, const RunFlags& flags);

}  // namespace ppb
