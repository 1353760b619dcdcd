// ModelSpec: parsing of Hugging Face config.json files (the architecture, the sizes, the
// options every layer shares, the sliding windows, the unit signatures). The parser's other
// parts: model_config_fields.cpp (RoPE, layer_types, activation, MLA), model_config_moe.cpp (the
// experts); the counts of each unit: model_counts.cpp.
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
#include <sstream>

#include "common/error.h"
#include "model/config_detail.h"

namespace ppb::model {

using namespace detail;

namespace {

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

/// The decoder's fields: the root, or the text_config of a multimodal wrapper, completed with
/// the text model's defaults as transformers does (held in `storage`; `prefix` then names it in
/// messages). @throws ppb::UserError when the wrapper has no text_config object.
const json& decoder_fields(const json& root, const ArchInfo& arch, const std::string& source, json& storage,
                           std::string& prefix) {
  if (!arch.text_config) return root;
  auto tc = root.find("text_config");
  if (tc == root.end() || !tc->is_object())
    throw UserError("model config " + source + ": " + arch.architecture +
                    " needs a 'text_config' object with the text model's fields");
  storage = gemma3_text_defaults();
  for (auto it = tc->begin(); it != tc->end(); ++it) storage[it.key()] = it.value();
  prefix = "text_config.";
  return storage;
}

/// The sizes: m.hidden, m.n_layers, m.vocab, and the returned layer's heads, KV heads, head_dim
/// (DeepSeek-V3: qk_nope + qk_rope), intermediate and MLA sizes.
/// @throws ppb::UserError for a missing, non-positive or absurd size, KV heads that do not
///         divide the heads, or a hidden size the heads do not divide without head_dim.
LayerShape read_sizes(const ConfigReader& r, const json& cfg, Family fam, ModelSpec& m) {
  m.hidden = r.positive_int("hidden_size", kMaxSize);
  m.n_layers = r.positive_int("num_hidden_layers", kMaxLayers);
  const int n_heads = r.positive_int("num_attention_heads", kMaxSize);
  const int intermediate = r.positive_int("intermediate_size", kMaxSize);
  m.vocab = r.positive_int("vocab_size", kMaxSize);
  const int n_kv = r.positive_int_or("num_key_value_heads", n_heads, kMaxSize);
  if (n_heads % n_kv != 0)
    r.fail(r.field("num_key_value_heads") + " (" + std::to_string(n_kv) +
           ") must divide num_attention_heads (" + std::to_string(n_heads) + ")");
  const MlaShape mla = fam == Family::deepseek_v3 ? read_mla(r, cfg) : MlaShape{};
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
  LayerShape base;
  base.hidden = m.hidden;
  base.n_heads = n_heads;
  base.n_kv_heads = n_kv;
  base.head_dim = head_dim;
  base.intermediate = intermediate;
  base.mla = mla;
  return base;
}

/// The model-wide norms and logits: m.rms_eps, m.tie_embeddings, Gemma's scaled embedding,
/// (1 + w) final norm and final logit softcap. Returns the attention logit softcap (0: none).
/// Gemma2Config defaults: attn 50, final 30; null (and Gemma-3's default) means none.
double read_model_norms(const ConfigReader& r, const json& cfg, Family fam, ModelSpec& m) {
  const bool gemma = fam == Family::gemma2 || fam == Family::gemma3;
  m.rms_eps = r.number_or("rms_norm_eps", 1e-6);
  m.tie_embeddings = r.bool_or("tie_word_embeddings", gemma);
  m.embed_scale_sqrt_hidden = gemma;
  m.final_norm_plus_one = gemma;
  const bool g2 = fam == Family::gemma2;
  double attn_softcap = 0.0;
  if (gemma) {
    attn_softcap = cfg.contains("attn_logit_softcapping")
                       ? r.number_or("attn_logit_softcapping", 0.0, true)
                       : (g2 ? 50.0 : 0.0);
    m.final_softcap = cfg.contains("final_logit_softcapping")
                          ? r.number_or("final_logit_softcapping", 0.0, true)
                          : (g2 ? 30.0 : 0.0);
  }
  return attn_softcap;
}

/// DeepseekV3Attention's softmax scale: 1/sqrt(qk_nope + qk_rope) (= 1/sqrt(head_dim)), times
/// mscale^2 with YaRN's mscale = 0.1 * mscale_all_dim * ln(factor) + 1 when rope_scaling gives
/// mscale_all_dim (and a factor > 1). @throws ppb::UserError for a non-numeric factor or
/// mscale_all_dim, or one that makes the scale overflow.
double deepseek_attn_scale(const ConfigReader& r, int head_dim) {
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
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
      scale *= mscale * mscale;
      if (!std::isfinite(scale) || !(scale > 0.0))
        r.fail(r.field("rope_scaling") + ".mscale_all_dim " + show(rs.at("mscale_all_dim")) + " with factor " +
               show(rs.at("factor")) + " gives the attention scale (0.1 * mscale_all_dim * ln(factor) + 1)^2 / " +
               "sqrt(head_dim) = " + std::to_string(scale) + "; it must be finite (DeepSeek-V3 ships 1.0)");
    }
  }
  return scale;
}

/// The options every layer shares, into `base` (whose sizes read_sizes filled): biases, sinks,
/// q/k norms, Gemma's sandwich and (1 + w) norms, the activation, rms_eps, the attention scale
/// and softcap, RoPE.
void read_layer_options(const ConfigReader& r, Family fam, double rms_eps, double attn_softcap, LayerShape& base) {
  const bool gemma = fam == Family::gemma2 || fam == Family::gemma3;
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
  base.rms_eps = rms_eps;
  base.attn_scale = gemma && r.has("query_pre_attn_scalar")
                        ? 1.0 / std::sqrt(r.number_or("query_pre_attn_scalar", 0.0))
                        : 1.0 / std::sqrt(static_cast<double>(base.head_dim));
  base.attn_softcap = attn_softcap;
  base.rope = read_rope(r);
  if (fam == Family::deepseek_v3) base.attn_scale = deepseek_attn_scale(r, base.head_dim);
  // Not modelled: Llama's mlp_bias and Phi-3/4's partial_rotary_factor change neither a
  // matmul shape nor the cost visibly (mlp biases are hidden + 2 * intermediate parameters).
}

/// Which layers use a sliding window, and its size (0: none).
struct SlidingLayers {
  std::vector<bool> sliding;
  int window = 0;
};

/// The family's sliding-window layers: none (Llama, DeepSeek-V3); all (Mistral, Mixtral, Phi-3);
/// Qwen's layers from max_window_layers on, with use_sliding_window; Gemma-2's and gpt-oss's even
/// layers; Gemma-3's all but every sliding_window_pattern-th; an explicit layer_types list where
/// the family reads one.
SlidingLayers read_sliding_layers(const ConfigReader& r, Family fam, int n_layers) {
  SlidingLayers out{std::vector<bool>(n_layers, false), 0};
  std::vector<bool>& sliding = out.sliding;
  int& window = out.window;
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
      sliding.assign(n_layers, true);
      break;
    case Family::qwen2:
    case Family::qwen3:
    case Family::qwen3_moe:
      // HF: the window exists only with use_sliding_window; then layers i >= max_window_layers
      // use it (Qwen2Config defaults: sliding_window 4096, max_window_layers 28).
      if (r.bool_or("use_sliding_window", false)) {
        window = r.window_or("sliding_window", 4096);
        if (has_layer_types) {
          sliding = read_layer_types(r, n_layers);
        } else {
          int mwl = r.has("max_window_layers")
                        ? r.int_at_least("max_window_layers", 0, "a non-negative integer")
                        : 28;
          for (int i = 0; i < n_layers; ++i) sliding[i] = i >= mwl;
        }
      }
      break;
    case Family::gpt_oss:
    case Family::gemma2:
      // Gemma-2 and gpt-oss: even layers local, odd layers global, unless layer_types says
      // (default windows: Gemma2Config 4096, GptOssConfig 128).
      window = r.window_or("sliding_window", fam == Family::gpt_oss ? 128 : 4096);
      if (has_layer_types) {
        sliding = read_layer_types(r, n_layers);
      } else {
        for (int i = 0; i < n_layers; ++i) sliding[i] = i % 2 == 0;
      }
      break;
    case Family::gemma3: {
      // Gemma-3: layer i is global iff (i + 1) % sliding_window_pattern == 0 (5 local : 1 global).
      window = r.window_or("sliding_window", 4096);
      if (has_layer_types) {
        sliding = read_layer_types(r, n_layers);
      } else {
        int pattern = r.positive_int_or("sliding_window_pattern", 6);
        for (int i = 0; i < n_layers; ++i) sliding[i] = (i + 1) % pattern != 0;
      }
      break;
    }
  }
  return out;
}

/// m.layers: `base` for every layer; a sliding-window layer gets the window and, on Gemma-3, the
/// local layers' own RoPE (rope_local_base_freq, never scaled).
void assign_layers(const ConfigReader& r, Family fam, const LayerShape& base, const SlidingLayers& sl, ModelSpec& m) {
  Rope local_rope = base.rope;
  if (fam == Family::gemma3) {
    local_rope = Rope{};
    local_rope.theta = r.number_or("rope_local_base_freq", 10000.0);
  }
  m.layers.assign(m.n_layers, base);
  for (int i = 0; i < m.n_layers; ++i) {
    if (sl.sliding[i] && sl.window > 0) {
      m.layers[i].sliding_window = sl.window;
      m.layers[i].rope = local_rope;
    }
  }
}

/// Every size is <= 2^24 (experts <= 2^16), but products of them still overflow int64: bounds
/// the whole model in double, with the very terms of the counts, before any count is formed.
/// @throws ppb::UserError when the bound exceeds kMaxParams.
void check_params_bound(const ConfigReader& r, const ModelSpec& m) {
  double params_bound = 2.0 * m.vocab * static_cast<double>(m.hidden) + m.hidden;
  for (const LayerShape& l : m.layers) params_bound += layer_params_bound(l);
  params_bound += m.mtp_modules * (layer_params_bound(m.mtp_shape) +
                                   2.0 * m.hidden * static_cast<double>(m.hidden) + 3.0 * m.hidden);
  if (params_bound > kMaxParams) {
    std::ostringstream os;
    os << "the sizes give about " << params_bound << " parameters (at most " << kMaxParams
       << "): hidden_size, intermediate_size, vocab_size, the experts or num_hidden_layers is absurd";
    r.fail(os.str());
  }
}

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> v;
  for (const auto& a : kArchs) v.push_back(a.architecture);
  return v;
}

ModelSpec parse_model_config(const std::string& json_text, const std::string& source) {
  const json root = parse_json(json_text, source);
  if (!root.is_object())
    throw UserError("model config " + source + ": the top level must be a JSON object, got " + show(root));
  const ArchInfo& arch = identify(root, source);

  ModelSpec m;
  m.source = source;
  m.config_json = json_text;
  m.architecture = arch.architecture;
  if (auto it = root.find("architectures"); it != root.end() && it->is_array() && !it->empty())
    m.architecture = (*it)[0].get<std::string>();

  json storage;
  std::string prefix;
  const json& cfg = decoder_fields(root, arch, source, storage, prefix);
  const ConfigReader r(cfg, source, prefix);
  m.model_type = r.string_or("model_type", arch.model_type);

  const Family fam = arch.family;
  LayerShape base = read_sizes(r, cfg, fam, m);
  const double attn_softcap = read_model_norms(r, cfg, fam, m);
  read_layer_options(r, fam, m.rms_eps, attn_softcap, base);
  assign_layers(r, fam, base, read_sliding_layers(r, fam, m.n_layers), m);
  read_experts(r, fam, m);
  check_params_bound(r, m);
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

}  // namespace ppb::model
