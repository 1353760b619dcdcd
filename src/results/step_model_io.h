// The step model's grid in the results file (issue 47, results/README.md "/profile/step_model"):
// the grid's steps, each rank's medians per signature, and, for h5py, the fit of each (rank,
// signature) with its held-out errors (stepcost::fit_grid of the same values: a reader refits
// rather than trusting them). One owner for writing and reading it back.
#pragma once

#include "results/h5.h"
#include "results/run_record.h"
#include "stepcost/step_model.h"

namespace ppb {

/// Writes /profile/step_model under `prof` (nothing where the profile timed no grid).
/// @throws InternalError if step_ms does not match the ranks, signatures and steps, or HDF5 fails.
void write_step_model(h5::Group& prof, const RunRecord& run);

/// The step model fitted to `p`'s grid, its held-out error over the whole model
/// (stepcost::fit_profile_grid); empty where the profile timed no grid.
/// @throws what stepcost::fit_profile_grid throws.
stepcost::GridFit fit_step_model(const ProfileTable& p);

/// Reads the grid and its medians back into `p` (files without the group leave them empty).
void read_step_model(const h5::Group& prof, ProfileTable& p);

}  // namespace ppb
