#include "results/conditions.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/host_conditions.h"

namespace ppb {

namespace {

/// The loads of the ranks grouped by key(rank), in order of first rank; each entry's hostname
/// lists its ranks' hostnames (", "), in order of first rank.
template <typename Key>
std::vector<HostLoad> loads_by(const std::vector<RankInfo>& ranks, Key key) {
  std::vector<HostLoad> loads;
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> hosts;  // [entry] its nodes, in order of first rank
  std::vector<std::set<int>> cpus;
  std::vector<bool> known;
  for (const RankInfo& r : ranks) {
    const std::string k = key(r);
    auto it = std::find(keys.begin(), keys.end(), k);
    const size_t i = static_cast<size_t>(it - keys.begin());
    if (it == keys.end()) {
      keys.push_back(k);
      loads.emplace_back();
      hosts.emplace_back();
      cpus.emplace_back();
      known.push_back(true);
    }
    if (std::find(hosts[i].begin(), hosts[i].end(), r.hostname) == hosts[i].end()) hosts[i].push_back(r.hostname);
    loads[i].ranks += 1;
    loads[i].threads += std::max(1, r.compute_threads);
    const auto list = parse_cpu_list(r.cpu_affinity);
    if (r.cpu_affinity.empty() || !list) {
      known[i] = false;
    } else {
      cpus[i].insert(list->begin(), list->end());
    }
  }
  for (size_t i = 0; i < loads.size(); ++i) {
    loads[i].nodes = static_cast<int>(hosts[i].size());
    for (size_t n = 0; n < hosts[i].size(); ++n) loads[i].hostname += (n ? ", " : "") + hosts[i][n];
  }
  for (size_t i = 0; i < loads.size(); ++i) {
    if (!known[i]) continue;
    loads[i].cpus = static_cast<int>(cpus[i].size());
    loads[i].cpu_list = format_cpu_list(std::vector<int>(cpus[i].begin(), cpus[i].end()));
  }
  return loads;
}

}  // namespace

std::vector<HostLoad> host_loads(const std::vector<RankInfo>& ranks) {
  return loads_by(ranks, [](const RankInfo& r) { return r.hostname; });
}

std::vector<HostLoad> machine_loads(const std::vector<RankInfo>& ranks) {
  return loads_by(ranks, [](const RankInfo& r) { return rank_machine(r); });
}

std::string oversubscription_warning(const HostLoad& h) {
  const std::string who = h.nodes > 1 ? "nodes " + h.hostname + " are one machine (one kernel) and run "
                                      : "node " + h.hostname + " runs ";
  return "ppbench: WARNING: " + who + std::to_string(h.threads) + " compute threads (" + std::to_string(h.ranks) +
         " ranks) on " + (h.nodes > 1 ? "its " : "") + std::to_string(h.cpus) + " CPUs (" + h.cpu_list +
         "): ranks share cores, so stage times include waiting for a core; fine for trying ppbench, not for timings "
         "to publish";
}

std::string quota_period_warning(int rank, const RankInfo& info) {
  const double q = info.cpu_quota_cores, p = info.cpu_quota_period_ms;
  if (!(q > 0) || !(p > kEvenQuotaPeriodMs) || info.compute_threads <= 0 || q >= info.compute_threads) return "";
  char text[640];
  std::snprintf(text, sizeof text,
                "WARNING: rank %d's CPU quota of %.2f cores is enforced over %.0f ms periods (a container's or "
                "Docker's --cpus default is 100 ms): it runs %.0f ms and then waits, so a timing shorter than %.0f ms "
                "runs at full speed or stalls, and the profile's medians predict the rank faster than the pipeline "
                "runs it (20%% at a 10 ms period, docs/MEASUREMENTS.md). For a slower device on purpose use a period "
                "of %.0f ms or less: scripts/cpu_quota.sh",
                rank, q, p, q * p, p, kEvenQuotaPeriodMs);
  return text;
}

std::vector<SharedQuota> shared_quotas(const std::vector<RankInfo>& ranks) {
  std::vector<SharedQuota> out;
  std::vector<std::string> keys;  // [entry] machine and cgroup identity
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankInfo& i = ranks[r];
    std::vector<QuotaLevel> levels = i.cpu_quota_levels;
    if (levels.empty() && !i.cpu_quota_cgroup_id.empty())  // files before the levels: the binding one
      levels.push_back({i.cpu_quota_cgroup_id, i.cpu_quota_cores, i.cpu_quota_cgroup});
    if (levels.empty() || !(levels.front().cores > 0)) continue;
    const int threads = std::max(1, i.compute_threads);
    // Under a level above its binding one (levels.front()) a rank runs at most that binding quota.
    const double held = std::min(static_cast<double>(threads), levels.front().cores);
    std::set<std::string> seen;  // one level once per rank (a v1 hierarchy mounted under two names)
    for (const QuotaLevel& l : levels) {
      if (l.cgroup_id.empty() || !(l.cores > 0) || !seen.insert(l.cgroup_id).second) continue;
      const std::string key = rank_machine(i) + " " + l.cgroup_id;
      const size_t at = static_cast<size_t>(std::find(keys.begin(), keys.end(), key) - keys.begin());
      if (at == keys.size()) {
        keys.push_back(key);
        out.push_back({{}, l.cores, 0, 0.0, l.cgroup});
      }
      SharedQuota& q = out[at];
      q.ranks.push_back(static_cast<int>(r));
      q.threads += threads;
      q.demand_cores += l.cgroup_id == levels.front().cgroup_id ? threads : held;
    }
  }
  const auto fits = [](const SharedQuota& q) { return q.ranks.size() < 2 || q.demand_cores <= q.cores * (1 + 1e-9); };
  out.erase(std::remove_if(out.begin(), out.end(), fits), out.end());
  // Of levels holding the same ranks (a quota nested in another over the same ranks) the tightest.
  std::stable_sort(out.begin(), out.end(), [](const SharedQuota& a, const SharedQuota& b) {
    return a.ranks != b.ranks ? a.ranks < b.ranks : a.cores < b.cores;
  });
  out.erase(std::unique(out.begin(), out.end(), [](const SharedQuota& a, const SharedQuota& b) { return a.ranks == b.ranks; }),
            out.end());
  return out;
}

std::string quota_levels_text(const std::vector<QuotaLevel>& levels) {
  if (levels.empty()) return "";
  nlohmann::json a = nlohmann::json::array();
  for (const QuotaLevel& l : levels) a.push_back({{"cgroup_id", l.cgroup_id}, {"cores", l.cores}, {"cgroup", l.cgroup}});
  // A directory name that is not UTF-8 is stored with U+FFFD in its place, never a failed run.
  return a.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<QuotaLevel> parse_quota_levels(const std::string& text) {
  std::vector<QuotaLevel> out;
  if (text.empty()) return out;
  const auto bad = [&](const std::string& why) {
    return UserError("/ranks/cpu_quota_levels: " + why + " in '" + text +
                      "' (expected a JSON array of {\"cgroup_id\": text, \"cores\": number > 0, \"cgroup\": text})");
  };
  const nlohmann::json a = nlohmann::json::parse(text, nullptr, false);
  if (!a.is_array()) throw bad("not a JSON array");
  for (const auto& l : a) {
    if (!l.is_object() || !l.contains("cgroup_id") || !l["cgroup_id"].is_string() || !l.contains("cores") ||
        !l["cores"].is_number() || !(l["cores"].get<double>() > 0) || !l.contains("cgroup") || !l["cgroup"].is_string())
      throw bad("a level without a text cgroup_id and cgroup and a number of cores > 0");
    out.push_back({l["cgroup_id"].get<std::string>(), l["cores"].get<double>(), l["cgroup"].get<std::string>()});
  }
  return out;
}

std::string shared_quota_warning(const SharedQuota& q) {
  std::string ranks;
  for (const int r : q.ranks) {
    if (!ranks.empty()) ranks += ',';
    ranks += std::to_string(r);
  }
  char cores[32];
  std::snprintf(cores, sizeof cores, "%.2f", q.cores);
  const std::string head = "WARNING: ranks " + ranks + " share one CPU quota of " + cores + " cores (cgroup " + q.cgroup +
                           ") with " + std::to_string(q.threads) + " compute threads";
  const std::string tail = " cores, so stage times include waiting for the quota, as on oversubscribed cores (not timings to "
                           "publish). ";
  if (q.demand_cores < q.threads) {  // some ranks held to their own tighter quotas below this one
    char want[32];
    std::snprintf(want, sizeof want, "%.2f", q.demand_cores);
    return head + " that would run " + want + " cores, some ranks held to their own quotas inside it: together they run at most " +
           cores + tail + "Make the quotas inside it, and the ranks without one, add up to at most " + cores +
           " cores, or raise it";
  }
  return head + ": each sees the whole quota, but together they run at most " + cores + tail +
         "Give each rank its own quota (scripts/cpu_quota.sh) or the job a core per compute thread";
}

bool any_oversubscribed(const std::vector<RankInfo>& ranks) {
  for (const auto& h : host_loads(ranks))
    if (h.oversubscribed()) return true;
  for (const auto& h : machine_loads(ranks))
    if (h.oversubscribed()) return true;
  return !shared_quotas(ranks).empty();
}

}  // namespace ppb
