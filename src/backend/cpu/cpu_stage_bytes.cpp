// cpu_stage_bytes: the bytes a CPU stage allocates, computed the way CpuStage's constructor
// (cpu_stage.cpp) sizes its buffers, before anything is allocated (tests/unit/test_cpu_ops.cpp
// checks weights and KV cache against a built stage).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_paged_store.h"
#include "backend/cpu/cpu_stage.h"
#include "backend/cpu/cpu_stage_detail.h"
#include "backend/tensor_parallel.h"
#include "common/error.h"

namespace ppb {
namespace {

using model::LayerShape;
using model::UnitKind;

/// cpu_stage_bytes' running sums in floats, unit by unit: the weights, the KV cache, the RoPE
/// tables, and the largest of each scratch size over the stage's layers (CpuStage's ScratchSizes).
struct BytesPlan {
  size_t H = 0, ctx = 0, max_tokens = 0, groups = 0;  ///< hidden, P + G, B * ctx, M
  int t = 1, r = 0;                                  ///< tensor-parallel width and rank
  size_t weights = 0, kv = 0, rope = 0;
  size_t kv_token = 0, kv_regions = 0;  ///< KV floats per token of one slot; regions per slot (K, V or MLA's)
  size_t max_q = 0, max_kv = 0, max_inter = 0, max_attn = 0;
  size_t max_mla_qa = 0, max_mla_kva = 0, max_mla_rope = 0, max_mla_values = 0, max_experts = 0, max_top_k = 0;
  bool has_layer = false;
  std::vector<std::pair<model::Rope, int>> ropes;  ///< the distinct (rope, rotated head_dim) so far

  /// Adds one decoder layer of shape ls, this rank's shard, as CpuStage::make_layer builds it.
  void add_layer(const LayerShape& ls);
  /// add_layer's MLA attention (weights, scratch sizes); returns the attention output's width per token.
  size_t add_mla(const LayerShape& ls);
  /// add_layer's router and routed experts (weights, scratch sizes).
  void add_experts(const LayerShape& ls);
  /// Scratch floats of the layers for a cache of `max_context` positions (activations,
  /// attention, MLA, MoE); 0 without layers.
  size_t layer_scratch(int max_context) const;
};

void BytesPlan::add_layer(const LayerShape& ls) {
  has_layer = true;
  // This rank's shard (CpuStage's constructor): its heads and MLP slice; norms whole.
  const TpHeads th = tp_heads(ls.n_heads, ls.n_kv_heads, t, r);
  const auto [i0, i1] = tp_range(static_cast<size_t>(ls.intermediate), t, r);
  const size_t nq = static_cast<size_t>(th.q_count) * ls.head_dim, nkv = static_cast<size_t>(th.kv_count) * ls.head_dim;
  const size_t I = i1 - i0;
  const size_t norms = H * (ls.sandwich_norm ? 4 : 2) + (ls.qk_norm ? 2 * static_cast<size_t>(ls.head_dim) : 0);
  weights += norms + 3 * H * I;
  size_t attn_width = nq;
  if (ls.is_mla()) {
    attn_width = add_mla(ls);
  } else {
    weights += H * (2 * nq + 2 * nkv) + (ls.attn_bias ? nq + 2 * nkv : 0) + (ls.o_bias ? H : 0) +
               (ls.attn_sinks ? static_cast<size_t>(ls.n_heads) : 0);
    max_kv = std::max(max_kv, nkv);
  }
  if (ls.is_moe()) add_experts(ls);
  max_q = std::max(max_q, nq);
  max_attn = std::max(max_attn, attn_width);
  max_inter = std::max(max_inter, I);
  kv += groups * max_tokens * cpu::layer_cache_floats(ls, nkv);
  kv_token += cpu::layer_cache_floats(ls, nkv);
  kv_regions += ls.is_mla() ? 1 : 2;
  const int rotated = ls.is_mla() ? ls.mla.qk_rope : ls.head_dim;
  const auto key = std::make_pair(ls.rope, rotated);
  if (std::find(ropes.begin(), ropes.end(), key) == ropes.end()) {
    ropes.push_back(key);
    rope += 2 * ctx * static_cast<size_t>(rotated / 2);
  }
}

size_t BytesPlan::add_mla(const LayerShape& ls) {
  const model::MlaShape& a = ls.mla;
  const size_t nh = static_cast<size_t>(ls.n_heads), qk = static_cast<size_t>(a.qk_nope + a.qk_rope);
  const size_t D = static_cast<size_t>(a.kv_lora_rank + a.qk_rope), L = static_cast<size_t>(a.kv_lora_rank);
  const size_t ql = static_cast<size_t>(a.q_lora_rank);
  weights += (ql > 0 ? H * ql + ql + ql * nh * qk : H * nh * qk) + H * D + L +
             nh * (a.qk_nope + a.v_head_dim) * L + H * nh * a.v_head_dim;
  max_q = std::max(max_q, nh * qk);
  max_mla_qa = std::max(max_mla_qa, ql);
  max_mla_kva = std::max(max_mla_kva, D);
  max_mla_rope = std::max(max_mla_rope, nh * a.qk_rope);
  max_mla_values = std::max(max_mla_values, nh * a.v_head_dim);
  return nh * D;
}

void BytesPlan::add_experts(const LayerShape& ls) {
  const model::MoeShape& e = ls.moe;
  const size_t E = static_cast<size_t>(e.n_experts), Ie = static_cast<size_t>(e.expert_intermediate);
  weights += E * H + (e.router_bias ? E : 0) + (e.router == model::RouterKind::sigmoid_grouped ? E : 0) +
             E * (3 * H * Ie + (e.expert_bias ? 2 * Ie + H : 0));
  max_experts = std::max(max_experts, E);
  max_top_k = std::max(max_top_k, static_cast<size_t>(e.top_k));
  max_inter = std::max(max_inter, Ie);
}

size_t BytesPlan::layer_scratch(int max_context) const {
  if (!has_layer) return 0;
  size_t scratch = max_tokens * (H + max_q + max_attn + 2 * max_kv + 2 * max_inter) + cpu::attention_scratch_floats(max_context);
  scratch += max_tokens * (max_mla_qa + max_mla_kva + (max_mla_kva > 0 ? max_attn : 0) + max_mla_rope + max_mla_values);
  // MoE: router logits, gathered rows, expert output, the sum, the weights (and as many int32
  // experts and slots, counted as floats: both 4 bytes).
  if (max_experts > 0) scratch += max_tokens * (max_experts + 3 * H + 3 * max_top_k) + max_experts + 1;
  return scratch;
}

}  // namespace

StageBytes cpu_stage_bytes(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  if (first < 0 || last < first || last >= m.num_units()) {
    throw UserError("stage units [" + std::to_string(first) + ", " + std::to_string(last) +
                    "] are not a range of the model's " + std::to_string(m.num_units()) + " units");
  }
  BytesPlan plan;
  const size_t H = static_cast<size_t>(m.hidden), B = static_cast<size_t>(std::max(cfg.work.batch, 1));
  plan.H = H;
  plan.ctx = static_cast<size_t>(std::max(cfg.work.max_context(), 1));
  plan.max_tokens = B * plan.ctx;
  plan.groups = static_cast<size_t>(std::max(cfg.work.groups, 1));
  const int t = plan.t = cfg.tp_width;
  plan.r = cfg.tp_rank;
  if (const std::string why = tp_unsupported_reason(m, t); !why.empty())
    throw UserError("--tp " + std::to_string(t) + ": " + why);
  const auto [v0, v1] = tp_range(static_cast<size_t>(m.vocab), t, plan.r);
  const size_t vocab_local = v1 - v0;
  bool has_embed = false, has_head = false;
  for (int u = first; u <= last; ++u) {
    const model::Unit& unit = m.units[u];
    if (unit.kind == UnitKind::embed) {
      has_embed = true;
      plan.weights += static_cast<size_t>(m.vocab) * H;
    } else if (unit.kind == UnitKind::head) {
      has_head = true;
      plan.weights += H + (m.tie_embeddings && has_embed ? 0 : vocab_local * H);
      if (m.mtp) {
        // The MTP modules (CpuStage's constructor): the draft tokens' embedding table unless
        // the stage holds embed, and per module its norms, eh_proj and layer.
        plan.weights += has_embed ? 0 : static_cast<size_t>(m.vocab) * H;
        for (int k = 0; k < m.mtp_modules; ++k) {
          plan.weights += 3 * H + 2 * H * H;
          plan.add_layer(m.mtp_shape);
        }
      }
    } else {
      plan.add_layer(m.layers[unit.layer]);
    }
  }
  const size_t max_tokens = plan.max_tokens;
  size_t scratch = max_tokens * H + plan.rope + plan.layer_scratch(cfg.work.max_context());
  if (has_head) scratch += B * H + B * vocab_local;
  if (has_head && m.mtp) scratch += max_tokens * 2 * H + B;  // MTP: [embedding, hidden] rows; draft tokens
  // Width > 1: the group's all-reduce gathers every rank's part of the largest [B x T, H]
  // (create_mpi_tp_group's buffer, one per stage's group; ThreadTpGroups' is smaller).
  if (t > 1 && plan.has_layer) scratch += static_cast<size_t>(t) * max_tokens * H;
  StageBytes b;
  b.weights = plan.weights * sizeof(float);
  b.scratch = scratch * sizeof(float);
  b.kv_cache = plan.kv * sizeof(float);
  b.kv_token_bytes = plan.kv_token * sizeof(float);
  b.kv_paged = true;  // CpuStage: a PagedStore under a pool (cpu_paged_store.h)
  b.kv_page_slack = cpu::page_slack_bytes(plan.groups * B * plan.kv_regions);
  if (cfg.kv_pool_tokens > 0)
    b.kv_cache = std::min(b.kv_cache, static_cast<size_t>(cfg.kv_pool_tokens) * b.kv_token_bytes + b.kv_page_slack);
  return b;
}

}  // namespace ppb
