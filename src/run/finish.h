// The last phases of `ppbench run` (DESIGN.md §1 steps 6-7): partitions that share a measured
// split take its measurement, every measured partition is compared with the reference (paired
// by round, with bootstrap CIs), cross-calibrated, and the complete file written with the
// summary printed.
#pragma once

#include <string>

#include "balance/predict.h"
#include "run/context.h"
#include "run/plan.h"

namespace ppb::run {

/// Every partition of `set` that is the same split as an earlier one (identical, or equivalent:
/// the same stages on identical devices in another order, balance::compare_splits) takes that
/// one's measurement on rank 0 instead of being benchmarked again (which would only measure the
/// machine's noise between two runs of one split); an equivalent one is stored as the split that
/// was measured, the solver's own in solver_split. Collective (its snapshot).
void share_measurements(RunContext& ctx, const PartitionSet& set);

/// Rank 0: every measured partition against the reference (set.reference), paired by round:
/// tokens/s and decode tokens/s gains with their 95% CIs and verdicts ("same split" for one that
/// shares the reference's measurement).
void compare_with_reference(RunContext& ctx, const PartitionSet& set);

/// Rank 0: the cross-calibrated predictions of every measured split of one rank per stage
/// (balance::cross_calibrate); a failure costs only these predictions (warned).
void cross_calibrate_partitions(RunContext& ctx);

/// Rank 0: the run's verdict `validation` ("ok", "failed", "skipped") recorded, status complete,
/// the whole file written and the summary printed with the file's name (every finish's last step).
void write_complete(RunContext& ctx, const std::string& validation);

/// The complete results file and the summary (rank 0): the run's verdicts (balanced against the
/// reference), validation, status "complete". Returns the exit status every rank agrees on: 1
/// when validation failed, else 0.
int finish_run(RunContext& ctx, const PartitionSet& set);

/// `ppbench profile`: the complete file without partitions, its summary and how to balance it.
int finish_profile_only(RunContext& ctx);

}  // namespace ppb::run
