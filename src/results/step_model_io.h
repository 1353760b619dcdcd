// The step model's grid in the results file (issue 47, results/README.md "/profile/step_model"):
// the grid's steps, each rank's medians per signature, and, for h5py, the fit of each (rank,
// signature) with its held-out errors (stepcost::fit_grid of the same values: a reader refits
// rather than trusting them). One owner for writing and reading it back.
#pragma once

#include <string>

#include "results/h5.h"
#include "results/profile_step_fit.h"
#include "results/run_record.h"
#include "stepcost/step_model.h"

namespace ppb {

/// Writes /profile/step_model under `prof` (nothing where the profile timed no grid).
/// @throws InternalError if step_ms does not match the ranks, signatures and steps, or HDF5 fails.
void write_step_model(h5::Group& prof, const RunRecord& run);

/// Writes each tensor-parallel group's grid under /profile/tp `tp` (step_ms, step_attempts and
/// its fit's held-out errors, results/README.md), where every group of p.tp timed it.
void write_tp_step_grids(h5::Group& tp, const ProfileTable& p);

/// The step model's own uncertainty (issue 47), for every prediction made from it: "held-out
/// steps within X% (p50), Y% (max)", its held-out steps' |model / measured - 1| over the whole
/// model (fit_step_model), then each tensor-parallel group's ("; width W (ranks a..b) X%, Y%");
/// "" where the profile timed no grid. The interpolation's error only:
/// not how far the machine's speed moves between the profile and the rounds (on this project's
/// VMs ±30% over tens of seconds: docs/MEASUREMENTS.md § 2026-12-06 the grid's level against the cycles').
std::string step_model_uncertainty(const ProfileTable& p);

/// The forward's fixed cost per rank and kind of step (step_fixed_costs) in one line for the
/// summary, and which the predictions take; "" where the profile timed none.
std::string fixed_cost_line(const ProfileTable& p);

/// The relative error a prediction's band is drawn at (serving::search_rate_band): the step
/// model's held-out |model / measured - 1| (p50) over the whole model (fit_step_model), the
/// width-1 grid's (a tensor-parallel group's grid, printed apart, misses by more: its band is
/// narrower than its error); 0 where the profile timed no grid or the error is 50% or more (a
/// model that far off bounds nothing).
double step_model_band_error(const ProfileTable& p);

/// Reads the grid and its medians back into `p` (files without the group leave them empty).
void read_step_model(const h5::Group& prof, ProfileTable& p);

}  // namespace ppb
