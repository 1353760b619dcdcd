// Gather of the profile table and broadcast of the assignment, as run_job does them.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "balance/partition.h"
#include "common/error.h"
#include "mpi_test_main.h"

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

}  // namespace
}  // namespace ppb
