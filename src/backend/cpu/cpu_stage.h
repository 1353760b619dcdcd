// The CPU StageExecutor: units [first, last] of a model in fp32, with the kernels of cpu_ops.h.
#pragma once

#include <memory>

#include "backend/stage.h"

namespace ppb::model {
struct ModelSpec;
}  // namespace ppb::model

namespace ppb {
namespace cpu {
class WeightCache;
}  // namespace cpu

/// Builds units [first, last] (inclusive) of `m` on the CPU, in fp32.
///
/// Allocates only those units' weights (deterministic, backend/weights.h: a tied lm_head is
/// generated from the embed unit's matrix, and shared when the stage also holds embed), one KV
/// cache per request group and layer (K and V, each [batch, max_context, n_kv_heads, head_dim]
/// fp32, also for sliding-window layers), and scratch for batch * max_context tokens, so a
/// forward never allocates.
///
/// `cache` (cpu_weight_cache.h): the rank's weight tensors; a tensor another live stage built
/// from the same cache already holds is shared, not generated again (same values: weights are a
/// pure function of seed, unit, tensor and block). Null: the stage's own tensors.
///
/// Forward math (HF semantics, modeling_llama.py / modeling_qwen3.py / modeling_gemma2.py /
/// modeling_gemma3.py):
///   embed: x = E[tokens] (* sqrt(hidden) if embed_scale_sqrt_hidden)
///   layer: h = norm(x); q,k,v = proj(h) (+bias); q,k = qk_norm per head; rope(q,k); cache k,v;
///          a = o_proj(attention(q, K, V)); x += sandwich ? post_attention_norm(a) : a;
///          h = (sandwich ? pre_feedforward_norm : post_attention_norm)(x);
///          m = down(act(gate(h)) * up(h)); x += sandwich ? post_feedforward_norm(m) : m
///   head:  the last position of each sequence: checksum += sum(x); logits = lm_head(norm(x));
///          optional final softcap; greedy argmax -> int32 [B]
///
/// A ragged step (enqueue_forward_ragged, continuous batching) runs the same body: the layer
/// works on the step's packed token rows (norms, projections, MLP, MoE, the tensor-parallel
/// all-reduces), RoPE, the KV-cache write and the attention go row by row in the row's slot
/// (cpu::rope_ragged, kv_cache_write_ragged, attention_ragged), the head reads each row's last
/// token. A uniform forward is the ragged step of slots 0..B-1 at one pos and T.
///
/// Each forward runs entirely inside one lane.host_task(), so it executes on the lane's thread.
/// Forwards of one executor share its scratch buffers: enqueue them on a single lane.
/// @throws ppb::UserError if cfg.work.dtype is not f32 ("the CPU backend computes in f32; use
///         --dtype f32"), if [first, last] is not a valid unit range, if cfg.work's batch,
///         max_context() (P + G) or groups are not positive, or if a layer's heads/head_dim are inconsistent or its rope scaling
///         type is unsupported.
std::unique_ptr<StageExecutor> create_cpu_stage(const model::ModelSpec& m, int first, int last,
                                                const StageConfig& cfg,
                                                std::shared_ptr<cpu::WeightCache> cache = nullptr);

/// Bytes of host memory a CPU stage of units [first, last] allocates for `cfg`, computed the
/// way the constructor sizes its buffers: weights (fp32, a tied lm_head shared when the stage
/// also holds embed), KV cache (2 x groups x batch x max_context x n_kv_heads x head_dim fp32
/// per layer, max_context = cfg.work.max_context() = P + G), and scratch (activations for batch x max_context tokens, the attention block,
/// RoPE tables, the head's logits; at tensor-parallel width t, this rank's shard of each and the
/// t x batch x max_context x hidden floats its group's all-reduce gathers). Pure arithmetic: call it before create_stage to check
/// --memory-limit, including the profile's one-unit stages.
StageBytes cpu_stage_bytes(const model::ModelSpec& m, int first, int last, const StageConfig& cfg);

}  // namespace ppb
