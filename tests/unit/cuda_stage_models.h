// The small models of the CUDA stage tests (test_cuda_kernels.cpp, test_cuda_stage_ragged.cpp):
// hand-made dense layers (Llama, Qwen with bias and q/k norm, a Gemma-like with sandwich norms,
// softcaps and a sliding window) and the tiny configs of every MoE architecture (tests/data).
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.h"

namespace ppb_cuda_stage_test {

using ppb::model::Activation;
using ppb::model::LayerShape;
using ppb::model::ModelSpec;
using ppb::model::UnitKind;

inline LayerShape small_layer(int hidden = 64, int n_heads = 4, int n_kv = 2, int head_dim = 32) {
  LayerShape s;
  s.hidden = hidden;
  s.n_heads = n_heads;
  s.n_kv_heads = n_kv;
  s.head_dim = head_dim;
  s.intermediate = 128;
  s.rms_eps = 1e-5;
  s.attn_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  return s;
}

inline ModelSpec make_spec(const std::vector<LayerShape>& layers, int vocab = 300) {
  ModelSpec m;
  m.architecture = "Test";
  m.hidden = layers.at(0).hidden;
  m.n_layers = static_cast<int>(layers.size());
  m.vocab = vocab;
  m.rms_eps = 1e-5;
  m.layers = layers;
  m.units.push_back({"embed", UnitKind::embed, -1, 0});
  for (int i = 0; i < m.n_layers; ++i) m.units.push_back({"layer." + std::to_string(i), UnitKind::layer, i, 1});
  m.units.push_back({"head", UnitKind::head, -1, 2});
  return m;
}

inline std::vector<std::pair<std::string, ModelSpec>> stage_models() {
  std::vector<std::pair<std::string, ModelSpec>> ms;
  ms.emplace_back("llama", make_spec({small_layer(), small_layer()}));
  LayerShape q2 = small_layer();
  q2.attn_bias = true;
  LayerShape q3 = small_layer(64, 4, 2, 32);
  q3.qk_norm = true;
  ms.emplace_back("qwen_bias_qknorm", make_spec({q2, q3}));
  std::vector<LayerShape> g;
  for (int i = 0; i < 2; ++i) {
    LayerShape s = small_layer(64, 4, 1, 32);
    s.sandwich_norm = s.norm_plus_one = s.qk_norm = true;
    s.act = Activation::gelu_tanh;
    s.attn_softcap = i == 0 ? 20.0 : 0.0;
    if (i == 0) s.sliding_window = 5;
    g.push_back(s);
  }
  ModelSpec gm = make_spec(g);
  gm.tie_embeddings = gm.embed_scale_sqrt_hidden = gm.final_norm_plus_one = true;
  gm.final_softcap = 30.0;
  ms.emplace_back("gemma_like", gm);
  return ms;
}

/// The tiny config of every mixture-of-experts architecture (tests/data): Mixtral (softmax
/// router), Qwen3-MoE (softmax, norm_topk), DeepSeek-V3 (MLA, sigmoid group-limited router with
/// a correction bias, shared experts, dense-first layers) with its MTP module, gpt-oss (sinks,
/// biases, sliding and full attention, topk_softmax router, clamped SwiGLU).
inline std::vector<std::pair<std::string, ModelSpec>> moe_models() {
  std::vector<std::pair<std::string, ModelSpec>> ms;
  for (const char* name : {"tiny-mixtral", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-gpt-oss"})
    ms.emplace_back(name, ppb::model::load_model_config(std::string(PPB_SOURCE_DIR "/tests/data/") + name + ".json"));
  ModelSpec mtp = ms[2].second;
  ppb::model::enable_mtp(mtp);
  ms.emplace_back("tiny-deepseek-v3 --mtp", mtp);
  return ms;
}

}  // namespace ppb_cuda_stage_test
