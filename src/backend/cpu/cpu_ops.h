// The CPU kernels of a decoder-only transformer forward, fp32, as plain functions.
//
// These are the "CPU twins" (llm.c style) every CUDA kernel is tested against: each function is
// the reference semantics of one kernel, with the shapes in its docstring and the napkin math
// (FLOPs, bytes, the floor) above its definition in cpu_ops.cpp. Matrix products go through
// cpu_gemm.h (the rank's GEMM library, or the small-M kernel for decode-sized linears);
// everything else is a plain loop. Layouts are row-major; a token row of
// heads is [n_heads, head_dim] contiguous, i.e. q [B, T, n_heads, head_dim] as HF's
// view(B, T, -1, head_dim) before its transpose.
//
// None of these allocate, except rope_inv_freq. Buffers may not alias unless a docstring says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/model_spec.h"

namespace ppb::cpu {

/// Embedding gather: out[i, :] = scale * table[tokens[i], :].
/// out [n_tokens, hidden], tokens [n_tokens] int32, table [vocab, hidden]. `scale` is 1, or
/// sqrt(hidden) rounded to fp32 for Gemma (HF Gemma3TextScaledWordEmbedding: embed_scale =
/// hidden_size**0.5 cast to the weight dtype).
/// @throws ppb::InternalError if a token id is outside [0, vocab).
void embedding(float* out, const int32_t* tokens, size_t n_tokens, const float* table, int vocab,
               int hidden, float scale);

/// RMSNorm over the last dimension: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * g,
/// g = w (Llama: LlamaRMSNorm) or g = 1 + w (plus_one; Gemma: Gemma3RMSNorm, computed in fp32).
/// x, out [rows, dim]; w [dim]. In place (out == x) is allowed. The per-head q/k norm of
/// Qwen3/Gemma-3 is the same call with rows = tokens * heads, dim = head_dim.
void rmsnorm(float* out, const float* x, const float* w, size_t rows, int dim, float eps, bool plus_one);

/// Linear layer (nn.Linear): y[M, N] = x[M, K] · W[N, K]^T (+ bias[N]): small_m_linear for
/// M <= kSmallM where the CPU has AVX2 or AVX-512, else sgemm (cpu_gemm.h).
/// W is in HF's [out_features, in_features] layout. bias may be null.
void linear(float* y, const float* x, const float* w, const float* bias, int M, int N, int K);

/// RoPE inverse frequencies [head_dim / 2]: inv_freq_i = theta^(-2i / head_dim), then scaled:
/// "linear": inv_freq / factor (HF _compute_linear_scaling_rope_parameters, equivalent to
/// dividing positions by factor); "llama3": HF _compute_llama3_parameters (low-frequency
/// components / factor, high-frequency kept, smooth interpolation between). Computed in double
/// (HF rounds inv_freq to fp32; we keep it exact, the twin is the reference).
/// @throws ppb::UserError for an odd head_dim or an unknown scaling_type (valid: "", "linear", "llama3").
std::vector<double> rope_inv_freq(const model::Rope& rope, int head_dim);

/// cos/sin tables for positions [0, n_pos): cos_out[p, i] = cos(p * inv_freq[i]), same for sin;
/// both [n_pos, half], angles in double, rounded to fp32 once.
void rope_tables(float* cos_out, float* sin_out, const double* inv_freq, int half, int n_pos);

/// Rotary embedding in place, HF rotate_half convention (dimension i pairs with i + head_dim/2):
///   x'[i]        = x[i] * cos_i - x[i + hd/2] * sin_i
///   x'[i + hd/2] = x[i + hd/2] * cos_i + x[i] * sin_i        (apply_rotary_pos_emb, modeling_llama.py)
/// x [batch, tokens, n_heads, head_dim]; token t of every sequence is at position pos0 + t;
/// cos/sin tables [>= pos0 + tokens, head_dim / 2] from rope_tables.
void rope(float* x, int batch, int tokens, int n_heads, int head_dim, int pos0, const float* cos_table,
          const float* sin_table);

/// Copies new K or V rows into a cache: cache[b, pos0 + t, :] = src[b, t, :].
/// src [batch, tokens, row]; cache [batch, max_context, row] with row = n_kv_heads * head_dim.
void kv_cache_write(float* cache, const float* src, int batch, int tokens, int pos0, int max_context,
                    int row);

/// Shape of one attention call.
struct AttentionShape {
  int batch = 1;
  int tokens = 1;       ///< T new query tokens per sequence, at positions [pos0, pos0 + T)
  int pos0 = 0;
  int max_context = 0;  ///< the cache's capacity per sequence
  int n_heads = 0;      ///< query heads
  int n_kv_heads = 0;   ///< KV heads; query head h reads KV head h / (n_heads / n_kv_heads)
  int head_dim = 0;
  int window = 0;       ///< 0 = global; else query position p sees keys max(0, p-window+1)..p
  float scale = 1.0f;   ///< multiplier of q·k (LayerShape::attn_scale)
  float softcap = 0.0f; ///< 0 = none; else s = softcap * tanh(s / softcap) before the mask (Gemma-2)
  /// gpt-oss attention sinks: [n_heads] logits that join every softmax's denominator (and its
  /// max) but attend to no value; null = none.
  const float* sinks = nullptr;
};

/// Query rows per block of attention(); the scratch holds one block of scores.
constexpr int kAttentionQueryBlock = 64;

/// Floats of scratch attention() needs for a cache of `max_context` positions.
size_t attention_scratch_floats(int max_context);

/// Causal grouped-query attention over a KV cache (HF eager_attention_forward, modeling_llama.py
/// / modeling_gemma2.py): for each sequence b and query head h,
///   S = scale * Q K^T   (sgemm, K read in place from the cache with its row stride)
///   S = softcap * tanh(S / softcap)          (if softcap > 0)
///   mask key positions outside [max(0, p - window + 1), p] (causal, sliding window)
///   P = softmax(S) in fp32 with max subtraction;  O = P V   (sgemm)
/// (with sinks: P_j = e^{S_j - m} / (sum_j e^{S_j - m} + e^{sink_h - m}), m = max(max_j S_j, sink_h),
/// as transformers' GptOssAttention concatenates the sink to the scores and drops its column).
/// The value rows may be the key rows (k_cache == v_cache): MLA's latent cache (CpuStage).
/// q, out [batch, tokens, n_heads, head_dim]; k_cache, v_cache [batch, max_context, n_kv_heads,
/// head_dim] holding positions [0, pos0 + tokens) (the new ones already written);
/// scratch >= attention_scratch_floats(max_context) floats.
void attention(float* out, const float* q, const float* k_cache, const float* v_cache,
               const AttentionShape& s, float* scratch);

/// A ragged batch (continuous batching, issue 37): row r is one request with its own cache
/// slot, its pos_r tokens already cached and n_r new tokens (a prefill's prompt, or 1 for a
/// decode). Its query tokens are packed: row r's are token rows [offset[r], offset[r + 1]) of
/// q / out, so n_r = offset[r + 1] - offset[r] (flash-attention's cu_seqlens_q, vLLM's
/// query_start_loc). Host arrays for cpu::attention_ragged; device arrays for the CUDA twin.
struct RaggedBatch {
  int rows = 0;
  const int32_t* slot = nullptr;    ///< [rows] the row's sequence in the cache, in [0, slots)
  const int32_t* pos = nullptr;     ///< [rows] tokens already cached: the row's first new position
  const int32_t* offset = nullptr;  ///< [rows + 1] packed token offsets, offset[0] = 0, non-decreasing
};

/// Checks a ragged batch against a cache of `n_slots` sequences of `max_context` positions:
/// offset[0] = 0, n_r >= 0, slot_r in [0, n_slots), 0 <= pos_r and pos_r + n_r <= max_context.
/// Two rows may share a slot (attention only reads the cache).
/// @throws ppb::InternalError naming the first bad row (a scheduler bug, not a user's error).
void check_ragged_batch(const RaggedBatch& rb, int n_slots, int max_context);

/// Causal grouped-query attention over a ragged batch: for each row r, attention() of one
/// sequence (the same code path, so bitwise what attention() with batch 1, tokens n_r,
/// pos0 pos_r over that slot's cache gives): query token t of row r is at position pos_r + t
/// and attends the keys of its slot at positions [max(0, p - window + 1), p], p = pos_r + t,
/// with attention()'s scale, softcap, sliding window and sinks (HF eager_attention_forward,
/// modeling_llama.py / modeling_gemma2.py; GptOssAttention's sinks). Rows with n_r = 0 write
/// nothing.
/// q, out [offset[rows], n_heads, head_dim] (packed token rows: row 0's, then row 1's, ...);
/// k_cache, v_cache [s.batch = slots, s.max_context, n_kv_heads, head_dim], each row's slot
/// holding positions [0, pos_r + n_r) (the new ones already written). s.tokens and s.pos0 are
/// not read. scratch >= attention_scratch_floats(s.max_context) floats.
/// @throws ppb::InternalError from check_ragged_batch(rb, s.batch, s.max_context).
void attention_ragged(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const AttentionShape& s, const RaggedBatch& rb, float* scratch);

/// RoPE of a ragged batch, in place: row r's tokens (rows [offset[r], offset[r + 1]) of x) are
/// at positions pos_r, pos_r + 1, ...: rope(x + offset[r] * n_heads * head_dim, 1, n_r, ...,
/// pos_r) for each row, so each row is bitwise rope() of that row alone, and a batch whose rows
/// are B sequences of T tokens at one pos0 is bitwise rope(x, B, T, ..., pos0). rb.slot is not
/// read; the caller has checked rb (check_ragged_batch).
/// x [offset[rows], n_heads, head_dim]; cos/sin tables [>= max_r(pos_r + n_r), head_dim / 2].
void rope_ragged(float* x, const RaggedBatch& rb, int n_heads, int head_dim, const float* cos_table,
                 const float* sin_table);

/// Copies a ragged batch's new K or V rows into its rows' slots: cache[slot_r, pos_r + t, :] =
/// src[offset[r] + t, :] for t < n_r (kv_cache_write of each row at batch 1 into its slot).
/// src [offset[rows], row]; cache [slots, max_context, row]; the caller has checked rb
/// (check_ragged_batch): every row's positions fit the cache.
void kv_cache_write_ragged(float* cache, const float* src, const RaggedBatch& rb, int max_context, int row);

/// Gated MLP activation: out = act(gate) * up, elementwise over n values (HF LlamaMLP /
/// GemmaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))).
/// silu(g) = g / (1 + e^-g); gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
/// (PyTorch gelu approximate="tanh", HF "gelu_pytorch_tanh"). out may alias gate or up.
/// swiglu_clamped (gpt-oss, `limit` = swiglu_limit): g = min(gate, limit), u = clamp(up, -limit, limit),
/// out = (u + 1) g sigmoid(1.702 g) (transformers GptOssExperts).
void gated_activation(float* out, const float* gate, const float* up, size_t n, model::Activation act,
                      float limit = 0.0f);

/// A MoE router's choice for M tokens (model::RouterKind for the rules): logits [M, E] (the router
/// linear's output, its bias included), correction [E] (sigmoid_grouped's e_score_correction_bias;
/// else unused, may be null). Writes experts [M, top_k] (int32, in order of choice: best first,
/// ties to the lower expert index, as are groups) and weights [M, top_k]. Scores in double.
/// @throws ppb::InternalError for a shape the config parser would have refused.
/// `skew` (--expert-skew; null = the router's own choice): the experts are instead a sample of
/// top_k without replacement from the popularity law log_p [E] (Gumbel-top-k: argtop-k of
/// log_p[e] + g_e, g_e = -ln(-ln u_e), u_e a hash of `key`, the token's logits' bits and e: so
/// deterministic, different per token, equal on every rank and run), with the router's own weights
/// for the chosen experts (renormalised and scaled as the config says); no group limit.
/// The shape checks of route_tokens (every backend's router): 1 <= top_k <= n_experts; for
/// sigmoid_grouped n_group | n_experts, 1 <= topk_group <= n_group and a correction bias.
/// @throws ppb::InternalError (a shape the config parser would have refused).
void check_route_shape(const model::MoeShape& moe, bool has_correction);
struct RouteSkew {
  const double* log_p = nullptr;
  uint64_t key = 0;
};
void route_tokens(int32_t* experts, float* weights, const float* logits, int M, const model::MoeShape& moe,
                  const float* correction, const RouteSkew* skew = nullptr);

/// The popularity law --expert-skew A gives a layer's experts: expert e of popularity rank r_e
/// (a permutation of [0, E) drawn from `key`) has log p_e = -A ln(r_e + 1) - ln sum_r (r + 1)^-A
/// (a Zipf law, as NVIDIA aiconfigurator's study of expert loads fits them: A ~ 1.0 for
/// DeepSeek-V3, ~ 1.2 for Qwen3-235B). A >= 0 (0: uniform). Returns [E].
std::vector<double> expert_popularity_log_p(int n_experts, double A, uint64_t key);

/// Residual add in place: x[i] += y[i] for n values.
void add_inplace(float* x, const float* y, size_t n);

/// Soft capping in place: x = cap * tanh(x / cap) (Gemma-2 final_logit_softcapping). cap > 0.
void softcap_inplace(float* x, size_t n, float cap);

/// Greedy sampling: out[r] = argmax_j logits[r, j]; the lowest index wins ties; NaNs never win.
/// logits [rows, n]; out [rows] int32.
void argmax_rows(int32_t* out, const float* logits, int rows, int n);

}  // namespace ppb::cpu
