// The CUDA stage's class (create_cuda_stage, cuda_stage.h), shared by its three sources:
// cuda_stage.cpp (construction: weights, caches, scratch; the records), cuda_stage_forward.cpp
// (the forward of B sequences: layers, attention, MLP, head, decode graphs) and
// cuda_stage_ragged.cpp (the ragged forward of continuous batching). Internal to
// src/backend/cuda: the rest of the tree sees a StageExecutor.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/cuda/cuda_ragged_plan.h"
#include "backend/cuda/cuda_stage_plan.h"
#include "backend/stage.h"
#include "backend/tensor_parallel.h"
#include "backend/weights.h"
#include "model/model_spec.h"

namespace ppb::cuda {

// Decode graphs a stage keeps (groups x context buckets; backend/decode_graphs.h): beyond it,
// decode runs eagerly. 64 groups x 11 buckets (64 .. 65536 keys) fit.
constexpr size_t kMaxDecodeGraphs = 1024;

/// A ragged step's (sub-)row of more new tokens than this attends alone through
/// attention_prefill (tensor-core GEMMs over its keys once per query block) instead of in
/// attention_ragged's launch, which reads a row's keys once per query token (kernels_attention.cu:
/// a 512-token prompt ~0.5 GB of K/V reads against ~4 MB). Decodes and the short prefills of a
/// serving step stay in the one launch. A guess of the crossover, not a measurement (no GPU
/// here); RaggedLimits::long_row_tokens.
constexpr int kRaggedLongRowTokens = 32;

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

/// The token rows of one layer pass over x and how they attend. A uniform forward: rows
/// [b0, b0 + nb) of the group's cache, `tokens` new tokens each at positions [pos, pos + tokens)
/// (decode: attention planned for context `bucket`; pos_dev non-null: the kernels read the
/// position there, a graph's replay). A ragged step: chunk `chunk` of plan `ragged` (M = its
/// tokens), the per-token metadata in the stage's device copy of ragged->meta.
struct LayerPass {
  int M = 0;  ///< token rows of x and of the scratch
  int b0 = 0, nb = 0, pos = 0, tokens = 0, bucket = 0;
  const int* pos_dev = nullptr;
  const RaggedPlan* ragged = nullptr;
  const RaggedChunk* chunk = nullptr;
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
  size_t ragged_input_bytes(int total_tokens) const override {
    const size_t n = static_cast<size_t>(total_tokens);
    return plan_.has_embed ? n * sizeof(int32_t) : n * hidden_ * dt_;
  }
  size_t ragged_output_bytes(int rows, int total_tokens) const override {
    return plan_.has_head ? static_cast<size_t>(rows) * sizeof(int32_t)
                          : static_cast<size_t>(total_tokens) * hidden_ * dt_;
  }
  /// Continuous batching (cuda_stage_ragged.cpp): a step whose rows are slots 0..B-1 in order
  /// with one pos and one token count runs the eager uniform forward (enqueue_forward's bits).
  /// Any other step: its metadata uploaded once in stream order (RaggedPlan::meta, from pinned
  /// memory of the stage), then per layer chunk the layers over the packed tokens: projections,
  /// norms, MLP/MoE and the all-reduces over M = the chunk's tokens; q/k/v, RoPE and the cache
  /// writes in one launch reading each token's position and slot; GQA attention in one
  /// attention_ragged launch per piece (a long row: attention_prefill at batch 1); MLA with the
  /// latent cache write and the absorbed queries in one launch each and mla_attention per
  /// (sub-)row. The head (and --mtp) over each row's last new token. Eager launches, no graph.
  /// @throws ppb::InternalError for a group outside the stage or a step check_ragged_step refuses.
  void enqueue_forward_ragged(Lane& lane, const void* in, void* out, int group, const RaggedStep& step) override;
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
  /// enqueue_forward without a graph: embedding (or the input copy), the layers, the head and
  /// --mtp (or the output copy), eager launches on `st`. Checked arguments.
  void forward_eager(cudaStream_t st, const void* in, void* out, int group, int pos, int tokens);
  /// One decoder layer over the pass's rows of `x`.
  void layer_forward(const LayerWeights& w, cudaStream_t st, char* x, const LayerPass& pass, int group);
  /// The layers `ls` over x_ [B, tokens, H]: in one pass per layer, or (a prefill longer than
  /// plan_.rows rows) chunk by chunk, sequence by sequence. Decode plans attention for `bucket`.
  void run_layers(const LayerWeights* ls, size_t n, cudaStream_t st, int pos, int tokens, int group, int bucket = 0,
                  const int* pos_dev = nullptr);
  /// Attention sub-blocks of layer_forward over the pass's rows: the normed input in h_, the
  /// output (before any all-reduce) into h_.
  void gqa_attention(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, int group);
  void mla_attention_block(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, int group);
  /// gqa_attention's attention of a ragged chunk (q_ -> attn_) over the group's caches kc, vc:
  /// per piece attention_ragged, or attention_prefill at batch 1 for a long row.
  void ragged_gqa_attention(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, void* kc, void* vc);
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
  /// The constructor's scratch: activations of plan_.rows rows, attention, MLA, MoE, the head's,
  /// a ragged step's metadata.
  void allocate_scratch();
  void* bias_weights(size_t n, int unit, Tensor t, void* dst = nullptr, size_t first = 0);
  float* f32_weights(size_t n, int unit, Tensor t, float scale);
  /// The head over x_ [B, tokens, H]: last rows, final norm, lm_head, softcap, argmax -> out [B].
  void head_forward(cudaStream_t st, int tokens, int32_t* out);
  /// The head after its input rows were gathered into last_rows_ [rows, H]: final norm,
  /// lm_head, softcap, argmax (vocabulary-parallel: the group's best) -> out [rows].
  void head_logits_argmax(cudaStream_t st, int rows, int32_t* out);
  /// The instantiated decode graph of (group, the bucket of pos), captured on first use; null
  /// beyond kMaxDecodeGraphs (the caller then runs the forward eagerly).
  cudaGraphExec_t decode_graph(int group, int pos);
  char* at(void* base, size_t elems) const { return static_cast<char*>(base) + elems * dt_; }

  // ---- the ragged forward (cuda_stage_ragged.cpp) ----
  /// The stage's bounds for plan_ragged_step (its scratch rows, its partials buffer and the
  /// largest partials of its GQA layers).
  RaggedLimits ragged_limits() const;
  /// Copies plan.meta into pinned memory of the stage and enqueues its upload to ragged_meta_ on
  /// `st`; the pinned buffer is reused only once its copy has run (an event per buffer, never
  /// waited on: a busy one makes the pool grow), so a later step cannot overwrite it.
  void upload_ragged_meta(const RaggedPlan& plan, cudaStream_t st);
  /// The layers `ls` over x_ [plan.tokens, H] (the packed tokens), chunk by chunk.
  void run_ragged_layers(const LayerWeights* ls, size_t n, cudaStream_t st, const RaggedPlan& plan, int group);
  /// mla_attention per (sub-)row of a ragged chunk: mla_qabs_ -> mla_olat_ over the group's cache.
  void ragged_mla_attention(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, int group);
  /// --mtp after a ragged head: each module over the packed tokens, drafts per row.
  void ragged_mtp_forward(cudaStream_t st, const int32_t* head_tokens, const RaggedPlan& plan, int group);
  const int32_t* ragged_meta(int at) const { return ragged_meta_ + at; }

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
  int* bad_ragged_dev_ = nullptr;       // set by attention_ragged for a token outside its plan (a planner bug)
  int* pos_dev_ = nullptr;              // a decode graph's position, set before each replay
  int32_t* graph_tokens_ = nullptr;     // [B] a decode graph's input tokens (embedding stage)
  int32_t* graph_out_ = nullptr;        // [B] a decode graph's output tokens (head stage)
  int32_t* ragged_meta_ = nullptr;      // [ragged_meta_ints(B, B x context)] a ragged step's metadata
  /// Pinned host copies of ragged steps' metadata, each with the event recorded after its upload:
  /// kMetaStagingBuffers of kMetaStagingBytes from the constructor, more only while that many
  /// steps are in flight or for a step of more metadata.
  static constexpr int kMetaStagingBuffers = 4;
  static constexpr size_t kMetaStagingBytes = 64 << 10;
  struct MetaStaging {
    PinnedMemory host;
    EventHandle uploaded{cudaEventDisableTiming};
  };
  std::vector<std::unique_ptr<MetaStaging>> meta_staging_;
  // Last: destroyed first, before the memory their nodes point into is freed.
  std::map<std::pair<int, int>, GraphExecHandle> graphs_;  // (group, context bucket) -> decode graph
};

}  // namespace ppb::cuda
