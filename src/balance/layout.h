// Layouts (issue 14): the tensor-parallel width of each pipeline stage, as `--tp` gives them,
// and the balancer's problem of a layout, whose devices are its stages' groups of ranks.
//
// Pure C++ (no MPI, device or HDF5).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "balance/partition.h"
#include "balance/problem.h"
#include "results/run_record.h"

namespace ppb::balance {

/// One `--tp` value for `ranks` ranks: "W" (every stage W ranks wide: ranks / W stages) or
/// "a,b,c" (stage k of width w_k, the widths summing to the ranks). Stage k runs on the ranks
/// after those of stages 0..k-1 (consecutive ranks).
/// @throws ppb::UserError naming --tp and what would be valid (a width that does not divide
///         the ranks, widths that do not sum to them, a width < 1, not a number).
std::vector<int> parse_layout(const std::string& text, int ranks);

/// "1" | "2" | "2,1,1": the widths as --tp spells them ("W" when every stage has width W).
std::string layout_label(const std::vector<int>& widths);

/// The suffix of a layout's partition names: "" for one rank per stage (today's names),
/// "_tp2", "_tp2-1-1" otherwise (HDF5 group names without commas).
std::string layout_suffix(const std::vector<int>& widths);

/// The groups of a layout: (first rank, width) of each stage.
std::vector<std::pair<int, int>> layout_groups(const std::vector<int>& widths);

/// The balancer's problem for `widths`: device k = stage k's group of ranks, whose cost row is
/// the group's profile at its width (run.profile.tp; width 1: the rank's own row and its
/// stage_fixed_ms; wider: no fixed cost), whose memory
/// is width x the smallest limit of its ranks (the weights and KV cache split about 1/width;
/// the replicated embedding and norms, and KV heads replicated where a layer has fewer than
/// width, make this optimistic by their size, and the run's memory check of each rank's exact
/// shard catches what it misses), and whose link to another group is
/// the link between the groups' first ranks. Activation bytes, messages and overlap as the run.
/// @throws ppb::UserError when the widths do not cover run.ranks or a group of width > 1 has
///         no profile at that width.
BalanceProblem layout_problem(const RunRecord& run, Objective o, const std::vector<int>& widths);

/// A class per rank, equal for identical devices: the same node (hostname), device model, cgroup
/// CPU quota and compute threads. Classes are numbered in order of first appearance. Ranks of
/// one class are interchangeable (issue 13) and may form a tensor-parallel group.
std::vector<int> rank_device_classes(const std::vector<RankInfo>& ranks);

/// The profile of the group of ranks first .. first + width - 1 at its width: the group's own
/// (run.profile.tp), else that of a profiled group of the same width whose ranks are of the same
/// device class (identical devices cost the same); null if none, or if the group mixes classes.
/// `classes`: rank_device_classes(run.ranks).
const ProfileTable::TpGroupProfile* group_profile(const RunRecord& run, const std::vector<int>& classes, int first,
                                                  int width);

/// The groups `--tp auto` profiles: for every width w in [2, ranks] in `widths` and every device
/// class, the first w consecutive ranks of that class; (first rank, width).
std::vector<std::pair<int, int>> auto_layout_groups(const std::vector<int>& classes, const std::vector<int>& widths);

struct GroupCandidate;
/// The groups a layout search may place stages on: for each device d in [0, classes.size()) and
/// each width w of `widths` with d + w devices, devices d .. d + w - 1 when they are of one
/// class; cost row (objective `o`, ms): p's row of device d at width 1 (with its stage_fixed_ms),
/// group_profile's at w > 1 (skipped where there is none; no fixed cost); memory: w x the smallest of p.device_memory_bytes over them
/// (one entry per device; empty = unlimited).
std::vector<GroupCandidate> layout_candidates(const RunRecord& run, const BalanceProblem& p, Objective o,
                                              const std::vector<int>& classes, const std::vector<int>& widths);

/// One group of devices a stage may run on in the layout search: devices first .. first +
/// width - 1, its cost row [U] (objective ms, compute only), the fixed cost a stage on it pays
/// once besides its units' (BalanceProblem::stage_fixed_ms; 0 for a tensor-parallel group, whose
/// profile times none) and its memory (bytes; <= 0 = unlimited).
struct GroupCandidate {
  int first = 0, width = 1;
  std::vector<double> cost;
  double fixed_ms = 0.0;
  int64_t memory_bytes = 0;
};

/// The best layout and split (issue 14, --tp auto): stages on consecutive groups of `devices`
/// devices chosen among `groups` (every device in exactly one stage), each stage a contiguous
/// run of units, minimising the bottleneck stage time (stage_time with the problem's default
/// link, activation bytes, messages and overlap: `base` gives those, the unit bytes and names;
/// its cost rows are not used), then the spread (largest - smallest stage time), then the
/// stage count (fewer first: fewer boundaries). A stage's units must fit its group's memory.
/// Exact: a DP over (units placed, devices used),
///   f[v][d + w] = min over groups (d, w), u < v of max(f[u][d], time_{d,w}(u, v)),
/// then the spread pass g = max of the smallest stage time among paths with every stage <=
/// B*; O(U^2 x groups). The result's device_rank are the groups' first devices and tp_width
/// their widths; solver "balanced", algorithm "layout-dp".
/// @throws ppb::UserError when no layout covers the devices within the memory limits.
Partition solve_layout(const BalanceProblem& base, const std::vector<GroupCandidate>& groups, int devices);

/// make_split on a layout problem, in the run's ranks: device_rank[k] = the first rank of stage
/// k's group, tp_width = widths. Stages stay in rank order (r.order is ignored).
Partition make_layout_split(const BalanceProblem& layout_problem, SplitRequest r, const std::vector<int>& widths);

}  // namespace ppb::balance
