// The phases of `ppbench run` called directly under MPI (src/run): the partitions' one codec,
// the plan phase (rank 0 solves, every rank receives the same splits) and the gather of a
// round (each rank's newest repetition onto rank 0's record, on rank 0's clock).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <filesystem>
#include <unistd.h>
#include <vector>

#include "balance/partition.h"
#include "balance/problem.h"
#include "common/events.h"
#include "mpi_test_main.h"
#include "run/context.h"
#include "run/gather.h"
#include "run/options.h"
#include "run/plan.h"
#include "run/startup.h"

namespace ppb {
namespace {

/// Every rank's copy of `parts` as rank 0 sees them (gathered and compared there).
void expect_same_everywhere(const MpiContext& mpi, const std::vector<balance::Partition>& parts) {
  std::vector<int> flat;
  for (const auto& p : parts) {
    flat.push_back(p.num_stages());
    for (int k = 0; k < p.num_stages(); ++k) flat.insert(flat.end(), {p.first_unit[k], p.last_unit[k], p.device_rank[k], p.width(k)});
    flat.insert(flat.end(), {p.groups, p.replicas});
    for (char c : p.solver) flat.push_back(c);
  }
  const auto all = mpi.gatherv_ints(flat);
  if (mpi.is_root())
    for (int r = 1; r < mpi.size(); ++r) EXPECT_EQ(all[r], all[0]) << "rank " << r;
}

TEST(RunPhases, PartitionCodecCarriesSplitsWidthsAndNames) {
  const auto& mpi = test::mpi();
  const int R = mpi.size(), U = 5 * R;
  std::vector<balance::Partition> parts;
  if (mpi.is_root()) {
    balance::Partition a = balance::solve_uniform(U, R);
    a.solver = "uniform";
    a.device_rank.clear();
    for (int k = 0; k < R; ++k) a.device_rank.push_back(R - 1 - k);  // a device order of its own
    a.tp_width.assign(R, 1);
    parts.push_back(a);
    balance::Partition b;  // one stage over every rank: tensor-parallel width R
    b.solver = "uniform_tp" + std::to_string(R);
    b.first_unit = {0};
    b.last_unit = {U - 1};
    b.device_rank = {0};
    b.tp_width = {R};
    parts.push_back(b);
    balance::Partition c;  // R replicas of one rank each, at M = 3
    c.solver = "plan-dp" + std::to_string(R) + "-pp1-m3";
    c.first_unit = {0};
    c.last_unit = {U - 1};
    c.device_rank = {0};
    c.tp_width = {1};
    c.groups = 3;
    c.replicas = R;
    parts.push_back(c);
  }
  run::broadcast_partitions(mpi, parts, U);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].replicas, R);
  EXPECT_EQ(parts[2].groups, 3);
  EXPECT_EQ(parts[0].replicas, 1);
  // Each rank serves its own replica of the one-rank layout, as its stage 0.
  const StagePlacement place = run::PartitionSet::placement(parts[2], mpi.rank());
  EXPECT_EQ(place.replica, mpi.rank());
  EXPECT_EQ(place.stage, 0);
  EXPECT_EQ(place.rank, mpi.rank());
  EXPECT_EQ(parts[0].solver, "uniform");
  EXPECT_EQ(parts[1].solver, "uniform_tp" + std::to_string(R));
  EXPECT_EQ(parts[0].device_rank.front(), R - 1);
  EXPECT_EQ(parts[0].last_unit.back(), U - 1);
  EXPECT_EQ(parts[1].tp_width, std::vector<int>{R});
  EXPECT_EQ(parts[1].last_unit, std::vector<int>{U - 1});
  balance::check_partition(parts[0], U);
  expect_same_everywhere(mpi, parts);
}

/// A run context on tiny-llama, started up to the cluster's description (device, transport,
/// clocks, links), its output in a scratch directory.
struct Started {
  RunFlags flags;
  run::RunOptions opt;
  std::unique_ptr<run::RunContext> ctx;
  explicit Started(const std::string& partition) {
    flags.model_path = PPB_SOURCE_DIR "/tests/data/tiny-llama.json";
    flags.partition = partition;
    flags.prompt_len = 4;
    flags.gen_len = 2;
    flags.batch = 2;
    flags.quiet = true;
    flags.output = (std::filesystem::temp_directory_path() / ("ppbench_run_phases_" + std::to_string(::getpid()) + ".h5")).string();
    flags.force = true;
    opt = run::parse_run_options(flags);
    ctx = std::make_unique<run::RunContext>(test::mpi(), opt);
    run::start_up(*ctx);
    run::open_device(*ctx);
    run::open_transport(*ctx);
    run::describe_run(*ctx);
  }
};

TEST(RunPhases, PlanSolvesOnRankZeroAndEveryRankGetsTheSplits) {
  const auto& mpi = test::mpi();
  Started s("both");
  run::RunContext& ctx = *s.ctx;
  const int U = ctx.spec.num_units(), R = ctx.ranks;
  // Rank 0's profile: every layer 1 ms, the head 2R ms of workload (a heavy head), identical ranks.
  if (ctx.root) {
    ProfileTable& t = ctx.record().profile;
    for (int u = 0; u < U; ++u) t.unit_name.push_back(ctx.spec.units[u].name);
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u) t.latency_ms.insert(t.latency_ms.end(), {u == U - 1 ? 2.0 * R : 1.0, 0.0});
    t.unit_weight_bytes.assign(U, 1);
    t.unit_kv_bytes.assign(U, 0);
  }
  const run::PartitionSet set = run::plan_partitions(ctx);
  ASSERT_EQ(set.size(), 2u);
  EXPECT_EQ(set.reference, "uniform");
  EXPECT_EQ(set.splits[0].solver, "uniform");
  EXPECT_EQ(set.splits[1].solver, "balanced");
  expect_same_everywhere(mpi, set.splits);
  // The balanced split is the exact solver's on rank 0's table, and no worse than uniform there.
  if (ctx.root) {
    const balance::BalanceProblem prob = balance::problem_from_run(ctx.record(), balance::Objective::workload);
    balance::SplitRequest req;
    req.stages = R;
    const balance::Partition best = balance::make_split(prob, req);
    EXPECT_EQ(set.splits[1].first_unit, best.first_unit);
    balance::Partition uni = set.splits[0], bal = set.splits[1];
    balance::evaluate(prob, uni);
    balance::evaluate(prob, bal);
    EXPECT_LE(bal.bottleneck_ms, uni.bottleneck_ms);
  }
}

TEST(RunPhases, GatherOfARoundAppendsEachRanksNewRepetitionOnRankZerosClock) {
  const auto& mpi = test::mpi();
  Started s("uniform");
  run::RunContext& ctx = *s.ctx;
  const Workload& w = ctx.workload;
  const int R = ctx.ranks, steps = w.gen_len + 1;
  // Two partitions of the same split (the gather does not care whether they differ): bench 1
  // joins late and brings two repetitions at once, so that each bench's slice of every rank's
  // message starts after the other's new repetitions alone.
  run::PartitionSet set;
  balance::Partition p = balance::solve_uniform(ctx.spec.num_units(), R);
  p.tp_width.assign(R, 1);
  for (const char* name : {"uniform", "other"}) {
    p.solver = name;
    set.splits.push_back(p);
    if (ctx.root) {
      PartitionRecord pr;
      pr.name = name;
      pr.first_unit = p.first_unit;
      pr.last_unit = p.last_unit;
      pr.device_rank = p.device_rank;
      ctx.record().partitions.push_back(pr);
    }
  }
  std::vector<run::Bench> benches(2);
  std::vector<run::ClosedTurns> turns(2);
  benches[0].pi = 0;
  benches[1].pi = 1;
  // Each rank's events of bench b, repetition i encode (b, rank, i, group, step, event) as
  // seconds on its own clock: the run's start on rank 0's clock, plus its offset to rank 0,
  // plus a code; rank 0 must map them back to the code (seconds since the run started).
  std::vector<double> start{ctx.root ? ctx.record().run_start_s : 0.0};
  mpi.bcast_doubles(start);
  // The offsets rank 0 will subtract (clock_offsets is valid on rank 0 alone).
  std::vector<double> offsets = ctx.cluster.clock_offsets_s;
  mpi.bcast_doubles(offsets);
  auto code = [&](int b, int r, int i, int g, int t, int x) {
    return 10.0 * b + 1.0 * r + 0.1 * i + 0.01 * g + 0.001 * t + 1e-5 * x;
  };
  auto add_repetition = [&](int b, int round) {
    const int i = static_cast<int>(benches[b].rounds.size());
    for (int g = 0; g < w.groups; ++g)
      for (int t = 0; t < steps; ++t)
        for (int x = 0; x < kNumEvents; ++x)
          turns[b].rec.events.push_back(code(b, mpi.rank(), i, g, t, x) + offsets[mpi.rank()] + start[0]);
    benches[b].rounds.push_back(round);
  };
  add_repetition(0, 0);
  run::gather_round(ctx, set, benches, turns);
  EXPECT_EQ(turns[0].reps_gathered, 1u);
  EXPECT_EQ(turns[1].reps_gathered, 0u);
  add_repetition(0, 1);
  add_repetition(1, 1);
  add_repetition(1, 1);
  run::gather_round(ctx, set, benches, turns);
  EXPECT_EQ(turns[0].reps_gathered, 2u);
  EXPECT_EQ(turns[1].reps_gathered, 2u);
  if (!ctx.root) return;
  for (int b = 0; b < 2; ++b) {
    const PartitionRecord& pr = ctx.record().partitions[b];
    const EventShape sh{2, w.groups, steps, R};
    ASSERT_EQ(pr.events.size(), static_cast<size_t>(2) * w.groups * steps * R * kNumEvents);
    EXPECT_EQ(pr.rep_round, (b == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 1}));
    EXPECT_EQ(pr.rep_tokens_per_s.size(), 2u);
    EXPECT_TRUE(pr.measured);
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < R; ++k)
        for (int g = 0; g < w.groups; ++g)
          for (int t = 0; t < steps; ++t)
            for (int x = 0; x < kNumEvents; ++x) {
              const double got = pr.events[sh.index(i, g, t, k, x)];
              // code + offset + start, less (offset + start) on rank 0: four roundings of numbers
              // below |start| + 32 s, each within half an ulp there; 8 ulps is twice that. (The
              // codes of neighbouring events are 1e-5 s apart: a mix-up fails at any clock.)
              EXPECT_NEAR(got, code(b, k, i, g, t, x),
                          8 * std::numeric_limits<double>::epsilon() * (std::fabs(start[0]) + 32))
                  << b << " " << i << " " << k << " " << g << " " << t << " " << x;
            }
  }
}

}  // namespace
}  // namespace ppb
