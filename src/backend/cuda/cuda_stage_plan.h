// The plan of a CUDA stage (cuda_stage.cpp): what is decided before anything is allocated, from
// the model, the unit range and the StageConfig alone: the validated layer shards, RoPE tables,
// the rows of a layer pass, the scratch sizes, the bytes (cuda_stage_bytes) and the launch bound
// of a forward (cuda_launches_per_forward).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/stage.h"
#include "backend/tensor_parallel.h"
#include "model/model_spec.h"

namespace ppb::cuda {

/// The fixed cuBLAS workspace of a stage, bytes (CudaStage::bind_cublas; counted in its scratch).
inline constexpr size_t kCublasWorkspaceBytes = 32u << 20;

/// Everything about a stage that is decided before allocating: validated shapes and sizes.
struct StagePlan {
  struct Layer {
    int unit = 0;      // weights' unit id (an MTP module's: num_units() + k)
    int layer = 0;     // index in ModelSpec::layers (MTP module k: n_layers + k)
    model::LayerShape shape;  // this rank's shard (tensor parallelism): its heads and MLP slice
    model::LayerShape full;   // the layer's whole shape
    TpHeads heads;     // this rank's query and KV heads
    size_t i0 = 0;     // this rank's MLP slice starts at intermediate row i0
    int rope = 0;      // index into ropes
  };
  std::vector<Layer> layers;
  std::vector<Layer> mtp_layers;  // --mtp: each MTP module's decoder layer (head stage)
  std::vector<std::pair<model::Rope, int>> ropes;  // distinct (rope, rotated dimensions)
  bool has_embed = false, has_head = false, head_shares_embed = false;
  bool mtp_own_embed = false;  // --mtp without the embedding on this stage: the draft tokens' table
  size_t vocab_begin = 0, vocab_local = 0;  // the head's tokens [vocab_begin, + vocab_local) (all at width 1)
  int rows = 0;         // token rows per layer pass
  int query_block = 0;  // prefill attention query rows per block
  int mla_query_block = 0;  // MLA: query tokens per block (every sequence and head at once)
  size_t max_qkv = 0, max_q = 0, max_inter = 0;
  // MLA: q_a rows, latent rows (D), absorbed queries (heads x D), latent outputs (heads x L).
  size_t max_mla_qa = 0, max_mla_kva = 0, max_mla_qabs = 0, max_mla_olat = 0;
  // MoE: experts, top_k and expert width of the widest layer.
  size_t max_experts = 0, max_top_k = 0, max_expert_inter = 0;
  int moe_layers = 0;
  size_t scores_elems = 0, decode_floats = 0;
  StageBytes bytes;
};

/// The stage plan of units [first, last] of `m` for `cfg`: validated shapes (every backend's
/// check_stage_layer and the CUDA kernels' limits), this rank's shards, bytes.
/// @throws ppb::UserError for an invalid unit range, config, tensor-parallel width or layer
///         shape, naming it.
StagePlan make_plan(const model::ModelSpec& m, int first, int last, const StageConfig& cfg);

/// Upper bound of the launches of one forward of `tokens` tokens per sequence on a stage of
/// plan `plan` (StageExecutor::launches_per_forward).
size_t plan_launches(const StagePlan& plan, const StageConfig& cfg, int tokens);

/// The shape of a layer's MLA calls for `batch` sequences of `tokens` tokens at pos0, in a cache
/// of max_context positions (scale: the layer's, or 1/sqrt(qk_nope + qk_rope)).
MlaCallShape mla_call_shape(const model::LayerShape& s, int batch, int tokens, int pos0, int max_context);
/// The attention call shape of a (non-MLA) layer: `batch` sequences of `tokens` tokens at pos0 in
/// a cache of max_context positions; scale the layer's or 1/sqrt(head_dim), its window and softcap.
cpu::AttentionShape attention_shape(const model::LayerShape& s, int batch, int tokens, int pos0, int max_context);

}  // namespace ppb::cuda
