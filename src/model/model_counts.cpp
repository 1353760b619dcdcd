// The analytic counts of a ModelSpec's units: parameters (unique, resident, active), KV-cache
// bytes, FLOPs and bytes moved of a forward, and the experts a batch reaches.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "model/config_detail.h"
#include "model/model_spec.h"

namespace ppb::model {
namespace {

const Unit& unit_at(const ModelSpec& m, int unit) {
  if (unit < 0 || unit >= m.num_units())
    throw InternalError("unit index " + std::to_string(unit) + " out of range [0, " +
                        std::to_string(m.num_units()) + ") of model " + m.source);
  return m.units[unit];
}

void check_positive(int value, const char* name) {
  if (value <= 0) throw InternalError(std::string(name) + " must be positive, got " + std::to_string(value));
}

/// Attention weights of a layer (projections, biases, q/k norms, sinks; MLA's low-rank
/// projections and their norms), in T (int64_t for counts, double for the size bound).
template <class T>
T attention_params(const LayerShape& s) {
  const T h = s.hidden, nh = s.n_heads;
  if (s.is_mla()) {
    const MlaShape& a = s.mla;
    const T qk = T(a.qk_nope) + a.qk_rope;
    const T q = a.q_lora_rank > 0 ? h * a.q_lora_rank + a.q_lora_rank + T(a.q_lora_rank) * nh * qk : h * nh * qk;
    return q + h * (T(a.kv_lora_rank) + a.qk_rope) + a.kv_lora_rank +
           T(a.kv_lora_rank) * nh * (T(a.qk_nope) + a.v_head_dim) + nh * a.v_head_dim * h;
  }
  const T q = nh * s.head_dim, kv = T(s.n_kv_heads) * s.head_dim;
  T p = h * q + 2 * h * kv + q * h;
  if (s.attn_bias) p += q + 2 * kv;
  if (s.o_bias) p += h;
  if (s.qk_norm) p += 2 * T(s.head_dim);
  if (s.attn_sinks) p += nh;
  return p;
}

/// One routed expert's weights: gate, up, down (+ gpt-oss's biases).
template <class T>
T expert_params(const LayerShape& s) {
  const T h = s.hidden, ie = s.moe.expert_intermediate;
  return 3 * h * ie + (s.moe.expert_bias ? 2 * ie + h : T(0));
}

/// The MLP's weights with `experts` of the routed experts counted (all: the layer; top_k: what
/// one token multiplies by): the dense MLP or shared experts, the router and its biases.
template <class T>
T mlp_params(const LayerShape& s, int experts) {
  const T h = s.hidden;
  T p = 3 * h * T(s.intermediate);
  if (s.is_moe()) {
    const T e = s.moe.n_experts;
    p += e * h + (s.moe.router_bias ? e : T(0)) + (s.moe.router == RouterKind::sigmoid_grouped ? e : T(0)) +
         T(experts) * expert_params<T>(s);
  }
  return p;
}

/// All weights of a layer with `experts` routed experts counted: attention, MLP, RMSNorms.
template <class T>
T layer_params_t(const LayerShape& s, int experts) {
  return attention_params<T>(s) + mlp_params<T>(s, experts) + (s.sandwich_norm ? 4 : 2) * T(s.hidden);
}

int64_t layer_params(const LayerShape& s) { return layer_params_t<int64_t>(s, s.moe.n_experts); }

/// Weights one token's forward multiplies by (matmuls only: the FLOP count's 2 * params).
/// MLA in its absorbed form applies W_kvb once per token too (folded into q and the output).
double layer_matmul_params_per_token(const LayerShape& s) {
  const double h = s.hidden, nh = s.n_heads;
  double attn = 0.0;
  if (s.is_mla()) {
    const MlaShape& a = s.mla;
    const double qk = static_cast<double>(a.qk_nope) + a.qk_rope;
    attn = (a.q_lora_rank > 0 ? h * a.q_lora_rank + a.q_lora_rank * nh * qk : h * nh * qk) +
           h * (a.kv_lora_rank + a.qk_rope) + a.kv_lora_rank * nh * (static_cast<double>(a.qk_nope) + a.v_head_dim) +
           nh * a.v_head_dim * h;
  } else {
    const double q = nh * s.head_dim, kv = static_cast<double>(s.n_kv_heads) * s.head_dim;
    attn = h * q + 2 * h * kv + q * h;
  }
  double mlp = 3 * h * s.intermediate;
  if (s.is_moe()) mlp += s.moe.n_experts * h + s.moe.top_k * 3 * h * static_cast<double>(s.moe.expert_intermediate);
  return attn + mlp;
}

/// FLOPs of attention per query token and attended position: QK^T and AV, 2 FLOPs per MAC.
/// MLA (absorbed): scores over kv_lora_rank + qk_rope features, values over kv_lora_rank.
double attention_flops_per_position(const LayerShape& s) {
  if (s.is_mla()) return 2.0 * s.n_heads * (2.0 * s.mla.kv_lora_rank + s.mla.qk_rope);
  return 4.0 * s.n_heads * s.head_dim;
}

/// Sum over q = a+1 .. b of min(window, q) (window 0 = no cap): the key positions attended by
/// the new tokens at 0-based positions a .. b-1 under a causal (sliding-window) mask.
double attended_positions(int64_t a, int64_t b, int64_t window) {
  auto prefix = [window](int64_t n) -> double {
    if (window == 0 || n <= window) return 0.5 * static_cast<double>(n) * static_cast<double>(n + 1);
    return 0.5 * static_cast<double>(window) * static_cast<double>(window + 1) +
           static_cast<double>(n - window) * static_cast<double>(window);
  };
  return prefix(b) - prefix(a);
}

}  // namespace

namespace detail {

double layer_params_bound(const LayerShape& s) { return layer_params_t<double>(s, s.moe.n_experts); }

}  // namespace detail

const LayerShape& ModelSpec::layer_of(int unit) const {
  const Unit& u = unit_at(*this, unit);
  if (u.kind != UnitKind::layer)
    throw InternalError("unit " + std::to_string(unit) + " ('" + u.name + "') is not a decoder layer");
  return layers[u.layer];
}

namespace {

/// KV-cache bytes per token of one layer of shape s.
int64_t layer_kv_row_bytes(const LayerShape& s, int dtype_bytes) {
  if (s.is_mla()) return (int64_t{s.mla.kv_lora_rank} + s.mla.qk_rope) * dtype_bytes;  // the latent and k_rope
  return 2 * int64_t{s.n_kv_heads} * s.head_dim * dtype_bytes;
}

/// FLOPs of one layer's forward (unit_flops' contract).
double layer_flops(const LayerShape& s, double b, int tokens, int context) {
  const double matmul = 2.0 * layer_matmul_params_per_token(s) * tokens;
  // QK^T and AV per attended (query, key) pair.
  const double attn = attention_flops_per_position(s) * attended_positions(context - tokens, context, s.sliding_window);
  return b * (matmul + attn);
}

/// Bytes one layer's forward moves (unit_bytes_moved's contract), its activations included.
double layer_bytes(const LayerShape& s, int hidden, int batch, int tokens, int context, int dtype_bytes, double skew) {
  // KV read: the union of the windows of the new tokens, i.e. all `context` positions, or the
  // last window + tokens - 1 of them for a sliding-window layer. KV written: the new tokens'
  // rows. Activations: the input read and the output written.
  const double d = dtype_bytes, rows = static_cast<double>(batch) * tokens;
  const int window = s.sliding_window;
  const int64_t positions = window > 0 ? std::min<int64_t>(context, int64_t{window} + tokens - 1) : context;
  const double kv_row = static_cast<double>(layer_kv_row_bytes(s, dtype_bytes));
  // A MoE layer reads the experts its tokens reach, not all of them.
  const double unread_experts = s.is_moe() ? s.moe.n_experts - expected_distinct_experts(s, rows, skew) : 0.0;
  const double weights = static_cast<double>(layer_params(s)) - unread_experts * static_cast<double>(expert_params<int64_t>(s));
  return weights * d + static_cast<double>(batch) * static_cast<double>(positions) * kv_row + rows * kv_row +
         2.0 * rows * hidden * d;
}

/// One MTP module's own parameters: enorm, hnorm, eh_proj [H, 2H], its decoder layer and
/// shared_head.norm (DeepSeek-V3 README_WEIGHTS), the shared embedding and lm_head aside.
int64_t mtp_module_params(const ModelSpec& m) {
  const int64_t h = m.hidden;
  return 2 * h + 2 * h * h + layer_params(m.mtp_shape) + h;
}

}  // namespace

void enable_mtp(ModelSpec& m) {
  if (m.mtp_modules == 0)
    throw UserError("--mtp: " + m.source + " (" + m.architecture +
                    ") has no multi-token-prediction module (num_nextn_predict_layers is 0 or absent)");
  if (m.mtp) return;
  m.mtp = true;
  Unit& head = m.units.back();
  if (head.kind != UnitKind::head) throw InternalError("enable_mtp: the last unit of " + m.source + " is not the head");
  head.name = "head+mtp";
  if (head.signature >= 0 && head.signature < static_cast<int>(m.signatures.size()))
    m.signatures[head.signature] = "head+mtp";
}

int64_t unit_params(const ModelSpec& m, int unit) {
  const Unit& u = unit_at(m, unit);
  int64_t table = int64_t{m.vocab} * m.hidden;
  switch (u.kind) {
    case UnitKind::embed: return table;
    case UnitKind::layer: return layer_params(m.layers[u.layer]);
    case UnitKind::head: return m.hidden + (m.tie_embeddings ? 0 : table) + (m.mtp ? mtp_params(m) : 0);
  }
  return 0;
}

int64_t unit_resident_params(const ModelSpec& m, int unit) {
  const Unit& u = unit_at(m, unit);
  const int64_t table = int64_t{m.vocab} * m.hidden;
  // A head holds the [vocab, hidden] matrix even when tied; with MTP also the embedding table
  // (the draft token's embedding) and the modules.
  if (u.kind == UnitKind::head) return m.hidden + table + (m.mtp ? table + mtp_params(m) : 0);
  return unit_params(m, unit);
}

int64_t mtp_params(const ModelSpec& m) { return m.mtp_modules == 0 ? 0 : m.mtp_modules * mtp_module_params(m); }

int64_t total_params(const ModelSpec& m) {
  int64_t sum = m.mtp ? 0 : mtp_params(m);  // with --mtp the head unit counts them
  for (int u = 0; u < m.num_units(); ++u) sum += unit_params(m, u);
  return sum;
}

int64_t unit_active_params(const ModelSpec& m, int unit) {
  const Unit& u = unit_at(m, unit);
  switch (u.kind) {
    case UnitKind::embed: return 0;  // a token reads one row of the table
    case UnitKind::layer: {
      const LayerShape& s = m.layers[u.layer];
      return layer_params_t<int64_t>(s, s.moe.top_k);
    }
    case UnitKind::head: {
      // A tied head multiplies by the table too; MTP modules add their active parameters.
      int64_t p = m.hidden + int64_t{m.vocab} * m.hidden;
      if (m.mtp)
        p += m.mtp_modules * (mtp_module_params(m) - layer_params(m.mtp_shape) +
                              layer_params_t<int64_t>(m.mtp_shape, m.mtp_shape.moe.top_k));
      return p;
    }
  }
  return 0;
}

int64_t active_params(const ModelSpec& m) {
  int64_t sum = 0;
  for (int u = 0; u < m.num_units(); ++u) sum += unit_active_params(m, u);
  return sum;
}

namespace {

/// Probability that one token's top_k (a Gumbel-top-k sample of p_r ~ (r + 1)^-A) include the
/// expert of popularity rank r, for r in [0, n): 8192 draws of a fixed splitmix64 stream,
/// computed once per (n, k, A) and kept (a run asks for the same few many times).
const std::vector<double>& inclusion_probabilities(int n, int k, double A) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, double>, std::vector<double>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({n, k, A});
  if (!fresh) return it->second;
  constexpr int kDraws = 8192;
  std::vector<double> incl(n, 0.0), key(n);
  std::vector<int> order(n);
  uint64_t state = 0x853C49E6748FEA9BULL;
  auto next = [&state] {  // splitmix64 (Steele, Lea, Flood 2014)
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (int d = 0; d < kDraws; ++d) {
    for (int r = 0; r < n; ++r) {
      const double u = (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53;
      key[r] = -A * std::log(r + 1.0) - std::log(-std::log(u));
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) { return key[a] > key[b]; });
    for (int j = 0; j < k; ++j) incl[order[j]] += 1.0 / kDraws;
  }
  it->second = std::move(incl);
  return it->second;
}

}  // namespace

double expected_distinct_experts(const LayerShape& s, double rows, double skew) {
  if (!s.is_moe() || rows <= 0.0) return 0.0;
  const double n = s.moe.n_experts, k = s.moe.top_k;
  if (!(skew > 0.0)) return n * (1.0 - std::pow(1.0 - k / n, rows));
  double sum = 0.0;
  for (double pi : inclusion_probabilities(s.moe.n_experts, s.moe.top_k, skew)) sum += 1.0 - std::pow(1.0 - pi, rows);
  return sum;
}

int64_t kv_bytes_per_token(const ModelSpec& m, int unit, int dtype_bytes) {
  const Unit& u = unit_at(m, unit);
  check_positive(dtype_bytes, "dtype_bytes");
  if (u.kind == UnitKind::head) return m.mtp ? m.mtp_modules * layer_kv_row_bytes(m.mtp_shape, dtype_bytes) : 0;
  if (u.kind != UnitKind::layer) return 0;
  return layer_kv_row_bytes(m.layers[u.layer], dtype_bytes);
}

int64_t kv_cache_bytes(const ModelSpec& m, int unit, int sequences, int context, int dtype_bytes) {
  const Unit& u = unit_at(m, unit);
  if (sequences < 0 || context < 0)
    throw InternalError("kv_cache_bytes: sequences and context must be >= 0");
  if (u.kind == UnitKind::embed) return 0;
  const LayerShape& s = u.kind == UnitKind::layer ? m.layers[u.layer] : m.mtp_shape;
  const int window = s.sliding_window;
  const int64_t positions = window > 0 ? std::min(window, context) : context;
  return kv_bytes_per_token(m, unit, dtype_bytes) * sequences * positions;
}

double unit_flops(const ModelSpec& m, int unit, Phase phase, int batch, int tokens, int context) {
  const Unit& u = unit_at(m, unit);
  if (batch < 0 || tokens < 1 || context < tokens)
    throw InternalError("unit_flops: need batch >= 0, tokens >= 1, context >= tokens; got batch " +
                        std::to_string(batch) + ", tokens " + std::to_string(tokens) + ", context " +
                        std::to_string(context));
  const double b = batch, t = tokens;
  switch (u.kind) {
    case UnitKind::embed:
      return 0.0;  // a gather, no matmul
    case UnitKind::head: {
      // lm_head [vocab, hidden] matmul: prefill only needs the last token's logits.
      const double per_token = 2.0 * m.vocab * static_cast<double>(m.hidden);
      const double head = phase == Phase::prefill ? b * per_token : b * t * per_token;
      if (!m.mtp) return head;
      // Each MTP module: eh_proj over every row, its layer, and the shared head again.
      const double eh = 2.0 * 2.0 * m.hidden * static_cast<double>(m.hidden) * b * t;
      return head + m.mtp_modules * (eh + layer_flops(m.mtp_shape, b, tokens, context) + head);
    }
    case UnitKind::layer:
      return layer_flops(m.layers[u.layer], b, tokens, context);
  }
  return 0.0;
}

double unit_bytes_moved(const ModelSpec& m, int unit, Phase phase, int batch, int tokens, int context,
                        int dtype_bytes) {
  const Unit& u = unit_at(m, unit);
  check_positive(dtype_bytes, "dtype_bytes");
  if (batch < 0 || tokens < 1 || context < tokens)
    throw InternalError("unit_bytes_moved: need batch >= 0, tokens >= 1, context >= tokens");
  const double d = dtype_bytes;
  const double rows = static_cast<double>(batch) * tokens;  // token rows of the forward
  const double act = rows * m.hidden * d;                   // one [B, T, hidden] activation
  switch (u.kind) {
    case UnitKind::embed:
      // A gather reads only the rows of the tokens in the batch, not the whole table; writes
      // the activation.
      return std::min(rows, static_cast<double>(m.vocab)) * m.hidden * d + act;
    case UnitKind::head: {
      // The weight, the normed input of the tokens whose logits are computed (prefill: the
      // last one), and their fp32 logits written once.
      const double logit_rows = phase == Phase::prefill ? static_cast<double>(batch) : rows;
      const double head = (m.hidden + static_cast<double>(m.vocab) * m.hidden) * d + logit_rows * m.hidden * d +
                          logit_rows * m.vocab * 4.0;
      if (!m.mtp) return head;
      // Each MTP module: the draft token's embedding rows, norms and eh_proj, its layer, and
      // the shared head read again.
      const double eh = (2.0 * m.hidden * static_cast<double>(m.hidden) + 3.0 * m.hidden) * d + 3.0 * act;
      return head + m.mtp_modules * (rows * m.hidden * d + eh +
                                     layer_bytes(m.mtp_shape, m.hidden, batch, tokens, context, dtype_bytes,
                                                 m.expert_skew) +
                                     head);
    }
    case UnitKind::layer:
      return layer_bytes(m.layers[u.layer], m.hidden, batch, tokens, context, dtype_bytes, m.expert_skew);
  }
  return 0.0;
}

UnitWork unit_work(const ModelSpec& m, int unit, int batch, int prompt_len, const std::vector<int>& decode_contexts,
                   int dtype_bytes) {
  UnitWork w;
  w.prefill_flops = unit_flops(m, unit, Phase::prefill, batch, prompt_len, prompt_len);
  w.prefill_bytes = unit_bytes_moved(m, unit, Phase::prefill, batch, prompt_len, prompt_len, dtype_bytes);
  if (decode_contexts.empty()) throw InternalError("unit_work: no decode contexts");
  for (int c : decode_contexts) {
    w.decode_flops += unit_flops(m, unit, Phase::decode, batch, 1, c + 1);
    w.decode_bytes += unit_bytes_moved(m, unit, Phase::decode, batch, 1, c + 1, dtype_bytes);
  }
  w.decode_flops /= static_cast<double>(decode_contexts.size());
  w.decode_bytes /= static_cast<double>(decode_contexts.size());
  return w;
}

}  // namespace ppb::model
