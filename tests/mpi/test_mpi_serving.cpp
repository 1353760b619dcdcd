// The serving engine across ranks (issue 37): requests that arrive, continuously batched by M
// groups of B slots through a pipeline of one stage per rank. Its tokens equal, bitwise, those
// of the same schedule run step by step on one stage holding the whole model, and those of its
// serialized replay; every request gets its gen_len tokens at consistent times.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "balance/partition.h"
#include "common/events.h"
#include "model/model_spec.h"
#include "mpi_test_main.h"
#include "pipeline/serving_pipeline.h"
#include "serving/request_metrics.h"
#include "transport/transport.h"

namespace ppb {
namespace {

/// A hand-made scenario: 10 requests of prompts 2..9 and outputs 1..5 tokens; the first six at
/// t = 0 (more than the M x B = 4 slots: two queue), the rest 20 ms apart.
std::vector<serving::Request> scenario() {
  std::vector<serving::Request> r;
  const int prompts[] = {5, 3, 9, 2, 7, 4, 6, 8, 3, 5};
  const int outputs[] = {4, 1, 3, 5, 2, 4, 1, 3, 5, 2};
  for (int i = 0; i < 10; ++i) r.push_back({i < 6 ? 0.0 : 0.02 * (i - 5), prompts[i], outputs[i]});
  return r;
}

/// Every step of `schedule` run in order on one stage of the whole model, directly: the tokens
/// of each request ([N][gen_len]) as a one-rank engine would give them.
std::vector<std::vector<int32_t>> sequential_tokens(Device& device, const model::ModelSpec& m, const ServingConfig& cfg,
                                                    const std::vector<serving::Request>& reqs,
                                                    const std::vector<ScheduledStep>& schedule, const StageConfig& sc) {
  auto stage = device.create_stage(m, 0, m.num_units() - 1, sc);
  auto lane = device.create_lane("ref");
  std::vector<std::vector<int32_t>> out(reqs.size());
  for (const ScheduledStep& s : schedule) {
    RaggedStep rs;
    std::vector<int32_t> ids;
    for (const ScheduledRow& row : s.rows) {
      rs.slot.push_back(row.slot);
      rs.pos.push_back(row.position);
      rs.tokens.push_back(row.tokens);
      for (int t = 0; t < row.tokens; ++t) {
        const int p = row.position + t;
        const int P = reqs[row.request].prompt_len;
        ids.push_back(p < P ? prompt_token(cfg.seed, row.request, 0, p, cfg.vocab) : out[row.request].at(p - P));
      }
    }
    std::vector<int32_t> tok(s.rows.size());
    stage->enqueue_forward_ragged(*lane, ids.data(), tok.data(), s.group, rs);
    lane->synchronize();
    for (size_t r = 0; r < s.rows.size(); ++r)
      if (s.rows[r].emits) out[s.rows[r].request].push_back(tok[r]);
  }
  return out;
}

/// The layout: one stage per rank, the model split uniformly.
void check_serving(const char* config, serving::StepPolicy policy, int max_batched_tokens = 2048) {
  const auto& mpi = test::mpi();
  auto m = model::load_model_config(std::string(PPB_SOURCE_DIR) + "/tests/data/" + config);
  auto device = create_cpu_device(1);
  auto transport = create_mpi_transport(mpi, {});
  const int S = mpi.size();
  std::vector<std::vector<int>> stage_ranks;
  for (int k = 0; k < S; ++k) stage_ranks.push_back({k});
  const StagePlacement place = layout_placement(stage_ranks, mpi.rank());
  const auto part = balance::solve_uniform(m.num_units(), S);
  const std::vector<serving::Request> reqs = scenario();
  ServingConfig cfg;
  cfg.scheduler.groups = 2;
  cfg.scheduler.slots = 2;
  cfg.scheduler.policy = policy;
  cfg.scheduler.max_batched_tokens = max_batched_tokens;
  cfg.seed = 91;
  cfg.vocab = m.vocab;
  StageConfig sc;
  sc.work.batch = cfg.scheduler.slots;
  sc.work.groups = cfg.scheduler.groups;
  sc.work.prompt_len = 9;  // the longest prompt
  sc.work.gen_len = 5;     // the longest output
  auto stage = device->create_stage(m, part.first_unit[place.stage], part.last_unit[place.stage], sc);

  const ServingRecord live = run_serving(*device, *transport, *stage, place, cfg, reqs);
  const ServingRecord replay = replay_serving(*device, *transport, *stage, place, cfg, reqs, live.schedule);
  EXPECT_EQ(live.events.size(), live.step_rows.size() * kNumEvents);
  if (place.stage != 0) return;
  // Stage 0 receives a step's token return only once the step's forward has ended (it polls for
  // nothing before it can come): its receive starts at or after its forward's end.
  for (size_t i = 0; S > 1 && i < live.step_rows.size(); ++i)
    EXPECT_GE(live.events[i * kNumEvents + kRecvStart], live.events[i * kNumEvents + kComputeEnd]) << "step " << i;

  ASSERT_EQ(live.tokens.size(), reqs.size());
  ASSERT_EQ(live.times.size(), reqs.size());
  for (size_t q = 0; q < reqs.size(); ++q) {
    EXPECT_EQ(static_cast<int>(live.tokens[q].size()), reqs[q].gen_len) << "request " << q;
    EXPECT_NO_THROW(serving::request_latency(live.times[q])) << "request " << q;
    EXPECT_GE(live.times[q].admitted_s, reqs[q].arrival_s);
    EXPECT_GE(live.group[q], 0);
    EXPECT_LT(live.group[q], cfg.scheduler.groups);
    EXPECT_GE(live.slot[q], 0);
    EXPECT_LT(live.slot[q], cfg.scheduler.slots);
  }
  // Each step's rows are distinct slots of its group; a request keeps its group and slot.
  for (const ScheduledStep& s : live.schedule) {
    std::vector<int> slots;
    for (const ScheduledRow& row : s.rows) {
      slots.push_back(row.slot);
      EXPECT_EQ(live.group[row.request], s.group);
      EXPECT_EQ(live.slot[row.request], row.slot);
    }
    std::sort(slots.begin(), slots.end());
    EXPECT_EQ(std::adjacent_find(slots.begin(), slots.end()), slots.end());
  }
  if (policy == serving::StepPolicy::vllm_v1) {  // every step within the budget; some prompts chunked
    int chunks = 0;
    for (const ScheduledStep& s : live.schedule) {
      int tokens = 0;
      for (const ScheduledRow& row : s.rows) {
        tokens += row.tokens;
        chunks += row.position > 0 && row.position < reqs[row.request].prompt_len ? 1 : 0;
      }
      EXPECT_LE(tokens, max_batched_tokens);
    }
    EXPECT_GT(chunks, 0);
  }
  EXPECT_EQ(replay.tokens, live.tokens) << "the serialized replay of the live schedule";
  const auto reference = sequential_tokens(*device, m, cfg, reqs, live.schedule, sc);
  EXPECT_EQ(reference, live.tokens) << "the same schedule on one stage of the whole model";
}

TEST(MpiServing, LiveRunEqualsItsReplayAndOneStageOfTheWholeModel) {
  check_serving("tiny-llama.json", serving::StepPolicy::mixed);
}

TEST(MpiServing, PrefillFirstStepsToo) { check_serving("tiny-llama.json", serving::StepPolicy::prefill_first); }

// vLLM V1 with chunked prefill under 4 tokens a step: the 9-, 8-, 7-, 6- and 5-token prompts
// span steps (chunks at positions > 0 through every stage), and still every token equals the
// replay's and the whole model's on one stage, bitwise.
TEST(MpiServing, ChunkedPrefillUnderATokenBudget) {
  check_serving("tiny-llama.json", serving::StepPolicy::vllm_v1, 4);
}

TEST(MpiServing, MixtureOfExperts) { check_serving("tiny-qwen3-moe.json", serving::StepPolicy::mixed); }

TEST(MpiServing, AloneScheduleRunsEachRequestByItself) {
  const auto reqs = scenario();
  const std::vector<ScheduledStep> s = alone_schedule(reqs, {1, 3});
  // request 1: one prefill (gen 1); request 3: prefill + 4 decodes.
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(s[0].rows[0].request, 1);
  EXPECT_EQ(s[0].rows[0].tokens, 3);
  EXPECT_EQ(s[1].rows[0].request, 3);
  EXPECT_EQ(s[1].rows[0].tokens, 2);
  for (int k = 1; k < 5; ++k) {
    EXPECT_EQ(s[1 + k].rows[0].position, 2 + k - 1);
    EXPECT_EQ(s[1 + k].rows[0].tokens, 1);
    EXPECT_EQ(s[1 + k].rows[0].slot, 0);
    EXPECT_EQ(s[1 + k].group, 0);
  }
}

}  // namespace
}  // namespace ppb
