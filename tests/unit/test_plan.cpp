// Unit tests of the deployment planner (issue 36, offline part): balance/plan.h's search against
// brute force on small cases (every composition of widths, every split, every M, each evaluated
// directly with balance::Predictor), the Pareto front against a direct dominance check, the
// `ppbench plan` command's bad inputs (UserError: exit status 2) and its output, and the time of
// a 64-device, 128-unit plan.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "app/offline_commands.h"
#include "balance/layout.h"
#include "balance/plan.h"
#include "balance/plan_serving.h"
#include "balance/serving_step_model.h"
#include "serving/arrivals.h"
#include "serving/pipeline_sim.h"
#include "serving/rate_search.h"
#include "balance/predict.h"
#include "balance/problem.h"
#include "balance/solver.h"
#include "common/error.h"
#include "results/writer.h"
#include "synthetic_run.h"
#include "user_error_of.h"

namespace ppb {
namespace {

namespace fs = std::filesystem;
using balance::PlanCandidate;

/// A complete `ppbench profile`-like record: R ranks on one machine, U units (embed, layers,
/// head) with random costs, a profile per width in `tp_widths` (rank 0's group), workload B=2
/// P=4 G=3 M=2. two_pass: an alone table below the together one (the contention model runs).
RunRecord make_profile(int R, int U, const std::vector<int>& tp_widths, unsigned seed, bool two_pass = false,
                       int64_t memory_limit = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> pre(1.0, 5.0), dec(0.1, 1.0);
  RunRecord r = ppb_test::synthetic_run(R, {2, 4, 3, 2, "f32", 1, 2, 0, 3, true, 7, "workload"}, memory_limit);
  if (two_pass) r.workload.profile_passes = "alone+together";
  auto& p = r.profile;
  for (int u = 0; u < U; ++u) {
    p.unit_name.push_back(u == 0 ? "embed" : u == U - 1 ? "head" : "layer." + std::to_string(u - 1));
    p.unit_signature.push_back(u == 0 ? 0 : u == U - 1 ? 2 : 1);
    p.unit_params.push_back(100);
    p.unit_weight_bytes.push_back(u == U - 1 ? 3000 : 1000);
    p.unit_kv_bytes.push_back(u == 0 || u == U - 1 ? 0 : 400);
  }
  p.signature_name = {"embed", "layer", "head"};
  std::vector<double> row;
  for (int u = 0; u < U; ++u) row.insert(row.end(), {pre(rng), dec(rng)});
  for (int k = 0; k < R; ++k) p.latency_ms.insert(p.latency_ms.end(), row.begin(), row.end());
  p.latency_min_ms = p.latency_max_ms = p.latency_ms;
  if (two_pass)
    for (double v : p.latency_ms) p.latency_alone_ms.push_back(v * std::uniform_real_distribution<double>(0.6, 0.95)(rng));
  p.decode_contexts = {4};
  p.decode_context_ms.assign(static_cast<size_t>(R) * U, 1.0);
  p.cost_ms.assign(static_cast<size_t>(R) * U, 1.0);
  for (int w : tp_widths) {
    ProfileTable::TpGroupProfile g;
    g.first_rank = 0;
    g.width = w;
    for (double v : row) g.latency_ms.push_back(v * std::uniform_real_distribution<double>(0.4, 0.9)(rng));
    g.latency_min_ms = g.latency_max_ms = g.latency_ms;
    p.tp.push_back(g);
  }
  r.reference_partition = "";
  return r;
}

// ---- brute force --------------------------------------------------------------------------

/// Every composition of n devices into `widths` (groups within machines of m, at most U stages).
void compositions(int n, int m, int U, const std::vector<int>& widths, std::vector<int>& cur, int d,
                  std::vector<std::vector<int>>& out) {
  if (d == n) {
    out.push_back(cur);
    return;
  }
  if (static_cast<int>(cur.size()) >= U) return;
  for (int w : widths)
    if (d + w <= n && d / m == (d + w - 1) / m) {
      cur.push_back(w);
      compositions(n, m, U, widths, cur, d + w, out);
      cur.pop_back();
    }
}

/// Every split of U units into S stages, each stage evaluated on the layout problem; the fitting
/// split with the smallest bottleneck, then spread (relative tolerance 1e-9); nullopt if none fits.
std::optional<balance::Partition> best_split(const balance::BalanceProblem& lp, const std::vector<int>& widths) {
  const int U = lp.units(), S = static_cast<int>(widths.size());
  std::optional<balance::Partition> best;
  std::vector<int> cut(S + 1, 0);  // stage k = [cut[k], cut[k+1])
  cut[S] = U;
  std::function<void(int)> rec = [&](int k) {
    if (k == S) {
      balance::Partition p;
      for (int s = 0; s < S; ++s) {
        p.first_unit.push_back(cut[s]);
        p.last_unit.push_back(cut[s + 1] - 1);
        p.device_rank.push_back(s);
      }
      for (int s = 0; s < S; ++s) {
        int64_t bytes = 0;
        for (int u = cut[s]; u < cut[s + 1]; ++u) bytes += lp.weight_bytes[u] + lp.kv_bytes[u];
        if (!lp.device_memory_bytes.empty() && lp.device_memory_bytes[s] > 0 && bytes > lp.device_memory_bytes[s]) return;
      }
      balance::evaluate(lp, p);
      auto better = [](const balance::Partition& a, const balance::Partition& b) {
        const double tol = 1e-9 * std::max(1.0, b.bottleneck_ms);
        if (a.bottleneck_ms < b.bottleneck_ms - tol) return true;
        if (a.bottleneck_ms > b.bottleneck_ms + tol) return false;
        return a.spread_ms < b.spread_ms - tol;
      };
      if (!best || better(p, *best)) best = p;
      return;
    }
    for (int c = cut[k - 1] + 1; c <= U - (S - k); ++c) {
      cut[k] = c;
      rec(k + 1);
    }
  };
  rec(1);
  if (best) {
    const auto groups = balance::layout_groups(widths);
    for (int s = 0; s < S; ++s) best->device_rank[s] = groups[s].first;
    best->tp_width = widths;
  }
  return best;
}

/// The planner's candidates by brute force: every composition, every split, every M, each
/// predicted directly (Predictor on plan_record). every_layout: each composition's best split;
/// else per stage count the composition with the smallest bottleneck (lexicographically smallest
/// widths among ties), as plan_layouts' bottleneck mode defines it.
std::map<std::string, PlanCandidate> brute_force(const RunRecord& run, int N, bool every_layout) {
  const RunRecord rec1 = balance::plan_record(run, N, 1);
  std::vector<int> widths = {1};
  for (const auto& g : rec1.profile.tp) widths.push_back(g.width);
  std::sort(widths.begin(), widths.end());
  const int U = static_cast<int>(run.profile.unit_name.size());
  int m = 0;
  for (const RankInfo& k : run.ranks) m += rank_machine(k) == rank_machine(run.ranks[0]) ? 1 : 0;
  std::vector<std::vector<int>> all;
  std::vector<int> cur;
  compositions(N, m, U, widths, cur, 0, all);
  std::map<std::string, PlanCandidate> out;
  int max_s = 0;
  for (const auto& c : all) max_s = std::max(max_s, static_cast<int>(c.size()));
  for (int M = 1; M <= 2 * max_s; ++M) {
    const RunRecord rec = balance::plan_record(run, N, M);
    const balance::Predictor pred(rec);
    std::map<int, std::pair<std::vector<int>, balance::Partition>> per_s;  // bottleneck mode
    std::vector<std::pair<std::vector<int>, balance::Partition>> chosen;
    for (const auto& w : all) {
      const int S = static_cast<int>(w.size());
      if (M > 2 * S) continue;
      const auto split = best_split(balance::layout_problem(rec, balance::Objective::workload, w), w);
      if (!split) continue;
      if (every_layout) {
        chosen.emplace_back(w, *split);
        continue;
      }
      auto it = per_s.find(S);
      const double tol = 1e-9 * std::max(1.0, split->bottleneck_ms);
      if (it == per_s.end() || split->bottleneck_ms < it->second.second.bottleneck_ms - tol) per_s[S] = {w, *split};
      // compositions come in lexicographic order: a tie keeps the first
    }
    for (auto& [S, c] : per_s) chosen.push_back(c);
    for (const auto& [w, split] : chosen) {
      PlanCandidate c;
      c.widths = w;
      c.groups = M;
      c.split = split;
      c.label = balance::plan_label(w, M);
      const auto ph = pred.predicted_phases(split, rec.profile);
      const auto met = pred.simulate(split, ph.phase_ms);
      c.tokens_per_s = met.tokens_per_s;
      c.tokens_per_s_per_device = met.tokens_per_s / N;
      c.ttft_p50_ms = met.ttft_p50_ms;
      c.tpot_p50_ms = met.tpot_p50_ms;
      c.tokens_per_s_per_user = 1000.0 / met.tpot_p50_ms;
      // The pruning's bounds hold for every candidate.
      const auto b = balance::plan_bounds(pred, rec, split);
      EXPECT_LE(c.tokens_per_s, b.tokens_per_s_max * (1 + 1e-9)) << c.label;
      EXPECT_GE(c.ttft_p50_ms, b.ttft_min_ms * (1 - 1e-9)) << c.label;
      EXPECT_GE(c.tpot_p50_ms, b.tpot_min_ms * (1 - 1e-9)) << c.label;
      out[c.label] = c;
    }
  }
  return out;
}

/// Direct dominance: every candidate no other beats in both objectives (>= both, > one).
std::set<size_t> dominance_front(const std::vector<PlanCandidate>& c) {
  std::set<size_t> front;
  for (size_t i = 0; i < c.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < c.size() && !dominated; ++j)
      dominated = c[j].tokens_per_s_per_device >= c[i].tokens_per_s_per_device &&
                  c[j].tokens_per_s_per_user >= c[i].tokens_per_s_per_user &&
                  (c[j].tokens_per_s_per_device > c[i].tokens_per_s_per_device ||
                   c[j].tokens_per_s_per_user > c[i].tokens_per_s_per_user);
    if (!dominated) front.insert(i);
  }
  return front;
}

/// plan_layouts against brute_force: every candidate it simulated as the brute force predicts
/// it (same split, figures to 1e-9; all of them without pruning), the same front as a direct
/// dominance check of every brute-force candidate, and the same best under the TPOT target (or
/// the same closest when none meets it).
void expect_matches(const RunRecord& run, balance::PlanRequest req, const std::map<std::string, PlanCandidate>& bf) {
  const double slo_tpot = req.slo_tpot_ms;
  const bool prune = req.prune;
  const balance::PlanResult r = balance::plan_layouts(run, req);
  SCOPED_TRACE("N=" + std::to_string(req.devices) + " replicas " + std::to_string(req.replicas) + " mode " + r.mode +
               (prune ? " pruned" : ""));
  if (!prune) ASSERT_EQ(r.candidates.size(), bf.size());
  EXPECT_EQ(r.candidates.size() + r.pruned, bf.size());
  for (const PlanCandidate& c : r.candidates) {
    const auto it = bf.find(c.label);
    ASSERT_NE(it, bf.end()) << c.label;
    EXPECT_EQ(c.split.counts_string(), it->second.split.counts_string()) << c.label;
    EXPECT_NEAR(c.tokens_per_s, it->second.tokens_per_s, 1e-9 * c.tokens_per_s) << c.label;
    EXPECT_NEAR(c.tpot_p50_ms, it->second.tpot_p50_ms, 1e-9 * c.tpot_p50_ms) << c.label;
    EXPECT_NEAR(c.ttft_p50_ms, it->second.ttft_p50_ms, 1e-9 * c.ttft_p50_ms) << c.label;
  }
  std::vector<PlanCandidate> bfv;
  for (const auto& [label, c] : bf) bfv.push_back(c);
  std::set<std::string> front, bf_front;
  for (size_t i : r.front) front.insert(r.candidates[i].label);
  for (size_t i : dominance_front(bfv)) bf_front.insert(bfv[i].label);
  EXPECT_EQ(front, bf_front);
  const auto ch = balance::best_under_slo(r.candidates, 0, slo_tpot);
  const auto bf_ch = balance::best_under_slo(bfv, 0, slo_tpot);
  ASSERT_EQ(ch.best.has_value(), bf_ch.best.has_value());
  if (ch.best) EXPECT_EQ(r.candidates[*ch.best].label, bfv[*bf_ch.best].label);
  if (!ch.best) EXPECT_EQ(r.candidates[ch.closest].label, bfv[bf_ch.closest].label);
  // Only the best wanted (plan's N + 1 devices): the same best, from fewer simulations.
  req.need_front = false;
  const balance::PlanResult only = balance::plan_layouts(run, req);
  const auto only_ch = balance::best_under_slo(only.candidates, 0, slo_tpot);  // none simulated: no best
  ASSERT_EQ(only_ch.best.has_value(), bf_ch.best.has_value());
  if (only_ch.best) EXPECT_EQ(only.candidates[*only_ch.best].label, bfv[*bf_ch.best].label);
}

void expect_matches_brute_force(const RunRecord& run, int N, size_t max_layouts, double slo_tpot, bool prune = true) {
  balance::PlanRequest req;
  req.devices = N;
  req.max_layouts = max_layouts;
  req.slo_tpot_ms = slo_tpot;
  req.prune = prune;
  expect_matches(run, req, brute_force(run, N, max_layouts > 0));
}

/// Replicas by brute force: for every R dividing N with N / R <= `most` devices, brute_force's
/// candidates of N / R devices, R of them: tokens/s x R, tokens/s per device over all N devices
/// (the replica's own), latencies as they are.
std::map<std::string, PlanCandidate> brute_force_replicas(const RunRecord& run, int N, int most, std::vector<int>& counts) {
  std::map<std::string, PlanCandidate> out;
  counts.clear();
  for (int R = 1; R <= N; ++R) {
    if (N % R != 0 || N / R > most) continue;
    counts.push_back(R);
    for (auto [label, c] : brute_force(run, N / R, true)) {
      c.replicas = R;
      c.tokens_per_s *= R;
      c.tokens_per_s_per_device = c.tokens_per_s / N;
      c.label = balance::plan_label(c.widths, c.groups, R);
      out[c.label] = c;
    }
  }
  return out;
}

TEST(Plan, Labels) {
  EXPECT_EQ(balance::plan_label({1, 1}, 4), "PP2 M4");
  EXPECT_EQ(balance::plan_label({2}, 1), "TP2 M1");
  EXPECT_EQ(balance::plan_label({2, 1}, 2), "PP2 tp2-1 M2");
  EXPECT_EQ(balance::plan_label({2, 2}, 3), "PP2 tp2 M3");
  EXPECT_EQ(balance::plan_label({1}, 1), "PP1 M1");
}

// Replicas (issue 49): every R dividing N searched for N / R devices, one front over them all.
TEST(Plan, ReplicasMatchBruteForce) {
  EXPECT_EQ(balance::plan_label({1, 1}, 4, 2), "DP2 PP2 M4");
  EXPECT_EQ(balance::plan_label({2}, 1, 3), "DP3 TP2 M1");
  for (unsigned seed : {1u, 2u}) {
    const RunRecord run = make_profile(2, 4, {2}, seed);  // one pipeline: at most 4 units x width 2
    for (int N : {2, 4, 6, 12})
      for (bool prune : {false, true})
        for (double slo : {6.0, 1e-3}) {
          balance::PlanRequest req;
          req.devices = N;
          req.replicas = 0;
          req.slo_tpot_ms = slo;
          req.prune = prune;
          std::vector<int> counts;
          const auto bf = brute_force_replicas(run, N, 8, counts);
          EXPECT_EQ(balance::plan_layouts(run, req).replica_counts, counts) << N;
          expect_matches(run, req, bf);
        }
    // A fixed R: that R alone, the same figures as among all.
    balance::PlanRequest req;
    req.devices = 6;
    req.replicas = 3;
    const auto r3 = balance::plan_layouts(run, req);
    EXPECT_EQ(r3.replica_counts, std::vector<int>{3});
    for (const PlanCandidate& c : r3.candidates) EXPECT_EQ(c.replicas, 3) << c.label;
    req.replicas = 4;
    EXPECT_THROW(balance::plan_layouts(run, req), UserError);  // 4 does not divide 6
  }
}

// `plan --devices 64` on a 26-unit model (issue 49's example): one pipeline cannot use 64
// devices (26 units x width 2 = 52), replicas can; each replica count's figures are those of one
// pipeline of 64 / R devices, R times the tokens/s.
TEST(Plan, SixtyFourDevicesOnTwentySixUnitsAnswerWithReplicas) {
  const RunRecord run = make_profile(2, 26, {2}, 3);
  balance::PlanRequest req;
  req.devices = 64;
  EXPECT_NE(test::error_of([&] { balance::plan_layouts(run, req); }).find("at most 52 devices"), std::string::npos);
  req.replicas = 0;
  const auto r = balance::plan_layouts(run, req);
  EXPECT_EQ(r.replica_counts, (std::vector<int>{2, 4, 8, 16, 32, 64}));
  ASSERT_FALSE(r.front.empty());
  const PlanCandidate& best = r.candidates[*balance::best_under_slo(r.candidates, 0, 0).best];
  EXPECT_EQ(best.label.rfind("DP" + std::to_string(best.replicas) + " ", 0), 0u) << best.label;
  balance::PlanRequest one;
  one.devices = 64 / best.replicas;
  const auto single = balance::plan_layouts(run, one);
  bool found = false;
  for (const PlanCandidate& c : single.candidates)
    if (c.widths == best.widths && c.groups == best.groups) {
      found = true;
      EXPECT_NEAR(best.tokens_per_s, best.replicas * c.tokens_per_s, 1e-9 * best.tokens_per_s);
      EXPECT_DOUBLE_EQ(best.tpot_p50_ms, c.tpot_p50_ms);
      EXPECT_NEAR(best.tokens_per_s_per_device, c.tokens_per_s_per_device, 1e-9 * c.tokens_per_s_per_device);
    }
  EXPECT_TRUE(found) << best.label;
}

// Replicas on one machine contend (issue 49; a profile of two passes, CPU ranks): a replica's
// stage whose twin in another replica shares its machine is overlapped all the time, so it runs
// at its together times; replicas on machines of their own run at their alone times.
TEST(Plan, ReplicasOnOneMachineRunAtTheirTogetherTimes) {
  const RunRecord shared = make_profile(2, 4, {}, 5, true);  // two ranks on machine m0
  balance::PlanRequest one;
  one.devices = 1;
  one.prune = false;
  RunRecord always = shared;  // a device whose every step is overlapped: its together times alone
  always.profile.latency_alone_ms = always.profile.latency_ms;
  const auto alone = balance::plan_layouts(shared, one), together = balance::plan_layouts(always, one);
  RunRecord apart = shared;  // one rank per machine
  apart.ranks[1].machine_id = "m1";
  balance::PlanRequest dp;
  dp.devices = 2;
  dp.replicas = 2;
  dp.prune = false;
  using Case = std::pair<const RunRecord*, const balance::PlanResult*>;
  for (const auto& [run, twin] : {Case{&shared, &together}, Case{&apart, &alone}}) {
    const auto r = balance::plan_layouts(*run, dp);
    ASSERT_EQ(r.candidates.size(), twin->candidates.size());
    for (size_t i = 0; i < r.candidates.size(); ++i) {
      const PlanCandidate &c = r.candidates[i], &t = twin->candidates[i];
      SCOPED_TRACE(c.label);
      EXPECT_EQ(c.replicas, 2);
      EXPECT_EQ(c.groups, t.groups);
      EXPECT_NEAR(c.tpot_p50_ms, t.tpot_p50_ms, 1e-9 * t.tpot_p50_ms);
      EXPECT_NEAR(c.ttft_p50_ms, t.ttft_p50_ms, 1e-9 * t.ttft_p50_ms);
      EXPECT_NEAR(c.tokens_per_s, 2 * t.tokens_per_s, 1e-9 * c.tokens_per_s);
    }
  }
  // The together pass is the slower here (alone = together x 0.6..0.95): sharing costs.
  EXPECT_GT(together.candidates[0].tpot_p50_ms, alone.candidates[0].tpot_p50_ms);
}

TEST(Plan, EveryLayoutMatchesBruteForce) {
  for (unsigned seed : {1u, 2u, 3u}) {
    const RunRecord run = make_profile(2, 6, {2}, seed);
    for (int N : {1, 2, 3, 4, 5})
      for (bool prune : {false, true})
        for (double slo : {6.0, 1e-3}) expect_matches_brute_force(run, N, 256, slo, prune);
  }
}

/// run --tp auto's ranking (rank_layouts_by_tokens) against brute force: of every layout at the
/// record's M (2), the most predicted tokens/s (ties: fewer stages, then the smaller bottleneck)
/// and the smallest bottleneck; and at least once in these seeds the two differ (the reason for
/// the ranking: the fill and drain of M groups, not the bottleneck stage, decide).
// run --plan measures one tensor-parallel layout at several M: each such point is predicted again
// from the others' measured / predicted steps of the same stage (balance::cross_calibrate), and
// a point without a twin gets no cross-calibrated prediction.
TEST(Plan, TensorParallelPointsCrossCalibrateEachOther) {
  RunRecord r = make_profile(2, 6, {2}, 11);
  const balance::Predictor pred(r);
  const double factor[2] = {1.25, 0.8};  // measured / predicted, prefill and decode
  for (int M : {1, 2}) {
    balance::Partition p;
    p.solver = "plan-tp2-m" + std::to_string(M);
    p.first_unit = {0};
    p.last_unit = {5};
    p.device_rank = {0};
    p.tp_width = {2};
    p.groups = M;
    p.predicted_stage_ms = {1.0};  // the solver's evaluation, which describe keeps for a TP stage
    PartitionRecord pr = pred.describe(p, r.profile);
    pr.measured = true;
    pr.stage_compute_mean_ms = {pr.predicted_phase_ms[0] * factor[0], pr.predicted_phase_ms[1] * factor[1]};
    pr.metrics["decode_tokens_per_s"] = 1.0;
    r.partitions.push_back(pr);
  }
  std::vector<std::string> warnings;
  balance::cross_calibrate(pred, r, warnings);
  for (const PartitionRecord& pr : r.partitions) {
    SCOPED_TRACE(pr.name);
    ASSERT_EQ(pr.predicted_phase_cross_ms.size(), 2u);
    for (int ph = 0; ph < 2; ++ph)
      EXPECT_NEAR(pr.predicted_phase_cross_ms[ph], pr.predicted_phase_ms[ph] * factor[ph], 1e-12 * pr.predicted_phase_ms[ph]);
    EXPECT_EQ(pr.cross_calibrated_by, pr.name == "plan-tp2-m1" ? "plan-tp2-m2" : "plan-tp2-m1");
    const auto sim = pred.simulate(balance::partition_of(pr), pr.predicted_phase_cross_ms);
    EXPECT_DOUBLE_EQ(pr.metrics.at("simulated_cross_tokens_per_s"), sim.tokens_per_s);
    EXPECT_DOUBLE_EQ(pr.metrics.at("simulated_cross_tpot_p50_ms"), sim.tpot_p50_ms);
  }
  // Alone, a tensor-parallel point has no twin: no cross-calibrated prediction.
  r.partitions.resize(1);
  r.partitions[0].predicted_phase_cross_ms.clear();
  r.partitions[0].metrics.erase("simulated_cross_tokens_per_s");
  balance::cross_calibrate(pred, r, warnings);
  EXPECT_TRUE(r.partitions[0].predicted_phase_cross_ms.empty());
  EXPECT_EQ(r.partitions[0].metrics.count("simulated_cross_tokens_per_s"), 0u);
}

TEST(Plan, TpAutoRanksLayoutsByPredictedTokens) {
  int differ = 0;
  for (unsigned seed = 1; seed <= 12; ++seed) {
    const RunRecord run = make_profile(2, 6, {2}, seed);
    for (int N : {2, 3, 4}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " N=" + std::to_string(N));
      const balance::LayoutRanking r = balance::rank_layouts_by_tokens(run, N);
      const auto bf = brute_force(run, N, /*every_layout=*/true);
      const PlanCandidate* best = nullptr;
      const PlanCandidate* low = nullptr;
      size_t at_m = 0;
      for (const auto& [label, c] : bf) {
        if (c.groups != run.workload.microbatches) continue;
        ++at_m;
        const double tol = 1e-9 * c.tokens_per_s;
        if (!best || c.tokens_per_s > best->tokens_per_s + tol ||
            (c.tokens_per_s >= best->tokens_per_s - tol &&
             (c.widths.size() < best->widths.size() ||
              (c.widths.size() == best->widths.size() && c.split.bottleneck_ms < best->split.bottleneck_ms))))
          best = &c;
        if (!low || c.split.bottleneck_ms < low->split.bottleneck_ms - 1e-9 * low->split.bottleneck_ms) low = &c;
      }
      ASSERT_NE(best, nullptr);
      EXPECT_EQ(r.evaluated, at_m);
      EXPECT_EQ(r.best.widths, best->widths);
      EXPECT_NEAR(r.best.tokens_per_s, best->tokens_per_s, 1e-9 * best->tokens_per_s);
      EXPECT_NEAR(r.min_bottleneck.split.bottleneck_ms, low->split.bottleneck_ms, 1e-9 * low->split.bottleneck_ms);
      EXPECT_GE(r.best.tokens_per_s, r.min_bottleneck.tokens_per_s * (1 - 1e-12));
      if (r.best.widths != r.min_bottleneck.widths) ++differ;
    }
  }
  std::printf("the most tokens/s and the smallest bottleneck chose different layouts in %d of 36 cases\n", differ);
  EXPECT_GT(differ, 0);
}

TEST(Plan, EveryLayoutMatchesBruteForceWithTheContentionModel) {
  const RunRecord run = make_profile(2, 5, {2}, 11, /*two_pass=*/true);
  for (int N : {2, 3, 4})
    for (bool prune : {false, true}) expect_matches_brute_force(run, N, 256, 5.0, prune);
}

TEST(Plan, MemoryBindsAsGroupsGrow) {
  // 1000 B weights per layer, 400 B of KV per layer at M=2 (200 per group); 3000 B for the head.
  // 4500 B per device: a stage holds the head and one layer only at small M.
  const RunRecord run = make_profile(2, 6, {2}, 5, false, 4500);
  for (int N : {2, 3, 4}) expect_matches_brute_force(run, N, 256, 1e9);
  balance::PlanRequest req;
  req.devices = 3;
  const auto r = balance::plan_layouts(run, req);
  EXPECT_GT(r.infeasible, 0u);
}

TEST(Plan, BottleneckModeMatchesBruteForce) {
  for (unsigned seed : {4u, 6u}) {
    const RunRecord run = make_profile(4, 7, {2, 4}, seed);
    for (int N : {3, 4, 6})
      for (bool prune : {false, true}) expect_matches_brute_force(run, N, 0, 8.0, prune);
  }
}

TEST(Plan, FrontIsTheNonDominatedSet) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> coarse(1, 6);  // many ties
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<PlanCandidate> c(40);
    for (auto& x : c) {
      x.tokens_per_s_per_device = coarse(rng);
      x.tokens_per_s_per_user = coarse(rng);
    }
    const auto f = balance::pareto_front(c);
    EXPECT_EQ(std::set<size_t>(f.begin(), f.end()), dominance_front(c));
    for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(c[f[i - 1]].tokens_per_s_per_user, c[f[i]].tokens_per_s_per_user);
  }
}

TEST(Plan, ClosestWhenNoneMeetsTheTargets) {
  std::vector<PlanCandidate> c(3);
  c[0].ttft_p50_ms = 10, c[0].tpot_p50_ms = 4, c[0].tokens_per_s = 5;
  c[1].ttft_p50_ms = 30, c[1].tpot_p50_ms = 2, c[1].tokens_per_s = 9;
  c[2].ttft_p50_ms = 12, c[2].tpot_p50_ms = 3, c[2].tokens_per_s = 7;
  const auto ch = balance::best_under_slo(c, 10, 2);  // 0: x2 (TPOT), 1: x3 (TTFT), 2: x1.5
  EXPECT_FALSE(ch.best.has_value());
  EXPECT_EQ(ch.closest, 2u);
  EXPECT_DOUBLE_EQ(ch.relax, 1.5);
  EXPECT_EQ(*balance::best_under_slo(c, 0, 0).best, 1u);
  EXPECT_EQ(*balance::best_under_slo(c, 12, 0).best, 2u);
}

// ---- the command --------------------------------------------------------------------------

// ---- --scenario: the layouts ranked by the highest request rate (issue 38) -------------------

/// Whether one replica of candidate c of `plan` passes `slo` at `rate`: its own serving
/// simulation, built directly (plan_record of its N / R devices at its M, ProfileStepCosts of its
/// split), not through the ranking.
bool passes_at(const RunRecord& run, const balance::PlanResult& plan, const PlanCandidate& c,
               const std::vector<serving::Request>& unit, const serving::SloTarget& slo, double rate) {
  const RunRecord rec = balance::plan_record(run, plan.devices / c.replicas, c.groups);
  const balance::Predictor pred(rec);
  const balance::ProfileStepCosts costs(rec, pred, c.split);
  serving::PipelineSimConfig cfg;
  cfg.scheduler = {c.groups, c.batch, serving::StepPolicy::mixed};
  return serving::judge_requests(serving::simulate_serving(serving::scale_arrivals(unit, rate), costs, cfg).times, slo).pass;
}

TEST(PlanServing, EveryLayoutIsSearchedAndRankedByItsHighestRate) {
  const RunRecord run = make_profile(2, 8, {2}, 5);
  balance::PlanRequest req;
  req.devices = 4;
  req.prune = false;
  req.replicas = 0;  // R = 1, 2, 4: a replica's rate searched, R times it the layout's
  const balance::PlanResult plan = balance::plan_layouts(run, req);
  serving::ScenarioSpec spec;
  spec.arrivals = {1.0, 1.0, true};
  spec.requests = 64;
  spec.prompt_lens = serving::parse_length_spec("uniform:2,8", "--prompt-lens");
  spec.gen_lens = serving::parse_length_spec("uniform:2,6", "--gen-lens");
  spec.max_prompt_len = spec.max_gen_len = 64;
  spec.seed = 9;
  const auto unit = serving::generate_requests(spec);
  spec.slots = 2;
  spec.goodput.ttft_ms = 150;
  spec.goodput.tpot_ms = 40;
  spec.attainment = 0.9;
  const serving::SloTarget slo = spec.slo();
  const auto ranked = balance::rank_by_serving_rate(run, plan, unit, spec);
  ASSERT_EQ(ranked.size(), plan.candidates.size());
  std::set<size_t> seen;
  int found = 0, found_replicated = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const auto& e = ranked[i];
    const PlanCandidate& c = plan.candidates[e.candidate];
    SCOPED_TRACE(c.label);
    seen.insert(e.candidate);
    if (i > 0 && ranked[i - 1].search.outcome == e.search.outcome)
      EXPECT_GE(ranked[i - 1].max_rate, e.max_rate * (1 - 1e-9));  // by rate, descending
    if (e.search.outcome != serving::RateSearchResult::Outcome::found) continue;
    ++found;
    found_replicated += c.replicas > 1;
    // The claim checked on the candidate's own simulation (one replica at rate / R): a pass at
    // the rate, a failure within 1% above it.
    EXPECT_DOUBLE_EQ(e.max_rate, c.replicas * e.search.rate);
    EXPECT_TRUE(passes_at(run, plan, c, unit, slo, e.max_rate / c.replicas));
    EXPECT_FALSE(passes_at(run, plan, c, unit, slo, e.search.failing_rate));
    EXPECT_LE(e.search.failing_rate, 1.01 * e.search.rate * (1 + 1e-12));
    EXPECT_DOUBLE_EQ(e.max_rate_per_device, e.max_rate / 4);
  }
  EXPECT_EQ(seen.size(), plan.candidates.size());
  EXPECT_GT(found, 0);
  EXPECT_GT(found_replicated, 0);
  // The SLO binds (a queue of 64 requests breaks the TTFT limit) and a request alone meets it.
  EXPECT_EQ(ranked.front().search.outcome, serving::RateSearchResult::Outcome::found);
}

class PlanCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ppb_plan_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    file_ = (dir_ / "profile.h5").string();
    write_results(file_, make_profile(2, 6, {2}, 1));
  }
  void TearDown() override { fs::remove_all(dir_); }
  PlanOptions opts(int devices) {
    PlanOptions o;
    o.input = file_;
    o.devices = devices;
    return o;
  }
  fs::path dir_;
  std::string file_;
};

using test::error_of;

TEST_F(PlanCommandTest, BadInputsNameTheFlag) {
  PlanOptions o = opts(0);
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--devices"), std::string::npos);
  o = opts(1000);  // 6 units x width 2
  o.replicas = "1";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--devices 1000: one pipeline uses at most 12"), std::string::npos);
  o.replicas = "x";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--replicas 'x'"), std::string::npos);
  o.replicas = "0";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--replicas '0'"), std::string::npos);
  o.replicas = "3";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--replicas 3 does not divide --devices 1000"), std::string::npos);
  o.replicas = "auto";  // 1000 devices as 100 replicas of 10 .. 1000 of 1
  testing::internal::CaptureStdout();
  EXPECT_EQ(plan_command(o), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("replicas 100,125,200,250,500,1000;"), std::string::npos);
  o = opts(2);
  o.batch = "2,8";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--batch 8: "), std::string::npos);
  o.batch = "x";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--batch 'x'"), std::string::npos);
  o.batch = "2";
  o.scenario.slo_tpot_ms = -1;
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--slo-ttft and --slo-tpot"), std::string::npos);
  o.scenario.slo_tpot_ms = 0;
  o.top = -2;
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--top"), std::string::npos);
  o.top = 0;
  o.json_out = file_;
  EXPECT_NE(error_of([&] { plan_command(o); }).find("input"), std::string::npos);
  o.json_out = (dir_ / "out.json").string();
  std::ofstream(o.json_out) << "{}";
  EXPECT_THROW(plan_command(o), UserError);  // exists, no --force
  o.force = true;
  EXPECT_EQ(plan_command(o), 0);
  const auto j = nlohmann::json::parse(std::ifstream(o.json_out));
  EXPECT_EQ(j["devices"], 2);
  EXPECT_FALSE(j["front"].empty());
  EXPECT_FALSE(j["one_more_device"].is_null());
  o = opts(2);
  o.input = (dir_ / "x.json").string();
  std::ofstream(o.input) << "{}";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("results file"), std::string::npos);
}

TEST_F(PlanCommandTest, ScenarioRanksLayoutsByRate) {
  PlanOptions o = opts(2);
  o.scenario.requests = 64;  // a scenario's flag without --scenario
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--requests describes requests that arrive"), std::string::npos);
  o.scenario.scenario = "poisson";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--slo-ttft MS --slo-tpot MS"), std::string::npos);
  o.scenario.slo_ttft_ms = 150;
  o.scenario.slo_tpot_ms = 40;
  o.scenario.attainment = 0;
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--attainment"), std::string::npos);
  o.scenario.attainment = 0.9;
  o.scenario.scenario = "trace";  // run's alone
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--scenario 'trace' is unknown for plan"), std::string::npos);
  o.scenario.scenario = "poisson";
  o.scenario.step_policy = "chunked";
  EXPECT_NE(error_of([&] { plan_command(o); }).find("--step-policy 'chunked'"), std::string::npos);
  o.scenario.step_policy = "mixed";
  o.json_out = (dir_ / "scenario.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(plan_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("layouts by the highest request rate"), std::string::npos) << out;
  EXPECT_NE(out.find("best: "), std::string::npos) << out;
  const auto j = nlohmann::json::parse(std::ifstream(o.json_out));
  ASSERT_FALSE(j["ranked"].empty());
  for (size_t i = 1; i < j["ranked"].size(); ++i)
    if (j["ranked"][i]["outcome"] == "found" && j["ranked"][i - 1]["outcome"] == "found")
      EXPECT_GE(j["ranked"][i - 1]["max_rate_req_per_s"].get<double>(), j["ranked"][i]["max_rate_req_per_s"].get<double>());
}

TEST_F(PlanCommandTest, PrintsTheFrontAndTheChoice) {
  PlanOptions o = opts(2);
  o.scenario.slo_tpot_ms = 1e-6;  // nobody meets it
  testing::internal::CaptureStdout();
  EXPECT_EQ(plan_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("Pareto front"), std::string::npos) << out;
  EXPECT_NE(out.find("no layout meets TPOT p50"), std::string::npos) << out;
  EXPECT_NE(out.find("one more device (3)"), std::string::npos) << out;
  o.scenario.slo_tpot_ms = 0;
  o.csv = true;
  testing::internal::CaptureStdout();
  EXPECT_EQ(plan_command(o), 0);
  const std::string csv = testing::internal::GetCapturedStdout();
  EXPECT_EQ(csv.rfind("layout,stages,tp_widths,groups", 0), 0u) << csv;
  EXPECT_NE(csv.find("TP2 M1,1,2,1,2,6,"), std::string::npos) << csv;
  std::istringstream lines(csv);
  for (std::string line; std::getline(lines, line);)  // 15 fields on every row: no comma inside a field
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 14) << line;
  EXPECT_NE(csv.find("DP2 PP1 M1,1,1,"), std::string::npos) << csv;  // --replicas auto: 2 x one device
}

// ---- 64 devices, 128 units ----------------------------------------------------------------

/// A GPU-like profile: 8 ranks on one machine (one pass), widths 2, 4, 8; 128 units.
TEST_F(PlanCommandTest, SixtyFourDevicesAndAHundredTwentyEightUnits) {
  RunRecord run = make_profile(8, 128, {2, 4, 8}, 17);
  run.workload.gen_len = 8;
  const std::string path = (dir_ / "synthetic.h5").string();
  write_results(path, run);
  // PPB_PLAN_SYNTHETIC_OUT=FILE keeps a copy, to time `ppbench plan FILE --devices 64` by hand.
  if (const char* keep = std::getenv("PPB_PLAN_SYNTHETIC_OUT")) fs::copy_file(path, keep, fs::copy_options::overwrite_existing);
  PlanOptions o = opts(64);
  o.input = path;
  o.json_out = (dir_ / "p64.json").string();
  const auto t0 = std::chrono::steady_clock::now();
  testing::internal::CaptureStdout();
  EXPECT_EQ(plan_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto j = nlohmann::json::parse(std::ifstream(o.json_out));
  std::printf("plan --devices 64, 128 units: %zu candidates simulated, %s pruned, front %zu (%s, %s layouts solved "
              "of %s), search %.2f s, whole command (with the 65-device search) %.2f s\n%s",
              j["candidates"].size(), j["candidates_pruned"].dump().c_str(), j["front"].size(), j["mode"].get<std::string>().c_str(), j["layouts_evaluated"].dump().c_str(),
              j["layouts_possible"].dump().c_str(), j["search_seconds"].get<double>(), s, out.c_str());
  // PPB_PLAN_FULL=1: the same front and best as simulating all 4,104 candidates (~30 s here).
  if (std::getenv("PPB_PLAN_FULL")) {
    balance::PlanRequest req;
    req.devices = 64;
    const auto pruned = balance::plan_layouts(run, req);
    req.prune = false;
    const auto full = balance::plan_layouts(run, req);
    std::set<std::string> a, b;
    for (size_t i : pruned.front) a.insert(pruned.candidates[i].label);
    for (size_t i : full.front) b.insert(full.candidates[i].label);
    EXPECT_EQ(a, b);
    EXPECT_EQ(pruned.candidates[*balance::best_under_slo(pruned.candidates, 0, 0).best].label,
              full.candidates[*balance::best_under_slo(full.candidates, 0, 0).best].label);
    std::printf("PPB_PLAN_FULL: %zu candidates simulated without pruning, fronts of %zu and %zu points\n",
                full.candidates.size(), a.size(), b.size());
  }
  // Issue 36 asks under 10 s: printed above, not asserted (a timed test fails on a loaded or
  // sanitized build; 1.2-1.3 s on this project's 2-core VM, DESIGN.md). What is asserted is that
  // the search at this size ends with a front and a choice.
  EXPECT_GT(j["front"].size(), 0u);
}

}  // namespace
}  // namespace ppb
