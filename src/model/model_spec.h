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
  silu,       ///< Llama, Mistral, Qwen, Phi-3 ("silu")
  gelu_tanh,  ///< Gemma ("gelu_pytorch_tanh", "gelu")
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
  int head_dim = 0;      ///< explicit head_dim, else hidden / n_heads
  int intermediate = 0;  ///< intermediate_size of the gated MLP
  int sliding_window = 0;  ///< 0 = global attention; else attend to the last `sliding_window` positions
  bool attn_bias = false;  ///< bias on q/k/v projections (Qwen2, attention_bias=true)
  bool qk_norm = false;    ///< RMSNorm over head_dim on q and k (Qwen3, Gemma-3)
  bool sandwich_norm = false;  ///< Gemma-2/3: post-attention and pre/post-feedforward norms
  bool norm_plus_one = false;  ///< Gemma: RMSNorm scales by (1 + w)
  Activation act = Activation::silu;
  double rms_eps = 1e-6;
  double attn_scale = 0.0;        ///< multiplier of q·k; 1/sqrt(head_dim) or query_pre_attn_scalar^-0.5
  double attn_softcap = 0.0;      ///< Gemma-2 attn_logit_softcapping (0 = none)
  Rope rope;
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
/// Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (gemma3_text), Phi3ForCausalLM.
/// @throws ppb::UserError on malformed JSON (with line/column), a missing or non-positive size,
///         heads that don't divide, or an unsupported architecture (listing the supported ones).
ModelSpec parse_model_config(const std::string& json_text, const std::string& source = "<string>");

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

/// Total parameter count (sum of unit_params).
int64_t total_params(const ModelSpec& m);

/// KV-cache bytes per token per sequence of a unit (0 for embed/head):
/// 2 * n_kv_heads * head_dim * dtype_bytes. A sliding-window layer still allocates
/// min(window, context) positions; see kv_cache_bytes.
int64_t kv_bytes_per_token(const ModelSpec& m, int unit, int dtype_bytes);

/// KV-cache bytes of a unit for `sequences` sequences of `context` tokens.
int64_t kv_cache_bytes(const ModelSpec& m, int unit, int sequences, int context, int dtype_bytes);

/// Matmul + attention FLOPs of one forward of a unit: `batch` sequences, `tokens` new tokens
/// each, attending to `context` positions in total (context >= tokens). Prefill: the head
/// computes logits for the last token only. Formula: 2 * params touched per token plus
/// 4 * n_heads * head_dim * attended positions for attention (Kaplan et al. 2020, §2.1).
double unit_flops(const ModelSpec& m, int unit, Phase phase, int batch, int tokens, int context);

/// Bytes one forward must move to or from memory (the memory-bound floor's numerator): the
/// unit's weights; the KV cache read (the attended positions) and written (the new tokens'
/// rows); the [B, T, hidden] activation read and written; the head's fp32 logits written.
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

/// Bytes of the activation a stage boundary after `unit` carries for `batch` x `tokens`:
/// hidden states batch*tokens*hidden*dtype_bytes, or batch*4 token ids after the head.
int64_t boundary_bytes(const ModelSpec& m, int unit, int batch, int tokens, int dtype_bytes);

}  // namespace ppb::model
