// The CUDA kernels of a decoder-only transformer forward: host launchers, one per kernel.
//
// Each launcher is the GPU twin of a ppb::cpu op (backend/cpu/cpu_ops.h) with the same shapes
// and semantics, for activations in f32, f16 or bf16 (`t`) with fp32 arithmetic inside; the
// napkin math (bytes, FLOPs, floor) sits above each kernel in the .cu files. Every launcher
// enqueues on `stream`, checks the launch (CUDA_CHECK(cudaGetLastError())) and returns at once.
// Layouts are the CPU twins' (row-major; a token row of heads is [n_heads, head_dim]).
//
// tests/unit/test_cuda_kernels.cpp runs each launcher against its twin on random data.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>

#include "backend/cpu/cpu_ops.h"
#include "backend/dtype.h"
#include "model/model_spec.h"

namespace ppb::cuda {

/// The cudaDataType of a DType (CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF).
cudaDataType_t cuda_type(DType t);

// ---- conversions and weights -----------------------------------------------------------------

/// dst[i] = t(src[i]) (round to nearest even); src fp32 device memory, n values.
void convert_from_f32(void* dst, DType t, const float* src, size_t n, cudaStream_t stream);
/// dst[i] = float(src[i]).
void convert_to_f32(float* dst, const void* src, DType t, size_t n, cudaStream_t stream);

/// Weights on the device, identical to weights.h's fill_uniform then a rounding to `t`:
/// dst[i] = t(offset + uniform_at(key, i, scale)) (offset 0, or 1 for a plain RMSNorm weight,
/// the fp32 add of fill_norm). key = weight_key(seed, unit, tensor).
void fill_uniform(void* dst, DType t, size_t n, uint64_t key, float scale, float offset, cudaStream_t stream);

/// Columns [col0, col0 + cols) of every row of the tensor [rows, fan_in] (a row-parallel
/// tensor-parallel shard): dst[r, c] = t(uniform_at(key, r * fan_in + col0 + c, scale)), dst
/// [rows, cols]. Twin: weights.h fill_projection_cols. (A row shard is fill_uniform with its
/// key advanced: key + first * 0x9E3779B97F4A7C15, as weights.cpp's fill_uniform does.)
void fill_uniform_cols(void* dst, DType t, size_t rows, size_t fan_in, size_t col0, size_t cols, uint64_t key,
                       float scale, cudaStream_t stream);

/// The key of element `first` of a tensor: fill_uniform(dst, ..., weight_key_at(key, first), ...)
/// fills elements first, first + 1, ... (weights.cpp's fill_uniform with `first`).
inline uint64_t weight_key_at(uint64_t key, size_t first) { return key + first * 0x9E3779B97F4A7C15ULL; }

// ---- elementwise / row kernels (twins in ppb::cpu) ----------------------------------------

/// cpu::embedding. A token id outside [0, vocab) sets *bad_token = 1 and reads row 0 (the
/// stage reports it after the lane synchronised; a kernel cannot throw).
void embedding(void* out, const int32_t* tokens, size_t n_tokens, const void* table, int vocab, int hidden,
               float scale, int* bad_token, DType t, cudaStream_t stream);

/// cpu::rmsnorm (in place allowed).
void rmsnorm(void* out, const void* x, const void* w, size_t rows, int dim, float eps, bool plus_one, DType t,
             cudaStream_t stream);

/// cpu::add_inplace(x, y) then cpu::rmsnorm(out, x, w): the residual add fused with the next
/// norm. x [rows, dim] is updated in place; out may alias y (each element is read and written by
/// one thread), not x.
void add_rmsnorm(void* x, const void* y, void* out, const void* w, size_t rows, int dim, float eps, bool plus_one,
                 DType t, cudaStream_t stream);

/// cpu::add_inplace.
void add_inplace(void* x, const void* y, size_t n, DType t, cudaStream_t stream);

/// cpu::gated_activation over the fused gate|up GEMM output: gate_up [rows, 2*inter]
/// (gate = columns [0, inter), up = [inter, 2*inter)) -> out [rows, inter].
void gated_activation(void* out, const void* gate_up, size_t rows, int inter, model::Activation act, DType t,
                      cudaStream_t stream);

/// Shape of the fused q/k/v post-processing.
struct QkvShape {
  int batch = 1;
  int tokens = 1;
  int pos0 = 0;
  int max_context = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  bool qk_norm = false;
  bool plus_one = false;  ///< q/k norm scales by (1 + w)
  float eps = 1e-6f;
  /// Where non-null, the kernel reads pos0 from this device int instead of `pos0`: a forward
  /// captured in a CUDA graph is replayed at every position of its context bucket.
  const int* pos0_dev = nullptr;
};

/// Everything between the fused QKV GEMM and attention, in one pass: per token row and head,
/// + bias (if non-null, [nq + 2 nkv]), q/k RMSNorm over head_dim (if qk_norm), RoPE on q and k
/// (cos/sin fp32 [>= pos0 + tokens, head_dim/2]), q -> q_out, k/v -> the caches at pos0 + t.
/// Twins: cpu::linear's bias, cpu::rmsnorm(rows*heads, head_dim), cpu::rope, cpu::kv_cache_write.
/// qkv [batch*tokens, (n_heads + 2 n_kv_heads) * head_dim] (q | k | v); q_out [batch*tokens,
/// n_heads*head_dim]; caches [batch, max_context, n_kv_heads, head_dim].
void qkv_rope_cache(void* q_out, void* k_cache, void* v_cache, const void* qkv, const void* bias,
                    const void* q_norm, const void* k_norm, const float* cos_table, const float* sin_table,
                    const QkvShape& s, DType t, cudaStream_t stream);

/// cpu::softcap_inplace on fp32 logits.
void softcap_inplace(float* x, size_t n, float cap, cudaStream_t stream);

/// cpu::argmax_rows on fp32 logits (lowest index wins ties; NaN never wins).
void argmax_rows(int32_t* out, const float* logits, int rows, int n, cudaStream_t stream);

/// A (value, token id) pair of the vocabulary-parallel head (tensor parallelism).
struct ArgmaxPair {
  float value;
  int32_t id;
};
/// Per row: this shard's best (logit, id + id_offset) of logits [rows, n] (argmax_rows' order).
void argmax_pairs(ArgmaxPair* out, const float* logits, int rows, int n, int id_offset, cudaStream_t stream);
/// Per row i: the best of pairs[r * rows + i] over the group's r in [0, width) (the larger value,
/// ties to the lower id: tensor_parallel.h's rule, width 1's answer) -> out[i].
void argmax_of_pairs(int32_t* out, const ArgmaxPair* pairs, int width, int rows, cudaStream_t stream);

/// The head's input: last[b, :] = x[b, tokens-1, :] and *checksum += sum of those rows (in
/// double, in a fixed order: deterministic, so a pipelined and a serialized run agree bitwise).
/// x [batch, tokens, hidden]; last [batch, hidden].
void gather_last_rows(void* last, const void* x, int batch, int tokens, int hidden, double* checksum, DType t,
                      cudaStream_t stream);

// ---- matrix products ------------------------------------------------------------------------

/// cpu::linear without bias: y[M, N] = x[M, K] · W[N, K]^T, cublasGemmEx with fp32 accumulate
/// (CUBLAS_COMPUTE_32F: no TF32 for f32). x and W in `t`; y in `y_type` (t, or f32 for logits).
void linear(cublasHandle_t handle, void* y, cudaDataType_t y_type, const void* x, const void* w, DType t, int M,
            int N, int K);

// ---- attention (twin: cpu::attention) ---------------------------------------------------------

/// Decode attention (flash-decoding): the attended keys of each query row are split into
/// chunks, one block per (chunk, KV head, row) computes a partial softmax for the whole GQA
/// group (K/V rows read once per group), a second kernel merges the chunks. Any tokens/pos0;
/// meant for tokens == 1. partial: attention_decode_scratch_floats(s) floats.
///
/// plan_keys > 0 sizes the chunks and the grid for that many attended keys instead of the
/// call's own count (it must be >= that count and <= the cache's; blocks past a row's last key
/// write empty partials the merge skips): a decode forward planned per context bucket
/// (backend/decode_graphs.h) runs the same grid, hence the same summation order, at every
/// position of the bucket, eagerly or replayed from a CUDA graph. pos0_dev, where non-null, is
/// read by the kernel in place of s.pos0 (the graph's position); s.pos0 must still be a position
/// of the bucket (the host checks plan_keys against it).
/// @throws ppb::InternalError if plan_keys is below the call's attended keys or above the cache.
void attention_decode(void* out, const void* q, const void* k_cache, const void* v_cache,
                      const cpu::AttentionShape& s, float* partial, DType t, cudaStream_t stream,
                      int plan_keys = 0, const int* pos0_dev = nullptr);
/// Floats of `partial` attention_decode needs for shape `s`.
size_t attention_decode_scratch_floats(const cpu::AttentionShape& s);

/// Prefill attention on tensor cores: per sequence and block of `query_block` query rows,
/// S = scale Q K^T (cublasGemmStridedBatchedEx over KV heads, fp32 out), a row softmax kernel
/// (softcap, causal + window mask) writing P in `t`, O = P V (batched GEMM). Keys before the
/// block's window and after its last position are skipped. scores: query_block * n_heads *
/// round_up(max attended keys, 8) floats; probs: the same count of `t` values.
void attention_prefill(cublasHandle_t handle, void* out, const void* q, const void* k_cache, const void* v_cache,
                       const cpu::AttentionShape& s, int query_block, float* scores, void* probs, DType t,
                       cudaStream_t stream);
/// Elements of `scores` (and of `probs`) attention_prefill needs.
size_t attention_prefill_scratch_elems(const cpu::AttentionShape& s, int query_block);

/// *dst = value, one thread: sets a CUDA graph's device-side parameter (the decode position)
/// in stream order before the graph is launched.
void set_device_int(int* dst, int value, cudaStream_t stream);

// ---- lanes ----------------------------------------------------------------------------------

/// A one-thread kernel that spins (with __nanosleep) until *counter >= value: the fallback of
/// CudaLane's stream wait where cuStreamWaitValue32 is unavailable. counter: mapped pinned memory.
void launch_wait_counter(const uint32_t* counter, uint32_t value, cudaStream_t stream);

/// Streaming multiprocessors of the current device (cached per device).
int sm_count();

}  // namespace ppb::cuda
