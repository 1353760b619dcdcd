// Internals of the config.json parser, shared by its files: model_spec.cpp (the architecture,
// the dense fields, the sliding windows, the parameter bound), model_config_fields.cpp (RoPE,
// layer_types, the activation, MLA), model_config_moe.cpp (the experts) and model_counts.cpp
// (the counts the bound uses). Not part of the model's interface: include it only from
// src/model/*.cpp.
#pragma once

#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/model_spec.h"

namespace ppb::model::detail {

using nlohmann::json;

// Sizes above these are refused as absurd, so that every count stays well inside int64 and a
// config cannot make the parser allocate gigabytes. The largest dense models have hidden 16384,
// intermediate 53248, vocab 262208, 128 heads and 126 layers (Llama-3.1-405B, Gemma-3).
constexpr int kMaxSize = 1 << 24;         ///< hidden, intermediate, vocab, heads, head_dim
constexpr int kMaxLayers = 1 << 14;       ///< num_hidden_layers
constexpr double kMaxParams = 1e15;       ///< the whole model (Llama-3.1-405B: 4.1e11)

constexpr int kMaxExperts = 1 << 16;     ///< routed experts of a layer (DeepSeek-V3: 256, Kimi-K2: 384)

/// The transformers configuration class a config is read as (model_spec.cpp kArchs).
enum class Family { llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen3_moe, deepseek_v3, gpt_oss };

/// A JSON value shortened for an error message: its dump, cut to 57 bytes (whole UTF-8
/// characters) and "..." when longer than 60.
std::string show(const json& v);

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

/// rope_theta + rope_scaling of the global (or only) kind of layer (model_config_fields.cpp):
/// "linear" and "llama3" scaling are read; any other type is kept as unscaled RoPE.
/// @throws ppb::UserError naming the rope_scaling field that is not a positive number.
Rope read_rope(const ConfigReader& r);

/// Which of the `n_layers` layers are sliding-window ones, from an explicit `layer_types` list
/// of "sliding_attention" / "full_attention" (model_config_fields.cpp).
/// @throws ppb::UserError for a list of another length or another entry.
std::vector<bool> read_layer_types(const ConfigReader& r, int n_layers);

/// The MLP's activation from hidden_activation (Gemma-2/3) or hidden_act; default
/// gelu_pytorch_tanh for `gemma`, else silu (model_config_fields.cpp).
/// @throws ppb::UserError for an unsupported name, listing the supported ones.
Activation read_activation(const ConfigReader& r, bool gemma);

/// Multi-head latent attention's sizes (DeepseekV3ForCausalLM), all required: q_lora_rank may be
/// null (a direct q_proj, as DeepSeek-V2-Lite) but not absent. `cfg` is the object `r` reads
/// (model_config_fields.cpp). @throws ppb::UserError for a missing or non-positive size or an
/// odd qk_rope_head_dim.
MlaShape read_mla(const ConfigReader& r, const json& cfg);

/// The mixture-of-experts fields of a MoE family into m.layers (and DeepSeek-V3's MTP modules
/// into m.mtp_modules, m.mtp_shape); nothing for a dense family (model_config_moe.cpp).
/// Needs m.n_layers and m.layers filled with the dense shape.
/// @throws ppb::UserError for a missing or inconsistent expert or routing field.
void read_experts(const ConfigReader& r, Family fam, ModelSpec& m);

/// All weights of a layer of shape `s` with every routed expert counted, in double (the same
/// terms as layer_params, which could overflow int64 on an absurd config): the parser's
/// bound on the model's size (model_counts.cpp).
double layer_params_bound(const LayerShape& s);

}  // namespace ppb::model::detail
