#include "backend/cpu/cpu_stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_aligned.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_stage_detail.h"
#include "backend/tensor_parallel.h"
#include "backend/weights.h"
#include "common/error.h"
#include "model/model_spec.h"

namespace ppb {
namespace {

using model::LayerShape;
using model::UnitKind;

/// Weights of one decoder layer; null where the layer has no such tensor.
struct LayerWeights {
  int unit = 0;
  int layer = 0;      ///< index in ModelSpec::layers (MTP module k: n_layers + k)
  int moe_index = -1; ///< MoE layers: row of CpuStage::expert_tokens_
  std::vector<double> skew_log_p;  ///< --expert-skew: the layer's popularity law [E]; empty: none
  uint64_t skew_key = 0;
  LayerShape shape;  ///< this rank's shard: n_heads and n_kv_heads are its own heads (tp_heads)
  int intermediate = 0;  ///< this rank's slice of the MLP (the whole of it at width 1)
  int rope_table = 0;  // index into CpuStage::ropes_
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* o = nullptr;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* gate = nullptr;
  const float* up = nullptr;
  const float* down = nullptr;
  const float* input_norm = nullptr;
  const float* post_attention_norm = nullptr;
  const float* pre_feedforward_norm = nullptr;   // sandwich only
  const float* post_feedforward_norm = nullptr;  // sandwich only
  const float* q_norm = nullptr;                 // qk_norm only
  const float* k_norm = nullptr;
  const float* o_bias = nullptr;                 // gpt-oss
  const float* sinks = nullptr;                  // gpt-oss [n_heads]
  // Multi-head latent attention (shape.is_mla()); q_b is q (Tensor::q_proj) when q_lora_rank is 0.
  const float* q_a = nullptr;
  const float* q_a_norm = nullptr;
  const float* q_b = nullptr;
  const float* kv_a = nullptr;
  const float* kv_a_norm = nullptr;
  const float* kv_b = nullptr;
  // Mixture of experts (shape.is_moe()); gate/up/down above are the shared experts, if any.
  const float* router = nullptr;
  const float* router_bias = nullptr;
  const float* router_correction = nullptr;
  std::vector<const float*> expert_gate, expert_up, expert_down;                  // [E]
  std::vector<const float*> expert_gate_bias, expert_up_bias, expert_down_bias;   // [E] (gpt-oss)
  // K and V caches of every group: [groups][batch, max_context, n_kv_heads, head_dim] (this
  // rank's KV heads). MLA: one latent cache [batch, max_context, kv_lora_rank + qk_rope] per
  // group, in k_cache and v_cache alike (the attention reads its values from the keys' rows).
  std::vector<float*> k_cache;
  std::vector<float*> v_cache;
};

/// cos/sin tables [max_context, head_dim/2] of one distinct (rope, head_dim).
struct RopeTable {
  model::Rope rope;
  int head_dim = 0;
  cpu::AlignedFloatVector cos;
  cpu::AlignedFloatVector sin;
};

using cpu::layer_cache_floats;

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

class CpuStage final : public StageExecutor {
 public:
  CpuStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg);

  int first_unit() const override { return first_; }
  int last_unit() const override { return last_; }
  size_t input_bytes(int tokens) const override {
    const size_t n = static_cast<size_t>(cfg_.work.batch) * tokens;
    return has_embed_ ? n * sizeof(int32_t) : n * hidden_ * sizeof(float);
  }
  size_t output_bytes(int tokens) const override {
    const size_t n = static_cast<size_t>(cfg_.work.batch);
    return has_head_ ? n * sizeof(int32_t) : n * tokens * hidden_ * sizeof(float);
  }
  void enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) override;
  // Ragged forward (issue 37): not built yet on this backend.
  size_t ragged_input_bytes(int total_tokens) const override { return 0; }
  size_t ragged_output_bytes(int rows, int total_tokens) const override { return 0; }
  void enqueue_forward_ragged(Lane&, const void*, void*, int, const RaggedStep&) override {
    throw InternalError("this backend's stage has no ragged forward yet (issue 37)");
  }
  double checksum() const override { return checksum_; }
  void reset_checksum() override {
    checksum_ = 0.0;
    for (auto& row : expert_tokens_) std::fill(row.begin() + 1, row.end(), 0);
  }
  std::vector<std::vector<int64_t>> expert_tokens() const override { return expert_tokens_; }
  size_t weight_bytes() const override { return weight_bytes_; }
  size_t kv_cache_bytes() const override { return kv_bytes_; }

 private:
  float* new_weights(size_t n);
  /// The largest of each scratch size over the stage's layers, and the KV-cache floats.
  struct ScratchSizes {
    size_t max_q = 0, max_kv = 0, max_inter = 0, max_attn = 0;
    size_t max_mla_qa = 0, max_mla_kva = 0, max_mla_rope = 0, max_mla_values = 0, max_experts = 0, max_top_k = 0;
    size_t kv_floats = 0;
  };
  /// The constructor's weights of unit u (embed, head or a decoder layer); grows z.
  void add_unit(const model::ModelSpec& m, int u, ScratchSizes& z);
  /// add_unit's head: the final norm, this rank's rows of lm_head (shared with embed when tied
  /// on this stage), the MTP modules.
  void add_head(const model::ModelSpec& m, int u, ScratchSizes& z);
  /// The constructor's KV caches: one zeroed block of z.kv_floats, carved per layer and group.
  void carve_kv_caches(const ScratchSizes& z);
  /// The constructor's scratch buffers, sized once for batch * max_context tokens.
  void allocate_scratch(const ScratchSizes& z);
  /// Builds one decoder layer of shape s, its weights keyed by unit u (layer: its index in
  /// ModelSpec::layers, for messages), this rank's shard, with its RoPE table; grows z.
  LayerWeights make_layer(const LayerShape& s, int u, int layer, ScratchSizes& z);
  /// The whole tensor [rows, fan_in] (fill_projection), a plain RMSNorm weight, elements
  /// [first, first + n) of a bias, of unit u.
  float* projection(size_t rows, size_t fan_in, int u, Tensor t);
  float* plain_norm(size_t n, int u, Tensor t);
  float* bias_weights(size_t n, int u, Tensor t, size_t first = 0);
  /// Rows [row0, row0 + rows) of unit u's [*, H] tensor (a column-parallel shard).
  float* projection_rows(size_t row0, size_t rows, int u, Tensor t);
  /// Columns [col0, col0 + cols) of unit u's [H, fan_in] tensor (a row-parallel shard).
  float* projection_cols(size_t fan_in, size_t col0, size_t cols, int u, Tensor t);
  /// A layer's RMSNorm weight [n] of unit u (plus_one: the (1 + w) form).
  float* layer_norm(size_t n, int u, Tensor t, bool plus_one);
  /// make_layer's attention weights of this rank's heads th (q, k, v, o; biases, q/k norms,
  /// sinks); returns the attention output's width per token.
  size_t add_attention_weights(LayerWeights& w, const LayerShape& s, int u, const TpHeads& th, ScratchSizes& z);
  /// make_layer's MLA attention weights; returns the attention output's width per token.
  size_t add_mla_weights(LayerWeights& w, const LayerShape& s, int u, ScratchSizes& z);
  /// Index in ropes_ of the cos/sin tables of layer shape s, built on first use.
  int rope_table_for(const LayerShape& s);
  /// make_layer's router and routed experts, and the layer's row of expert_tokens_.
  void add_expert_weights(LayerWeights& w, const LayerShape& s, int u, int layer, ScratchSizes& z);
  /// --mtp: the MTP modules after the head (their norms, eh_proj, layer; the draft tokens'
  /// embedding table unless this stage holds embed's).
  void add_mtp_modules(const model::ModelSpec& m, ScratchSizes& z);
  void forward(const void* in, void* out, int group, int pos, int tokens);
  void layer_forward(const LayerWeights& w, int group, int pos, int tokens);
  void mla_attention(const LayerWeights& w, int group, int pos, int tokens, float* out);
  void moe_mlp(const LayerWeights& w, int rows, float* out);
  /// One gated MLP's weights [I, H], [I, H], [H, I] and optional biases [I], [I], [H].
  struct MlpWeights {
    const float *gate = nullptr, *up = nullptr, *down = nullptr;
    const float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
  };
  /// out[rows, H] = down(act(gate(in)) * up(in)) with the layer's activation (HF LlamaMLP; gpt-oss
  /// experts with biases and the clamp); out may alias in. Scratch: gate_, up_ [rows, I].
  void gated_mlp(float* out, const float* in, int rows, int I, const MlpWeights& w, const LayerShape& s);
  void mtp_forward(const int32_t* tokens, int group, int pos, int T);
  void head_forward(int32_t* out, int tokens);

  int first_ = 0;
  int last_ = 0;
  StageConfig cfg_;
  size_t hidden_ = 0;
  int vocab_ = 0;
  int tp_width_ = 1;  ///< tensor parallelism: this stage is shard tp_rank_ of tp_width_
  int tp_rank_ = 0;
  TpGroup* tp_ = nullptr;
  size_t vocab_begin_ = 0;  ///< the head's tokens [vocab_begin_, vocab_begin_ + vocab_local_)
  int vocab_local_ = 0;
  bool has_embed_ = false;
  bool has_head_ = false;
  float embed_scale_ = 1.0f;
  bool final_norm_plus_one_ = false;
  float final_softcap_ = 0.0f;
  float final_eps_ = 1e-6f;

  std::vector<cpu::AlignedFloats> weight_store_;  // one 64-byte-aligned block per tensor
  size_t weight_bytes_ = 0;
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  const float* lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<RopeTable> ropes_;

  cpu::AlignedFloats kv_store_;
  size_t kv_bytes_ = 0;

  // Scratch, sized once for batch * max_context tokens.
  cpu::AlignedFloatVector x_, h_, q_, k_, v_, attn_, gate_, up_, scores_, last_rows_, logits_;
  // MLA: q's low-rank part, [c_kv, k_rope] rows, absorbed queries, RoPE staging, per-head values.
  cpu::AlignedFloatVector mla_qa_, mla_kva_, mla_q_, mla_rope_, mla_values_;
  // MoE: router logits, routed rows gathered, expert output, the layer's sum; the choice.
  cpu::AlignedFloatVector moe_logits_, moe_rows_, moe_out_, moe_sum_, route_weights_;
  std::vector<int32_t> route_experts_;
  std::vector<int> expert_count_, expert_slots_;
  std::vector<float> best_;  // the head's [B] largest local logits (width > 1)

  // --mtp (model::ModelSpec::mtp): the multi-token-prediction modules after the head.
  struct MtpModule {
    const float* enorm = nullptr;        // [H] the draft token's embedding norm
    const float* hnorm = nullptr;        // [H] the hidden state's norm
    const float* eh_proj = nullptr;      // [H, 2H]
    const float* shared_norm = nullptr;  // [H] before the shared lm_head
    LayerWeights layer;
  };
  std::vector<MtpModule> mtp_;
  const float* mtp_embed_ = nullptr;     // the embedding table (embed_ when this stage holds it)
  float mtp_eps_ = 1e-6f;
  cpu::AlignedFloatVector mtp_cat_;      // [B*T, 2H]
  std::vector<int32_t> draft_;           // [B] the token each module starts from, then its draft

  double checksum_ = 0.0;
  /// Per MoE layer: [0] its layer index, then the tokens routed to each expert since the last
  /// reset_checksum().
  std::vector<std::vector<int64_t>> expert_tokens_;
};

float* CpuStage::new_weights(size_t n) {
  weight_store_.push_back(cpu::make_aligned_floats(n));
  weight_bytes_ += n * sizeof(float);
  return weight_store_.back().get();
}

float* CpuStage::projection(size_t rows, size_t fan_in, int u, Tensor t) {
  float* p = new_weights(rows * fan_in);
  fill_projection(p, rows, fan_in, cfg_.work.seed, u, t);
  return p;
}

float* CpuStage::plain_norm(size_t n, int u, Tensor t) {
  float* p = new_weights(n);
  fill_norm(p, n, cfg_.work.seed, u, t, false);
  return p;
}

float* CpuStage::bias_weights(size_t n, int u, Tensor t, size_t first) {
  float* p = new_weights(n);
  fill_bias(p, n, cfg_.work.seed, u, t, first);
  return p;
}

float* CpuStage::projection_rows(size_t row0, size_t rows, int u, Tensor t) {
  float* p = new_weights(rows * hidden_);
  fill_projection_rows(p, row0, rows, hidden_, cfg_.work.seed, u, t);
  return p;
}

float* CpuStage::projection_cols(size_t fan_in, size_t col0, size_t cols, int u, Tensor t) {
  float* p = new_weights(hidden_ * cols);
  fill_projection_cols(p, hidden_, fan_in, col0, cols, cfg_.work.seed, u, t);
  return p;
}

float* CpuStage::layer_norm(size_t n, int u, Tensor t, bool plus_one) {
  float* p = new_weights(n);
  fill_norm(p, n, cfg_.work.seed, u, t, plus_one);
  return p;
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
    float* e = new_weights(static_cast<size_t>(m.vocab) * hidden_);
    fill_embedding(e, m.vocab, hidden_, cfg_.work.seed);
    mtp_embed_ = e;
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
    float* sk = new_weights(static_cast<size_t>(s.n_heads));
    fill_uniform(sk, static_cast<size_t>(s.n_heads), cfg_.work.seed, u, static_cast<uint64_t>(Tensor::sinks), 1.0f);
    w.sinks = sk;
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

CpuStage::CpuStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg)
    : first_(first), last_(last), cfg_(cfg) {
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
    float* e = new_weights(static_cast<size_t>(m.vocab) * hidden_);
    fill_embedding(e, m.vocab, hidden_, cfg_.work.seed);
    embed_ = e;
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
  const uint64_t seed = cfg_.work.seed;
  const size_t H = hidden_;
  has_head_ = true;
  float* n = new_weights(H);
  fill_norm(n, H, seed, u, Tensor::final_norm, m.final_norm_plus_one);
  final_norm_ = n;
  if (m.tie_embeddings && embed_ != nullptr) {
    // Same stage holds embed: share the one matrix, as HF ties it (this rank's rows of it;
    // the embedding is replicated, backend/tensor_parallel.h).
    lm_head_ = embed_ + vocab_begin_ * H;
  } else {
    float* w = new_weights(static_cast<size_t>(vocab_local_) * H);
    if (m.tie_embeddings) {
      fill_embedding(w, vocab_local_, H, seed, vocab_begin_);
    } else {
      fill_projection_rows(w, vocab_begin_, vocab_local_, H, seed, u, Tensor::lm_head);
    }
    lm_head_ = w;
  }
  if (m.mtp) add_mtp_modules(m, z);
}

void CpuStage::carve_kv_caches(const ScratchSizes& z) {
  const size_t max_tokens = static_cast<size_t>(cfg_.work.batch) * static_cast<size_t>(cfg_.work.max_context());
  kv_bytes_ = z.kv_floats * sizeof(float);
  if (z.kv_floats == 0) return;
  kv_store_ = cpu::make_aligned_floats(z.kv_floats, /*zero=*/true);  // zeros: pages touched now
  float* p = kv_store_.get();
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

void CpuStage::allocate_scratch(const ScratchSizes& z) {
  const size_t H = hidden_;
  const size_t B = static_cast<size_t>(cfg_.work.batch);
  const size_t max_tokens = B * static_cast<size_t>(cfg_.work.max_context());
  x_.resize(max_tokens * H);
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

void CpuStage::enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) {
  if (group < 0 || group >= cfg_.work.groups || pos < 0 || tokens < 1 || pos + tokens > cfg_.work.max_context()) {
    throw InternalError("enqueue_forward(group=" + std::to_string(group) + ", pos=" + std::to_string(pos) +
                        ", tokens=" + std::to_string(tokens) + ") is outside the stage's groups=" +
                        std::to_string(cfg_.work.groups) + ", max_context=" + std::to_string(cfg_.work.max_context()));
  }
  lane.host_task([this, in, out, group, pos, tokens] { forward(in, out, group, pos, tokens); });
}

void CpuStage::forward(const void* in, void* out, int group, int pos, int tokens) {
  const size_t rows = static_cast<size_t>(cfg_.work.batch) * tokens;
  if (has_embed_) {
    cpu::embedding(x_.data(), static_cast<const int32_t*>(in), rows, embed_, vocab_,
                   static_cast<int>(hidden_), embed_scale_);
  } else {
    std::memcpy(x_.data(), in, rows * hidden_ * sizeof(float));
  }
  for (const LayerWeights& w : layers_) layer_forward(w, group, pos, tokens);
  if (has_head_) {
    head_forward(static_cast<int32_t*>(out), tokens);
    if (!mtp_.empty()) mtp_forward(static_cast<const int32_t*>(out), group, pos, tokens);
  } else {
    std::memcpy(out, x_.data(), rows * hidden_ * sizeof(float));
  }
}

void CpuStage::layer_forward(const LayerWeights& w, int group, int pos, int tokens) {
  const LayerShape& s = w.shape;
  const int B = cfg_.work.batch;
  const int M = B * tokens;
  const int H = static_cast<int>(hidden_);
  const int hd = s.head_dim;
  const int nq = s.n_heads * hd;     // this rank's heads
  const int nkv = s.n_kv_heads * hd;
  const int I = w.intermediate;      // this rank's slice
  const float eps = static_cast<float>(s.rms_eps);
  const size_t MH = static_cast<size_t>(M) * H;
  float* x = x_.data();
  float* h = h_.data();

  // Attention block.
  cpu::rmsnorm(h, x, w.input_norm, M, H, eps, s.norm_plus_one);
  if (s.is_mla()) {
    mla_attention(w, group, pos, tokens, h);
  } else {
    cpu::linear(q_.data(), h, w.q, w.q_bias, M, nq, H);
    cpu::linear(k_.data(), h, w.k, w.k_bias, M, nkv, H);
    cpu::linear(v_.data(), h, w.v, w.v_bias, M, nkv, H);
    if (s.qk_norm) {
      cpu::rmsnorm(q_.data(), q_.data(), w.q_norm, static_cast<size_t>(M) * s.n_heads, hd, eps, s.norm_plus_one);
      cpu::rmsnorm(k_.data(), k_.data(), w.k_norm, static_cast<size_t>(M) * s.n_kv_heads, hd, eps, s.norm_plus_one);
    }
    const RopeTable& rt = ropes_[w.rope_table];
    cpu::rope(q_.data(), B, tokens, s.n_heads, hd, pos, rt.cos.data(), rt.sin.data());
    cpu::rope(k_.data(), B, tokens, s.n_kv_heads, hd, pos, rt.cos.data(), rt.sin.data());
    float* kc = w.k_cache[group];
    float* vc = w.v_cache[group];
    cpu::kv_cache_write(kc, k_.data(), B, tokens, pos, cfg_.work.max_context(), nkv);
    cpu::kv_cache_write(vc, v_.data(), B, tokens, pos, cfg_.work.max_context(), nkv);
    cpu::AttentionShape as;
    as.batch = B;
    as.tokens = tokens;
    as.pos0 = pos;
    as.max_context = cfg_.work.max_context();
    as.n_heads = s.n_heads;
    as.n_kv_heads = s.n_kv_heads;
    as.head_dim = hd;
    as.window = s.sliding_window;
    as.scale = static_cast<float>(s.attn_scale > 0.0 ? s.attn_scale : 1.0 / std::sqrt(static_cast<double>(hd)));
    as.softcap = static_cast<float>(s.attn_softcap);
    as.sinks = w.sinks;
    cpu::attention(attn_.data(), q_.data(), kc, vc, as, scores_.data());
    cpu::linear(h, attn_.data(), w.o, w.o_bias, M, H, nq);
  }
  if (tp_width_ > 1) tp_->allreduce_sum(h, MH);  // row-parallel o_proj: sum the ranks' partials
  if (s.sandwich_norm) cpu::rmsnorm(h, h, w.post_attention_norm, M, H, eps, s.norm_plus_one);
  cpu::add_inplace(x, h, MH);

  // MLP block.
  const float* pre_mlp_norm = s.sandwich_norm ? w.pre_feedforward_norm : w.post_attention_norm;
  cpu::rmsnorm(h, x, pre_mlp_norm, M, H, eps, s.norm_plus_one);
  if (s.is_moe()) {
    moe_mlp(w, M, h);
  } else {
    gated_mlp(h, h, M, I, {w.gate, w.up, w.down}, s);
  }
  if (tp_width_ > 1) tp_->allreduce_sum(h, MH);  // row-parallel down_proj
  if (s.sandwich_norm) cpu::rmsnorm(h, h, w.post_feedforward_norm, M, H, eps, s.norm_plus_one);
  cpu::add_inplace(x, h, MH);
}

// Absorbed MLA (DeepSeek-V2 paper §2.1.2; DeepSeek-V3 inference/model.py, attn_impl "absorb"):
// W_kvb's key half is folded into each head's query (q_lat = W_UK^T q_nope, [kv_lora]) and its
// value half applied after the attention (v = W_UV o_lat), so the attention itself is MQA over
// the latent cache rows [c_kv, k_rope] with keys and values in the same rows: scores
// q_lat . c_kv + q_rope . k_rope; outputs sum_j p_j [c_kv, k_rope]_j, of which the first
// kv_lora_rank features are o_lat. Equal, up to rounding, to expanding k_nope = W_UK c_kv and
// v = W_UV c_kv per position (tests/unit/test_cpu_ops.cpp checks it against that form).
void CpuStage::mla_attention(const LayerWeights& w, int group, int pos, int tokens, float* out) {
  const LayerShape& s = w.shape;
  const model::MlaShape& a = s.mla;
  const int B = cfg_.work.batch, M = B * tokens, H = static_cast<int>(hidden_), nh = s.n_heads;
  const int nope = a.qk_nope, rd = a.qk_rope, qk = nope + rd, L = a.kv_lora_rank, D = L + rd, vd = a.v_head_dim;
  const float eps = static_cast<float>(s.rms_eps);
  const float* hn = out;  // the normed input; overwritten only by the final o_proj
  float* q = q_.data();
  if (a.q_lora_rank > 0) {
    cpu::linear(mla_qa_.data(), hn, w.q_a, nullptr, M, a.q_lora_rank, H);
    cpu::rmsnorm(mla_qa_.data(), mla_qa_.data(), w.q_a_norm, M, a.q_lora_rank, eps, false);
    cpu::linear(q, mla_qa_.data(), w.q_b, nullptr, M, nh * qk, a.q_lora_rank);
  } else {
    cpu::linear(q, hn, w.q_b, nullptr, M, nh * qk, H);
  }
  float* kva = mla_kva_.data();
  cpu::linear(kva, hn, w.kv_a, nullptr, M, D, H);
  for (int m = 0; m < M; ++m) cpu::rmsnorm(kva + static_cast<size_t>(m) * D, kva + static_cast<size_t>(m) * D, w.kv_a_norm, 1, L, eps, false);
  // RoPE on k_rope (one "head" per token) and on each head's q_rope, staged contiguously.
  const RopeTable& rt = ropes_[w.rope_table];
  float* r = mla_rope_.data();
  for (int m = 0; m < M; ++m) std::memcpy(r + static_cast<size_t>(m) * rd, kva + static_cast<size_t>(m) * D + L, rd * sizeof(float));
  cpu::rope(r, B, tokens, 1, rd, pos, rt.cos.data(), rt.sin.data());
  for (int m = 0; m < M; ++m) std::memcpy(kva + static_cast<size_t>(m) * D + L, r + static_cast<size_t>(m) * rd, rd * sizeof(float));
  float* cache = w.k_cache[group];
  cpu::kv_cache_write(cache, kva, B, tokens, pos, cfg_.work.max_context(), D);
  // Absorbed queries [M, nh, D]: q_lat then the rotated q_rope.
  float* qa = mla_q_.data();
  for (int h = 0; h < nh; ++h)
    cpu::sgemm(false, M, L, nope, 1.0f, q + static_cast<size_t>(h) * qk, nh * qk,
               w.kv_b + static_cast<size_t>(h) * (nope + vd) * L, L, 0.0f, qa + static_cast<size_t>(h) * D, nh * D);
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < nh; ++h)
      std::memcpy(r + (static_cast<size_t>(m) * nh + h) * rd, q + static_cast<size_t>(m) * nh * qk + static_cast<size_t>(h) * qk + nope,
                  rd * sizeof(float));
  cpu::rope(r, B, tokens, nh, rd, pos, rt.cos.data(), rt.sin.data());
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < nh; ++h)
      std::memcpy(qa + (static_cast<size_t>(m) * nh + h) * D + L, r + (static_cast<size_t>(m) * nh + h) * rd, rd * sizeof(float));
  cpu::AttentionShape as;
  as.batch = B;
  as.tokens = tokens;
  as.pos0 = pos;
  as.max_context = cfg_.work.max_context();
  as.n_heads = nh;
  as.n_kv_heads = 1;
  as.head_dim = D;
  as.scale = static_cast<float>(s.attn_scale);
  cpu::attention(attn_.data(), qa, cache, cache, as, scores_.data());
  // Each head's values: W_UV [v, kv_lora] times its o_lat.
  float* values = mla_values_.data();
  for (int h = 0; h < nh; ++h)
    cpu::sgemm(true, M, vd, L, 1.0f, attn_.data() + static_cast<size_t>(h) * D, nh * D,
               w.kv_b + (static_cast<size_t>(h) * (nope + vd) + nope) * L, L, 0.0f, values + static_cast<size_t>(h) * vd, nh * vd);
  cpu::linear(out, values, w.o, nullptr, M, H, nh * vd);
}

void CpuStage::gated_mlp(float* out, const float* in, int rows, int I, const MlpWeights& w, const LayerShape& s) {
  const int H = static_cast<int>(hidden_);
  cpu::linear(gate_.data(), in, w.gate, w.gate_bias, rows, I, H);
  cpu::linear(up_.data(), in, w.up, w.up_bias, rows, I, H);
  cpu::gated_activation(gate_.data(), gate_.data(), up_.data(), static_cast<size_t>(rows) * I, s.act,
                        static_cast<float>(s.swiglu_limit));
  cpu::linear(out, gate_.data(), w.down, w.down_bias, rows, H, I);
}

// Routed experts over only the tokens routed to each (grouped by expert, in expert order, so the
// sum of a token's contributions has one fixed order), then the shared experts.
void CpuStage::moe_mlp(const LayerWeights& w, int rows, float* out) {
  const LayerShape& s = w.shape;
  const model::MoeShape& e = s.moe;
  const int E = e.n_experts, k = e.top_k, Ie = e.expert_intermediate, H = static_cast<int>(hidden_);
  const float* hn = out;  // the normed input
  cpu::linear(moe_logits_.data(), hn, w.router, w.router_bias, rows, E, H);
  cpu::RouteSkew skew{w.skew_log_p.data(), w.skew_key};
  cpu::route_tokens(route_experts_.data(), route_weights_.data(), moe_logits_.data(), rows, e, w.router_correction,
                    w.skew_log_p.empty() ? nullptr : &skew);
  // Counting sort of the rows * k choices by expert, keeping token order within an expert.
  const int n_choices = rows * k;
  std::fill(expert_count_.begin(), expert_count_.begin() + E + 1, 0);
  for (int i = 0; i < n_choices; ++i) ++expert_count_[route_experts_[i] + 1];
  for (int x = 0; x < E; ++x) expert_count_[x + 1] += expert_count_[x];
  {
    std::vector<int> next(expert_count_.begin(), expert_count_.begin() + E);
    for (int i = 0; i < n_choices; ++i) expert_slots_[next[route_experts_[i]]++] = i;
  }
  float* sum = moe_sum_.data();
  std::fill(sum, sum + static_cast<size_t>(rows) * H, 0.0f);
  float* xr = moe_rows_.data();
  float* y = moe_out_.data();
  for (int x = 0; x < E; ++x) {
    const int begin = expert_count_[x], n = expert_count_[x + 1] - begin;
    expert_tokens_[w.moe_index][x + 1] += n;
    if (n == 0) continue;  // decode reads only the experts its tokens chose
    for (int r = 0; r < n; ++r)
      std::memcpy(xr + static_cast<size_t>(r) * H, hn + static_cast<size_t>(expert_slots_[begin + r] / k) * H, H * sizeof(float));
    gated_mlp(y, xr, n, Ie,
              {w.expert_gate[x], w.expert_up[x], w.expert_down[x], w.expert_gate_bias[x], w.expert_up_bias[x],
               w.expert_down_bias[x]},
              s);
    for (int r = 0; r < n; ++r) {
      const int slot = expert_slots_[begin + r];
      const float wt = route_weights_[slot];
      float* dst = sum + static_cast<size_t>(slot / k) * H;
      const float* src = y + static_cast<size_t>(r) * H;
      for (int j = 0; j < H; ++j) dst[j] += wt * src[j];
    }
  }
  if (w.intermediate > 0) {  // shared experts: every token
    gated_mlp(y, hn, rows, w.intermediate, {w.gate, w.up, w.down}, s);
    cpu::add_inplace(sum, y, static_cast<size_t>(rows) * H);
  }
  std::memcpy(out, sum, static_cast<size_t>(rows) * H * sizeof(float));
}

// DeepSeek-V3's MTP module k (inference/model.py, README_WEIGHTS): h' = eh_proj([enorm(E t),
// hnorm(h)]) then a decoder layer, then the shared head's norm and lm_head drafting the next
// token; module k + 1 starts from module k's hidden state and draft. The token input is the
// head's greedy token for every position of a sequence (this stage does not receive the
// prompt's ids; the cost is the module's either way), and the drafts are not verified: the
// pipeline's tokens stay the main model's. The modules' last hidden states join the checksum,
// so that validation covers them.
void CpuStage::mtp_forward(const int32_t* tokens, int group, int pos, int T) {
  const int B = cfg_.work.batch, M = B * T, H = static_cast<int>(hidden_);
  std::copy(tokens, tokens + B, draft_.begin());
  float* cat = mtp_cat_.data();
  for (const MtpModule& mod : mtp_) {
    for (int m = 0; m < M; ++m) {
      const float* e = mtp_embed_ + static_cast<size_t>(draft_[m / T]) * H;
      cpu::rmsnorm(cat + static_cast<size_t>(m) * 2 * H, e, mod.enorm, 1, H, mtp_eps_, false);
      cpu::rmsnorm(cat + static_cast<size_t>(m) * 2 * H + H, x_.data() + static_cast<size_t>(m) * H, mod.hnorm, 1, H,
                   mtp_eps_, false);
    }
    cpu::linear(x_.data(), cat, mod.eh_proj, nullptr, M, H, 2 * H);
    layer_forward(mod.layer, group, pos, T);
    float* last = last_rows_.data();
    double sum = 0.0;
    for (int b = 0; b < B; ++b) {
      const float* row = x_.data() + (static_cast<size_t>(b) * T + T - 1) * H;
      std::memcpy(last + static_cast<size_t>(b) * H, row, H * sizeof(float));
      for (int j = 0; j < H; ++j) sum += row[j];
    }
    checksum_ += sum;
    cpu::rmsnorm(last, last, mod.shared_norm, B, H, mtp_eps_, false);
    cpu::linear(logits_.data(), last, lm_head_, nullptr, B, vocab_local_, H);
    cpu::argmax_rows(draft_.data(), logits_.data(), B, vocab_local_);
  }
}

void CpuStage::head_forward(int32_t* out, int tokens) {
  const int B = cfg_.work.batch;
  const size_t H = hidden_;
  float* last = last_rows_.data();
  double sum = 0.0;
  for (int b = 0; b < B; ++b) {
    const float* row = x_.data() + (static_cast<size_t>(b) * tokens + tokens - 1) * H;
    std::memcpy(last + b * H, row, H * sizeof(float));
    for (size_t j = 0; j < H; ++j) sum += row[j];
  }
  checksum_ += sum;
  cpu::rmsnorm(last, last, final_norm_, B, static_cast<int>(H), final_eps_, final_norm_plus_one_);
  const int V = vocab_local_;
  cpu::linear(logits_.data(), last, lm_head_, nullptr, B, V, static_cast<int>(H));
  if (final_softcap_ > 0.0f) cpu::softcap_inplace(logits_.data(), logits_.size(), final_softcap_);
  cpu::argmax_rows(out, logits_.data(), B, V);
  if (tp_width_ > 1) {
    // Vocabulary-parallel head: this rank's best token (ties: its lowest id, argmax_rows), then
    // the group's best, ties to the lowest id: width 1's answer.
    for (int b = 0; b < B; ++b) {
      best_[b] = logits_[static_cast<size_t>(b) * V + out[b]];
      out[b] += static_cast<int32_t>(vocab_begin_);
    }
    tp_->allreduce_argmax(best_.data(), out, B);
  }
}

}  // namespace

std::unique_ptr<StageExecutor> create_cpu_stage(const model::ModelSpec& m, int first, int last,
                                                const StageConfig& cfg) {
  return std::make_unique<CpuStage>(m, first, last, cfg);
}

}  // namespace ppb
