// The plan of a CUDA stage (cuda_stage_plan.h): make_plan, the launch bound, cuda_stage_bytes.
#include "backend/cuda/cuda_stage_plan.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ragged_plan.h"
#include "backend/weights.h"
#include "common/error.h"

namespace ppb {
namespace cuda {
namespace {

using model::LayerShape;
using model::UnitKind;

constexpr int kMaxChunkRows = 4096;                   // token rows per layer pass (scratch bound)
constexpr size_t kScoresBudgetBytes = 256u << 20;     // prefill attention scores + probabilities
// Launches of a decode forward replayed from a graph: the position, the input copy, the graph,
// the output copy.
constexpr size_t kGraphDecodeLaunches = 4;

int round_up(int v, int m) { return (v + m - 1) / m * m; }

/// Weights of a layer shard in the stage's dtype (`elems`) and in fp32 (`f32`: gpt-oss's sinks,
/// DeepSeek's router correction bias, which the kernels read in fp32).
struct LayerWeightCount {
  size_t elems = 0, f32 = 0;
};

/// The weights of layer shard s (every tensor make_layer allocates for it).
LayerWeightCount layer_weight_count(const LayerShape& s) {
  const size_t H = s.hidden, I = s.intermediate;
  LayerWeightCount c;
  size_t& n = c.elems;
  n = 3 * I * H + 2 * H;  // the dense MLP (a MoE layer's shared experts; I = 0: none), two norms
  if (s.sandwich_norm) n += 2 * H;
  if (s.is_mla()) {
    const model::MlaShape& a = s.mla;
    const size_t nh = s.n_heads, qk = a.qk_nope + a.qk_rope, L = a.kv_lora_rank, D = L + a.qk_rope,
                 ql = a.q_lora_rank;
    n += (ql > 0 ? ql * H + ql + nh * qk * ql : nh * qk * H) + D * H + L + nh * (a.qk_nope + a.v_head_dim) * L +
         H * nh * a.v_head_dim;
  } else {
    const size_t nq = static_cast<size_t>(s.n_heads) * s.head_dim, nkv = static_cast<size_t>(s.n_kv_heads) * s.head_dim;
    n += (nq + 2 * nkv) * H + H * nq;
    if (s.qk_norm) n += 2 * static_cast<size_t>(s.head_dim);
    if (s.attn_bias) n += nq + 2 * nkv;
    if (s.o_bias) n += H;
    if (s.attn_sinks) c.f32 += s.n_heads;
  }
  if (s.is_moe()) {
    const model::MoeShape& e = s.moe;
    const size_t E = e.n_experts, Ie = e.expert_intermediate;
    n += E * H + (e.router_bias ? E : 0) + E * 3 * Ie * H + (e.expert_bias ? E * (2 * Ie + H) : 0);
    if (e.router == model::RouterKind::sigmoid_grouped) c.f32 += E;
  }
  return c;
}

/// The scratch of the stage's layer passes (make_plan's layers and MTP layers, their sizes in
/// p): activations of plan rows, prefill attention's scores within kScoresBudgetBytes, decode
/// attention's partials, MLA's and MoE's buffers. Sets p.query_block, p.mla_query_block,
/// p.scores_elems and p.decode_floats. Bytes; 0 for a stage without layers.
size_t layer_scratch_bytes(StagePlan& p, const StageConfig& cfg, size_t H, size_t dt, int max_heads) {
  if (p.layers.empty() && p.mtp_layers.empty()) return 0;
  const size_t B = static_cast<size_t>(cfg.work.batch);
  const int per_seq = std::min(cfg.work.max_context(), p.rows);
  const size_t keys = static_cast<size_t>(round_up(cfg.work.max_context(), 8));
  // Prefill attention's scores and probabilities within kScoresBudgetBytes: query rows per
  // block of one sequence's heads (GQA), or MLA's query tokens of every sequence and head.
  // (MLA's block holds every sequence and head: it may fall to one query token, decode's size.)
  auto block_rows = [&](size_t per_row, size_t floor_rows) {
    int qb = static_cast<int>(std::max<size_t>(floor_rows, kScoresBudgetBytes / std::max<size_t>(per_row, 1)));
    qb = std::min(qb, per_seq);
    if (qb > 64) qb = qb / 64 * 64;
    return std::max(qb, 1);
  };
  p.query_block = block_rows(static_cast<size_t>(max_heads) * keys * (sizeof(float) + dt), 16);
  p.mla_query_block = block_rows(B * static_cast<size_t>(max_heads) * keys * (sizeof(float) + dt), 1);
  for (const auto* layers : {&p.layers, &p.mtp_layers}) {
    for (const StagePlan::Layer& l : *layers) {
      if (l.shape.is_mla()) {
        const MlaCallShape ms = mla_call_shape(l.shape, cfg.work.batch, 1, 0, cfg.work.max_context());
        p.scores_elems = std::max(p.scores_elems, mla_attention_scratch_elems(ms, p.mla_query_block));
      } else {
        const cpu::AttentionShape a = attention_shape(l.shape, cfg.work.batch, 1, 0, cfg.work.max_context());
        p.scores_elems = std::max(p.scores_elems, attention_prefill_scratch_elems(a, p.query_block));
        p.decode_floats = std::max(p.decode_floats, attention_decode_scratch_floats(a));
      }
    }
  }
  const size_t R = static_cast<size_t>(p.rows);
  size_t scratch = R * dt * (H + p.max_qkv + 2 * p.max_q + 3 * p.max_inter);
  scratch += R * dt * (p.max_mla_qa + p.max_mla_kva + p.max_mla_qabs + p.max_mla_olat);
  scratch += p.scores_elems * (sizeof(float) + dt) + p.decode_floats * sizeof(float);
  if (p.max_experts > 0) {
    // Router logits (fp32), the choices (experts, weights), the dispatch, the routed rows'
    // gate|up, activation and output, the routed sum.
    const size_t choices = R * p.max_top_k;
    scratch += R * p.max_experts * sizeof(float) + choices * (sizeof(int32_t) + sizeof(float)) +
               moe_dispatch_bytes(static_cast<int>(choices), static_cast<int>(p.max_experts)) + 256;
    scratch += choices * dt * (3 * p.max_expert_inter + H) + R * H * dt;
  }
  return scratch;
}

/// make_plan's refusals of the range, the workload's sizes, the model's and the tensor-parallel
/// rank and width, in that order. @throws ppb::UserError naming them.
void check_plan_config(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  if (first < 0 || last < first || last >= m.num_units()) {
    throw UserError("stage units [" + std::to_string(first) + ", " + std::to_string(last) +
                    "] are not a range of the model's " + std::to_string(m.num_units()) + " units");
  }
  if (cfg.work.batch < 1 || cfg.work.max_context() < 1 || cfg.work.groups < 1) {
    throw UserError("stage config needs batch, max_context and groups >= 1, got batch=" + std::to_string(cfg.work.batch) +
                    " max_context=" + std::to_string(cfg.work.max_context()) + " groups=" + std::to_string(cfg.work.groups));
  }
  if (m.hidden < 1 || m.vocab < 1) throw UserError("model needs hidden_size and vocab_size >= 1");
  if (cfg.tp_width < 1 || cfg.tp_rank < 0 || cfg.tp_rank >= cfg.tp_width)
    throw UserError("stage config: tensor-parallel rank " + std::to_string(cfg.tp_rank) + " is outside a group of width " +
                    std::to_string(cfg.tp_width));
  if (const std::string why = tp_unsupported_reason(m, cfg.tp_width); !why.empty())
    throw UserError("--tp " + std::to_string(cfg.tp_width) + ": " + why);
}

/// A decoder layer's shape against every backend's rule (check_stage_layer) and the CUDA
/// kernels' limits (experts routed per token, head_dim). @throws ppb::UserError naming the layer.
void check_cuda_layer(const LayerShape& s, int hidden, int layer) {
  check_stage_layer(s, hidden, layer);
  if (s.is_moe() && (s.moe.top_k > kMoeMaxTopK || s.moe.n_experts > kMoeMaxExperts)) {
    throw UserError("layer " + std::to_string(layer) + ": the CUDA backend routes at most " +
                    std::to_string(kMoeMaxTopK) + " experts per token of at most " + std::to_string(kMoeMaxExperts) +
                    ", got top_k=" + std::to_string(s.moe.top_k) + " of " + std::to_string(s.moe.n_experts));
  }
  if (!s.is_mla() && s.head_dim > 256) {
    throw UserError("layer " + std::to_string(layer) + ": the CUDA backend supports head_dim <= 256, got " +
                    std::to_string(s.head_dim));
  }
}

/// make_plan's pass over the stage's units: the layers into p, the running sums of weights
/// (stage dtype and fp32), KV cache (elements), RoPE tables and fixed scratch (bytes).
struct PlanBuilder {
  const model::ModelSpec& m;
  const StageConfig& cfg;
  StagePlan& p;
  size_t H = 0, B = 0, ctx = 0;  ///< hidden, batch, P + G
  size_t weight_elems = 0, kv_elems = 0, rope_bytes = 0, scratch_fixed = 0;
  int max_heads = 0;
  size_t weight_f32 = 0;

  /// Unit u: embed, the head (and the MTP modules after it) or a decoder layer.
  void add_unit(int u);
  /// One decoder layer (a main layer, or an MTP module's: unit id num_units() + k) into `into`.
  void add_layer(const LayerShape& s, int u, int layer, std::vector<StagePlan::Layer>& into);
  /// Index in p.ropes of the table of layer shape s (its rope, the dimensions it rotates),
  /// added on first use. @throws ppb::UserError for an unsupported scaling type.
  int rope_index(const LayerShape& s);
  /// The weights, KV cache and scratch maxima of this rank's shard ls of a layer.
  void add_shard_sizes(const LayerShape& ls);
};

void PlanBuilder::add_unit(int u) {
  const size_t V = static_cast<size_t>(m.vocab);
  const model::Unit& unit = m.units[u];
  if (unit.kind == UnitKind::embed) {
    p.has_embed = true;
    weight_elems += V * H;
  } else if (unit.kind == UnitKind::head) {
    p.has_head = true;
    p.head_shares_embed = m.tie_embeddings && p.has_embed;
    weight_elems += H + (p.head_shares_embed ? 0 : p.vocab_local * H);
    if (m.mtp) {
      // The MTP modules (CpuStage's): the draft tokens' embedding table unless this stage holds
      // embed's, and per module its norms, eh_proj and decoder layer.
      p.mtp_own_embed = !p.has_embed;
      if (p.mtp_own_embed) weight_elems += V * H;
      for (int k = 0; k < m.mtp_modules; ++k) {
        weight_elems += 3 * H + 2 * H * H;
        add_layer(m.mtp_shape, m.num_units() + k, m.n_layers + k, p.mtp_layers);
      }
    }
  } else {
    if (unit.layer < 0 || unit.layer >= static_cast<int>(m.layers.size())) {
      throw UserError("unit '" + unit.name + "' has layer index " + std::to_string(unit.layer) + " outside [0, " +
                      std::to_string(m.layers.size()) + ")");
    }
    add_layer(m.layers[unit.layer], u, unit.layer, p.layers);
  }
}

void PlanBuilder::add_layer(const LayerShape& s, int u, int layer, std::vector<StagePlan::Layer>& into) {
  check_cuda_layer(s, m.hidden, layer);
  StagePlan::Layer l;
  l.unit = u;
  l.layer = layer;
  l.full = s;
  l.shape = s;
  l.heads = tp_heads(s.n_heads, s.n_kv_heads, cfg.tp_width, cfg.tp_rank);
  const auto [i0, i1] = tp_range(static_cast<size_t>(s.intermediate), cfg.tp_width, cfg.tp_rank);
  l.i0 = i0;
  l.shape.n_heads = l.heads.q_count;
  l.shape.n_kv_heads = l.heads.kv_count;
  l.shape.intermediate = static_cast<int>(i1 - i0);
  l.rope = rope_index(s);
  add_shard_sizes(l.shape);  // the shard from here on (MoE and MLA layers refuse --tp: whole)
  into.push_back(l);
}

int PlanBuilder::rope_index(const LayerShape& s) {
  const int rotated = s.is_mla() ? s.mla.qk_rope : s.head_dim;  // MLA rotates only q_rope and k_rope
  auto it = std::find_if(p.ropes.begin(), p.ropes.end(),
                         [&](const auto& r) { return r.first == s.rope && r.second == rotated; });
  if (it == p.ropes.end()) {
    cpu::rope_inv_freq(s.rope, rotated);  // validates the scaling type (UserError)
    p.ropes.emplace_back(s.rope, rotated);
    rope_bytes += 2 * ctx * static_cast<size_t>(rotated / 2) * sizeof(float);
    it = p.ropes.end() - 1;
  }
  return static_cast<int>(it - p.ropes.begin());
}

void PlanBuilder::add_shard_sizes(const LayerShape& ls) {
  const LayerWeightCount wc = layer_weight_count(ls);
  weight_elems += wc.elems;
  weight_f32 += wc.f32;
  max_heads = std::max(max_heads, ls.n_heads);
  if (ls.is_mla()) {
    const model::MlaShape& a = ls.mla;
    const size_t nh = static_cast<size_t>(ls.n_heads), D = static_cast<size_t>(a.kv_lora_rank + a.qk_rope);
    p.max_q = std::max({p.max_q, nh * (a.qk_nope + a.qk_rope), nh * a.v_head_dim});  // q_, then the values in attn_
    p.max_mla_qa = std::max(p.max_mla_qa, static_cast<size_t>(a.q_lora_rank));
    p.max_mla_kva = std::max(p.max_mla_kva, D);
    p.max_mla_qabs = std::max(p.max_mla_qabs, nh * D);
    p.max_mla_olat = std::max(p.max_mla_olat, nh * a.kv_lora_rank);
    kv_elems += static_cast<size_t>(cfg.work.groups) * B * ctx * D;  // one latent row per token: keys and values
  } else {
    const size_t nq = static_cast<size_t>(ls.n_heads) * ls.head_dim, nkv = static_cast<size_t>(ls.n_kv_heads) * ls.head_dim;
    p.max_qkv = std::max(p.max_qkv, nq + 2 * nkv);
    p.max_q = std::max(p.max_q, nq);
    kv_elems += 2 * static_cast<size_t>(cfg.work.groups) * B * ctx * nkv;
  }
  p.max_inter = std::max(p.max_inter, static_cast<size_t>(ls.intermediate));
  if (ls.is_moe()) {
    ++p.moe_layers;
    p.max_experts = std::max(p.max_experts, static_cast<size_t>(ls.moe.n_experts));
    p.max_top_k = std::max(p.max_top_k, static_cast<size_t>(ls.moe.top_k));
    p.max_expert_inter = std::max(p.max_expert_inter, static_cast<size_t>(ls.moe.expert_intermediate));
    // The layer's expert counters (int64) and, with --expert-skew, its popularity law (double).
    scratch_fixed += static_cast<size_t>(ls.moe.n_experts) * (sizeof(int64_t) + (cfg.expert_skew > 0.0 ? sizeof(double) : 0));
  }
}

}  // namespace

MlaCallShape mla_call_shape(const LayerShape& s, int batch, int tokens, int pos0, int max_context) {
  MlaCallShape c;
  c.batch = batch;
  c.tokens = tokens;
  c.pos0 = pos0;
  c.max_context = max_context;
  c.n_heads = s.n_heads;
  c.qk_nope = s.mla.qk_nope;
  c.qk_rope = s.mla.qk_rope;
  c.v_head_dim = s.mla.v_head_dim;
  c.kv_lora_rank = s.mla.kv_lora_rank;
  c.eps = static_cast<float>(s.rms_eps);
  c.scale = static_cast<float>(s.attn_scale > 0.0 ? s.attn_scale
                                                  : 1.0 / std::sqrt(static_cast<double>(s.mla.qk_nope + s.mla.qk_rope)));
  return c;
}

cpu::AttentionShape attention_shape(const LayerShape& s, int batch, int tokens, int pos0, int max_context) {
  cpu::AttentionShape a;
  a.batch = batch;
  a.tokens = tokens;
  a.pos0 = pos0;
  a.max_context = max_context;
  a.n_heads = s.n_heads;
  a.n_kv_heads = s.n_kv_heads;
  a.head_dim = s.head_dim;
  a.window = s.sliding_window;
  a.scale = static_cast<float>(s.attn_scale > 0.0 ? s.attn_scale : 1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  a.softcap = static_cast<float>(s.attn_softcap);
  return a;
}

StagePlan make_plan(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  check_plan_config(m, first, last, cfg);
  StagePlan p;
  {
    const auto [v0, v1] = tp_range(static_cast<size_t>(m.vocab), cfg.tp_width, cfg.tp_rank);
    p.vocab_begin = v0;
    p.vocab_local = v1 - v0;
  }
  const size_t dt = static_cast<size_t>(dtype_bytes(cfg.work.dtype));
  const size_t H = static_cast<size_t>(m.hidden), B = static_cast<size_t>(cfg.work.batch),
               ctx = static_cast<size_t>(cfg.work.max_context());
  PlanBuilder b{m, cfg, p, H, B, ctx};
  for (int u = first; u <= last; ++u) b.add_unit(u);
  p.rows = static_cast<int>(std::min<size_t>(B * ctx, std::max<size_t>(B, kMaxChunkRows)));
  size_t scratch = B * ctx * H * dt + kCublasWorkspaceBytes + b.rope_bytes + b.scratch_fixed + 64;
  scratch += layer_scratch_bytes(p, cfg, H, dt, b.max_heads);
  if (p.has_head) scratch += B * H * dt + B * p.vocab_local * sizeof(float);
  // --mtp: the modules' input rows [B x context, 2H] and the draft tokens [B].
  if (!p.mtp_layers.empty()) scratch += B * ctx * 2 * H * dt + B * sizeof(int32_t);
  // The vocabulary-parallel head's (value, id) pairs: this rank's [B] and the group's [width][B].
  if (p.has_head && cfg.tp_width > 1) scratch += (1 + static_cast<size_t>(cfg.tp_width)) * B * sizeof(ArgmaxPair);
  scratch += 2 * B * sizeof(int32_t) + 64;  // a decode graph's token input, token output and position
  // A ragged step's metadata (at most B x context tokens) and its attention's error flag.
  scratch += ragged_meta_ints(cfg.work.batch, B * ctx) * sizeof(int32_t) + sizeof(int);
  p.bytes.weights = b.weight_elems * dt + b.weight_f32 * sizeof(float);
  p.bytes.kv_cache = b.kv_elems * dt;
  // Every slot of every group at max_context, allocated whole (not demand-paged: kv_paged false,
  // StageConfig::kv_pool_tokens ignored).
  p.bytes.kv_token_bytes = b.kv_elems * dt / (static_cast<size_t>(std::max(cfg.work.groups, 1)) * std::max<size_t>(B * ctx, 1));
  p.bytes.scratch = scratch;
  return p;
}

size_t plan_launches(const StagePlan& plan, const StageConfig& cfg, int tokens) {
  // Mirrors enqueue_forward and layer_forward; a cuBLAS call counts as two launches (a GEMM may
  // add a split-K reduction), attention_decode as two (split-K and combine).
  constexpr size_t kBlas = 2;
  if (tokens == 1 && cfg.cuda_graphs) return kGraphDecodeLaunches;
  const size_t B = static_cast<size_t>(cfg.work.batch), T = static_cast<size_t>(std::max(tokens, 1));
  auto layer_pass = [&](const LayerShape& s, size_t nb, size_t tc) {
    size_t n = 1 + kBlas + 1 + 1;  // input norm, o_proj, add+norm, the final add
    if (s.sandwich_norm) n += 2;
    if (cfg.tp_width > 1) n += 2;  // the all-reduces after o_proj and down_proj
    if (s.is_mla()) {
      // (q_a, its norm,) q_b, kv_a, the cache write, the absorbed queries (GEMM + RoPE), the
      // values; attention: per query block S, softmax, PV (every sequence at once).
      n += (s.mla.q_lora_rank > 0 ? kBlas + 1 : 0) + kBlas + kBlas + 1 + kBlas + 1 + kBlas;
      const size_t qb = static_cast<size_t>(std::max(plan.mla_query_block, 1));
      n += ((tc + qb - 1) / qb) * (2 * kBlas + 1);
    } else {
      n += kBlas + 1;  // qkv, rope + cache
      if (s.o_bias) n += 1;
      if (tc == 1) {
        n += 2;
      } else {
        const size_t group = static_cast<size_t>(s.n_heads / std::max(s.n_kv_heads, 1));
        const size_t qb = static_cast<size_t>(std::max(plan.query_block, 1));
        n += nb * ((tc + qb - 1) / qb) * (2 * group * kBlas + 1);
      }
    }
    if (s.intermediate > 0) n += kBlas + 1 + kBlas;  // gate_up, act, down (dense, or shared experts)
    // Router GEMM, its bias, route, dispatch, the two grouped GEMMs, act, combine, the shared add.
    if (s.is_moe()) n += kBlas + 1 + 1 + 1 + 2 + 1 + 1 + 1;
    return n;
  };
  const size_t rows_per_pass = static_cast<size_t>(std::max(plan.rows, 1));
  auto layers = [&](const std::vector<StagePlan::Layer>& ls) {
    size_t n = 0;
    for (const auto& l : ls) {
      if (B * T <= rows_per_pass) {
        n += layer_pass(l.shape, B, T);
      } else {  // chunked prefill, sequence by sequence
        for (size_t t0 = 0; t0 < T; t0 += rows_per_pass) n += B * layer_pass(l.shape, 1, std::min(rows_per_pass, T - t0));
      }
    }
    return n;
  };
  size_t n = 1;  // embedding or the input copy
  n += layers(plan.layers);
  n += plan.has_head ? 4 + kBlas : 1;  // gather, norm, lm_head, softcap, argmax; or the output copy
  if (plan.has_head && cfg.tp_width > 1) n += 2;  // the pairs' all-gather and the group's argmax
  // --mtp: the draft copy; per module its input rows, eh_proj, layer, gather, norm, lm_head, argmax.
  if (!plan.mtp_layers.empty()) n += 1 + plan.mtp_layers.size() * (1 + kBlas + 3 + kBlas) + layers(plan.mtp_layers);
  return n;
}

}  // namespace cuda

StageBytes cuda_stage_bytes(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  return cuda::make_plan(m, first, last, cfg).bytes;
}

size_t cuda_launches_per_forward(const model::ModelSpec& m, int first, int last, const StageConfig& cfg, int tokens) {
  return cuda::plan_launches(cuda::make_plan(m, first, last, cfg), cfg, tokens);
}

}  // namespace ppb
