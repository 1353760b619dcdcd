// The serving simulator and the rate search (issue 38, offline part): the event-driven simulator
// on hand-made cases with exact times (one and two stages, queueing when slots are full), the
// profile's step-time model against hand-computed values, MLPerf's rule against LoadGen's
// numbers, the bisection against a brute-force scan of the simulator, `ppbench serve-search`'s
// bad inputs (UserError: exit status 2, naming the flag) and its output, and the time of a
// 70B-class search on 8 devices.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/offline_commands.h"
#include "balance/contention.h"
#include "balance/layout.h"
#include "balance/partition.h"
#include "balance/plan.h"
#include "balance/predict.h"
#include "balance/problem.h"
#include "balance/serving_calibration.h"
#include "balance/serving_step_model.h"
#include "results/profile_step_fit.h"
#include "balance/simulator.h"
#include "common/error.h"
#include "common/events.h"
#include "results/reader.h"
#include "results/writer.h"
#include "serving/arrivals.h"
#include "serving/scenario.h"
#include "serving/pipeline_sim.h"
#include "serving/rate_search.h"
#include "serving/simulated_rate.h"
#include "synthetic_run.h"
#include "tiny_profile.h"
#include "user_error_of.h"

namespace ppb {
namespace {

namespace fs = std::filesystem;
using serving::Request;
using serving::RequestTimes;
using serving::StepShape;
using test::error_of;
using ppb_test::tiny_profile;

/// Fixed step costs: stage k computes pre_ms[k] per prefill token plus dec_ms[k] when the step
/// has decode rows; every transfer of stage k takes xfer_ms[k].
class FixedCosts final : public serving::StepCostModel {
 public:
  FixedCosts(std::vector<double> pre, std::vector<double> dec, std::vector<double> xfer)
      : pre_(std::move(pre)), dec_(std::move(dec)), xfer_(std::move(xfer)) {}
  int stages() const override { return static_cast<int>(pre_.size()); }
  double compute_ms(int k, const StepShape& s) const override {
    return pre_[k] * static_cast<double>(s.prefill_tokens) + (s.decode_rows > 0 ? dec_[k] : 0.0);
  }
  double transfer_ms(int k, const StepShape&) const override { return xfer_[k]; }

 private:
  std::vector<double> pre_, dec_, xfer_;
};

Request req(double arrival_s, int prompt, int gen) {
  Request r;
  r.arrival_s = arrival_s;
  r.prompt_len = prompt;
  r.gen_len = gen;
  return r;
}

void expect_tokens(const RequestTimes& t, const std::vector<double>& ms, double admitted_ms) {
  ASSERT_EQ(t.token_s.size(), ms.size());
  for (std::size_t i = 0; i < ms.size(); ++i) EXPECT_NEAR(t.token_s[i], ms[i] * 1e-3, 1e-12) << "token " << i;
  EXPECT_NEAR(t.admitted_s, admitted_ms * 1e-3, 1e-12);
  EXPECT_DOUBLE_EQ(t.first_token_s, t.token_s.front());
  EXPECT_DOUBLE_EQ(t.finish_s, t.token_s.back());
}

// ---- the simulator on hand-made cases -------------------------------------------------------

// One stage, one group of 2 slots: 1 ms per prefill token, 5 ms per decode step.
//  t=0: r0 alone (r1 arrives at 2 ms): prefill 4 tokens, 4 ms -> r0's token 1 at 4 ms.
//  t=4: r1 admitted (queue 2 ms); r0 decodes + r1 prefills 2 tokens: 2 + 5 = 7 ms -> 11 ms.
//  t=11: both decode: 5 ms -> 16 ms, both finish.
TEST(ServingSim, OneStageMixedStepsHaveExactTimes) {
  const FixedCosts costs({1.0}, {5.0}, {0.0});
  serving::PipelineSimConfig cfg;
  cfg.scheduler.groups = 1;
  cfg.scheduler.slots = 2;
  const auto r = serving::simulate_serving({req(0.0, 4, 3), req(0.002, 2, 2)}, costs, cfg);
  expect_tokens(r.times[0], {4, 11, 16}, 0);
  expect_tokens(r.times[1], {11, 16}, 4);
  EXPECT_EQ(r.steps, 3);
  EXPECT_NEAR(r.stage_busy_s[0], 0.016, 1e-12);
  EXPECT_NEAR(r.end_s, 0.016, 1e-12);
  const auto l1 = serving::request_latency(r.times[1]);
  EXPECT_NEAR(l1.ttft_s, 0.009, 1e-12);   // 11 - 2 ms
  EXPECT_NEAR(l1.queue_s, 0.002, 1e-12);  // admitted at 4 ms
  EXPECT_NEAR(l1.tpot_s, 0.005, 1e-12);
}

// The client's --max-concurrency 1 (vLLM's semaphore): three requests at t = 0 through one
// stage, one group of 4 slots, 1 ms per prefill token, 1 ms per decode step, prompts of 1, two
// output tokens: r0 sent at 0 (tokens at 1, 2 ms), r1 sent when r0 finished (2 ms: tokens 3, 4),
// r2 at 4 ms (5, 6). TTFT counts from the send: 1 ms each. Without the limit all three share the
// steps: a prefill of 3 tokens (3 ms), a decode: tokens at 3 and 4 ms.
TEST(ServingSim, MaxConcurrencySendsARequestWhenAnotherFinishes) {
  const FixedCosts costs({1.0}, {1.0}, {0.0});
  serving::PipelineSimConfig cfg;
  cfg.scheduler.groups = 1;
  cfg.scheduler.slots = 4;
  const std::vector<Request> three{req(0.0, 1, 2), req(0.0, 1, 2), req(0.0, 1, 2)};
  const auto open = serving::simulate_serving(three, costs, cfg);
  for (const auto& t : open.times) expect_tokens(t, {3, 4}, 0);
  cfg.scheduler.max_concurrency = 1;
  const auto limited = serving::simulate_serving(three, costs, cfg);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    expect_tokens(limited.times[i], {1.0 + 2 * i, 2.0 + 2 * i}, 2.0 * i);
    EXPECT_NEAR(limited.times[i].arrival_s, 0.002 * i, 1e-12);  // sent
    EXPECT_NEAR(serving::request_latency(limited.times[i]).ttft_s, 0.001, 1e-12);
  }
  // A limit of 2: r0 and r1 share a 2-token prefill (tokens at 2, 3 ms); r2 sent when they finish
  // (3 ms), then prefilled alone: tokens at 4, 5 ms.
  cfg.scheduler.max_concurrency = 2;
  const auto two = serving::simulate_serving(three, costs, cfg);
  expect_tokens(two.times[0], {2, 3}, 0);
  expect_tokens(two.times[1], {2, 3}, 0);
  expect_tokens(two.times[2], {4, 5}, 3);
  EXPECT_NEAR(two.times[2].arrival_s, 0.003, 1e-12);
}

// The batch queue (vLLM V1's PP) against pinned groups, one stage, M = 2 of B = 1, 1 ms per
// prefill token, 2 ms per decode step, two requests of prompt 1 and 3 outputs at t = 0:
//  groups: g0 runs r0, g1 r1, taking turns on the stage: r0 at 1, 4, 8; r1 at 2, 6, 10 ms.
//  batch queue: batch 0 takes both (the pool's 2 slots): a 2-token prefill (2 ms), then both
//  decode in each step batch 0 forms when they are back (batch 1 finds none not in flight):
//  2, 4, 6 ms for both.
// And with --max-concurrency 1 on groups: r0 alone, 1, 3, 5 ms; r1 is sent when r0 finishes
// (5 ms) and g0, back first, admits it: 6, 8, 10 ms (g1, offered a step then too, finds none).
TEST(ServingSim, BatchQueueTakesEveryRequestNotInFlight) {
  const FixedCosts costs({1.0}, {2.0}, {0.0});
  serving::PipelineSimConfig cfg;
  cfg.scheduler.groups = 2;
  cfg.scheduler.slots = 1;
  const std::vector<Request> two{req(0.0, 1, 3), req(0.0, 1, 3)};
  const auto groups = serving::simulate_serving(two, costs, cfg);
  expect_tokens(groups.times[0], {1, 4, 8}, 0);
  expect_tokens(groups.times[1], {2, 6, 10}, 0);
  cfg.scheduler.pp_schedule = serving::PpSchedule::batch_queue;
  const auto queue = serving::simulate_serving(two, costs, cfg);
  expect_tokens(queue.times[0], {2, 4, 6}, 0);
  expect_tokens(queue.times[1], {2, 4, 6}, 0);
  EXPECT_EQ(queue.steps, 3);
  // A third request at t = 0 and outputs of 2: batch 1 finds the pool's slots held by batch 0's
  // step in flight and waits for its return (not for an arrival, which is past): r0, r1 at 2, 4;
  // r2 admitted when they leave (4 ms), prefilled 4-5, decoded 5-7.
  const auto three = serving::simulate_serving({req(0.0, 1, 2), req(0.0, 1, 2), req(0.0, 1, 2)}, costs, cfg);
  expect_tokens(three.times[0], {2, 4}, 0);
  expect_tokens(three.times[1], {2, 4}, 0);
  expect_tokens(three.times[2], {5, 7}, 4);
  cfg.scheduler.pp_schedule = serving::PpSchedule::groups;
  cfg.scheduler.max_concurrency = 1;
  const auto limited = serving::simulate_serving(two, costs, cfg);
  expect_tokens(limited.times[0], {1, 3, 5}, 0);
  expect_tokens(limited.times[1], {6, 8, 10}, 5);
}

// Two stages, M = 2 groups of 1 slot, three requests at t = 0: the third waits for a free slot.
// Stage 0: 1 ms per prefill token, 2 ms per decode; stage 1: 2 ms per token, 3 ms per decode;
// link 0 takes 0.5 ms, the token return 0.25 ms. Each resource serves FIFO, one at a time:
//  g0 (r0, 2 tokens): c0 0-2, link 2-2.5, c1 2.5-6.5 -> token; return 6.5-6.75.
//  g1 (r1, 1 token):  c0 2-3 (waits for g0), link 3-3.5, c1 6.5-8.5 (waits) -> token; return -8.75.
//  g0 decode: c0 6.75-8.75, link 8.75-9.25, c1 9.25-12.25 -> r0 done; return -12.5.
//  g1 decode: c0 8.75-10.75, link -11.25, c1 12.25-15.25 (waits) -> r1 done.
//  g0 admits r2 at 12.5 (queue 12.5 ms): c0 12.5-13.5, link -14, c1 15.25-17.25 (waits).
TEST(ServingSim, TwoStagesQueueWhenSlotsAreFull) {
  const FixedCosts costs({1.0, 2.0}, {2.0, 3.0}, {0.5, 0.25});
  serving::PipelineSimConfig cfg;
  cfg.scheduler.groups = 2;
  cfg.scheduler.slots = 1;
  const auto r = serving::simulate_serving({req(0, 2, 2), req(0, 1, 2), req(0, 1, 1)}, costs, cfg);
  expect_tokens(r.times[0], {6.5, 12.25}, 0);
  expect_tokens(r.times[1], {8.5, 15.25}, 0);
  expect_tokens(r.times[2], {17.25}, 12.5);
  EXPECT_EQ(r.steps, 5);
  EXPECT_NEAR(r.stage_busy_s[0], 0.008, 1e-12);  // 2 + 1 + 2 + 2 + 1 ms
  EXPECT_NEAR(r.stage_busy_s[1], 0.014, 1e-12);  // 4 + 2 + 3 + 3 + 2 ms
  const auto m = serving::serving_metrics(r.times, {});
  EXPECT_NEAR(m.ttft.p50_ms, 8.5, 1e-9);
  EXPECT_NEAR(m.queue.mean_ms, 12.5 / 3, 1e-9);
}

// --no-overlap: a stage's send holds its compute lane, and the tokens are out before the return.
// One request (prompt 1, two tokens) on the costs above: c0 + send 0-1.5, c1 1.5-3.5 (token),
// return -3.75; decode c0 + send 3.75-6.25, c1 6.25-9.25 (token).
TEST(ServingSim, WithoutOverlapTheSendHoldsTheComputeLane) {
  const FixedCosts costs({1.0, 2.0}, {2.0, 3.0}, {0.5, 0.25});
  serving::PipelineSimConfig cfg;
  cfg.overlap = false;
  const auto r = serving::simulate_serving({req(0, 1, 2)}, costs, cfg);
  expect_tokens(r.times[0], {3.5, 9.25}, 0);
  EXPECT_NEAR(r.stage_busy_s[0], 0.0015 + 0.0025, 1e-12);
  EXPECT_NEAR(r.stage_busy_s[1], 0.00225 + 0.00325, 1e-12);
}

// An idle group waits for the next arrival; a later arrival goes to the group whose step forms
// first. One stage, 2 groups of 1 slot, 10 ms per prefill token.
TEST(ServingSim, IdleGroupsWakeAtTheNextArrival) {
  const FixedCosts costs({10.0}, {1.0}, {0.0});
  serving::PipelineSimConfig cfg;
  cfg.scheduler.groups = 2;
  const auto r = serving::simulate_serving({req(0.1, 1, 1), req(0.105, 1, 1)}, costs, cfg);
  expect_tokens(r.times[0], {110}, 100);  // g0 wakes at 100 ms
  expect_tokens(r.times[1], {120}, 105);  // g1 wakes at 105 ms, waits for the stage until 110
}

/// FixedCosts whose transfers differ between prefill and decode steps (the closed simulator's
/// send_prefill_ms / send_decode_ms).
class PhaseCosts final : public serving::StepCostModel {
 public:
  std::vector<double> pre, dec, send_pre, send_dec;
  int stages() const override { return static_cast<int>(pre.size()); }
  double compute_ms(int k, const StepShape& s) const override {
    return pre[k] * static_cast<double>(s.prefill_tokens) + (s.decode_rows > 0 ? dec[k] : 0.0);
  }
  double transfer_ms(int k, const StepShape& s) const override { return s.prefill_rows > 0 ? send_pre[k] : send_dec[k]; }
};

// Where both apply, the closed-batch simulator's timeline (balance/simulator.h with eager sends:
// this simulator's transfers do not wait for the receiver): M groups of B requests of P prompt
// tokens all at t = 0, G + 1 tokens each (the prefill's and G decodes), constant step costs.
// Every token of every request is out at the closed simulator's last-stage compute end of that
// group and step, on 200 random cases of 1..4 stages and 1..5 groups. (With rendezvous sends,
// the run's pipeline, the closed simulator differs where a sender waits for a receiver: counted.)
TEST(ServingSim, AgreesWithTheClosedSimulatorWithEagerSends) {
  const int B = 2, P = 5, G = 4;
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> ms(0.01, 3.0);
  int rendezvous_differs = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int S = 1 + trial % 4, M = 1 + (trial / 4) % 5;
    PhaseCosts costs;
    std::vector<balance::SimStage> stages(S);
    for (int k = 0; k < S; ++k) {
      costs.pre.push_back(ms(rng));
      costs.dec.push_back(ms(rng));
      costs.send_pre.push_back(S > 1 ? ms(rng) : 0.0);
      costs.send_dec.push_back(S > 1 ? 0.3 * ms(rng) : 0.0);
      stages[k] = {costs.pre[k] * B * P, costs.dec[k], costs.send_pre[k], costs.send_dec[k]};
    }
    serving::PipelineSimConfig cfg;
    cfg.scheduler.groups = M;
    cfg.scheduler.slots = B;
    const auto r = serving::simulate_serving(std::vector<Request>(M * B, req(0.0, P, G + 1)), costs, cfg);
    for (bool eager : {true, false}) {
      balance::SimConfig closed_cfg;
      closed_cfg.groups = M;
      closed_cfg.gen_len = G;
      closed_cfg.batch = B;
      closed_cfg.eager_sends = eager;
      const balance::SimResult closed = balance::simulate_pipeline(stages, closed_cfg);
      double worst = 0.0;
      for (int i = 0; i < M * B; ++i) {
        const int g = i / B;  // FCFS: requests 0..B-1 fill group 0's slots, and so on
        ASSERT_EQ(r.times[i].token_s.size(), static_cast<std::size_t>(G + 1));
        for (int t = 0; t <= G; ++t)
          worst = std::max(worst, std::abs(r.times[i].token_s[t] -
                                           closed.events[closed.shape.index(0, g, t, S - 1, kComputeEnd)]));
      }
      if (eager) EXPECT_LT(worst, 1e-12) << "S=" << S << " M=" << M;
      else rendezvous_differs += worst > 1e-12 ? 1 : 0;
    }
  }
  std::printf("closed simulator with rendezvous sends: %d of 200 cases differ\n", rendezvous_differs);
}

/// PhaseCosts whose stages share machines (StageContention): compute_ms is the together time.
class ContendedCosts final : public serving::StepCostModel {
 public:
  PhaseCosts base;
  std::vector<serving::StageContention> stages_of;
  int stages() const override { return base.stages(); }
  double compute_ms(int k, const StepShape& s) const override { return base.compute_ms(k, s); }
  double transfer_ms(int k, const StepShape& s) const override { return base.transfer_ms(k, s); }
  std::vector<serving::StageContention> contention() const override { return stages_of; }
};

// The contention model in the serving simulator is balance/contention.h's: on a closed batch
// (M groups of B requests at t = 0, as above), stages on one machine with random alone shares
// in [0.6, 1) settle at the closed model's overlap f per stage and phase, on 100 random cases of
// 2..3 stages and 1..4 groups. Both iterate the same damped map from f = 1 and stop on different
// rules (f moved < kOverlapTolerance here; every step time < 1e-4 relative there), so where
// both settled their f agree within 2 kOverlapTolerance (the map halves a step each play).
TEST(ServingSim, ContentionSettlesWhereTheClosedModelDoes) {
  const int B = 2, P = 5, G = 6;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> ms(0.05, 3.0), share(0.6, 1.0);
  int compared = 0;
  for (int trial = 0; trial < 100; ++trial) {
    const int S = 2 + trial % 2, M = 1 + (trial / 2) % 4;
    ContendedCosts costs;
    std::vector<balance::SimStage> together(S), alone(S);
    for (int k = 0; k < S; ++k) {
      costs.base.pre.push_back(ms(rng));
      costs.base.dec.push_back(ms(rng));
      costs.base.send_pre.push_back(0.2 * ms(rng));
      costs.base.send_dec.push_back(0.05 * ms(rng));
      serving::StageContention c;
      c.alone_share = {share(rng), share(rng)};
      costs.stages_of.push_back(c);
      together[k] = {costs.base.pre[k] * B * P, costs.base.dec[k], costs.base.send_pre[k], costs.base.send_dec[k]};
      alone[k] = {together[k].prefill_ms * c.alone_share[0], together[k].decode_ms * c.alone_share[1],
                  together[k].send_prefill_ms, together[k].send_decode_ms};
    }
    serving::PipelineSimConfig cfg;
    cfg.scheduler.groups = M;
    cfg.scheduler.slots = B;
    const auto r = serving::simulate_serving(std::vector<Request>(M * B, req(0.0, P, G + 1)), costs, cfg);
    balance::SimConfig closed_cfg;
    closed_cfg.groups = M;
    closed_cfg.gen_len = G;
    closed_cfg.batch = B;
    closed_cfg.eager_sends = true;
    const balance::ContentionResult closed = balance::contended_step_times(alone, together, std::vector<int>(S, 0), closed_cfg);
    ASSERT_EQ(r.overlap.size(), static_cast<std::size_t>(S));
    EXPECT_GT(r.contention_plays, 1);
    if (!r.contention_converged || !closed.converged) continue;
    ++compared;
    for (int k = 0; k < S; ++k) {
      EXPECT_NEAR(r.overlap[k][0], closed.overlap_prefill[k], 2 * serving::kOverlapTolerance) << "trial " << trial << " stage " << k;
      EXPECT_NEAR(r.overlap[k][1], closed.overlap_decode[k], 2 * serving::kOverlapTolerance) << "trial " << trial << " stage " << k;
    }
  }
  std::printf("contention: %d of 100 cases settled in both models\n", compared);
  EXPECT_GE(compared, 90);
}

// One group in flight on two stages of one machine: the stages never compute at once, f falls
// to 0 and every step costs its alone time; on two machines, each stage alone on its own, too,
// in one play (the closed model's rule).
TEST(ServingSim, ContentionWithOneGroupInFlightGivesTheAloneTimes) {
  ContendedCosts costs;
  costs.base.pre = {0.5, 0.7};
  costs.base.dec = {4.0, 6.0};
  costs.base.send_pre = {0.3, 0.1};
  costs.base.send_dec = {0.2, 0.1};
  costs.stages_of.resize(2);
  costs.stages_of[0].alone_share = {0.9, 0.8};
  costs.stages_of[1].alone_share = {0.95, 0.75};
  // The alone times, no contention model: a step with prefill rows (a mixed one too) at the
  // prefill share, a decode-only step at the decode share.
  class AloneCosts final : public serving::StepCostModel {
   public:
    explicit AloneCosts(const ContendedCosts& c) : c_(c) {}
    int stages() const override { return c_.stages(); }
    double compute_ms(int k, const StepShape& s) const override {
      return c_.compute_ms(k, s) * c_.stages_of[k].alone_share[s.prefill_rows > 0 ? 0 : 1];
    }
    double transfer_ms(int k, const StepShape& s) const override { return c_.transfer_ms(k, s); }

   private:
    const ContendedCosts& c_;
  } alone(costs);
  serving::PipelineSimConfig cfg;
  cfg.scheduler.groups = 1;
  cfg.scheduler.slots = 2;
  const std::vector<Request> requests = {req(0.0, 4, 5), req(0.001, 3, 4), req(0.05, 6, 3)};
  const auto r = serving::simulate_serving(requests, costs, cfg);
  const auto want = serving::simulate_serving(requests, alone, cfg);
  // The together play sees no overlap; the second, at f = 0 (taken whole), sees none again.
  ASSERT_TRUE(r.contention_converged);
  EXPECT_EQ(r.contention_plays, 2);
  for (const auto& f : r.overlap) EXPECT_EQ(f, (std::array<double, 2>{0.0, 0.0}));
  ASSERT_EQ(r.times.size(), want.times.size());
  for (std::size_t i = 0; i < r.times.size(); ++i)
    for (std::size_t t = 0; t < r.times[i].token_s.size(); ++t)
      EXPECT_NEAR(r.times[i].token_s[t], want.times[i].token_s[t], 1e-12);  // a x ms vs ms x a: rounding only

  costs.stages_of[1].machine = 1;  // two machines: the alone times at once, one play
  const auto apart = serving::simulate_serving(requests, costs, cfg);
  EXPECT_EQ(apart.contention_plays, 1);
  for (const auto& f : apart.overlap) EXPECT_EQ(f, (std::array<double, 2>{0.0, 0.0}));
  for (std::size_t i = 0; i < apart.times.size(); ++i)
    for (std::size_t t = 0; t < apart.times[i].token_s.size(); ++t)
      EXPECT_NEAR(apart.times[i].token_s[t], want.times[i].token_s[t], 1e-12);
  costs.stages_of[0].alone_share = costs.stages_of[1].alone_share = {1.0, 1.0};  // one pass: no model, one plain play
  const auto plain = serving::simulate_serving(requests, costs, cfg);
  const auto base = serving::simulate_serving(requests, costs.base, cfg);
  EXPECT_EQ(plain.contention_plays, 0);
  EXPECT_TRUE(plain.overlap.empty());
  for (std::size_t i = 0; i < plain.times.size(); ++i) EXPECT_EQ(plain.times[i].token_s, base.times[i].token_s);

  costs.stages_of[1].alone_share = {0.0, 1.0};
  try {
    serving::simulate_serving(requests, costs, cfg);
    ADD_FAILURE() << "an alone share of 0 was played";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1's alone share is 0"), std::string::npos) << e.what();
  }
}

TEST(ServingSim, ScaledArrivalsEqualTheArrivalsDrawnAtThatRate) {
  serving::ScenarioSpec spec;
  spec.requests = 500;
  spec.prompt_lens = serving::parse_length_spec("uniform:1,50", "--prompt-lens");
  spec.gen_lens = serving::parse_length_spec("lognormal:20,0.5", "--gen-lens");
  spec.max_prompt_len = spec.max_gen_len = 100;
  spec.seed = 7;
  for (double k : {0.5, 1.0, 3.0}) {
    spec.arrivals = {1.0, k, true};
    const auto unit = serving::generate_requests(spec);
    spec.arrivals = {3.7, k, true};
    const auto direct = serving::generate_requests(spec);
    const auto scaled = serving::scale_arrivals(unit, 3.7);
    for (std::size_t i = 0; i < direct.size(); ++i) {
      EXPECT_NEAR(scaled[i].arrival_s, direct[i].arrival_s, 1e-12 * (1 + direct[i].arrival_s)) << i;
      EXPECT_EQ(scaled[i].prompt_len, direct[i].prompt_len);
      EXPECT_EQ(scaled[i].gen_len, direct[i].gen_len);
    }
  }
}

// ---- the step-time model on a tiny synthetic profile ----------------------------------------

StepShape shape(long long prefill_tokens, int decode_rows, double context) {
  StepShape s;
  s.prefill_tokens = prefill_tokens;
  s.prefill_rows = prefill_tokens > 0 ? 1 : 0;
  s.decode_rows = decode_rows;
  s.decode_context_mean = context;
  s.rows = s.prefill_rows + decode_rows;
  s.tokens = prefill_tokens + decode_rows;
  return s;
}

// Stage 0 = embed + layer.0 on rank 0: prefill 1 + 3 = 4 ms for B·P = 8 tokens; decode curve
// 0.1+1.0, 0.2+1.4, 0.3+2.4 = 1.1, 1.6, 2.7 ms at contexts 4, 8, 12. Stage 1 = head on rank 1:
// prefill 0.5 x 2 = 1 ms, decode 0.8 ms at every context.
TEST(ServingStepModel, MatchesHandComputedValues) {
  const RunRecord run = tiny_profile(2);
  const balance::Predictor pred(run);
  balance::Partition p = balance::parse_manual("2,1", 3, 2);
  const balance::ProfileStepCosts costs(run, pred, p);
  ASSERT_EQ(costs.stages(), 2);
  EXPECT_NEAR(costs.compute_ms(0, shape(8, 0, 0)), 4.0, 1e-12);           // the profiled prefill
  EXPECT_NEAR(costs.compute_ms(0, shape(12, 0, 0)), 6.0, 1e-12);          // 12 / 8 x 4
  EXPECT_NEAR(costs.compute_ms(0, shape(0, 2, 7)), 1.1 + 0.75 * 0.5, 1e-12);  // between 4 and 8
  EXPECT_NEAR(costs.compute_ms(0, shape(0, 1, 10)), 1.6 + 0.5 * 1.1, 1e-12);  // 1 row = 2 rows
  EXPECT_NEAR(costs.compute_ms(0, shape(12, 2, 7)), 6.0 + 1.475, 1e-12);  // mixed: the sum
  EXPECT_NEAR(costs.compute_ms(0, shape(0, 2, 2)), 1.1, 1e-12);           // clamped below
  EXPECT_NEAR(costs.compute_ms(0, shape(0, 2, 40)), 2.7, 1e-12);          // clamped above
  EXPECT_NEAR(costs.compute_ms(1, shape(4, 1, 9)), 0.5 + 0.8, 1e-12);
  EXPECT_THROW(costs.compute_ms(0, shape(0, 3, 8)), InternalError);  // more rows than B = 2
  // Transfers: 14 tokens x 64 x 4 bytes over 2 us + 5 GB/s; the return: 3 rows x 4 bytes.
  EXPECT_NEAR(costs.transfer_ms(0, shape(12, 2, 7)), 1e3 * (2e-6 + 14 * 64 * 4 / 5e9), 1e-15);
  EXPECT_NEAR(costs.transfer_ms(1, shape(12, 2, 7)), 1e3 * (2e-6 + 3 * 4 / 5e9), 1e-15);
}

// A tensor-parallel stage: its group's mean decode (over contexts) shaped by its first rank's
// width-1 curve: group decode sum 0.1 + 0.6 + 0.2 = 0.9 ms; rank 0's curve over the 3 units
// 1.5, 2.0, 3.1 (mean 2.2) -> 0.9 x 1.5 / 2.2 at context 4.
/// The profile of a group of ranks 0-1 at width 2 (per unit: prefill, decode), added to `run`.
void add_tp2_group(RunRecord& run) {
  ProfileTable::TpGroupProfile g;
  g.first_rank = 0;
  g.width = 2;
  g.latency_ms = {0.5, 0.1, 1.5, 0.6, 0.25, 0.2};
  g.latency_min_ms = g.latency_max_ms = g.latency_ms;
  run.profile.tp.push_back(g);
}

TEST(ServingStepModel, TensorParallelStageTakesTheGroupsMeanAndTheRanksShape) {
  RunRecord run = tiny_profile(2);
  add_tp2_group(run);
  const balance::Predictor pred(run);
  balance::Partition p = balance::parse_manual("3", 3, 1);
  p.tp_width = {2};
  const balance::ProfileStepCosts costs(run, pred, p);
  EXPECT_NEAR(costs.compute_ms(0, shape(8, 0, 0)), 2.25, 1e-12);
  EXPECT_NEAR(costs.compute_ms(0, shape(0, 2, 4)), 0.9 * 1.5 / 2.2, 1e-12);
  EXPECT_NEAR(costs.compute_ms(0, shape(0, 2, 12)), 0.9 * 3.1 / 2.2, 1e-12);
  EXPECT_EQ(costs.transfer_ms(0, shape(8, 0, 0)), 0.0);  // one stage: no transfer
}

// ---- the step-cost model's grid (issue 47) ---------------------------------------------------

/// Signature s on rank r, linear in tokens and keys (exact in the piecewise-linear model):
/// (1 + r) x (0.3 (s + 1) + 0.1 (s + 1) T + 1e-3 prefill keys + 2e-3 decode keys); the head
/// (s = 2) by rows: (1 + r) x (0.5 + 0.25 R).
double grid_unit_ms(int r, int s, const stepcost::StepWork& w) {
  if (s == 2) return (1 + r) * (0.5 + 0.25 * w.rows);
  return (1 + r) * (0.3 * (s + 1) + 0.1 * (s + 1) * w.tokens + 1e-3 * w.prefill_keys + 2e-3 * w.decode_keys);
}

/// tiny_profile(R) with the grid of its workload (B=2, P=4, G=9) timed as grid_unit_ms, and its
/// cycles' tables (latency_ms prefill, decode_context_ms) the same function's at their shapes (B
/// prompts of P; B rows at each context) times `decode_level` and `prefill_level`: the grid's
/// stepcost::Level against the cycles.
RunRecord tiny_profile_with_grid(int R, double decode_level = 1.0, double prefill_level = 1.0) {
  RunRecord run = tiny_profile(R);
  stepcost::GridSpec spec;
  spec.max_rows = 2, spec.max_tokens = 8, spec.max_context = 13, spec.contexts = {4, 8, 12};
  const std::vector<stepcost::GridStep> grid = stepcost::plan_grid(spec);
  const stepcost::FlatGrid f = stepcost::flatten(grid);
  auto& p = run.profile;
  p.step_rows = f.rows, p.step_pos = f.pos, p.step_tokens = f.tokens, p.step_role = f.role;
  p.step_by_rows = {0, 0, 1};
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < 3; ++s)
      for (const auto& g : grid) p.step_ms.push_back(grid_unit_ms(r, s, g.work()));
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < 3; ++u) {
      p.latency_ms[(r * 3 + u) * 2] = prefill_level * grid_unit_ms(r, u, stepcost::step_work({0, 0}, {4, 4}));
      for (int c = 0; c < 3; ++c)
        p.decode_context_ms[(r * 3 + u) * 3 + c] = decode_level * grid_unit_ms(r, u, stepcost::step_work({4 * (c + 1), 4 * (c + 1)}, {1, 1}));
    }
  return run;
}

/// A step of prompts (tokens at position 0) and decode rows at `pos`, as the scheduler forms it.
StepShape shape_of(const std::vector<int>& prompts, const std::vector<int>& decode_pos) {
  serving::Step st;
  int slot = 0;
  for (int t : prompts) st.rows.push_back({slot, slot, 0, t, true, true}), ++slot;
  for (int p : decode_pos) st.rows.push_back({slot, slot, p, 1, false, true}), ++slot;
  return serving::step_shape(st);
}

// A forward's fixed cost (stepcost::FixedCost): each unit's timings carry it once, a stage of n
// units pays it once. Rank 0's decode pairs give F = 0.2 ms (20% of a 1 ms one-unit forward, all
// of one sign: taken), its prefill pairs have both signs (not taken); rank 1's prefill F = -0.15
// (taken: a stage of two then costs 0.15 more than its units), its decode pairs are 0 (not taken).
void add_fixed_pairs(RunRecord& run) {
  ProfileTable& t = run.profile;
  t.fixed_unit = 1;
  const double F[2][2] = {{0.0, 0.2}, {-0.15, 0.0}};  // [rank][prefill, decode]
  for (int r = 0; r < 2; ++r)
    for (int ph = 0; ph < 2; ++ph)
      for (int i = 0; i < stepcost::kFixedCostSamples; ++i) {
        const double sign = r == 0 && ph == 0 ? (i % 2 ? 1.0 : -1.0) : 1.0;  // rank 0's prefill: +-0.05
        const double f = r == 0 && ph == 0 ? 0.05 * sign : F[r][ph];
        t.fixed_one_ms.push_back(1.0);
        t.fixed_two_ms.push_back(2.0 - f);
      }
}

TEST(ServingStepModel, AStageOfNUnitsPaysAForwardsFixedCostOnce) {
  const RunRecord plain = tiny_profile_with_grid(2);
  RunRecord run = plain;
  add_fixed_pairs(run);
  const std::vector<stepcost::FixedCost> f = step_fixed_costs(run.profile);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_FALSE(f[0].taken());
  EXPECT_TRUE(f[1].taken());
  EXPECT_NEAR(f[1].ms, 0.2, 1e-12);
  EXPECT_TRUE(f[2].taken());
  EXPECT_NEAR(f[2].ms, -0.15, 1e-12);
  EXPECT_FALSE(f[3].taken());
  const balance::Predictor pred(run), plain_pred(plain);
  const StepShape decode = shape_of({}, {4, 11}), prefill = shape_of({5}, {}), mixed = shape_of({3}, {7});
  {  // 2,1: stage 0 of two units on rank 0 (decode less 0.2), stage 1 of one unit (as its unit)
    const balance::Partition p = balance::parse_manual("2,1", 3, 2);
    const balance::ProfileStepCosts costs(run, pred, p), base(plain, plain_pred, p);
    EXPECT_NEAR(costs.compute_ms(0, decode), base.compute_ms(0, decode) - 0.2, 1e-9);
    EXPECT_NEAR(costs.compute_ms(0, prefill), base.compute_ms(0, prefill), 1e-9);
    EXPECT_NEAR(costs.compute_ms(0, mixed), base.compute_ms(0, mixed), 1e-9);  // a step with a prompt: prefill's
    for (const StepShape& sh : {decode, prefill, mixed}) EXPECT_NEAR(costs.compute_ms(1, sh), base.compute_ms(1, sh), 1e-9);
    // The closed predictions' sums (the cycles' tables) likewise.
    const auto [pre, dec] = pred.stage_sums(run.profile, p, 0);
    const auto [bpre, bdec] = plain_pred.stage_sums(plain.profile, p, 0);
    EXPECT_NEAR(pre, bpre, 1e-12);
    EXPECT_NEAR(dec, bdec - 0.2, 1e-12);
  }
  {  // 1,2: stage 1 of two units on rank 1 (prefill 0.15 more)
    const balance::Partition p = balance::parse_manual("1,2", 3, 2);
    const balance::ProfileStepCosts costs(run, pred, p), base(plain, plain_pred, p);
    EXPECT_NEAR(costs.compute_ms(1, prefill), base.compute_ms(1, prefill) + 0.15, 1e-9);
    EXPECT_NEAR(costs.compute_ms(1, mixed), base.compute_ms(1, mixed) + 0.15, 1e-9);
    EXPECT_NEAR(costs.compute_ms(1, decode), base.compute_ms(1, decode), 1e-9);
    EXPECT_NEAR(costs.compute_ms(0, prefill), base.compute_ms(0, prefill), 1e-9);  // one unit
    const auto [pre, dec] = pred.stage_sums(run.profile, p, 1);
    const auto [bpre, bdec] = plain_pred.stage_sums(plain.profile, p, 1);
    EXPECT_NEAR(pre, bpre + 0.15, 1e-12);
    EXPECT_NEAR(dec, bdec, 1e-12);
  }
  {  // Without the grid (the two-shape model): the decode curve and the prefill step alike
    RunRecord two_shape = tiny_profile(2), two_shape_plain = tiny_profile(2);
    add_fixed_pairs(two_shape);
    const balance::Predictor tp(two_shape), tpp(two_shape_plain);
    const balance::Partition p = balance::parse_manual("2,1", 3, 2), q = balance::parse_manual("1,2", 3, 2);
    const balance::ProfileStepCosts c(two_shape, tp, p), b(two_shape_plain, tpp, p);
    const balance::ProfileStepCosts cq(two_shape, tp, q), bq(two_shape_plain, tpp, q);
    ASSERT_FALSE(c.uses_step_model(0));
    for (double ctx : {4.0, 7.0, 12.0}) EXPECT_NEAR(c.compute_ms(0, shape(0, 2, ctx)), b.compute_ms(0, shape(0, 2, ctx)) - 0.2, 1e-12);
    EXPECT_NEAR(c.compute_ms(0, shape(8, 0, 0)), b.compute_ms(0, shape(8, 0, 0)), 1e-12);
    EXPECT_NEAR(cq.compute_ms(1, shape(8, 0, 0)), bq.compute_ms(1, shape(8, 0, 0)) + 0.15, 1e-12);
    EXPECT_NEAR(cq.compute_ms(1, shape(0, 1, 7)), bq.compute_ms(1, shape(0, 1, 7)), 1e-12);
  }
  // The planner's record of 4 devices like rank 0 carries rank 0's pairs to each.
  const std::vector<stepcost::FixedCost> four = step_fixed_costs(balance::plan_record(run, 4, 2).profile);
  ASSERT_EQ(four.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(four[i].applied_ms(), f[i % 2].applied_ms()) << i;
  // Pairs that are not [R][2][18] are named.
  run.profile.fixed_two_ms.pop_back();
  EXPECT_THROW(step_fixed_costs(run.profile), UserError);
}

// The balancer's problem charges the forward's fixed cost once per stage, as the predictions do:
// every split's stage times are Predictor::stage_sums' (objective_cost, with the transfers),
// the solved split the best of them, and the scenario's step mix charges it per step.
TEST(ServingStepModel, TheBalancerChargesAForwardsFixedCostOncePerStage) {
  const RunRecord plain = tiny_profile_with_grid(2);
  RunRecord run = plain;
  add_fixed_pairs(run);
  const int G = run.workload.gen_len;
  const balance::Objective o = balance::Objective::workload;
  const balance::BalanceProblem pf = balance::problem_from_run(run, o), p0 = balance::problem_from_run(plain, o);
  EXPECT_TRUE(p0.stage_fixed_ms.empty());
  ASSERT_EQ(pf.stage_fixed_ms.size(), 2u);
  EXPECT_NEAR(pf.stage_fixed_ms[0], G * 0.2, 1e-12);  // rank 0: its decode F, G times
  EXPECT_NEAR(pf.stage_fixed_ms[1], -0.15, 1e-12);    // rank 1: its prefill F
  for (int r = 0; r < 2; ++r)
    for (int u = 0; u < 3; ++u) EXPECT_NEAR(pf.cost[r][u], p0.cost[r][u] - pf.stage_fixed_ms[r], 1e-12) << r << "," << u;
  const balance::Predictor pred(run);
  double best = std::numeric_limits<double>::infinity();
  for (const std::vector<int>& order : {std::vector<int>{0, 1}, std::vector<int>{1, 0}})
    for (const char* split : {"1,2", "2,1"}) {
      balance::Partition p = balance::parse_manual(split, 3, 2);
      p.device_rank = order;
      balance::evaluate(pf, p);
      const std::vector<double> xfer = balance::stage_transfer_ms(pf, p);
      for (int k = 0; k < 2; ++k) {
        const auto [pre, dec] = pred.stage_sums(run.profile, p, k);
        EXPECT_NEAR(p.predicted_stage_ms[k], balance::with_transfers(balance::objective_cost(o, pre, dec, G), xfer[k], pf.overlap),
                    1e-9) << split << " order " << order[0] << " stage " << k;
      }
      best = std::min(best, p.bottleneck_ms);
    }
  EXPECT_NEAR(balance::solve_with_order(pf, 2, balance::OrderMode::automatic).bottleneck_ms, best, 1e-9);
  {  // one stage of all three units on rank 0 pays F once: its timings less 2·F
    balance::Partition one = balance::parse_manual("3", 3, 1);
    one.device_rank = {0};
    balance::evaluate(pf, one);
    double sum = 0;
    for (int u = 0; u < 3; ++u) sum += p0.cost[0][u];
    EXPECT_NEAR(one.predicted_stage_ms[0], sum - 2 * pf.stage_fixed_ms[0], 1e-9);
  }
  // The layout problem keeps it for width-1 stages.
  EXPECT_EQ(balance::layout_problem(run, o, {1, 1}).stage_fixed_ms, pf.stage_fixed_ms);
  // The scenario's step mix: scale x each step's F of its kind (the level is 1 here).
  const std::vector<StepShape> mix = {shape_of({5}, {}), shape_of({}, {4, 11}), shape_of({3}, {7})};
  const std::vector<double> f = balance::step_mix_costs(run, mix, 0.5).stage_fixed_ms;
  ASSERT_EQ(f.size(), 2u);
  EXPECT_NEAR(f[0], 0.5 * 0.2, 1e-9);           // one decode-only step
  EXPECT_NEAR(f[1], 0.5 * 2 * -0.15, 1e-9);     // two steps with a prompt
  EXPECT_TRUE(balance::step_mix_costs(plain, mix, 0.5).stage_fixed_ms.empty());
  // apply_stage_fixed caps F at the row's cheapest unit (every unit's cost less F stays >= 0).
  balance::BalanceProblem q;
  q.cost = {{1.0, 0.3, 2.0}, {1.0, 1.0, 1.0}};
  balance::apply_stage_fixed(q, {0.5, -0.25});
  EXPECT_EQ(q.stage_fixed_ms, (std::vector<double>{0.3, -0.25}));
  EXPECT_NEAR(q.cost[0][0], 0.7, 1e-12);
  EXPECT_EQ(q.cost[0][1], 0.0);
  EXPECT_NEAR(q.cost[1][2], 1.25, 1e-12);
  EXPECT_NO_THROW(balance::validate_problem(q));
}

TEST(ServingStepModel, StagesSumTheirUnitsStepModelsWhereTheProfileTimedAGrid) {
  const RunRecord run = tiny_profile_with_grid(2);
  const balance::Predictor pred(run);
  const balance::Partition p = balance::parse_manual("2,1", 3, 2);
  const balance::ProfileStepCosts costs(run, pred, p);
  ASSERT_TRUE(costs.uses_step_model(0) && costs.uses_step_model(1));
  for (const StepShape& sh : {shape_of({5}, {}), shape_of({3}, {7}), shape_of({}, {4, 11}), shape_of({1}, {}),
                              shape_of({12}, {})}) {
    const stepcost::StepWork w = balance::step_work_of(sh);
    EXPECT_EQ(w.tokens, static_cast<double>(sh.tokens));
    EXPECT_NEAR(costs.compute_ms(0, sh), grid_unit_ms(0, 0, w) + grid_unit_ms(0, 1, w), 1e-9);  // rank 0
    EXPECT_NEAR(costs.compute_ms(1, sh), grid_unit_ms(1, 2, w), 1e-9);                          // the head, rank 1
  }
  // A prompt of t at 0 attends t(t+1)/2 keys, a decode at p attends p + 1 (a 1-token prompt too).
  EXPECT_EQ(shape_of({3}, {7}).prefill_keys, 6.0);
  EXPECT_EQ(shape_of({3}, {7}).decode_keys, 8.0);
  EXPECT_EQ(shape_of({1}, {4, 11}).decode_keys, 1.0 + 5.0 + 12.0);
  EXPECT_EQ(shape_of({1}, {4, 11}).prefill_keys, 0.0);
  // The stored fit's held-out errors: 0 on a cost the model represents exactly.
  const stepcost::GridFit fit = fit_step_model(run.profile);
  EXPECT_EQ(fit.models.size(), 6u);
  EXPECT_LT(fit.abs_error_max, 1e-9);
  // The balancer's step-mix costs: scale x each unit's model summed over the shapes.
  const std::vector<StepShape> mix = {shape_of({5}, {}), shape_of({}, {4, 11})};
  const std::vector<double> cost = balance::step_mix_costs(run, mix, 0.5).unit_ms;
  ASSERT_EQ(cost.size(), 6u);
  EXPECT_TRUE(balance::step_mix_costs(run, {}, 0.5).unit_ms.empty());  // no steps (another objective): no mix, not zeros
  for (int r = 0; r < 2; ++r)
    for (int u = 0; u < 3; ++u) {
      double want = 0;
      for (const StepShape& sh : mix) want += 0.5 * grid_unit_ms(r, u, balance::step_work_of(sh));
      EXPECT_NEAR(cost[static_cast<std::size_t>(r * 3 + u)], want, 1e-9) << r << "," << u;
    }
  // The planner's record of 4 devices like rank 0 carries rank 0's grid to each: every stage of
  // a 4-stage split on it runs the step model, rank 0's (grid_unit_ms of r = 0).
  const RunRecord four = balance::plan_record(run, 4, 2);
  const balance::Predictor four_pred(four);
  const balance::ProfileStepCosts four_costs(four, four_pred, balance::parse_manual("1,1,1", 3, 3));
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(four_costs.uses_step_model(k)) << k;
    const StepShape sh = shape_of({5}, {9});
    EXPECT_NEAR(four_costs.compute_ms(k, sh), grid_unit_ms(0, k, balance::step_work_of(sh)), 1e-9) << k;
  }
  // A tensor-parallel stage whose group timed no grid (older files) keeps the two-shape model.
  RunRecord tp = tiny_profile_with_grid(2);
  add_tp2_group(tp);
  balance::Partition whole = balance::parse_manual("3", 3, 1);
  whole.tp_width = {2};
  {
    const balance::Predictor tp_pred(tp);
    const balance::ProfileStepCosts tp_costs(tp, tp_pred, whole);
    EXPECT_FALSE(tp_costs.uses_step_model(0));
    EXPECT_NEAR(tp_costs.compute_ms(0, shape(8, 0, 0)), 2.25, 1e-12);
  }
  // With its grid (the same steps on the group's shards, timed as grid_unit_ms at "r = -0.5":
  // half rank 0's), the stage is the sum of the group's three unit models, and a split whose
  // stage 0 is a width-1 rank keeps that rank's own fits beside it.
  const std::vector<stepcost::GridStep> grid = stepcost::unflatten(
      {tp.profile.step_rows, tp.profile.step_pos, tp.profile.step_tokens, tp.profile.step_role});
  for (int s = 0; s < 3; ++s)
    for (const auto& g : grid) tp.profile.tp[0].step_ms.push_back(grid_unit_ms(0, s, g.work()) / 2);
  // Its cycles at the group model's level (1: the grid's level is the cycles'; prefill of B=2
  // prompts of 4, decode the mean over the contexts 4, 8, 12).
  for (int u = 0; u < 3; ++u) {
    tp.profile.tp[0].latency_ms[2 * u] = grid_unit_ms(0, u, stepcost::step_work({0, 0}, {4, 4})) / 2;
    double dec = 0;
    for (int c : {4, 8, 12}) dec += grid_unit_ms(0, u, stepcost::step_work({c, c}, {1, 1})) / 2 / 3;
    tp.profile.tp[0].latency_ms[2 * u + 1] = dec;
  }
  const balance::Predictor tp_pred(tp);
  const balance::ProfileStepCosts tp_costs(tp, tp_pred, whole);
  ASSERT_TRUE(tp_costs.uses_step_model(0));
  EXPECT_LT(fit_step_model(tp.profile, tp.profile.tp[0]).abs_error_max, 1e-9);
  for (const StepShape& sh : {shape_of({5}, {}), shape_of({3}, {7}), shape_of({}, {4, 11}), shape_of({12}, {})}) {
    const stepcost::StepWork w = balance::step_work_of(sh);
    EXPECT_NEAR(tp_costs.compute_ms(0, sh), (grid_unit_ms(0, 0, w) + grid_unit_ms(0, 1, w) + grid_unit_ms(0, 2, w)) / 2, 1e-9);
  }
  {  // the group's own level: its cycles 1.44x its grid's decode and 0.64x its prefill scale the TP
     // stage by 1.2 and 0.8 (the ranks' levels stay 1)
    RunRecord lv = tp;
    for (int u = 0; u < 3; ++u) lv.profile.tp[0].latency_ms[2 * u] *= 0.64, lv.profile.tp[0].latency_ms[2 * u + 1] *= 1.44;
    const stepcost::Level gl = group_step_level(lv.profile, 2, 4, lv.profile.tp[0], fit_step_model(lv.profile, lv.profile.tp[0]).models);
    EXPECT_NEAR(gl.decode, 1.44, 1e-9);
    EXPECT_NEAR(gl.prefill, 0.64, 1e-9);
    const balance::Predictor lv_pred(lv);
    const balance::ProfileStepCosts lv_costs(lv, lv_pred, whole);
    EXPECT_NEAR(lv_costs.compute_ms(0, shape_of({}, {4, 11})), 1.2 * tp_costs.compute_ms(0, shape_of({}, {4, 11})), 1e-9);
    EXPECT_NEAR(lv_costs.compute_ms(0, shape_of({3}, {7})), 0.8 * tp_costs.compute_ms(0, shape_of({3}, {7})), 1e-9);
    balance::Partition pp = balance::parse_manual("2,1", 3, 2);  // width 1 on the same ranks: their level, 1
    const balance::ProfileStepCosts pp_costs(lv, lv_pred, pp), pp_base(tp, tp_pred, pp);
    EXPECT_NEAR(pp_costs.compute_ms(0, shape_of({}, {4, 11})), pp_base.compute_ms(0, shape_of({}, {4, 11})), 1e-12);
  }
  // Four devices like rank 0 with a group of two at width 2 (the planner's record carries the
  // group's grid): stages 0..1 width 1 on their ranks' fits, stage 2 the group's.
  const RunRecord four_tp = balance::plan_record(tp, 4, 2);
  const balance::Predictor ftp_pred(four_tp);
  balance::Partition mixed = balance::parse_manual("1,1,1", 3, 3);
  mixed.tp_width = {1, 1, 2};
  mixed.device_rank = {0, 1, 2};
  const balance::ProfileStepCosts mixed_costs(four_tp, ftp_pred, mixed);
  const stepcost::StepWork w = balance::step_work_of(shape_of({3}, {7}));
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(mixed_costs.uses_step_model(k)) << k;
  EXPECT_NEAR(mixed_costs.compute_ms(0, shape_of({3}, {7})), grid_unit_ms(0, 0, w), 1e-9);
  EXPECT_NEAR(mixed_costs.compute_ms(1, shape_of({3}, {7})), grid_unit_ms(0, 1, w), 1e-9);
  EXPECT_NEAR(mixed_costs.compute_ms(2, shape_of({3}, {7})), grid_unit_ms(0, 2, w) / 2, 1e-9);
}

// The grid's level against the profile's cycles: cycles 1.21x the grid's model of their decode
// shapes and 0.81x of their prefill on every rank give Level 1.21 / 0.81, and the predictions
// take their geometric mean with the grid's (kCyclesLevelWeight 0.5): every stage's decode-only
// steps 1.1x the model, its steps with prefill rows 0.9x, the balancer's step-mix costs likewise.
TEST(ServingStepModel, PredictionsPoolTheGridsLevelWithTheCycles) {
  const RunRecord same = tiny_profile_with_grid(2), run = tiny_profile_with_grid(2, 1.21, 0.81);
  const balance::Predictor pred_same(same), pred(run);
  const balance::Partition p = balance::parse_manual("2,1", 3, 2);
  const balance::ProfileStepCosts base(same, pred_same, p), costs(run, pred, p);
  const std::vector<stepcost::Level> lv = step_model_levels(run.profile, 2, 4, fit_step_model(run.profile).models);
  ASSERT_EQ(lv.size(), 2u);
  for (const stepcost::Level& l : lv) {
    EXPECT_NEAR(l.decode, 1.21, 1e-9);
    EXPECT_NEAR(l.prefill, 0.81, 1e-9);
  }
  for (const stepcost::Level& l : step_model_levels(same.profile, 2, 4, fit_step_model(same.profile).models)) {
    EXPECT_NEAR(l.decode, 1.0, 1e-9);
    EXPECT_NEAR(l.prefill, 1.0, 1e-9);
  }
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(costs.compute_ms(k, shape_of({}, {4, 11})), 1.1 * base.compute_ms(k, shape_of({}, {4, 11})), 1e-9) << k;
    EXPECT_NEAR(costs.compute_ms(k, shape_of({3}, {7})), 0.9 * base.compute_ms(k, shape_of({3}, {7})), 1e-9) << k;
    EXPECT_NEAR(costs.compute_ms(k, shape_of({5}, {})), 0.9 * base.compute_ms(k, shape_of({5}, {})), 1e-9) << k;
  }
  const std::vector<StepShape> mix = {shape_of({5}, {}), shape_of({}, {4, 11})};
  const std::vector<double> c_same = balance::step_mix_costs(same, {mix[0]}, 1.0).unit_ms, c = balance::step_mix_costs(run, {mix[0]}, 1.0).unit_ms;
  const std::vector<double> d_same = balance::step_mix_costs(same, {mix[1]}, 1.0).unit_ms, d = balance::step_mix_costs(run, {mix[1]}, 1.0).unit_ms;
  ASSERT_EQ(c.size(), 6u);
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_NEAR(c[i], 0.9 * c_same[i], 1e-9) << i;
    EXPECT_NEAR(d[i], 1.1 * d_same[i], 1e-9) << i;
  }
}

// ---- the step model calibrated on measured steps --------------------------------------------

/// A serving partition record of `p` whose steps measured `factor(shape)` x the model's compute.
ServingPartitionRecord measured_steps(const std::string& name, const balance::ProfileStepCosts& model, int S,
                                      const std::vector<StepShape>& shapes, double (*factor)(const StepShape&, int)) {
  ServingPartitionRecord sp;
  sp.name = name;
  sp.stages = S;
  for (const StepShape& s : shapes) {
    sp.step_group.push_back(0);
    sp.step_prefill_tokens.push_back(static_cast<int>(s.prefill_tokens));
    sp.step_decode_rows.push_back(s.decode_rows);
    sp.step_decode_context.push_back(s.decode_context_mean);
    sp.step_prefill_rows.push_back(s.prefill_rows);
    sp.step_prefill_keys.push_back(s.prefill_keys);
    sp.step_decode_keys.push_back(s.decode_keys);
    for (int k = 0; k < S; ++k) {
      sp.step_compute_start_s.push_back(0.0);
      sp.step_compute_ms.push_back(model.compute_ms(k, s) * factor(s, k));
    }
  }
  return sp;
}

// The uniform split's steps measured 1.2x the model on decode, 2x on steps of <= 16 token rows
// with prefill, 3x on 17-32 (none beyond): the calibration recovers exactly those factors per
// rank (rank 1 measured 1.5x what rank 0 did), the bands without samples take the nearest
// band's, the partition being predicted is left out, and the calibrated model of another split
// is its profile model times its ranks' factors.
TEST(ServingCalibration, RecoversPerRankAndBandFactorsFromTheOtherSplitsSteps) {
  const RunRecord base = tiny_profile(2);
  const balance::Predictor pred(base);
  const balance::Partition a = balance::parse_manual("2,1", 3, 2), b = balance::parse_manual("1,2", 3, 2);
  const balance::ProfileStepCosts model_a(base, pred, a), model_b(base, pred, b);
  const std::vector<StepShape> shapes = {shape(0, 2, 5), shape(0, 1, 9), shape(8, 2, 6), shape(12, 0, 0),
                                         shape(20, 1, 7), shape(30, 2, 4), shape(0, 2, 11)};
  auto factor = [](const StepShape& s, int k) {
    const double rank = k == 0 ? 1.0 : 1.5;  // split a: stage k on rank k
    return rank * (s.prefill_rows == 0 ? 1.2 : s.tokens <= 16 ? 2.0 : 3.0);
  };
  RunRecord run = base;
  run.serving.partitions = {measured_steps("a", model_a, 2, shapes, factor), ServingPartitionRecord{}};
  run.serving.partitions[1].name = "b";  // no steps: contributes nothing
  const auto calib = balance::calibrate_steps(run, pred, {a, b}, "b");
  ASSERT_EQ(calib.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const double rank = r == 0 ? 1.0 : 1.5;
    EXPECT_NEAR(calib[r].decode_factor, 1.2 * rank, 1e-12);
    EXPECT_EQ(calib[r].decode_samples, 3);
    EXPECT_NEAR(calib[r].prefill_factor[0], 2.0 * rank, 1e-12);
    EXPECT_NEAR(calib[r].prefill_factor[1], 3.0 * rank, 1e-12);
    EXPECT_EQ(calib[r].prefill_samples[0], 2);
    EXPECT_EQ(calib[r].prefill_samples[1], 2);
    for (size_t band = 2; band < calib[r].prefill_factor.size(); ++band)
      EXPECT_NEAR(calib[r].prefill_factor[band], 3.0 * rank, 1e-12) << "the nearest band's";
  }
  EXPECT_EQ(balance::step_token_band(16), 0);
  EXPECT_EQ(balance::step_token_band(17), 1);
  EXPECT_EQ(balance::step_token_band(1000), 4);
  // Excluding the only partition with steps leaves factors of 1.
  const auto none = balance::calibrate_steps(run, pred, {a, b}, "a");
  EXPECT_EQ(none[0].decode_factor, 1.0);
  EXPECT_EQ(none[1].prefill_factor[0], 1.0);
  const balance::CalibratedStepCosts cb(run, pred, b, calib);
  for (const StepShape& s : shapes)
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(cb.compute_ms(k, s), model_b.compute_ms(k, s) * factor(s, k), 1e-12);
}

// Where the profile timed the step model's grid the model carries the shape: the calibration is
// a scale per rank for decode-only steps and one for steps with prefill rows, every band alike.
TEST(ServingCalibration, TheStepModelTakesAScalePerKindOfStep) {
  const RunRecord base = tiny_profile_with_grid(2);
  const balance::Predictor pred(base);
  const balance::Partition a = balance::parse_manual("2,1", 3, 2), b = balance::parse_manual("1,2", 3, 2);
  const balance::ProfileStepCosts model_a(base, pred, a), model_b(base, pred, b);
  ASSERT_TRUE(model_a.uses_step_model(0) && model_a.uses_step_model(1));
  const std::vector<StepShape> shapes = {shape_of({}, {4, 11}), shape_of({}, {6}), shape_of({5}, {}),
                                         shape_of({3}, {7}), shape_of({}, {9, 12}), shape_of({8}, {})};
  auto factor = [](const StepShape& s, int k) { return (k == 0 ? 1.0 : 1.25) * (s.prefill_rows > 0 ? 1.1 : 1.45); };
  RunRecord run = base;
  run.serving.partitions = {measured_steps("a", model_a, 2, shapes, factor)};
  const auto calib = balance::calibrate_steps(run, pred, {a}, "");
  ASSERT_EQ(calib.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const double rank = r == 0 ? 1.0 : 1.25;
    EXPECT_TRUE(calib[r].by_kind);
    EXPECT_NEAR(calib[r].decode_factor, 1.45 * rank, 1e-9);
    EXPECT_EQ(calib[r].decode_samples, 3);
    EXPECT_EQ(calib[r].prefill_samples[0], 3);
    for (double f : calib[r].prefill_factor) EXPECT_NEAR(f, 1.1 * rank, 1e-9);
  }
  const balance::CalibratedStepCosts cb(run, pred, b, calib);
  for (const StepShape& s : shapes)
    for (int k = 0; k < 2; ++k) EXPECT_NEAR(cb.compute_ms(k, s), model_b.compute_ms(k, s) * factor(s, k), 1e-9);
}

/// `model` with stage k's compute scaled by factor(shape, k).
class ScaledCosts final : public serving::StepCostModel {
 public:
  ScaledCosts(const serving::StepCostModel& m, double (*f)(const StepShape&, int)) : m_(m), f_(f) {}
  int stages() const override { return m_.stages(); }
  double compute_ms(int k, const StepShape& s) const override { return m_.compute_ms(k, s) * f_(s, k); }
  double transfer_ms(int k, const StepShape& s) const override { return m_.transfer_ms(k, s); }

 private:
  const serving::StepCostModel& m_;
  double (*f_)(const StepShape&, int);
};

/// A scenario of 16 requests (B = 2, SLO 40 / 12 ms) stored in `run` as a serving run stores its own.
struct TinyScenario {
  serving::ScenarioSpec spec;
  std::vector<serving::Request> requests;
};
TinyScenario store_tiny_scenario(RunRecord& run) {
  TinyScenario sc;
  sc.spec.slots = 2;
  sc.spec.goodput.ttft_ms = 40.0;
  sc.spec.goodput.tpot_ms = 12.0;
  run.serving.spec = sc.spec;
  for (int i = 0; i < 16; ++i) {
    sc.requests.push_back({0.004 * i, 2 + i % 5, 1 + i % 4});
    run.serving.arrival_s.push_back(sc.requests.back().arrival_s);
    run.serving.prompt_len.push_back(sc.requests.back().prompt_len);
    run.serving.gen_len.push_back(sc.requests.back().gen_len);
  }
  return sc;
}

// After the rounds, a partition's own steps (measured 1.45x the model on decode and 1.1x with
// prefill on rank 0, 1.25x that on rank 1) give its step_level exactly, and predict_serving's
// self_* are the stored scenario played on the model scaled by them; steps that measured the
// model itself replay the profile's prediction (self_* = simulated_*).
TEST(ServingCalibration, OwnStepsGiveTheRoundsLevelAndTheSimulatorAtIt) {
  RunRecord run = tiny_profile_with_grid(2);
  const balance::Predictor pred(run);
  const balance::Partition a = balance::parse_manual("2,1", 3, 2);
  const balance::ProfileStepCosts model(run, pred, a);
  const TinyScenario sc = store_tiny_scenario(run);
  const serving::ScenarioSpec& spec = sc.spec;
  const std::vector<serving::Request>& reqs = sc.requests;
  const std::vector<StepShape> shapes = {shape_of({}, {4, 11}), shape_of({}, {6}), shape_of({5}, {}),
                                         shape_of({3}, {7}), shape_of({}, {9, 12}), shape_of({8}, {})};
  auto check = [&](double (*factor)(const StepShape&, int), const std::vector<double>& level) -> ServingPartitionRecord {
    RunRecord r = run;
    ServingPartitionRecord sp = measured_steps("a", model, 2, shapes, factor);
    sp.groups = 2, sp.slots = 2;
    r.serving.partitions = {sp};
    EXPECT_EQ(balance::predict_serving(r, pred, {a}), "");
    const ServingPartitionRecord& p = r.serving.partitions[0];
    EXPECT_EQ(p.step_level.size(), level.size());
    for (size_t i = 0; i < level.size() && i < p.step_level.size(); ++i) EXPECT_NEAR(p.step_level[i], level[i], 1e-9) << i;
    serving::PipelineSimConfig cfg;
    cfg.scheduler = spec.scheduler(2);
    const ScaledCosts scaled(model, factor);
    const serving::ServingMetrics want = serving::serving_metrics(serving::simulate_serving(reqs, scaled, cfg).times, spec.goodput);
    EXPECT_NEAR(p.self.output_tokens_per_s, want.output_tokens_per_s, 1e-9 * want.output_tokens_per_s);
    EXPECT_NEAR(p.self.ttft_p50_ms, want.ttft.p50_ms, 1e-9 * want.ttft.p50_ms);
    EXPECT_NEAR(p.self.ttft_p99_ms, want.ttft.p99_ms, 1e-9 * want.ttft.p99_ms);
    EXPECT_NEAR(p.self.tpot_p50_ms, want.tpot.p50_ms, 1e-9 * want.tpot.p50_ms);
    EXPECT_NEAR(p.self.tpot_p99_ms, want.tpot.p99_ms, 1e-9 * want.tpot.p99_ms);
    EXPECT_EQ(p.self.slo_attainment, want.slo_attainment);
    // Steps of one ratio per stage and kind: the replay in order is the same play.
    EXPECT_NEAR(p.replayed.ttft_p50_ms, want.ttft.p50_ms, 1e-9 * want.ttft.p50_ms);
    EXPECT_NEAR(p.replayed.tpot_p99_ms, want.tpot.p99_ms, 1e-9 * want.tpot.p99_ms);
    EXPECT_EQ(p.replayed.slo_attainment, want.slo_attainment);
    return p;
  };
  const ServingPartitionRecord slow = check(
      [](const StepShape& s, int k) { return (k == 0 ? 1.0 : 1.25) * (s.prefill_rows > 0 ? 1.1 : 1.45); },
      {1.45, 1.1, 1.45 * 1.25, 1.1 * 1.25});
  EXPECT_GT(slow.self.ttft_p50_ms, slow.simulated.ttft_p50_ms);  // slower steps: later tokens
  const ServingPartitionRecord same = check([](const StepShape&, int) { return 1.0; }, {1, 1, 1, 1});
  EXPECT_NEAR(same.self.ttft_p99_ms, same.simulated.ttft_p99_ms, 1e-9 * same.simulated.ttft_p99_ms);
  EXPECT_NEAR(same.self.tpot_p50_ms, same.simulated.tpot_p50_ms, 1e-9 * same.simulated.tpot_p50_ms);
  EXPECT_EQ(same.self.slo_attainment, same.simulated.slo_attainment);
}

// A profile of two passes (alone: prefill 0.95x, decode 0.8x the together times) on one
// machine: ProfileStepCosts gives each stage those alone shares, predict_serving plays them
// (simulated_* is the simulator's own play of that model, simulated_overlap its fixed point's f),
// and the results file keeps the overlap.
TEST(ServingCalibration, TwoPassProfileGivesTheStagesContentionAndTheirOverlap) {
  RunRecord run = tiny_profile_with_grid(2);
  for (std::size_t i = 0; i < run.profile.latency_ms.size(); ++i)
    run.profile.latency_alone_ms.push_back(run.profile.latency_ms[i] * (i % 2 == 0 ? 0.95 : 0.8));
  const balance::Predictor pred(run);
  const balance::Partition a = balance::parse_manual("2,1", 3, 2);
  const balance::ProfileStepCosts model(run, pred, a);
  const std::vector<serving::StageContention> c = model.contention();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].machine, c[1].machine);  // tiny_profile: the ranks of one machine
  for (const serving::StageContention& s : c) {
    EXPECT_NEAR(s.alone_share[0], 0.95, 1e-12);
    EXPECT_NEAR(s.alone_share[1], 0.8, 1e-12);
    EXPECT_FALSE(s.always_overlapped);
  }
  const TinyScenario sc = store_tiny_scenario(run);
  const serving::ScenarioSpec& spec = sc.spec;
  const std::vector<serving::Request>& reqs = sc.requests;
  ServingPartitionRecord sp;
  sp.name = "a", sp.stages = 2, sp.groups = 2, sp.slots = 2;
  run.serving.partitions = {sp};
  EXPECT_EQ(balance::predict_serving(run, pred, {a}), "");
  const ServingPartitionRecord& p = run.serving.partitions[0];
  serving::PipelineSimConfig cfg;
  cfg.scheduler = spec.scheduler(2);
  const serving::PipelineSimResult r = serving::simulate_serving(reqs, model, cfg);
  const serving::ServingMetrics want = serving::serving_metrics(r.times, spec.goodput);
  EXPECT_EQ(p.simulated.ttft_p50_ms, want.ttft.p50_ms);
  EXPECT_EQ(p.simulated.tpot_p99_ms, want.tpot.p99_ms);
  ASSERT_EQ(p.simulated_overlap.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(p.simulated_overlap[i], r.overlap[i / 2][i % 2]);
    EXPECT_GE(p.simulated_overlap[i], 0.0);
    EXPECT_LE(p.simulated_overlap[i], 1.0);
  }
  EXPECT_GT(p.simulated_overlap[1] + p.simulated_overlap[3], 0.0);  // two groups: the stages' decodes overlap
  // Faster than the together play, where something overlapped less than all the time.
  const serving::PipelineSimResult together = serving::simulate_serving(reqs, ScaledCosts(model, [](const StepShape&, int) { return 1.0; }), cfg);
  EXPECT_LT(r.times.back().finish_s, together.times.back().finish_s);

  const std::filesystem::path path = std::filesystem::temp_directory_path() / ("ppb_overlap_" + std::to_string(::getpid()) + ".h5");
  write_results(path.string(), run);
  const RunRecord back = read_results(path.string());
  std::filesystem::remove(path);
  ASSERT_EQ(back.serving.partitions.size(), 1u);
  EXPECT_EQ(back.serving.partitions[0].simulated_overlap, p.simulated_overlap);
}

// Steps of two prompts, a chunk at a cached position and a recompute beside decodes, measured
// 1.1x (steps with prefill) and 0.9x (decode-only) the step model of their exact shapes: the
// recorded rows and keys (`steps/` prefill_rows, prefill_keys, decode_keys) give those levels
// exactly; without them (older files) a step's prefill counts as one prompt of its tokens from
// position 0, its keys miscounted, and the level comes out off.
TEST(ServingCalibration, RecordedKeysCalibrateStepsOfSeveralPromptsExactly) {
  const RunRecord run = tiny_profile_with_grid(2);
  const balance::Predictor pred(run);
  const balance::Partition a = balance::parse_manual("2,1", 3, 2);
  const balance::ProfileStepCosts model(run, pred, a);
  auto step = [](const std::vector<std::pair<int, int>>& prefill, const std::vector<int>& decode_pos) {
    serving::Step st;
    int slot = 0;
    for (const auto& [pos, t] : prefill) st.rows.push_back({slot, slot, pos, t, true, true}), ++slot;
    for (int p : decode_pos) st.rows.push_back({slot, slot, p, 1, false, true}), ++slot;
    return serving::step_shape(st);
  };
  const std::vector<StepShape> shapes = {step({{0, 5}, {0, 7}}, {}), step({{6, 4}}, {9}), step({{0, 3}, {8, 6}}, {4}),
                                         step({}, {5, 10}), step({}, {7})};
  ASSERT_EQ(shapes[0].prefill_rows, 2);
  ASSERT_EQ(shapes[0].prefill_keys, 15.0 + 28.0);  // 5 * 6 / 2 + 7 * 8 / 2, not 12 * 13 / 2
  ASSERT_EQ(shapes[1].prefill_keys, 4 * 6 + 10.0);  // a chunk of 4 at position 6
  auto factor = [](const StepShape& s, int) { return s.prefill_rows > 0 ? 1.1 : 0.9; };
  RunRecord r = run;
  r.serving.partitions = {measured_steps("a", model, 2, shapes, factor)};
  for (const balance::StepCalibration& c : balance::calibrate_own_steps(r, pred, {a}, "a")) {
    EXPECT_TRUE(c.by_kind);
    EXPECT_NEAR(c.decode_factor, 0.9, 1e-12);
    EXPECT_NEAR(c.prefill_factor.front(), 1.1, 1e-12);
  }
  ServingPartitionRecord& old = r.serving.partitions[0];
  old.step_prefill_rows.clear(), old.step_prefill_keys.clear(), old.step_decode_keys.clear();
  const std::vector<balance::StepCalibration> approx = balance::calibrate_own_steps(r, pred, {a}, "a");
  EXPECT_NEAR(approx[0].decode_factor, 0.9, 1e-12);  // decode-only steps: the mean context is exact
  EXPECT_GT(std::abs(approx[0].prefill_factor.front() - 1.1), 1e-3);
}

// The level of a kind of step is its steps' busy time against the model's (sum measured / sum
// modelled), not their median ratio: three decode steps at 0.9x, 0.9x and 2x of the model weigh
// by their time. And the replay takes the ratios in the order the steps ran, per stage and kind.
TEST(ServingCalibration, TheLevelIsTheBusyTimeAndTheReplayTakesEachStepInOrder) {
  const RunRecord run = tiny_profile_with_grid(2);
  const balance::Predictor pred(run);
  const balance::Partition a = balance::parse_manual("2,1", 3, 2);
  const balance::ProfileStepCosts model(run, pred, a);
  const std::vector<StepShape> shapes = {shape_of({}, {4, 11}), shape_of({5}, {}), shape_of({}, {7}),
                                         shape_of({3}, {7}), shape_of({}, {4, 11})};
  auto one = [](const StepShape&, int) { return 1.0; };
  RunRecord r = run;
  r.serving.partitions = {measured_steps("a", model, 2, shapes, one)};
  ServingPartitionRecord& sp = r.serving.partitions[0];
  const double ratio[5][2] = {{0.9, 1.0}, {1.2, 1.1}, {0.9, 1.0}, {1.5, 1.3}, {2.0, 0.7}};  // [step][stage]
  double meas[2][2] = {}, want[2][2] = {};  // [stage][with prefill, decode-only]
  for (int i = 0; i < 5; ++i)
    for (int k = 0; k < 2; ++k) {
      sp.step_compute_ms[static_cast<std::size_t>(i * 2 + k)] *= ratio[i][k];
      const int kind = shapes[static_cast<std::size_t>(i)].prefill_rows > 0 ? 0 : 1;
      meas[k][kind] += model.compute_ms(k, shapes[static_cast<std::size_t>(i)]) * ratio[i][k];
      want[k][kind] += model.compute_ms(k, shapes[static_cast<std::size_t>(i)]);
    }
  const std::vector<balance::StepCalibration> own = balance::calibrate_own_steps(r, pred, {a}, "a");
  ASSERT_EQ(own.size(), 2u);
  for (int k = 0; k < 2; ++k) {  // stage k runs on rank k
    EXPECT_NEAR(own[k].decode_factor, meas[k][1] / want[k][1], 1e-12) << k;
    EXPECT_NEAR(own[k].prefill_factor.front(), meas[k][0] / want[k][0], 1e-12) << k;
  }
  EXPECT_GT(std::abs(own[0].decode_factor - 0.9), 0.1);  // the median of 0.9, 0.9, 2.0 would say 0.9
  // The replay: the n-th step of a kind the simulator forms takes the n-th measured one's ratio,
  // whatever its own shape, cycling past the last.
  const balance::ReplayedStepCosts replay(r, pred, a, sp);
  const StepShape d = shape_of({}, {6}), p = shape_of({8}, {});
  for (double want_ratio : {0.9, 0.9, 2.0, 0.9}) EXPECT_NEAR(replay.compute_ms(0, d), model.compute_ms(0, d) * want_ratio, 1e-12);
  for (double want_ratio : {1.2, 1.5, 1.2}) EXPECT_NEAR(replay.compute_ms(0, p), model.compute_ms(0, p) * want_ratio, 1e-12);
  for (double want_ratio : {1.0, 1.0, 0.7}) EXPECT_NEAR(replay.compute_ms(1, d), model.compute_ms(1, d) * want_ratio, 1e-12);
}

// ---- MLPerf's rule --------------------------------------------------------------------------

TEST(ServingMlperf, EarlyStoppingMatchesLoadGensCounts) {
  // t = 0: 0.99^n < 0.01 from n = 459; t = 1: n = 662, LoadGen's MultiStream min_query_count
  // (mlperf.conf *.MultiStream.min_query_count = 662), the same bound at the 99th percentile.
  EXPECT_EQ(serving::mlperf_min_queries(0), 459);
  EXPECT_EQ(serving::mlperf_min_queries(1), 662);
  EXPECT_FALSE(serving::mlperf_early_stopping(458, 0));
  EXPECT_TRUE(serving::mlperf_early_stopping(459, 0));
  EXPECT_FALSE(serving::mlperf_early_stopping(661, 1));
  EXPECT_NEAR(serving::binomial_cdf(1, 3, 0.5), 0.5, 1e-12);
  EXPECT_NEAR(serving::binomial_cdf(0, 10, 0.1), std::pow(0.9, 10), 1e-12);
  std::vector<double> v;
  for (int i = 1; i <= 200; ++i) v.push_back(201 - i);
  EXPECT_EQ(serving::loadgen_percentile(v, 0.99), 199.0);  // sorted index floor(200 x 0.99) = 198
  EXPECT_EQ(serving::loadgen_percentile({3, 1, 2}, 0.99), 3.0);
}

/// n requests of 3 tokens at 10 ms apart each: TTFT 100 ms, TPOT (E2E - TTFT) / 2 = 20 ms, and
/// `slow` of them TTFT 300 ms.
std::vector<RequestTimes> hand_times(int n, int slow) {
  std::vector<RequestTimes> out;
  for (int i = 0; i < n; ++i) {
    RequestTimes t;
    t.arrival_s = 0.01 * i;
    t.admitted_s = t.arrival_s;
    const double ttft = i < slow ? 0.3 : 0.1;
    t.token_s = {t.arrival_s + ttft, t.arrival_s + ttft + 0.02, t.arrival_s + ttft + 0.04};
    t.first_token_s = t.token_s.front();
    t.finish_s = t.token_s.back();
    t.prompt_len = 5;
    t.gen_len = 3;
    out.push_back(t);
  }
  return out;
}

TEST(ServingMlperf, JudgeAppliesP99EarlyStoppingAndTheMinimumQueries) {
  serving::SloTarget slo;
  slo.ttft_ms = 200;
  slo.tpot_ms = 50;
  slo.mlperf = true;
  auto v = serving::judge_requests(hand_times(500, 0), slo);
  EXPECT_TRUE(v.pass);
  EXPECT_NEAR(v.ttft_p99_ms, 100, 1e-9);
  EXPECT_NEAR(v.tpot_p99_ms, 20, 1e-9);
  v = serving::judge_requests(hand_times(500, 1), slo);  // p99 fine, early stopping needs 662
  EXPECT_NEAR(v.ttft_p99_ms, 100, 1e-9);
  EXPECT_EQ(v.ttft_over, 1);
  EXPECT_FALSE(v.early_stopping);
  EXPECT_FALSE(v.pass);
  EXPECT_TRUE(serving::judge_requests(hand_times(700, 1), slo).pass);
  EXPECT_FALSE(serving::judge_requests(hand_times(99, 0), slo).pass);  // < 100 queries
  slo.mlperf = false;  // attainment: 499 of 500
  slo.attainment = 0.998;
  v = serving::judge_requests(hand_times(500, 1), slo);
  EXPECT_NEAR(v.attainment, 0.998, 1e-12);
  EXPECT_TRUE(v.pass);
  slo.attainment = 0.999;
  EXPECT_FALSE(serving::judge_requests(hand_times(500, 1), slo).pass);
}

// ---- the bisection against a brute-force scan -----------------------------------------------

struct ScanCase {
  const char* name;
  double burstiness;
  const char* prompts;
  const char* outputs;
};

/// The rate searches' pipeline (2 groups of 4 slots), SLO (TTFT 150 ms, TPOT 12 ms for 90%) and
/// requests: 200 of case `c` at unit rate, seed 3.
serving::PipelineSimConfig search_config() {
  serving::PipelineSimConfig cfg;
  cfg.scheduler.groups = 2;
  cfg.scheduler.slots = 4;
  return cfg;
}
serving::SloTarget search_slo() {
  serving::SloTarget slo;
  slo.ttft_ms = 150;
  slo.tpot_ms = 12;
  slo.attainment = 0.9;
  return slo;
}
std::vector<Request> search_requests(const ScanCase& c) {
  serving::ScenarioSpec spec;
  spec.arrivals = {1.0, c.burstiness, true};
  spec.requests = 200;
  spec.prompt_lens = serving::parse_length_spec(c.prompts, "--prompt-lens");
  spec.gen_lens = serving::parse_length_spec(c.outputs, "--gen-lens");
  spec.max_prompt_len = spec.max_gen_len = 1000;
  spec.seed = 3;
  return serving::generate_requests(spec);
}

TEST(ServingRateSearch, BisectionMatchesABruteForceScan) {
  const FixedCosts costs({0.05, 0.04}, {2.0, 1.5}, {0.1, 0.05});
  const serving::PipelineSimConfig cfg = search_config();
  const serving::SloTarget slo = search_slo();
  for (const ScanCase& c : {ScanCase{"constant gaps, fixed lengths", INFINITY, "fixed:64", "fixed:16"},
                            ScanCase{"Poisson, lognormal lengths", 1.0, "lognormal:64,0.5", "lognormal:16,0.5"}}) {
    const auto unit = search_requests(c);
    auto judge = [&](double rate) {
      return serving::judge_requests(serving::simulate_serving(serving::scale_arrivals(unit, rate), costs, cfg).times, slo);
    };
    serving::RateSearchOptions so;
    so.start_rate = 1.0;
    const auto s = serving::search_max_rate(judge, so);
    ASSERT_EQ(s.outcome, serving::RateSearchResult::Outcome::found) << c.name;
    EXPECT_LE(s.failing_rate - s.rate, 0.01 * s.rate);
    // The scan: 0.2% steps over [0.5, 1.5] x the answer; the transitions pass -> fail on it.
    const double step = 0.002 * s.rate;
    std::vector<double> transitions;
    bool prev = true;
    int inversions = 0;
    for (double r = 0.5 * s.rate; r <= 1.5 * s.rate; r += step) {
      const bool pass = judge(r).pass;
      if (prev && !pass) transitions.push_back(r - step);  // the last passing rate before it
      inversions += !prev && pass ? 1 : 0;
      prev = pass;
    }
    ASSERT_FALSE(transitions.empty()) << c.name;
    std::printf("%s: bisection %.4f req/s (%zu probes, %d non-monotone), scan's first transition %.4f, %zu "
                "transition(s), %d fail->pass inversion(s)\n",
                c.name, s.rate, s.probes.size(), s.non_monotone, transitions.front(), transitions.size(), inversions);
    // The bisection ends on a pass-to-fail transition of the scan, within the tolerance plus a step;
    // where the scan is monotone, on its only one.
    double nearest = transitions.front();
    for (double t : transitions)
      if (std::abs(t - s.rate) < std::abs(nearest - s.rate)) nearest = t;
    EXPECT_NEAR(s.rate, nearest, 0.01 * s.rate + step) << c.name;
    if (inversions == 0) EXPECT_NEAR(s.rate, transitions.front(), 0.01 * s.rate + step) << c.name;
    // The search serve-search and run --request-rate search share (its own first probe, from the
    // requests alone) lands on a transition of the same scan.
    const auto shared = serving::search_simulated_rate(unit, costs, cfg, slo);
    ASSERT_EQ(shared.outcome, serving::RateSearchResult::Outcome::found) << c.name;
    double near_shared = transitions.front();
    for (double t : transitions)
      if (std::abs(t - shared.rate) < std::abs(near_shared - shared.rate)) near_shared = t;
    EXPECT_NEAR(shared.rate, near_shared, 0.01 * shared.rate + step) << c.name;
    if (inversions == 0) EXPECT_NEAR(shared.rate, s.rate, 0.01 * s.rate + 2 * step) << c.name;
  }
}

// The rate band (issue 47: the max rate with the step model's own uncertainty): its ends are the
// searches at compute x (1 -+ e), and scaling every compute by s with the SLO's limits scaled alike
// is the same pipeline on a clock s times slower, so its highest rate is the unscaled one / s
// (exact in the simulator with free transfers; each search within its 1% bisection).
TEST(ServingRateSearch, BandIsTheSearchAtScaledStepsAndScalesAsTime) {
  const FixedCosts with_xfer({0.05, 0.04}, {2.0, 1.5}, {0.1, 0.05});
  const serving::ScaledStepCosts scaled(with_xfer, 1.25);
  StepShape sh;
  sh.prefill_tokens = 10;
  sh.decode_rows = 2;
  EXPECT_DOUBLE_EQ(scaled.compute_ms(1, sh), 1.25 * with_xfer.compute_ms(1, sh));
  EXPECT_DOUBLE_EQ(scaled.transfer_ms(0, sh), with_xfer.transfer_ms(0, sh));
  EXPECT_EQ(scaled.stages(), 2);
  EXPECT_THROW(serving::ScaledStepCosts(with_xfer, 0.0), InternalError);

  const FixedCosts costs({0.05, 0.04}, {2.0, 1.5}, {0.0, 0.0});
  const serving::PipelineSimConfig cfg = search_config();
  const serving::SloTarget slo = search_slo();
  const auto unit = search_requests({"constant gaps, fixed lengths", INFINITY, "fixed:64", "fixed:16"});
  const auto mid = serving::search_simulated_rate(unit, costs, cfg, slo);
  ASSERT_EQ(mid.outcome, serving::RateSearchResult::Outcome::found);
  const auto band = serving::search_rate_band(unit, costs, cfg, slo, 0.1);
  EXPECT_DOUBLE_EQ(band.rel_error, 0.1);
  EXPECT_DOUBLE_EQ(band.slower.rate,
                   serving::search_simulated_rate(unit, serving::ScaledStepCosts(costs, 1.1), cfg, slo).rate);
  EXPECT_DOUBLE_EQ(band.faster.rate,
                   serving::search_simulated_rate(unit, serving::ScaledStepCosts(costs, 0.9), cfg, slo).rate);
  EXPECT_LT(band.slower.rate, mid.rate);
  EXPECT_GT(band.faster.rate, mid.rate);
  for (double s : {1.1, 0.9}) {
    serving::SloTarget slo_s = slo;
    slo_s.ttft_ms *= s;
    slo_s.tpot_ms *= s;
    const auto dilated = serving::search_simulated_rate(unit, serving::ScaledStepCosts(costs, s), cfg, slo_s);
    ASSERT_EQ(dilated.outcome, serving::RateSearchResult::Outcome::found);
    EXPECT_NEAR(dilated.rate * s, mid.rate, 0.02 * mid.rate) << "scale " << s;
  }
  const auto zero = serving::search_rate_band(unit, costs, cfg, slo, 0.0);
  EXPECT_DOUBLE_EQ(zero.slower.rate, mid.rate);
  EXPECT_DOUBLE_EQ(zero.faster.rate, mid.rate);
  EXPECT_THROW(serving::search_rate_band(unit, costs, cfg, slo, 1.0), InternalError);
}

TEST(ServingRateSearch, BracketsDownwardsAndReportsNoneOrUnbounded) {
  auto threshold = [](double t) {
    return [t](double rate) {
      serving::RateVerdict v;
      v.pass = rate <= t;
      return v;
    };
  };
  serving::RateSearchOptions so;
  so.start_rate = 100.0;
  auto s = serving::search_max_rate(threshold(3.3), so);  // halves 100 -> 50 -> ... -> 3.125
  ASSERT_EQ(s.outcome, serving::RateSearchResult::Outcome::found);
  EXPECT_LE(s.rate, 3.3);
  EXPECT_GT(s.failing_rate, 3.3);
  EXPECT_GE(s.rate, 3.3 / 1.01);
  EXPECT_EQ(s.non_monotone, 0);
  so.min_rate = 1.0;
  EXPECT_EQ(serving::search_max_rate(threshold(0.5), so).outcome, serving::RateSearchResult::Outcome::none);
  so.max_rate = 1000.0;
  EXPECT_EQ(serving::search_max_rate(threshold(1e6), so).outcome, serving::RateSearchResult::Outcome::unbounded);
}

// ---- the command ----------------------------------------------------------------------------

class ServeSearchCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ppb_serve_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    file_ = (dir_ / "profile.h5").string();
    write_results(file_, tiny_profile(2));
  }
  void TearDown() override { fs::remove_all(dir_); }
  ServeSearchOptions opts() {
    ServeSearchOptions o;
    o.input = file_;
    o.scenario.slo_ttft_ms = 50;
    o.scenario.slo_tpot_ms = 10;
    o.scenario.requests = 100;
    return o;
  }
  fs::path dir_;
  std::string file_;
};

TEST_F(ServeSearchCommandTest, BadInputsNameTheFlag) {
  auto err = [&](auto change) {
    ServeSearchOptions o = opts();
    change(o);
    return error_of([&] { serve_search_command(o); });
  };
  EXPECT_NE(err([](auto& o) { o.scenario.slo_ttft_ms = 0; }).find("--slo-ttft"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.scenario.slo_tpot_ms = -1; }).find("--slo-tpot"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.scenario.attainment = 1.5; }).find("--attainment"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.scenario.requests = 0; }).find("--requests"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.mlperf = true; o.scenario.requests = 50; }).find("--requests 50 with --mlperf"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.scenario.burstiness = 0; }).find("--burstiness"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.scenario.prompt_lens = "normal:3"; }).find("--prompt-lens"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.scenario.gen_lens = "fixed:0"; }).find("--gen-lens"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.microbatches = -1; }).find("-M"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.batch = 3; }).find("-b 3"), std::string::npos);  // the file's B is 2
  EXPECT_NE(err([](auto& o) { o.partition_name = "nope"; }).find("--partition-name 'nope'"), std::string::npos);
  EXPECT_NE(err([&](auto& o) { o.json_out = file_; }).find("input"), std::string::npos);
  EXPECT_NE(err([&](auto& o) { o.input = (dir_ / "missing.h5").string(); }), "no error");
}

TEST_F(ServeSearchCommandTest, PrintsTheRatePerPartitionAndPerDevice) {
  ServeSearchOptions o = opts();
  o.json_out = (dir_ / "s.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(serve_search_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("uniform (not measured)"), std::string::npos) << out;
  const auto j = nlohmann::json::parse(std::ifstream(o.json_out));
  const auto& p = j["partitions"][0];
  EXPECT_EQ(p["outcome"], "found") << out;
  EXPECT_EQ(p["devices"], 2);
  const double rate = p["max_rate_req_per_s"].get<double>();
  EXPECT_GT(rate, 0.0);
  EXPECT_DOUBLE_EQ(p["max_rate_per_device"].get<double>(), rate / 2);
  EXPECT_GE(p["at_max_rate"]["attainment"].get<double>(), 0.9);
  const auto& last = p["probes"].back();
  EXPECT_LE(p["failing_rate"].get<double>() - rate, 0.01 * rate + 1e-12);
  EXPECT_FALSE(last.is_null());
  std::printf("%s", out.c_str());
  // --mlperf: p99 of each within its limit with early stopping; at the answer no request of 500
  // may miss by much (t <= 1 needs n >= 662, so t = 0 here), and 500 / R s < 600 s is noted.
  o.mlperf = true;
  o.scenario.requests = 500;
  o.force = true;
  testing::internal::CaptureStdout();
  EXPECT_EQ(serve_search_command(o), 0);
  const std::string mlperf_out = testing::internal::GetCapturedStdout();
  const auto jm = nlohmann::json::parse(std::ifstream(o.json_out));
  const auto& pm = jm["partitions"][0];
  EXPECT_EQ(jm["slo"]["rule"], "mlperf");
  ASSERT_EQ(pm["outcome"], "found") << mlperf_out;
  EXPECT_LE(pm["at_max_rate"]["ttft_p99_ms"].get<double>(), 50.0);
  EXPECT_EQ(pm["at_max_rate"]["attainment"].get<double>(), 1.0);
  EXPECT_NE(mlperf_out.find("MLPerf's minimum duration"), std::string::npos) << mlperf_out;
  std::printf("%s", mlperf_out.c_str());
}

// A TTFT limit below a lone request's prefill: no rate passes (the search halves 10 times below
// its light-load start and stops), and the JSON has no maximum rate.
TEST_F(ServeSearchCommandTest, SaysSoWhenNoRateMeetsTheSlo) {
  ServeSearchOptions o = opts();
  o.scenario.slo_ttft_ms = 0.001;
  o.json_out = (dir_ / "none.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(serve_search_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("no rate meets the SLO"), std::string::npos) << out;
  const auto j = nlohmann::json::parse(std::ifstream(o.json_out));
  EXPECT_EQ(j["partitions"][0]["outcome"], "none");
  EXPECT_FALSE(j["partitions"][0].contains("max_rate_req_per_s"));
  EXPECT_EQ(j["partitions"][0]["probes"].size(), 11u);  // the start and 10 halvings
}

// ---- a 70B-class search on 8 devices ---------------------------------------------------------

/// A Llama-3.1-70B-like profile on 8 H200-like ranks (one pass): embed, 80 layers, head
/// (82 units); B=16 P=512 G=256, M=8. Napkin numbers: a layer's bf16 weights are ~1.7 GB, read
/// at ~4.8 TB/s in ~0.36 ms per decode step (+ KV reads growing with the context); its prefill
/// of 16 x 512 tokens is 2 x 0.86e9 x 8192 = 1.4e13 FLOP, ~20 ms at ~700 TFLOP/s; the head
/// (8192 x 128256) ~0.45 ms per decode step.
RunRecord llama70b_profile() {
  const int R = 8, U = 82;
  RunRecord r = tiny_profile(R);
  r.model_attrs_num = {{"hidden_size", 8192}};
  r.workload = {16, 512, 256, 8, "bf16", 1, 2, 0, 3, true, 7, "workload"};
  r.link_latency_s = 5e-6;
  r.link_bandwidth_Bps = 50e9;
  auto& p = r.profile;
  p = ProfileTable{};
  p.decode_contexts = {512, 597, 682, 767};
  p.signature_name = {"embed", "layer", "head"};
  for (int u = 0; u < U; ++u) {
    p.unit_name.push_back(u == 0 ? "embed" : u == U - 1 ? "head" : "layer." + std::to_string(u - 1));
    p.unit_signature.push_back(u == 0 ? 0 : u == U - 1 ? 2 : 1);
    p.unit_params.push_back(u == 0 || u == U - 1 ? 1050000000 : 856000000);
    p.unit_weight_bytes.push_back(2 * p.unit_params.back());
    p.unit_kv_bytes.push_back(u == 0 || u == U - 1 ? 0 : 1 << 20);
  }
  for (int k = 0; k < R; ++k)
    for (int u = 0; u < U; ++u) {
      const bool layer = u > 0 && u < U - 1;
      const double pre = u == 0 ? 0.2 : layer ? 20.0 : 1.5, dec = u == 0 ? 0.02 : layer ? 0.38 : 0.45;
      p.latency_ms.insert(p.latency_ms.end(), {pre, dec});
      for (int c = 0; c < 4; ++c) p.decode_context_ms.push_back(layer ? 0.35 + 0.02 * c : dec);
    }
  p.latency_min_ms = p.latency_max_ms = p.latency_ms;
  p.cost_ms.assign(static_cast<std::size_t>(R) * U, 1.0);
  return r;
}

/// `plan --scenario` on 4 devices of the 70B-class profile with tensor-parallel widths 2, 4 and 8
/// (each width's step a 1/w share of a layer's plus 15% for its all-reduces): every layout of
/// 4 devices (6 compositions) and of 5 (one more device), M = 1 .. 2S, each searched; prints its
/// time. (8 devices: 572 candidates, 167 s here on 2 cores, and 230 s more for 9: DESIGN.md.)
TEST_F(ServeSearchCommandTest, PlanScenarioOnFourDevicesOfA70BClassProfile) {
  RunRecord run = llama70b_profile();
  const std::size_t U = run.profile.unit_name.size();
  for (int w : {2, 4, 8}) {
    ProfileTable::TpGroupProfile g;
    g.first_rank = 0;
    g.width = w;
    for (std::size_t i = 0; i < 2 * U; ++i) g.latency_ms.push_back(run.profile.latency_ms[i] / w * 1.15);
    g.latency_min_ms = g.latency_max_ms = g.latency_ms;
    run.profile.tp.push_back(g);
  }
  const std::string path = (dir_ / "llama70b_tp.h5").string();
  write_results(path, run);
  PlanOptions o;
  o.input = path;
  o.devices = 4;
  o.scenario.scenario = "poisson";
  o.scenario.slo_ttft_ms = 2000;
  o.scenario.slo_tpot_ms = 200;
  o.scenario.attainment = 0.99;
  o.scenario.requests = 128;
  o.scenario.prompt_lens = "lognormal:512,0.5";
  o.scenario.gen_lens = "lognormal:256,0.5";
  o.json_out = (dir_ / "plan70b.json").string();
  const auto t0 = std::chrono::steady_clock::now();
  testing::internal::CaptureStdout();
  EXPECT_EQ(plan_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto j = nlohmann::json::parse(std::ifstream(o.json_out));
  std::printf("plan --scenario, 82 units on 4 devices (+ 5 for one more), 128 requests: %zu candidates, %.2f s\n%s",
              j["ranked"].size(), s, out.c_str());
  ASSERT_FALSE(j["ranked"].empty());
  EXPECT_EQ(j["ranked"][0]["outcome"], "found");
  EXPECT_GE(j["ranked"][0]["attainment"].get<double>(), 0.99);
  for (std::size_t i = 1; i < j["ranked"].size(); ++i)
    if (j["ranked"][i]["outcome"] == "found")
      EXPECT_GE(j["ranked"][0]["max_rate_req_per_s"].get<double>(), j["ranked"][i]["max_rate_req_per_s"].get<double>());
}

TEST_F(ServeSearchCommandTest, A70BClassSearchOnEightDevices) {
  const std::string path = (dir_ / "llama70b.h5").string();
  write_results(path, llama70b_profile());
  // PPB_SERVE_SYNTHETIC_OUT=FILE keeps a copy, to run `ppbench serve-search FILE ...` by hand.
  if (const char* keep = std::getenv("PPB_SERVE_SYNTHETIC_OUT")) fs::copy_file(path, keep, fs::copy_options::overwrite_existing);
  ServeSearchOptions o;
  o.input = path;
  o.scenario.slo_ttft_ms = 2000;  // MLPerf's llama2-70b Server limits (loadgen/mlperf.conf)
  o.scenario.slo_tpot_ms = 200;
  o.scenario.attainment = 0.99;
  o.scenario.requests = 1000;
  o.scenario.prompt_lens = "lognormal:512,0.5";
  o.scenario.gen_lens = "lognormal:256,0.5";
  o.json_out = (dir_ / "70b.json").string();
  const auto t0 = std::chrono::steady_clock::now();
  testing::internal::CaptureStdout();
  EXPECT_EQ(serve_search_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto j = nlohmann::json::parse(std::ifstream(o.json_out));
  const auto& p = j["partitions"][0];
  std::printf("serve-search, 82 units on 8 devices, 1000 requests: %.2f s (%zu probes)\n%s", s, p["probes"].size(),
              out.c_str());
  EXPECT_EQ(p["outcome"], "found");
  EXPECT_EQ(p["devices"], 8);
  EXPECT_GE(p["at_max_rate"]["attainment"].get<double>(), 0.99);
  // Issue 38 asks under 30 s here; a generous bound (sanitized builds run several times slower).
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(s, 300.0);
#else
  EXPECT_LT(s, 30.0);
#endif
}

}  // namespace
}  // namespace ppb
