// Context buckets of the CUDA stage's decode forwards (issue 17, item 8).
//
// A small model's decode step is host-bound: a Qwen3-0.6B layer issues ~11 launches of a few µs
// each against ~25–35 µs of GPU work. vLLM and TensorRT-LLM capture decode steps in CUDA graphs
// and replay them, one launch per step. A graph fixes every kernel's grid and parameters, but a
// decode step's attention grows with the KV cache. As those engines do, the stage plans decode
// attention per context bucket, not per position: one grid for every position of a bucket (blocks
// past a row's last key add empty partials), the position read by the kernels from device memory.
// A captured forward then serves every step of its bucket, and the eager path (--no-cuda-graphs)
// plans by the same buckets, so both run the same kernels in the same order, bit for bit.
//
// Host-only (no CUDA): the CPU tests check the bucket arithmetic.
#pragma once

#include <algorithm>

namespace ppb {

/// The smallest bucket: attention planned for at least this many keys.
inline constexpr int kMinDecodeBucket = 64;

/// Attended keys a decode forward at position `pos` (0-based: the KV cache holds pos + 1 keys
/// after it) is planned for: the smallest power of two >= pos + 1, at least kMinDecodeBucket,
/// at most `max_context` (the cache's capacity, which bounds every position). Buckets are
/// [1, 64], (64, 128], (128, 256], ... up to max_context: log2(max_context / 64) + 1 of them at
/// most, so a stage captures at most groups x that many decode graphs.
/// Requires 0 <= pos < max_context.
inline int decode_context_bucket(int pos, int max_context) {
  const long need = static_cast<long>(pos) + 1;
  long b = kMinDecodeBucket;
  while (b < need) b *= 2;
  return static_cast<int>(std::min<long>(b, max_context));
}

/// Keys a layer's decode attention is planned for in bucket `bucket`: the bucket, or the
/// layer's sliding window where that is smaller (window <= 0: full attention). Always >= the
/// keys any position of the bucket attends (min(window, pos + 1)).
inline int decode_plan_keys(int bucket, int window) { return window > 0 ? std::min(window, bucket) : bucket; }

}  // namespace ppb
