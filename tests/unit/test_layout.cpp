// Layouts with tensor-parallel stages (balance/layout.h, issue 14): --tp parsing, the layout
// problem of a run, and the layout search against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "balance/layout.h"
#include "balance/solver.h"
#include "common/error.h"
#include "results/run_record.h"

namespace {

using ppb::balance::GroupCandidate;
using ppb::balance::Partition;

TEST(Layout, ParseWidths) {
  EXPECT_EQ(ppb::balance::parse_layout("1", 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(ppb::balance::parse_layout("2", 4), (std::vector<int>{2, 2}));
  EXPECT_EQ(ppb::balance::parse_layout("4", 4), (std::vector<int>{4}));
  EXPECT_EQ(ppb::balance::parse_layout("2,1,1", 4), (std::vector<int>{2, 1, 1}));
  EXPECT_THROW(ppb::balance::parse_layout("3", 4), ppb::UserError);
  EXPECT_THROW(ppb::balance::parse_layout("2,1", 4), ppb::UserError);
  EXPECT_THROW(ppb::balance::parse_layout("0", 4), ppb::UserError);
  EXPECT_THROW(ppb::balance::parse_layout("2,,2", 4), ppb::UserError);
  EXPECT_THROW(ppb::balance::parse_layout("x", 4), ppb::UserError);
  EXPECT_EQ(ppb::balance::layout_label({2, 2}), "2");
  EXPECT_EQ(ppb::balance::layout_label({2, 1, 1}), "2,1,1");
  EXPECT_EQ(ppb::balance::layout_suffix({1, 1}), "");
  EXPECT_EQ(ppb::balance::layout_suffix({2, 2}), "_tp2");
  EXPECT_EQ(ppb::balance::layout_suffix({2, 1, 1}), "_tp2-1-1");
  EXPECT_EQ(ppb::balance::layout_groups({2, 1, 1}), (std::vector<std::pair<int, int>>{{0, 2}, {2, 1}, {3, 1}}));
  // --tp auto profiles one group per width and device class: classes 0,0,1,1 at widths 2, 4.
  EXPECT_EQ(ppb::balance::auto_layout_groups({0, 0, 1, 1}, {2, 4}), (std::vector<std::pair<int, int>>{{0, 2}, {2, 2}}));
  EXPECT_EQ(ppb::balance::auto_layout_groups({0, 0, 0, 0}, {2, 3, 4}),
            (std::vector<std::pair<int, int>>{{0, 2}, {0, 3}, {0, 4}}));
}

/// --tp auto profiles one group per width and device class: a group of identical ranks elsewhere
/// takes that profile (and a group mixing classes, none).
TEST(Layout, GroupProfileFallsBackToTheSameWidthAndClass) {
  ppb::RunRecord run;
  ppb::ProfileTable::TpGroupProfile g;
  g.first_rank = 0;
  g.width = 2;
  g.latency_ms = {1, 2};
  run.profile.tp.push_back(g);
  EXPECT_EQ(ppb::balance::group_profile(run, {0, 0, 0, 0}, 0, 2), &run.profile.tp[0]);
  EXPECT_EQ(ppb::balance::group_profile(run, {0, 0, 0, 0}, 2, 2), &run.profile.tp[0]);
  EXPECT_EQ(ppb::balance::group_profile(run, {0, 0, 1, 1}, 2, 2), nullptr);  // another kind of device
  EXPECT_EQ(ppb::balance::group_profile(run, {0, 0, 1, 1}, 1, 2), nullptr);  // mixes kinds
  EXPECT_EQ(ppb::balance::group_profile(run, {0, 0, 0, 0}, 0, 4), nullptr);  // width not profiled
  EXPECT_EQ(ppb::balance::group_profile(run, {0, 0, 0, 0}, 3, 2), nullptr);  // past the ranks
}

/// Every layout of `devices` devices from `groups` and every contiguous split of the units
/// over its stages, evaluated with the same stage_time as the solver: the smallest bottleneck,
/// then spread, then stage count.
struct Best {
  double bottleneck = std::numeric_limits<double>::infinity();
  double spread = std::numeric_limits<double>::infinity();
  int stages = 0;
};

Best brute_force(const ppb::balance::BalanceProblem& base, const std::vector<GroupCandidate>& groups, int devices) {
  const int U = static_cast<int>(groups[0].cost.size());
  ppb::balance::BalanceProblem xp = base;
  xp.cost.assign(1, groups[0].cost);
  const std::vector<double> xfer = ppb::balance::boundary_transfer_ms(xp);
  Best best;
  std::vector<const GroupCandidate*> chosen;
  std::vector<int> cuts;  // unit where each chosen stage starts
  std::function<void(int, int)> go = [&](int d, int u) {
    if (d == devices || u == U) {
      if (d != devices || u != U) return;
      double hi = 0, lo = std::numeric_limits<double>::infinity();
      for (size_t k = 0; k < chosen.size(); ++k) {
        const int a = cuts[k], b = k + 1 < chosen.size() ? cuts[k + 1] : U;
        double c = 0;
        int64_t bytes = 0;
        for (int x = a; x < b; ++x) {
          c += chosen[k]->cost[x];
          bytes += base.weight_bytes[x] + base.kv_bytes[x];
        }
        if (chosen[k]->memory_bytes > 0 && bytes > chosen[k]->memory_bytes) return;
        const double t = ppb::balance::stage_time(c, a > 0 ? xfer[a - 1] : 0.0, b < U ? xfer[b - 1] : 0.0, base.overlap);
        hi = std::max(hi, t);
        lo = std::min(lo, t);
      }
      const int S = static_cast<int>(chosen.size());
      if (hi < best.bottleneck || (hi == best.bottleneck && (hi - lo < best.spread || (hi - lo == best.spread && S < best.stages))))
        best = {hi, hi - lo, S};
      return;
    }
    for (const GroupCandidate& g : groups) {
      if (g.first != d || d + g.width > devices) continue;
      for (int v = u + 1; v <= U; ++v) {
        chosen.push_back(&g);
        cuts.push_back(u);
        go(d + g.width, v);
        chosen.pop_back();
        cuts.pop_back();
      }
    }
  };
  go(0, 0);
  return best;
}

TEST(Layout, SearchMatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.5, 4.0);
  for (int trial = 0; trial < 60; ++trial) {
    const int U = 3 + trial % 5;          // 3..7 units
    const int D = 1 + (trial / 5) % 4;    // 1..4 devices
    ppb::balance::BalanceProblem base;
    base.cost.assign(1, std::vector<double>(U, 1.0));
    base.weight_bytes.assign(U, 0);
    base.kv_bytes.assign(U, 0);
    for (int u = 0; u < U; ++u) base.weight_bytes[u] = 10 + static_cast<int64_t>(rng() % 20);
    base.activation_bytes.assign(U - 1, 1e6 * (trial % 3));
    base.link_bandwidth_GBps = 1.0;
    base.link_latency_us = trial % 2 ? 100.0 : 0.0;
    base.messages_per_boundary = 3;
    base.overlap = trial % 4 != 0;
    // Width 1 on every device (heterogeneous rows), widths 2 and 4 where they fit, each faster
    // per unit than one device but not twice; a memory limit that binds sometimes.
    std::vector<GroupCandidate> groups;
    for (int d = 0; d < D; ++d)
      for (int w : {1, 2, 4}) {
        if (d + w > D) continue;
        GroupCandidate g;
        g.first = d;
        g.width = w;
        for (int u = 0; u < U; ++u) g.cost.push_back(cost(rng) / (w == 1 ? 1.0 : 0.6 * w));
        g.memory_bytes = trial % 3 == 0 ? 0 : 45 * w;
        groups.push_back(g);
      }
    const Best want = brute_force(base, groups, D);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": U " + std::to_string(U) + " D " + std::to_string(D));
    if (std::isinf(want.bottleneck)) {
      EXPECT_THROW(ppb::balance::solve_layout(base, groups, D), ppb::UserError);
      continue;
    }
    const Partition p = ppb::balance::solve_layout(base, groups, D);
    EXPECT_EQ(p.bottleneck_ms, want.bottleneck);
    EXPECT_EQ(p.spread_ms, want.spread);
    EXPECT_EQ(p.num_stages(), want.stages);
    int devices = 0;
    for (int k = 0; k < p.num_stages(); ++k) {
      EXPECT_EQ(p.device_rank[k], devices);
      devices += p.width(k);
    }
    EXPECT_EQ(devices, D);
    EXPECT_EQ(p.first_unit.front(), 0);
    EXPECT_EQ(p.last_unit.back(), U - 1);
  }
}

TEST(Layout, SearchWidensTheHeavyStageWhenThatBeatsAnotherStage) {
  // Three identical devices and a head three times a layer: widening is worth it only when a
  // width-2 group runs the head faster than one device runs it.
  ppb::balance::BalanceProblem base;
  const std::vector<double> one = {1, 1, 1, 1, 3};
  base.cost.assign(1, one);
  std::vector<GroupCandidate> groups;
  for (int d = 0; d < 3; ++d) {
    groups.push_back({d, 1, one, 0});
    if (d + 2 <= 3) groups.push_back({d, 2, {0.55, 0.55, 0.55, 0.55, 1.6}, 0});
  }
  const Partition p = ppb::balance::solve_layout(base, groups, 3);
  // Three stages of one device: at best 2, 2, 3 (the head alone): bottleneck 3. Width 2 for
  // layers 0..3 and the head alone: 2.2, 3. One device for layers 0..1 (2) and a width-2 group
  // for layers 2..3 and the head (0.55 + 0.55 + 1.6 = 2.7): bottleneck 2.7, the best.
  EXPECT_DOUBLE_EQ(p.bottleneck_ms, 2.7);
  EXPECT_EQ(p.tp_width, (std::vector<int>{1, 2}));
  EXPECT_EQ(p.counts_string(), "2,3");
}

}  // namespace
