// Deterministic random weights: a pure function of (seed, unit index, tensor id, element index).
//
// No weights ever move between ranks (DESIGN.md §1.2): every rank, stage and backend that
// needs a tensor generates it itself, and gets the same bits. The generator is counter-based
// (each element is computed from its index alone, like Philox in cuRAND), so it can be split
// in blocks, threads or CUDA threads freely:
//
//   key   = splitmix64-chain(seed, unit, tensor)            (once per tensor)
//   z_i   = mix64(key + (i + 1) * 0x9E3779B97F4A7C15)       (splitmix64's i-th output)
//   k_i   = (z_i >> 40) - 2^23                              (24 random bits, integer in [-2^23, 2^23))
//   v_i   = float(k_i) * (scale * 2^-23)                    (in [-scale, scale))
//
// Every step but the last multiply is exact in fp32 and `scale * 2^-23` is exact too, so a
// value is one correctly rounded multiply: bit-identical on any IEEE-754 machine and in CUDA
// (no FMA contraction is possible).
//
// Conventions (what each named tensor gets; see fill_projection/fill_norm/fill_bias):
//   projections [out, in]   uniform, scale 1/sqrt(in)     (Kaiming-uniform-like, keeps activations O(1))
//   embedding [vocab, H]    uniform, scale 1.0
//   RMSNorm weight          1 + 0.1*u   (norm_plus_one, i.e. Gemma's (1 + w) form: 0.1*u)
//   bias                    0.02*u
// A tied lm_head is the embedding itself: unit 0, Tensor::embed.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define PPB_HOST_DEVICE __host__ __device__
#else
#define PPB_HOST_DEVICE
#endif

namespace ppb {

/// Tensor ids of the weights of every unit kind. The numeric values are part of the weight
/// convention: changing one changes the weights. Names follow HF Llama/Gemma-3 modules.
enum class Tensor : uint64_t {
  embed = 0,               ///< embed_tokens.weight [vocab, H] (unit 0; also the tied lm_head)
  q_proj = 1,              ///< [n_heads*hd, H]
  k_proj = 2,              ///< [n_kv*hd, H]
  v_proj = 3,              ///< [n_kv*hd, H]
  o_proj = 4,              ///< [H, n_heads*hd]
  q_bias = 5,              ///< [n_heads*hd] (attn_bias)
  k_bias = 6,              ///< [n_kv*hd]
  v_bias = 7,              ///< [n_kv*hd]
  gate_proj = 8,           ///< [I, H]
  up_proj = 9,             ///< [I, H]
  down_proj = 10,          ///< [H, I]
  input_layernorm = 11,    ///< [H]
  post_attention_layernorm = 12,    ///< [H] Llama: pre-MLP norm; Gemma sandwich: on the attention output
  pre_feedforward_layernorm = 13,   ///< [H] Gemma sandwich only
  post_feedforward_layernorm = 14,  ///< [H] Gemma sandwich only
  q_norm = 15,             ///< [hd] (qk_norm)
  k_norm = 16,             ///< [hd] (qk_norm)
  final_norm = 17,         ///< model.norm [H] (head unit)
  lm_head = 18,            ///< [vocab, H] (head unit, untied only)
  // Mixture of experts (model::MoeShape). A routed expert's tensors are expert_tensor(t, e).
  router = 19,             ///< [E, H] (mlp.gate)
  router_bias = 20,        ///< [E] (gpt-oss)
  router_correction = 21,  ///< [E] DeepSeek-V3 e_score_correction_bias (the choice only), a bias
  expert_gate = 22,        ///< [I_e, H] per expert
  expert_up = 23,          ///< [I_e, H]
  expert_down = 24,        ///< [H, I_e]
  expert_gate_bias = 25,   ///< [I_e] (gpt-oss)
  expert_up_bias = 26,     ///< [I_e]
  expert_down_bias = 27,   ///< [H]
  // Multi-head latent attention (model::MlaShape); o_proj is Tensor::o_proj [H, n_heads * v].
  q_a_proj = 28,           ///< [q_lora, H]
  q_a_norm = 29,           ///< [q_lora]
  q_b_proj = 30,           ///< [n_heads * (qk_nope + qk_rope), q_lora] (q_lora == 0: Tensor::q_proj [., H])
  kv_a_proj = 31,          ///< [kv_lora + qk_rope, H]
  kv_a_norm = 32,          ///< [kv_lora]
  kv_b_proj = 33,          ///< [n_heads * (qk_nope + v_head_dim), kv_lora]
  // gpt-oss attention.
  sinks = 34,              ///< [n_heads] a logit per head, uniform in [-1, 1)
  o_bias = 35,             ///< [H]
  // Multi-token prediction (DeepSeek-V3), keyed by the unit id num_units() + module; the module's
  // decoder layer uses the layer ids above under the same unit id.
  mtp_enorm = 36,          ///< [H]
  mtp_hnorm = 37,          ///< [H]
  mtp_eh_proj = 38,        ///< [H, 2H]
  mtp_shared_norm = 39,    ///< [H]
  expert_skew = 40,        ///< not a tensor: the key of a MoE layer's --expert-skew popularity order
};

/// The id of routed expert `expert`'s tensor t (t one of the expert_* ids): a distinct tensor per
/// expert, so that each expert of a layer holds its own weights.
inline Tensor expert_tensor(Tensor t, int expert) {
  return static_cast<Tensor>(static_cast<uint64_t>(t) | ((static_cast<uint64_t>(expert) + 1) << 32));
}

/// splitmix64's output function (Steele, Lea, Flood 2014; the constants of java.util.SplittableRandom).
PPB_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// The per-tensor key: a hash of (seed, unit, tensor).
PPB_HOST_DEVICE inline uint64_t weight_key(uint64_t seed, uint64_t unit, uint64_t tensor) {
  uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ULL);
  h = mix64(h ^ (unit + 0x632BE59BD9B4E019ULL));
  h = mix64(h ^ (tensor + 0x85157AF5D1B2A3C7ULL));
  return h;
}

/// Element `i` of the tensor with key `key`, in [-scale, scale). Reference for other backends.
PPB_HOST_DEVICE inline float uniform_at(uint64_t key, uint64_t i, float scale) {
  const uint64_t z = mix64(key + (i + 1) * 0x9E3779B97F4A7C15ULL);
  const int32_t k = static_cast<int32_t>(z >> 40) - (1 << 23);
  return static_cast<float>(k) * (scale * 0x1p-23f);
}

/// Fills dst[0, n) with elements first, ..., first + n - 1 of the tensor: dst[i] =
/// uniform_at(weight_key(seed, unit, tensor), first + i, scale), values in [-scale, scale).
/// Identical on every rank, stage and backend, whatever block of it a caller fills (a
/// tensor-parallel shard, backend/tensor_parallel.h). ~1 ns/value single thread.
void fill_uniform(float* dst, size_t n, uint64_t seed, uint64_t unit, uint64_t tensor, float scale,
                  size_t first = 0);

/// A projection weight [rows, fan_in] (row-major, HF nn.Linear layout [out, in]): scale 1/sqrt(fan_in).
void fill_projection(float* dst, size_t rows, size_t fan_in, uint64_t seed, uint64_t unit, Tensor t);

/// Rows [row0, row0 + rows) of the projection [*, fan_in] (a column-parallel shard: output
/// features), into dst [rows, fan_in]; the same values as those rows of fill_projection.
void fill_projection_rows(float* dst, size_t row0, size_t rows, size_t fan_in, uint64_t seed, uint64_t unit,
                          Tensor t);

/// Columns [col0, col0 + cols) of every row of the projection [rows, fan_in] (a row-parallel
/// shard: input features), into dst [rows, cols]; the scale stays 1/sqrt(fan_in) of the whole.
void fill_projection_cols(float* dst, size_t rows, size_t fan_in, size_t col0, size_t cols, uint64_t seed,
                          uint64_t unit, Tensor t);

/// An RMSNorm weight [n]: 1 + 0.1*u, or 0.1*u when the norm scales by (1 + w) (Gemma).
void fill_norm(float* dst, size_t n, uint64_t seed, uint64_t unit, Tensor t, bool plus_one);

/// A bias [n]: 0.02*u; elements [first, first + n) of it.
void fill_bias(float* dst, size_t n, uint64_t seed, uint64_t unit, Tensor t, size_t first = 0);

/// The embedding [vocab, hidden], scale 1.0, always unit 0 (so a tied lm_head is identical);
/// with row0, its rows [row0, row0 + vocab) (a vocabulary-parallel shard of a tied lm_head).
void fill_embedding(float* dst, size_t vocab, size_t hidden, uint64_t seed, size_t row0 = 0);

}  // namespace ppb
