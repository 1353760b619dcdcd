// The run's conditions per node, from what every rank recorded (RankInfo: CPU affinity, compute
// threads): whether a node runs more compute threads than it lets its ranks use CPUs, in which
// case stage times measure ranks waiting for a core, not the stages.
#pragma once

#include <string>
#include <vector>

#include "results/run_record.h"

namespace ppb {

struct HostLoad {
  std::string hostname;  ///< the node; for machine_loads, the machine's nodes joined by ", "
  int ranks = 0;    ///< ranks on the node
  int threads = 0;  ///< their compute threads (BLAS threads; 1 per GPU rank)
  int cpus = 0;     ///< CPUs in the union of their affinities (0 = not recorded)
  std::string cpu_list;  ///< that union as a cpulist ("0-3")
  int nodes = 1;         ///< nodes (hostnames) in the entry: 1 for host_loads
  bool oversubscribed() const { return cpus > 0 && threads > cpus; }
};

/// One entry per node (hostname), in order of first rank. A rank without a recorded affinity
/// (older files) makes its node's cpus 0: unknown, never reported oversubscribed.
std::vector<HostLoad> host_loads(const std::vector<RankInfo>& ranks);

/// One entry per machine (rank_machine: the ranks under one kernel), in order of first rank.
/// A machine can hold several nodes (containers, network namespaces: issue 16's two-node test),
/// whose ranks then share its CPUs even where each node alone is not oversubscribed.
std::vector<HostLoad> machine_loads(const std::vector<RankInfo>& ranks);

/// The start-up warning for an oversubscribed entry of host_loads or machine_loads (a node, or
/// a machine of several nodes), one line without its newline.
std::string oversubscription_warning(const HostLoad& h);

/// The longest CFS period (ms) at which a CPU quota still throttles a rank evenly enough for the
/// profile: measured at 2 ms within +-1.5% per stage, at 10 ms a stage 20% over its prediction
/// (docs/MEASUREMENTS.md, 2026-12-07 unequal devices).
inline constexpr double kEvenQuotaPeriodMs = 2.0;

/// A warning (one line, no "ppbench:" prefix or newline) when rank `rank`'s CPU quota is below its
/// compute threads (so it throttles them) over a period longer than kEvenQuotaPeriodMs: a timing
/// shorter than the period then runs at full speed or stalls, the profile's medians keep the
/// full-speed ones, and the rank is predicted faster than the pipeline runs it. "" otherwise, and
/// for files that recorded no period.
std::string quota_period_warning(int rank, const RankInfo& info);

/// A cgroup with a CPU quota that several ranks of one machine run under (at any level of their
/// cgroups: RankInfo::cpu_quota_levels, or the binding one, cpu_quota_cgroup_id, in files before
/// them), which they share: each sees the whole quota, so none is throttled alone, yet together
/// they run at most `cores` (a container's --cpus over several ranks, also where some of them run
/// under their own tighter quota inside it: scripts/cpu_quota.sh in a container).
struct SharedQuota {
  std::vector<int> ranks;     ///< world ranks, ascending (two or more)
  double cores = 0.0;         ///< the quota, in cores
  int threads = 0;            ///< the ranks' compute threads together
  /// The cores they would run: each rank's compute threads, at most its own tighter quota where
  /// one binds below this one (then below `threads`).
  double demand_cores = 0.0;
  std::string cgroup;         ///< its directory as the first rank's mounts show it
};

/// The shared quotas that the ranks would run past (demand_cores > cores), in order of first rank;
/// a rank is counted at its own binding quota, not at a shared level between that and this one
/// (so a level above another shared one may be warned where that one already caps its ranks);
/// those ranks take turns within the quota as oversubscribed ranks take turns on cores. Of
/// levels with the same ranks only the tightest is kept. Ranks without a recorded cgroup identity
/// (no quota, or older files) are in none.
std::vector<SharedQuota> shared_quotas(const std::vector<RankInfo>& ranks);

/// RankInfo::cpu_quota_levels as the text /ranks/cpu_quota_levels stores per rank: a JSON array
/// of {"cgroup_id", "cores", "cgroup"}, "" for none.
std::string quota_levels_text(const std::vector<QuotaLevel>& levels);

/// The inverse of quota_levels_text ("" -> none).
/// @throws ppb::UserError naming /ranks/cpu_quota_levels where `text` is not such an array.
std::vector<QuotaLevel> parse_quota_levels(const std::string& text);

/// The warning for one entry of shared_quotas: one line, no "ppbench:" prefix or newline.
std::string shared_quota_warning(const SharedQuota& q);

/// Whether any node or machine is oversubscribed (host_loads, machine_loads), or any quota is
/// shared by ranks that would run past its cores (shared_quotas).
bool any_oversubscribed(const std::vector<RankInfo>& ranks);

}  // namespace ppb
