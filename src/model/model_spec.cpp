// ModelSpec: parsing of Hugging Face config.json files and the analytic counts of each unit.
//
// Field meanings and defaults follow the transformers configuration classes of each family
// (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Gemma2Config, Gemma3TextConfig,
// Phi3Config, MixtralConfig, Qwen3MoeConfig, DeepseekV3Config, GptOssConfig). Only what changes
// the shapes, the math or the cost of a unit is read.
#include "model/model_spec.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <numeric>
#include <mutex>
#include <map>

#include "common/error.h"

namespace ppb::model {
namespace {

using nlohmann::json;

// Sizes above these are refused as absurd, so that every count stays well inside int64 and a
// config cannot make the parser allocate gigabytes. The largest dense models have hidden 16384,
// intermediate 53248, vocab 262208, 128 heads and 126 layers (Llama-3.1-405B, Gemma-3).
constexpr int kMaxSize = 1 << 24;         ///< hidden, intermediate, vocab, heads, head_dim
constexpr int kMaxLayers = 1 << 14;       ///< num_hidden_layers
constexpr double kMaxParams = 1e15;       ///< the whole model (Llama-3.1-405B: 4.1e11)

constexpr int kMaxExperts = 1 << 16;     ///< routed experts of a layer (DeepSeek-V3: 256, Kimi-K2: 384)

enum class Family { llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen3_moe, deepseek_v3, gpt_oss };

struct ArchInfo {
  const char* architecture;  ///< architectures[0]
  const char* model_type;    ///< the matching model_type, for configs without `architectures`
  Family family;
  bool text_config;          ///< the decoder's fields live in a `text_config` sub-object
};

constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", Family::llama, false},
    {"MistralForCausalLM", "mistral", Family::mistral, false},
    {"Qwen2ForCausalLM", "qwen2", Family::qwen2, false},
    {"Qwen3ForCausalLM", "qwen3", Family::qwen3, false},
    {"Gemma2ForCausalLM", "gemma2", Family::gemma2, false},
    {"Gemma3ForCausalLM", "gemma3_text", Family::gemma3, false},
    {"Gemma3ForConditionalGeneration", "gemma3", Family::gemma3, true},
    {"Phi3ForCausalLM", "phi3", Family::phi3, false},
    {"MixtralForCausalLM", "mixtral", Family::mixtral, false},
    {"Qwen3MoeForCausalLM", "qwen3_moe", Family::qwen3_moe, false},
    {"DeepseekV3ForCausalLM", "deepseek_v3", Family::deepseek_v3, false},
    {"GptOssForCausalLM", "gpt_oss", Family::gpt_oss, false},
};

std::string supported_list() {
  std::string s;
  for (const auto& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.architecture;
  }
  return s;
}

/// A JSON value shortened for an error message.
std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) {
    size_t n = 57;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // keep UTF-8 whole
    s = s.substr(0, n) + "...";
  }
  return s;
}

/// Typed, checked access to the fields of one config object. Every failure is a UserError that
/// names the source, the field (with its `text_config.` prefix where relevant) and the value.
class ConfigReader {
 public:
  ConfigReader(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw UserError("model config " + source_ + ": " + what);
  }
  std::string field(const std::string& key) const { return prefix_ + key; }

  /// Present and not null.
  bool has(const std::string& key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  const json& at(const std::string& key) const { return obj_.at(key); }

  /// A required integer >= `min` and <= `max`.
  int int_at_least(const std::string& key, int min, const char* what, int max = INT_MAX) const {
    if (!has(key)) fail("missing required field '" + field(key) + "' (" + what + ")");
    const json& v = obj_.at(key);
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      x = u > static_cast<uint64_t>(INT_MAX) ? int64_t{INT_MAX} + 1 : static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
               v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 1e12) {
      x = static_cast<int64_t>(v.get<double>());  // 4096.0 is accepted as 4096
    } else {
      fail(field(key) + " must be " + what + ", got " + show(v));
    }
    if (x < min) fail(field(key) + " must be " + what + ", got " + show(v));
    if (x > max)
      fail(field(key) + " must be " + what + " of at most " + std::to_string(max) + ", got " + show(v));
    return static_cast<int>(x);
  }
  int positive_int(const std::string& key, int max = INT_MAX) const {
    return int_at_least(key, 1, "a positive integer", max);
  }
  int positive_int_or(const std::string& key, int dflt, int max = INT_MAX) const {
    return has(key) ? positive_int(key, max) : dflt;
  }
  /// Window-like field: missing -> `if_missing`; null -> 0 (none); else a positive integer.
  int window_or(const std::string& key, int if_missing) const {
    if (obj_.find(key) == obj_.end()) return if_missing;
    return has(key) ? int_at_least(key, 1, "a positive integer or null") : 0;
  }
  /// A number > 0 (or >= 0 when `allow_zero`); missing or null -> `dflt`.
  double number_or(const std::string& key, double dflt, bool allow_zero = false) const {
    if (!has(key)) return dflt;
    const json& v = obj_.at(key);
    const char* what = allow_zero ? "a non-negative number" : "a positive number";
    if (!v.is_number()) fail(field(key) + " must be " + what + ", got " + show(v));
    double x = v.get<double>();
    if (!std::isfinite(x) || x < 0.0 || (!allow_zero && x == 0.0))
      fail(field(key) + " must be " + what + ", got " + show(v));
    return x;
  }
  bool bool_or(const std::string& key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = obj_.at(key);
    if (!v.is_boolean()) fail(field(key) + " must be true or false, got " + show(v));
    return v.get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    const json& v = obj_.at(key);
    if (!v.is_string()) fail(field(key) + " must be a string, got " + show(v));
    return v.get<std::string>();
  }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

/// Parses the text; a syntax error becomes a UserError with line:column.
json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based: the index of the last character read (n + 1 at end of input).
    size_t pos = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < pos; ++i) {
      if (text[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    size_t column = pos - line_start + 1;
    // Keep nlohmann's reason, without its "[json.exception...] parse error at ...: " prefix.
    std::string reason = e.what();
    if (auto p = reason.find("parse error"); p != std::string::npos) {
      if (auto c = reason.find(": ", p); c != std::string::npos) reason = reason.substr(c + 2);
    }
    throw UserError("model config " + source + ": malformed JSON at line " + std::to_string(line) +
                    ", column " + std::to_string(column) + ": " + reason);
  } catch (const json::exception& e) {
    // json::parse also throws out_of_range.406 for a number beyond double ("1e400").
    std::string reason = e.what();
    if (auto p = reason.find("] "); p != std::string::npos) reason = reason.substr(p + 2);
    throw UserError("model config " + source + ": malformed JSON: " + reason);
  }
}

/// Finds the architecture from architectures[0], else from model_type.
const ArchInfo& identify(const json& root, const std::string& source) {
  auto arch_it = root.find("architectures");
  if (arch_it != root.end() && arch_it->is_array() && !arch_it->empty()) {
    const json& first = (*arch_it)[0];
    if (!first.is_string())
      throw UserError("model config " + source + ": architectures[0] must be a string, got " +
                      show(first));
    std::string name = first.get<std::string>();
    for (const auto& a : kArchs)
      if (name == a.architecture) return a;
    throw UserError("unsupported architecture '" + name + "' in " + source + "; supported: " +
                    supported_list());
  }
  auto type_it = root.find("model_type");
  if (type_it != root.end() && type_it->is_string()) {
    std::string type = type_it->get<std::string>();
    for (const auto& a : kArchs)
      if (type == a.model_type) return a;
    throw UserError("unsupported model_type '" + type + "' (no 'architectures' field) in " + source +
                    "; supported: " + supported_list());
  }
  throw UserError("model config " + source +
                  ": neither 'architectures' nor 'model_type' is given, so the architecture is "
                  "unknown; supported: " + supported_list());
}

/// Gemma3TextConfig's defaults (transformers configuration_gemma3.py), for the keys a
/// Gemma3ForConditionalGeneration `text_config` may leave out (e.g. gemma-3-4b-it lists only
/// the sizes that differ from these).
const json& gemma3_text_defaults() {
  static const json d = {
      {"vocab_size", 262208},          {"hidden_size", 2304},
      {"intermediate_size", 9216},     {"num_hidden_layers", 26},
      {"num_attention_heads", 8},      {"num_key_value_heads", 4},
      {"head_dim", 256},               {"hidden_activation", "gelu_pytorch_tanh"},
      {"rms_norm_eps", 1e-6},          {"rope_theta", 1000000.0},
      {"attention_bias", false},       {"query_pre_attn_scalar", 256},
      {"sliding_window", 4096},        {"final_logit_softcapping", nullptr},
      {"attn_logit_softcapping", nullptr}, {"rope_scaling", nullptr},
      {"rope_local_base_freq", 10000.0}, {"sliding_window_pattern", 6},
      {"tie_word_embeddings", true},   {"model_type", "gemma3_text"},
  };
  return d;
}

/// rope_theta + rope_scaling of the global (or only) kind of layer.
Rope read_rope(const ConfigReader& r) {
  Rope rope;
  rope.theta = r.number_or("rope_theta", 10000.0);
  if (!r.has("rope_scaling")) return rope;
  const json& s = r.at("rope_scaling");
  if (!s.is_object()) r.fail(r.field("rope_scaling") + " must be an object or null, got " + show(s));
  ConfigReader sr(s, "", "");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto it = s.find(key);
    if (it != s.end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  auto positive = [&](const char* key, double dflt) {
    if (!sr.has(key)) return dflt;
    const json& v = s.at(key);
    if (!v.is_number() || !(v.get<double>() > 0.0) || !std::isfinite(v.get<double>()))
      r.fail(r.field("rope_scaling") + "." + key + " must be a positive number, got " + show(v));
    return v.get<double>();
  };
  if (type == "linear") {
    rope.scaling_type = "linear";
    rope.factor = positive("factor", 1.0);
  } else if (type == "llama3") {
    rope.scaling_type = "llama3";
    rope.factor = positive("factor", 8.0);
    rope.low_freq_factor = positive("low_freq_factor", 1.0);
    rope.high_freq_factor = positive("high_freq_factor", 4.0);
    double omp = positive("original_max_position_embeddings", 8192.0);
    if (omp > INT_MAX)  // the cast below would be undefined
      r.fail(r.field("rope_scaling") + ".original_max_position_embeddings must be at most " +
             std::to_string(INT_MAX) + ", got " + show(s.at("original_max_position_embeddings")));
    rope.original_max_position = static_cast<int>(omp);
  }
  // Anything else ("default", "dynamic", "yarn", "longrope", "su", ...) is kept as unscaled
  // RoPE: these change only the rotary frequencies (and for dynamic, only past the trained
  // length), not a shape, a FLOP or a byte, and the weights here are random anyway.
  return rope;
}

/// Which layers are sliding-window ones, from an explicit `layer_types` list.
std::vector<bool> read_layer_types(const ConfigReader& r, int n_layers) {
  const json& lt = r.at("layer_types");
  if (!lt.is_array() || static_cast<int>(lt.size()) != n_layers)
    r.fail(r.field("layer_types") + " must be a list of " + std::to_string(n_layers) +
           " entries (num_hidden_layers), got " + show(lt));
  std::vector<bool> sliding(n_layers);
  for (int i = 0; i < n_layers; ++i) {
    const json& t = lt[i];
    if (t == "sliding_attention") {
      sliding[i] = true;
    } else if (t == "full_attention") {
      sliding[i] = false;
    } else {
      r.fail(r.field("layer_types") + "[" + std::to_string(i) +
             "] must be \"sliding_attention\" or \"full_attention\", got " + show(t));
    }
  }
  return sliding;
}

Activation read_activation(const ConfigReader& r, bool gemma) {
  // Gemma-2/3 name it hidden_activation (and may carry a stale hidden_act); others hidden_act.
  std::string key = r.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  std::string act = r.string_or(key, gemma ? "gelu_pytorch_tanh" : "silu");
  if (act == "silu" || act == "swish") return Activation::silu;
  if (act == "gelu_pytorch_tanh" || act == "gelu" || act == "gelu_new") return Activation::gelu_tanh;
  r.fail(r.field(key) + " '" + act +
         "' is not supported; supported: silu, swish, gelu_pytorch_tanh, gelu, gelu_new");
}

/// Multi-head latent attention's sizes (DeepseekV3ForCausalLM), all required: q_lora_rank may be
/// null (a direct q_proj, as DeepSeek-V2-Lite) but not absent. `cfg` is the object `r` reads.
MlaShape read_mla(const ConfigReader& r, const json& cfg) {
  if (!cfg.contains("q_lora_rank"))
    r.fail("missing required field '" + r.field("q_lora_rank") +
           "' (a positive integer, or null for a direct q_proj as DeepSeek-V2-Lite)");
  MlaShape mla;
  mla.q_lora_rank = r.has("q_lora_rank") ? r.positive_int("q_lora_rank", kMaxSize) : 0;
  mla.kv_lora_rank = r.positive_int("kv_lora_rank", kMaxSize);
  mla.qk_nope = r.positive_int("qk_nope_head_dim", kMaxSize);
  mla.qk_rope = r.positive_int("qk_rope_head_dim", kMaxSize);
  mla.v_head_dim = r.positive_int("v_head_dim", kMaxSize);
  if (mla.qk_rope % 2 != 0)
    r.fail(r.field("qk_rope_head_dim") + " must be even (RoPE rotates pairs), got " + std::to_string(mla.qk_rope));
  return mla;
}

/// A list of distinct layer indices in [0, n_layers) (Qwen3-MoE mlp_only_layers).
std::vector<bool> read_layer_set(const ConfigReader& r, const std::string& key, int n_layers) {
  std::vector<bool> in(n_layers, false);
  if (!r.has(key)) return in;
  const json& v = r.at(key);
  if (!v.is_array()) r.fail(r.field(key) + " must be a list of layer indices, got " + show(v));
  for (const json& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= n_layers)
      r.fail(r.field(key) + " must hold layer indices in [0, " + std::to_string(n_layers) + "), got " + show(e));
    in[static_cast<size_t>(e.get<int64_t>())] = true;
  }
  return in;
}

/// The mixture-of-experts fields of a MoE family, and which layers are MoE ones (the others keep
/// the dense MLP of intermediate_size). The sizes of the experts and of the routing are required
/// (a config without them is a mistake, not a model); the rest default as in the transformers
/// configuration classes.
/// DeepSeek-V3's multi-token-prediction modules are read here too (their layer is a MoE one).
void read_experts(const ConfigReader& r, Family fam, ModelSpec& m) {
  if (fam != Family::mixtral && fam != Family::qwen3_moe && fam != Family::deepseek_v3 && fam != Family::gpt_oss)
    return;
  const int L = m.n_layers;
  MoeShape moe;
  std::vector<bool> moe_layer(L, true);
  int shared_width = 0;
  std::string experts_key;
  switch (fam) {
    case Family::mixtral:
      experts_key = "num_local_experts";
      moe.n_experts = r.positive_int(experts_key, kMaxExperts);
      moe.top_k = r.positive_int("num_experts_per_tok", kMaxExperts);
      moe.expert_intermediate = m.layers[0].intermediate;
      moe.router = RouterKind::softmax;
      moe.norm_topk = true;  // MixtralSparseMoeBlock always renormalises the top k
      break;
    case Family::qwen3_moe: {
      experts_key = "num_experts";
      moe.n_experts = r.positive_int(experts_key, kMaxExperts);
      moe.top_k = r.positive_int("num_experts_per_tok", kMaxExperts);
      moe.expert_intermediate = r.positive_int("moe_intermediate_size", kMaxSize);
      moe.router = RouterKind::softmax;
      moe.norm_topk = r.bool_or("norm_topk_prob", false);
      // Qwen3MoeDecoderLayer: MoE iff the layer is not in mlp_only_layers and
      // (i + 1) % decoder_sparse_step == 0.
      const int step = r.positive_int_or("decoder_sparse_step", 1);
      const std::vector<bool> mlp_only = read_layer_set(r, "mlp_only_layers", L);
      for (int i = 0; i < L; ++i) moe_layer[i] = !mlp_only[i] && (i + 1) % step == 0;
      break;
    }
    case Family::deepseek_v3: {
      experts_key = "n_routed_experts";
      moe.n_experts = r.positive_int(experts_key, kMaxExperts);
      moe.top_k = r.positive_int("num_experts_per_tok", kMaxExperts);
      moe.expert_intermediate = r.positive_int("moe_intermediate_size", kMaxSize);
      moe.n_shared = r.has("n_shared_experts") ? r.int_at_least("n_shared_experts", 0, "a non-negative integer", 1024) : 1;
      if (int64_t{moe.n_shared} * moe.expert_intermediate > kMaxSize)
        r.fail(r.field("n_shared_experts") + " x moe_intermediate_size = " +
               std::to_string(int64_t{moe.n_shared} * moe.expert_intermediate) + " shared-expert features (at most " +
               std::to_string(kMaxSize) + "): absurd");
      shared_width = moe.n_shared * moe.expert_intermediate;
      moe.router = RouterKind::sigmoid_grouped;
      moe.norm_topk = r.bool_or("norm_topk_prob", true);
      moe.n_group = r.positive_int("n_group", kMaxExperts);
      moe.topk_group = r.positive_int("topk_group", kMaxExperts);
      moe.routed_scaling = r.number_or("routed_scaling_factor", 2.5);
      if (const std::string f = r.string_or("scoring_func", "sigmoid"); f != "sigmoid")
        r.fail(r.field("scoring_func") + " '" + f + "' is not supported for DeepseekV3ForCausalLM; supported: sigmoid");
      if (const std::string t = r.string_or("topk_method", "noaux_tc"); t != "noaux_tc")
        r.fail(r.field("topk_method") + " '" + t + "' is not supported for DeepseekV3ForCausalLM; supported: noaux_tc");
      if (moe.n_experts % moe.n_group != 0)
        r.fail(r.field("n_group") + " (" + std::to_string(moe.n_group) + ") must divide n_routed_experts (" +
               std::to_string(moe.n_experts) + ")");
      if (moe.topk_group > moe.n_group)
        r.fail(r.field("topk_group") + " (" + std::to_string(moe.topk_group) + ") must be at most n_group (" +
               std::to_string(moe.n_group) + ")");
      if (moe.top_k > moe.topk_group * (moe.n_experts / moe.n_group))
        r.fail(r.field("num_experts_per_tok") + " (" + std::to_string(moe.top_k) + ") exceeds the " +
               std::to_string(moe.topk_group * (moe.n_experts / moe.n_group)) +
               " experts of the topk_group groups a token may use");
      // DeepseekV3: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0.
      const int first_dense = r.has("first_k_dense_replace")
                                  ? r.int_at_least("first_k_dense_replace", 0, "a non-negative integer")
                                  : 3;
      const int freq = r.positive_int_or("moe_layer_freq", 1);
      for (int i = 0; i < L; ++i) moe_layer[i] = i >= first_dense && i % freq == 0;
      m.mtp_modules = r.has("num_nextn_predict_layers")
                          ? r.int_at_least("num_nextn_predict_layers", 0, "a non-negative integer", 64)
                          : 0;
      break;
    }
    case Family::gpt_oss:
      experts_key = "num_local_experts";
      moe.n_experts = r.positive_int(experts_key, kMaxExperts);
      moe.top_k = r.has("num_experts_per_tok") ? r.positive_int("num_experts_per_tok", kMaxExperts)
                                                : r.positive_int("experts_per_token", kMaxExperts);
      moe.expert_intermediate = m.layers[0].intermediate;
      moe.router = RouterKind::topk_softmax;
      moe.router_bias = true;
      moe.expert_bias = true;
      break;
    default:
      return;
  }
  if (moe.top_k > moe.n_experts)
    r.fail(r.field("num_experts_per_tok") + " (" + std::to_string(moe.top_k) + ") exceeds " + r.field(experts_key) +
           " (" + std::to_string(moe.n_experts) + ")");
  for (int i = 0; i < L; ++i) {
    if (!moe_layer[i]) continue;
    m.layers[i].moe = moe;
    m.layers[i].intermediate = shared_width;
  }
  if (m.mtp_modules > 0) {
    // The MTP module's layer is a full decoder layer of the model's last kind (DeepSeek-V3: MoE).
    m.mtp_shape = m.layers[L - 1];
  }
}

/// Names the signatures and assigns every unit its signature (see the header's contract).
void assign_signatures(ModelSpec& m) {
  std::vector<int> shape_of(m.n_layers);  // index into `distinct`
  std::vector<int> distinct;              // first layer index of each distinct shape
  for (int i = 0; i < m.n_layers; ++i) {
    int k = 0;
    while (k < static_cast<int>(distinct.size()) && !(m.layers[distinct[k]] == m.layers[i])) ++k;
    if (k == static_cast<int>(distinct.size())) distinct.push_back(i);
    shape_of[i] = k;
  }
  // Named by what tells the shapes apart: "dense"/"moe" where both kinds occur (DeepSeek-V3's
  // first layers), "global"/"local" where the attention window differs; a counter for the rest.
  std::vector<std::string> names;
  if (distinct.size() == 1) {
    names.push_back("layer");
  } else {
    bool mixed_moe = false, mixed_window = false;
    for (int first : distinct) {
      mixed_moe |= m.layers[first].is_moe() != m.layers[distinct[0]].is_moe();
      mixed_window |= (m.layers[first].sliding_window == 0) != (m.layers[distinct[0]].sliding_window == 0);
    }
    for (int first : distinct) {
      std::string name = "layer";
      if (mixed_moe) name += m.layers[first].is_moe() ? ".moe" : ".dense";
      if (mixed_window || !mixed_moe) name += m.layers[first].sliding_window == 0 ? ".global" : ".local";
      names.push_back(name);
    }
    std::vector<std::string> base = names;
    for (size_t k = 0; k < names.size(); ++k) {
      if (std::count(base.begin(), base.end(), base[k]) > 1) {
        int nth = static_cast<int>(std::count(base.begin(), base.begin() + k, base[k]));
        names[k] = base[k] + "." + std::to_string(nth);
      }
    }
  }

  m.signatures = {"embed"};
  m.signatures.insert(m.signatures.end(), names.begin(), names.end());
  m.signatures.push_back("head");
  int head_sig = static_cast<int>(m.signatures.size()) - 1;

  m.units.clear();
  m.units.push_back({"embed", UnitKind::embed, -1, 0});
  for (int i = 0; i < m.n_layers; ++i)
    m.units.push_back({"layer." + std::to_string(i), UnitKind::layer, i, 1 + shape_of[i]});
  m.units.push_back({"head", UnitKind::head, -1, head_sig});

  m.signature_example.assign(m.signatures.size(), -1);
  for (int u = 0; u < m.num_units(); ++u)
    if (m.signature_example[m.units[u].signature] < 0) m.signature_example[m.units[u].signature] = u;
}

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

std::vector<std::string> supported_architectures() {
  std::vector<std::string> v;
  for (const auto& a : kArchs) v.push_back(a.architecture);
  return v;
}

const LayerShape& ModelSpec::layer_of(int unit) const {
  const Unit& u = unit_at(*this, unit);
  if (u.kind != UnitKind::layer)
    throw InternalError("unit " + std::to_string(unit) + " ('" + u.name + "') is not a decoder layer");
  return layers[u.layer];
}

ModelSpec parse_model_config(const std::string& json_text, const std::string& source) {
  json root = parse_json(json_text, source);
  if (!root.is_object())
    throw UserError("model config " + source + ": the top level must be a JSON object, got " + show(root));
  const ArchInfo& arch = identify(root, source);

  ModelSpec m;
  m.source = source;
  m.config_json = json_text;
  m.architecture = arch.architecture;
  if (auto it = root.find("architectures"); it != root.end() && it->is_array() && !it->empty())
    m.architecture = (*it)[0].get<std::string>();

  // The decoder's fields: the root, or the text_config of a multimodal wrapper (then
  // completed with the text model's defaults, as transformers does).
  json cfg_storage;
  const json* cfg = &root;
  std::string prefix;
  if (arch.text_config) {
    auto tc = root.find("text_config");
    if (tc == root.end() || !tc->is_object())
      throw UserError("model config " + source + ": " + arch.architecture +
                      " needs a 'text_config' object with the text model's fields");
    cfg_storage = gemma3_text_defaults();
    for (auto it = tc->begin(); it != tc->end(); ++it) cfg_storage[it.key()] = it.value();
    cfg = &cfg_storage;
    prefix = "text_config.";
  }
  const ConfigReader r(*cfg, source, prefix);
  m.model_type = r.string_or("model_type", arch.model_type);

  const Family fam = arch.family;
  const bool gemma = fam == Family::gemma2 || fam == Family::gemma3;

  m.hidden = r.positive_int("hidden_size", kMaxSize);
  m.n_layers = r.positive_int("num_hidden_layers", kMaxLayers);
  const int n_heads = r.positive_int("num_attention_heads", kMaxSize);
  const int intermediate = r.positive_int("intermediate_size", kMaxSize);
  m.vocab = r.positive_int("vocab_size", kMaxSize);
  const int n_kv = r.positive_int_or("num_key_value_heads", n_heads, kMaxSize);
  if (n_heads % n_kv != 0)
    r.fail(r.field("num_key_value_heads") + " (" + std::to_string(n_kv) +
           ") must divide num_attention_heads (" + std::to_string(n_heads) + ")");
  const MlaShape mla = fam == Family::deepseek_v3 ? read_mla(r, *cfg) : MlaShape{};
  int head_dim = 0;
  if (fam == Family::deepseek_v3) {
    head_dim = mla.qk_nope + mla.qk_rope;  // the q.k width of every head
  } else if (r.has("head_dim")) {
    head_dim = r.positive_int("head_dim", kMaxSize);
  } else {
    if (m.hidden % n_heads != 0)
      r.fail(r.field("hidden_size") + " (" + std::to_string(m.hidden) +
             ") is not divisible by num_attention_heads (" + std::to_string(n_heads) +
             ") and no head_dim is given");
    head_dim = m.hidden / n_heads;
  }
  const double q_width = static_cast<double>(n_heads) * head_dim;
  if (q_width > kMaxSize) {
    std::ostringstream os;
    os << "the sizes give " << n_heads << " x " << head_dim << " = " << q_width
       << " query features per token (at most " << kMaxSize << "): num_attention_heads or head_dim is absurd";
    r.fail(os.str());
  }

  m.rms_eps = r.number_or("rms_norm_eps", 1e-6);
  m.tie_embeddings = r.bool_or("tie_word_embeddings", gemma);
  m.embed_scale_sqrt_hidden = gemma;
  m.final_norm_plus_one = gemma;
  // Gemma2Config defaults: attn 50, final 30; null (and Gemma-3's default) means none.
  const bool g2 = fam == Family::gemma2;
  double attn_softcap = 0.0;
  if (gemma) {
    attn_softcap = cfg->contains("attn_logit_softcapping")
                       ? r.number_or("attn_logit_softcapping", 0.0, true)
                       : (g2 ? 50.0 : 0.0);
    m.final_softcap = cfg->contains("final_logit_softcapping")
                          ? r.number_or("final_logit_softcapping", 0.0, true)
                          : (g2 ? 30.0 : 0.0);
  }

  LayerShape base;
  base.hidden = m.hidden;
  base.n_heads = n_heads;
  base.n_kv_heads = n_kv;
  base.head_dim = head_dim;
  base.intermediate = intermediate;
  const bool gpt_oss = fam == Family::gpt_oss;
  // Qwen2: q/k/v bias always; gpt-oss: q/k/v/o biases unless attention_bias is false.
  base.attn_bias = fam == Family::qwen2 || r.bool_or("attention_bias", gpt_oss);
  base.o_bias = gpt_oss && base.attn_bias;
  base.attn_sinks = gpt_oss;
  base.qk_norm = fam == Family::qwen3 || fam == Family::qwen3_moe || fam == Family::gemma3;
  base.sandwich_norm = gemma;
  base.norm_plus_one = gemma;
  if (gpt_oss) {
    base.act = Activation::swiglu_clamped;
    base.swiglu_limit = r.number_or("swiglu_limit", 7.0);
  } else {
    base.act = read_activation(r, gemma);
  }
  base.rms_eps = m.rms_eps;
  base.attn_scale = gemma && r.has("query_pre_attn_scalar")
                        ? 1.0 / std::sqrt(r.number_or("query_pre_attn_scalar", 0.0))
                        : 1.0 / std::sqrt(static_cast<double>(head_dim));
  base.attn_softcap = attn_softcap;
  base.rope = read_rope(r);
  base.mla = mla;
  if (fam == Family::deepseek_v3) {
    // DeepseekV3Attention: 1/sqrt(qk_nope + qk_rope), times mscale^2 with YaRN's
    // mscale = 0.1 * mscale_all_dim * ln(factor) + 1 when rope_scaling gives mscale_all_dim.
    base.attn_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    if (r.has("rope_scaling") && r.at("rope_scaling").is_object()) {
      const json& rs = r.at("rope_scaling");
      auto number = [&](const char* key, double dflt) {  // read_rope checked the object; these two may be absent
        auto it = rs.find(key);
        if (it == rs.end() || it->is_null()) return dflt;
        if (!it->is_number() || !std::isfinite(it->get<double>()))
          r.fail(r.field("rope_scaling") + "." + key + " must be a number, got " + show(*it));
        return it->get<double>();
      };
      const double factor = number("factor", 1.0), all_dim = number("mscale_all_dim", 0.0);
      if (all_dim > 0.0 && factor > 1.0) {
        const double mscale = 0.1 * all_dim * std::log(factor) + 1.0;
        base.attn_scale *= mscale * mscale;
      }
    }
  }
  // Not modelled: Llama's mlp_bias and Phi-3/4's partial_rotary_factor change neither a
  // matmul shape nor the cost visibly (mlp biases are hidden + 2 * intermediate parameters).

  // Which layers use a sliding window, and its size.
  std::vector<bool> sliding(m.n_layers, false);
  int window = 0;
  const bool has_layer_types = r.has("layer_types");
  switch (fam) {
    case Family::llama:
      break;
    case Family::deepseek_v3:
      break;
    case Family::mistral:
    case Family::mixtral:
    case Family::phi3:
      window = r.window_or("sliding_window", 0);
      sliding.assign(m.n_layers, true);
      break;
    case Family::qwen2:
    case Family::qwen3:
    case Family::qwen3_moe:
      // HF: the window exists only with use_sliding_window; then layers i >= max_window_layers
      // use it (Qwen2Config defaults: sliding_window 4096, max_window_layers 28).
      if (r.bool_or("use_sliding_window", false)) {
        window = r.window_or("sliding_window", 4096);
        if (has_layer_types) {
          sliding = read_layer_types(r, m.n_layers);
        } else {
          int mwl = r.has("max_window_layers")
                        ? r.int_at_least("max_window_layers", 0, "a non-negative integer")
                        : 28;
          for (int i = 0; i < m.n_layers; ++i) sliding[i] = i >= mwl;
        }
      }
      break;
    case Family::gpt_oss:
    case Family::gemma2:
      // Gemma-2 and gpt-oss: even layers local, odd layers global, unless layer_types says
      // (default windows: Gemma2Config 4096, GptOssConfig 128).
      window = r.window_or("sliding_window", fam == Family::gpt_oss ? 128 : 4096);
      if (has_layer_types) {
        sliding = read_layer_types(r, m.n_layers);
      } else {
        for (int i = 0; i < m.n_layers; ++i) sliding[i] = i % 2 == 0;
      }
      break;
    case Family::gemma3: {
      // Gemma-3: layer i is global iff (i + 1) % sliding_window_pattern == 0 (5 local : 1 global).
      window = r.window_or("sliding_window", 4096);
      if (has_layer_types) {
        sliding = read_layer_types(r, m.n_layers);
      } else {
        int pattern = r.positive_int_or("sliding_window_pattern", 6);
        for (int i = 0; i < m.n_layers; ++i) sliding[i] = (i + 1) % pattern != 0;
      }
      break;
    }
  }

  // Gemma-3 local layers: their own base frequency, never scaled.
  Rope local_rope = base.rope;
  if (fam == Family::gemma3) {
    local_rope = Rope{};
    local_rope.theta = r.number_or("rope_local_base_freq", 10000.0);
  }

  m.layers.assign(m.n_layers, base);
  for (int i = 0; i < m.n_layers; ++i) {
    if (sliding[i] && window > 0) {
      m.layers[i].sliding_window = window;
      m.layers[i].rope = local_rope;
    }
  }
  read_experts(r, fam, m);

  // Every size is <= 2^24 (experts <= 2^16), but products of them still overflow int64: bound
  // the whole model in double, with the very terms of the counts, before any count is formed.
  double params_bound = 2.0 * m.vocab * static_cast<double>(m.hidden) + m.hidden;
  for (const LayerShape& l : m.layers) params_bound += layer_params_t<double>(l, l.moe.n_experts);
  params_bound += m.mtp_modules * (layer_params_t<double>(m.mtp_shape, m.mtp_shape.moe.n_experts) +
                                   2.0 * m.hidden * static_cast<double>(m.hidden) + 3.0 * m.hidden);
  if (params_bound > kMaxParams) {
    std::ostringstream os;
    os << "the sizes give about " << params_bound << " parameters (at most " << kMaxParams
       << "): hidden_size, intermediate_size, vocab_size, the experts or num_hidden_layers is absurd";
    r.fail(os.str());
  }
  assign_signatures(m);
  return m;
}

ModelSpec load_model_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError("cannot read model config '" + path + "': it is a directory (give the config.json file)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read model config '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw UserError("cannot read model config '" + path + "': read error");
  return parse_model_config(text.str(), path);
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

int64_t boundary_bytes(const ModelSpec& m, int unit, int batch, int tokens, int dtype_bytes) {
  const Unit& u = unit_at(m, unit);
  if (u.kind == UnitKind::head) return int64_t{batch} * 4;  // int32 token ids
  return int64_t{batch} * tokens * m.hidden * dtype_bytes;
}

}  // namespace ppb::model
