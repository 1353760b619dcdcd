// The CPU device's free memory (backend/cpu/cpu_memory.h): MemAvailable capped by the memory
// cgroup limit (v1 and v2), on fake /proc and /sys/fs/cgroup trees in a temporary directory.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/cpu_memory.h"
#include "backend/device.h"

namespace {

namespace fs = std::filesystem;
using ppb::cgroup_memory_headroom;
using ppb::cpu_free_memory;

constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kGiB = uint64_t(1) << 30;

class CpuMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("ppb_cpu_memory_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(proc());
    fs::create_directories(cg());
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path proc() const { return root_ / "proc"; }
  fs::path cg() const { return root_ / "cgroup"; }
  void write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void meminfo(uint64_t available_kib) {
    write(proc() / "meminfo", "MemTotal:       24683656 kB\nMemFree:         1000000 kB\n"
                              "MemAvailable:   " + std::to_string(available_kib) + " kB\nBuffers: 1 kB\n");
  }
  /// A v2 cgroup directory <cg>/<rel> with memory.max and memory.current (and optionally memory.stat).
  void v2(const std::string& rel, const std::string& max, uint64_t current, uint64_t inactive_file = 0) {
    fs::path dir = cg() / rel;
    write(dir / "memory.max", max + "\n");
    write(dir / "memory.current", std::to_string(current) + "\n");
    if (inactive_file)
      write(dir / "memory.stat", "anon 1\nfile 2\nactive_file 3\ninactive_file " + std::to_string(inactive_file) + "\n");
  }
  void v1(const std::string& rel, uint64_t limit, uint64_t usage, uint64_t total_inactive_file = 0) {
    fs::path dir = cg() / "memory" / rel;
    write(dir / "memory.limit_in_bytes", std::to_string(limit) + "\n");
    write(dir / "memory.usage_in_bytes", std::to_string(usage) + "\n");
    if (total_inactive_file)
      write(dir / "memory.stat", "inactive_file 5\ntotal_inactive_file " + std::to_string(total_inactive_file) + "\n");
  }

  fs::path root_;
};

TEST_F(CpuMemory, V2LimitIsMaxMinusCurrent) {
  v2("system.slice/job_7", std::to_string(4 * kGiB), 1 * kGiB);
  auto h = cgroup_memory_headroom("0::/system.slice/job_7\n", cg());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(*h, 3 * kGiB);
}

TEST_F(CpuMemory, V2MaxMeansNoLimit) {
  v2("user.slice", "max", 1 * kGiB);
  EXPECT_FALSE(cgroup_memory_headroom("0::/user.slice\n", cg()).has_value());
}

TEST_F(CpuMemory, V2NestedLimitsTakeTheSmallestHeadroom) {
  // A Slurm-like tree: the job's limit (8 GiB, 7.5 GiB used) is tighter than the step's own
  // (4 GiB, 1 GiB used), and the task has none; the root's limit is loose.
  v2("", std::to_string(64 * kGiB), 10 * kGiB);
  v2("slurm/job_1", std::to_string(8 * kGiB), 7 * kGiB + 512 * kMiB);
  v2("slurm/job_1/step_0", std::to_string(4 * kGiB), 1 * kGiB);
  v2("slurm/job_1/step_0/task_0", "max", 512 * kMiB);
  auto h = cgroup_memory_headroom("0::/slurm/job_1/step_0/task_0\n", cg());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(*h, 512 * kMiB);
}

TEST_F(CpuMemory, V2InactivePageCacheCountsAsFree) {
  v2("job", std::to_string(2 * kGiB), 2 * kGiB, 1 * kGiB);
  EXPECT_EQ(cgroup_memory_headroom("0::/job\n", cg()).value_or(0), 1 * kGiB);
}

TEST_F(CpuMemory, UsageOverTheLimitIsZero) {
  v2("job", std::to_string(1 * kGiB), 2 * kGiB);
  EXPECT_EQ(cgroup_memory_headroom("0::/job\n", cg()).value_or(99), 0u);
}

TEST_F(CpuMemory, V1Limit) {
  v1("", 9223372036854771712ull, 20 * kGiB);  // the root: unlimited
  v1("slurm/uid_0/job_3/step_batch", 6 * kGiB, 2 * kGiB, 1 * kGiB);
  const std::string self = "12:pids:/\n4:memory:/slurm/uid_0/job_3/step_batch\n3:cpu,cpuacct:/\n0::/\n";
  auto h = cgroup_memory_headroom(self, cg());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(*h, 5 * kGiB);
}

TEST_F(CpuMemory, V1HugeValueMeansUnlimited) {
  v1("", 9223372036854771712ull, 20 * kGiB);
  v1("docker/abc", 9223372036854771712ull, 1 * kGiB);
  EXPECT_FALSE(cgroup_memory_headroom("4:memory:/docker/abc\n0::/\n", cg()).has_value());
}

TEST_F(CpuMemory, V1ControllerAmongOthersAndMissingDirectories) {
  // The process's own directory is not visible (a container sees its cgroup as the mount's
  // root): the walk up still finds the limit at the root.
  v1("", 3 * kGiB, 1 * kGiB);
  auto h = cgroup_memory_headroom("5:memory,hugetlb:/docker/abc\n", cg());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(*h, 2 * kGiB);
}

TEST_F(CpuMemory, NoCgroupFilesMeansNoLimit) {
  EXPECT_FALSE(cgroup_memory_headroom("0::/\n", cg()).has_value());
  EXPECT_FALSE(cgroup_memory_headroom("4:memory:/a/b\n0::/a/b\n", cg()).has_value());
  EXPECT_FALSE(cgroup_memory_headroom("", cg()).has_value());
  EXPECT_FALSE(cgroup_memory_headroom("garbage\n::\n", root_ / "does-not-exist").has_value());
}

TEST_F(CpuMemory, UnreadableOrMalformedFilesAreIgnored) {
  v2("job", "12 GiB", 1 * kGiB);  // not a number: ignored
  v2("job/step", std::to_string(4 * kGiB), 0);
  fs::remove(cg() / "job/step/memory.current");  // a limit without usage: ignored
  EXPECT_FALSE(cgroup_memory_headroom("0::/job/step\n", cg()).has_value());
  v2("x", std::to_string(4 * kGiB), 1 * kGiB);
  EXPECT_FALSE(cgroup_memory_headroom("0::/../x\n", cg()).has_value());  // outside our view
}

TEST_F(CpuMemory, FreeMemoryIsTheSmallerOfMemAvailableAndTheCgroup) {
  meminfo(16 * 1024 * 1024);  // 16 GiB available on the node
  write(proc() / "self" / "cgroup", "0::/job\n");
  v2("job", std::to_string(4 * kGiB), 1 * kGiB);
  EXPECT_EQ(cpu_free_memory(proc(), cg()), 3 * kGiB);
  v2("job", std::to_string(40 * kGiB), 1 * kGiB);
  EXPECT_EQ(cpu_free_memory(proc(), cg()), 16 * kGiB);
  v2("job", "max", 1 * kGiB);
  EXPECT_EQ(cpu_free_memory(proc(), cg()), 16 * kGiB);
}

TEST_F(CpuMemory, FreeMemoryWithOnlyOneSourceOrNone) {
  write(proc() / "self" / "cgroup", "0::/job\n");
  v2("job", std::to_string(4 * kGiB), 1 * kGiB);
  EXPECT_EQ(cpu_free_memory(proc(), cg()), 3 * kGiB);  // no meminfo
  fs::remove_all(cg() / "job");
  EXPECT_EQ(cpu_free_memory(proc(), cg()), 0u);  // neither
  meminfo(1024);
  EXPECT_EQ(cpu_free_memory(proc(), cg()), 1 * kMiB);  // meminfo only
}

TEST_F(CpuMemory, PoolsAreTheKernelAndTheCgroupThatLimits) {
  meminfo(16 * 1024 * 1024);
  write(proc() / "self" / "cgroup", "0::/job/step_0/task_1\n");
  v2("job", std::to_string(6 * kGiB), 2 * kGiB);  // 4 GiB of headroom: the tightest
  v2("job/step_0", std::to_string(20 * kGiB), 1 * kGiB);
  auto pools = ppb::cpu_memory_pools(proc(), cg());
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[0].free_bytes, 16 * kGiB);
  EXPECT_EQ(pools[0].key, "kernel");
  EXPECT_EQ(pools[1].free_bytes, 4 * kGiB);
  // Named by the limiting directory's inode, not its path: a process in another container (or
  // cgroup namespace) sees its own cgroup as "/" but the kernel's inode of the same directory.
  const std::string job = pools[1].key;
  EXPECT_EQ(job.rfind("cgroup:", 0), 0u) << job;
  EXPECT_EQ(job.find("job"), std::string::npos) << job;
  // A sibling task of the same step draws on the same cgroup: the same key.
  write(proc() / "self" / "cgroup", "0::/job/step_0/task_2\n");
  EXPECT_EQ(ppb::cpu_memory_pools(proc(), cg())[1].key, job);
  // Another job's cgroup is another pool.
  v2("job_b", std::to_string(6 * kGiB), 2 * kGiB);
  write(proc() / "self" / "cgroup", "0::/job_b\n");
  pools = ppb::cpu_memory_pools(proc(), cg());
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_NE(pools[1].key, job);
  // No limit: the kernel's pool alone; nothing readable: none.
  write(proc() / "self" / "cgroup", "0::/user.slice\n");
  EXPECT_EQ(ppb::cpu_memory_pools(proc(), cg()).size(), 1u);
  fs::remove(proc() / "meminfo");
  EXPECT_TRUE(ppb::cpu_memory_pools(proc(), cg()).empty());
}

TEST(MemoryShare, EachPoolDividedByItsRanksTheSmallestShareWins) {
  using ppb::MemoryPool;
  // Two namespace nodes of one machine (m), no cgroup limits: 4 ranks draw on the kernel's
  // 16 GiB, 4 GiB each (dividing by the node's 2 ranks gave 8 GiB each: twice the machine).
  const std::vector<std::vector<std::string>> four{{"m/kernel"}, {"m/kernel"}, {"m/kernel"}, {"m/kernel"}};
  auto sharers = ppb::count_pool_sharers({"m/kernel"}, four);
  EXPECT_EQ(sharers, std::vector<int>{4});
  EXPECT_EQ(ppb::memory_share({MemoryPool{16 * kGiB, "kernel"}}, sharers), 4 * kGiB);
  // Two containers of one machine, each limited to 6 GiB and holding 2 ranks: the cgroup's
  // headroom is shared by its 2 ranks (3 GiB), the kernel's 16 GiB by all 4 (4 GiB): 3 GiB.
  const std::vector<std::vector<std::string>> containers{
      {"m/kernel", "m/cgroup:a"}, {"m/kernel", "m/cgroup:a"}, {"m/kernel", "m/cgroup:b"}, {"m/kernel", "m/cgroup:b"}};
  sharers = ppb::count_pool_sharers({"m/kernel", "m/cgroup:a"}, containers);
  EXPECT_EQ(sharers, (std::vector<int>{4, 2}));
  EXPECT_EQ(ppb::memory_share({{16 * kGiB, "kernel"}, {6 * kGiB, "cgroup:a"}}, sharers), 3 * kGiB);
  // Large limits: the kernel's share is the smaller one.
  EXPECT_EQ(ppb::memory_share({{16 * kGiB, "kernel"}, {60 * kGiB, "cgroup:a"}}, sharers), 4 * kGiB);
  // Another machine's kernel is another pool; a key listed twice counts its rank once.
  sharers = ppb::count_pool_sharers({"n/kernel"}, {{"m/kernel"}, {"n/kernel", "n/kernel"}, {"n/kernel"}});
  EXPECT_EQ(sharers, std::vector<int>{2});
  EXPECT_EQ(ppb::memory_share({}, {}), 0u);
  EXPECT_THROW(ppb::memory_share({{kGiB, "kernel"}}, {}), std::invalid_argument);
  EXPECT_THROW(ppb::memory_share({{kGiB, "kernel"}}, {0}), std::invalid_argument);
}

TEST(CpuMemoryHost, DeviceFreeMemoryIsPositiveAndAtMostMemAvailable) {
  auto device = ppb::create_cpu_device(1);
  const size_t free = device->free_memory();
  EXPECT_GT(free, 0u);
  // Without cgroups: MemAvailable alone (a little slack: it moves between the two reads).
  EXPECT_LE(free, cpu_free_memory("/proc", "/nonexistent-cgroup-root") + 256 * kMiB);
}

}  // namespace
