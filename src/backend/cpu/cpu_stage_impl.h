// The CPU stage's class (cpu_stage.cpp: its construction; cpu_stage_forward.cpp: its forwards,
// uniform and ragged): internal to the CPU backend, create_cpu_stage (cpu_stage.h) is its interface.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_aligned.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_paged_store.h"
#include "backend/cpu/cpu_weight_cache.h"
#include "backend/stage.h"
#include "backend/tensor_parallel.h"
#include "backend/weights.h"
#include "model/model_spec.h"

namespace ppb::cpu {

/// Weights of one decoder layer; null where the layer has no such tensor.
struct LayerWeights {
  int unit = 0;
  int layer = 0;      ///< index in ModelSpec::layers (MTP module k: n_layers + k)
  int moe_index = -1; ///< MoE layers: row of CpuStage::expert_tokens_
  std::vector<double> skew_log_p;  ///< --expert-skew: the layer's popularity law [E]; empty: none
  uint64_t skew_key = 0;
  model::LayerShape shape;  ///< this rank's shard: n_heads and n_kv_heads are its own heads (tp_heads)
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

/// The CPU StageExecutor of create_cpu_stage (cpu_stage.h has its contract and forward math).
class CpuStage final : public StageExecutor {
 public:
  /// `cache`: the rank's weight tensors (cpu_weight_cache.h), shared with the other stages built
  /// from it; null: a cache of this stage's own.
  CpuStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg,
           std::shared_ptr<WeightCache> cache = nullptr);

  int first_unit() const override { return first_; }
  int last_unit() const override { return last_; }
  // A uniform forward's bytes are those of its B rows of T tokens as a ragged step.
  size_t input_bytes(int tokens) const override { return ragged_input_bytes(cfg_.work.batch * tokens); }
  size_t output_bytes(int tokens) const override {
    return ragged_output_bytes(cfg_.work.batch, cfg_.work.batch * tokens);
  }
  void enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) override;
  size_t ragged_input_bytes(int total_tokens) const override {
    const size_t n = static_cast<size_t>(total_tokens);
    return has_embed_ ? n * sizeof(int32_t) : n * hidden_ * sizeof(float);
  }
  size_t ragged_output_bytes(int rows, int total_tokens) const override {
    return has_head_ ? static_cast<size_t>(rows) * sizeof(int32_t)
                     : static_cast<size_t>(total_tokens) * hidden_ * sizeof(float);
  }
  /// StageExecutor's, checked by check_ragged_step before anything is enqueued. The MTP modules
  /// (--mtp) run on a ragged step as on a uniform one: each row drafts from its own head token.
  void enqueue_forward_ragged(Lane& lane, const void* in, void* out, int group, const RaggedStep& step) override;
  double checksum() const override { return checksum_; }
  void reset_checksum() override {
    checksum_ = 0.0;
    for (auto& row : expert_tokens_) std::fill(row.begin() + 1, row.end(), 0);
  }
  std::vector<std::vector<int64_t>> expert_tokens() const override { return expert_tokens_; }
  std::vector<std::pair<const void*, size_t>> host_blocks() const override { return blocks_; }
  size_t weight_bytes() const override { return weight_bytes_; }
  size_t kv_cache_bytes() const override { return kv_bytes_; }
  size_t kv_resident_bytes() const override { return kv_paged_.data() != nullptr ? kv_paged_.resident_bytes() : kv_bytes_; }

 private:
  /// The tensor `key` of `n` floats from the cache (`fill` writes it if no stage holds it yet),
  /// held by this stage; counted in weight_bytes_ whether shared or not.
  float* weights(const WeightKey& key, size_t n, const std::function<void(float*)>& fill);
  /// WeightKey of this stage's seed.
  WeightKey key(WeightKey::Fill fill, uint64_t unit, Tensor t, size_t a = 0, size_t b = 0, size_t c = 0,
                size_t d = 0) const {
    return WeightKey{fill, cfg_.work.seed, unit, static_cast<uint64_t>(t), a, b, c, d};
  }
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
  /// The constructor's KV caches: one zeroed block of z.kv_floats (demand-paged under a pool:
  /// StageConfig::kv_pool_tokens > 0), carved per layer and group.
  void carve_kv_caches(const ScratchSizes& z);
  /// The constructor's scratch buffers, sized once for batch * max_context tokens.
  void allocate_scratch(const ScratchSizes& z);
  /// Builds one decoder layer of shape s, its weights keyed by unit u (layer: its index in
  /// ModelSpec::layers, for messages), this rank's shard, with its RoPE table; grows z.
  LayerWeights make_layer(const model::LayerShape& s, int u, int layer, ScratchSizes& z);
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
  /// Rows [row0, row0 + rows) of the embedding [vocab, H] (unit 0; a tied lm_head's shard).
  float* embedding_rows(size_t row0, size_t rows);
  /// make_layer's attention weights of this rank's heads th (q, k, v, o; biases, q/k norms,
  /// sinks); returns the attention output's width per token.
  size_t add_attention_weights(LayerWeights& w, const model::LayerShape& s, int u, const TpHeads& th, ScratchSizes& z);
  /// make_layer's MLA attention weights; returns the attention output's width per token.
  size_t add_mla_weights(LayerWeights& w, const model::LayerShape& s, int u, ScratchSizes& z);
  /// Index in ropes_ of the cos/sin tables of layer shape s, built on first use.
  int rope_table_for(const model::LayerShape& s);
  /// make_layer's router and routed experts, and the layer's row of expert_tokens_.
  void add_expert_weights(LayerWeights& w, const model::LayerShape& s, int u, int layer, ScratchSizes& z);
  /// --mtp: the MTP modules after the head (their norms, eh_proj, layer; the draft tokens'
  /// embedding table unless this stage holds embed's).
  void add_mtp_modules(const model::ModelSpec& m, ScratchSizes& z);
  /// The rows of a uniform forward of T = `tokens` tokens at `pos`: sequence b is row b, in
  /// slot b, its tokens [b T, (b + 1) T); in uniform_slot_, uniform_pos_, uniform_offset_.
  cpu::RaggedBatch uniform_rows(int pos, int tokens);
  /// One forward of group `group` over `rows` (uniform or ragged, checked by the caller): in
  /// [offset[rows]] ids or [offset[rows], H] activations; out [rows] ids or [offset[rows], H].
  void forward(const void* in, void* out, int group, const cpu::RaggedBatch& rows);
  /// x_ [offset[rows], H] through one decoder layer; the rows' K/V into their slots of `group`.
  void layer_forward(const LayerWeights& w, int group, const cpu::RaggedBatch& rows);
  /// layer_forward's attention (GQA and its variants; mla_attention: MLA's): out [offset[rows], H]
  /// holds the normed input and gets the attention block's output (before any TP all-reduce).
  void self_attention(const LayerWeights& w, int group, const cpu::RaggedBatch& rows, float* out);
  void mla_attention(const LayerWeights& w, int group, const cpu::RaggedBatch& rows, float* out);
  void moe_mlp(const LayerWeights& w, int rows, float* out);
  /// One gated MLP's weights [I, H], [I, H], [H, I] and optional biases [I], [I], [H].
  struct MlpWeights {
    const float *gate = nullptr, *up = nullptr, *down = nullptr;
    const float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
  };
  /// out[rows, H] = down(act(gate(in)) * up(in)) with the layer's activation (HF LlamaMLP; gpt-oss
  /// experts with biases and the clamp); out may alias in. Scratch: gate_, up_ [rows, I].
  void gated_mlp(float* out, const float* in, int rows, int I, const MlpWeights& w, const model::LayerShape& s);
  /// The MTP modules after the head; `tokens` [rows] the head's tokens, each row's draft input.
  void mtp_forward(const int32_t* tokens, int group, const cpu::RaggedBatch& rows);
  /// Copies each row's last token row of x_ to last_rows_ [rows, H]; returns their sum (double).
  double gather_last_rows(const cpu::RaggedBatch& rows);
  /// Each row's last token through the final norm, lm_head and argmax: out [rows].
  void head_forward(int32_t* out, const cpu::RaggedBatch& rows);

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

  std::shared_ptr<WeightCache> cache_;
  std::vector<std::shared_ptr<float>> weight_store_;  // the tensors it holds, one 64-byte-aligned block each
  size_t weight_bytes_ = 0;
  std::vector<std::pair<const void*, size_t>> blocks_;  ///< host_blocks(): the weight blocks, then the KV store
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  const float* lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<RopeTable> ropes_;

  cpu::AlignedFloats kv_store_;  ///< the KV caches, touched at construction (kv_pool_tokens = 0)
  cpu::PagedStore kv_paged_;     ///< or, under a scheduler's pool, demand-paged (cpu_paged_store.h)
  size_t kv_bytes_ = 0;
  /// Gives back the pages of `slots` of `group` in every layer's cache (a paged store only).
  void release_slots(int group, const std::vector<int32_t>& slots);

  // Scratch, sized once for batch * max_context tokens: a uniform forward of up to max_context
  // tokens per sequence, or a ragged step (at most B rows of at most max_context tokens each,
  // check_ragged_step). scores_ holds one query block of one row (attention_ragged, as
  // attention, runs its rows one after the other): attention_scratch_floats(max_context).
  cpu::AlignedFloatVector x_, h_, q_, k_, v_, attn_, gate_, up_, scores_, last_rows_, logits_;
  // MLA: q's low-rank part, [c_kv, k_rope] rows, absorbed queries, RoPE staging, per-head values.
  cpu::AlignedFloatVector mla_qa_, mla_kva_, mla_q_, mla_rope_, mla_values_;
  // MoE: router logits, routed rows gathered, expert output, the layer's sum; the choice.
  cpu::AlignedFloatVector moe_logits_, moe_rows_, moe_out_, moe_sum_, route_weights_;
  std::vector<int32_t> route_experts_;
  std::vector<int> expert_count_, expert_slots_;
  std::vector<float> best_;  // the head's [B] largest local logits (width > 1)
  // uniform_rows: slots 0..B-1 [B], the rows' pos [B], their offsets [B + 1].
  std::vector<int32_t> uniform_slot_, uniform_pos_, uniform_offset_;

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

}  // namespace ppb::cpu
