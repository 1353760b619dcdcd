#include "backend/cpu/cpu_stage.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_aligned.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_stage_detail.h"
#include "backend/cpu/cpu_stage_impl.h"
#include "backend/tensor_parallel.h"
#include "backend/weights.h"
#include "common/error.h"
#include "model/model_spec.h"

namespace ppb {
namespace {

using model::UnitKind;

/// The refusals of CpuStage's constructor, in order, before anything is built: the dtype, the
/// unit range, the workload's sizes, the model's, the tensor-parallel rank, group and width.
void check_cpu_stage_config(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  if (cfg.work.dtype != DType::f32) throw UserError("the CPU backend computes in f32; use --dtype f32");
  if (first < 0 || last < first || last >= m.num_units()) {
    throw UserError("stage units [" + std::to_string(first) + ", " + std::to_string(last) +
                    "] are not a range of the model's " + std::to_string(m.num_units()) + " units");
  }
  if (cfg.work.batch < 1 || cfg.work.max_context() < 1 || cfg.work.groups < 1) {
    throw UserError("stage config needs batch, max_context and groups >= 1, got batch=" +
                    std::to_string(cfg.work.batch) + " max_context=" + std::to_string(cfg.work.max_context()) +
                    " groups=" + std::to_string(cfg.work.groups));
  }
  if (m.hidden < 1 || m.vocab < 1) {
    throw UserError("model needs hidden_size and vocab_size >= 1");
  }
  const int width = cfg.tp_width, rank = cfg.tp_rank;
  if (width < 1 || rank < 0 || rank >= width)
    throw UserError("stage config: tensor-parallel rank " + std::to_string(rank) + " is outside a group of width " +
                    std::to_string(width));
  if (width > 1 && (cfg.tp == nullptr || cfg.tp->width() != width || cfg.tp->rank() != rank))
    throw InternalError("a stage of tensor-parallel width " + std::to_string(width) +
                        " needs the group's communicator, of that width and rank");
  if (const std::string why = tp_unsupported_reason(m, width); !why.empty())
    throw UserError("--tp " + std::to_string(width) + ": " + why);
}

}  // namespace

namespace cpu {

using model::LayerShape;

float* CpuStage::weights(const WeightKey& k, size_t n, const std::function<void(float*)>& fill) {
  weight_store_.push_back(cache_->get(k, n, fill));
  weight_bytes_ += n * sizeof(float);
  blocks_.emplace_back(weight_store_.back().get(), n * sizeof(float));
  return weight_store_.back().get();
}

float* CpuStage::projection(size_t rows, size_t fan_in, int u, Tensor t) {
  const uint64_t seed = cfg_.work.seed;
  return weights(key(WeightKey::Fill::projection, u, t, rows, fan_in), rows * fan_in,
                 [&](float* p) { fill_projection(p, rows, fan_in, seed, u, t); });
}

float* CpuStage::plain_norm(size_t n, int u, Tensor t) { return layer_norm(n, u, t, false); }

float* CpuStage::bias_weights(size_t n, int u, Tensor t, size_t first) {
  const uint64_t seed = cfg_.work.seed;
  return weights(key(WeightKey::Fill::bias, u, t, n, first), n, [&](float* p) { fill_bias(p, n, seed, u, t, first); });
}

float* CpuStage::projection_rows(size_t row0, size_t rows, int u, Tensor t) {
  const uint64_t seed = cfg_.work.seed;
  const size_t fan_in = hidden_;
  return weights(key(WeightKey::Fill::projection_rows, u, t, row0, rows, fan_in), rows * fan_in,
                 [&](float* p) { fill_projection_rows(p, row0, rows, fan_in, seed, u, t); });
}

float* CpuStage::projection_cols(size_t fan_in, size_t col0, size_t cols, int u, Tensor t) {
  const uint64_t seed = cfg_.work.seed;
  const size_t rows = hidden_;
  return weights(key(WeightKey::Fill::projection_cols, u, t, rows, fan_in, col0, cols), rows * cols,
                 [&](float* p) { fill_projection_cols(p, rows, fan_in, col0, cols, seed, u, t); });
}

float* CpuStage::layer_norm(size_t n, int u, Tensor t, bool plus_one) {
  const uint64_t seed = cfg_.work.seed;
  return weights(key(WeightKey::Fill::norm, u, t, n, plus_one ? 1 : 0), n,
                 [&](float* p) { fill_norm(p, n, seed, u, t, plus_one); });
}

float* CpuStage::embedding_rows(size_t row0, size_t rows) {
  const uint64_t seed = cfg_.work.seed;
  const size_t H = hidden_;
  return weights(key(WeightKey::Fill::embedding, 0, Tensor::embed, row0, rows, H), rows * H,
                 [&](float* p) { fill_embedding(p, rows, H, seed, row0); });
}

size_t CpuStage::add_mla_weights(LayerWeights& w, const LayerShape& s, int u, ScratchSizes& z) {
  // Tensor parallelism refuses MLA (tp_unsupported_reason): the whole layer here.
  const model::MlaShape& a = s.mla;
  const size_t H = hidden_, nh = static_cast<size_t>(s.n_heads), qk = static_cast<size_t>(a.qk_nope + a.qk_rope);
  const size_t D = static_cast<size_t>(a.kv_lora_rank + a.qk_rope), L = static_cast<size_t>(a.kv_lora_rank);
  if (a.q_lora_rank > 0) {
    const size_t ql = static_cast<size_t>(a.q_lora_rank);
    w.q_a = projection(ql, H, u, Tensor::q_a_proj);
    w.q_a_norm = plain_norm(ql, u, Tensor::q_a_norm);
    w.q_b = projection(nh * qk, ql, u, Tensor::q_b_proj);
    z.max_mla_qa = std::max(z.max_mla_qa, ql);
  } else {
    w.q_b = projection(nh * qk, H, u, Tensor::q_proj);
  }
  w.kv_a = projection(D, H, u, Tensor::kv_a_proj);
  w.kv_a_norm = plain_norm(L, u, Tensor::kv_a_norm);
  w.kv_b = projection(nh * (a.qk_nope + a.v_head_dim), L, u, Tensor::kv_b_proj);
  const size_t o_fan_in = nh * a.v_head_dim;
  w.o = projection(H, o_fan_in, u, Tensor::o_proj);
  z.max_q = std::max(z.max_q, nh * qk);
  z.max_mla_kva = std::max(z.max_mla_kva, D);
  z.max_mla_rope = std::max(z.max_mla_rope, nh * a.qk_rope);
  z.max_mla_values = std::max(z.max_mla_values, o_fan_in);
  return nh * D;
}

void CpuStage::add_expert_weights(LayerWeights& w, const LayerShape& s, int u, int layer, ScratchSizes& z) {
  // Tensor parallelism refuses MoE layers: every expert whole.
  const model::MoeShape& e = s.moe;
  const size_t H = hidden_, E = static_cast<size_t>(e.n_experts), Ie = static_cast<size_t>(e.expert_intermediate);
  w.router = projection(E, H, u, Tensor::router);
  if (e.router_bias) w.router_bias = bias_weights(E, u, Tensor::router_bias);
  if (e.router == model::RouterKind::sigmoid_grouped) w.router_correction = bias_weights(E, u, Tensor::router_correction);
  for (int x = 0; x < e.n_experts; ++x) {
    w.expert_gate.push_back(projection(Ie, H, u, expert_tensor(Tensor::expert_gate, x)));
    w.expert_up.push_back(projection(Ie, H, u, expert_tensor(Tensor::expert_up, x)));
    w.expert_down.push_back(projection(H, Ie, u, expert_tensor(Tensor::expert_down, x)));
    const bool b = e.expert_bias;
    w.expert_gate_bias.push_back(b ? bias_weights(Ie, u, expert_tensor(Tensor::expert_gate_bias, x)) : nullptr);
    w.expert_up_bias.push_back(b ? bias_weights(Ie, u, expert_tensor(Tensor::expert_up_bias, x)) : nullptr);
    w.expert_down_bias.push_back(b ? bias_weights(H, u, expert_tensor(Tensor::expert_down_bias, x)) : nullptr);
  }
  w.moe_index = static_cast<int>(expert_tokens_.size());
  expert_tokens_.push_back(std::vector<int64_t>(E + 1, 0));
  expert_tokens_.back()[0] = layer;
  if (cfg_.expert_skew > 0.0) {
    w.skew_key = weight_key(cfg_.work.seed, static_cast<uint64_t>(u), static_cast<uint64_t>(Tensor::expert_skew));
    w.skew_log_p = cpu::expert_popularity_log_p(e.n_experts, cfg_.expert_skew, w.skew_key);
  }
  z.max_experts = std::max(z.max_experts, E);
  z.max_top_k = std::max(z.max_top_k, static_cast<size_t>(e.top_k));
  z.max_inter = std::max(z.max_inter, Ie);
}

void CpuStage::add_mtp_modules(const model::ModelSpec& m, ScratchSizes& z) {
  // Weights keyed by the unit ids num_units() + k, which no real unit has.
  if (embed_ != nullptr) {
    mtp_embed_ = embed_;
  } else {
    mtp_embed_ = embedding_rows(0, static_cast<size_t>(m.vocab));
  }
  mtp_eps_ = static_cast<float>(m.rms_eps);
  for (int k = 0; k < m.mtp_modules; ++k) {
    const int mu = m.num_units() + k;
    MtpModule mod;
    mod.enorm = plain_norm(hidden_, mu, Tensor::mtp_enorm);
    mod.hnorm = plain_norm(hidden_, mu, Tensor::mtp_hnorm);
    mod.eh_proj = projection(hidden_, 2 * hidden_, mu, Tensor::mtp_eh_proj);
    mod.shared_norm = plain_norm(hidden_, mu, Tensor::mtp_shared_norm);
    mod.layer = make_layer(m.mtp_shape, mu, m.n_layers + k, z);
    mtp_.push_back(std::move(mod));
  }
}

size_t CpuStage::add_attention_weights(LayerWeights& w, const LayerShape& s, int u, const TpHeads& th,
                                       ScratchSizes& z) {
  const size_t H = hidden_, hd = static_cast<size_t>(s.head_dim);
  const size_t nq_all = static_cast<size_t>(s.n_heads) * hd;
  const size_t q0 = th.q_begin * hd, kv0 = th.kv_begin * hd;
  const size_t nq = static_cast<size_t>(th.q_count) * hd;
  const size_t nkv = static_cast<size_t>(th.kv_count) * hd;
  // Column-parallel q, k, v (this rank's heads' rows); row-parallel o (their columns).
  w.q = projection_rows(q0, nq, u, Tensor::q_proj);
  w.k = projection_rows(kv0, nkv, u, Tensor::k_proj);
  w.v = projection_rows(kv0, nkv, u, Tensor::v_proj);
  w.o = projection_cols(nq_all, q0, nq, u, Tensor::o_proj);
  if (s.attn_bias) {
    w.q_bias = bias_weights(nq, u, Tensor::q_bias, q0);
    w.k_bias = bias_weights(nkv, u, Tensor::k_bias, kv0);
    w.v_bias = bias_weights(nkv, u, Tensor::v_bias, kv0);
  }
  if (s.qk_norm) {
    w.q_norm = layer_norm(s.head_dim, u, Tensor::q_norm, s.norm_plus_one);
    w.k_norm = layer_norm(s.head_dim, u, Tensor::k_norm, s.norm_plus_one);
  }
  if (s.o_bias) w.o_bias = bias_weights(H, u, Tensor::o_bias);  // TP refuses gpt-oss: the whole bias
  if (s.attn_sinks) {
    const size_t n = static_cast<size_t>(s.n_heads);
    const uint64_t seed = cfg_.work.seed;
    w.sinks = weights(key(WeightKey::Fill::uniform, u, Tensor::sinks, n), n, [&](float* p) {
      fill_uniform(p, n, seed, u, static_cast<uint64_t>(Tensor::sinks), 1.0f);
    });
  }
  z.max_kv = std::max(z.max_kv, nkv);
  return nq;
}

int CpuStage::rope_table_for(const LayerShape& s) {
  // RoPE tables, one per distinct (rope, head_dim) (Gemma-3: local and global differ).
  // MLA rotates only the qk_rope part of each head.
  const int rotated = s.is_mla() ? s.mla.qk_rope : s.head_dim;
  auto it = std::find_if(ropes_.begin(), ropes_.end(), [&](const RopeTable& r) {
    return r.rope == s.rope && r.head_dim == rotated;
  });
  if (it == ropes_.end()) {
    const size_t ctx = static_cast<size_t>(cfg_.work.max_context());
    RopeTable r;
    r.rope = s.rope;
    r.head_dim = rotated;
    const std::vector<double> inv = cpu::rope_inv_freq(s.rope, rotated);
    const int half = rotated / 2;
    r.cos.resize(ctx * half);
    r.sin.resize(ctx * half);
    cpu::rope_tables(r.cos.data(), r.sin.data(), inv.data(), half, cfg_.work.max_context());
    ropes_.push_back(std::move(r));
    it = ropes_.end() - 1;
  }
  return static_cast<int>(it - ropes_.begin());
}

LayerWeights CpuStage::make_layer(const LayerShape& s, int u, int layer, ScratchSizes& z) {
  const size_t H = hidden_;
  const size_t ctx = static_cast<size_t>(cfg_.work.max_context());
  const size_t max_tokens = static_cast<size_t>(cfg_.work.batch) * ctx;
  check_stage_layer(s, static_cast<int>(hidden_), layer);
  // This rank's shard (all of it at width 1): its heads, its slice of the MLP.
  const TpHeads th = tp_heads(s.n_heads, s.n_kv_heads, tp_width_, tp_rank_);
  const auto [i0, i1] = tp_range(static_cast<size_t>(s.intermediate), tp_width_, tp_rank_);
  const size_t hd = static_cast<size_t>(s.head_dim);
  const size_t I_all = static_cast<size_t>(s.intermediate);
  LayerWeights w;
  w.unit = u;
  w.layer = layer;
  w.shape = s;
  w.shape.n_heads = th.q_count;
  w.shape.n_kv_heads = th.kv_count;
  w.intermediate = static_cast<int>(i1 - i0);
  const size_t nq = static_cast<size_t>(th.q_count) * hd;
  const size_t nkv = static_cast<size_t>(th.kv_count) * hd;
  const size_t I = i1 - i0;
  w.input_norm = layer_norm(H, u, Tensor::input_layernorm, s.norm_plus_one);
  // The attention output per token.
  const size_t attn_width = s.is_mla() ? add_mla_weights(w, s, u, z) : add_attention_weights(w, s, u, th, z);
  w.post_attention_norm = layer_norm(H, u, Tensor::post_attention_layernorm, s.norm_plus_one);
  if (s.sandwich_norm) {
    w.pre_feedforward_norm = layer_norm(H, u, Tensor::pre_feedforward_layernorm, s.norm_plus_one);
    w.post_feedforward_norm = layer_norm(H, u, Tensor::post_feedforward_layernorm, s.norm_plus_one);
  }
  if (I > 0) {  // the dense MLP, or a MoE layer's shared experts
    w.gate = projection_rows(i0, I, u, Tensor::gate_proj);
    w.up = projection_rows(i0, I, u, Tensor::up_proj);
    w.down = projection_cols(I_all, i0, I, u, Tensor::down_proj);
  }
  if (s.is_moe()) add_expert_weights(w, s, u, layer, z);
  w.rope_table = rope_table_for(s);

  z.max_q = std::max(z.max_q, nq);
  z.max_attn = std::max(z.max_attn, attn_width);
  z.max_inter = std::max(z.max_inter, I);
  z.kv_floats += static_cast<size_t>(cfg_.work.groups) * max_tokens * layer_cache_floats(s, nkv);
  return w;
}

CpuStage::CpuStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg,
                   std::shared_ptr<WeightCache> cache)
    : first_(first), last_(last), cfg_(cfg), cache_(cache ? std::move(cache) : std::make_shared<WeightCache>()) {
  check_cpu_stage_config(m, first, last, cfg);
  tp_width_ = cfg.tp_width;
  tp_rank_ = cfg.tp_rank;
  tp_ = cfg.tp;
  hidden_ = static_cast<size_t>(m.hidden);
  vocab_ = m.vocab;
  const auto [v0, v1] = tp_range(static_cast<size_t>(m.vocab), tp_width_, tp_rank_);
  vocab_begin_ = v0;
  vocab_local_ = static_cast<int>(v1 - v0);
  embed_scale_ = m.embed_scale_sqrt_hidden ? static_cast<float>(std::sqrt(static_cast<double>(m.hidden))) : 1.0f;
  final_norm_plus_one_ = m.final_norm_plus_one;
  final_softcap_ = static_cast<float>(m.final_softcap);
  final_eps_ = static_cast<float>(m.rms_eps);

  ScratchSizes z;
  for (int u = first; u <= last; ++u) add_unit(m, u, z);
  carve_kv_caches(z);
  allocate_scratch(z);
}

void CpuStage::add_unit(const model::ModelSpec& m, int u, ScratchSizes& z) {
  const model::Unit& unit = m.units[u];
  if (unit.kind == UnitKind::embed) {
    has_embed_ = true;
    embed_ = embedding_rows(0, static_cast<size_t>(m.vocab));
  } else if (unit.kind == UnitKind::head) {
    add_head(m, u, z);
  } else {
    if (unit.layer < 0 || unit.layer >= static_cast<int>(m.layers.size())) {
      throw UserError("unit '" + unit.name + "' has layer index " + std::to_string(unit.layer) +
                      " outside [0, " + std::to_string(m.layers.size()) + ")");
    }
    layers_.push_back(make_layer(m.layers[unit.layer], u, unit.layer, z));
  }
}

void CpuStage::add_head(const model::ModelSpec& m, int u, ScratchSizes& z) {
  const size_t H = hidden_;
  has_head_ = true;
  final_norm_ = layer_norm(H, u, Tensor::final_norm, m.final_norm_plus_one);
  if (m.tie_embeddings && embed_ != nullptr) {
    // Same stage holds embed: share the one matrix, as HF ties it (this rank's rows of it;
    // the embedding is replicated, backend/tensor_parallel.h).
    lm_head_ = embed_ + vocab_begin_ * H;
  } else {
    const size_t rows = static_cast<size_t>(vocab_local_);
    lm_head_ = m.tie_embeddings ? embedding_rows(vocab_begin_, rows) : projection_rows(vocab_begin_, rows, u, Tensor::lm_head);
  }
  if (m.mtp) add_mtp_modules(m, z);
}

void CpuStage::carve_kv_caches(const ScratchSizes& z) {
  const size_t max_tokens = static_cast<size_t>(cfg_.work.batch) * static_cast<size_t>(cfg_.work.max_context());
  kv_bytes_ = z.kv_floats * sizeof(float);
  if (z.kv_floats == 0) return;
  float* p = nullptr;
  if (cfg_.kv_pool_tokens > 0) {
    // Resident only where written (cpu_paged_store.h); not a host block: evicting it would
    // map its untouched pages.
    kv_paged_ = cpu::PagedStore(z.kv_floats);
    p = kv_paged_.data();
  } else {
    kv_store_ = cpu::make_aligned_floats(z.kv_floats, /*zero=*/true);  // zeros: pages touched now
    blocks_.emplace_back(kv_store_.get(), kv_bytes_);
    p = kv_store_.get();
  }
  std::vector<LayerWeights*> cached;
  for (LayerWeights& w : layers_) cached.push_back(&w);
  for (MtpModule& mod : mtp_) cached.push_back(&mod.layer);
  for (LayerWeights* wp : cached) {
    LayerWeights& w = *wp;
    const size_t nkv = static_cast<size_t>(w.shape.n_kv_heads) * w.shape.head_dim;
    const size_t per = max_tokens * layer_cache_floats(w.shape, nkv);
    for (int g = 0; g < cfg_.work.groups; ++g) {
      w.k_cache.push_back(p);
      // MLA: one latent cache is the keys and the values; else K then V.
      w.v_cache.push_back(w.shape.is_mla() ? p : p + per / 2);
      p += per;
    }
  }
}

void CpuStage::release_slots(int group, const std::vector<int32_t>& slots) {
  if (kv_paged_.data() == nullptr || slots.empty()) return;
  const size_t ctx = static_cast<size_t>(cfg_.work.max_context());
  auto release = [&](const LayerWeights& w) {
    const size_t nkv = static_cast<size_t>(w.shape.n_kv_heads) * w.shape.head_dim;
    // Floats of one slot in one cache: K or V rows, or MLA's latent rows (one cache).
    const size_t seq = ctx * (w.shape.is_mla() ? layer_cache_floats(w.shape, nkv) : nkv);
    for (const int32_t slot : slots) {
      kv_paged_.release(w.k_cache[group] + slot * seq, seq);
      if (!w.shape.is_mla()) kv_paged_.release(w.v_cache[group] + slot * seq, seq);
    }
  };
  for (const LayerWeights& w : layers_) release(w);
  for (const MtpModule& mod : mtp_) release(mod.layer);
}

void CpuStage::allocate_scratch(const ScratchSizes& z) {
  const size_t H = hidden_;
  const size_t B = static_cast<size_t>(cfg_.work.batch);
  const size_t max_tokens = B * static_cast<size_t>(cfg_.work.max_context());
  x_.resize(max_tokens * H);
  uniform_slot_.resize(B);
  for (size_t b = 0; b < B; ++b) uniform_slot_[b] = static_cast<int32_t>(b);
  uniform_pos_.resize(B);
  uniform_offset_.assign(B + 1, 0);
  if (!mtp_.empty()) {
    mtp_cat_.resize(max_tokens * 2 * H);
    draft_.resize(B);
  }
  if (!layers_.empty() || !mtp_.empty()) {
    h_.resize(max_tokens * H);
    q_.resize(max_tokens * z.max_q);
    k_.resize(max_tokens * z.max_kv);
    v_.resize(max_tokens * z.max_kv);
    attn_.resize(max_tokens * z.max_attn);
    gate_.resize(max_tokens * z.max_inter);
    up_.resize(max_tokens * z.max_inter);
    scores_.resize(cpu::attention_scratch_floats(cfg_.work.max_context()));
    mla_qa_.resize(max_tokens * z.max_mla_qa);
    mla_kva_.resize(max_tokens * z.max_mla_kva);
    mla_q_.resize(max_tokens * (z.max_mla_kva > 0 ? z.max_attn : 0));
    mla_rope_.resize(max_tokens * z.max_mla_rope);
    mla_values_.resize(max_tokens * z.max_mla_values);
    if (z.max_experts > 0) {
      moe_logits_.resize(max_tokens * z.max_experts);
      moe_rows_.resize(max_tokens * H);
      moe_out_.resize(max_tokens * H);
      moe_sum_.resize(max_tokens * H);
      route_weights_.resize(max_tokens * z.max_top_k);
      route_experts_.resize(max_tokens * z.max_top_k);
      expert_count_.resize(z.max_experts + 1);
      expert_slots_.resize(max_tokens * z.max_top_k);
    }
  }
  if (has_head_) {
    last_rows_.resize(B * H);
    logits_.resize(B * static_cast<size_t>(vocab_local_));
    best_.resize(B);
  }
}

}  // namespace cpu

std::unique_ptr<StageExecutor> create_cpu_stage(const model::ModelSpec& m, int first, int last,
                                                const StageConfig& cfg, std::shared_ptr<cpu::WeightCache> cache) {
  return std::make_unique<cpu::CpuStage>(m, first, last, cfg, std::move(cache));
}

}  // namespace ppb
