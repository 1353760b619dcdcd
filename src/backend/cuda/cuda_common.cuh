// Device-side helpers shared by the kernels: dtype conversion, dtype dispatch, reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/dtype.h"
#include "common/error.h"

namespace ppb::cuda {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/// Runs `body` with `T` bound to the element type of `dtype` (float, __half, __nv_bfloat16).
#define PPB_DISPATCH_DTYPE(dtype, T, ...)                          \
  switch (dtype) {                                                 \
    case ::ppb::DType::f32: {                                      \
      using T = float;                                             \
      __VA_ARGS__;                                                 \
      break;                                                       \
    }                                                              \
    case ::ppb::DType::f16: {                                      \
      using T = __half;                                            \
      __VA_ARGS__;                                                 \
      break;                                                       \
    }                                                              \
    case ::ppb::DType::bf16: {                                     \
      using T = __nv_bfloat16;                                     \
      __VA_ARGS__;                                                 \
      break;                                                       \
    }                                                              \
  }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, <= 1024), in a fixed order: the result is
/// deterministic. Every thread gets the sum. `shared` holds >= 32 values.
template <typename V>
__device__ V block_sum(V v, V* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  V total = lane < nwarps ? shared[lane] : V(0);
  return warp_sum(total);
}

/// dst[j] = src[j] / rms(src) * w[j] (w[j] + 1 where plus_one) for j < dim: cpu::rmsnorm of one
/// row by one block (blockDim.x a multiple of 32), the sum of squares in fp32 (block_sum's fixed
/// order). dst may be src. `shared` holds >= 32 floats. Every thread of the block must call it.
template <typename T>
__device__ void rmsnorm_row(T* dst, const T* src, const T* w, int dim, float eps, bool plus_one, float* shared) {
  float ss = 0.0f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    const float v = to_f32(src[j]);
    ss += v * v;
  }
  ss = block_sum(ss, shared);  // every thread has read its values before any writes (in place)
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    const float g = plus_one ? 1.0f + to_f32(w[j]) : to_f32(w[j]);
    dst[j] = from_f32<T>(to_f32(src[j]) * inv * g);
  }
}

/// Threads per block of a row kernel (RMSNorm and its fusions) over rows of `dim` values.
inline int norm_block(int dim) { return dim >= 2048 ? 512 : (dim >= 512 ? 256 : 128); }

/// Grid size for a grid-stride loop over n elements.
inline unsigned grid_for(size_t n, int block, unsigned cap = 65535u * 8u) {
  const size_t g = (n + static_cast<size_t>(block) - 1) / static_cast<size_t>(block);
  return static_cast<unsigned>(g == 0 ? 1 : (g < cap ? g : cap));
}

}  // namespace ppb::cuda
