// The mixture-of-experts fields of config.json (Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss):
// the experts' sizes, the router, which layers are MoE ones, DeepSeek-V3's MTP modules.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config_detail.h"

namespace ppb::model::detail {

namespace {

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


}  // namespace

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

}  // namespace ppb::model::detail
