// Conditions recorded beside the timings (common/host_conditions.h, results/conditions.h): the
// cpulist format, CPU quotas of cgroup v1 and v2 on fake trees, the governor, and which nodes run
// more compute threads than they have CPUs; the summary's warning.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/host_conditions.h"
#include "results/conditions.h"
#include "results/run_record.h"
#include "results/summary.h"

namespace {

namespace fs = std::filesystem;

class FakeTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("ppb_conditions_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const fs::path& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  fs::path root_;
};

TEST(CpuList, FormatsAndParsesRanges) {
  EXPECT_EQ(ppb::format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(ppb::format_cpu_list({5}), "5");
  EXPECT_EQ(ppb::format_cpu_list({}), "");
  EXPECT_EQ(*ppb::parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ppb::parse_cpu_list("3,1-2,2"), (std::vector<int>{1, 2, 3}));  // sorted, unique
  EXPECT_TRUE(ppb::parse_cpu_list("")->empty());
  for (const char* bad : {"1-", "3-1", "a", "1,,2", "-1"}) EXPECT_FALSE(ppb::parse_cpu_list(bad)) << bad;
  // This process: a non-empty affinity that round-trips.
  const std::vector<int> mine = ppb::cpu_affinity();
  ASSERT_FALSE(mine.empty());
  EXPECT_EQ(*ppb::parse_cpu_list(ppb::format_cpu_list(mine)), mine);
}

TEST_F(FakeTree, CgroupV2QuotaSmallestOverTheHierarchy) {
  write("cg/cpu.max", "max 100000\n");
  write("cg/job/cpu.max", "300000 100000\n");      // 3 cores for the job
  write("cg/job/step/cpu.max", "50000 100000\n");  // half a core for this step
  const auto q = ppb::cgroup_cpu_quota("0::/job/step\n", root_ / "cg");
  ASSERT_TRUE(q);
  EXPECT_DOUBLE_EQ(q->cores, 0.5);
  write("cg/job/step/cpu.max", "max 100000\n");
  EXPECT_DOUBLE_EQ(ppb::cgroup_cpu_quota("0::/job/step\n", root_ / "cg")->cores, 3.0);
  EXPECT_FALSE(ppb::cgroup_cpu_quota("0::/other\n", root_ / "cg"));  // "max" only
  EXPECT_FALSE(ppb::cgroup_cpu_quota("0::/../job\n", root_ / "cg"));  // never leaves the root
}

/// The period comes from the level that binds: the fewest cores, of equal cores the longest period
/// (the one that stalls a rank longest).
TEST_F(FakeTree, CgroupQuotaPeriodOfTheBindingLevel) {
  write("cg/job/cpu.max", "300000 100000\n");  // 3 cores per 100 ms
  write("cg/job/step/cpu.max", "1000 2000\n");  // 0.5 cores per 2 ms: binds
  auto q = ppb::cgroup_cpu_quota("0::/job/step\n", root_ / "cg");
  ASSERT_TRUE(q);
  EXPECT_DOUBLE_EQ(q->cores, 0.5);
  EXPECT_DOUBLE_EQ(q->period_ms, 2.0);
  write("cg/job/cpu.max", "50000 100000\n");  // 0.5 cores per 100 ms: equal cores, longer period
  q = ppb::cgroup_cpu_quota("0::/job/step\n", root_ / "cg");
  ASSERT_TRUE(q);
  EXPECT_DOUBLE_EQ(q->cores, 0.5);
  EXPECT_DOUBLE_EQ(q->period_ms, 100.0);
  write("cg/cpu/ppb/cpu.cfs_quota_us", "5000\n");  // cgroup v1, as scripts/cpu_quota.sh at 10 ms
  write("cg/cpu/ppb/cpu.cfs_period_us", "10000\n");
  q = ppb::cgroup_cpu_quota("3:cpu:/ppb\n", root_ / "cg");
  ASSERT_TRUE(q);
  EXPECT_DOUBLE_EQ(q->cores, 0.5);
  EXPECT_DOUBLE_EQ(q->period_ms, 10.0);
  EXPECT_FALSE(ppb::cgroup_cpu_quota("0::/other\n", root_ / "cg"));
}

/// The quota names the directory of its binding level, and that directory's identity is one per
/// cgroup: the same through another path to it (as another cgroup namespace shows it), another
/// for another cgroup.
TEST_F(FakeTree, CgroupQuotaNamesTheBindingDirectoryAndItsIdentity) {
  write("cg/job/cpu.max", "200000 100000\n");  // 2 cores: binds
  write("cg/job/step0/cpu.max", "max 100000\n");
  write("cg/job/step1/cpu.max", "max 100000\n");
  const auto a = ppb::cgroup_cpu_quota("0::/job/step0\n", root_ / "cg");
  const auto b = ppb::cgroup_cpu_quota("0::/job/step1\n", root_ / "cg");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->dir, root_ / "cg/job");
  EXPECT_EQ(b->dir, a->dir);  // two steps under one job quota: one cgroup
  write("cg/job/step1/cpu.max", "50000 100000\n");
  const auto c = ppb::cgroup_cpu_quota("0::/job/step1\n", root_ / "cg");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->dir, root_ / "cg/job/step1");  // its own, tighter quota binds
  const std::string id = ppb::cgroup_identity(a->dir);
  EXPECT_FALSE(id.empty());
  fs::create_directory_symlink(root_ / "cg/job", root_ / "seen_from_a_container");
  EXPECT_EQ(ppb::cgroup_identity(root_ / "seen_from_a_container"), id);
  EXPECT_NE(ppb::cgroup_identity(c->dir), id);
  EXPECT_EQ(ppb::cgroup_identity(root_ / "absent"), "");
}

/// Every level that sets a quota, the binding one first: a rank's own quota inside a container's
/// (scripts/cpu_quota.sh under --cpus), then the container's; the binding one is cgroup_cpu_quota's.
TEST_F(FakeTree, CgroupQuotasListEveryLevelTheBindingOneFirst) {
  write("cg/cpu.max", "max 100000\n");
  write("cg/docker/cpu.max", "150000 100000\n");          // the container: 1.5 cores
  write("cg/docker/rank1/cpu.max", "max 100000\n");       // no quota of its own
  write("cg/docker/rank1/ppb/cpu.max", "1000 2000\n");    // 0.5 cores per 2 ms: binds
  auto all = ppb::cgroup_cpu_quotas("0::/docker/rank1/ppb\n", root_ / "cg");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].dir, root_ / "cg/docker/rank1/ppb");
  EXPECT_DOUBLE_EQ(all[0].cores, 0.5);
  EXPECT_DOUBLE_EQ(all[0].period_ms, 2.0);
  EXPECT_EQ(all[1].dir, root_ / "cg/docker");
  EXPECT_DOUBLE_EQ(all[1].cores, 1.5);
  EXPECT_EQ(ppb::cgroup_cpu_quota("0::/docker/rank1/ppb\n", root_ / "cg")->dir, all[0].dir);
  write("cg/docker/cpu.max", "20000 100000\n");  // the container tighter (0.2 cores): it binds, listed first
  all = ppb::cgroup_cpu_quotas("0::/docker/rank1/ppb\n", root_ / "cg");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].dir, root_ / "cg/docker");
  EXPECT_EQ(all[1].dir, root_ / "cg/docker/rank1/ppb");
  EXPECT_TRUE(ppb::cgroup_cpu_quotas("0::/other\n", root_ / "cg").empty());
}

TEST_F(FakeTree, CgroupV1QuotaUnderCpuCpuacct) {
  write("cg/cpu,cpuacct/slurm/cpu.cfs_quota_us", "200000\n");
  write("cg/cpu,cpuacct/slurm/cpu.cfs_period_us", "100000\n");
  write("cg/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  write("cg/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const auto q = ppb::cgroup_cpu_quota("4:memory:/slurm\n3:cpu,cpuacct:/slurm\n", root_ / "cg");
  ASSERT_TRUE(q);
  EXPECT_DOUBLE_EQ(q->cores, 2.0);
  EXPECT_FALSE(ppb::cgroup_cpu_quota("4:memory:/slurm\n", root_ / "cg"));  // no cpu controller
}

TEST_F(FakeTree, GovernorOrEmpty) {
  write("sys/devices/system/cpu/cpu3/cpufreq/scaling_governor", "performance\n");
  EXPECT_EQ(ppb::cpu_governor(3, root_ / "sys"), "performance");
  EXPECT_EQ(ppb::cpu_governor(0, root_ / "sys"), "");  // not exposed (a VM)
}

ppb::RankInfo rank(const std::string& host, const std::string& cpus, int threads) {
  ppb::RankInfo r;
  r.hostname = host;
  r.cpu_affinity = cpus;
  r.compute_threads = threads;
  return r;
}

TEST(HostLoads, OversubscribedWhenThreadsExceedTheUnionOfCpus) {
  // Node a: 4 one-thread ranks on CPUs 0-1 (mpirun --oversubscribe -np 4 on 2 cores).
  // Node b: 2 ranks of 2 threads, bound to 0-1 and 2-3: exactly full.
  const std::vector<ppb::RankInfo> ranks{rank("a", "0-1", 1), rank("a", "0-1", 1), rank("b", "0-1", 2),
                                         rank("a", "0-1", 1), rank("a", "0,1", 1), rank("b", "2-3", 2)};
  const auto loads = ppb::host_loads(ranks);
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].hostname, "a");
  EXPECT_EQ(loads[0].ranks, 4);
  EXPECT_EQ(loads[0].threads, 4);
  EXPECT_EQ(loads[0].cpus, 2);
  EXPECT_EQ(loads[0].cpu_list, "0-1");
  EXPECT_TRUE(loads[0].oversubscribed());
  EXPECT_EQ(ppb::oversubscription_warning(loads[0]),
            "ppbench: WARNING: node a runs 4 compute threads (4 ranks) on 2 CPUs (0-1): ranks share cores, so stage "
            "times include waiting for a core; fine for trying ppbench, not for timings to publish");
  EXPECT_EQ(loads[1].threads, 4);
  EXPECT_EQ(loads[1].cpus, 4);
  EXPECT_FALSE(loads[1].oversubscribed());
  EXPECT_TRUE(ppb::any_oversubscribed(ranks));
  // Unknown affinity (an older file): never called oversubscribed.
  EXPECT_FALSE(ppb::any_oversubscribed({rank("a", "", 1), rank("a", "", 1), rank("a", "0", 1)}));
}

/// Nodes that are namespaces of one machine (issue 16's two-node test): each node alone is
/// within its CPUs, the machine is not.
TEST(HostLoads, NodesOfOneMachineShareItsCpus) {
  std::vector<ppb::RankInfo> ranks{rank("node0", "0-1", 1), rank("node0", "0-1", 1), rank("node1", "0-1", 1),
                                   rank("node1", "0-1", 1)};
  for (auto& r : ranks) r.machine_id = "boot-1";
  for (const auto& h : ppb::host_loads(ranks)) EXPECT_FALSE(h.oversubscribed()) << h.hostname;
  const auto machines = ppb::machine_loads(ranks);
  ASSERT_EQ(machines.size(), 1u);
  EXPECT_EQ(machines[0].hostname, "node0, node1");
  EXPECT_EQ(machines[0].nodes, 2);
  EXPECT_EQ(machines[0].ranks, 4);
  EXPECT_EQ(machines[0].threads, 4);
  EXPECT_EQ(machines[0].cpus, 2);
  EXPECT_TRUE(machines[0].oversubscribed());
  EXPECT_TRUE(ppb::any_oversubscribed(ranks));
  EXPECT_EQ(ppb::oversubscription_warning(machines[0]),
            "ppbench: WARNING: nodes node0, node1 are one machine (one kernel) and run 4 compute threads (4 ranks) on "
            "its 2 CPUs (0-1): ranks share cores, so stage times include waiting for a core; fine for trying "
            "ppbench, not for timings to publish");
  EXPECT_EQ(ppb::host_loads(ranks)[0].nodes, 1);

  ppb::RunRecord run;
  run.world_size = 4;
  run.ranks = ranks;
  std::ostringstream os;
  ppb::print_summary(os, run);
  EXPECT_NE(os.str().find("conditions: machine of nodes node0, node1 (one kernel, /ranks/machine_id): 4 rank(s), 4 "
                          "compute thread(s) on 2 CPU(s) (0-1)\n  WARNING: oversubscribed: 4 compute threads on 2 "
                          "CPUs of one machine"),
            std::string::npos)
      << os.str();

  // One rank per node, each on a core of its own (the test's pinned run): the machine is full,
  // not oversubscribed. Different machines (boot ids) are never summed.
  ranks = {rank("node0", "0", 1), rank("node1", "1", 1)};
  for (auto& r : ranks) r.machine_id = "boot-1";
  EXPECT_FALSE(ppb::any_oversubscribed(ranks));
  ranks = {rank("n0", "0-1", 2), rank("n1", "0-1", 2)};
  ranks[0].machine_id = "boot-1";
  ranks[1].machine_id = "boot-2";
  EXPECT_EQ(ppb::machine_loads(ranks).size(), 2u);
  EXPECT_FALSE(ppb::any_oversubscribed(ranks));
  // Files before machine_id: one machine per hostname, as before.
  ranks = {rank("n0", "0-1", 2), rank("n1", "0-1", 2)};
  EXPECT_EQ(ppb::machine_loads(ranks).size(), 2u);
}

TEST(HostLoads, SummaryWarnsAndNamesQuotas) {
  ppb::RunRecord run;
  run.world_size = 3;
  run.ranks = {rank("vm", "0-1", 1), rank("vm", "0-1", 1), rank("vm", "0-1", 1)};
  run.ranks[2].cpu_quota_cores = 0.5;
  run.ranks[0].cpu_governor = "performance";
  std::ostringstream os;
  ppb::print_summary(os, run);
  const std::string text = os.str();
  EXPECT_NE(text.find("conditions: node vm: 3 rank(s), 3 compute thread(s) on 2 CPU(s) (0-1); rank 2 CPU quota 0.50 "
                      "cores; governor performance"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("WARNING: oversubscribed: 3 compute threads on 2 CPUs"), std::string::npos) << text;
  run.ranks.pop_back();
  std::ostringstream ok;
  ppb::print_summary(ok, run);
  EXPECT_EQ(ok.str().find("WARNING"), std::string::npos) << ok.str();
}

/// A quota under the rank's compute threads over a period longer than kEvenQuotaPeriodMs warns
/// (the profile sees the full-speed windows); a short period, a quota the threads fit in, or no
/// recorded period does not.
TEST(HostLoads, QuotaOverALongPeriodWarns) {
  ppb::RankInfo info = rank("vm", "0-1", 1);
  info.cpu_quota_cores = 0.5;
  info.cpu_quota_period_ms = 100.0;
  const std::string w = ppb::quota_period_warning(1, info);
  EXPECT_NE(w.find("rank 1's CPU quota of 0.50 cores is enforced over 100 ms periods"), std::string::npos) << w;
  EXPECT_NE(w.find("it runs 50 ms and then waits"), std::string::npos) << w;
  EXPECT_NE(w.find("a period of 2 ms or less"), std::string::npos) << w;
  info.cpu_quota_period_ms = ppb::kEvenQuotaPeriodMs;
  EXPECT_EQ(ppb::quota_period_warning(1, info), "");
  info.cpu_quota_period_ms = 100.0;
  info.cpu_quota_cores = 1.0;  // one compute thread fits in one core
  EXPECT_EQ(ppb::quota_period_warning(1, info), "");
  info.cpu_quota_cores = 0.5;
  info.cpu_quota_period_ms = std::numeric_limits<double>::quiet_NaN();  // a file before the period
  EXPECT_EQ(ppb::quota_period_warning(1, info), "");

  ppb::RunRecord run;
  run.world_size = 2;
  run.ranks = {rank("vm", "0", 1), rank("vm", "1", 1)};
  run.ranks[1].cpu_quota_cores = 0.5;
  run.ranks[1].cpu_quota_period_ms = 10.0;
  std::ostringstream os;
  ppb::print_summary(os, run);
  EXPECT_NE(os.str().find("; rank 1 CPU quota 0.50 cores per 10 ms; governor not exposed\n  WARNING: rank 1's CPU "
                          "quota of 0.50 cores is enforced over 10 ms periods"),
            std::string::npos)
      << os.str();
}

/// Ranks of one machine in one quota'd cgroup (a container's --cpus over several ranks) take turns
/// within it: warned, and counted oversubscribed, where their compute threads exceed its cores;
/// not where they fit, where each rank has its own cgroup (scripts/cpu_quota.sh), or where the
/// same identity is on another machine.
TEST(HostLoads, RanksSharingOneQuotaPastItsCoresWarn) {
  std::vector<ppb::RankInfo> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(rank("vm", "0-3", 1));  // 4 CPUs: not oversubscribed by affinity
    ranks.back().machine_id = "boot-1";
    ranks.back().cpu_quota_cores = 2.0;
    ranks.back().cpu_quota_period_ms = 100.0;
    ranks.back().cpu_quota_cgroup = "/sys/fs/cgroup";
    ranks.back().cpu_quota_cgroup_id = "35:1";
  }
  EXPECT_FALSE(ppb::host_loads(ranks)[0].oversubscribed());
  auto shared = ppb::shared_quotas(ranks);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(shared[0].threads, 4);
  EXPECT_DOUBLE_EQ(shared[0].cores, 2.0);
  EXPECT_TRUE(ppb::any_oversubscribed(ranks));
  EXPECT_EQ(ppb::shared_quota_warning(shared[0]).rfind(
                "WARNING: ranks 0,1,2,3 share one CPU quota of 2.00 cores (cgroup /sys/fs/cgroup) with 4 compute "
                "threads: each sees the whole quota, but together they run at most 2.00 cores",
                0),
            0u)
      << ppb::shared_quota_warning(shared[0]);
  ppb::RunRecord run;
  run.world_size = 4;
  run.ranks = ranks;
  std::ostringstream os;
  ppb::print_summary(os, run);
  EXPECT_NE(os.str().find("governor not exposed\n  WARNING: ranks 0,1,2,3 share one CPU quota of 2.00 cores"),
            std::string::npos)
      << os.str();

  auto two = ranks;  // two ranks fit in 2 cores
  two.resize(2);
  EXPECT_TRUE(ppb::shared_quotas(two).empty());
  EXPECT_FALSE(ppb::any_oversubscribed(two));
  auto own = ranks;  // each rank its own cgroup, as scripts/cpu_quota.sh makes them
  for (int r = 0; r < 4; ++r) own[r].cpu_quota_cgroup_id = "35:" + std::to_string(10 + r);
  EXPECT_TRUE(ppb::shared_quotas(own).empty());
  auto machines = ranks;  // one identity on two machines: two cgroups
  machines[2].machine_id = machines[3].machine_id = "boot-2";
  EXPECT_TRUE(ppb::shared_quotas(machines).empty());
  auto older = ranks;  // files before the identity: never grouped
  for (auto& r : older) r.cpu_quota_cgroup_id.clear();
  EXPECT_TRUE(ppb::shared_quotas(older).empty());
}

/// A quota nested in a shared one (scripts/cpu_quota.sh on rank 1 inside a container's --cpus):
/// the container's level groups both ranks, rank 1 counted at its own 0.5 cores. Warned where
/// they would run past the container (1 core: 1 + 0.5), not where they fit (1.5 or 2 cores), not
/// where each runs under its own quota inside it; of two levels over the same ranks the tightest.
TEST(HostLoads, RanksUnderTheirOwnQuotasInsideASharedOneWarnPastIt) {
  std::vector<ppb::RankInfo> ranks(2, rank("vm", "0-1", 1));
  for (auto& r : ranks) r.machine_id = "boot-1";
  const ppb::QuotaLevel container{"35:1", 1.0, "/sys/fs/cgroup/cpu/docker/c1"};
  ranks[0].cpu_quota_cores = 1.0;
  ranks[0].cpu_quota_cgroup = container.cgroup;
  ranks[0].cpu_quota_cgroup_id = container.cgroup_id;
  ranks[0].cpu_quota_levels = {container};
  ranks[1].cpu_quota_cores = 0.5;
  ranks[1].cpu_quota_cgroup = "/sys/fs/cgroup/cpu/docker/c1/ppb_quota_7";
  ranks[1].cpu_quota_cgroup_id = "35:2";
  ranks[1].cpu_quota_levels = {{"35:2", 0.5, ranks[1].cpu_quota_cgroup}, container};
  auto shared = ppb::shared_quotas(ranks);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(shared[0].cores, 1.0);
  EXPECT_EQ(shared[0].threads, 2);
  EXPECT_DOUBLE_EQ(shared[0].demand_cores, 1.5);
  EXPECT_EQ(shared[0].cgroup, container.cgroup);
  EXPECT_TRUE(ppb::any_oversubscribed(ranks));
  EXPECT_EQ(ppb::shared_quota_warning(shared[0]).rfind(
                "WARNING: ranks 0,1 share one CPU quota of 1.00 cores (cgroup /sys/fs/cgroup/cpu/docker/c1) with 2 "
                "compute threads that would run 1.50 cores, some ranks held to their own quotas inside it: together "
                "they run at most 1.00 cores",
                0),
            0u)
      << ppb::shared_quota_warning(shared[0]);
  for (const double cores : {1.5, 2.0}) {  // 1 + 0.5 fits
    auto roomy = ranks;
    roomy[0].cpu_quota_cores = roomy[0].cpu_quota_levels[0].cores = roomy[1].cpu_quota_levels[1].cores = cores;
    EXPECT_TRUE(ppb::shared_quotas(roomy).empty()) << cores;
  }
  auto both = ranks;  // rank 0 under its own 0.5 too: 0.5 + 0.5 fits in the container's 1
  both[0].cpu_quota_cores = 0.5;
  both[0].cpu_quota_cgroup_id = "35:3";
  both[0].cpu_quota_levels = {{"35:3", 0.5, "/sys/fs/cgroup/cpu/docker/c1/ppb_quota_6"}, container};
  EXPECT_TRUE(ppb::shared_quotas(both).empty());
  auto twice = ranks;  // a second level over the same ranks, also past (1.2 cores): the tighter kept
  for (auto& r : twice) r.cpu_quota_levels.push_back({"35:0", 1.2, "/sys/fs/cgroup/cpu/docker"});
  shared = ppb::shared_quotas(twice);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_DOUBLE_EQ(shared[0].cores, 1.0);
  auto v1_twice = ranks;  // one level listed twice for a rank (a v1 hierarchy under two names): counted once
  v1_twice[0].cpu_quota_levels.push_back(container);
  shared = ppb::shared_quotas(v1_twice);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_DOUBLE_EQ(shared[0].demand_cores, 1.5);
}

/// /ranks/cpu_quota_levels' text: a round trip, "" for none, and a clear error for what is not
/// such an array.
TEST(HostLoads, QuotaLevelsTextRoundTripsAndRefusesOtherText) {
  const std::vector<ppb::QuotaLevel> levels{{"35:2", 0.5, "/a b"}, {"35:1", 1.5, "/\"x\";y"}};
  EXPECT_EQ(ppb::parse_quota_levels(ppb::quota_levels_text(levels)), levels);
  EXPECT_EQ(ppb::quota_levels_text({}), "");
  // A directory name that is not UTF-8 is stored with U+FFFD, not a failed run.
  const auto odd = ppb::parse_quota_levels(ppb::quota_levels_text({{"35:3", 0.5, "/cg/\xff"}}));
  ASSERT_EQ(odd.size(), 1u);
  EXPECT_EQ(odd[0].cgroup, "/cg/\xef\xbf\xbd");
  EXPECT_TRUE(ppb::parse_quota_levels("").empty());
  for (const char* bad : {"{", "{}", "[{\"cgroup_id\": \"1:2\"}]", "[{\"cgroup_id\": 1, \"cores\": 1, \"cgroup\": \"/\"}]",
                          "[{\"cgroup_id\": \"1:2\", \"cores\": 0, \"cgroup\": \"/\"}]"}) {
    try {
      ppb::parse_quota_levels(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ppb::UserError& e) {
      EXPECT_NE(std::string(e.what()).find("/ranks/cpu_quota_levels"), std::string::npos) << e.what();
    }
  }
}

/// Two CUDA ranks on one GPU (gpu_check's set-up on a one-GPU machine): the summary warns that
/// the simulator assumes a GPU per rank; ranks on two GPUs, or CPU ranks, get no such warning.
TEST(HostLoads, SummaryWarnsWhenRanksShareAGpu) {
  ppb::RunRecord run;
  run.world_size = 2;
  run.backend = "cuda";
  run.ranks = {rank("vm", "0", 1), rank("vm", "1", 1)};
  for (auto& r : run.ranks) {
    r.device_name = "NVIDIA H200";
    r.bus_id = "0000:00:06.0";
  }
  std::ostringstream os;
  ppb::print_summary(os, run);
  EXPECT_NE(os.str().find("WARNING: ranks 0, 1 share one GPU (NVIDIA H200, bus 0000:00:06.0)"), std::string::npos)
      << os.str();
  run.ranks[1].bus_id = "0000:00:07.0";
  std::ostringstream two;
  ppb::print_summary(two, run);
  EXPECT_EQ(two.str().find("share one GPU"), std::string::npos) << two.str();
  run.ranks[1].bus_id = run.ranks[0].bus_id;
  run.backend = "cpu";
  std::ostringstream cpu;
  ppb::print_summary(cpu, run);
  EXPECT_EQ(cpu.str().find("share one GPU"), std::string::npos) << cpu.str();
}

}  // namespace
