// Multi-head latent attention (DeepSeek-V3 MLA, absorbed form) and the multi-token-prediction
// input of the CUDA stage. Twins: CpuStage::mla_attention and CpuStage::mtp_forward
// (backend/cpu/cpu_stage.cpp), built from cpu::rmsnorm, cpu::rope, cpu::kv_cache_write,
// cpu::sgemm and cpu::attention (n_kv_heads = 1, head_dim D, k_cache == v_cache).
//
// Napkin math below uses DeepSeek-V3's shapes: 128 heads, qk_nope 128, qk_rope R = 64,
// v_head_dim 128, kv_lora_rank L = 512 (D = L + R = 576), bf16, on an H200 (~4.8 TB/s HBM3e,
// ~990 TFLOP/s dense bf16: ridge ~200 FLOP/byte).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace ppb::cuda {
namespace {

int round_up8(int v) { return (v + 7) / 8 * 8; }

/// Max over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. `shared`
/// holds >= 32 values and may be reused by a following block_sum (which syncs first).
__device__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const float m = lane < nwarps ? shared[lane] : -INFINITY;
  return warp_max(m);
}

}  // namespace

// ---- latent KV cache write --------------------------------------------------------------------

// Napkin math: one block per token row; reads the kv_a GEMM output once and writes the latent
// cache row once: 2 x 576 x 2 B = 2.3 KiB per token (prefill of 4096 tokens: 9.4 MB, ~2 µs;
// decode is launch-bound). ~5 FLOPs per value. Fuses the twin's three passes (norm, rope,
// cache copy). The sum of squares is fp32 (the CPU twin's is double: part of the tolerance).
template <typename T>
__global__ void mla_kv_cache_write_kernel(T* cache, const T* kva, const T* w, const float* cos_t, const float* sin_t,
                                          MlaCallShape s) {
  __shared__ float red[32];
  const int L = s.kv_lora_rank, R = s.qk_rope, D = L + R, half = R / 2;
  const size_t row = blockIdx.x;  // b * tokens + t
  const bool ragged = s.token_pos != nullptr && s.token_slot != nullptr;
  const int b = ragged ? s.token_slot[row] : static_cast<int>(row / s.tokens);
  const int p = ragged ? s.token_pos[row] : (s.pos0_dev ? *s.pos0_dev : s.pos0) + static_cast<int>(row % s.tokens);
  const T* x = kva + row * D;
  T* dst = cache + (static_cast<size_t>(b) * s.max_context + p) * D;
  rmsnorm_row(dst, x, w, L, s.eps, /*plus_one=*/false, red);
  // RoPE of k_rope (qkv_rope_cache_kernel's / cpu::rope's pairing: i with i + R/2; tables [pos, R/2]).
  const float* c = cos_t + static_cast<size_t>(p) * half;
  const float* sn = sin_t + static_cast<size_t>(p) * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float x1 = to_f32(x[L + i]), x2 = to_f32(x[L + i + half]);
    dst[L + i] = from_f32<T>(x1 * c[i] - x2 * sn[i]);
    dst[L + i + half] = from_f32<T>(x2 * c[i] + x1 * sn[i]);
  }
}

void mla_kv_cache_write(void* cache, const void* kva, const void* kv_norm, const float* cos_table,
                        const float* sin_table, const MlaCallShape& s, DType t, cudaStream_t stream) {
  const size_t rows = static_cast<size_t>(s.batch) * s.tokens;
  if (rows == 0) return;
  if (rows > 0x7fffffffu) throw InternalError("mla_kv_cache_write: too many rows");
  const int block = norm_block(s.kv_lora_rank);
  PPB_DISPATCH_DTYPE(t, T,
                     mla_kv_cache_write_kernel<T><<<static_cast<unsigned>(rows), block, 0, stream>>>(
                         static_cast<T*>(cache), static_cast<const T*>(kva), static_cast<const T*>(kv_norm), cos_table,
                         sin_table, s));
  CUDA_CHECK(cudaGetLastError());
}

// ---- absorbed queries -------------------------------------------------------------------------

// Napkin math (the rope part; the q_nope . W_UK part is the GEMM below): per token 128 heads x
// 64 values read and written, 2 B each: 32 KiB per token, prefill 4096 tokens 134 MB, ~28 µs;
// decode launch-bound. One thread per rotated pair.
template <typename T>
__global__ void mla_query_rope_kernel(T* qa, const T* q, const float* cos_t, const float* sin_t, size_t n, int tokens,
                                      int nh, int nope, int R, int L, int pos0, const int* pos0_dev,
                                      const int32_t* token_pos) {
  const int half = R / 2, qk = nope + R, D = L + R;
  const int base = pos0_dev ? *pos0_dev : pos0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int k = static_cast<int>(i % half);
    const size_t mh = i / half;  // m * nh + h
    const int p = token_pos ? token_pos[mh / nh] : base + static_cast<int>((mh / nh) % tokens);
    const T* src = q + mh * qk + nope;
    T* dst = qa + mh * D + L;
    const float x1 = to_f32(src[k]), x2 = to_f32(src[k + half]);
    const float c = cos_t[static_cast<size_t>(p) * half + k], sn = sin_t[static_cast<size_t>(p) * half + k];
    dst[k] = from_f32<T>(x1 * c - x2 * sn);
    dst[k + half] = from_f32<T>(x2 * c + x1 * sn);
  }
}

// Napkin math: the absorption GEMM is 2 x M x 128 x 128 x 512 = 16.8 MFLOP per token and
// reads W_UK (128 x 128 x 512 x 2 B = 16.8 MB) once: decode (M = 8) is weight-bound, ~3.5 µs;
// prefill of 4096 tokens is 69 GFLOP, compute-bound, ~0.1 ms on tensor cores.
void mla_absorb_queries(cublasHandle_t handle, void* qa, const void* q, const void* kv_b, const float* cos_table,
                        const float* sin_table, const MlaCallShape& s, DType t, cudaStream_t stream) {
  const int M = s.batch * s.tokens;
  if (M == 0) return;
  const int nh = s.n_heads, nope = s.qk_nope, R = s.qk_rope, vd = s.v_head_dim, L = s.kv_lora_rank;
  const int qk = nope + R, D = L + R;
  const cudaDataType_t ct = cuda_type(t);
  const float one = 1.0f, zero = 0.0f;
  // Per head h, row-major C_h[M, L] = A_h[M, nope] . B_h[nope, L] with
  //   C_h = qa + h D (row stride nh D), A_h = q + h qk (row stride nh qk),
  //   B_h = W_UK_h = kv_b + h (nope + v) L (row stride L).
  // Read column-major, a row-major [r, c] matrix of row stride ld is its transpose [c, r] with
  // leading dimension ld, so this is C_h^T[L, M] = B_h^T[L, nope] . A_h^T[nope, M], op N / N:
  //   m = L, n = M, k = nope; A = W_UK_h (lda L, stride (nope + v) L); B = q_h (ldb nh qk,
  //   stride qk); C = qa_h (ldc nh D, stride D); batch nh.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, L, M, nope, &one, kv_b, ct, L,
                                          static_cast<long long>(nope + vd) * L, q, ct, nh * qk,
                                          static_cast<long long>(qk), &zero, qa, ct, nh * D, static_cast<long long>(D),
                                          nh, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (R == 0) return;
  const size_t n = static_cast<size_t>(M) * nh * (R / 2);
  PPB_DISPATCH_DTYPE(t, T,
                     mla_query_rope_kernel<T><<<grid_for(n, 256), 256, 0, stream>>>(
                         static_cast<T*>(qa), static_cast<const T*>(q), cos_table, sin_table, n, s.tokens, nh, nope, R,
                         L, s.pos0, s.pos0_dev, s.token_pos));
  CUDA_CHECK(cudaGetLastError());
}

// ---- attention over the latent cache ----------------------------------------------------------

// Napkin math (the row softmax between the two batched GEMMs): decode B = 8 at context 4096,
// per layer: 8 x 128 heads x 4096 keys fp32 scores written by the GEMM, read twice here, probs
// written (2 B) and read by P.V: 4.2 M x 14 B = 59 MB, ~12 µs, the same order as the latent
// cache itself (8 x 4096 x 576 x 2 B = 38 MB read by each GEMM). FLOPs per sequence
// 2 x 128 x 4096 x (576 + 512) = 1.1 GFLOP against 4.7 MB of cache: ~240 FLOP/byte, at the
// H200's ridge, hence tensor-core GEMMs (MQA: the 128 heads are the GEMM's rows) rather than a
// flash-decoding kernel. A fused kernel would save the score traffic.
// Row r of a sequence's block is (query token r / nh, head r % nh); keys j <= its position.
template <typename T>
__global__ void mla_softmax_kernel(T* probs, const float* scores, int rows_per_seq, int nh, int n, int ld, int t0,
                                   int pos0, const int* pos0_dev) {
  __shared__ float red[32];
  const size_t row = blockIdx.x;  // b * rows_per_seq + r
  const int r = static_cast<int>(row % rows_per_seq);
  const int p = (pos0_dev ? *pos0_dev : pos0) + t0 + r / nh;
  const int hi = min(p, n - 1);  // last attended key (inclusive)
  const float* s = scores + row * ld;
  T* out = probs + row * ld;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= hi; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m, red);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= hi; j += blockDim.x) sum += expf(s[j] - m);
  sum = block_sum(sum, red);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < ld; j += blockDim.x) out[j] = from_f32<T>(j <= hi ? expf(s[j] - m) * inv : 0.0f);
}

size_t mla_attention_scratch_elems(const MlaCallShape& s, int query_block) {
  return static_cast<size_t>(s.batch) * static_cast<size_t>(std::max(query_block, 0)) * s.n_heads *
         static_cast<size_t>(round_up8(s.max_context));
}

void mla_attention(cublasHandle_t handle, void* o_lat, const void* qa, const void* cache, const MlaCallShape& s,
                   int query_block, float* scores, void* probs, DType t, cudaStream_t stream, int plan_keys) {
  const int B = s.batch, T_ = s.tokens, nh = s.n_heads, L = s.kv_lora_rank, D = L + s.qk_rope;
  if (B == 0 || T_ == 0) return;
  if (query_block <= 0) throw InternalError("mla_attention: query_block must be positive");
  const int attended = s.pos0 + T_;
  if (attended > s.max_context) {
    throw InternalError("mla_attention: positions up to " + std::to_string(attended) + " exceed the cache's " +
                        std::to_string(s.max_context));
  }
  if (plan_keys > 0 && (plan_keys < attended || plan_keys > s.max_context)) {
    throw InternalError("mla_attention: planned for " + std::to_string(plan_keys) + " keys, but the call attends " +
                        std::to_string(attended) + " of a cache of " + std::to_string(s.max_context));
  }
  const cudaDataType_t ct = cuda_type(t);
  const size_t es = static_cast<size_t>(dtype_bytes(t));
  const float one = 1.0f, zero = 0.0f;
  const size_t cap = mla_attention_scratch_elems(s, query_block);
  const long long cache_stride = static_cast<long long>(s.max_context) * D;  // per sequence
  const long long qa_stride = static_cast<long long>(T_) * nh * D;           // per sequence
  const long long o_stride = static_cast<long long>(T_) * nh * L;
  for (int t0 = 0; t0 < T_; t0 += query_block) {
    const int tq = std::min(query_block, T_ - t0);
    const int rows = tq * nh;  // per sequence: rows (token, head) of qa, contiguous
    const int keys = plan_keys > 0 ? plan_keys : s.pos0 + t0 + tq;
    const int ld = round_up8(keys);  // 16-byte aligned rows keep cuBLAS on tensor cores
    const long long s_stride = static_cast<long long>(rows) * ld;
    if (static_cast<size_t>(B) * static_cast<size_t>(s_stride) > cap)
      throw InternalError("mla_attention: scratch too small");
    const char* qb = static_cast<const char*>(qa) + static_cast<size_t>(t0) * nh * D * es;
    char* ob = static_cast<char*>(o_lat) + static_cast<size_t>(t0) * nh * L * es;
    // Per sequence b, row-major S_b[rows, keys] (row stride ld) = scale Q_b[rows, D] . K_b[keys, D]^T,
    // Q_b = qa rows of b's block (stride D), K_b = cache[b, 0:keys, :] (stride D). Column-major:
    // S_b^T[keys, rows] (ld ld) = op_T(K_b as [D, keys], ld D) . Q_b as [D, rows] (ld D):
    //   m = keys, n = rows, k = D; A = K_b (lda D, stride max_context D), op T; B = Q_b (ldb D,
    //   stride tokens nh D), op N; C = scores (ldc ld, stride rows ld); batch B.
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, keys, rows, D, &s.scale, cache, ct, D,
                                            cache_stride, qb, ct, D, qa_stride, &zero, scores, CUDA_R_32F, ld,
                                            s_stride, B, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    PPB_DISPATCH_DTYPE(t, Tp,
                       mla_softmax_kernel<Tp><<<static_cast<unsigned>(static_cast<size_t>(B) * rows), 256, 0, stream>>>(
                           static_cast<Tp*>(probs), scores, rows, nh, keys, ld, t0, s.pos0, s.pos0_dev));
    CUDA_CHECK(cudaGetLastError());
    // Row-major O_b[rows, L] (row stride L) = P_b[rows, keys] (stride ld) . V_b[keys, L], V_b =
    // cache[b, 0:keys, 0:L] (row stride D). Column-major: O_b^T[L, rows] (ldc L) =
    // V_b as [L, keys] (lda D) . P_b as [keys, rows] (ldb ld), op N / N:
    //   m = L, n = rows, k = keys; A = cache_b (lda D, stride max_context D); B = probs (ldb ld,
    //   stride rows ld); C = o_lat of b's block (ldc L, stride tokens nh L); batch B.
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, L, rows, keys, &one, cache, ct, D,
                                            cache_stride, probs, ct, ld, s_stride, &zero, ob, ct, L, o_stride, B,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// ---- values -------------------------------------------------------------------------------------

// Napkin math: 2 x M x 128 x 512 x 128 = 16.8 MFLOP per token; W_UV (16.8 MB) read once:
// decode weight-bound (~3.5 µs), prefill compute-bound (4096 tokens: 69 GFLOP, ~0.1 ms).
void mla_values(cublasHandle_t handle, void* values, const void* o_lat, const void* kv_b, const MlaCallShape& s, DType t,
                cudaStream_t stream) {
  const int M = s.batch * s.tokens;
  if (M == 0) return;
  const int nh = s.n_heads, nope = s.qk_nope, vd = s.v_head_dim, L = s.kv_lora_rank;
  const cudaDataType_t ct = cuda_type(t);
  const size_t es = static_cast<size_t>(dtype_bytes(t));
  const float one = 1.0f, zero = 0.0f;
  // Per head h, row-major C_h[M, v] = A_h[M, L] . W_UV_h[v, L]^T with C_h = values + h v (row
  // stride nh v), A_h = o_lat + h L (row stride nh L), W_UV_h = kv_b + (h (nope + v) + nope) L
  // (row stride L). Column-major: C_h^T[v, M] = op_T(W_UV_h as [L, v], ld L) . A_h as [L, M]:
  //   m = v, n = M, k = L; A = W_UV_h (lda L, stride (nope + v) L), op T; B = o_lat_h (ldb nh L,
  //   stride L), op N; C = values_h (ldc nh v, stride v); batch nh (cpu::linear's mapping).
  const char* w = static_cast<const char*>(kv_b) + static_cast<size_t>(nope) * L * es;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, vd, M, L, &one, w, ct, L,
                                          static_cast<long long>(nope + vd) * L, o_lat, ct, nh * L,
                                          static_cast<long long>(L), &zero, values, ct, nh * vd,
                                          static_cast<long long>(vd), nh, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  (void)stream;  // the GEMM runs on the handle's stream (the caller's `stream`)
}

// ---- MTP input -------------------------------------------------------------------

// Napkin math: per token row, H values of the draft's embedding row and H of the hidden state
// read, 2H written (2 B each): DeepSeek-V3 H = 7168, 57 KiB per token; decode B = 8 is
// launch-bound, prefill of 4096 tokens 235 MB, ~50 µs. One block per (row, half).
template <typename T>
__global__ void mtp_concat_kernel(T* cat, const int32_t* draft, const T* embed, const T* x, const T* enorm,
                                  const T* hnorm, int tokens, int hidden, float eps, const int32_t* token_row) {
  __shared__ float red[32];
  const size_t m = blockIdx.x;
  const bool second = blockIdx.y == 1;
  const int row = token_row ? token_row[m] : static_cast<int>(m / tokens);
  const T* src = second ? x + m * hidden : embed + static_cast<size_t>(draft[row]) * hidden;
  const T* w = second ? hnorm : enorm;
  T* dst = cat + m * 2 * hidden + (second ? hidden : 0);
  rmsnorm_row(dst, src, w, hidden, eps, /*plus_one=*/false, red);
}

void mtp_concat(void* cat, const int32_t* draft, const void* embed, const void* x, const void* enorm,
                const void* hnorm, int batch, int tokens, int hidden, float eps, DType t, cudaStream_t stream,
                const int32_t* token_row) {
  const size_t rows = static_cast<size_t>(batch) * tokens;
  if (rows == 0) return;
  if (rows > 0x7fffffffu) throw InternalError("mtp_concat: too many rows");
  const dim3 grid(static_cast<unsigned>(rows), 2);
  PPB_DISPATCH_DTYPE(t, T,
                     mtp_concat_kernel<T><<<grid, norm_block(hidden), 0, stream>>>(
                         static_cast<T*>(cat), draft, static_cast<const T*>(embed), static_cast<const T*>(x),
                         static_cast<const T*>(enorm), static_cast<const T*>(hnorm), tokens, hidden, eps, token_row));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ppb::cuda
