// `run --plan K`'s search and verdict in the results file (results/README.md, "/plan"): every
// candidate the planner simulated on the run's own profile, its Pareto front, the points
// measured, and the root attributes plan_predicted_best, plan_measured_best and
// plan_best_within_ci. One owner for writing and reading them back.
#pragma once

#include "results/h5.h"
#include "results/run_record.h"

namespace ppb {

/// Writes /plan (attributes: devices, points, mode, the search's counts, curve_layout, the
/// verdict and its paired comparison; one column dataset per PlanRecord::Candidate field, one row
/// per candidate; `front`: indices into the rows) and the root verdict attributes, when
/// run.plan.devices > 0; nothing otherwise.
/// @throws InternalError if HDF5 fails.
void write_plan(h5::Group& root, const RunRecord& run);

/// Reads what write_plan wrote into run.plan; a file without /plan leaves it empty (devices 0).
void read_plan(const h5::Group& root, RunRecord& run);

}  // namespace ppb
