// The CUDA stage's ragged forward (continuous batching, issue 37; CudaStage::enqueue_forward_ragged).
//
// Without a GPU: the host plan (cuda_ragged_plan.h) on hand-made and random steps: the checks
// name the bad row, every token lands in exactly one chunk, piece and sub-row with its own slot
// and position, the pieces respect the stage's bounds, the metadata fits ragged_meta_ints.
//
// With a GPU (skipped without one):
//  - rows = slots 0..B-1 in order, one pos and token count: enqueue_forward's bits (the stage
//    runs its uniform path); the same step with the slots reversed takes the ragged path:
//    f32 the same tokens, activations within stage_tol (below); bf16 the prefill's tokens;
//  - a ragged history (requests joining at different steps, each at its own positions, a slot
//    reused, a long prompt beside decodes) against each request run alone at B = 1 through
//    enqueue_forward, and against the CPU stage's ragged forward once that exists (its stage
//    throws "no ragged forward yet" today: that comparison is then reported as not run);
//  - a step of more tokens than the scratch's rows (chunks) against the uniform chunked prefill;
//  - bad steps throw InternalError; the ragged byte counts.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/cuda/cuda_ragged_plan.h"
#include "backend/device.h"
#include "backend/stage.h"
#include "common/error.h"
#include "cuda_stage_models.h"
#include "cuda_test_util.h"
#include "model/model_spec.h"

namespace {

using ppb::DType;
using ppb::RaggedStep;
using ppb::cuda::RaggedLimits;
using ppb::cuda::RaggedPiece;
using ppb::cuda::RaggedPlan;
using ppb::cuda::RaggedSubRow;
using ppb::model::ModelSpec;
using ppb_cuda_test::fvec;
using ppb_cuda_test::rel_err;
namespace cu = ppb::cuda;

RaggedStep make_step(std::vector<int32_t> slot, std::vector<int32_t> pos, std::vector<int32_t> tokens) {
  RaggedStep s;
  s.slot = std::move(slot);
  s.pos = std::move(pos);
  s.tokens = std::move(tokens);
  return s;
}

/// The InternalError message of check_ragged_step (B = 4, 20 positions), "" if it accepts.
std::string check_message(const RaggedStep& s) {
  try {
    cu::check_ragged_step(s, 4, 20);
  } catch (const ppb::InternalError& e) {
    return e.what();
  }
  return "";
}

// ---- the host plan (no GPU) ---------------------------------------------------------------------

TEST(CudaRaggedPlan, CheckNamesTheBadRow) {
  EXPECT_EQ(check_message(make_step({2, 0, 3}, {0, 17, 4}, {5, 1, 16})), "");
  const struct {
    RaggedStep step;
    const char* says;
  } bad[] = {
      {make_step({0, 1}, {0}, {1, 1}), "entries"},
      {make_step({}, {}, {}), "0 rows"},
      {make_step({0, 1, 2, 3, 0}, {0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}), "5 rows"},
      {make_step({0, 4}, {0, 0}, {1, 1}), "row 1 (slot 4"},
      {make_step({0, -1}, {0, 0}, {1, 1}), "row 1 (slot -1"},
      {make_step({3, 1, 3}, {0, 0, 2}, {1, 1, 1}), "row 2 (slot 3, pos 2, tokens 1): slot 3 is also row 0's"},
      {make_step({0, 1}, {0, 3}, {1, 0}), "row 1 (slot 1, pos 3, tokens 0): tokens must be >= 1"},
      {make_step({0, 1}, {-1, 3}, {1, 1}), "row 0 (slot 0, pos -1"},
      {make_step({0, 1}, {0, 15}, {1, 6}), "row 1 (slot 1, pos 15, tokens 6): positions"},
  };
  for (const auto& b : bad) {
    const std::string msg = check_message(b.step);
    EXPECT_NE(msg.find(b.says), std::string::npos) << "message: '" << msg << "', expected to hold '" << b.says << "'";
  }
}

/// A fake of attention_ragged's partials: more keys need more splits, as decode_plan's.
size_t fake_partials(int tokens, int keys) { return static_cast<size_t>(tokens) * ((keys + 15) / 16) * 10; }

/// Every invariant of a plan of `step` under `lim` (see cuda_ragged_plan.h).
void check_plan(const RaggedStep& step, const RaggedLimits& lim, const RaggedPlan& p, const std::string& what) {
  const int T = step.total_tokens();
  ASSERT_EQ(p.rows, step.rows()) << what;
  ASSERT_EQ(p.tokens, T) << what;
  EXPECT_LE(p.meta.size(), cu::ragged_meta_ints(lim.batch, static_cast<size_t>(T))) << what;
  // Per token its position, slot and row; per row its last token.
  int i = 0;
  for (int r = 0; r < step.rows(); ++r) {
    for (int t = 0; t < step.tokens[r]; ++t, ++i) {
      ASSERT_EQ(p.meta[p.token_pos + i], step.pos[r] + t) << what;
      ASSERT_EQ(p.meta[p.token_slot + i], step.slot[r]) << what;
      ASSERT_EQ(p.meta[p.token_row + i], r) << what;
    }
    ASSERT_EQ(p.meta[p.last + r], i - 1) << what;
  }
  // Chunks tile [0, T); pieces tile their chunk; sub-rows tile their piece, each token at its
  // own slot and position.
  int c_end = 0, next_piece = 0, next_sub = 0;
  for (const auto& c : p.chunks) {
    ASSERT_EQ(c.t0, c_end) << what;
    ASSERT_GE(c.tokens, 1) << what;
    ASSERT_LE(c.tokens, lim.chunk_tokens) << what;
    ASSERT_EQ(c.piece0, next_piece) << what;
    int p_end = c.t0;
    for (int k = c.piece0; k < c.piece0 + c.pieces; ++k) {
      const RaggedPiece& pc = p.pieces[k];
      ASSERT_EQ(pc.t0, p_end) << what;
      ASSERT_EQ(pc.sub0, next_sub) << what;
      int s_end = pc.t0, keys = 0;
      for (int j = pc.sub0; j < pc.sub0 + pc.subs; ++j) {
        const RaggedSubRow& s = p.subs[j];
        ASSERT_EQ(s.t0, s_end) << what;
        ASSERT_GE(s.n, 1) << what;
        ASSERT_EQ(s.slot, p.meta[p.token_slot + s.t0]) << what;
        ASSERT_EQ(s.pos, p.meta[p.token_pos + s.t0]) << what;
        ASSERT_EQ(p.meta[p.token_row + s.t0], p.meta[p.token_row + s.t0 + s.n - 1]) << what << ": one row per sub-row";
        if (!pc.prefill) {
          const int u = j - pc.sub0;
          EXPECT_EQ(p.meta[pc.meta_slot + u], s.slot) << what;
          EXPECT_EQ(p.meta[pc.meta_pos + u], s.pos) << what;
          EXPECT_EQ(p.meta[pc.meta_offset + u], s.t0 - pc.t0) << what;
          EXPECT_EQ(p.meta[pc.meta_offset + u + 1], s.t0 - pc.t0 + s.n) << what;
        }
        keys = std::max(keys, s.pos + s.n);
        s_end += s.n;
      }
      EXPECT_EQ(s_end, pc.t0 + pc.tokens) << what;
      EXPECT_EQ(pc.keys, keys) << what;
      if (pc.prefill) {
        EXPECT_EQ(pc.subs, 1) << what;
        EXPECT_GT(pc.tokens, lim.long_row_tokens) << what;
      } else {
        EXPECT_LE(pc.tokens, lim.max_piece_tokens) << what;
        if (lim.partial_floats) EXPECT_LE(lim.partial_floats(pc.tokens, pc.keys), lim.partial_capacity) << what;
        for (int j = pc.sub0; j < pc.sub0 + pc.subs; ++j)
          EXPECT_LE(p.subs[j].n, std::max(lim.long_row_tokens, 0) > 0 ? lim.long_row_tokens : T) << what;
      }
      next_sub += pc.subs;
      p_end += pc.tokens;
    }
    ASSERT_EQ(p_end, c.t0 + c.tokens) << what;
    next_piece += c.pieces;
    c_end += c.tokens;
  }
  EXPECT_EQ(c_end, T) << what;
  EXPECT_EQ(next_piece, static_cast<int>(p.pieces.size())) << what;
  EXPECT_EQ(next_sub, static_cast<int>(p.subs.size())) << what;
}

RaggedLimits small_limits() {
  RaggedLimits lim;
  lim.batch = 6;
  lim.max_context = 64;
  lim.chunk_tokens = 23;
  lim.long_row_tokens = 6;
  lim.max_piece_tokens = 9;
  lim.partial_floats = fake_partials;
  lim.partial_capacity = 400;  // 10 tokens at <= 16 keys, 2 at 64
  return lim;
}

TEST(CudaRaggedPlan, DecodeStepIsOnePiece) {
  RaggedLimits lim = small_limits();
  lim.partial_capacity = 100000;
  const RaggedStep s = make_step({4, 0, 5, 1}, {3, 17, 9, 0}, {1, 1, 1, 1});
  const RaggedPlan p = cu::plan_ragged_step(s, lim);
  check_plan(s, lim, p, "decode");
  ASSERT_EQ(p.chunks.size(), 1u);
  ASSERT_EQ(p.pieces.size(), 1u);
  EXPECT_FALSE(p.pieces[0].prefill);
  EXPECT_EQ(p.pieces[0].subs, 4);
  EXPECT_EQ(p.pieces[0].keys, 18);
}

TEST(CudaRaggedPlan, LongRowsChunksAndSplits) {
  const RaggedLimits lim = small_limits();
  // Tokens 0-29 a long prompt (chunk 0 holds 0-22: a prefill piece; chunk 1 its last 7: again
  // long), a decode at 40 and a 4-token prefill at 50: together 5 tokens at <= 54 keys (4 key
  // blocks), 5 x 4 x 10 = 200 floats <= 400: one ragged piece.
  const RaggedStep s = make_step({3, 0, 2}, {0, 40, 50}, {30, 1, 4});
  const RaggedPlan p = cu::plan_ragged_step(s, lim);
  check_plan(s, lim, p, "hand-made");
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].tokens, 23);
  ASSERT_EQ(p.chunks[0].pieces, 1);
  EXPECT_TRUE(p.pieces[0].prefill);
  EXPECT_EQ(p.pieces[0].tokens, 23);
  const RaggedPiece& tail = p.pieces[1];  // chunk 1: the prompt's last 7 tokens, long again
  EXPECT_TRUE(tail.prefill);
  EXPECT_EQ(p.subs[tail.sub0].pos, 23);
  EXPECT_EQ(tail.tokens, 7);
  ASSERT_EQ(p.chunks[1].pieces, 2);
  EXPECT_FALSE(p.pieces[2].prefill);
  EXPECT_EQ(p.pieces[2].subs, 2);
  EXPECT_EQ(p.pieces[2].keys, 54);
}

TEST(CudaRaggedPlan, SplitsARowWhosePartialsDoNotFitAndRefusesOneThatNeverFits) {
  RaggedLimits lim = small_limits();
  lim.long_row_tokens = 0;     // every row through attention_ragged
  lim.max_piece_tokens = 100;  // the partials alone bound the pieces
  // 12 tokens at 52..63: 4 key blocks -> 40 floats a token, 10 tokens a piece at most.
  const RaggedStep s = make_step({1}, {52}, {12});
  const RaggedPlan p = cu::plan_ragged_step(s, lim);
  check_plan(s, lim, p, "split");
  ASSERT_EQ(p.pieces.size(), 2u);
  EXPECT_EQ(p.pieces[0].tokens, 10);
  EXPECT_EQ(p.pieces[1].tokens, 2);
  EXPECT_EQ(p.subs[p.pieces[1].sub0].pos, 62);
  lim.partial_capacity = 5;  // not even one token
  EXPECT_THROW(cu::plan_ragged_step(s, lim), ppb::InternalError);
}

TEST(CudaRaggedPlan, RandomStepsKeepEveryInvariant) {
  std::mt19937 gen(1234);
  for (int trial = 0; trial < 500; ++trial) {
    RaggedLimits lim = small_limits();
    lim.chunk_tokens = 1 + static_cast<int>(gen() % 40);
    lim.long_row_tokens = static_cast<int>(gen() % 12);
    lim.max_piece_tokens = 1 + static_cast<int>(gen() % 16);
    if (trial % 3 == 0) lim.partial_floats = nullptr;
    std::vector<int32_t> slots{0, 1, 2, 3, 4, 5};
    std::shuffle(slots.begin(), slots.end(), gen);
    const int rows = 1 + static_cast<int>(gen() % 6);
    RaggedStep s;
    for (int r = 0; r < rows; ++r) {
      const int n = gen() % 3 == 0 ? 1 + static_cast<int>(gen() % 40) : 1;
      s.slot.push_back(slots[r]);
      s.pos.push_back(static_cast<int32_t>(gen() % (lim.max_context - n + 1)));
      s.tokens.push_back(n);
    }
    const RaggedPlan p = cu::plan_ragged_step(s, lim);
    check_plan(s, lim, p, "trial " + std::to_string(trial));
    if (HasFatalFailure()) return;
  }
}

// ---- the stage (GPU) ----------------------------------------------------------------------------

/// The tolerance of ‖ragged − uniform‖ / ‖uniform‖ over a whole stage's output activations:
/// cuda_test_util's per-kernel tolerances (the attention kernels differ: attention_ragged where
/// the uniform path runs attention_decode or attention_prefill, other splits of the keys, so
/// other fp32 sums and, in 16-bit types, other roundings of the attention output) times a few
/// for what the following layers carry of it (2-4 layers here).
double stage_tol(DType t) { return 5.0 * ppb_cuda_test::tol(t, 2e-5); }

/// fp32 copies of n device values of type t.
fvec device_floats(const void* p, size_t n, DType t) {
  cu::DeviceMemory tmp(std::max<size_t>(n, 1) * sizeof(float));
  cu::convert_to_f32(tmp.as<float>(), p, t, n, nullptr);
  fvec v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), tmp.get(), n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

ppb::StageConfig stage_config(DType t, int B, int P, int G) {
  ppb::StageConfig cfg;
  cfg.work.batch = B;
  cfg.work.prompt_len = P;
  cfg.work.gen_len = G;
  cfg.work.groups = 2;
  cfg.work.dtype = t;
  cfg.work.seed = 99;
  return cfg;
}

/// How a run feeds its steps to the stages.
enum class Feed { uniform, ragged_in_order, ragged_reversed_slots };

/// B sequences: a prefill of P tokens then `steps` decodes, each sequence feeding back its own
/// token, through a whole-model stage (tokens, checksum) and a stage without the head (its
/// output activations per step as fp32, fed the uniform run's tokens in every mode so that the
/// modes see the same inputs). `feed_tokens` (the uniform run's tokens) may be null: the body's
/// decode inputs are then this run's own tokens.
struct BatchRun {
  std::vector<int32_t> tokens;
  double checksum = 0.0;
  std::vector<fvec> acts;
};
BatchRun run_batch(ppb::Device& gpu, const ModelSpec& m, DType t, int B, int P, int steps, Feed feed,
              const std::vector<int32_t>* feed_tokens) {
  const ppb::StageConfig cfg = stage_config(t, B, P, steps);
  const int last = m.num_units() - 1;
  auto whole = gpu.create_stage(m, 0, last, cfg), body = gpu.create_stage(m, 0, last - 1, cfg);
  auto lane = gpu.create_lane("compute");
  auto in = gpu.allocate(static_cast<size_t>(B) * P * 4), body_in = gpu.allocate(static_cast<size_t>(B) * P * 4);
  auto out = gpu.allocate(static_cast<size_t>(B) * 4), acts = gpu.allocate(body->output_bytes(P));
  std::vector<int32_t> ids(static_cast<size_t>(B) * P);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % m.vocab);
  in->upload(ids.data(), ids.size() * 4);
  body_in->upload(ids.data(), ids.size() * 4);
  BatchRun run;
  for (int s = 0; s <= steps; ++s) {
    const int pos = s == 0 ? 0 : P + s - 1, T = s == 0 ? P : 1;
    if (feed == Feed::uniform) {
      whole->enqueue_forward(*lane, in->data(), out->data(), 1, pos, T);
      body->enqueue_forward(*lane, body_in->data(), acts->data(), 1, pos, T);
    } else {
      RaggedStep st;  // row b = sequence b (the uniform layout of the input and output)
      for (int b = 0; b < B; ++b) {
        st.slot.push_back(feed == Feed::ragged_in_order ? b : B - 1 - b);
        st.pos.push_back(pos);
        st.tokens.push_back(T);
      }
      whole->enqueue_forward_ragged(*lane, in->data(), out->data(), 1, st);
      body->enqueue_forward_ragged(*lane, body_in->data(), acts->data(), 1, st);
    }
    lane->synchronize();
    std::vector<int32_t> tok(B);
    out->download(tok.data(), tok.size() * 4);
    run.tokens.insert(run.tokens.end(), tok.begin(), tok.end());
    run.acts.push_back(device_floats(acts->data(), static_cast<size_t>(B) * T * m.hidden, t));
    in->upload(tok.data(), tok.size() * 4);
    const int32_t* next = feed_tokens ? feed_tokens->data() + static_cast<size_t>(s) * B : tok.data();
    body_in->upload(next, static_cast<size_t>(B) * 4);
  }
  run.checksum = whole->checksum();
  return run;
}

TEST(CudaStageRagged, SlotsInOrderAreTheUniformForwardAndReversedSlotsMatchIt) {
  REQUIRE_GPU();
  auto gpu = ppb::create_cuda_device(0);
  std::vector<std::pair<std::string, ModelSpec>> models = ppb_cuda_stage_test::stage_models();
  const size_t dense = models.size();
  for (auto& mm : ppb_cuda_stage_test::moe_models()) models.push_back(std::move(mm));
  const int B = 3, steps = 4;
  for (size_t k = 0; k < models.size(); ++k) {
    const auto& [name, m] = models[k];
    // MoE models in f32 only: a 16-bit rounding may flip a router's choice, and a token's
    // output with it (test_cuda_kernels.cpp's MoE test checks their 16-bit runs for determinism).
    for (DType t : k < dense ? std::vector<DType>{DType::f32, DType::bf16} : std::vector<DType>{DType::f32}) {
      for (int P : {9, 40}) {  // prompts through attention_ragged, and alone through attention_prefill
        const std::string what = name + " " + ppb::dtype_name(t) + " P " + std::to_string(P);
        const BatchRun uni = run_batch(*gpu, m, t, B, P, steps, Feed::uniform, nullptr);
        const BatchRun in_order = run_batch(*gpu, m, t, B, P, steps, Feed::ragged_in_order, &uni.tokens);
        EXPECT_EQ(in_order.tokens, uni.tokens) << what;
        EXPECT_EQ(in_order.checksum, uni.checksum) << what;
        EXPECT_EQ(in_order.acts, uni.acts) << what;
        const BatchRun rev = run_batch(*gpu, m, t, B, P, steps, Feed::ragged_reversed_slots, &uni.tokens);
        if (t == DType::f32) {
          EXPECT_EQ(rev.tokens, uni.tokens) << what;
          EXPECT_NEAR(rev.checksum, uni.checksum, 1e-4 * (1.0 + std::fabs(uni.checksum))) << what;
        } else {  // a near-tie may flip a later token (and every one after it): the prefill's must agree
          EXPECT_TRUE(std::equal(uni.tokens.begin(), uni.tokens.begin() + B, rev.tokens.begin())) << what;
        }
        for (size_t s = 0; s < uni.acts.size(); ++s)
          EXPECT_LT(rel_err(rev.acts[s], uni.acts[s]), stage_tol(t)) << what << " step " << s;
      }
    }
  }
}

/// One request of a history: its slot, the step it joins at, its prompt length and the tokens
/// it generates (the prefill's included: gen steps).
struct Request {
  int slot, join, prompt, gen;
};

std::vector<int32_t> prompt_of(size_t request, int len, int vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int i = 0; i < len; ++i) p[i] = static_cast<int32_t>((i * 31 + 7 * request + 3) % vocab);
  return p;
}

/// Per request: its tokens and (with a body stage, GPU) its activations, step by step.
struct History {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<fvec>> acts;
  double checksum = 0.0;
};

/// The history of `reqs` as ragged steps on `dev` (B = 4 slots, 64 positions), rows in the
/// order of `order` among the active requests. with_body: a stage without the head too, fed the
/// same ids (GPU: its activations as fp32). @throws what the stages throw.
History run_ragged_history(ppb::Device& dev, const ModelSpec& m, const std::vector<Request>& reqs,
                           const std::vector<size_t>& order, bool with_body) {
  const ppb::StageConfig cfg = stage_config(DType::f32, 4, 48, 16);
  const int last = m.num_units() - 1;
  auto whole = dev.create_stage(m, 0, last, cfg);
  auto body = with_body ? dev.create_stage(m, 0, last - 1, cfg) : nullptr;
  auto lane = dev.create_lane("compute");
  auto in = dev.allocate(4 * 64 * 4), out = dev.allocate(4 * 4);
  auto acts = with_body ? dev.allocate(body->ragged_output_bytes(4, 4 * 64)) : nullptr;
  History h;
  h.tokens.resize(reqs.size());
  h.acts.resize(reqs.size());
  for (int s = 0;; ++s) {
    RaggedStep st;
    std::vector<int32_t> ids;
    std::vector<size_t> row_req;
    for (size_t q : order) {
      const Request& r = reqs[q];
      if (s < r.join || s >= r.join + r.gen) continue;
      const bool prefill = s == r.join;
      const std::vector<int32_t> new_ids = prefill ? prompt_of(q, r.prompt, m.vocab) : std::vector<int32_t>{h.tokens[q].back()};
      st.slot.push_back(r.slot);
      st.pos.push_back(prefill ? 0 : r.prompt + (s - r.join) - 1);
      st.tokens.push_back(static_cast<int32_t>(new_ids.size()));
      ids.insert(ids.end(), new_ids.begin(), new_ids.end());
      row_req.push_back(q);
    }
    if (st.rows() == 0) break;
    in->upload(ids.data(), ids.size() * 4);
    whole->enqueue_forward_ragged(*lane, in->data(), out->data(), 1, st);
    if (body) body->enqueue_forward_ragged(*lane, in->data(), acts->data(), 1, st);
    lane->synchronize();
    std::vector<int32_t> tok(st.rows());
    out->download(tok.data(), tok.size() * 4);
    const fvec a = body ? device_floats(acts->data(), ids.size() * m.hidden, DType::f32) : fvec{};
    size_t off = 0;
    for (int r = 0; r < st.rows(); ++r) {
      h.tokens[row_req[r]].push_back(tok[r]);
      const size_t n = static_cast<size_t>(st.tokens[r]) * m.hidden;
      if (body) h.acts[row_req[r]].emplace_back(a.begin() + off, a.begin() + off + n);
      off += n;
    }
  }
  h.checksum = whole->checksum();
  return h;
}

/// Each request alone at B = 1 through enqueue_forward (prefill, then decodes feeding back its
/// own tokens): its tokens and the activations of a stage without the head.
History run_alone(ppb::Device& gpu, const ModelSpec& m, const std::vector<Request>& reqs) {
  const ppb::StageConfig cfg = stage_config(DType::f32, 1, 48, 16);
  const int last = m.num_units() - 1;
  History h;
  for (size_t q = 0; q < reqs.size(); ++q) {
    auto whole = gpu.create_stage(m, 0, last, cfg), body = gpu.create_stage(m, 0, last - 1, cfg);
    auto lane = gpu.create_lane("compute");
    auto in = gpu.allocate(64 * 4), out = gpu.allocate(4), acts = gpu.allocate(body->output_bytes(64));
    std::vector<int32_t> ids = prompt_of(q, reqs[q].prompt, m.vocab), toks;
    std::vector<fvec> a;
    for (int k = 0; k < reqs[q].gen; ++k) {
      const int pos = k == 0 ? 0 : reqs[q].prompt + k - 1, T = static_cast<int>(ids.size());
      in->upload(ids.data(), ids.size() * 4);
      whole->enqueue_forward(*lane, in->data(), out->data(), 1, pos, T);
      body->enqueue_forward(*lane, in->data(), acts->data(), 1, pos, T);
      lane->synchronize();
      int32_t tok = 0;
      out->download(&tok, 4);
      toks.push_back(tok);
      a.push_back(device_floats(acts->data(), static_cast<size_t>(T) * m.hidden, DType::f32));
      ids = {tok};
    }
    h.tokens.push_back(toks);
    h.acts.push_back(a);
  }
  return h;
}

TEST(CudaStageRagged, HistoryMatchesEachRequestAloneAndTheCpuStage) {
  REQUIRE_GPU();
  auto gpu = ppb::create_cuda_device(0);
  auto cpu_dev = ppb::create_cpu_device(1);
  // Slot 2: A, then D once A is done (steps 6-9). Step 1: C's and B's prefills (B's 40 tokens
  // alone through attention_prefill) beside A's decode; E's one-token prompt at step 2.
  const std::vector<Request> reqs{
      {2, 0, 5, 6},   // A
      {0, 1, 40, 3},  // B
      {3, 1, 3, 5},   // C
      {2, 6, 7, 4},   // D
      {1, 2, 1, 8},   // E
  };
  const std::vector<size_t> order{2, 4, 0, 3, 1};  // rows never in slot order
  std::vector<std::pair<std::string, ModelSpec>> models = ppb_cuda_stage_test::stage_models();
  for (auto& mm : ppb_cuda_stage_test::moe_models()) models.push_back(std::move(mm));
  for (const auto& [name, m] : models) {
    const History ragged = run_ragged_history(*gpu, m, reqs, order, true);
    const History alone = run_alone(*gpu, m, reqs);
    for (size_t q = 0; q < reqs.size(); ++q) {
      const std::string what = name + " request " + std::to_string(q);
      EXPECT_EQ(ragged.tokens[q], alone.tokens[q]) << what;
      ASSERT_EQ(ragged.acts[q].size(), alone.acts[q].size()) << what;
      for (size_t k = 0; k < alone.acts[q].size(); ++k)
        EXPECT_LT(rel_err(ragged.acts[q][k], alone.acts[q][k]), stage_tol(DType::f32)) << what << " step " << k;
    }
    // The CPU twin, once its stage has a ragged forward (another branch builds it).
    History cpu;
    try {
      cpu = run_ragged_history(*cpu_dev, m, reqs, order, false);
    } catch (const ppb::InternalError& e) {
      if (std::string(e.what()).find("no ragged forward") == std::string::npos) throw;
      std::printf("%s: the CPU stage has no ragged forward yet: CPU twin comparison not run\n", name.c_str());
      continue;
    }
    EXPECT_EQ(ragged.tokens, cpu.tokens) << name << " vs the CPU stage";
    EXPECT_NEAR(ragged.checksum, cpu.checksum, 1e-4 * (1.0 + std::fabs(cpu.checksum))) << name << " vs the CPU stage";
  }
}

/// 2 x 2100 prompt tokens > the stage's 4,096 scratch rows: the ragged step runs in two chunks
/// (the second holds the end of the second prompt), the uniform forward sequence by sequence.
TEST(CudaStageRagged, StepLongerThanTheScratchRunsInChunks) {
  REQUIRE_GPU();
  auto gpu = ppb::create_cuda_device(0);
  const ModelSpec m = ppb_cuda_stage_test::stage_models()[0].second;
  const int B = 2, P = 2100;
  const ppb::StageConfig cfg = stage_config(DType::f32, B, P, 1);
  std::vector<int32_t> ids(static_cast<size_t>(B) * P);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 13 + 1) % m.vocab);
  auto lane = gpu->create_lane("c");
  auto in = gpu->allocate(ids.size() * 4), out_u = gpu->allocate(8), out_r = gpu->allocate(8);
  in->upload(ids.data(), ids.size() * 4);
  auto uniform = gpu->create_stage(m, 0, m.num_units() - 1, cfg), ragged = gpu->create_stage(m, 0, m.num_units() - 1, cfg);
  std::vector<int32_t> a(B), b(B);
  uniform->enqueue_forward(*lane, in->data(), out_u->data(), 0, 0, P);
  ragged->enqueue_forward_ragged(*lane, in->data(), out_r->data(), 0, make_step({1, 0}, {0, 0}, {P, P}));
  lane->synchronize();
  out_u->download(a.data(), 8);
  out_r->download(b.data(), 8);
  EXPECT_EQ(a, b);
  // A decode step each, on the caches the chunks wrote.
  uniform->enqueue_forward(*lane, out_u->data(), out_u->data(), 0, P, 1);
  ragged->enqueue_forward_ragged(*lane, out_r->data(), out_r->data(), 0, make_step({1, 0}, {P, P}, {1, 1}));
  lane->synchronize();
  out_u->download(a.data(), 8);
  out_r->download(b.data(), 8);
  EXPECT_EQ(a, b);
  EXPECT_NEAR(ragged->checksum(), uniform->checksum(), 1e-4 * (1.0 + std::fabs(uniform->checksum())));
}

TEST(CudaStageRagged, BadStepsThrowAndByteCounts) {
  REQUIRE_GPU();
  auto gpu = ppb::create_cuda_device(0);
  const ModelSpec m = ppb_cuda_stage_test::stage_models()[0].second;
  const ppb::StageConfig cfg = stage_config(DType::bf16, 4, 12, 8);  // 20 positions
  auto whole = gpu->create_stage(m, 0, m.num_units() - 1, cfg), body = gpu->create_stage(m, 0, m.num_units() - 2, cfg);
  EXPECT_EQ(whole->ragged_input_bytes(7), 7u * 4);
  EXPECT_EQ(whole->ragged_output_bytes(3, 7), 3u * 4);
  EXPECT_EQ(body->ragged_output_bytes(3, 7), 7u * 64 * 2);
  auto body2 = gpu->create_stage(m, 1, m.num_units() - 1, cfg);
  EXPECT_EQ(body2->ragged_input_bytes(7), 7u * 64 * 2);
  auto lane = gpu->create_lane("c");
  auto in = gpu->allocate(4 * 20 * 4), out = gpu->allocate(16);
  const RaggedStep bad[] = {
      make_step({0, 1, 2, 3, 0}, {0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}),  // rows > B
      make_step({0, 4}, {0, 0}, {1, 1}),                             // slot out of range
      make_step({1, 1}, {0, 3}, {1, 1}),                             // a slot twice
      make_step({0, 1}, {0, 3}, {1, 0}),                             // no token
      make_step({0, 1}, {0, 15}, {1, 6}),                            // past max_context
      make_step({0}, {-1}, {1}),                                     // negative pos
  };
  for (const RaggedStep& s : bad)
    EXPECT_THROW(whole->enqueue_forward_ragged(*lane, in->data(), out->data(), 0, s), ppb::InternalError);
  EXPECT_THROW(whole->enqueue_forward_ragged(*lane, in->data(), out->data(), 2, make_step({0}, {0}, {1})),
               ppb::InternalError);  // group 2 of 2
  lane->synchronize();
  EXPECT_NO_THROW(whole->checksum());  // nothing was enqueued, nothing flagged
}

}  // namespace
