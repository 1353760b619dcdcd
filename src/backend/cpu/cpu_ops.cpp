#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <vector>
#include <string>

#include "backend/cpu/cpu_gemm.h"
#include "backend/weights.h"
#include "common/error.h"

namespace ppb::cpu {

// Napkin math: pure copy, n_tokens * hidden * 4 bytes read (rows of the table) and written;
// no FLOPs but the optional scale. Llama-3-8B decode B=8: 8 * 4096 * 4 = 128 KiB, ~µs.
void embedding(float* out, const int32_t* tokens, size_t n_tokens, const float* table, int vocab,
               int hidden, float scale) {
  const size_t h = static_cast<size_t>(hidden);
  for (size_t i = 0; i < n_tokens; ++i) {
    const int32_t tok = tokens[i];
    if (tok < 0 || tok >= vocab) {
      throw InternalError("embedding: token id " + std::to_string(tok) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(vocab) + ")");
    }
    const float* row = table + static_cast<size_t>(tok) * h;
    float* dst = out + i * h;
    if (scale == 1.0f) {
      std::memcpy(dst, row, h * sizeof(float));
    } else {
      for (size_t j = 0; j < h; ++j) dst[j] = row[j] * scale;
    }
  }
}

// Napkin math: ~4 FLOPs per element (square-accumulate, scale, weight), 8 bytes moved per
// element (read x, write out) + dim*4 for w: memory-bound; rows*dim = 8*4096 in decode is
// ~0.25 MiB, a few µs. The sum of squares is kept in double (cheap, and it makes the twin
// a tighter reference than the fp32 GPU reduction it checks).
void rmsnorm(float* out, const float* x, const float* w, size_t rows, int dim, float eps, bool plus_one) {
  const size_t d = static_cast<size_t>(dim);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* yr = out + r * d;
    double ss = 0.0;
    for (size_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    if (plus_one) {
      for (size_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * (1.0f + w[j]);
    } else {
      for (size_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * w[j];
    }
  }
}

// Napkin math: 2*M*N*K FLOPs; bytes ~ 4*(N*K + M*K + M*N). Decode (M = B small) is
// weight-bandwidth-bound: Llama-3-8B q_proj 4096x4096 fp32 = 64 MiB per call, at ~10 GB/s
// per core ~6 ms. Prefill (M = B*T large) is compute-bound: ~100-150 GFLOP/s per AVX-512 core
// with a GEMM that uses the core's vector width (cpu_gemm.h). Up to kSmallM rows the small-M
// kernel streams W once instead.
void linear(float* y, const float* x, const float* w, const float* bias, int M, int N, int K) {
  if (M <= kSmallM && small_m_isa()[0] != '\0') {
    small_m_linear(y, x, w, M, N, K);
  } else {
    sgemm(true, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
  }
  if (bias != nullptr) {
    for (int m = 0; m < M; ++m) {
      float* yr = y + static_cast<size_t>(m) * N;
      for (int n = 0; n < N; ++n) yr[n] += bias[n];
    }
  }
}

std::vector<double> rope_inv_freq(const model::Rope& rope, int head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    throw UserError("RoPE needs an even head_dim, got " + std::to_string(head_dim));
  }
  const int half = head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(rope.theta, (2.0 * i) / static_cast<double>(head_dim));
  }
  if (rope.scaling_type.empty()) return inv;
  if (rope.scaling_type == "linear") {
    for (double& f : inv) f /= rope.factor;
    return inv;
  }
  if (rope.scaling_type == "llama3") {
    // HF modeling_rope_utils._compute_llama3_parameters, term by term.
    const double old_ctx = static_cast<double>(rope.original_max_position);
    const double low_freq_wavelen = old_ctx / rope.low_freq_factor;
    const double high_freq_wavelen = old_ctx / rope.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      double scaled = wavelen > low_freq_wavelen ? f / rope.factor : f;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        const double smooth = (old_ctx / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        scaled = (1.0 - smooth) * scaled / rope.factor + smooth * scaled;
      }
      f = scaled;
    }
    return inv;
  }
  throw UserError("rope_scaling type '" + rope.scaling_type +
                  "' is not supported; valid: none, \"linear\", \"llama3\"");
}

// Napkin math: n_pos * half sin+cos in double, once per stage at construction
// (8192 x 64 = 0.5 M pairs, ~10 ms); the tables are 2 * n_pos * half * 4 bytes (4 MiB).
void rope_tables(float* cos_out, float* sin_out, const double* inv_freq, int half, int n_pos) {
  for (int p = 0; p < n_pos; ++p) {
    for (int i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * inv_freq[i];
      cos_out[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      sin_out[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

// Napkin math: 6 FLOPs per pair, 16 bytes read+written per pair + the tables (cached);
// memory-bound, B*T*heads*hd*8 bytes: decode 8 x 32 x 128 x 8 = 256 KiB, ~µs.
void rope(float* x, int batch, int tokens, int n_heads, int head_dim, int pos0, const float* cos_table,
          const float* sin_table) {
  const int half = head_dim / 2;
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < tokens; ++t) {
      const float* c = cos_table + static_cast<size_t>(pos0 + t) * half;
      const float* s = sin_table + static_cast<size_t>(pos0 + t) * half;
      float* row = x + (static_cast<size_t>(b) * tokens + t) * n_heads * head_dim;
      for (int h = 0; h < n_heads; ++h) {
        float* v = row + static_cast<size_t>(h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float x1 = v[i];
          const float x2 = v[i + half];
          v[i] = x1 * c[i] - x2 * s[i];
          v[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
    }
  }
}

// Napkin math: a copy of batch * tokens * row * 4 bytes (decode Llama-3-8B B=8: 32 KiB per K or V).
void kv_cache_write(float* cache, const float* src, int batch, int tokens, int pos0, int max_context,
                    int row) {
  const size_t r = static_cast<size_t>(row);
  for (int b = 0; b < batch; ++b) {
    std::memcpy(cache + (static_cast<size_t>(b) * max_context + pos0) * r,
                src + static_cast<size_t>(b) * tokens * r, static_cast<size_t>(tokens) * r * sizeof(float));
  }
}

size_t attention_scratch_floats(int max_context) {
  return static_cast<size_t>(kAttentionQueryBlock) * static_cast<size_t>(std::max(max_context, 1));
}

namespace {

/// One row of scores in place: -inf outside the attended keys [lo, hi] (inclusive), the optional
/// softcap, then softmax in fp32 with max subtraction (the sum in double); 0 outside [lo, hi].
void mask_softmax_row(float* row, int n, int lo, int hi, float softcap, const float* sink = nullptr) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < lo; ++j) row[j] = neg_inf;
  for (int j = hi + 1; j < n; ++j) row[j] = neg_inf;
  if (softcap > 0.0f) {
    for (int j = lo; j <= hi; ++j) row[j] = softcap * std::tanh(row[j] / softcap);
  }
  float mx = sink != nullptr ? *sink : neg_inf;
  for (int j = lo; j <= hi; ++j) mx = std::max(mx, row[j]);
  double sum = sink != nullptr ? std::exp(static_cast<double>(*sink - mx)) : 0.0;
  for (int j = lo; j <= hi; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = 0; j < lo; ++j) row[j] = 0.0f;
  for (int j = lo; j <= hi; ++j) row[j] *= inv;
  for (int j = hi + 1; j < n; ++j) row[j] = 0.0f;
}

/// attention() of one sequence: q, out [T, n_heads, head_dim] at positions [pos0, pos0 + T);
/// kb, vb that sequence's cache [max_context, n_kv_heads, head_dim]. s gives everything else
/// (its batch, tokens and pos0 are not read). The one path of attention and attention_ragged,
/// so a ragged row gives the bits a batch of one at its position gives.
void attention_sequence(float* out, const float* q, const float* kb, const float* vb, int T, int pos0,
                        const AttentionShape& s, float* scratch) {
  const int hd = s.head_dim;
  const int q_stride = s.n_heads * hd;     // floats between consecutive tokens of q / out
  const int kv_stride = s.n_kv_heads * hd; // floats between consecutive positions of the cache
  const int group = s.n_heads / s.n_kv_heads;
  if (T == 1 && group <= kAttentionQueryBlock) {
    // Decode: the `group` query heads of a KV head are contiguous rows of q (stride hd) that
    // attend the same keys, so each KV head takes one product for its scores and one for
    // P V, `group` rows each, instead of two per query head (per-call overhead is most of a
    // decode product this small).
    const int p = pos0;
    const int k_begin = s.window > 0 ? std::max(0, p - s.window + 1) : 0;
    const int n = p + 1 - k_begin;
    for (int g = 0; g < s.n_kv_heads; ++g) {
      const size_t q_off = static_cast<size_t>(g) * group * hd;
      const size_t kv_off = static_cast<size_t>(k_begin) * kv_stride + static_cast<size_t>(g) * hd;
      sgemm(true, group, n, hd, s.scale, q + q_off, hd, kb + kv_off, kv_stride, 0.0f, scratch, n);
      for (int r = 0; r < group; ++r)
        mask_softmax_row(scratch + static_cast<size_t>(r) * n, n, 0, n - 1, s.softcap,
                         s.sinks != nullptr ? s.sinks + g * group + r : nullptr);
      sgemm(false, group, hd, n, 1.0f, scratch, n, vb + kv_off, kv_stride, 0.0f, out + q_off, hd);
    }
    return;
  }
  for (int h = 0; h < s.n_heads; ++h) {
    const int g = h / group;
    for (int t0 = 0; t0 < T; t0 += kAttentionQueryBlock) {
      const int tq = std::min(kAttentionQueryBlock, T - t0);
      const int p_first = pos0 + t0;
      const int p_last = p_first + tq - 1;
      const int k_begin = s.window > 0 ? std::max(0, p_first - s.window + 1) : 0;
      const int n = p_last + 1 - k_begin;
      const size_t q_off = static_cast<size_t>(t0) * q_stride + static_cast<size_t>(h) * hd;
      const size_t kv_off = static_cast<size_t>(k_begin) * kv_stride + static_cast<size_t>(g) * hd;
      sgemm(true, tq, n, hd, s.scale, q + q_off, q_stride, kb + kv_off, kv_stride, 0.0f, scratch, n);
      for (int r = 0; r < tq; ++r) {
        const int pr = p_first + r;
        const int lo = (s.window > 0 ? std::max(0, pr - s.window + 1) : 0) - k_begin;
        mask_softmax_row(scratch + static_cast<size_t>(r) * n, n, lo, pr - k_begin, s.softcap,
                         s.sinks != nullptr ? s.sinks + h : nullptr);
      }
      sgemm(false, tq, hd, n, 1.0f, scratch, n, vb + kv_off, kv_stride, 0.0f, out + q_off, q_stride);
    }
  }
}

}  // namespace

// Napkin math, per sequence and query head, n = attended keys (<= pos0 + T):
//   FLOPs 2*T*n*hd (QK^T) + 2*T*n*hd (PV) + ~5*T*n (softmax), bytes ~ 2*n*hd*4 (K and V rows).
// Decode (T = 1) is bandwidth-bound on the cache: Llama-3-8B, B=8, ctx=2048: 8 seq x 8 KV heads
// x 2048 x 128 x 2 x 4 B = 128 MiB per layer, read once per KV head (its query heads' rows
// together). Prefill is sgemm-bound; query blocks of kAttentionQueryBlock rows only compute
// keys up to the block's last position, skipping ~half of the causal triangle.
void attention(float* out, const float* q, const float* k_cache, const float* v_cache,
               const AttentionShape& s, float* scratch) {
  const size_t seq_q = static_cast<size_t>(s.tokens) * s.n_heads * s.head_dim;  // floats of q per sequence
  const size_t seq_kv = static_cast<size_t>(s.max_context) * s.n_kv_heads * s.head_dim;
  for (int b = 0; b < s.batch; ++b)
    attention_sequence(out + b * seq_q, q + b * seq_q, k_cache + b * seq_kv, v_cache + b * seq_kv, s.tokens,
                       s.pos0, s, scratch);
}

// Napkin math: attention()'s per sequence, each row r with T = n_r at pos0 = pos_r: a batch of
// decodes costs what attention() costs at B = rows (the cache rows read once per KV head), a
// prefill row what a B = 1 prefill of n_r tokens costs. Validating the rows is O(rows).
void attention_ragged(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const AttentionShape& s, const RaggedBatch& rb, float* scratch) {
  check_ragged_batch(rb, s.batch, s.max_context);
  const size_t tok_q = static_cast<size_t>(s.n_heads) * s.head_dim;  // floats of q per token
  const size_t seq_kv = static_cast<size_t>(s.max_context) * s.n_kv_heads * s.head_dim;
  for (int r = 0; r < rb.rows; ++r) {
    const int n = rb.offset[r + 1] - rb.offset[r];
    if (n == 0) continue;
    const size_t q0 = static_cast<size_t>(rb.offset[r]) * tok_q;
    const size_t kv0 = static_cast<size_t>(rb.slot[r]) * seq_kv;
    attention_sequence(out + q0, q + q0, k_cache + kv0, v_cache + kv0, n, rb.pos[r], s, scratch);
  }
}

void check_ragged_batch(const RaggedBatch& rb, int n_slots, int max_context) {
  auto fail = [&](int r, const std::string& what) {
    throw InternalError("ragged attention: row " + std::to_string(r) + " of " + std::to_string(rb.rows) + ": " + what);
  };
  if (rb.rows < 0) throw InternalError("ragged attention: " + std::to_string(rb.rows) + " rows");
  if (rb.rows > 0 && (rb.slot == nullptr || rb.pos == nullptr || rb.offset == nullptr))
    throw InternalError("ragged attention: null slot, pos or offset array");
  if (rb.rows > 0 && rb.offset[0] != 0) fail(0, "offset[0] = " + std::to_string(rb.offset[0]) + ", not 0");
  for (int r = 0; r < rb.rows; ++r) {
    const int n = rb.offset[r + 1] - rb.offset[r];
    if (rb.slot[r] < 0 || rb.slot[r] >= n_slots)
      fail(r, "slot " + std::to_string(rb.slot[r]) + " outside [0, " + std::to_string(n_slots) + ")");
    if (n < 0) fail(r, "offsets decrease (" + std::to_string(n) + " tokens)");
    if (rb.pos[r] < 0 || static_cast<long>(rb.pos[r]) + n > max_context)
      fail(r, "positions [" + std::to_string(rb.pos[r]) + ", " + std::to_string(static_cast<long>(rb.pos[r]) + n) +
                  ") outside the cache's [0, " + std::to_string(max_context) + ")");
  }
}

// Napkin math: rope()'s and kv_cache_write()'s over the packed tokens (the same bytes as a
// uniform batch of as many tokens), one call per row.
void rope_ragged(float* x, const RaggedBatch& rb, int n_heads, int head_dim, const float* cos_table,
                 const float* sin_table) {
  const size_t tok = static_cast<size_t>(n_heads) * head_dim;
  for (int r = 0; r < rb.rows; ++r)
    rope(x + rb.offset[r] * tok, 1, rb.offset[r + 1] - rb.offset[r], n_heads, head_dim, rb.pos[r], cos_table, sin_table);
}

void kv_cache_write_ragged(float* cache, const float* src, const RaggedBatch& rb, int max_context, int row) {
  const size_t seq = static_cast<size_t>(max_context) * row;  // floats of one slot
  for (int r = 0; r < rb.rows; ++r)
    kv_cache_write(cache + rb.slot[r] * seq, src + static_cast<size_t>(rb.offset[r]) * row, 1,
                   rb.offset[r + 1] - rb.offset[r], rb.pos[r], max_context, row);
}

// Napkin math: ~20 FLOPs (one exp or tanh) per element, 12 bytes moved; B*T*I elements
// (decode Llama-3-8B B=8: 8 x 14336 = 115 k, ~0.1 ms scalar).
void gated_activation(float* out, const float* gate, const float* up, size_t n, model::Activation act,
                      float limit) {
  if (act == model::Activation::swiglu_clamped) {
    constexpr float kAlpha = 1.702f;  // GptOssExperts.alpha
    for (size_t i = 0; i < n; ++i) {
      const float g = std::min(gate[i], limit);
      const float u = std::clamp(up[i], -limit, limit);
      out[i] = (u + 1.0f) * (g / (1.0f + std::exp(-kAlpha * g)));
    }
  } else if (act == model::Activation::silu) {
    for (size_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  } else {
    const float k = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
    for (size_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * up[i];
    }
  }
}

// Napkin math: n FLOPs, 12n bytes: memory-bound, trivial.
void add_inplace(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

// Napkin math: one tanh per element; B * vocab elements once per step (8 x 256 k = 2 M, ~10 ms scalar).
void softcap_inplace(float* x, size_t n, float cap) {
  for (size_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

// Napkin math: one compare per element, rows * n * 4 bytes read (B x vocab: 8 x 128 k x 4 = 4 MiB).
void argmax_rows(int32_t* out, const float* logits, int rows, int n) {
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + static_cast<size_t>(r) * n;
    int best = 0;
    float best_v = -std::numeric_limits<float>::infinity();
    bool found = false;
    for (int j = 0; j < n; ++j) {
      if (!found ? !std::isnan(row[j]) : row[j] > best_v) {
        best = j;
        best_v = row[j];
        found = true;
      }
    }
    out[r] = best;
  }
}

}  // namespace ppb::cpu

namespace ppb::cpu {

// Napkin math: per token O(E log E) compares and E exp/sigmoid: E = 256, M = 4096 prefill rows:
// ~10 M operations, well under the expert products' 2 * M * k * 3 * H * I_e FLOPs.
std::vector<double> expert_popularity_log_p(int n_experts, double A, uint64_t key) {
  if (n_experts < 1 || !(A >= 0.0)) throw InternalError("expert_popularity_log_p: need n_experts >= 1 and A >= 0");
  std::vector<int> by_rank(n_experts);
  std::iota(by_rank.begin(), by_rank.end(), 0);
  std::sort(by_rank.begin(), by_rank.end(), [&](int a, int b) {
    const uint64_t ha = mix64(key + static_cast<uint64_t>(a)), hb = mix64(key + static_cast<uint64_t>(b));
    return ha < hb || (ha == hb && a < b);
  });
  double norm = 0.0;
  for (int r = 0; r < n_experts; ++r) norm += std::pow(r + 1.0, -A);
  std::vector<double> log_p(n_experts);
  for (int r = 0; r < n_experts; ++r) log_p[by_rank[r]] = -A * std::log(r + 1.0) - std::log(norm);
  return log_p;
}

void check_route_shape(const model::MoeShape& moe, bool has_correction) {
  const int E = moe.n_experts, k = moe.top_k;
  if (E < 1 || k < 1 || k > E) throw InternalError("route_tokens: need 1 <= top_k <= n_experts");
  const bool grouped = moe.router == model::RouterKind::sigmoid_grouped;
  const int G = grouped ? moe.n_group : 1;
  if (G < 1 || E % G != 0 || (grouped && (moe.topk_group < 1 || moe.topk_group > G || !has_correction)))
    throw InternalError("route_tokens: sigmoid_grouped needs n_group | n_experts, 1 <= topk_group <= n_group "
                        "and the correction bias");
}

namespace {

/// route_tokens step 1: the router's scores [E] of one token's logits z [E]: softmax
/// probabilities, sigmoid scores, or the logits themselves (topk_softmax).
void router_scores(std::vector<double>& score, const float* z, int E, model::RouterKind router) {
  switch (router) {
    case model::RouterKind::softmax: {
      double mx = -std::numeric_limits<double>::infinity();
      for (int e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(z[e]));
      double total = 0.0;
      for (int e = 0; e < E; ++e) total += score[e] = std::exp(static_cast<double>(z[e]) - mx);
      for (int e = 0; e < E; ++e) score[e] /= total;
      break;
    }
    case model::RouterKind::topk_softmax:
      for (int e = 0; e < E; ++e) score[e] = z[e];
      break;
    case model::RouterKind::sigmoid_grouped:
      for (int e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(z[e])));
      break;
  }
}

/// route_tokens step 2 under --expert-skew: choice [E] = Gumbel-top-k keys of the popularity
/// law, keyed by the token's logits z [E] (their bits).
void skew_choice(std::vector<double>& choice, const float* z, int E, const RouteSkew& skew) {
  uint64_t h = skew.key;
  for (int e = 0; e < E; ++e) {
    uint32_t bits = 0;
    std::memcpy(&bits, z + e, sizeof bits);
    h = mix64(h ^ (bits + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(e + 1)));
  }
  for (int e = 0; e < E; ++e) {
    const uint64_t r = mix64(h + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(e + 1));
    const double u = (static_cast<double>(r >> 11) + 0.5) * 0x1p-53;  // in (0, 1)
    choice[e] = skew.log_p[e] - std::log(-std::log(u));
  }
}

/// route_tokens step 2 of sigmoid_grouped with n_group G > 1: each group's score is the sum of
/// its two best biased scores (DeepSeek-V3 model.py Gate); experts outside the topk_group best
/// groups get choice -inf (cannot be chosen).
void mask_groups(std::vector<double>& choice, const model::MoeShape& moe, int G) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int E = moe.n_experts, per = E / G;
  std::vector<double> group_score(G);
  std::vector<int> group_order(G);
  for (int g = 0; g < G; ++g) {
    double a = neg_inf, b = neg_inf;
    for (int e = g * per; e < (g + 1) * per; ++e) {
      if (choice[e] > a) {
        b = a;
        a = choice[e];
      } else if (choice[e] > b) {
        b = choice[e];
      }
    }
    group_score[g] = per >= 2 ? a + b : a;
  }
  std::iota(group_order.begin(), group_order.end(), 0);
  std::partial_sort(group_order.begin(), group_order.begin() + moe.topk_group, group_order.end(), [&](int a, int b) {
    return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
  });
  std::vector<bool> keep(G, false);
  for (int j = 0; j < moe.topk_group; ++j) keep[group_order[j]] = true;
  for (int e = 0; e < E; ++e)
    if (!keep[e / per]) choice[e] = neg_inf;
}

/// route_tokens step 3: the weights w [k] of the chosen experts order[0, k), by the router's
/// rule, from their scores.
void chosen_weights(float* w, const std::vector<double>& score, const std::vector<int>& order, int k,
                    const model::MoeShape& moe) {
  double sum = 0.0;
  switch (moe.router) {
    case model::RouterKind::softmax:
      for (int j = 0; j < k; ++j) sum += score[order[j]];
      for (int j = 0; j < k; ++j) w[j] = static_cast<float>(moe.norm_topk ? score[order[j]] / sum : score[order[j]]);
      break;
    case model::RouterKind::topk_softmax: {
      const double mx = score[order[0]];
      for (int j = 0; j < k; ++j) sum += std::exp(score[order[j]] - mx);
      for (int j = 0; j < k; ++j) w[j] = static_cast<float>(std::exp(score[order[j]] - mx) / sum);
      break;
    }
    case model::RouterKind::sigmoid_grouped:
      for (int j = 0; j < k; ++j) sum += score[order[j]];
      for (int j = 0; j < k; ++j) {
        const double wj = moe.norm_topk ? score[order[j]] / (sum + 1e-20) : score[order[j]];
        w[j] = static_cast<float>(wj * moe.routed_scaling);
      }
      break;
  }
}

}  // namespace

void route_tokens(int32_t* experts, float* weights, const float* logits, int M, const model::MoeShape& moe,
                  const float* correction, const RouteSkew* skew) {
  check_route_shape(moe, correction != nullptr);
  const int E = moe.n_experts, k = moe.top_k;
  const bool grouped = moe.router == model::RouterKind::sigmoid_grouped;
  const int G = grouped ? moe.n_group : 1;
  std::vector<double> score(E), choice(E);
  std::vector<int> order(E);
  for (int m = 0; m < M; ++m) {
    const float* z = logits + static_cast<size_t>(m) * E;
    int32_t* ex = experts + static_cast<size_t>(m) * k;
    float* w = weights + static_cast<size_t>(m) * k;
    // 1. The router's scores.
    router_scores(score, z, E, moe.router);
    // 2. The choice: the skew's sample, or the router's own ranking.
    if (skew != nullptr) {
      skew_choice(choice, z, E, *skew);
    } else if (grouped) {
      for (int e = 0; e < E; ++e) choice[e] = score[e] + correction[e];
      if (G > 1) mask_groups(choice, moe, G);
    } else {
      choice = score;
    }
    // The k largest choices (ties: lower index first) into order[0, k).
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return choice[a] > choice[b] || (choice[a] == choice[b] && a < b); });
    // 3. The chosen experts and their weights, by the router's rule.
    for (int j = 0; j < k; ++j) ex[j] = order[j];
    chosen_weights(w, score, order, k, moe);
  }
}

}  // namespace ppb::cpu
