// ModelSpec: a Hugging Face config.json turned into the ordered list of pipeline units
// (embed, layer.0 .. layer.{L-1}, head) with their shapes, signatures and analytic counts.
//
// Pure C++: no MPI, CUDA or HDF5 here (DESIGN.md §5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ppb::model {

enum class UnitKind { embed, layer, head };

/// MLP activation of the gated MLP: act(gate) * up.
enum class Activation {
  silu,       ///< Llama, Mistral, Qwen, Phi-3, Mixtral, DeepSeek ("silu")
  gelu_tanh,  ///< Gemma ("gelu_pytorch_tanh", "gelu")
  /// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
  /// out = (u + 1) * g * sigmoid(1.702 * g) (transformers GptOssExperts; limit = swiglu_limit).
  swiglu_clamped,
};

/// How a mixture-of-experts layer's router chooses and weighs its experts from the logits
/// z = W_router x (+ b): [n_experts] per token.
enum class RouterKind {
  /// p = softmax(z) over all experts; the top_k largest p; weights p, divided by their sum when
  /// norm_topk (Mixtral always; Qwen3-MoE with norm_topk_prob).
  softmax,
  /// DeepSeek-V3 "noaux_tc": s = sigmoid(z); the choice ranks s + correction bias, limited to the
  /// topk_group groups (of n_group equal groups) whose two best biased scores sum highest;
  /// weights are the chosen s (unbiased), divided by their sum when norm_topk, times
  /// routed_scaling.
  sigmoid_grouped,
  /// gpt-oss: the top_k largest z, weights softmax over those k only.
  topk_softmax,
};

/// The mixture-of-experts part of a layer (n_experts == 0: a dense MLP of LayerShape::intermediate).
struct MoeShape {
  int n_experts = 0;            ///< routed experts (num_local_experts, num_experts, n_routed_experts)
  int top_k = 0;                ///< experts per token (num_experts_per_tok)
  int expert_intermediate = 0;  ///< each expert's gated-MLP width (moe_intermediate_size; Mixtral, gpt-oss: intermediate_size)
  int n_shared = 0;             ///< shared experts every token passes (DeepSeek n_shared_experts); one MLP of
                                ///< n_shared * expert_intermediate, held in LayerShape::intermediate
  RouterKind router = RouterKind::softmax;
  bool norm_topk = false;       ///< renormalise the chosen weights to sum 1
  int n_group = 1;              ///< sigmoid_grouped: expert groups, and how many of them a token may use
  int topk_group = 1;
  double routed_scaling = 1.0;  ///< sigmoid_grouped: routed_scaling_factor
  bool router_bias = false;     ///< gpt-oss: the router linear has a bias
  bool expert_bias = false;     ///< gpt-oss: biases on each expert's gate/up [2 * I] and down [H]
  bool operator==(const MoeShape&) const = default;
};

/// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; kv_lora_rank == 0: not MLA). Per token:
/// q = W_qb rmsnorm(W_qa x) (or W_q x when q_lora_rank == 0), [n_heads, qk_nope + qk_rope];
/// [c_kv, k_rope] = W_kva x with c_kv = rmsnorm(.) [kv_lora_rank] and k_rope [qk_rope] (RoPE, shared
/// by every head): the KV cache holds only these kv_lora_rank + qk_rope values per token;
/// W_kvb [n_heads * (qk_nope + v_head_dim), kv_lora_rank] expands c_kv into each head's k_nope and v.
struct MlaShape {
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope = 0;
  int qk_rope = 0;
  int v_head_dim = 0;
  bool operator==(const MlaShape&) const = default;
};

/// Rotary embedding parameters of one layer (HF `rope_theta`, `rope_scaling`).
struct Rope {
  double theta = 10000.0;
  std::string scaling_type;  ///< "" (none), "linear", "llama3"
  double factor = 1.0;       ///< linear / llama3 scaling factor
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
  bool operator==(const Rope&) const = default;
};

/// Everything that determines the cost and the math of one decoder layer. Two layers with
/// equal LayerShape share a signature.
struct LayerShape {
  int hidden = 0;        ///< hidden_size
  int n_heads = 0;       ///< num_attention_heads (query heads)
  int n_kv_heads = 0;    ///< num_key_value_heads (GQA groups; == n_heads for MHA, 1 for MQA)
  int head_dim = 0;      ///< explicit head_dim, else hidden / n_heads (MLA: qk_nope + qk_rope)
  /// intermediate_size of the gated MLP; in a MoE layer the shared experts' width (0: none)
  int intermediate = 0;
  int sliding_window = 0;  ///< 0 = global attention; else attend to the last `sliding_window` positions
  bool attn_bias = false;  ///< bias on q/k/v projections (Qwen2, attention_bias=true)
  bool o_bias = false;     ///< bias on o_proj too (gpt-oss)
  bool attn_sinks = false; ///< gpt-oss: a learned logit per head joins each softmax's denominator
  double swiglu_limit = 0.0;  ///< Activation::swiglu_clamped's limit
  bool qk_norm = false;    ///< RMSNorm over head_dim on q and k (Qwen3, Gemma-3)
  bool sandwich_norm = false;  ///< Gemma-2/3: post-attention and pre/post-feedforward norms
  bool norm_plus_one = false;  ///< Gemma: RMSNorm scales by (1 + w)
  Activation act = Activation::silu;
  double rms_eps = 1e-6;
  double attn_scale = 0.0;        ///< multiplier of q·k; 1/sqrt(head_dim) or query_pre_attn_scalar^-0.5
  double attn_softcap = 0.0;      ///< Gemma-2 attn_logit_softcapping (0 = none)
  Rope rope;
  MoeShape moe;
  MlaShape mla;
  bool is_moe() const { return moe.n_experts > 0; }
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  bool operator==(const LayerShape&) const = default;
};

/// One pipeline unit.
struct Unit {
  std::string name;       ///< "embed", "layer.<i>", "head"
  UnitKind kind = UnitKind::layer;
  int layer = -1;         ///< decoder layer index for kind == layer, else -1
  int signature = 0;      ///< index into ModelSpec::signatures
};

/// Parsed model. Units are in pipeline order: units[0] = embed, units[1..L] = layers, units[L+1] = head.
struct ModelSpec {
  std::string source;          ///< file name or "<string>"
  std::string config_json;     ///< the input text, verbatim
  std::string architecture;    ///< architectures[0], e.g. "LlamaForCausalLM"
  std::string model_type;      ///< e.g. "llama", "qwen3", "gemma3_text"
  int hidden = 0;
  int n_layers = 0;
  int vocab = 0;
  bool tie_embeddings = false;
  bool embed_scale_sqrt_hidden = false;  ///< Gemma multiplies embeddings by sqrt(hidden)
  bool final_norm_plus_one = false;      ///< Gemma final norm uses (1 + w)
  double final_softcap = 0.0;            ///< Gemma-2 final_logit_softcapping (0 = none)
  double rms_eps = 1e-6;
  std::vector<LayerShape> layers;        ///< [n_layers]
  /// Multi-token-prediction modules (DeepSeek-V3 num_nextn_predict_layers): each an embedding
  /// norm, a hidden norm, eh_proj [H, 2H], one decoder layer of mtp_shape and a final norm,
  /// sharing the embedding and lm_head. Counted by total_params (mtp_params) always; run with
  /// the head (enable_mtp) when --mtp asks for them.
  int mtp_modules = 0;
  LayerShape mtp_shape;
  /// --mtp: the head unit ("head+mtp") also runs the MTP modules after the head, as speculative
  /// decoding serves with them: each module drafts a token from the main model's final hidden
  /// state and the token before it. Its parameters, weights, KV cache, FLOPs and bytes are the
  /// head unit's. The module must share the head's stage (it reads the head's token and hidden
  /// state and shares lm_head), so it is not a separately placeable unit.
  bool mtp = false;
  /// --expert-skew the run routes with (0: the router's own choice): the floors count the experts
  /// a forward reaches under it (expected_distinct_experts).
  double expert_skew = 0.0;
  std::vector<Unit> units;               ///< [n_layers + 2]
  std::vector<std::string> signatures;   ///< signature names, e.g. "embed", "layer.global", "layer.local", "head"
  std::vector<int> signature_example;    ///< for each signature, the index of its first unit

  int num_units() const { return static_cast<int>(units.size()); }
  const LayerShape& layer_of(int unit) const;  ///< shape of a layer unit; throws if not a layer
};

/// Phase of inference a count refers to.
enum class Phase { prefill, decode };

/// Parses a Hugging Face config.json text.
/// Supported architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
/// Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (gemma3_text), Phi3ForCausalLM, and the
/// mixture-of-experts MixtralForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM (also
/// Kimi-K2; MLA) and GptOssForCausalLM.
/// @throws ppb::UserError on malformed JSON (with line/column), a missing or non-positive size,
///         heads that don't divide, or an unsupported architecture (listing the supported ones).
ModelSpec parse_model_config(const std::string& json_text, const std::string& source = "<string>");

/// --mtp: makes the head unit run the model's MTP modules too (ModelSpec::mtp); renames the head
/// unit and its signature "head+mtp". @throws ppb::UserError naming --mtp when the model has none.
void enable_mtp(ModelSpec& m);

/// Reads and parses a config.json file. @throws ppb::UserError if unreadable or invalid.
ModelSpec load_model_config(const std::string& path);

/// The supported `architectures` values, for messages and --help.
std::vector<std::string> supported_architectures();

/// Unique parameter count of a unit (tied lm_head counted once, in embed). Sum over units =
/// the model's parameter count (Llama-3.1-8B: 8,030,261,248).
int64_t unit_params(const ModelSpec& m, int unit);

/// Parameters resident on the stage that holds the unit (a tied head still needs the
/// [vocab, hidden] matrix on its stage).
int64_t unit_resident_params(const ModelSpec& m, int unit);

/// Parameters of the multi-token-prediction modules (0 without), not counting the embedding and
/// lm_head they share with the model (DeepSeek-V3: one module, 11.6 B).
int64_t mtp_params(const ModelSpec& m);

/// Total parameter count: the sum of unit_params plus mtp_params (the checkpoint holds both).
int64_t total_params(const ModelSpec& m);

/// Parameters of a unit one token's forward multiplies by: a MoE layer's attention, router,
/// shared experts and top_k of its routed experts; a dense unit's all, but for the embedding,
/// of which a token reads one row (0 here). Sum over units: the model's active parameters as
/// DeepSeek-V3 (36.6 B of 671 B) and gpt-oss (5.13 B of 116.83 B) publish them; Mixtral's "12.9 B"
/// and Qwen3-30B-A3B's "3.3 B" add the embedding table.
int64_t unit_active_params(const ModelSpec& m, int unit);

/// Sum of unit_active_params over the units.
int64_t active_params(const ModelSpec& m);

/// Expected distinct experts that `rows` tokens reach when each picks top_k of n_experts
/// uniformly: n (1 - (1 - k/n)^rows). With skew A > 0 (--expert-skew: each token's experts a
/// Gumbel-top-k sample of p ~ rank^-A): sum_e 1 - (1 - pi_e)^rows, pi_e the probability that a
/// token's k include expert e, estimated once per (n, k, A) from 8192 draws of a fixed stream
/// (within ~1% of exact). 0 for a dense layer. A decode step reads only these experts.
double expected_distinct_experts(const LayerShape& s, double rows, double skew = 0.0);

/// KV-cache bytes per token per sequence of a unit (0 for embed/head):
/// 2 * n_kv_heads * head_dim * dtype_bytes; MLA: (kv_lora_rank + qk_rope) * dtype_bytes. A sliding-window layer still allocates
/// min(window, context) positions; see kv_cache_bytes.
int64_t kv_bytes_per_token(const ModelSpec& m, int unit, int dtype_bytes);

/// KV-cache bytes of a unit for `sequences` sequences of `context` tokens.
int64_t kv_cache_bytes(const ModelSpec& m, int unit, int sequences, int context, int dtype_bytes);

/// Matmul + attention FLOPs of one forward of a unit: `batch` sequences, `tokens` new tokens
/// each, attending to `context` positions in total (context >= tokens). Prefill: the head
/// computes logits for the last token only. Formula: 2 * params touched per token plus
/// 4 * n_heads * head_dim * attended positions for attention (Kaplan et al. 2020, §2.1). A MoE
/// layer counts its active parameters (unit_active_params); MLA is counted in its absorbed form
/// (W_kvb folded into the query and the output, as DeepSeek's inference code runs decode):
/// 2 * n_heads * (2 * kv_lora_rank + qk_rope) per attended position.
double unit_flops(const ModelSpec& m, int unit, Phase phase, int batch, int tokens, int context);

/// Bytes one forward must move to or from memory (the memory-bound floor's numerator): the
/// unit's weights; the KV cache read (the attended positions) and written (the new tokens'
/// rows); the [B, T, hidden] activation read and written; the head's fp32 logits written.
/// A MoE layer reads only the experts its B*T tokens reach (expected_distinct_experts).
/// Embed: the gathered table rows and the activation written.
double unit_bytes_moved(const ModelSpec& m, int unit, Phase phase, int batch, int tokens, int context,
                        int dtype_bytes);

/// FLOPs and bytes of one unit's forwards as the profiler times them: prefill of `batch` x
/// `prompt_len` tokens from position 0; decode of `batch` x 1 token at position c (attending
/// c + 1 positions), averaged over `decode_contexts` as the profile's decode latency is.
struct UnitWork {
  double prefill_flops = 0.0, prefill_bytes = 0.0;  ///< FLOP, bytes
  double decode_flops = 0.0, decode_bytes = 0.0;    ///< FLOP, bytes (mean over contexts)
};
/// @throws ppb::InternalError for an empty decode_contexts or invalid sizes.
UnitWork unit_work(const ModelSpec& m, int unit, int batch, int prompt_len, const std::vector<int>& decode_contexts,
                   int dtype_bytes);

}  // namespace ppb::model
