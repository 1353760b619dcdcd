// What the CPU stage (cpu_stage.cpp) and its byte plan (cpu_stage_bytes.cpp) share, so that the
// plan sizes the KV cache as the stage allocates it.
#pragma once

#include <cstddef>

#include "model/model_spec.h"

namespace ppb::cpu {

/// KV-cache floats per token of a layer on this rank: K and V rows of its KV heads (`nkv` =
/// n_kv_heads * head_dim of its shard), or MLA's one latent row (kv_lora_rank + qk_rope).
inline size_t layer_cache_floats(const model::LayerShape& s, size_t nkv) {
  return s.is_mla() ? static_cast<size_t>(s.mla.kv_lora_rank + s.mla.qk_rope) : 2 * nkv;
}

}  // namespace ppb::cpu
