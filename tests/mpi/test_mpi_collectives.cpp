// Gather of the profile table and broadcast of the assignment, as run_job does them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include "backend/tensor_parallel.h"
#include "balance/partition.h"
#include "common/error.h"
#include "mpi_test_main.h"
#include "transport/transport.h"

namespace ppb {
namespace {

TEST(MpiCollectives, ProfileGatherIsRankMajor) {
  const auto& mpi = test::mpi();
  const int U = 7;
  // Each rank's latency row [U][2] encodes (rank, unit, phase) so misplacement shows.
  std::vector<double> mine;
  for (int u = 0; u < U; ++u)
    for (int ph = 0; ph < 2; ++ph) mine.push_back(1000.0 * mpi.rank() + 10.0 * u + ph);
  auto all = mpi.gather_doubles(mine);
  if (mpi.is_root()) {
    ASSERT_EQ(all.size(), static_cast<size_t>(mpi.size() * U * 2));
    for (int r = 0; r < mpi.size(); ++r)
      for (int u = 0; u < U; ++u)
        for (int ph = 0; ph < 2; ++ph) EXPECT_EQ(all[(r * U + u) * 2 + ph], 1000.0 * r + 10.0 * u + ph);
  } else {
    EXPECT_TRUE(all.empty());
  }
}

TEST(MpiCollectives, VariableLengthGatherAndStrings) {
  const auto& mpi = test::mpi();
  std::vector<int> mine(mpi.rank() + 1, mpi.rank());
  auto all = mpi.gatherv_ints(mine);
  auto names = mpi.gather_strings("rank-" + std::to_string(mpi.rank()));
  if (mpi.is_root()) {
    for (int r = 0; r < mpi.size(); ++r) {
      EXPECT_EQ(all[r], std::vector<int>(r + 1, r));
      EXPECT_EQ(names[r], "rank-" + std::to_string(r));
    }
  }
}

TEST(MpiCollectives, BalancedAssignmentBroadcastFromRoot) {
  const auto& mpi = test::mpi();
  const int S = mpi.size(), U = 3 * S + 2;
  // Rank 0 solves on a heterogeneous table; every rank must end with the same first units.
  std::vector<int> first;
  balance::Partition p;
  if (mpi.is_root()) {
    std::vector<std::vector<double>> cost(S, std::vector<double>(U, 1.0));
    for (int k = 0; k < S; ++k) cost[k][U - 1] = 4.0 + k;  // heavy head
    p = balance::solve_balanced(cost, S);
    first = p.first_unit;
  }
  mpi.bcast_ints(first);
  ASSERT_EQ(static_cast<int>(first.size()), S);
  EXPECT_EQ(first[0], 0);
  for (int k = 1; k < S; ++k) EXPECT_GT(first[k], first[k - 1]);
  // Every rank checks it got rank 0's answer by gathering what it received.
  auto echoed = mpi.gatherv_ints(first);
  if (mpi.is_root())
    for (int r = 0; r < S; ++r) EXPECT_EQ(echoed[r], p.first_unit);
}

TEST(MpiCollectives, AgreeReturnsTheWorstStatus) {
  const auto& mpi = test::mpi();
  EXPECT_EQ(mpi.agree(0), 0);
  EXPECT_EQ(mpi.agree(mpi.rank() == mpi.size() - 1 ? 2 : 0), 2);
}

/// The machine (issue 16's namespaces share one): read from the kernel's boot id, so on the one
/// machine ctest runs on every rank has the same id, that file's first line, and the machine's
/// ranks are the node's; without the file, the hostname stands in.
TEST(MpiCollectives, RanksOfOneMachineShareItsIdAndRankTheNodesWay) {
  const auto& mpi = test::mpi();
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot && std::getline(boot, id) && !id.empty()) {
    EXPECT_EQ(mpi.machine_id(), id);
  } else {
    EXPECT_EQ(mpi.machine_id(), "host:" + mpi.hostname());
  }
  const auto ids = mpi.gather_strings(mpi.machine_id());
  if (mpi.is_root()) {
    for (const auto& other : ids) EXPECT_EQ(other, ids[0]);
    EXPECT_EQ(mpi.machine_ids(), ids);  // every rank's, as gathered at start-up
  }
  EXPECT_EQ(mpi.machine_size(), mpi.size());
  EXPECT_EQ(mpi.machine_size(), mpi.local_size());
  EXPECT_EQ(mpi.machine_rank(), mpi.local_rank());

  char tmpl[] = "/tmp/ppb_boot_id_XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = tmpl;
  {
    std::ofstream out(path);
    out << "3f1c2d9e-0000-4000-8000-00000000abcd  \n second line\n";
  }
  EXPECT_EQ(MpiContext::read_machine_id(path, "n1"), "3f1c2d9e-0000-4000-8000-00000000abcd");
  {
    std::ofstream out(path);  // empty
  }
  EXPECT_EQ(MpiContext::read_machine_id(path, "n1"), "host:n1");
  std::remove(path.c_str());
  EXPECT_EQ(MpiContext::read_machine_id(path, "n1"), "host:n1");  // missing

  // Several machines: each rank's colour is the first rank of its machine.
  EXPECT_EQ(MpiContext::machine_colours({"b1", "b2", "b1", "host:n3", "b2", "b2"}),
            (std::vector<int>{0, 1, 0, 3, 1, 1}));
  EXPECT_EQ(MpiContext::machine_colours({"x"}), (std::vector<int>{0}));
  EXPECT_TRUE(MpiContext::machine_colours({}).empty());
}

/// The link matrix (issue 16): the measured pairs on every rank, symmetric, NaN elsewhere;
/// link_model is its pair 0 <-> 1.
TEST(MpiCollectives, LinkMatrixMeasuresTheGivenPairsOnly) {
  const auto& mpi = test::mpi();
  const int R = mpi.size();
  std::vector<std::pair<int, int>> pairs;
  for (int a = 0; a + 1 < R; ++a) pairs.emplace_back(a + 1, a);  // neighbours, either order
  const auto m = mpi.link_matrix(pairs, 1 << 16);
  ASSERT_EQ(m.latency_s.size(), static_cast<size_t>(R * R));
  for (int a = 0; a < R; ++a)
    for (int b = 0; b < R; ++b) {
      const size_t k = static_cast<size_t>(a) * R + b;
      if (std::abs(a - b) == 1) {
        EXPECT_GT(m.latency_s[k], 0.0) << a << " " << b;
        EXPECT_LT(m.latency_s[k], 0.1) << a << " " << b;  // one node: far below 100 ms
        EXPECT_GT(m.bandwidth_Bps[k], 1e6) << a << " " << b;
        EXPECT_EQ(m.latency_s[k], m.latency_s[static_cast<size_t>(b) * R + a]);
      } else {
        EXPECT_TRUE(std::isnan(m.latency_s[k]) && std::isnan(m.bandwidth_Bps[k])) << a << " " << b;
      }
    }
  const auto [lat, bw] = mpi.link_model(1 << 16);
  EXPECT_GT(lat, 0.0);
  EXPECT_GT(bw, 1e6);
  EXPECT_THROW(mpi.link_matrix({{0, 0}}), InternalError);
}

TEST(MpiCollectives, ClockOffsetsAreSmallOnOneNode) {
  // CLOCK_MONOTONIC is node-wide: ping-pong must find offsets far below a millisecond.
  const auto& mpi = test::mpi();
  auto off = mpi.clock_offsets();
  if (mpi.is_root())
    for (double o : off) EXPECT_LT(std::abs(o), 1e-3);
}

/// The tensor-parallel group over MPI (transport.h create_mpi_tp_group): groups of 2 consecutive
/// ranks (and one of every rank); each rank's part encodes (rank, element), so the sum is known;
/// every rank of a group gets the bits of tp_sum_in_rank_order over the same parts (what
/// ThreadTpGroups computes), and the argmax keeps the largest value, ties to the lowest id.
TEST(MpiCollectives, TensorParallelGroupsSumInRankOrderAndAgreeOnTheArgmax) {
  const auto& mpi = test::mpi();
  MpiPollConfig poll;
  poll.timeout_s = 60;
  poll.spin_us = 100;
  for (int width : {2, mpi.size()}) {
    const int color = mpi.rank() / width, key = mpi.rank() % width;
    auto group = create_mpi_tp_group(mpi, color, key, poll);
    ASSERT_TRUE(group);
    ASSERT_EQ(group->width(), width);
    ASSERT_EQ(group->rank(), key);
    const size_t n = 1000;
    auto part = [&](int r) {  // values whose rounded sums depend on the order
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = (1.0f + 1e-7f * static_cast<float>(i)) * (r % 2 ? 1e-3f : 1e4f) + 0.1f * r;
      return v;
    };
    std::vector<float> mine = part(key);
    group->allreduce_sum(mine.data(), n);
    std::vector<std::vector<float>> parts;
    std::vector<const float*> ptrs;
    for (int r = 0; r < width; ++r) parts.push_back(part(r));
    for (auto& p : parts) ptrs.push_back(p.data());
    std::vector<float> expect(n);
    tp_sum_in_rank_order(expect.data(), ptrs.data(), width, n);
    EXPECT_EQ(mine, expect) << "width " << width;
    // Argmax over 3 rows: row 0's best on the group's last rank; row 1 a tie everywhere (lowest
    // id wins, that of rank 0); row 2 the best on rank 0.
    std::vector<float> value = {static_cast<float>(key), 7.0f, key == 0 ? 9.0f : 1.0f};
    std::vector<int32_t> id = {100 + key, 50 + key, 10 * key};
    group->allreduce_argmax(value.data(), id.data(), 3);
    EXPECT_EQ(id, (std::vector<int32_t>{100 + width - 1, 50, 0})) << "width " << width;
    EXPECT_EQ(value, (std::vector<float>{static_cast<float>(width - 1), 7.0f, 9.0f}));
  }
  // color < 0: not in any group.
  auto none = create_mpi_tp_group(mpi, mpi.rank() == 0 ? -1 : 0, mpi.rank(), poll);
  EXPECT_EQ(none == nullptr, mpi.rank() == 0);
}

}  // namespace
}  // namespace ppb
