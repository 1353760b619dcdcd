#include "backend/cpu/cpu_stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_aligned.h"
#include "backend/cpu/cpu_ops.h"
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
  // K and V caches of every group: [groups][batch, max_context, n_kv_heads, head_dim] (this
  // rank's KV heads).
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

class CpuStage final : public StageExecutor {
 public:
  CpuStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg);

  int first_unit() const override { return first_; }
  int last_unit() const override { return last_; }
  size_t input_bytes(int tokens) const override {
    const size_t n = static_cast<size_t>(cfg_.batch) * tokens;
    return has_embed_ ? n * sizeof(int32_t) : n * hidden_ * sizeof(float);
  }
  size_t output_bytes(int tokens) const override {
    const size_t n = static_cast<size_t>(cfg_.batch);
    return has_head_ ? n * sizeof(int32_t) : n * tokens * hidden_ * sizeof(float);
  }
  void enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) override;
  double checksum() const override { return checksum_; }
  void reset_checksum() override { checksum_ = 0.0; }
  size_t weight_bytes() const override { return weight_bytes_; }
  size_t kv_cache_bytes() const override { return kv_bytes_; }

 private:
  float* new_weights(size_t n);
  void forward(const void* in, void* out, int group, int pos, int tokens);
  void layer_forward(const LayerWeights& w, int group, int pos, int tokens);
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
  std::vector<float> best_;  // the head's [B] largest local logits (width > 1)

  double checksum_ = 0.0;
};

float* CpuStage::new_weights(size_t n) {
  weight_store_.push_back(cpu::make_aligned_floats(n));
  weight_bytes_ += n * sizeof(float);
  return weight_store_.back().get();
}

CpuStage::CpuStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg)
    : first_(first), last_(last), cfg_(cfg) {
  if (cfg.dtype != DType::f32) throw UserError("the CPU backend computes in f32; use --dtype f32");
  if (first < 0 || last < first || last >= m.num_units()) {
    throw UserError("stage units [" + std::to_string(first) + ", " + std::to_string(last) +
                    "] are not a range of the model's " + std::to_string(m.num_units()) + " units");
  }
  if (cfg.batch < 1 || cfg.max_context < 1 || cfg.groups < 1) {
    throw UserError("stage config needs batch, max_context and groups >= 1, got batch=" +
                    std::to_string(cfg.batch) + " max_context=" + std::to_string(cfg.max_context) +
                    " groups=" + std::to_string(cfg.groups));
  }
  if (m.hidden < 1 || m.vocab < 1) {
    throw UserError("model needs hidden_size and vocab_size >= 1");
  }
  tp_width_ = cfg.tp_width;
  tp_rank_ = cfg.tp_rank;
  tp_ = cfg.tp;
  if (tp_width_ < 1 || tp_rank_ < 0 || tp_rank_ >= tp_width_)
    throw UserError("stage config: tensor-parallel rank " + std::to_string(tp_rank_) + " is outside a group of width " +
                    std::to_string(tp_width_));
  if (tp_width_ > 1 && (tp_ == nullptr || tp_->width() != tp_width_ || tp_->rank() != tp_rank_))
    throw InternalError("a stage of tensor-parallel width " + std::to_string(tp_width_) +
                        " needs the group's communicator, of that width and rank");
  if (const std::string why = tp_unsupported_reason(m, tp_width_); !why.empty())
    throw UserError("--tp " + std::to_string(tp_width_) + ": " + why);
  hidden_ = static_cast<size_t>(m.hidden);
  vocab_ = m.vocab;
  const auto [v0, v1] = tp_range(static_cast<size_t>(m.vocab), tp_width_, tp_rank_);
  vocab_begin_ = v0;
  vocab_local_ = static_cast<int>(v1 - v0);
  embed_scale_ = m.embed_scale_sqrt_hidden ? static_cast<float>(std::sqrt(static_cast<double>(m.hidden))) : 1.0f;
  final_norm_plus_one_ = m.final_norm_plus_one;
  final_softcap_ = static_cast<float>(m.final_softcap);
  final_eps_ = static_cast<float>(m.rms_eps);
  const uint64_t seed = cfg.seed;
  const size_t H = hidden_;
  const size_t B = static_cast<size_t>(cfg.batch);
  const size_t ctx = static_cast<size_t>(cfg.max_context);
  const size_t max_tokens = B * ctx;

  // ---- weights --------------------------------------------------------------------------
  size_t max_q = 0, max_kv = 0, max_inter = 0;
  size_t kv_floats = 0;
  for (int u = first; u <= last; ++u) {
    const model::Unit& unit = m.units[u];
    if (unit.kind == UnitKind::embed) {
      has_embed_ = true;
      float* e = new_weights(static_cast<size_t>(m.vocab) * H);
      fill_embedding(e, m.vocab, H, seed);
      embed_ = e;
    } else if (unit.kind == UnitKind::head) {
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
    } else {
      if (unit.layer < 0 || unit.layer >= static_cast<int>(m.layers.size())) {
        throw UserError("unit '" + unit.name + "' has layer index " + std::to_string(unit.layer) +
                        " outside [0, " + std::to_string(m.layers.size()) + ")");
      }
      const LayerShape& s = m.layers[unit.layer];
      if (s.hidden != m.hidden || s.n_heads < 1 || s.n_kv_heads < 1 || s.n_heads % s.n_kv_heads != 0 ||
          s.head_dim < 2 || s.head_dim % 2 != 0 || s.intermediate < 1) {
        throw UserError("layer " + std::to_string(unit.layer) + " has an inconsistent shape: hidden=" +
                        std::to_string(s.hidden) + " n_heads=" + std::to_string(s.n_heads) +
                        " n_kv_heads=" + std::to_string(s.n_kv_heads) + " head_dim=" +
                        std::to_string(s.head_dim) + " intermediate=" + std::to_string(s.intermediate) +
                        " (need n_kv_heads | n_heads, an even head_dim, hidden = model hidden)");
      }
      // This rank's shard (all of it at width 1): its heads, its slice of the MLP.
      const TpHeads th = tp_heads(s.n_heads, s.n_kv_heads, tp_width_, tp_rank_);
      const auto [i0, i1] = tp_range(static_cast<size_t>(s.intermediate), tp_width_, tp_rank_);
      const size_t hd = static_cast<size_t>(s.head_dim);
      const size_t nq_all = static_cast<size_t>(s.n_heads) * hd, I_all = static_cast<size_t>(s.intermediate);
      const size_t q0 = th.q_begin * hd, kv0 = th.kv_begin * hd;
      LayerWeights w;
      w.unit = u;
      w.shape = s;
      w.shape.n_heads = th.q_count;
      w.shape.n_kv_heads = th.kv_count;
      w.intermediate = static_cast<int>(i1 - i0);
      const size_t nq = static_cast<size_t>(th.q_count) * hd;
      const size_t nkv = static_cast<size_t>(th.kv_count) * hd;
      const size_t I = i1 - i0;
      // Column-parallel: rows [row0, row0 + rows) of [*, H]. Row-parallel: columns
      // [col0, col0 + cols) of [H, fan_in].
      auto proj_rows = [&](size_t row0, size_t rows, Tensor t) {
        float* p = new_weights(rows * H);
        fill_projection_rows(p, row0, rows, H, seed, u, t);
        return p;
      };
      auto proj_cols = [&](size_t fan_in, size_t col0, size_t cols, Tensor t) {
        float* p = new_weights(H * cols);
        fill_projection_cols(p, H, fan_in, col0, cols, seed, u, t);
        return p;
      };
      auto norm = [&](size_t n, Tensor t) {
        float* p = new_weights(n);
        fill_norm(p, n, seed, u, t, s.norm_plus_one);
        return p;
      };
      auto bias = [&](size_t first, size_t n, Tensor t) {
        float* p = new_weights(n);
        fill_bias(p, n, seed, u, t, first);
        return p;
      };
      w.input_norm = norm(H, Tensor::input_layernorm);
      w.q = proj_rows(q0, nq, Tensor::q_proj);
      w.k = proj_rows(kv0, nkv, Tensor::k_proj);
      w.v = proj_rows(kv0, nkv, Tensor::v_proj);
      w.o = proj_cols(nq_all, q0, nq, Tensor::o_proj);
      if (s.attn_bias) {
        w.q_bias = bias(q0, nq, Tensor::q_bias);
        w.k_bias = bias(kv0, nkv, Tensor::k_bias);
        w.v_bias = bias(kv0, nkv, Tensor::v_bias);
      }
      if (s.qk_norm) {
        w.q_norm = norm(s.head_dim, Tensor::q_norm);
        w.k_norm = norm(s.head_dim, Tensor::k_norm);
      }
      w.post_attention_norm = norm(H, Tensor::post_attention_layernorm);
      if (s.sandwich_norm) {
        w.pre_feedforward_norm = norm(H, Tensor::pre_feedforward_layernorm);
        w.post_feedforward_norm = norm(H, Tensor::post_feedforward_layernorm);
      }
      w.gate = proj_rows(i0, I, Tensor::gate_proj);
      w.up = proj_rows(i0, I, Tensor::up_proj);
      w.down = proj_cols(I_all, i0, I, Tensor::down_proj);

      // RoPE tables, one per distinct (rope, head_dim) (Gemma-3: local and global differ).
      auto it = std::find_if(ropes_.begin(), ropes_.end(), [&](const RopeTable& r) {
        return r.rope == s.rope && r.head_dim == s.head_dim;
      });
      if (it == ropes_.end()) {
        RopeTable r;
        r.rope = s.rope;
        r.head_dim = s.head_dim;
        const std::vector<double> inv = cpu::rope_inv_freq(s.rope, s.head_dim);
        const int half = s.head_dim / 2;
        r.cos.resize(ctx * half);
        r.sin.resize(ctx * half);
        cpu::rope_tables(r.cos.data(), r.sin.data(), inv.data(), half, cfg.max_context);
        ropes_.push_back(std::move(r));
        it = ropes_.end() - 1;
      }
      w.rope_table = static_cast<int>(it - ropes_.begin());

      max_q = std::max(max_q, nq);
      max_kv = std::max(max_kv, nkv);
      max_inter = std::max(max_inter, I);
      kv_floats += 2 * static_cast<size_t>(cfg.groups) * max_tokens * nkv;
      layers_.push_back(std::move(w));
    }
  }

  // ---- KV caches: one zeroed block, carved per layer and group ----------------------------
  kv_bytes_ = kv_floats * sizeof(float);
  if (kv_floats > 0) {
    kv_store_ = cpu::make_aligned_floats(kv_floats, /*zero=*/true);  // zeros: pages touched now
    float* p = kv_store_.get();
    for (LayerWeights& w : layers_) {
      const size_t per = max_tokens * static_cast<size_t>(w.shape.n_kv_heads) * w.shape.head_dim;
      for (int g = 0; g < cfg.groups; ++g) {
        w.k_cache.push_back(p);
        p += per;
        w.v_cache.push_back(p);
        p += per;
      }
    }
  }

  // ---- scratch ------------------------------------------------------------------------------
  x_.resize(max_tokens * H);
  if (!layers_.empty()) {
    h_.resize(max_tokens * H);
    q_.resize(max_tokens * max_q);
    k_.resize(max_tokens * max_kv);
    v_.resize(max_tokens * max_kv);
    attn_.resize(max_tokens * max_q);
    gate_.resize(max_tokens * max_inter);
    up_.resize(max_tokens * max_inter);
    scores_.resize(cpu::attention_scratch_floats(cfg.max_context));
  }
  if (has_head_) {
    last_rows_.resize(B * H);
    logits_.resize(B * static_cast<size_t>(vocab_local_));
    best_.resize(B);
  }
}

void CpuStage::enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) {
  if (group < 0 || group >= cfg_.groups || pos < 0 || tokens < 1 || pos + tokens > cfg_.max_context) {
    throw InternalError("enqueue_forward(group=" + std::to_string(group) + ", pos=" + std::to_string(pos) +
                        ", tokens=" + std::to_string(tokens) + ") is outside the stage's groups=" +
                        std::to_string(cfg_.groups) + ", max_context=" + std::to_string(cfg_.max_context));
  }
  lane.host_task([this, in, out, group, pos, tokens] { forward(in, out, group, pos, tokens); });
}

void CpuStage::forward(const void* in, void* out, int group, int pos, int tokens) {
  const size_t rows = static_cast<size_t>(cfg_.batch) * tokens;
  if (has_embed_) {
    cpu::embedding(x_.data(), static_cast<const int32_t*>(in), rows, embed_, vocab_,
                   static_cast<int>(hidden_), embed_scale_);
  } else {
    std::memcpy(x_.data(), in, rows * hidden_ * sizeof(float));
  }
  for (const LayerWeights& w : layers_) layer_forward(w, group, pos, tokens);
  if (has_head_) {
    head_forward(static_cast<int32_t*>(out), tokens);
  } else {
    std::memcpy(out, x_.data(), rows * hidden_ * sizeof(float));
  }
}

void CpuStage::layer_forward(const LayerWeights& w, int group, int pos, int tokens) {
  const LayerShape& s = w.shape;
  const int B = cfg_.batch;
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
  cpu::kv_cache_write(kc, k_.data(), B, tokens, pos, cfg_.max_context, nkv);
  cpu::kv_cache_write(vc, v_.data(), B, tokens, pos, cfg_.max_context, nkv);
  cpu::AttentionShape as;
  as.batch = B;
  as.tokens = tokens;
  as.pos0 = pos;
  as.max_context = cfg_.max_context;
  as.n_heads = s.n_heads;
  as.n_kv_heads = s.n_kv_heads;
  as.head_dim = hd;
  as.window = s.sliding_window;
  as.scale = static_cast<float>(s.attn_scale > 0.0 ? s.attn_scale : 1.0 / std::sqrt(static_cast<double>(hd)));
  as.softcap = static_cast<float>(s.attn_softcap);
  cpu::attention(attn_.data(), q_.data(), kc, vc, as, scores_.data());
  cpu::linear(h, attn_.data(), w.o, nullptr, M, H, nq);
  if (tp_width_ > 1) tp_->allreduce_sum(h, MH);  // row-parallel o_proj: sum the ranks' partials
  if (s.sandwich_norm) cpu::rmsnorm(h, h, w.post_attention_norm, M, H, eps, s.norm_plus_one);
  cpu::add_inplace(x, h, MH);

  // MLP block.
  const float* pre_mlp_norm = s.sandwich_norm ? w.pre_feedforward_norm : w.post_attention_norm;
  cpu::rmsnorm(h, x, pre_mlp_norm, M, H, eps, s.norm_plus_one);
  cpu::linear(gate_.data(), h, w.gate, nullptr, M, I, H);
  cpu::linear(up_.data(), h, w.up, nullptr, M, I, H);
  cpu::gated_activation(gate_.data(), gate_.data(), up_.data(), static_cast<size_t>(M) * I, s.act);
  cpu::linear(h, gate_.data(), w.down, nullptr, M, H, I);
  if (tp_width_ > 1) tp_->allreduce_sum(h, MH);  // row-parallel down_proj
  if (s.sandwich_norm) cpu::rmsnorm(h, h, w.post_feedforward_norm, M, H, eps, s.norm_plus_one);
  cpu::add_inplace(x, h, MH);
}

void CpuStage::head_forward(int32_t* out, int tokens) {
  const int B = cfg_.batch;
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

StageBytes cpu_stage_bytes(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  if (first < 0 || last < first || last >= m.num_units()) {
    throw UserError("stage units [" + std::to_string(first) + ", " + std::to_string(last) +
                    "] are not a range of the model's " + std::to_string(m.num_units()) + " units");
  }
  // Mirrors CpuStage's constructor (tests/unit/test_cpu_ops.cpp checks weights and KV cache
  // against a built stage).
  const size_t H = static_cast<size_t>(m.hidden), B = static_cast<size_t>(std::max(cfg.batch, 1));
  const size_t ctx = static_cast<size_t>(std::max(cfg.max_context, 1)), groups = static_cast<size_t>(std::max(cfg.groups, 1));
  const size_t max_tokens = B * ctx;
  const int t = cfg.tp_width, r = cfg.tp_rank;
  if (const std::string why = tp_unsupported_reason(m, t); !why.empty())
    throw UserError("--tp " + std::to_string(t) + ": " + why);
  const auto [v0, v1] = tp_range(static_cast<size_t>(m.vocab), t, r);
  const size_t vocab_local = v1 - v0;
  size_t weights = 0, kv = 0, max_q = 0, max_kv = 0, max_inter = 0, rope = 0;
  bool has_embed = false, has_head = false, has_layer = false;
  std::vector<std::pair<model::Rope, int>> ropes;
  for (int u = first; u <= last; ++u) {
    const model::Unit& unit = m.units[u];
    if (unit.kind == UnitKind::embed) {
      has_embed = true;
      weights += static_cast<size_t>(m.vocab) * H;
    } else if (unit.kind == UnitKind::head) {
      has_head = true;
      weights += H + (m.tie_embeddings && has_embed ? 0 : vocab_local * H);
    } else {
      has_layer = true;
      const model::LayerShape& ls = m.layers[unit.layer];
      // This rank's shard (CpuStage's constructor): its heads and MLP slice; norms whole.
      const TpHeads th = tp_heads(ls.n_heads, ls.n_kv_heads, t, r);
      const auto [i0, i1] = tp_range(static_cast<size_t>(ls.intermediate), t, r);
      const size_t nq = static_cast<size_t>(th.q_count) * ls.head_dim, nkv = static_cast<size_t>(th.kv_count) * ls.head_dim;
      const size_t I = i1 - i0;
      const size_t norms = H * (ls.sandwich_norm ? 4 : 2) + (ls.qk_norm ? 2 * static_cast<size_t>(ls.head_dim) : 0);
      weights += H * (2 * nq + 2 * nkv + 3 * I) + (ls.attn_bias ? nq + 2 * nkv : 0) + norms;
      max_q = std::max(max_q, nq);
      max_kv = std::max(max_kv, nkv);
      max_inter = std::max(max_inter, I);
      kv += 2 * groups * max_tokens * nkv;
      const auto key = std::make_pair(ls.rope, ls.head_dim);
      if (std::find(ropes.begin(), ropes.end(), key) == ropes.end()) {
        ropes.push_back(key);
        rope += 2 * ctx * static_cast<size_t>(ls.head_dim / 2);
      }
    }
  }
  size_t scratch = max_tokens * H + rope;
  if (has_layer)
    scratch += max_tokens * (H + 2 * max_q + 2 * max_kv + 2 * max_inter) + cpu::attention_scratch_floats(cfg.max_context);
  if (has_head) scratch += B * H + B * vocab_local;
  // Width > 1: the group's all-reduce gathers every rank's part of the largest [B x T, H]
  // (create_mpi_tp_group's buffer, one per stage's group; ThreadTpGroups' is smaller).
  if (t > 1 && has_layer) scratch += static_cast<size_t>(t) * max_tokens * H;
  return {weights * sizeof(float), kv * sizeof(float), scratch * sizeof(float)};
}

}  // namespace ppb
