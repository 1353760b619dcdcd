#include "backend/cuda/cuda_stage.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_lane.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/cuda/cuda_stage_plan.h"
#include "backend/decode_graphs.h"
#include "backend/tensor_parallel.h"
#include "backend/weights.h"
#include "common/error.h"
#include "model/model_spec.h"

namespace ppb {
namespace cuda {
namespace {

using model::LayerShape;
using model::UnitKind;

// Decode graphs a stage keeps (groups x context buckets; backend/decode_graphs.h): beyond it,
// decode runs eagerly. 64 groups x 11 buckets (64 .. 65536 keys) fit.
constexpr size_t kMaxDecodeGraphs = 1024;

/// "1.23 GiB", for messages.
std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

/// Device pointers of one decoder layer's weights and caches; null where the layer has no such
/// tensor.
struct LayerWeights {
  StagePlan::Layer plan;
  void* qkv = nullptr;       // [nq + 2 nkv, H]: q_proj | k_proj | v_proj
  void* o = nullptr;         // [H, nq] (MLA: [H, n_heads v])
  void* gate_up = nullptr;   // [2 I, H]: gate_proj | up_proj (a MoE layer's shared experts)
  void* down = nullptr;      // [H, I]
  void* bias = nullptr;      // [nq + 2 nkv] or null
  void* o_bias = nullptr;    // [H] (gpt-oss)
  float* sinks = nullptr;    // [n_heads] fp32 (gpt-oss)
  void* input_norm = nullptr;
  void* post_attention_norm = nullptr;
  void* pre_feedforward_norm = nullptr;
  void* post_feedforward_norm = nullptr;
  void* q_norm = nullptr;
  void* k_norm = nullptr;
  // Multi-head latent attention; q_b is Tensor::q_proj [n_heads (nope + R), H] when q_lora_rank is 0.
  void* q_a = nullptr;        // [q_lora, H]
  void* q_a_norm = nullptr;   // [q_lora]
  void* q_b = nullptr;        // [n_heads (nope + R), q_lora]
  void* kv_a = nullptr;       // [L + R, H]
  void* kv_a_norm = nullptr;  // [L]
  void* kv_b = nullptr;       // [n_heads (nope + v), L]
  // Mixture of experts.
  void* router = nullptr;           // [E, H]
  void* router_bias = nullptr;      // [E] (gpt-oss)
  float* correction = nullptr;      // [E] fp32 (DeepSeek-V3's e_score_correction_bias)
  void* expert_gate_up = nullptr;   // [E, 2 I_e, H]: per expert gate | up
  void* expert_down = nullptr;      // [E, H, I_e]
  void* expert_gate_up_bias = nullptr;  // [E, 2 I_e] (gpt-oss)
  void* expert_down_bias = nullptr;     // [E, H]
  double* skew_log_p = nullptr;     // [E] --expert-skew's popularity law; null: the router's choice
  uint64_t skew_key = 0;
  int64_t* expert_tokens = nullptr; // [E] tokens routed to each expert since reset_checksum()
  // [groups] -> [batch, max_context, n_kv, hd]; MLA: one latent cache [batch, max_context, L + R]
  // per group, in k_cache and v_cache alike.
  std::vector<void*> k_cache, v_cache;
};

/// A stage on one GPU. Not thread-safe: its forwards are enqueued from one thread, on one lane
/// at a time (they share x_, the scratch, the cuBLAS handle and the decode graphs).
class CudaStage final : public StageExecutor {
 public:
  CudaStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg);

  int first_unit() const override { return first_; }
  int last_unit() const override { return last_; }
  size_t input_bytes(int tokens) const override {
    const size_t n = static_cast<size_t>(cfg_.work.batch) * tokens;
    return plan_.has_embed ? n * sizeof(int32_t) : n * hidden_ * dt_;
  }
  size_t output_bytes(int tokens) const override {
    const size_t n = static_cast<size_t>(cfg_.work.batch);
    return plan_.has_head ? n * sizeof(int32_t) : n * tokens * hidden_ * dt_;
  }
  void enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) override;
  // Ragged forward (issue 37): not built yet on this backend.
  size_t ragged_input_bytes(int total_tokens) const override { return 0; }
  size_t ragged_output_bytes(int rows, int total_tokens) const override { return 0; }
  void enqueue_forward_ragged(Lane&, const void*, void*, int, const RaggedStep&) override {
    throw InternalError("this backend's stage has no ragged forward yet (issue 37)");
  }
  double checksum() const override;
  void reset_checksum() override;
  size_t weight_bytes() const override { return plan_.bytes.weights; }
  size_t kv_cache_bytes() const override { return plan_.bytes.kv_cache; }
  size_t launches_per_forward(int tokens) const override {
    // A decode forward beyond the graph cap runs eagerly: its eager bound, then.
    if (tokens == 1 && cfg_.cuda_graphs && graphs_.size() >= kMaxDecodeGraphs) {
      StageConfig eager = cfg_;
      eager.cuda_graphs = false;
      return plan_launches(plan_, eager, tokens);
    }
    return plan_launches(plan_, cfg_, tokens);
  }
  size_t decode_graphs() const override { return graphs_.size(); }
  std::vector<std::vector<int64_t>> expert_tokens() const override;
  void prepare_forward(int group, int pos, int tokens) override {
    if (tokens == 1 && cfg_.cuda_graphs && group >= 0 && group < cfg_.work.groups && pos >= 0 && pos < cfg_.work.max_context())
      (void)decode_graph(group, pos);
  }

 private:
  void* alloc(size_t bytes);
  void* alloc_elems(size_t n) { return alloc(n * dt_); }
  /// Rows [row0, row0 + rows) of the projection [*, fan_in] (all of it: row0 = 0, rows = out).
  void* proj(size_t rows, size_t fan_in, int unit, Tensor t, void* dst = nullptr, size_t row0 = 0);
  void* norm(size_t n, int unit, Tensor t, bool plus_one);
  /// Points the stage's cuBLAS handle at stream `st` with its fixed workspace.
  void bind_cublas(cudaStream_t st);
  /// One decoder layer over rows [b0, b0 + nb) of `x`. Decode (tokens == 1) plans attention for
  /// context bucket `bucket` (backend/decode_graphs.h); pos_dev non-null: the kernels read the
  /// position there (a graph's replay), `pos` being a position of the bucket.
  void layer_forward(const LayerWeights& w, cudaStream_t st, char* x, int b0, int nb, int pos, int tokens, int group,
                     int bucket = 0, const int* pos_dev = nullptr);
  /// The layers `ls` over x_ [B, tokens, H]: in one pass per layer, or (a prefill longer than
  /// plan_.rows rows) chunk by chunk, sequence by sequence. Decode plans attention for `bucket`.
  void run_layers(const LayerWeights* ls, size_t n, cudaStream_t st, int pos, int tokens, int group, int bucket = 0,
                  const int* pos_dev = nullptr);
  /// Attention sub-blocks of layer_forward over rows [b0, b0 + nb): the normed input in h_, the
  /// output (before any all-reduce) into h_.
  void gqa_attention(const LayerWeights& w, cudaStream_t st, int b0, int nb, int pos, int tokens, int group, int bucket,
                     const int* pos_dev);
  void mla_attention_block(const LayerWeights& w, cudaStream_t st, int b0, int nb, int pos, int tokens, int group,
                           int bucket, const int* pos_dev);
  /// The MoE MLP of M rows: the normed input in h_, the output into h_ (routed sum + shared experts).
  void moe_mlp(const LayerWeights& w, cudaStream_t st, int M);
  /// The gated MLP of `w` (dense, or a MoE layer's shared experts) over M rows of h_, into h_.
  void dense_mlp(const LayerWeights& w, cudaStream_t st, int M);
  /// --mtp: the MTP modules after the head (CpuStage::mtp_forward): from the head's tokens
  /// `head_tokens` [B] (device), each module drafts the next token; their last hidden rows join
  /// the checksum.
  void mtp_forward(cudaStream_t st, const int32_t* head_tokens, int pos, int tokens, int group, int bucket = 0,
                   const int* pos_dev = nullptr);
  /// One decoder layer's weights and caches (a main layer or an MTP module's).
  LayerWeights make_layer(const StagePlan::Layer& l);
  /// make_layer's MLA attention: q (low-rank or whole), kv_a, kv_b, o; one latent cache per group.
  void add_mla_weights(LayerWeights& w, const StagePlan::Layer& l);
  /// make_layer's attention of this rank's heads: q|k|v rows, o columns, biases, q/k norms,
  /// sinks; K and V caches per group.
  void add_attention_weights(LayerWeights& w, const StagePlan::Layer& l);
  /// make_layer's router, routed experts (expert-major blocks), expert counters and --expert-skew law.
  void add_expert_weights(LayerWeights& w, const StagePlan::Layer& l);
  /// The constructor's check of the plan against the GPU's free memory.
  /// @throws ppb::UserError naming the stage, its bytes and the free bytes.
  void check_free_memory(int first, int last) const;
  /// Key of the embedding table's weights (embed, a tied lm_head, the MTP modules' table).
  uint64_t embed_key() const { return weight_key(cfg_.work.seed, 0, static_cast<uint64_t>(Tensor::embed)); }
  /// The constructor's embedding table and head (final norm, this rank's lm_head rows).
  void make_embed_and_head(const model::ModelSpec& m, int last);
  /// The constructor's RoPE cos/sin tables [max_context, dims/2] of every plan_.ropes entry.
  void upload_rope_tables();
  /// The constructor's --mtp modules: the draft tokens' table, per module its norms, eh_proj and
  /// layer, their input rows and draft tokens.
  void make_mtp_modules(const model::ModelSpec& m);
  /// The constructor's scratch: activations of plan_.rows rows, attention, MLA, MoE, the head's.
  void allocate_scratch();
  void* bias_weights(size_t n, int unit, Tensor t, void* dst = nullptr, size_t first = 0);
  float* f32_weights(size_t n, int unit, Tensor t, float scale);
  /// The head over x_ [B, tokens, H]: last rows, final norm, lm_head, softcap, argmax -> out [B].
  void head_forward(cudaStream_t st, int tokens, int32_t* out);
  /// The instantiated decode graph of (group, the bucket of pos), captured on first use; null
  /// beyond kMaxDecodeGraphs (the caller then runs the forward eagerly).
  cudaGraphExec_t decode_graph(int group, int pos);
  char* at(void* base, size_t elems) const { return static_cast<char*>(base) + elems * dt_; }

  int first_ = 0, last_ = 0;
  StageConfig cfg_;
  StagePlan plan_;
  size_t hidden_ = 0, dt_ = 4;
  int vocab_ = 0;
  TpGroup* tp_ = nullptr;  // width > 1: the NCCL group of the stage's ranks
  float embed_scale_ = 1.0f, final_softcap_ = 0.0f, final_eps_ = 1e-6f;
  bool final_norm_plus_one_ = false;

  Stream init_stream_;     // weight generation, checksum reads: private, so never waits on a lane
  Stream capture_stream_;  // decode graphs are captured here: nothing of a lane's stream is captured
  CublasHandle cublas_;
  std::vector<DeviceMemory> memory_;
  void* workspace_ = nullptr;
  void* embed_ = nullptr;
  void* final_norm_ = nullptr;
  void* lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;
  /// --mtp: the MTP modules after the head.
  struct MtpModule {
    void* enorm = nullptr;        // [H]
    void* hnorm = nullptr;        // [H]
    void* eh_proj = nullptr;      // [H, 2H]
    void* shared_norm = nullptr;  // [H]
  };
  std::vector<MtpModule> mtp_;
  std::vector<LayerWeights> mtp_layers_;  // module k's decoder layer
  void* mtp_embed_ = nullptr;   // the draft tokens' embedding table (embed_ where this stage has it)
  void* mtp_cat_ = nullptr;     // [B x context, 2H]
  int32_t* draft_ = nullptr;    // [B]
  std::vector<float*> rope_cos_, rope_sin_;
  // Scratch.
  void* x_ = nullptr;
  void *h_ = nullptr, *qkv_ = nullptr, *q_ = nullptr, *attn_ = nullptr, *gu_ = nullptr, *act_ = nullptr;
  float* scores_ = nullptr;
  void* probs_ = nullptr;
  // MLA scratch: q_a rows, latent rows, absorbed queries, latent outputs.
  void *mla_qa_ = nullptr, *mla_kva_ = nullptr, *mla_qabs_ = nullptr, *mla_olat_ = nullptr;
  // MoE scratch.
  float* moe_logits_ = nullptr;     // [rows, E] fp32
  int32_t* route_experts_ = nullptr;  // [rows, top_k]
  float* route_weights_ = nullptr;    // [rows, top_k]
  MoeDispatch dispatch_;
  void *moe_gu_ = nullptr, *moe_act_ = nullptr, *moe_y_ = nullptr, *moe_sum_ = nullptr;
  float* partial_ = nullptr;
  void* last_rows_ = nullptr;
  float* logits_ = nullptr;
  ArgmaxPair* pairs_ = nullptr;      // width > 1: this rank's best (logit, id) per row [B]
  ArgmaxPair* all_pairs_ = nullptr;  // width > 1: the group's [width][B]
  double* checksum_dev_ = nullptr;
  int* bad_token_dev_ = nullptr;
  int* pos_dev_ = nullptr;              // a decode graph's position, set before each replay
  int32_t* graph_tokens_ = nullptr;     // [B] a decode graph's input tokens (embedding stage)
  int32_t* graph_out_ = nullptr;        // [B] a decode graph's output tokens (head stage)
  // Last: destroyed first, before the memory their nodes point into is freed.
  std::map<std::pair<int, int>, GraphExecHandle> graphs_;  // (group, context bucket) -> decode graph
};

void* CudaStage::alloc(size_t bytes) {
  memory_.emplace_back(bytes);
  return memory_.back().get();
}

void* CudaStage::proj(size_t rows, size_t fan_in, int unit, Tensor t, void* dst, size_t row0) {
  void* p = dst ? dst : alloc_elems(rows * fan_in);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  fill_uniform(p, cfg_.work.dtype, rows * fan_in, weight_key_at(weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), row0 * fan_in),
               scale, 0.0f, init_stream_.get());
  return p;
}

void* CudaStage::norm(size_t n, int unit, Tensor t, bool plus_one) {
  void* p = alloc_elems(n);
  fill_uniform(p, cfg_.work.dtype, n, weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), 0.1f, plus_one ? 0.0f : 1.0f,
               init_stream_.get());
  return p;
}

void* CudaStage::bias_weights(size_t n, int unit, Tensor t, void* dst, size_t first) {
  void* p = dst ? dst : alloc_elems(n);
  fill_uniform(p, cfg_.work.dtype, n, weight_key_at(weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), first), 0.02f, 0.0f,
               init_stream_.get());
  return p;
}

float* CudaStage::f32_weights(size_t n, int unit, Tensor t, float scale) {
  auto* p = static_cast<float*>(alloc(n * sizeof(float)));
  fill_uniform(p, DType::f32, n, weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), scale, 0.0f, init_stream_.get());
  return p;
}

void CudaStage::add_mla_weights(LayerWeights& w, const StagePlan::Layer& l) {
  // MoE and MLA layers refuse tensor parallelism (tp_unsupported_reason): the whole layer.
  const LayerShape& s = l.shape;
  const int u = l.unit;
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context());
  const model::MlaShape& a = s.mla;
  const size_t nh = static_cast<size_t>(s.n_heads), qk = static_cast<size_t>(a.qk_nope + a.qk_rope);
  const size_t L = static_cast<size_t>(a.kv_lora_rank), D = L + static_cast<size_t>(a.qk_rope);
  if (a.q_lora_rank > 0) {
    const size_t ql = static_cast<size_t>(a.q_lora_rank);
    w.q_a = proj(ql, H, u, Tensor::q_a_proj);
    w.q_a_norm = norm(ql, u, Tensor::q_a_norm, false);
    w.q_b = proj(nh * qk, ql, u, Tensor::q_b_proj);
  } else {
    w.q_b = proj(nh * qk, H, u, Tensor::q_proj);
  }
  w.kv_a = proj(D, H, u, Tensor::kv_a_proj);
  w.kv_a_norm = norm(L, u, Tensor::kv_a_norm, false);
  w.kv_b = proj(nh * (a.qk_nope + a.v_head_dim), L, u, Tensor::kv_b_proj);
  w.o = proj(H, nh * a.v_head_dim, u, Tensor::o_proj);
  for (int g = 0; g < cfg_.work.groups; ++g) {
    // Zeroed at allocation (DeviceMemory), as it must be: a decode graph's attention spans its
    // whole context bucket and masks the keys past the position, which must then be finite
    // (0 x NaN would reach the output).
    void* c = alloc_elems(B * ctx * D);
    w.k_cache.push_back(c);
    w.v_cache.push_back(c);
  }
}

void CudaStage::add_attention_weights(LayerWeights& w, const StagePlan::Layer& l) {
  const LayerShape& s = l.shape;  // this rank's shard (the whole layer at width 1)
  const int u = l.unit;
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context());
  const size_t nq = static_cast<size_t>(s.n_heads) * s.head_dim, nkv = static_cast<size_t>(s.n_kv_heads) * s.head_dim;
  const size_t hd = static_cast<size_t>(s.head_dim);
  const size_t q0 = l.heads.q_begin * hd, kv0 = l.heads.kv_begin * hd;  // first rows of q / k and v
  const size_t nq_all = static_cast<size_t>(l.full.n_heads) * hd;
  // Column-parallel q/k/v: rows of the whole tensors; row-parallel o: columns.
  w.qkv = alloc_elems((nq + 2 * nkv) * H);
  proj(nq, H, u, Tensor::q_proj, w.qkv, q0);
  proj(nkv, H, u, Tensor::k_proj, at(w.qkv, nq * H), kv0);
  proj(nkv, H, u, Tensor::v_proj, at(w.qkv, (nq + nkv) * H), kv0);
  w.o = alloc_elems(H * nq);
  fill_uniform_cols(w.o, cfg_.work.dtype, H, nq_all, q0, nq, weight_key(cfg_.work.seed, u, static_cast<uint64_t>(Tensor::o_proj)),
                    static_cast<float>(1.0 / std::sqrt(static_cast<double>(nq_all))), init_stream_.get());
  if (s.attn_bias) {
    w.bias = alloc_elems(nq + 2 * nkv);
    bias_weights(nq, u, Tensor::q_bias, w.bias, q0);
    bias_weights(nkv, u, Tensor::k_bias, at(w.bias, nq), kv0);
    bias_weights(nkv, u, Tensor::v_bias, at(w.bias, nq + nkv), kv0);
  }
  if (s.qk_norm) {
    w.q_norm = norm(s.head_dim, u, Tensor::q_norm, s.norm_plus_one);
    w.k_norm = norm(s.head_dim, u, Tensor::k_norm, s.norm_plus_one);
  }
  if (s.o_bias) w.o_bias = bias_weights(H, u, Tensor::o_bias);  // gpt-oss refuses --tp: the whole bias
  if (s.attn_sinks) w.sinks = f32_weights(static_cast<size_t>(s.n_heads), u, Tensor::sinks, 1.0f);
  for (int g = 0; g < cfg_.work.groups; ++g) {
    w.k_cache.push_back(alloc_elems(B * ctx * nkv));
    w.v_cache.push_back(alloc_elems(B * ctx * nkv));
  }
}

void CudaStage::add_expert_weights(LayerWeights& w, const StagePlan::Layer& l) {
  const int u = l.unit;
  const size_t H = hidden_;
  const model::MoeShape& e = l.shape.moe;
  const size_t E = static_cast<size_t>(e.n_experts), Ie = static_cast<size_t>(e.expert_intermediate);
  w.router = proj(E, H, u, Tensor::router);
  if (e.router_bias) w.router_bias = bias_weights(E, u, Tensor::router_bias);
  if (e.router == model::RouterKind::sigmoid_grouped) w.correction = f32_weights(E, u, Tensor::router_correction, 0.02f);
  // Expert x's tensors in one block per kind, expert-major (the grouped GEMM's layout), each
  // filled from its own key (CpuStage::add_expert_weights): the same values as the CPU's.
  w.expert_gate_up = alloc_elems(E * 2 * Ie * H);
  w.expert_down = alloc_elems(E * H * Ie);
  if (e.expert_bias) {
    w.expert_gate_up_bias = alloc_elems(E * 2 * Ie);
    w.expert_down_bias = alloc_elems(E * H);
  }
  for (int x = 0; x < e.n_experts; ++x) {
    const size_t xi = static_cast<size_t>(x);
    proj(Ie, H, u, expert_tensor(Tensor::expert_gate, x), at(w.expert_gate_up, xi * 2 * Ie * H));
    proj(Ie, H, u, expert_tensor(Tensor::expert_up, x), at(w.expert_gate_up, (xi * 2 + 1) * Ie * H));
    proj(H, Ie, u, expert_tensor(Tensor::expert_down, x), at(w.expert_down, xi * H * Ie));
    if (e.expert_bias) {
      bias_weights(Ie, u, expert_tensor(Tensor::expert_gate_bias, x), at(w.expert_gate_up_bias, xi * 2 * Ie));
      bias_weights(Ie, u, expert_tensor(Tensor::expert_up_bias, x), at(w.expert_gate_up_bias, (xi * 2 + 1) * Ie));
      bias_weights(H, u, expert_tensor(Tensor::expert_down_bias, x), at(w.expert_down_bias, xi * H));
    }
  }
  w.expert_tokens = static_cast<int64_t*>(alloc(E * sizeof(int64_t)));  // zeroed (DeviceMemory)
  if (cfg_.expert_skew > 0.0) {
    w.skew_key = weight_key(cfg_.work.seed, static_cast<uint64_t>(u), static_cast<uint64_t>(Tensor::expert_skew));
    const std::vector<double> log_p = cpu::expert_popularity_log_p(e.n_experts, cfg_.expert_skew, w.skew_key);
    w.skew_log_p = static_cast<double*>(alloc(E * sizeof(double)));
    // From pageable memory the call returns once the bytes are staged (CUDA's API sync
    // behaviour), so log_p may go; the constructor's final synchronisation covers the DMA.
    CUDA_CHECK(cudaMemcpyAsync(w.skew_log_p, log_p.data(), E * sizeof(double), cudaMemcpyHostToDevice,
                               init_stream_.get()));
  }
}

LayerWeights CudaStage::make_layer(const StagePlan::Layer& l) {
  const LayerShape& s = l.shape;  // this rank's shard (the whole layer at width 1)
  const int u = l.unit;
  const size_t H = hidden_;
  const size_t I = static_cast<size_t>(s.intermediate);
  LayerWeights w;
  w.plan = l;
  w.input_norm = norm(H, u, Tensor::input_layernorm, s.norm_plus_one);
  if (s.is_mla()) {
    add_mla_weights(w, l);
  } else {
    add_attention_weights(w, l);
  }
  w.post_attention_norm = norm(H, u, Tensor::post_attention_layernorm, s.norm_plus_one);
  if (s.sandwich_norm) {
    w.pre_feedforward_norm = norm(H, u, Tensor::pre_feedforward_layernorm, s.norm_plus_one);
    w.post_feedforward_norm = norm(H, u, Tensor::post_feedforward_layernorm, s.norm_plus_one);
  }
  if (I > 0) {  // the dense MLP, or a MoE layer's shared experts: column-parallel gate/up, row-parallel down
    const size_t I_all = static_cast<size_t>(l.full.intermediate);
    w.gate_up = alloc_elems(2 * I * H);
    proj(I, H, u, Tensor::gate_proj, w.gate_up, l.i0);
    proj(I, H, u, Tensor::up_proj, at(w.gate_up, I * H), l.i0);
    w.down = alloc_elems(H * I);
    fill_uniform_cols(w.down, cfg_.work.dtype, H, I_all, l.i0, I,
                      weight_key(cfg_.work.seed, u, static_cast<uint64_t>(Tensor::down_proj)),
                      static_cast<float>(1.0 / std::sqrt(static_cast<double>(I_all))), init_stream_.get());
  }
  if (s.is_moe()) add_expert_weights(w, l);
  return w;
}

CudaStage::CudaStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg)
    : first_(first), last_(last), cfg_(cfg), plan_(make_plan(m, first, last, cfg)) {
  if (cfg.tp_width > 1 && (cfg.tp == nullptr || cfg.tp->width() != cfg.tp_width || cfg.tp->rank() != cfg.tp_rank))
    throw InternalError("a CUDA stage of tensor-parallel width " + std::to_string(cfg.tp_width) +
                        " needs its group's NCCL communicator, of that width and rank");
  tp_ = cfg.tp_width > 1 ? cfg.tp : nullptr;
  hidden_ = static_cast<size_t>(m.hidden);
  dt_ = static_cast<size_t>(dtype_bytes(cfg.work.dtype));
  vocab_ = m.vocab;
  embed_scale_ = m.embed_scale_sqrt_hidden ? static_cast<float>(std::sqrt(static_cast<double>(m.hidden))) : 1.0f;
  final_norm_plus_one_ = m.final_norm_plus_one;
  final_softcap_ = static_cast<float>(m.final_softcap);
  final_eps_ = static_cast<float>(m.rms_eps);

  check_free_memory(first, last);  // say what does not fit before cudaMalloc fails somewhere in the middle
  make_embed_and_head(m, last);
  upload_rope_tables();
  for (const StagePlan::Layer& l : plan_.layers) layers_.push_back(make_layer(l));
  if (!plan_.mtp_layers.empty()) make_mtp_modules(m);
  allocate_scratch();
  CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
}

void CudaStage::check_free_memory(int first, int last) const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (plan_.bytes.total() > free_b) {
    throw UserError("stage units [" + std::to_string(first) + ", " + std::to_string(last) + "] needs " +
                    gib(plan_.bytes.total()) + " of GPU memory (weights " + gib(plan_.bytes.weights) + ", KV cache " +
                    gib(plan_.bytes.kv_cache) + ", scratch " + gib(plan_.bytes.scratch) + ") but only " +
                    gib(free_b) + " are free; use more stages, a smaller --batch/--microbatches/context, or a "
                    "smaller --dtype");
  }
}

void CudaStage::make_embed_and_head(const model::ModelSpec& m, int last) {
  const size_t H = hidden_, V = static_cast<size_t>(m.vocab);
  if (plan_.has_embed) {
    embed_ = alloc_elems(V * H);
    fill_uniform(embed_, cfg_.work.dtype, V * H, embed_key(), 1.0f, 0.0f, init_stream_.get());
  }
  if (plan_.has_head) {
    final_norm_ = norm(H, last, Tensor::final_norm, m.final_norm_plus_one);
    // This rank's vocabulary rows (all at width 1): of the shared embedding, a tied copy, or lm_head.
    const size_t v0 = plan_.vocab_begin, Vl = plan_.vocab_local;
    if (plan_.head_shares_embed) {
      lm_head_ = at(embed_, v0 * H);
    } else if (m.tie_embeddings) {
      lm_head_ = alloc_elems(Vl * H);
      fill_uniform(lm_head_, cfg_.work.dtype, Vl * H, weight_key_at(embed_key(), v0 * H), 1.0f, 0.0f, init_stream_.get());
    } else {
      lm_head_ = proj(Vl, H, last, Tensor::lm_head, nullptr, v0);
    }
  }
}

void CudaStage::upload_rope_tables() {
  const size_t ctx = static_cast<size_t>(cfg_.work.max_context());
  for (const auto& [rope, hd] : plan_.ropes) {
    const std::vector<double> inv = cpu::rope_inv_freq(rope, hd);
    const size_t half = static_cast<size_t>(hd / 2);
    std::vector<float> c(ctx * half), s(ctx * half);
    cpu::rope_tables(c.data(), s.data(), inv.data(), hd / 2, cfg_.work.max_context());
    auto* dc = static_cast<float*>(alloc(c.size() * sizeof(float)));
    auto* ds = static_cast<float*>(alloc(s.size() * sizeof(float)));
    // On init_stream_, whose synchronisation at the end of the constructor covers the DMA
    // (a plain cudaMemcpy from pageable memory may return before the bytes landed).
    CUDA_CHECK(cudaMemcpyAsync(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice, init_stream_.get()));
    CUDA_CHECK(cudaMemcpyAsync(ds, s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice, init_stream_.get()));
    rope_cos_.push_back(dc);
    rope_sin_.push_back(ds);
  }
}

void CudaStage::make_mtp_modules(const model::ModelSpec& m) {
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context()),
               V = static_cast<size_t>(m.vocab);
  // Keyed by the unit ids num_units() + k, which no real unit has (CpuStage::add_mtp_modules).
  if (plan_.mtp_own_embed) {
    mtp_embed_ = alloc_elems(V * H);
    fill_uniform(mtp_embed_, cfg_.work.dtype, V * H, embed_key(), 1.0f, 0.0f, init_stream_.get());
  } else {
    mtp_embed_ = embed_;
  }
  for (const StagePlan::Layer& l : plan_.mtp_layers) {
    MtpModule mod;
    mod.enorm = norm(H, l.unit, Tensor::mtp_enorm, false);
    mod.hnorm = norm(H, l.unit, Tensor::mtp_hnorm, false);
    mod.eh_proj = proj(H, 2 * H, l.unit, Tensor::mtp_eh_proj);
    mod.shared_norm = norm(H, l.unit, Tensor::mtp_shared_norm, false);
    mtp_.push_back(mod);
    mtp_layers_.push_back(make_layer(l));
  }
  mtp_cat_ = alloc_elems(B * ctx * 2 * H);
  draft_ = static_cast<int32_t*>(alloc(B * sizeof(int32_t)));
}

void CudaStage::allocate_scratch() {
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context());
  workspace_ = alloc(kCublasWorkspaceBytes);
  x_ = alloc_elems(B * ctx * H);
  if (!layers_.empty() || !mtp_layers_.empty()) {
    const size_t R = static_cast<size_t>(plan_.rows);
    h_ = alloc_elems(R * H);
    qkv_ = alloc_elems(R * plan_.max_qkv);
    q_ = alloc_elems(R * plan_.max_q);
    attn_ = alloc_elems(R * plan_.max_q);
    gu_ = alloc_elems(R * 2 * plan_.max_inter);
    act_ = alloc_elems(R * plan_.max_inter);
    scores_ = static_cast<float*>(alloc(plan_.scores_elems * sizeof(float)));
    probs_ = alloc_elems(plan_.scores_elems);
    partial_ = static_cast<float*>(alloc(plan_.decode_floats * sizeof(float)));
    if (plan_.max_mla_kva > 0) {
      if (plan_.max_mla_qa > 0) mla_qa_ = alloc_elems(R * plan_.max_mla_qa);
      mla_kva_ = alloc_elems(R * plan_.max_mla_kva);
      mla_qabs_ = alloc_elems(R * plan_.max_mla_qabs);
      mla_olat_ = alloc_elems(R * plan_.max_mla_olat);
    }
    if (plan_.max_experts > 0) {
      const size_t choices = R * plan_.max_top_k, E = plan_.max_experts, Ie = plan_.max_expert_inter;
      moe_logits_ = static_cast<float*>(alloc(R * E * sizeof(float)));
      route_experts_ = static_cast<int32_t*>(alloc(choices * sizeof(int32_t)));
      route_weights_ = static_cast<float*>(alloc(choices * sizeof(float)));
      dispatch_ = moe_dispatch_at(alloc(moe_dispatch_bytes(static_cast<int>(choices), static_cast<int>(E)) + 256),
                                  static_cast<int>(choices), static_cast<int>(E));
      moe_gu_ = alloc_elems(choices * 2 * Ie);
      moe_act_ = alloc_elems(choices * Ie);
      moe_y_ = alloc_elems(choices * H);
      moe_sum_ = alloc_elems(R * H);
    }
  }
  if (plan_.has_head) {
    last_rows_ = alloc_elems(B * H);
    logits_ = static_cast<float*>(alloc(B * plan_.vocab_local * sizeof(float)));
    if (tp_) {
      pairs_ = static_cast<ArgmaxPair*>(alloc(B * sizeof(ArgmaxPair)));
      all_pairs_ = static_cast<ArgmaxPair*>(alloc(static_cast<size_t>(cfg_.tp_width) * B * sizeof(ArgmaxPair)));
    }
  }
  checksum_dev_ = static_cast<double*>(alloc(sizeof(double)));
  bad_token_dev_ = static_cast<int*>(alloc(sizeof(int)));
  pos_dev_ = static_cast<int*>(alloc(sizeof(int)));
  graph_tokens_ = static_cast<int32_t*>(alloc(B * sizeof(int32_t)));
  graph_out_ = static_cast<int32_t*>(alloc(B * sizeof(int32_t)));
}

void CudaStage::bind_cublas(cudaStream_t st) {
  cublasHandle_t hb = cublas_.get();
  CUBLAS_CHECK(cublasSetStream(hb, st));
  // After cublasSetStream (which resets it): a fixed workspace keeps cuBLAS's algorithm choice,
  // hence the bits, independent of the stream (pipelined and serialized runs must agree), and
  // lets cuBLAS run inside a stream capture (no allocation of its own).
  CUBLAS_CHECK(cublasSetWorkspace(hb, workspace_, kCublasWorkspaceBytes));
}

void CudaStage::enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) {
  if (group < 0 || group >= cfg_.work.groups || pos < 0 || tokens < 1 || pos + tokens > cfg_.work.max_context()) {
    throw InternalError("enqueue_forward(group=" + std::to_string(group) + ", pos=" + std::to_string(pos) +
                        ", tokens=" + std::to_string(tokens) + ") is outside the stage's groups=" +
                        std::to_string(cfg_.work.groups) + ", max_context=" + std::to_string(cfg_.work.max_context()));
  }
  const cudaStream_t st = as_cuda_lane(lane).stream();
  const int B = cfg_.work.batch;
  const size_t rows = static_cast<size_t>(B) * tokens;
  const size_t H = hidden_;
  if (tokens == 1 && cfg_.cuda_graphs) {
    if (cudaGraphExec_t graph = decode_graph(group, pos)) {
      // Replay: the position and the input into the graph's fixed buffers, one launch for every
      // kernel of the stage, the output out of them. Stream order makes the buffers safe: the
      // stage's forwards all run on one stream (x_ and the scratch are shared anyway).
      set_device_int(pos_dev_, pos, st);
      if (plan_.has_embed) {
        CUDA_CHECK(cudaMemcpyAsync(graph_tokens_, in, B * sizeof(int32_t), cudaMemcpyDefault, st));
      } else {
        CUDA_CHECK(cudaMemcpyAsync(x_, in, rows * H * dt_, cudaMemcpyDefault, st));
      }
      CUDA_CHECK(cudaGraphLaunch(graph, st));
      if (plan_.has_head) {
        CUDA_CHECK(cudaMemcpyAsync(out, graph_out_, B * sizeof(int32_t), cudaMemcpyDefault, st));
      } else {
        CUDA_CHECK(cudaMemcpyAsync(out, x_, rows * H * dt_, cudaMemcpyDefault, st));
      }
      return;
    }
  }
  bind_cublas(st);
  if (plan_.has_embed) {
    embedding(x_, static_cast<const int32_t*>(in), rows, embed_, vocab_, static_cast<int>(H), embed_scale_,
              bad_token_dev_, cfg_.work.dtype, st);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(x_, in, rows * H * dt_, cudaMemcpyDefault, st));
  }
  // Decode is planned per context bucket, as its graph would be: the same bits either way.
  const int bucket = tokens == 1 ? decode_context_bucket(pos, cfg_.work.max_context()) : 0;
  run_layers(layers_.data(), layers_.size(), st, pos, tokens, group, bucket);
  if (plan_.has_head) {
    head_forward(st, tokens, static_cast<int32_t*>(out));
    if (!mtp_.empty()) mtp_forward(st, static_cast<const int32_t*>(out), pos, tokens, group, bucket);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(out, x_, rows * H * dt_, cudaMemcpyDefault, st));
  }
}

void CudaStage::run_layers(const LayerWeights* ls, size_t n, cudaStream_t st, int pos, int tokens, int group,
                           int bucket, const int* pos_dev) {
  if (n == 0) return;
  const int B = cfg_.work.batch;
  if (static_cast<size_t>(B) * tokens <= static_cast<size_t>(plan_.rows)) {
    for (size_t i = 0; i < n; ++i)
      layer_forward(ls[i], st, static_cast<char*>(x_), 0, B, pos, tokens, group, bucket, pos_dev);
    return;
  }
  // Chunked prefill, sequence by sequence: chunk c of a sequence runs every layer after chunk
  // c-1 wrote its keys and values into the cache.
  for (int b = 0; b < B; ++b) {
    for (int t0 = 0; t0 < tokens; t0 += plan_.rows) {
      const int tc = std::min(plan_.rows, tokens - t0);
      char* xb = at(x_, (static_cast<size_t>(b) * tokens + t0) * hidden_);
      for (size_t i = 0; i < n; ++i) layer_forward(ls[i], st, xb, b, 1, pos + t0, tc, group);
    }
  }
}

void CudaStage::mtp_forward(cudaStream_t st, const int32_t* head_tokens, int pos, int tokens, int group, int bucket,
                            const int* pos_dev) {
  const int B = cfg_.work.batch, H = static_cast<int>(hidden_), V = static_cast<int>(plan_.vocab_local);
  const DType t = cfg_.work.dtype;
  const float eps = final_eps_;  // the model's rms_norm_eps (CpuStage's mtp_eps_)
  CUDA_CHECK(cudaMemcpyAsync(draft_, head_tokens, static_cast<size_t>(B) * sizeof(int32_t), cudaMemcpyDefault, st));
  for (size_t k = 0; k < mtp_.size(); ++k) {
    const MtpModule& mod = mtp_[k];
    mtp_concat(mtp_cat_, draft_, mtp_embed_, x_, mod.enorm, mod.hnorm, B, tokens, H, eps, t, st);
    linear(cublas_.get(), x_, cuda_type(t), mtp_cat_, mod.eh_proj, t, B * tokens, H, 2 * H);
    run_layers(&mtp_layers_[k], 1, st, pos, tokens, group, bucket, pos_dev);
    gather_last_rows(last_rows_, x_, B, tokens, H, checksum_dev_, t, st);
    rmsnorm(last_rows_, last_rows_, mod.shared_norm, B, H, eps, false, t, st);
    linear(cublas_.get(), logits_, CUDA_R_32F, last_rows_, lm_head_, t, B, V, H);
    argmax_rows(draft_, logits_, B, V, st);
  }
}

void CudaStage::head_forward(cudaStream_t st, int tokens, int32_t* out) {
  const int B = cfg_.work.batch, H = static_cast<int>(hidden_);
  gather_last_rows(last_rows_, x_, B, tokens, H, checksum_dev_, cfg_.work.dtype, st);
  rmsnorm(last_rows_, last_rows_, final_norm_, B, H, final_eps_, final_norm_plus_one_, cfg_.work.dtype, st);
  const int V = static_cast<int>(plan_.vocab_local);  // this rank's vocabulary slice (all at width 1)
  linear(cublas_.get(), logits_, CUDA_R_32F, last_rows_, lm_head_, cfg_.work.dtype, B, V, H);
  if (final_softcap_ > 0.0f) softcap_inplace(logits_, static_cast<size_t>(B) * V, final_softcap_, st);
  if (!tp_) {
    argmax_rows(out, logits_, B, V, st);
    return;
  }
  // Vocabulary-parallel: this rank's best (logit, id) per row, the group's pairs, their best.
  argmax_pairs(pairs_, logits_, B, V, static_cast<int>(plan_.vocab_begin), st);
  tp_->enqueue_allgather(pairs_, all_pairs_, static_cast<size_t>(B) * sizeof(ArgmaxPair), st);
  argmax_of_pairs(out, all_pairs_, tp_->width(), B, st);
}

cudaGraphExec_t CudaStage::decode_graph(int group, int pos) {
  const int bucket = decode_context_bucket(pos, cfg_.work.max_context());
  const std::pair<int, int> key{group, bucket};
  if (auto it = graphs_.find(key); it != graphs_.end()) return it->second.get();
  if (graphs_.size() >= kMaxDecodeGraphs) return nullptr;
  // Captured on a private stream in thread-local mode: another thread's CUDA calls (the
  // transport's, other lanes') neither join nor break the capture. Nothing captured runs now.
  const cudaStream_t cs = capture_stream_.get();
  bind_cublas(cs);
  CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  try {
    if (plan_.has_embed) {
      embedding(x_, graph_tokens_, static_cast<size_t>(cfg_.work.batch), embed_, vocab_, static_cast<int>(hidden_),
                embed_scale_, bad_token_dev_, cfg_.work.dtype, cs);
    }
    run_layers(layers_.data(), layers_.size(), cs, pos, 1, group, bucket, pos_dev_);
    if (plan_.has_head) {
      head_forward(cs, 1, graph_out_);
      if (!mtp_.empty()) mtp_forward(cs, graph_out_, pos, 1, group, bucket, pos_dev_);
    }
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(cs, &partial);
    if (partial) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();  // an invalidated capture's error, not to be blamed on a later launch
    throw;
  }
  cudaGraph_t raw = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(cs, &raw));
  const GraphHandle graph(raw);
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
  return graphs_.emplace(key, GraphExecHandle(exec)).first->second.get();
}

void CudaStage::layer_forward(const LayerWeights& w, cudaStream_t st, char* x, int b0, int nb, int pos, int tokens,
                              int group, int bucket, const int* pos_dev) {
  const LayerShape& s = w.plan.shape;
  const DType t = cfg_.work.dtype;
  const int M = nb * tokens, H = static_cast<int>(hidden_);
  const float eps = static_cast<float>(s.rms_eps);
  const bool p1 = s.norm_plus_one;

  // Attention block.
  rmsnorm(h_, x, w.input_norm, M, H, eps, p1, t, st);
  if (s.is_mla()) {
    mla_attention_block(w, st, b0, nb, pos, tokens, group, bucket, pos_dev);
  } else {
    gqa_attention(w, st, b0, nb, pos, tokens, group, bucket, pos_dev);
  }
  if (tp_) tp_->enqueue_allreduce_sum(h_, static_cast<size_t>(M) * H, t, st);  // row-parallel o_proj
  if (s.sandwich_norm) rmsnorm(h_, h_, w.post_attention_norm, M, H, eps, p1, t, st);
  // x += attention output; h = pre-MLP norm(x).
  add_rmsnorm(x, h_, h_, s.sandwich_norm ? w.pre_feedforward_norm : w.post_attention_norm, M, H, eps, p1, t, st);

  // MLP block.
  if (s.is_moe()) {
    moe_mlp(w, st, M);
  } else {
    dense_mlp(w, st, M);
  }
  if (tp_) tp_->enqueue_allreduce_sum(h_, static_cast<size_t>(M) * H, t, st);  // row-parallel down_proj
  if (s.sandwich_norm) rmsnorm(h_, h_, w.post_feedforward_norm, M, H, eps, p1, t, st);
  add_inplace(x, h_, static_cast<size_t>(M) * H, t, st);
}

void CudaStage::gqa_attention(const LayerWeights& w, cudaStream_t st, int b0, int nb, int pos, int tokens, int group,
                              int bucket, const int* pos_dev) {
  const LayerShape& s = w.plan.shape;
  const DType t = cfg_.work.dtype;
  cublasHandle_t hb = cublas_.get();
  const int M = nb * tokens, H = static_cast<int>(hidden_), hd = s.head_dim;
  const int nq = s.n_heads * hd, nkv = s.n_kv_heads * hd;
  const size_t cache_off = static_cast<size_t>(b0) * cfg_.work.max_context() * nkv;
  void* kc = at(w.k_cache[group], cache_off);
  void* vc = at(w.v_cache[group], cache_off);
  linear(hb, qkv_, cuda_type(t), h_, w.qkv, t, M, nq + 2 * nkv, H);
  QkvShape qs;
  qs.batch = nb;
  qs.tokens = tokens;
  qs.pos0 = pos;
  qs.max_context = cfg_.work.max_context();
  qs.n_heads = s.n_heads;
  qs.n_kv_heads = s.n_kv_heads;
  qs.head_dim = hd;
  qs.qk_norm = s.qk_norm;
  qs.plus_one = s.norm_plus_one;
  qs.eps = static_cast<float>(s.rms_eps);
  qs.pos0_dev = pos_dev;
  qkv_rope_cache(q_, kc, vc, qkv_, w.bias, w.q_norm, w.k_norm, rope_cos_[w.plan.rope], rope_sin_[w.plan.rope], qs, t, st);
  cpu::AttentionShape as = attention_shape(s, nb, tokens, pos, cfg_.work.max_context());
  as.sinks = w.sinks;
  if (tokens == 1) {
    attention_decode(attn_, q_, kc, vc, as, partial_, t, st, bucket > 0 ? decode_plan_keys(bucket, s.sliding_window) : 0,
                     pos_dev);
  } else {
    attention_prefill(hb, attn_, q_, kc, vc, as, plan_.query_block, scores_, probs_, t, st);
  }
  linear(hb, h_, cuda_type(t), attn_, w.o, t, M, H, nq);
  if (w.o_bias) add_bias_rows(h_, false, w.o_bias, static_cast<size_t>(M), H, t, st);
}

// Absorbed MLA (CpuStage::mla_attention): q (through q_a and its norm where q_lora_rank > 0),
// the latent rows into the cache, the absorbed queries, MQA over the latent cache, each head's
// values through W_UV, o_proj.
void CudaStage::mla_attention_block(const LayerWeights& w, cudaStream_t st, int b0, int nb, int pos, int tokens,
                                    int group, int bucket, const int* pos_dev) {
  const LayerShape& s = w.plan.shape;
  const model::MlaShape& a = s.mla;
  const DType t = cfg_.work.dtype;
  cublasHandle_t hb = cublas_.get();
  const int M = nb * tokens, H = static_cast<int>(hidden_), nh = s.n_heads;
  const int qk = a.qk_nope + a.qk_rope, D = a.kv_lora_rank + a.qk_rope;
  const float eps = static_cast<float>(s.rms_eps);
  if (a.q_lora_rank > 0) {
    linear(hb, mla_qa_, cuda_type(t), h_, w.q_a, t, M, a.q_lora_rank, H);
    rmsnorm(mla_qa_, mla_qa_, w.q_a_norm, M, a.q_lora_rank, eps, false, t, st);
    linear(hb, q_, cuda_type(t), mla_qa_, w.q_b, t, M, nh * qk, a.q_lora_rank);
  } else {
    linear(hb, q_, cuda_type(t), h_, w.q_b, t, M, nh * qk, H);
  }
  linear(hb, mla_kva_, cuda_type(t), h_, w.kv_a, t, M, D, H);
  MlaCallShape ms = mla_call_shape(s, nb, tokens, pos, cfg_.work.max_context());
  ms.pos0_dev = pos_dev;
  void* cache = at(w.k_cache[group], static_cast<size_t>(b0) * cfg_.work.max_context() * D);
  const float* cos_t = rope_cos_[w.plan.rope];
  const float* sin_t = rope_sin_[w.plan.rope];
  mla_kv_cache_write(cache, mla_kva_, w.kv_a_norm, cos_t, sin_t, ms, t, st);
  mla_absorb_queries(hb, mla_qabs_, q_, w.kv_b, cos_t, sin_t, ms, t, st);
  mla_attention(hb, mla_olat_, mla_qabs_, cache, ms, plan_.mla_query_block, scores_, probs_, t, st,
                tokens == 1 && bucket > 0 ? decode_plan_keys(bucket, 0) : 0);
  mla_values(hb, attn_, mla_olat_, w.kv_b, ms, t, st);
  linear(hb, h_, cuda_type(t), attn_, w.o, t, M, H, nh * a.v_head_dim);
}

void CudaStage::dense_mlp(const LayerWeights& w, cudaStream_t st, int M) {
  const LayerShape& s = w.plan.shape;
  const DType t = cfg_.work.dtype;
  cublasHandle_t hb = cublas_.get();
  const int H = static_cast<int>(hidden_), I = s.intermediate;
  linear(hb, gu_, cuda_type(t), h_, w.gate_up, t, M, 2 * I, H);
  gated_activation(act_, gu_, M, I, s.act, t, st, static_cast<float>(s.swiglu_limit));
  linear(hb, h_, cuda_type(t), act_, w.down, t, M, H, I);
}

// Routed experts over only the rows routed to each (CpuStage::moe_mlp), without a host round
// trip: the router, the choice, the rows sorted by expert, two grouped GEMMs around the
// activation, each token's weighted sum in expert order; then the shared experts added.
void CudaStage::moe_mlp(const LayerWeights& w, cudaStream_t st, int M) {
  const LayerShape& s = w.plan.shape;
  const model::MoeShape& e = s.moe;
  const DType t = cfg_.work.dtype;
  const int H = static_cast<int>(hidden_), E = e.n_experts, k = e.top_k, Ie = e.expert_intermediate;
  const int choices = M * k, tiles = moe_max_tiles(choices, E);
  linear(cublas_.get(), moe_logits_, CUDA_R_32F, h_, w.router, t, M, E, H);
  if (w.router_bias) add_bias_rows(moe_logits_, true, w.router_bias, static_cast<size_t>(M), E, t, st);
  route_tokens(route_experts_, route_weights_, moe_logits_, M, e, w.correction, w.skew_log_p, w.skew_key, st);
  moe_dispatch(dispatch_, route_experts_, M, k, E, w.expert_tokens, st);
  moe_grouped_linear(moe_gu_, h_, /*gather=*/true, w.expert_gate_up, w.expert_gate_up_bias, dispatch_, 2 * Ie, H, tiles,
                     t, st);
  gated_activation(moe_act_, moe_gu_, static_cast<size_t>(choices), Ie, s.act, t, st, static_cast<float>(s.swiglu_limit));
  moe_grouped_linear(moe_y_, moe_act_, /*gather=*/false, w.expert_down, w.expert_down_bias, dispatch_, H, Ie, tiles, t,
                     st);
  if (s.intermediate > 0) {  // shared experts: every token, then the routed sum added
    moe_combine(moe_sum_, moe_y_, route_weights_, route_experts_, dispatch_, M, k, H, t, st);
    dense_mlp(w, st, M);
    add_inplace(h_, moe_sum_, static_cast<size_t>(M) * H, t, st);
  } else {
    moe_combine(h_, moe_y_, route_weights_, route_experts_, dispatch_, M, k, H, t, st);
  }
}

std::vector<std::vector<int64_t>> CudaStage::expert_tokens() const {
  std::vector<std::vector<int64_t>> rows;
  for (const auto* ls : {&layers_, &mtp_layers_}) {
    for (const LayerWeights& w : *ls) {
      if (!w.expert_tokens) continue;
      const size_t E = static_cast<size_t>(w.plan.shape.moe.n_experts);
      std::vector<int64_t> row(E + 1);
      row[0] = w.plan.layer;
      CUDA_CHECK(cudaMemcpyAsync(row.data() + 1, w.expert_tokens, E * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                 init_stream_.get()));
      CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

double CudaStage::checksum() const {
  if (!plan_.has_head && !plan_.has_embed) return 0.0;
  double sum = 0.0;
  int bad = 0;
  CUDA_CHECK(cudaMemcpyAsync(&sum, checksum_dev_, sizeof sum, cudaMemcpyDeviceToHost, init_stream_.get()));
  CUDA_CHECK(cudaMemcpyAsync(&bad, bad_token_dev_, sizeof bad, cudaMemcpyDeviceToHost, init_stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
  if (bad) {
    throw InternalError("stage units [" + std::to_string(first_) + ", " + std::to_string(last_) +
                        "]: a token id outside [0, " + std::to_string(vocab_) + ") reached the embedding");
  }
  return plan_.has_head ? sum : 0.0;
}

void CudaStage::reset_checksum() {
  CUDA_CHECK(cudaMemsetAsync(checksum_dev_, 0, sizeof(double), init_stream_.get()));
  for (const auto* ls : {&layers_, &mtp_layers_})
    for (const LayerWeights& w : *ls)
      if (w.expert_tokens)
        CUDA_CHECK(cudaMemsetAsync(w.expert_tokens, 0, static_cast<size_t>(w.plan.shape.moe.n_experts) * sizeof(int64_t),
                                   init_stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
}

}  // namespace

std::unique_ptr<StageExecutor> create_cuda_stage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  return std::make_unique<CudaStage>(m, first, last, cfg);
}

}  // namespace cuda
}  // namespace ppb
