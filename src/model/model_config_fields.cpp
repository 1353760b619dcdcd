// The parts of a config.json every family may carry: RoPE and its scaling, an explicit
// layer_types list, the MLP's activation, multi-head latent attention's sizes (model_spec.cpp
// reads the rest; field meanings and defaults follow the transformers configuration classes).
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "model/config_detail.h"

namespace ppb::model::detail {

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) {
    size_t n = 57;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // keep UTF-8 whole
    s = s.substr(0, n) + "...";
  }
  return s;
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

}  // namespace ppb::model::detail
