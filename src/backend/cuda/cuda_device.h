// The CUDA device: one GPU per rank, chosen from the node-local rank (DESIGN.md §1).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backend/device.h"
#include "backend/stage.h"

namespace ppb::model {
struct ModelSpec;
}  // namespace ppb::model

namespace ppb {

/// GPUs this process can see (honours CUDA_VISIBLE_DEVICES); 0 when there is no driver, no
/// device, or CUDA fails to initialise. Never throws.
int cuda_visible_device_count();

/// Why no device is visible: the CUDA error text ("no CUDA-capable device is detected", ...),
/// "" when one is. For messages and the tests' GTEST_SKIP.
std::string cuda_unavailable_reason();

/// Creates the CUDA device for node-local rank `local_rank`: device = local_rank % visible
/// devices (under Slurm's one-GPU-per-task binding every rank sees one device, index 0), made
/// current on the calling thread. Stages are f32, f16 or bf16 (fp32 accumulate).
/// @throws ppb::UserError if no device is visible (naming the reason and CUDA_VISIBLE_DEVICES).
std::unique_ptr<Device> create_cuda_device(int local_rank);

/// The CUDA device ordinal behind `device` (for create_nccl_transport).
/// @throws ppb::InternalError if `device` is not a CUDA device.
int cuda_device_ordinal(const Device& device);

/// Bytes of device memory a CUDA stage of units [first, last] allocates for `cfg`: weights,
/// KV cache, and scratch (activations, attention and cuBLAS workspace). Arithmetic on the model
/// and the GPU's SM count (it needs a visible GPU): call it before create_stage to check
/// --memory-limit.
/// @throws ppb::UserError for an invalid unit range or config (as create_stage would).
StageBytes cuda_stage_bytes(const model::ModelSpec& m, int first, int last, const StageConfig& cfg);

/// Upper bound of the launches one forward of `tokens` tokens per sequence makes on a CUDA stage
/// of units [first, last] for `cfg` (StageExecutor::launches_per_forward): arithmetic on the
/// stage's plan (which reads the GPU's SM count). @throws ppb::UserError as cuda_stage_bytes.
size_t cuda_launches_per_forward(const model::ModelSpec& m, int first, int last, const StageConfig& cfg, int tokens);

}  // namespace ppb
