// The plan phase of `ppbench run` (DESIGN.md §1 step 4): rank 0 solves every split the options
// ask for, in every layout, from the gathered profile (balance/), and broadcasts them; every
// partition's record (split, predictions from the profile by balance::Predictor, this backend's
// stage bytes) goes into rank 0's record.
#pragma once

#include <string>
#include <vector>

#include "balance/partition.h"
#include "balance/predict.h"
#include "pipeline/pipeline.h"
#include "run/context.h"

namespace ppb::run {

/// The partitions of a run, in run order (the file's), on every rank: each its split with its
/// layout (balance::Partition: first units, device ranks, tensor-parallel widths; solver = the
/// partition's name). Rank 0's record holds partition i's record at run.partitions[i].
class PartitionSet {
 public:
  std::vector<balance::Partition> splits;
  /// The partition every gain is against ("uniform" when measured; "" = none): a field, so that
  /// no phase matches a name.
  std::string reference;

  /// The A/A control's name (--control: the reference measured a second time).
  static constexpr const char* kControl = kControlPartition;

  size_t size() const { return splits.size(); }
  /// Index of the partition named `name`, or -1.
  int index_of(const std::string& name) const;
  /// Rank `rank`'s place in partition `p`'s layout (pipeline.h layout_placement), in replica
  /// rank / p.ranks_per_replica().
  static StagePlacement placement(const balance::Partition& p, int rank);
  /// Whether partition i is measured by itself: not the same split as an earlier one
  /// (balance::same_split_as with `eq`), or the A/A control (measured twice on purpose).
  bool measured_alone(size_t i, const balance::SplitEquivalence& eq) const;
};

/// The M partition `p` runs: its own (balance::Partition::groups, `run --plan`'s points) or the
/// run's (workload groups).
inline int partition_groups(const RunContext& ctx, const balance::Partition& p) {
  return p.groups > 0 ? p.groups : ctx.workload.groups;
}

/// The one MPI codec of partitions: rank 0's `parts` to every rank (its splits, layouts and
/// names). Collective; on the other ranks `parts` is replaced.
/// Encoding: per partition S, then S first units, S device ranks, S widths, M, R; names one per line.
void broadcast_partitions(const MpiContext& mpi, std::vector<balance::Partition>& parts, int units);

/// The plan phase: rank 0 solves each --partition split of each layout (and --tp auto's layout:
/// choose_layout) on the problem of its record (balance::problem_from_run, the function `ppbench
/// balance FILE.h5` uses), every rank receives them, the A/A control is added. Bad input
/// (no split fits memory, say): PhaseFailed{2} on every rank, the profile kept in the file.
PartitionSet plan_partitions(RunContext& ctx);

/// Rank 0: each partition's record (ctx.predictor()'s describe from the run's profile, this
/// backend's stage bytes) appended to the record's partitions, with its memory report and
/// progress line.
void describe_partitions(RunContext& ctx, const PartitionSet& set);

/// Rank 0: partition `p`'s record predicted from profile table `prof` (the run's, or a calibrated
/// copy: the adaptive split's), with this backend's stage bytes; prints its memory report and a
/// progress line.
PartitionRecord describe_partition(RunContext& ctx, const balance::Partition& p, const ProfileTable& prof);

/// Prints the predictor's warnings on stderr ("ppbench: warning: ...").
void print_warnings(const std::vector<std::string>& warnings);

}  // namespace ppb::run
