// Tolerances of fp32 kernels against a double reference, derived from the arithmetic instead of
// chosen until green. Every test of a BLAS-backed kernel must pass on any x86-64 core OpenBLAS
// supports: OpenBLAS picks its sgemm kernel (and so the order and blocking of every sum, FMA or
// not) by the core it runs on, so two machines give two different roundings of the same product.
// A tolerance therefore bounds the rounding of *any* summation order, never one machine's result.
//
// The model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §3.1 and §3.5;
// Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", SISC 41(5), 2019):
//  - a sum or dot product of K fp32 terms in any order has |fl(s) − s| ≤ γ_K Σ|terms|,
//    γ_K = K u / (1 − K u), u = 2^-24 (deterministic, Higham Lemma 3.1 / eq. 3.5);
//  - with independent random-sign terms (the tests' uniform weights and inputs), Σ|terms| is
//    about √K |s| normwise, and the rounding errors behave as independent, so the realised
//    error is near λ√K u · Σ|terms| ≈ λ K u |s| normwise (Higham & Mary Thm 3.1; λ = 4 here);
//  - a chain of reductions (norm → projection → scores → softmax → P·V → projection ...) adds
//    its relative errors to first order: rmsnorm rescales a vector to unit RMS, so it passes a
//    relative error on without amplifying it, and the residual add passes the layer's error on
//    relative to the layer's own output.
// Elementwise ops (rope, exp, tanh, gelu, the add) cost a few u each; kElementwiseUlps covers
// them per layer. The margin each bound leaves over what was measured on seven OpenBLAS core
// types (Prescott, Nehalem, Sandybridge, Haswell/Zen, Atom, Barcelona, Cooperlake) is in
// tests/unit/test_cpu_ops.cpp beside each use.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "model/model_spec.h"

namespace ppb::test {

/// Unit roundoff of IEEE binary32 (round to nearest): 2^-24.
inline constexpr double kF32UnitRoundoff = 0x1p-24;
/// λ of the probabilistic bound λ K u (see the file comment).
inline constexpr double kLambda = 4.0;
/// Elementwise ops per layer (rope, exp/tanh/gelu, scale, add), in units of u.
inline constexpr double kElementwiseUlps = 16.0;

/// Deterministic bound γ_K = K u / (1 − K u) of a K-term fp32 sum in any order, relative to
/// Σ|terms| (Higham, eq. 3.5). K >= 1; K u < 1.
inline double gamma_f32(int K) {
  const double ku = static_cast<double>(K) * kF32UnitRoundoff;
  return ku / (1.0 - ku);
}

/// Normwise relative error of a chain of fp32 reductions of lengths `K` (random-sign terms):
/// λ u Σ K_r + kElementwiseUlps u. Dimensionless.
inline double chain_bound_f32(const std::vector<int>& K) {
  double sum = 0.0;
  for (int k : K) sum += k;
  return kF32UnitRoundoff * (kLambda * sum + kElementwiseUlps);
}

/// The reductions on one decoder layer's critical path with `context` keys per query:
/// input norm (H), QKV (H), [q/k norm (head_dim)], scores (head_dim), softmax sum (context),
/// P·V (context), o_proj (n_heads·head_dim), [post-attention norm (H)], pre-MLP norm (H),
/// gate/up (H), down (intermediate), [post-MLP norm (H)].
/// MLA (absorbed, CpuStage): input norm (H), q_a (H), q_a norm and q_b (q_lora), kv_a (H),
/// kv_a norm (kv_lora), the absorbed query (qk_nope), scores (kv_lora + qk_rope), softmax and
/// P·V (context), the values (kv_lora), o_proj (n_heads·v_head_dim).
/// MoE: router (H), gate/up (H), down (expert width), the weighted sum of top_k experts and the
/// shared ones (top_k + 1); the shared experts' own down (intermediate) where there are any.
inline std::vector<int> layer_reductions(const model::LayerShape& s, int context) {
  const int H = s.hidden, hd = s.head_dim;
  std::vector<int> K;
  if (s.is_mla()) {
    const model::MlaShape& a = s.mla;
    K = {H, H, a.kv_lora_rank, a.qk_nope, a.kv_lora_rank + a.qk_rope, context, context, a.kv_lora_rank,
         s.n_heads * a.v_head_dim};
    if (a.q_lora_rank > 0) K.insert(K.end(), {a.q_lora_rank, a.q_lora_rank});
  } else {
    K = {H, H, hd, context, context, s.n_heads * hd};
    if (s.qk_norm) K.push_back(hd);
  }
  K.insert(K.end(), {H, H});
  if (s.is_moe()) {
    K.insert(K.end(), {H, s.moe.expert_intermediate, s.moe.top_k + 1});
    if (s.intermediate > 0) K.push_back(s.intermediate);
  } else {
    K.push_back(s.intermediate);
  }
  if (s.sandwich_norm) K.insert(K.end(), {H, H});
  return K;
}

/// Normwise relative error bound of one layer's output delta f(x) (x' = x + f(x)).
inline double layer_bound_f32(const model::LayerShape& s, int context) {
  return chain_bound_f32(layer_reductions(s, context));
}

/// Normwise relative error bound of the hidden state after every layer of `m` (errors of the
/// layers add along the residual stream; the embedding gather is exact).
inline double model_bound_f32(const model::ModelSpec& m, int context) {
  double e = 0.0;
  for (const model::LayerShape& s : m.layers) e += layer_bound_f32(s, context);
  return e;
}

}  // namespace ppb::test
