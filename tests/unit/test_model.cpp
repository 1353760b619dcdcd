// Tests of src/model: config.json parsing, units and signatures, analytic counts.
//
// The parameter totals are the published Hugging Face counts of each model (the sum of the
// safetensors tensor sizes), not values derived from our own formula.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/error.h"
#include "common/roofline.h"
#include "common/transfer.h"
#include "model/model_spec.h"

namespace {

using namespace ppb::model;
using nlohmann::json;

std::string model_path(const std::string& file) { return std::string(PPB_MODELS_DIR) + "/" + file; }

std::string read_text(const std::string& file) {
  std::ifstream in(model_path(file), std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const std::string& file) { return json::parse(read_text(file)); }

ModelSpec load(const std::string& file) { return load_model_config(model_path(file)); }

/// The message of the UserError that `f` throws ("" and a test failure if none).
std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ppb::UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-UserError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

int count_windowed(const ModelSpec& m) {
  int n = 0;
  for (const auto& l : m.layers) n += l.sliding_window > 0;
  return n;
}

// ---- every dense config parses, with the published parameter counts ----------------------

struct ParamCase {
  const char* file;
  int64_t total;
};

/// gtest prints a parameter with PrintTo (else as a hex dump of its bytes): the config file.
void PrintTo(const ParamCase& c, std::ostream* os) { *os << c.file; }

/// A test name from the config file: "llama-3.1-8b.json" -> "llama_3_1_8b".
std::string param_case_name(const ::testing::TestParamInfo<ParamCase>& info) {
  std::string n = info.param.file;
  n = n.substr(0, n.rfind(".json"));
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class TotalParams : public ::testing::TestWithParam<ParamCase> {};

TEST_P(TotalParams, MatchesPublishedCount) {
  const ParamCase& c = GetParam();
  ModelSpec m = load(c.file);
  EXPECT_EQ(total_params(m), c.total) << c.file;
  EXPECT_EQ(m.num_units(), m.n_layers + 2);
  EXPECT_EQ(m.units.front().kind, UnitKind::embed);
  EXPECT_EQ(m.units.back().kind, UnitKind::head);
  EXPECT_EQ(m.config_json, read_text(c.file));
  EXPECT_EQ(m.source, model_path(c.file));
}

INSTANTIATE_TEST_SUITE_P(Models, TotalParams,
                         ::testing::Values(ParamCase{"llama-3.1-8b.json", 8'030'261'248},
                                           ParamCase{"llama-3.1-70b.json", 70'553'706'496},
                                           ParamCase{"tinyllama-1.1b-chat-v1.0.json", 1'100'048'384},
                                           ParamCase{"mistral-7b-v0.1.json", 7'241'732'096},
                                           ParamCase{"qwen3-0.6b.json", 596'049'920},
                                           ParamCase{"smollm-1.7b.json", 1'711'376'384},
                                           ParamCase{"gemma-3-1b-it.json", 999'885'952}),
                         param_case_name);

TEST(ModelConfigs, EveryInputParses) {
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(PPB_MODELS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    EXPECT_NO_THROW(load_model_config(entry.path().string())) << entry.path();
    ++parsed;
  }
  EXPECT_GE(parsed, 13);
}

// ---- mixture-of-experts and MLA: the published totals -------------------------------------
// Each figure below was derived by hand from the config's sizes (the derivation is in the
// comment) and agrees with the model card's rounded figure; the code computes it from the
// parsed shapes.

int64_t embedding_params(const ModelSpec& m) { return unit_params(m, 0); }

TEST(ModelConfigsMoe, MixtralTotalAndActive) {
  // Per layer: attention 4096*(4096 + 2*1024 + 4096) = 41,943,040; norms 8192; router 8*4096;
  // experts 8 * 3*4096*14336 = 1,409,286,144. 32 layers + embed + head (32000*4096 each) + norm:
  // 46,702,792,704 ("46.7B", Mistral AI). Active: 2 experts: 12,748,853,248; with the embedding
  // table 12,879,925,248 ("12.9B").
  ModelSpec m = load("mixtral-8x7b-v0.1.json");
  EXPECT_EQ(total_params(m), 46'702'792'704);
  EXPECT_EQ(active_params(m), 12'748'853'248);
  EXPECT_EQ(active_params(m) + embedding_params(m), 12'879'925'248);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer", "head"}));
  EXPECT_EQ(m.layers[0].moe.n_experts, 8);
  EXPECT_EQ(m.layers[0].moe.top_k, 2);
  EXPECT_EQ(m.layers[0].moe.expert_intermediate, 14336);
  EXPECT_EQ(m.layers[0].intermediate, 0);  // no shared experts
  EXPECT_TRUE(m.layers[0].moe.norm_topk);
}

TEST(ModelConfigsMoe, Qwen3MoeTotalAndActive) {
  // Per layer: attention 2048*4096*2 + 2*2048*512 + q/k norms 256 = 18,874,624; norms 4096;
  // router 128*2048; experts 128 * 3*2048*768 = 603,979,776 -> 623,120,640 x 48; embed and head
  // 151936*2048 each; norm 2048: 30,532,122,624 ("30.5B"; non-embedding 29.9B, Qwen3 card).
  // Active: 8 experts: 56,889,600 x 48 + head: 3,041,867,776; with the embedding table
  // 3,353,032,704 (the card's "3.3B activated").
  ModelSpec m = load("qwen3-30b-a3b.json");
  EXPECT_EQ(total_params(m), 30'532'122'624);
  EXPECT_EQ(total_params(m) - 2 * embedding_params(m), 29'909'792'768);  // embed and lm_head are equal
  EXPECT_EQ(active_params(m), 3'041'867'776);
  EXPECT_EQ(active_params(m) + embedding_params(m), 3'353'032'704);
  EXPECT_TRUE(m.layers[0].qk_norm);
  EXPECT_TRUE(m.layers[0].moe.norm_topk);
  EXPECT_EQ(m.layers[0].moe.expert_intermediate, 768);
  // mlp_only_layers and decoder_sparse_step make dense layers of intermediate_size.
  json j = read_json("qwen3-30b-a3b.json");
  j["mlp_only_layers"] = {0, 47};
  j["decoder_sparse_step"] = 2;
  m = parse_model_config(j.dump());
  EXPECT_FALSE(m.layers[0].is_moe());
  EXPECT_TRUE(m.layers[1].is_moe());
  EXPECT_FALSE(m.layers[2].is_moe());  // (2 + 1) % 2 != 0
  EXPECT_FALSE(m.layers[47].is_moe());
  EXPECT_EQ(m.layers[0].intermediate, 6144);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer.dense", "layer.moe", "head"}));
}

TEST(ModelConfigsMoe, MissingOrInconsistentRoutingFieldsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::function<void(json&)>>> qwen = {
      {"num_experts", [](json& j) { j.erase("num_experts"); }},
      {"moe_intermediate_size", [](json& j) { j.erase("moe_intermediate_size"); }},
      {"num_experts_per_tok", [](json& j) { j["num_experts_per_tok"] = 129; }},
      {"mlp_only_layers", [](json& j) { j["mlp_only_layers"] = {48}; }},
  };
  for (const auto& [field, edit] : qwen) {
    json j = read_json("qwen3-30b-a3b.json");
    edit(j);
    const std::string msg = user_error_of([&] { parse_model_config(j.dump(), "q.json"); });
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
  }
  const std::vector<std::pair<std::string, std::function<void(json&)>>> ds = {
      {"n_routed_experts", [](json& j) { j.erase("n_routed_experts"); }},
      {"kv_lora_rank", [](json& j) { j.erase("kv_lora_rank"); }},
      {"q_lora_rank", [](json& j) { j.erase("q_lora_rank"); }},
      {"n_group", [](json& j) { j["n_group"] = 7; }},
      {"topk_group", [](json& j) { j["topk_group"] = 9; }},
      {"scoring_func", [](json& j) { j["scoring_func"] = "softmax"; }},
      {"qk_rope_head_dim", [](json& j) { j["qk_rope_head_dim"] = 63; }},
  };
  for (const auto& [field, edit] : ds) {
    json j = read_json("deepseek-v3.json");
    edit(j);
    const std::string msg = user_error_of([&] { parse_model_config(j.dump(), "d.json"); });
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
  }
  json j = read_json("deepseek-v3.json");
  j["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite: a direct q_proj
  EXPECT_EQ(parse_model_config(j.dump()).layers[0].mla.q_lora_rank, 0);
}

TEST(ModelConfigsMoe, DeepSeekV3TotalActiveAndMtp) {
  // MLA per layer: q_a 7168*1536 + norm 1536 + q_b 1536*128*192 + kv_a 7168*576 + norm 512 +
  // kv_b 512*128*256 + o 128*128*7168 = 187,107,328. Dense layer (3): + norms 14,336 + MLP
  // 3*7168*18432 = 583,483,392. MoE layer (58): + norms + router 256*7168 + bias 256 + 256
  // routed and 1 shared expert of 3*7168*2048 = 11,507,286,272. Embed and head 129280*7168
  // each, norm 7168: 671,026,419,200 ("671B"). Active (8 routed + shared, no embedding):
  // 36,625,618,432 ("36.6B including the 0.9B output head"). MTP: 2 norms + eh_proj 2*7168^2 +
  // one MoE layer + norm = 11,610,068,224 (the README's "11.5B unique").
  ModelSpec m = load("deepseek-v3.json");
  EXPECT_EQ(total_params(m) - mtp_params(m), 671'026'419'200);
  EXPECT_EQ(active_params(m), 36'625'618'432);
  EXPECT_EQ(mtp_params(m), 11'610'068'224);
  EXPECT_EQ(m.mtp_modules, 1);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer.dense", "layer.moe", "head"}));
  EXPECT_FALSE(m.layers[2].is_moe());
  EXPECT_TRUE(m.layers[3].is_moe());
  const LayerShape& s = m.layers[3];
  EXPECT_TRUE(s.is_mla());
  EXPECT_EQ(s.head_dim, 192);
  EXPECT_EQ(s.moe.router, RouterKind::sigmoid_grouped);
  EXPECT_EQ(s.moe.n_group, 8);
  EXPECT_EQ(s.moe.topk_group, 4);
  EXPECT_DOUBLE_EQ(s.moe.routed_scaling, 2.5);
  EXPECT_EQ(s.intermediate, 2048);  // the shared expert
  // KV cache: the latent 512 + k_rope 64 per token and layer, not 2 * 128 heads * 192.
  EXPECT_EQ(kv_bytes_per_token(m, 4, 2), (512 + 64) * 2);
  // Softmax scale: 192^-0.5 * (0.1 * ln 40 + 1)^2.
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(s.attn_scale, mscale * mscale / std::sqrt(192.0), 1e-15);
  // An mscale_all_dim whose square overflows is refused by name (the fuzzer's input: 1.01e308).
  json j = read_json("deepseek-v3.json");
  j["rope_scaling"]["mscale_all_dim"] = 1.01e308;
  try {
    parse_model_config(j.dump());
    ADD_FAILURE() << "an infinite attention scale was accepted";
  } catch (const ppb::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_scaling.mscale_all_dim"), std::string::npos) << e.what();
  }
}

TEST(ModelConfigsMoe, KimiK2TotalAndActive) {
  // MLA with 64 heads: 101,124,096; 1 dense layer 497,500,160; 60 MoE layers of 384 routed + 1
  // shared expert, router 384*7168 + bias: 17,059,365,248; embed and head 163840*7168 each:
  // 1,026,408,232,448 ("1T"); active 31,687,095,808 ("32B").
  ModelSpec m = load("kimi-k2.json");
  EXPECT_EQ(total_params(m), 1'026'408'232'448);
  EXPECT_EQ(active_params(m), 31'687'095'808);
  EXPECT_EQ(m.mtp_modules, 0);
}

TEST(ModelConfigsMoe, GptOssTotalsAndActive) {
  // Attention per layer: q 2880*4096 + k, v 2880*512 + o 4096*2880, biases 4096+512+512+2880,
  // sinks 64 = 26,550,144. Experts of 2880*5760 + 5760 + 2880*2880 + 2880 = 24,891,840; router
  // E*2880 + E. Embed and head 201088*2880 each (1.16B). 120b: 116,829,156,672 ("116.83B"),
  // active 5,132,849,472 ("5.13B"); 20b: 20,914,757,184 ("20.91B"), active 3,608,307,264 ("3.61B").
  ModelSpec big = load("gpt-oss-120b.json");
  EXPECT_EQ(total_params(big), 116'829'156'672);
  EXPECT_EQ(active_params(big), 5'132'849'472);
  ModelSpec small = load("gpt-oss-20b.json");
  EXPECT_EQ(total_params(small), 20'914'757'184);
  EXPECT_EQ(active_params(small), 3'608'307'264);
  EXPECT_EQ(big.signatures, (std::vector<std::string>{"embed", "layer.local", "layer.global", "head"}));
  EXPECT_EQ(big.layers[0].sliding_window, 128);
  EXPECT_EQ(big.layers[1].sliding_window, 0);
  EXPECT_TRUE(big.layers[0].attn_sinks);
  EXPECT_EQ(big.layers[0].act, Activation::swiglu_clamped);
  EXPECT_DOUBLE_EQ(big.layers[0].swiglu_limit, 7.0);
  EXPECT_EQ(big.layers[0].moe.router, RouterKind::topk_softmax);
}

TEST(ModelConfigsMoe, DecodeReadsOnlyTheExpertsItsTokensReach) {
  ModelSpec m = load("qwen3-30b-a3b.json");
  const LayerShape& s = m.layers[0];
  // One token reaches exactly top_k experts; many tokens approach all of them.
  EXPECT_NEAR(expected_distinct_experts(s, 1), 8.0, 1e-9);
  EXPECT_NEAR(expected_distinct_experts(s, 2), 128.0 * (1.0 - std::pow(120.0 / 128.0, 2)), 1e-9);
  EXPECT_GT(expected_distinct_experts(s, 4096), 127.99);
  const double expert_bytes = 3.0 * 2048 * 768 * 2;
  const double one = unit_bytes_moved(m, 1, Phase::decode, 1, 1, 100, 2);
  const double four = unit_bytes_moved(m, 1, Phase::decode, 4, 1, 100, 2);
  const double more_experts = expected_distinct_experts(s, 4) - expected_distinct_experts(s, 1);
  // Three more sequences: KV rows of 2 * 4 heads * 128 * 2 bytes read (100 positions) and written,
  // and the [B, hidden] activation read and written.
  const double kv_row = 2 * 4 * 128 * 2;
  const double kv_act_delta = 3 * 100 * kv_row + 3 * kv_row + 2 * 3 * 2048 * 2;
  EXPECT_NEAR(four - one, more_experts * expert_bytes + kv_act_delta, 1.0);
  // FLOPs: 2 * active matmul weights per token.
  const double flops = unit_flops(m, 1, Phase::decode, 1, 1, 1);
  EXPECT_NEAR(flops, 2.0 * (18'874'368 + 128 * 2048 + 8 * 3.0 * 2048 * 768) + 4.0 * 32 * 128, 1.0);
}

// ---- units and signatures ----------------------------------------------------------------

TEST(ModelSpecLlama, ThreeSignaturesAndUnitNames) {
  ModelSpec m = load("llama-3.1-8b.json");
  EXPECT_EQ(m.architecture, "LlamaForCausalLM");
  EXPECT_EQ(m.model_type, "llama");
  ASSERT_EQ(m.num_units(), 34);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer", "head"}));
  EXPECT_EQ(m.signature_example, (std::vector<int>{0, 1, 33}));
  EXPECT_EQ(m.units[0].name, "embed");
  EXPECT_EQ(m.units[1].name, "layer.0");
  EXPECT_EQ(m.units[32].name, "layer.31");
  EXPECT_EQ(m.units[32].layer, 31);
  EXPECT_EQ(m.units[33].name, "head");
  EXPECT_EQ(m.units[0].signature, 0);
  for (int u = 1; u <= 32; ++u) EXPECT_EQ(m.units[u].signature, 1);
  EXPECT_EQ(m.units[33].signature, 2);

  const LayerShape& s = m.layer_of(1);
  EXPECT_EQ(s.hidden, 4096);
  EXPECT_EQ(s.n_heads, 32);
  EXPECT_EQ(s.n_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.intermediate, 14336);
  EXPECT_EQ(s.sliding_window, 0);
  EXPECT_FALSE(s.attn_bias);
  EXPECT_FALSE(s.qk_norm);
  EXPECT_FALSE(s.sandwich_norm);
  EXPECT_EQ(s.act, Activation::silu);
  EXPECT_DOUBLE_EQ(s.rms_eps, 1e-5);
  EXPECT_DOUBLE_EQ(s.attn_scale, 1.0 / std::sqrt(128.0));
  EXPECT_DOUBLE_EQ(s.rope.theta, 500000.0);
  EXPECT_EQ(s.rope.scaling_type, "llama3");
  EXPECT_DOUBLE_EQ(s.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(s.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(s.rope.high_freq_factor, 4.0);
  EXPECT_EQ(s.rope.original_max_position, 8192);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_FALSE(m.embed_scale_sqrt_hidden);

  // Per-unit counts (DESIGN.md §6: lm_head 525 M vs 218 M per layer).
  EXPECT_EQ(unit_params(m, 0), 525'336'576);
  EXPECT_EQ(unit_params(m, 1), 218'112'000);
  EXPECT_EQ(unit_params(m, 33), 525'336'576 + 4096);
  EXPECT_EQ(unit_resident_params(m, 33), 525'336'576 + 4096);
}

TEST(ModelSpecLlama, LayerOfANonLayerUnitThrows) {
  ModelSpec m = load("llama-3.1-8b.json");
  EXPECT_THROW(m.layer_of(0), ppb::InternalError);
  EXPECT_THROW(m.layer_of(33), ppb::InternalError);
  EXPECT_THROW(m.layer_of(34), ppb::InternalError);
  EXPECT_THROW(unit_params(m, -1), ppb::InternalError);
}

TEST(ModelSpecGemma3, LocalAndGlobalLayers) {
  ModelSpec m = load("gemma-3-1b-it.json");
  EXPECT_EQ(m.model_type, "gemma3_text");
  ASSERT_EQ(m.n_layers, 26);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer.local", "layer.global", "head"}));
  EXPECT_EQ(m.signature_example, (std::vector<int>{0, 1, 6, 27}));  // layer.5 is the first global
  int local = 0, global = 0;
  for (int i = 0; i < m.n_layers; ++i) {
    const LayerShape& s = m.layers[i];
    bool is_global = (i + 1) % 6 == 0;  // layers 5, 11, 17, 23
    EXPECT_EQ(s.sliding_window, is_global ? 0 : 512) << "layer " << i;
    EXPECT_EQ(m.units[1 + i].signature, is_global ? 2 : 1) << "layer " << i;
    EXPECT_DOUBLE_EQ(s.rope.theta, is_global ? 1e6 : 1e4) << "layer " << i;
    EXPECT_EQ(s.rope.scaling_type, "");
    (is_global ? global : local)++;
  }
  EXPECT_EQ(local, 22);
  EXPECT_EQ(global, 4);

  const LayerShape& s = m.layers[0];
  EXPECT_EQ(s.head_dim, 256);
  EXPECT_EQ(s.n_heads, 4);
  EXPECT_EQ(s.n_kv_heads, 1);
  EXPECT_TRUE(s.qk_norm);
  EXPECT_TRUE(s.sandwich_norm);
  EXPECT_TRUE(s.norm_plus_one);
  EXPECT_EQ(s.act, Activation::gelu_tanh);
  EXPECT_DOUBLE_EQ(s.attn_scale, 1.0 / 16.0);  // query_pre_attn_scalar 256
  EXPECT_DOUBLE_EQ(s.attn_softcap, 0.0);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_TRUE(m.embed_scale_sqrt_hidden);
  EXPECT_TRUE(m.final_norm_plus_one);
  EXPECT_DOUBLE_EQ(m.final_softcap, 0.0);
  // Tied: the head owns only the final norm, but its stage still holds the [vocab, hidden] table.
  EXPECT_EQ(unit_params(m, 27), 1152);
  EXPECT_EQ(unit_resident_params(m, 27), 1152 + int64_t{262144} * 1152);
}

TEST(ModelSpecGemma3, LayerTypesListOverridesThePattern) {
  json j = read_json("gemma-3-1b-it.json");
  j["num_hidden_layers"] = 4;
  j["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention", "full_attention"};
  ModelSpec m = parse_model_config(j.dump());
  EXPECT_EQ(m.layers[0].sliding_window, 0);
  EXPECT_EQ(m.layers[1].sliding_window, 512);
  EXPECT_EQ(m.layers[2].sliding_window, 512);
  EXPECT_EQ(m.layers[3].sliding_window, 0);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer.global", "layer.local", "head"}));
}

TEST(ModelSpecGemma3, ConditionalGenerationReadsTextConfigWithDefaults) {
  // gemma-3-4b-it's config.json lists only the text fields that differ from Gemma3TextConfig.
  json j = {{"architectures", {"Gemma3ForConditionalGeneration"}},
            {"model_type", "gemma3"},
            {"text_config",
             {{"hidden_size", 2560},
              {"intermediate_size", 10240},
              {"model_type", "gemma3_text"},
              {"num_hidden_layers", 34},
              {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
              {"sliding_window", 1024}}},
            {"vision_config", {{"hidden_size", 1152}}}};
  ModelSpec m = parse_model_config(j.dump(), "gemma-3-4b-it");
  EXPECT_EQ(m.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(m.model_type, "gemma3_text");
  EXPECT_EQ(m.vocab, 262208);
  EXPECT_TRUE(m.tie_embeddings);
  const LayerShape& local = m.layers[0];
  const LayerShape& global = m.layers[5];
  EXPECT_EQ(local.n_heads, 8);
  EXPECT_EQ(local.n_kv_heads, 4);
  EXPECT_EQ(local.head_dim, 256);
  EXPECT_EQ(local.sliding_window, 1024);
  EXPECT_EQ(local.rope.scaling_type, "");
  EXPECT_EQ(global.sliding_window, 0);
  EXPECT_EQ(global.rope.scaling_type, "linear");
  EXPECT_DOUBLE_EQ(global.rope.factor, 8.0);
  // Text decoder only: 34 * 94,382,592 + 262,208 * 2,560 + 2,560 (vision tower not counted).
  EXPECT_EQ(total_params(m), 3'880'263'168);

  json bad = j;
  bad["text_config"]["num_attention_heads"] = "eight";
  std::string msg = user_error_of([&] { parse_model_config(bad.dump(), "x"); });
  EXPECT_NE(msg.find("text_config.num_attention_heads"), std::string::npos) << msg;
  json missing = j;
  missing.erase("text_config");
  msg = user_error_of([&] { parse_model_config(missing.dump(), "x"); });
  EXPECT_NE(msg.find("text_config"), std::string::npos) << msg;
}

TEST(ModelSpecMistral, WindowOnEveryLayer) {
  ModelSpec m = load("mistral-7b-v0.1.json");
  EXPECT_EQ(count_windowed(m), 32);
  for (const auto& l : m.layers) EXPECT_EQ(l.sliding_window, 4096);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer", "head"}));
  // A sliding-window layer keeps at most `window` positions.
  EXPECT_EQ(kv_cache_bytes(m, 1, 1, 8192, 2), int64_t{4096} * 4096);
  EXPECT_EQ(kv_cache_bytes(m, 1, 2, 1000, 2), int64_t{2} * 1000 * 4096);
  // Prefill of 8192 tokens: token at position p attends min(4096, p + 1) keys.
  double attended = 4096.0 * 4097.0 / 2.0 + 4096.0 * 4096.0;
  double expected = 2.0 * (unit_params(m, 1) - 2 * 4096) * 8192 + 4.0 * 32 * 128 * attended;
  EXPECT_DOUBLE_EQ(unit_flops(m, 1, Phase::prefill, 1, 8192, 8192), expected);
}

TEST(ModelSpecQwen3, QkNormExplicitHeadDimTied) {
  ModelSpec m = load("qwen3-0.6b.json");
  const LayerShape& s = m.layer_of(1);
  EXPECT_TRUE(s.qk_norm);
  EXPECT_EQ(s.head_dim, 128);  // != 1024 / 16
  EXPECT_FALSE(s.attn_bias);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(count_windowed(m), 0);  // use_sliding_window false
  EXPECT_DOUBLE_EQ(s.rope.theta, 1e6);  // an integer in the file
  EXPECT_EQ(s.rope.scaling_type, "");
  EXPECT_EQ(unit_params(m, m.num_units() - 1), 1024);
}

TEST(ModelSpecQwen2, BiasAlwaysAndWindowFromMaxWindowLayers) {
  json j = read_json("qwen3-0.6b.json");
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  j.erase("head_dim");
  j["num_hidden_layers"] = 4;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 2;
  ModelSpec m = parse_model_config(j.dump());
  EXPECT_TRUE(m.layers[0].attn_bias);
  EXPECT_FALSE(m.layers[0].qk_norm);
  EXPECT_EQ(m.layers[0].head_dim, 64);
  EXPECT_EQ(m.layers[0].sliding_window, 0);
  EXPECT_EQ(m.layers[1].sliding_window, 0);
  EXPECT_EQ(m.layers[2].sliding_window, 4096);
  EXPECT_EQ(m.layers[3].sliding_window, 4096);
  EXPECT_EQ(m.signatures, (std::vector<std::string>{"embed", "layer.global", "layer.local", "head"}));
  EXPECT_EQ(m.signature_example, (std::vector<int>{0, 1, 3, 5}));
  // q/k/v biases: 16*64 + 2*8*64.
  int64_t h = 1024, q = 1024, kv = 512;
  EXPECT_EQ(unit_params(m, 1), h * q + 2 * h * kv + q * h + 3 * h * 3072 + q + 2 * kv + 2 * h);
}

TEST(ModelSpecGemma2, EvenLayersLocalAndSoftcaps) {
  json j = {{"architectures", {"Gemma2ForCausalLM"}}, {"model_type", "gemma2"},
            {"hidden_size", 2304}, {"intermediate_size", 9216}, {"num_hidden_layers", 4},
            {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 256},
            {"vocab_size", 256000}, {"hidden_act", "gelu_pytorch_tanh"},
            {"hidden_activation", "gelu_pytorch_tanh"}, {"query_pre_attn_scalar", 256},
            {"sliding_window", 4096}, {"attn_logit_softcapping", 50.0},
            {"final_logit_softcapping", 30.0}, {"rope_theta", 10000.0}};
  ModelSpec m = parse_model_config(j.dump());
  EXPECT_EQ(m.layers[0].sliding_window, 4096);
  EXPECT_EQ(m.layers[1].sliding_window, 0);
  EXPECT_EQ(m.layers[2].sliding_window, 4096);
  EXPECT_EQ(m.layers[3].sliding_window, 0);
  EXPECT_DOUBLE_EQ(m.layers[0].attn_softcap, 50.0);
  EXPECT_DOUBLE_EQ(m.final_softcap, 30.0);
  EXPECT_FALSE(m.layers[0].qk_norm);
  EXPECT_TRUE(m.layers[0].sandwich_norm);
  EXPECT_TRUE(m.tie_embeddings);  // Gemma default when the key is absent
  EXPECT_DOUBLE_EQ(m.layers[1].rope.theta, m.layers[0].rope.theta);  // one rope for all layers

  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  m = parse_model_config(j.dump());
  EXPECT_DOUBLE_EQ(m.layers[0].attn_softcap, 0.0);
  EXPECT_DOUBLE_EQ(m.final_softcap, 0.0);
}

TEST(ModelSpecPhi3, WindowOnAllLayersAndLongropeIsUnscaled) {
  json j = {{"architectures", {"Phi3ForCausalLM"}}, {"model_type", "phi3"},
            {"hidden_size", 3072}, {"intermediate_size", 8192}, {"num_hidden_layers", 32},
            {"num_attention_heads", 32}, {"num_key_value_heads", 32}, {"vocab_size", 32064},
            {"hidden_act", "silu"}, {"rms_norm_eps", 1e-5}, {"sliding_window", 2047},
            {"rope_theta", 10000.0},
            {"rope_scaling", {{"type", "longrope"}, {"long_factor", {1.0}}, {"short_factor", {1.0}}}},
            {"tie_word_embeddings", false}};
  ModelSpec m = parse_model_config(j.dump());
  EXPECT_EQ(count_windowed(m), 32);
  EXPECT_EQ(m.layers[0].sliding_window, 2047);
  EXPECT_EQ(m.layers[0].rope.scaling_type, "");
  EXPECT_DOUBLE_EQ(m.rms_eps, 1e-5);
  // Phi-3-mini: 3,821,079,552 parameters (published count).
  EXPECT_EQ(total_params(m), 3'821'079'552);
}

TEST(ModelSpecLlama, LinearRopeScalingAndTypeKey) {
  json j = read_json("tinyllama-1.1b-chat-v1.0.json");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4}};
  ModelSpec m = parse_model_config(j.dump());
  EXPECT_EQ(m.layers[0].rope.scaling_type, "linear");
  EXPECT_DOUBLE_EQ(m.layers[0].rope.factor, 4.0);
}

TEST(ModelSpecLlama, ArchitectureFromModelTypeWhenMissing) {
  json j = read_json("llama-3.1-8b.json");
  j.erase("architectures");
  ModelSpec m = parse_model_config(j.dump());
  EXPECT_EQ(m.architecture, "LlamaForCausalLM");
  EXPECT_EQ(total_params(m), 8'030'261'248);

  j["model_type"] = "falcon";
  std::string msg = user_error_of([&] { parse_model_config(j.dump()); });
  EXPECT_NE(msg.find("falcon"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supported"), std::string::npos) << msg;
  j.erase("model_type");
  msg = user_error_of([&] { parse_model_config(j.dump()); });
  EXPECT_NE(msg.find("architectures"), std::string::npos) << msg;
}

TEST(ModelSpecLlama, MissingKvHeadsMeansMha) {
  json j = read_json("llama-3.1-8b.json");
  j.erase("num_key_value_heads");
  ModelSpec m = parse_model_config(j.dump());
  EXPECT_EQ(m.layers[0].n_kv_heads, 32);
}

// ---- unsupported architectures -----------------------------------------------------------

TEST(ModelConfigs, UnsupportedArchitectureListsTheSupportedOnes) {
  json j = read_json("mixtral-8x7b-v0.1.json");
  j["architectures"] = {"DbrxForCausalLM"};
  std::string msg = user_error_of([&] { parse_model_config(j.dump(), "dbrx.json"); });
  EXPECT_NE(msg.find("'DbrxForCausalLM'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dbrx.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MixtralForCausalLM"), std::string::npos) << msg;  // lists what is supported
  EXPECT_NE(msg.find("GptOssForCausalLM"), std::string::npos) << msg;
  EXPECT_EQ(supported_architectures().size(), 12u);
}

// ---- bad input: each throws a UserError naming the field ----------------------------------

struct BadCase {
  const char* name;
  std::function<std::string()> text;  ///< the config text to parse
  std::vector<std::string> expect;    ///< substrings of the message
};

std::string llama_with(const std::function<void(json&)>& edit) {
  json j = read_json("llama-3.1-8b.json");
  edit(j);
  return j.dump(2);
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, ThrowsUserErrorNamingTheField) {
  const BadCase& c = GetParam();
  std::string msg = user_error_of([&] { parse_model_config(c.text(), "bad.json"); });
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  for (const auto& e : c.expect) EXPECT_NE(msg.find(e), std::string::npos) << "'" << e << "' not in: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadInput,
    ::testing::Values(
        BadCase{"malformed_json",
                [] { return std::string("{\n  \"hidden_size\": 4096,\n  oops: 1\n}\n"); },
                {"malformed JSON", "line 3"}},
        BadCase{"truncated_json", [] { return std::string("{\n  \"hidden_size\": 40"); },
                {"malformed JSON", "line 2"}},
        BadCase{"missing_hidden_size", [] { return llama_with([](json& j) { j.erase("hidden_size"); }); },
                {"hidden_size", "missing"}},
        BadCase{"zero_hidden_size", [] { return llama_with([](json& j) { j["hidden_size"] = 0; }); },
                {"hidden_size must be a positive integer, got 0"}},
        BadCase{"negative_hidden_size", [] { return llama_with([](json& j) { j["hidden_size"] = -3; }); },
                {"hidden_size must be a positive integer, got -3"}},
        BadCase{"string_hidden_size", [] { return llama_with([](json& j) { j["hidden_size"] = "4096"; }); },
                {"hidden_size", "\"4096\""}},
        BadCase{"fractional_layers",
                [] { return llama_with([](json& j) { j["num_hidden_layers"] = 32.5; }); },
                {"num_hidden_layers"}},
        BadCase{"null_vocab", [] { return llama_with([](json& j) { j["vocab_size"] = nullptr; }); },
                {"vocab_size"}},
        BadCase{"kv_heads_not_dividing",
                [] { return llama_with([](json& j) { j["num_key_value_heads"] = 5; }); },
                {"num_key_value_heads", "must divide num_attention_heads"}},
        BadCase{"hidden_not_divisible_by_heads",
                [] { return llama_with([](json& j) { j["hidden_size"] = 4100; }); },
                {"hidden_size", "num_attention_heads", "head_dim"}},
        BadCase{"unknown_activation", [] { return llama_with([](json& j) { j["hidden_act"] = "relu"; }); },
                {"hidden_act", "relu"}},
        BadCase{"bad_tie_flag",
                [] { return llama_with([](json& j) { j["tie_word_embeddings"] = "yes"; }); },
                {"tie_word_embeddings"}},
        BadCase{"bad_rope_factor",
                [] { return llama_with([](json& j) { j["rope_scaling"]["factor"] = "eight"; }); },
                {"rope_scaling.factor"}},
        BadCase{"negative_rope_theta",
                [] { return llama_with([](json& j) { j["rope_theta"] = -1.0; }); },
                {"rope_theta"}},
        BadCase{"top_level_array", [] { return std::string("[1, 2]"); }, {"JSON object"}},
        BadCase{"gemma_layer_types_wrong_length",
                [] {
                  json j = read_json("gemma-3-1b-it.json");
                  j["layer_types"] = {"full_attention"};
                  return j.dump();
                },
                {"layer_types", "26"}},
        BadCase{"gemma_bad_window",
                [] {
                  json j = read_json("gemma-3-1b-it.json");
                  j["sliding_window"] = -512;
                  return j.dump();
                },
                {"sliding_window"}},
        // Inputs that crashed the fuzz harness (tests/fuzz; each is a seed in tests/fuzz/corpus).
        BadCase{"number_beyond_double",  // was an uncaught json out_of_range.406
                [] { return std::string(R"({"architectures": [["LlamaForCausalLM"]], "hidden_size": 1e400})"); },
                {"malformed JSON", "1e400"}},
        BadCase{"absurd_layer_count",  // was a 2e9-element allocation (std::bad_alloc)
                [] { return llama_with([](json& j) { j["num_hidden_layers"] = 2000000000; }); },
                {"num_hidden_layers", "at most 16384", "2000000000"}},
        BadCase{"absurd_hidden_size",  // was a signed int64 overflow in the parameter count
                [] {
                  return std::string(R"({"model_type":"llama","hidden_size":2147483647,"num_hidden_layers":1,)"
                                     R"("num_attention_heads":1,"intermediate_size":2147483647,"vocab_size":1})");
                },
                {"hidden_size", "at most 16777216"}},
        BadCase{"parameter_count_beyond_1e15",  // every size in range, their product is not
                [] {
                  return llama_with([](json& j) {
                    j["hidden_size"] = 1 << 24;
                    j["intermediate_size"] = 1 << 24;
                    j["num_attention_heads"] = 1;
                    j["num_key_value_heads"] = 1;
                    j["num_hidden_layers"] = 16384;
                  });
                },
                {"parameters", "absurd"}},
        BadCase{"rope_original_max_position_beyond_int",  // was a float-to-int cast overflow (UB)
                [] {
                  return llama_with(
                      [](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 1e300; });
                },
                {"rope_scaling.original_max_position_embeddings", "at most"}}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

// Found while writing the fuzz harness: a long value shown in a message was cut inside a UTF-8
// character, so the message (which may end up in a results file) was not valid UTF-8.
TEST(BadInput, LongValueInMessageIsCutOnACharacterBoundary) {
  std::string text = R"({"model_type":"llama","hidden_size":")" + std::string(55, 'a') + "\u00e9\u00e9\u00e9\u00e9\"}";
  std::string msg = user_error_of([&] { parse_model_config(text, "x.json"); });
  EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
  EXPECT_NO_THROW(json(msg).dump()) << msg;  // dump() throws on invalid UTF-8
}

TEST(BadInput, MalformedJsonReportsLineAndColumn) {
  std::string msg = user_error_of([] { parse_model_config("{\n  \"a\": 1,\n  \"b\": tru\n}", "x.json"); });
  EXPECT_NE(msg.find("x.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 3, column"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << msg;
}

TEST(BadInput, UnreadablePath) {
  std::string path = "/nonexistent/ppbench/config.json";
  std::string msg = user_error_of([&] { load_model_config(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  msg = user_error_of([] { load_model_config(PPB_MODELS_DIR); });
  EXPECT_NE(msg.find("directory"), std::string::npos) << msg;
}

// ---- analytic counts ---------------------------------------------------------------------

TEST(Counts, KvBytesPerToken) {
  ModelSpec m = load("llama-3.1-8b.json");
  EXPECT_EQ(kv_bytes_per_token(m, 1, 2), 2 * 8 * 128 * 2);  // 4096
  EXPECT_EQ(kv_bytes_per_token(m, 0, 2), 0);
  EXPECT_EQ(kv_bytes_per_token(m, 33, 2), 0);
  EXPECT_EQ(kv_cache_bytes(m, 1, 4, 1000, 2), int64_t{4} * 1000 * 4096);
  EXPECT_EQ(kv_cache_bytes(m, 0, 4, 1000, 2), 0);
  // Whole model at 128k context, one sequence: 32 layers * 128k * 4 KiB = 16 GiB.
  int64_t total = 0;
  for (int u = 0; u < m.num_units(); ++u) total += kv_cache_bytes(m, u, 1, 131072, 2);
  EXPECT_EQ(total, int64_t{16} << 30);
}

TEST(Counts, LayerFlopsDecode) {
  ModelSpec m = load("llama-3.1-8b.json");
  double f = unit_flops(m, 1, Phase::decode, 1, 1, 1);
  EXPECT_NEAR(f, 2.0 * 218'112'000, 0.01 * 2.0 * 218'112'000);
  // Exactly: matmul weights (params minus the two RMSNorm vectors) + one attended position.
  EXPECT_DOUBLE_EQ(f, 2.0 * (218'112'000 - 2 * 4096) + 4.0 * 32 * 128 * 1);
  // Batch and context scale as expected: attention 4 * n_heads * head_dim per cached position.
  EXPECT_DOUBLE_EQ(unit_flops(m, 1, Phase::decode, 8, 1, 1000),
                   8 * (2.0 * (218'112'000 - 2 * 4096) + 4.0 * 32 * 128 * 1000));
  // Prefill of P tokens: causal, token p attends p + 1 positions.
  double p = 512;
  EXPECT_DOUBLE_EQ(unit_flops(m, 1, Phase::prefill, 2, 512, 512),
                   2 * (2.0 * (218'112'000 - 2 * 4096) * p + 4.0 * 32 * 128 * p * (p + 1) / 2));
}

TEST(Counts, HeadAndEmbedFlops) {
  ModelSpec m = load("llama-3.1-8b.json");
  const double vh = 128256.0 * 4096.0;
  EXPECT_DOUBLE_EQ(unit_flops(m, 0, Phase::prefill, 4, 512, 512), 0.0);
  EXPECT_DOUBLE_EQ(unit_flops(m, 33, Phase::prefill, 4, 512, 512), 4 * 2 * vh);  // last token only
  EXPECT_DOUBLE_EQ(unit_flops(m, 33, Phase::decode, 4, 1, 600), 4 * 2 * vh);
  EXPECT_DOUBLE_EQ(unit_flops(m, 33, Phase::decode, 4, 2, 600), 8 * 2 * vh);
  EXPECT_THROW(unit_flops(m, 1, Phase::decode, 1, 2, 1), ppb::InternalError);  // context < tokens
}

TEST(Counts, BytesMoved) {
  ModelSpec m = load("llama-3.1-8b.json");
  // Decode, batch 4, 1000 cached positions, bf16: weights + 4 * 1000 * 4096 bytes of KV read,
  // 4 new KV rows of 4096 bytes written, the [4, 1, 4096] activation read and written.
  EXPECT_DOUBLE_EQ(unit_bytes_moved(m, 1, Phase::decode, 4, 1, 1000, 2),
                   218'112'000.0 * 2 + 4.0 * 1000 * 4096 + 4.0 * 4096 + 2 * 4.0 * 4096 * 2);
  // Head: weight (with its norm), 4 normed rows read, 4 x vocab fp32 logits written.
  EXPECT_DOUBLE_EQ(unit_bytes_moved(m, 33, Phase::decode, 4, 1, 1000, 2),
                   (525'336'576.0 + 4096) * 2 + 4.0 * 4096 * 2 + 4.0 * 128256 * 4);
  // Prefill of 512 tokens: logits of the last token of each sequence only.
  EXPECT_DOUBLE_EQ(unit_bytes_moved(m, 33, Phase::prefill, 4, 512, 512, 2),
                   (525'336'576.0 + 4096) * 2 + 4.0 * 4096 * 2 + 4.0 * 128256 * 4);
  // Embed: 4 table rows gathered, the activation written.
  EXPECT_DOUBLE_EQ(unit_bytes_moved(m, 0, Phase::decode, 4, 1, 1000, 2), 2 * 4.0 * 4096 * 2);

  ModelSpec g = load("gemma-3-1b-it.json");
  // A local layer (window 512) reads at most window + tokens - 1 positions per sequence.
  const double act = 2.0 * 1152 * 2;  // one token's activation in and out, bf16
  const double kv_row = 2.0 * 256 * 2;
  double w = static_cast<double>(unit_resident_params(g, 1)) * 2;
  EXPECT_DOUBLE_EQ(unit_bytes_moved(g, 1, Phase::decode, 1, 1, 4000, 2), w + 512.0 * kv_row + kv_row + act);
  EXPECT_DOUBLE_EQ(unit_bytes_moved(g, 6, Phase::decode, 1, 1, 4000, 2),
                   static_cast<double>(unit_resident_params(g, 6)) * 2 + 4000.0 * kv_row + kv_row + act);
}

TEST(Counts, UnitWorkAveragesDecodeOverContexts) {
  ModelSpec m = load("llama-3.1-8b.json");
  const std::vector<int> contexts{100, 200, 600};
  const ppb::model::UnitWork w = ppb::model::unit_work(m, 1, 4, 100, contexts, 2);
  EXPECT_DOUBLE_EQ(w.prefill_flops, unit_flops(m, 1, Phase::prefill, 4, 100, 100));
  EXPECT_DOUBLE_EQ(w.prefill_bytes, unit_bytes_moved(m, 1, Phase::prefill, 4, 100, 100, 2));
  // The profiler times decode at position c, attending c + 1 positions; the mean is linear in
  // c here, so it equals the value at the mean position 300.
  EXPECT_DOUBLE_EQ(w.decode_flops, unit_flops(m, 1, Phase::decode, 4, 1, 301));
  EXPECT_DOUBLE_EQ(w.decode_bytes, unit_bytes_moved(m, 1, Phase::decode, 4, 1, 301, 2));
  EXPECT_THROW(ppb::model::unit_work(m, 1, 4, 100, {}, 2), ppb::InternalError);
}

TEST(Roofline, FloorIsTheLongerOfBytesAndFlops) {
  // 1 GB at 10 GB/s = 100 ms; 1 GFLOP at 100 GFLOP/s = 10 ms: memory-bound.
  EXPECT_DOUBLE_EQ(ppb::roofline_floor_ms(1e9, 1e9, 10.0, 100.0), 100.0);
  // 100 GFLOP at 100 GFLOP/s = 1000 ms: compute-bound.
  EXPECT_DOUBLE_EQ(ppb::roofline_floor_ms(100e9, 1e9, 10.0, 100.0), 1000.0);
  EXPECT_TRUE(std::isnan(ppb::roofline_floor_ms(1e9, 1e9, std::nan(""), 100.0)));  // not measured
  EXPECT_TRUE(std::isnan(ppb::roofline_floor_ms(1e9, 1e9, 10.0, 0.0)));
}

TEST(Counts, BoundaryBytes) {
  // What a stage boundary carries (common/transfer.h) with the model's hidden size: hidden
  // states after any unit but the head, int32 token ids after the head.
  ModelSpec m = load("llama-3.1-8b.json");
  EXPECT_EQ(ppb::boundary_message_bytes(false, 4, 512, m.hidden, 2), 4.0 * 512 * 4096 * 2);
  EXPECT_EQ(ppb::boundary_message_bytes(false, 4, 1, m.hidden, 2), 4.0 * 4096 * 2);
  EXPECT_EQ(ppb::boundary_message_bytes(true, 4, 1, m.hidden, 2), 16.0);
}

TEST(Counts, GemmaLocalLayerFlopsUseTheWindow) {
  ModelSpec g = load("gemma-3-1b-it.json");
  // Decode at context 4000: a local layer attends 512 positions, a global one 4000.
  double matmul = 2.0 * (unit_params(g, 1) - 4 * 1152 - 2 * 256);
  EXPECT_DOUBLE_EQ(unit_flops(g, 1, Phase::decode, 1, 1, 4000), matmul + 4.0 * 4 * 256 * 512);
  EXPECT_DOUBLE_EQ(unit_flops(g, 6, Phase::decode, 1, 1, 4000), matmul + 4.0 * 4 * 256 * 4000);
}

}  // namespace
