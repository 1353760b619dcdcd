// The CPU stage's ragged forward (StageExecutor::enqueue_forward_ragged, continuous batching of
// issue 37) on the tiny configs of tests/data:
//  - a ragged step whose rows are slots 0..B-1 at one pos and T is bitwise enqueue_forward
//    (one body: the uniform forward is that step), over a prefill and decodes, so the KV cache too;
//  - a history of requests that join, decode at their own positions, finish and free their slot,
//    against each request run alone on a B = 1 stage: equal up to the rounding of two fp32
//    evaluations of the same layers (the GEMMs see another M, OpenBLAS another blocking), the
//    bound derived in fp_bounds.h's way;
//  - a demand-paged KV store under a scheduler's pool (StageConfig::kv_pool_tokens) that
//    preempts: the whole store's bits, and never more resident than the pool's bound;
//  - the steps a stage refuses, before it enqueues anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_lane.h"
#include "backend/cpu/cpu_stage.h"
#include "backend/lane.h"
#include "backend/stage.h"
#include "backend/tensor_parallel.h"
#include "backend/weights.h"
#include "common/error.h"
#include "fp_bounds.h"
#include "model/model_spec.h"
#include "serving/scheduler.h"
#include "sync_lane.h"

namespace {

using ppb::RaggedStep;
using ppb::StageExecutor;
using ppb::model::ModelSpec;
using ids = std::vector<int32_t>;
using ppb::test::SyncLane;
using bytes = std::vector<char>;

ModelSpec tiny(const std::string& name) {
  return ppb::model::load_model_config(std::string(PPB_SOURCE_DIR "/tests/data/") + name + ".json");
}

/// tiny-llama, a MoE (Qwen3-MoE: a dense first layer; Mixtral), MLA + MoE (DeepSeek-V3; with its
/// MTP module too), Gemma-3 (sliding window 8, sandwich norms, (1 + w) norms), gpt-oss (sinks,
/// biases, alternating windows).
std::vector<std::pair<std::string, ModelSpec>> models() {
  std::vector<std::pair<std::string, ModelSpec>> ms;
  for (const char* n : {"tiny-llama", "tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v3", "tiny-gemma3", "tiny-gpt-oss"})
    ms.emplace_back(n, tiny(n));
  ModelSpec mtp = tiny("tiny-deepseek-v3");
  ppb::model::enable_mtp(mtp);
  ms.emplace_back("tiny-deepseek-v3+mtp", mtp);
  return ms;
}

ppb::StageConfig config(int batch, int prompt_len, int gen_len, int groups) {
  ppb::StageConfig c;
  c.work.batch = batch;
  c.work.prompt_len = prompt_len;
  c.work.gen_len = gen_len;
  c.work.groups = groups;
  c.work.seed = 77;
  return c;
}

ids random_ids(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  ids v(n);
  for (int32_t& x : v) x = d(gen);
  return v;
}

bytes random_activations(size_t floats, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  bytes b(floats * sizeof(float));
  for (size_t i = 0; i < floats; ++i) {
    const float x = d(gen);
    std::memcpy(b.data() + i * sizeof(float), &x, sizeof(float));
  }
  return b;
}

/// The ragged step of a uniform forward: rows = slots 0..B-1, each at `pos` with T tokens.
RaggedStep uniform_step(int B, int pos, int T) {
  RaggedStep s;
  for (int b = 0; b < B; ++b) {
    s.slot.push_back(b);
    s.pos.push_back(pos);
    s.tokens.push_back(T);
  }
  return s;
}

template <class T>
bytes as_bytes(const std::vector<T>& v) {
  bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// ---- 1. a uniform step as a ragged one: bitwise ------------------------------------------------

/// Stage [first, last] of m twice: one by enqueue_forward(group 1, pos, T), one by the ragged
/// step of the same rows; a prefill of P then G decodes (the head's tokens fed back where the
/// stage holds embed and head, fresh ids or activations otherwise).
void expect_uniform_ragged_bitwise(const ModelSpec& m, int first, int last, const ppb::StageConfig& cfg,
                                   ppb::Lane& lane) {
  const int B = cfg.work.batch, P = cfg.work.prompt_len, G = cfg.work.gen_len, H = m.hidden;
  auto a = ppb::create_cpu_stage(m, first, last, cfg);
  auto b = ppb::create_cpu_stage(m, first, last, cfg);
  const bool embed = first == 0, head = last == m.num_units() - 1;
  bytes fed_back;
  for (int step = 0; step <= G; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int pos = step == 0 ? 0 : P + step - 1, T = step == 0 ? P : 1;
    const size_t n = static_cast<size_t>(B) * T;
    const uint32_t seed = 100 + step;
    const bytes in = embed ? (!fed_back.empty() ? fed_back : as_bytes(random_ids(n, m.vocab, seed)))
                           : random_activations(n * H, seed);
    ASSERT_EQ(a->input_bytes(T), in.size());
    ASSERT_EQ(b->ragged_input_bytes(static_cast<int>(n)), in.size());
    ASSERT_EQ(a->output_bytes(T), b->ragged_output_bytes(B, static_cast<int>(n)));
    bytes out_a(a->output_bytes(T), 1), out_b(out_a.size(), 2);
    a->enqueue_forward(lane, in.data(), out_a.data(), 1, pos, T);
    b->enqueue_forward_ragged(lane, in.data(), out_b.data(), 1, uniform_step(B, pos, T));
    lane.synchronize();
    EXPECT_EQ(0, std::memcmp(out_a.data(), out_b.data(), out_a.size()));
    if (embed && head) fed_back = out_a;
  }
  EXPECT_EQ(a->checksum(), b->checksum());  // the same doubles summed in the same order
  EXPECT_EQ(a->expert_tokens(), b->expert_tokens());
}

/// Every model, as four stages: ids -> activations, activations -> ids, ids -> ids (the whole
/// model) and activations -> activations. B = 3, P = 6: the prefill's 18 token rows take the
/// GEMM library's path, the decodes' 3 the small-M kernel's (kSmallM = 16).
TEST(CpuStageRagged, UniformStepIsBitwiseEnqueueForward) {
  const ppb::StageConfig cfg = config(3, 6, 4, 2);
  SyncLane lane;
  for (const auto& [name, m] : models()) {
    const int U = m.num_units();
    for (auto [first, last] : {std::pair{0, U - 2}, {1, U - 1}, {0, U - 1}, {1, U - 2}}) {
      SCOPED_TRACE(name + " units [" + std::to_string(first) + ", " + std::to_string(last) + "]");
      expect_uniform_ragged_bitwise(m, first, last, cfg, lane);
    }
  }
}

/// The same on tensor-parallel shards of width 2 (each rank's pair of stages on its thread; the
/// vocabulary-parallel head's arg-max across the ranks).
TEST(CpuStageRagged, UniformStepIsBitwiseEnqueueForwardAtWidthTwo) {
  const ModelSpec m = tiny("tiny-llama");
  ASSERT_TRUE(ppb::tp_unsupported_reason(m, 2).empty());
  ppb::ThreadTpGroups groups(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ppb::StageConfig c = config(3, 5, 4, 2);
      c.tp_width = 2;
      c.tp_rank = r;
      c.tp = &groups.group(r);
      SyncLane lane;
      expect_uniform_ragged_bitwise(m, 0, m.num_units() - 1, c, lane);
    });
  }
  for (auto& t : threads) t.join();
}

/// The step is the task's own copy: the caller's object is overwritten before the lane runs it.
TEST(CpuStageRagged, TheStepIsCopied) {
  const ModelSpec m = tiny("tiny-llama");
  const ppb::StageConfig cfg = config(3, 5, 4, 1);
  ppb::CpuLane lane("ragged");
  SyncLane sync;
  auto a = ppb::create_cpu_stage(m, 0, m.num_units() - 1, cfg);
  auto b = ppb::create_cpu_stage(m, 0, m.num_units() - 1, cfg);
  const ids in = random_ids(15, m.vocab, 3);
  ids out_a(3), out_b(3, -1);
  a->enqueue_forward(sync, in.data(), out_a.data(), 0, 0, 5);
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  lane.host_task([started] { started.wait(); });  // the lane waits until the step is gone
  {
    auto step = std::make_unique<RaggedStep>(uniform_step(3, 0, 5));
    b->enqueue_forward_ragged(lane, in.data(), out_b.data(), 0, *step);
    *step = RaggedStep{{9, 9}, {99, 99}, {0, 0}};
  }
  go.set_value();
  lane.synchronize();
  EXPECT_EQ(out_a, out_b);
}

// ---- 2. requests that join and leave, against each alone --------------------------------------

/// One request: its slot in the batched stage, and its token ids at positions 0, 1, ...
struct Request {
  int32_t slot;
  ids tokens;
};
/// A row of a step: request `req` at `pos` with `n` new tokens.
struct Row {
  int req, pos, n;
};

/// B = 3 slots, max_context 16. A (slot 1) prefills 6 alone; B (slot 0) and C (slot 2) join with
/// prompts of 8 and 9 while A decodes (18 tokens: more than kSmallM = 16, so the batched step's
/// linears go to the GEMM library while each request alone stays on the small-M kernel); all
/// decode at their own positions, rows out of slot order; A leaves and D takes its slot (A's
/// stale positions 5..7 must not be read by D's prefill); C decodes alone past Gemma-3's window
/// of 8, up to the last position of the cache.
std::vector<std::vector<Row>> history() {
  const int A = 0, Bq = 1, C = 2, D = 3;
  return {{{A, 0, 6}},
          {{A, 6, 1}, {Bq, 0, 8}, {C, 0, 9}},
          {{C, 9, 1}, {A, 7, 1}, {Bq, 8, 1}},
          {{Bq, 9, 1}, {D, 0, 5}, {C, 10, 1}},
          {{D, 5, 1}, {Bq, 10, 1}, {C, 11, 1}},
          {{C, 12, 1}, {D, 6, 1}, {Bq, 11, 1}},
          {{C, 13, 1}},
          {{C, 14, 1}},
          {{C, 15, 1}, {D, 7, 1}}};
}

/// The history's stages: B slots, max_context P + G = 16 (its last position is 15), 2 groups.
constexpr int kHistoryContext = 16;
ppb::StageConfig history_config(int B) { return config(B, 10, kHistoryContext - 10, 2); }

std::vector<Request> requests(int vocab) {
  std::vector<Request> rs;
  const int32_t slots[] = {1, 0, 2, 1};
  for (int i = 0; i < 4; ++i) rs.push_back({slots[i], random_ids(kHistoryContext, vocab, 40 + i)});
  return rs;
}

/// The step of `rows` (slots from `slot_of(req)`) and its packed token ids.
std::pair<RaggedStep, ids> step_of(const std::vector<Row>& rows, const std::vector<Request>& reqs,
                                   const std::function<int32_t(int)>& slot_of) {
  RaggedStep s;
  ids in;
  for (const Row& r : rows) {
    s.slot.push_back(slot_of(r.req));
    s.pos.push_back(r.pos);
    s.tokens.push_back(r.n);
    const ids& t = reqs[r.req].tokens;
    in.insert(in.end(), t.begin() + r.pos, t.begin() + r.pos + r.n);
  }
  return {s, in};
}

/// Outputs of stage [0, last] of every step of the history: batched [step] (B = 3, group 1 of 2),
/// and alone [step][row] (each request on its own B = 1 stage, one-row steps in slot 0).
struct HistoryOutputs {
  std::vector<bytes> batched;
  std::vector<std::vector<bytes>> alone;
};

HistoryOutputs run_history(const ModelSpec& m, int last, const std::vector<Request>& reqs,
                           const std::function<ppb::StageConfig(int)>& cfg_of) {
  SyncLane lane;
  HistoryOutputs o;
  auto batched = ppb::create_cpu_stage(m, 0, last, cfg_of(3));
  std::vector<std::unique_ptr<StageExecutor>> alone;
  for (size_t i = 0; i < reqs.size(); ++i) alone.push_back(ppb::create_cpu_stage(m, 0, last, cfg_of(1)));
  for (const std::vector<Row>& rows : history()) {
    auto [step, in] = step_of(rows, reqs, [&](int q) { return reqs[q].slot; });
    o.batched.emplace_back(batched->ragged_output_bytes(step.rows(), step.total_tokens()));
    EXPECT_EQ(batched->ragged_input_bytes(step.total_tokens()), in.size() * sizeof(int32_t));
    batched->enqueue_forward_ragged(lane, in.data(), o.batched.back().data(), 1, step);
    o.alone.emplace_back();
    for (const Row& r : rows) {
      auto [one, one_in] = step_of({r}, reqs, [](int) { return 0; });
      o.alone.back().emplace_back(alone[r.req]->ragged_output_bytes(1, r.n));
      alone[r.req]->enqueue_forward_ragged(lane, one_in.data(), o.alone.back().back().data(), 1, one);
    }
  }
  return o;
}

const float* floats(const bytes& b, size_t token, int H) {
  return reinterpret_cast<const float*>(b.data()) + token * H;
}

double rel_err(const float* out, const float* ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

/// The head of m in double on one fp32 hidden state h [H]: logits [V] (final norm, lm_head, the
/// final softcap) and, per token j, the bound of the stage's own rounding of logit j.
struct HeadRef {
  std::vector<double> logits, rounding;
};

HeadRef head_ref(const ModelSpec& m, uint64_t seed, const float* h) {
  const int H = m.hidden, V = m.vocab, u = m.num_units() - 1;
  std::vector<float> g(H), w(static_cast<size_t>(V) * H);
  ppb::fill_norm(g.data(), H, seed, u, ppb::Tensor::final_norm, m.final_norm_plus_one);
  if (m.tie_embeddings) {
    ppb::fill_embedding(w.data(), V, H, seed);
  } else {
    ppb::fill_projection_rows(w.data(), 0, V, H, seed, u, ppb::Tensor::lm_head);
  }
  double ms = 0.0;
  for (int i = 0; i < H; ++i) ms += static_cast<double>(h[i]) * h[i];
  const double inv = 1.0 / std::sqrt(ms / H + m.rms_eps);
  std::vector<double> n(H);
  for (int i = 0; i < H; ++i) n[i] = h[i] * inv * (m.final_norm_plus_one ? 1.0 + g[i] : g[i]);
  const double n_norm = std::sqrt(std::inner_product(n.begin(), n.end(), n.begin(), 0.0));
  // The stage's logit j: the norm (a reduction of H terms: relative error of n) then a dot
  // product of H terms, |fl(w.n) - w.n| <= gamma_H sum|w_i n_i| <= gamma_H |w_j| |n| (Higham
  // 3.5, Cauchy-Schwarz); the softcap is 1-Lipschitz, plus its tanh's few ulps.
  const double rel = ppb::test::chain_bound_f32({H}) + ppb::test::gamma_f32(H);
  HeadRef r;
  for (int j = 0; j < V; ++j) {
    double z = 0.0, wn = 0.0;
    for (int i = 0; i < H; ++i) {
      z += w[static_cast<size_t>(j) * H + i] * n[i];
      wn += static_cast<double>(w[static_cast<size_t>(j) * H + i]) * w[static_cast<size_t>(j) * H + i];
    }
    double err = rel * std::sqrt(wn) * n_norm;
    if (m.final_softcap > 0) {
      z = m.final_softcap * std::tanh(z / m.final_softcap);
      err += ppb::test::kElementwiseUlps * ppb::test::kF32UnitRoundoff * m.final_softcap;
    }
    r.logits.push_back(z);
    r.rounding.push_back(err);
  }
  return r;
}

/// Two stages' greedy tokens a and b of hidden states ha and hb: equal, or a tie within what
/// their roundings allow. Stage X's token x maximises its fp32 logits, each within rounding_j
/// of the exact logits of hx; so z^a_a + rho_a >= z^a_b - rho_b and z^b_b + rho_b >= z^b_a - rho_a,
/// hence |z^a_a - z^a_b| <= rho_a + rho_b + |z^a_a - z^b_a| + |z^a_b - z^b_b| (Δ measured in
/// double from both hidden states).
/// Returns whether they differ.
bool expect_same_token(int32_t a, int32_t b, const HeadRef& ra, const HeadRef& rb) {
  if (a == b) return false;
  const int V = static_cast<int>(ra.logits.size());
  EXPECT_TRUE(a >= 0 && a < V && b >= 0 && b < V) << a << ", " << b;
  if (a < 0 || a >= V || b < 0 || b >= V) return true;
  const double gap = std::fabs(ra.logits[a] - ra.logits[b]);
  const double allowed = std::max(ra.rounding[a], rb.rounding[a]) + std::max(ra.rounding[b], rb.rounding[b]) +
                         std::fabs(ra.logits[a] - rb.logits[a]) + std::fabs(ra.logits[b] - rb.logits[b]);
  EXPECT_LE(gap, allowed) << "tokens " << a << " and " << b << " are no near-tie";
  return true;
}

/// Every row of every step against its request alone: the hidden states of a stage of embed
/// and every layer (each row's new tokens) and the whole model's tokens.
///
/// Tolerance: both are fp32 evaluations of the same exact layers with another summation order
/// (another M per GEMM: OpenBLAS may block it otherwise; the attention is the same code per
/// row), each within model_bound_f32(m, context) of the exact hidden state (fp_bounds.h: the
/// chain of reductions of every layer, context = the row's last position + 1), so they differ
/// by at most twice that, normwise over the row's tokens. Tokens: expect_same_token.
TEST(CpuStageRagged, RowsMatchEachRequestAlone) {
  for (const auto& [name, m] : models()) {
    SCOPED_TRACE(name);
    const int U = m.num_units(), H = m.hidden;
    const std::vector<Request> reqs = requests(m.vocab);
    const HistoryOutputs body = run_history(m, U - 2, reqs, history_config);
    const HistoryOutputs whole = run_history(m, U - 1, reqs, history_config);
    const std::vector<std::vector<Row>> steps = history();
    double worst = 0.0;
    int ties = 0;  // tokens that differ within a near-tie
    for (size_t s = 0; s < steps.size(); ++s) {
      size_t offset = 0;
      for (size_t r = 0; r < steps[s].size(); ++r) {
        const Row& row = steps[s][r];
        SCOPED_TRACE("step " + std::to_string(s) + " row " + std::to_string(r));
        const float* got = floats(body.batched[s], offset, H);
        const float* ref = floats(body.alone[s][r], 0, H);
        const double e = rel_err(got, ref, static_cast<size_t>(row.n) * H);
        const double bound = 2.0 * ppb::test::model_bound_f32(m, row.pos + row.n);
        EXPECT_LT(e, bound);
        worst = std::max(worst, e / bound);
        int32_t tok_batched, tok_alone;
        std::memcpy(&tok_batched, whole.batched[s].data() + r * sizeof(int32_t), sizeof(int32_t));
        std::memcpy(&tok_alone, whole.alone[s][r].data(), sizeof(int32_t));
        // The head reads the row's last token: the batched token is the exact head's of that
        // hidden state (up to the head's rounding), and the request's alone.
        const HeadRef head = head_ref(m, 77, floats(body.batched[s], offset + row.n - 1, H));
        const auto best = std::max_element(head.logits.begin(), head.logits.end()) - head.logits.begin();
        ties += expect_same_token(tok_batched, static_cast<int32_t>(best), head, head);
        ties += expect_same_token(tok_batched, tok_alone, head, head_ref(m, 77, floats(body.alone[s][r], row.n - 1, H)));
        offset += row.n;
      }
    }
    std::printf("%s: largest hidden-state difference / bound = %.3g; near-ties %d\n", name.c_str(), worst, ties);
  }
}

/// The history's batched steps on tensor-parallel shards of width 2 (rows < B go through the
/// vocabulary-parallel head's arg-max too): both ranks give the same tokens, and they are width
/// 1's or a near-tie; the hidden states differ from width 1's by the order of the o_proj and
/// down_proj sums only, each within model_bound_f32 of the exact ones, so by twice that.
TEST(CpuStageRagged, StepsAtWidthTwoGiveWidthOnesTokens) {
  for (const char* name : {"tiny-llama", "tiny-gemma3"}) {
    SCOPED_TRACE(name);
    const ModelSpec m = tiny(name);
    ASSERT_TRUE(ppb::tp_unsupported_reason(m, 2).empty());
    const int U = m.num_units(), H = m.hidden;
    const std::vector<Request> reqs = requests(m.vocab);
    const HistoryOutputs body_1 = run_history(m, U - 2, reqs, history_config);
    const HistoryOutputs whole_1 = run_history(m, U - 1, reqs, history_config);
    std::vector<HistoryOutputs> body(2), whole(2);
    ppb::ThreadTpGroups groups(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        const auto shard_of = [&](int B) {
          ppb::StageConfig c = history_config(B);
          c.tp_width = 2;
          c.tp_rank = r;
          c.tp = &groups.group(r);
          return c;
        };
        body[r] = run_history(m, U - 2, reqs, shard_of);
        whole[r] = run_history(m, U - 1, reqs, shard_of);
      });
    }
    for (auto& t : threads) t.join();
    const std::vector<std::vector<Row>> steps = history();
    for (size_t s = 0; s < steps.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      EXPECT_EQ(whole[0].batched[s], whole[1].batched[s]);
      const size_t n = body_1.batched[s].size() / sizeof(float);
      EXPECT_LT(rel_err(floats(body[0].batched[s], 0, H), floats(body_1.batched[s], 0, H), n),
                2.0 * ppb::test::model_bound_f32(m, kHistoryContext));
      size_t offset = 0;
      for (size_t r = 0; r < steps[s].size(); ++r) {
        offset += steps[s][r].n;
        int32_t tok_tp, tok_1;
        std::memcpy(&tok_tp, whole[0].batched[s].data() + r * sizeof(int32_t), sizeof(int32_t));
        std::memcpy(&tok_1, whole_1.batched[s].data() + r * sizeof(int32_t), sizeof(int32_t));
        expect_same_token(tok_tp, tok_1, head_ref(m, 77, floats(body[0].batched[s], offset - 1, H)),
                          head_ref(m, 77, floats(body_1.batched[s], offset - 1, H)));
      }
    }
  }
}

// ---- 3. a demand-paged KV store ---------------------------------------------------------------

/// vllm-v1 chunks under a KV pool that preempts (6 slots of up to 700 positions; a pool of 160
/// blocks of 8 tokens, a quarter of them) drive two stages of the body (embed .. last layer) of m: one whose store
/// holds every slot (kv_pool_tokens 0), one demand-paged under the pool, each step's released
/// slots given back before its rows. Every step's activations are bitwise the whole store's (a
/// released slot's pages read as zeros, and its next request writes each position before it
/// reads it), and after every step the paged store's resident bytes are within cpu_stage_bytes'
/// kv_cache for the pool, which is below what the slots' positions would hold without the
/// releases (so the test fails if a release is lost).
TEST(CpuStageRagged, PagedStoreHoldsThePoolAndGivesTheWholeStoresBits) {
  for (const char* name : {"tiny-llama", "tiny-deepseek-v3", "tiny-gemma3"}) {
    SCOPED_TRACE(name);
    const ModelSpec m = tiny(name);
    const int last = m.num_units() - 2, H = m.hidden;
    ppb::serving::SchedulerConfig sc;
    sc.slots = 6;
    sc.policy = ppb::serving::StepPolicy::vllm_v1;
    sc.max_batched_tokens = 128;
    sc.kv_block_size = 8;
    sc.kv_blocks = 160;
    std::vector<ppb::serving::Request> reqs;
    std::mt19937 gen(11);
    for (int q = 0; q < 24; ++q)
      reqs.push_back({0.0, std::uniform_int_distribution<int>(100, 600)(gen), std::uniform_int_distribution<int>(2, 60)(gen)});
    const ppb::StageConfig whole_cfg = config(sc.slots, 600, 100, 1);
    ppb::StageConfig paged_cfg = whole_cfg;
    paged_cfg.kv_pool_tokens = int64_t(sc.kv_blocks) * sc.kv_block_size;
    auto whole = ppb::create_cpu_stage(m, 0, last, whole_cfg);
    auto paged = ppb::create_cpu_stage(m, 0, last, paged_cfg);
    const ppb::StageBytes b = ppb::cpu_stage_bytes(m, 0, last, paged_cfg);
    ASSERT_TRUE(b.kv_paged);
    ASSERT_LT(b.kv_cache, ppb::cpu_stage_bytes(m, 0, last, whole_cfg).kv_cache / 2);
    EXPECT_EQ(paged->kv_resident_bytes(), 0u);
    SyncLane lane;
    ppb::serving::Scheduler s(reqs, sc);
    std::vector<int> touched(sc.slots, 0);  // the most positions each slot's rows wrote
    size_t peak = 0;
    int steps = 0;
    for (double t = 0; !s.finished(); t += 1.0, ++steps) {
      const ppb::serving::Step& st = s.next_step(0, t);
      ASSERT_FALSE(st.rows.empty());  // every request arrived at 0
      RaggedStep rs;
      ids in;
      for (const ppb::serving::BatchRow& row : st.rows) {
        rs.slot.push_back(row.slot);
        rs.pos.push_back(row.position);
        rs.tokens.push_back(row.tokens);
        for (int p = row.position; p < row.position + row.tokens; ++p) in.push_back((row.request * 131 + p * 7) % m.vocab);
        touched[row.slot] = std::max(touched[row.slot], row.position + row.tokens);
      }
      rs.released.assign(st.released.begin(), st.released.end());
      bytes out_w(in.size() * H * sizeof(float), 1), out_p(out_w.size(), 2);
      whole->enqueue_forward_ragged(lane, in.data(), out_w.data(), 0, rs);
      paged->enqueue_forward_ragged(lane, in.data(), out_p.data(), 0, rs);
      lane.synchronize();
      ASSERT_EQ(0, std::memcmp(out_w.data(), out_p.data(), out_w.size())) << "step " << steps;
      const size_t resident = paged->kv_resident_bytes();
      ASSERT_LE(resident, b.kv_cache) << "step " << steps;
      peak = std::max(peak, resident);
      s.complete_step(0, t + 1.0);
    }
    EXPECT_GT(s.preemptions(), 0);
    EXPECT_GT(peak, 0u);
    const size_t unreleased = static_cast<size_t>(std::accumulate(touched.begin(), touched.end(), 0)) * b.kv_token_bytes;
    EXPECT_GT(unreleased, b.kv_cache);
    EXPECT_EQ(whole->kv_resident_bytes(), whole->kv_cache_bytes());
    std::printf("%s: %d steps, %d preemptions; paged KV peak %zu B, bound %zu B (pool %zu + slack %zu), "
                "the slots' positions without releases %zu B, the whole store %zu B\n",
                name, steps, s.preemptions(), peak, b.kv_cache, b.kv_cache - b.kv_page_slack, b.kv_page_slack,
                unreleased, whole->kv_cache_bytes());
  }
}

// ---- 4. refused steps ---------------------------------------------------------------------------

/// Each bad step throws InternalError naming its row (or the group / the row count) before
/// anything is enqueued.
TEST(CpuStageRagged, RefusesBadStepsBeforeEnqueueing) {
  const ModelSpec m = tiny("tiny-llama");
  const ppb::StageConfig cfg = config(3, 5, 4, 2);  // B = 3, max_context 9, 2 groups
  auto stage = ppb::create_cpu_stage(m, 0, m.num_units() - 1, cfg);
  struct Bad {
    const char* what;
    RaggedStep step;
    int group;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {"slot twice", {{0, 2, 0}, {0, 0, 4}, {1, 1, 1}}, 0, "row 2 (slot 0"},
      {"rows > B", {{0, 1, 2, 0}, {0, 0, 0, 0}, {1, 1, 1, 1}}, 0, "1 to B = 3 rows"},
      {"no rows", {}, 0, "1 to B = 3 rows"},
      {"pos + tokens > max_context", {{1, 0}, {5, 8}, {1, 2}}, 0, "row 1 (slot 0, pos 8, tokens 2)"},
      {"tokens 0", {{1, 0}, {5, 0}, {0, 2}}, 0, "row 0 (slot 1, pos 5, tokens 0)"},
      {"pos < 0", {{1}, {-1}, {1}}, 0, "row 0"},
      {"slot out of range", {{3}, {0}, {1}}, 0, "row 0 (slot 3"},
      {"negative slot", {{0, -1}, {0, 0}, {1, 1}}, 0, "row 1 (slot -1"},
      {"arrays of two lengths", {{0, 1}, {0}, {1, 1}}, 0, "entries"},
      {"group out of range", {{0}, {0}, {1}}, 2, "group 2"},
      {"released slot out of range", {{0}, {0}, {1}, {3}}, 0, "released slot 3"},
      {"released twice", {{0}, {0}, {1}, {1, 1}}, 0, "released slot 1"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    SyncLane lane;
    std::vector<char> in(64 * sizeof(int32_t)), out(64 * sizeof(int32_t));
    try {
      stage->enqueue_forward_ragged(lane, in.data(), out.data(), b.group, b.step);
      ADD_FAILURE() << "no throw";
    } catch (const ppb::InternalError& e) {
      EXPECT_NE(std::string(e.what()).find(b.says), std::string::npos) << e.what();
    }
    EXPECT_EQ(lane.tasks, 0);
  }
}

}  // namespace
