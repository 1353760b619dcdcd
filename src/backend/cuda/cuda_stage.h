// The CUDA StageExecutor: units [first, last] of a model on one GPU, in f32, f16 or bf16.
#pragma once

#include <memory>

#include "backend/stage.h"

namespace ppb::model {
struct ModelSpec;
}  // namespace ppb::model

namespace ppb::cuda {

/// Builds units [first, last] (inclusive) of `m` on the current CUDA device.
///
/// Same math as the CPU stage (backend/cpu/cpu_stage.h: HF semantics, weights from
/// weights.h generated on the device, bit-identical before the rounding to cfg.dtype), with the
/// kernels of cuda_ops.h and cuBLAS, activations and KV cache in cfg.dtype, arithmetic and
/// accumulation in fp32. Per layer: fused q|k|v GEMM, one kernel for bias + q/k norm + RoPE +
/// KV-cache write, attention (tokens == 1: flash-decoding kernel; else cuBLAS batched GEMMs
/// around a softmax kernel), o_proj GEMM, residual add fused with the next norm, fused
/// gate|up GEMM, activation, down GEMM. Forwards of more than a scratch's worth of tokens run
/// sequence by sequence in chunks (chunked prefill: earlier chunks are in the KV cache).
///
/// The ragged forward of continuous batching (enqueue_forward_ragged, issue 37;
/// cuda_stage_ragged.cpp) runs the same layer body over a step's packed tokens: per-token
/// positions and slots for RoPE and the cache writes, attention_ragged (a long prompt row:
/// attention_prefill alone), MLA per row; a step that is enqueue_forward's (slots 0..B-1 in
/// order, one pos and token count) runs enqueue_forward's eager launches, hence its bits.
///
/// Everything is enqueued on the lane's stream (a CudaLane); the host never waits. Forwards of
/// one executor share its scratch: enqueue them on a single lane.
/// @throws ppb::UserError for an invalid range/config/shape (the CPU stage's messages), or when
///         the device has too little free memory (naming the stage, the need and the free bytes).
std::unique_ptr<StageExecutor> create_cuda_stage(const model::ModelSpec& m, int first, int last,
                                                 const StageConfig& cfg);

}  // namespace ppb::cuda
