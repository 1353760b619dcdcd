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

/// Whether any node or machine is oversubscribed (host_loads, machine_loads).
bool any_oversubscribed(const std::vector<RankInfo>& ranks);

}  // namespace ppb
