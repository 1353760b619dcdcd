// Attention kernels of the CUDA stage (twins: cpu::attention and cpu::attention_ragged in backend/cpu/cpu_ops.cpp).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace ppb::cuda {
namespace {

constexpr int kDecodeThreads = 256;
constexpr int kMaxHeadDim = 256;          // per-lane K registers: head_dim / 32 <= 8
constexpr size_t kDecodeSmemBytes = 48 * 1024;

struct DecodeParams {
  int tokens, pos0, max_context, n_heads, n_kv_heads, head_dim, window;
  float scale, softcap;
  int chunk, n_splits;
  const int* pos0_dev;  // non-null: pos0 read from the device (a CUDA graph's position)
};

/// Keys attended by the longest row of a call (all rows end at pos0 + tokens - 1 at most).
int max_attended(int pos0, int tokens, int window) {
  const int n = pos0 + tokens;
  return window > 0 ? std::min(window, n) : n;
}

int round_up(int v, int m) { return (v + m - 1) / m * m; }

/// Largest key chunk whose scores fit shared memory beside the group's queries.
int decode_chunk_max(int group, int head_dim) {
  const long floats = static_cast<long>(kDecodeSmemBytes / sizeof(float)) - static_cast<long>(group) * head_dim - 2L * group;
  const long c = floats / group / 32 * 32;
  return static_cast<int>(std::min<long>(c, 512));
}

/// Blocks per SM the decode plan aims for. Each warp streams one K row (256 B) at a time, so
/// the bytes in flight grow with the blocks: at 2 per SM (the first plan) a Llama-3.1-8B layer
/// at B=8, 2,048 keys read its 67 MB of KV in 185 µs on an H200 (7.6% of DRAM peak, Nsight
/// Compute, scripts/gpu_kernels.sh), half the layer's decode time. 8 asks for the most the
/// registers allow (40 per thread x 256 threads: 6 blocks per SM): measured, 141 µs (10% of
/// DRAM peak) and the combine of 16 splits 19 µs (was 8.5), the layer 0.339 -> 0.315 ms. The
/// rest is the kernel's own: 2-byte loads (a lane reads one bf16 of a row per instruction) and
/// one K row per warp at a time; vector loads and several keys per warp in flight are next.
constexpr int kDecodeBlocksPerSm = 8;

/// Chunk size and split count of a decode call over `n` keys: enough blocks to fill the GPU
/// (>= kDecodeBlocksPerSm per SM) when batch x KV heads alone does not. The chunk is sized for `n_chunk` keys
/// (n, or a context bucket's smallest count, so that a grid planned for a bucket still fills
/// the GPU just past the bucket's lower edge); the splits cover all `n`.
void decode_plan(int rows, int n_kv, int group, int head_dim, int n_chunk, int n, int* chunk, int* n_splits) {
  const int cmax = decode_chunk_max(group, head_dim);
  if (cmax < 32) {
    throw UserError("decode attention: a GQA group of " + std::to_string(group) + " heads of dim " +
                    std::to_string(head_dim) + " does not fit the kernel's 48 KiB of shared memory");
  }
  const int base = std::max(1, rows * n_kv);
  const int wanted = std::max(1, (kDecodeBlocksPerSm * sm_count() + base - 1) / base);
  int c = round_up(std::max(1, (n_chunk + wanted - 1) / wanted), 32);
  c = std::clamp(c, 32, cmax);
  *chunk = c;
  *n_splits = std::max(1, (n + c - 1) / c);
}

}  // namespace

/// Writes the empty partial (m = -inf, l = 0: the merge skips it) of query row r's heads of KV
/// head g for key chunk `split`.
__device__ __forceinline__ void empty_partial(float* m_part, float* l_part, const DecodeParams& p, int split, int g,
                                              int r) {
  const int group = p.n_heads / p.n_kv_heads;
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    const size_t i = (static_cast<size_t>(r) * p.n_heads + g * group + j) * p.n_splits + split;
    m_part[i] = -INFINITY;
    l_part[i] = 0.0f;
  }
}

/// The body of both decode kernels: the partial softmax and P V of query row r (q and the
/// partials' row; its `group` heads of KV head g), at position pos over cache sequence b, for
/// key chunk `split`.
template <typename T>
__device__ __forceinline__ void decode_chunk(float* o_part, float* m_part, float* l_part, const T* q, const T* k_cache,
                                             const T* v_cache, const DecodeParams& p, int split, int g, int r, int b,
                                             int pos) {
  extern __shared__ float smem[];
  const int group = p.n_heads / p.n_kv_heads, hd = p.head_dim;
  float* q_s = smem;                      // [group][hd]
  float* s_s = q_s + group * hd;          // [group][chunk]
  float* ml = s_s + group * p.chunk;      // m [group], l [group]
  const int lo = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int start = lo + split * p.chunk;
  const int len = min(pos + 1, start + p.chunk) - start;
  const int h0 = g * group;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  auto part = [&](int j) { return (static_cast<size_t>(r) * p.n_heads + h0 + j) * p.n_splits + split; };
  if (len <= 0) {  // this row attends to fewer chunks: an empty partial
    empty_partial(m_part, l_part, p, split, g, r);
    return;
  }
  for (int i = threadIdx.x; i < group * hd; i += blockDim.x)
    q_s[i] = to_f32(q[(static_cast<size_t>(r) * p.n_heads + h0) * hd + i]);
  __syncthreads();

  const size_t kv_stride = static_cast<size_t>(p.n_kv_heads) * hd;
  const T* kb = k_cache + (static_cast<size_t>(b) * p.max_context + start) * kv_stride + static_cast<size_t>(g) * hd;
  const T* vb = v_cache + (static_cast<size_t>(b) * p.max_context + start) * kv_stride + static_cast<size_t>(g) * hd;
  for (int kk = warp; kk < len; kk += nwarps) {
    float kreg[kMaxHeadDim / 32];
    const T* krow = kb + kk * kv_stride;
#pragma unroll
    for (int i = 0; i < kMaxHeadDim / 32; ++i) {
      const int d = lane + 32 * i;
      kreg[i] = d < hd ? to_f32(krow[d]) : 0.0f;
    }
    for (int j = 0; j < group; ++j) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxHeadDim / 32; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) dot += q_s[j * hd + d] * kreg[i];
      }
      dot = warp_sum(dot);
      if (lane == 0) {
        float sc = dot * p.scale;
        if (p.softcap > 0.0f) sc = p.softcap * tanhf(sc / p.softcap);
        s_s[j * p.chunk + kk] = sc;
      }
    }
  }
  __syncthreads();

  for (int j = warp; j < group; j += nwarps) {
    float* s = s_s + j * p.chunk;
    float m = -INFINITY;
    for (int kk = lane; kk < len; kk += 32) m = fmaxf(m, s[kk]);
    m = warp_max(m);
    float l = 0.0f;
    for (int kk = lane; kk < len; kk += 32) {
      const float e = __expf(s[kk] - m);
      s[kk] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ml[j] = m;
      ml[group + j] = l;
    }
  }
  __syncthreads();

  for (int o = threadIdx.x; o < group * hd; o += blockDim.x) {
    const int j = o / hd, d = o % hd;
    const float* s = s_s + j * p.chunk;
    float acc = 0.0f;
#pragma unroll 8
    for (int kk = 0; kk < len; ++kk) acc += s[kk] * to_f32(vb[kk * kv_stride + d]);
    o_part[part(j) * hd + d] = acc;
  }
  if (threadIdx.x < group) {
    m_part[part(threadIdx.x)] = ml[threadIdx.x];
    l_part[part(threadIdx.x)] = ml[group + threadIdx.x];
  }
}

// Napkin math (flash-decoding, Dao et al. 2023), Llama-3-8B decode B=8 at context 2048, bf16:
// K and V rows read once per GQA group: 8 seq x 8 KV heads x 2048 x 128 x 2 (K,V) x 2 B =
// 67 MB per layer, 14 µs at 4.8 TB/s; FLOPs 4 x 32 heads x 128 x 2048 x 8 = 0.27 GFLOP:
// bandwidth-bound by ~100x. One block per (key chunk, KV head, query row) so that even B=1
// has >= kDecodeBlocksPerSm blocks per SM in flight; a warp per key computes the group's dot products (the K
// row is loaded once into registers), partial softmax per head, then each thread owns one
// (head, dim) output and streams the chunk's V column (coalesced across the warp).
template <typename T>
__global__ void __launch_bounds__(kDecodeThreads) attention_decode_kernel(float* o_part, float* m_part, float* l_part,
                                                                           const T* q, const T* k_cache,
                                                                           const T* v_cache, DecodeParams p) {
  const int r = blockIdx.z;
  const int b = r / p.tokens, t = r % p.tokens, pos = (p.pos0_dev ? *p.pos0_dev : p.pos0) + t;
  decode_chunk<T>(o_part, m_part, l_part, q, k_cache, v_cache, p, blockIdx.x, blockIdx.y, r, b, pos);
}

// Napkin math: reads n_splits x (head_dim + 2) floats per (row, head): B=8 x 32 heads x 8
// splits x 130 x 4 B = 1 MiB, ~1 µs: negligible beside the 67 MB the partials came from.
// sinks (gpt-oss; null = none): the head's sink logit joins the max and the denominator once,
// here, and attends to no value.
template <typename T>
__global__ void attention_combine_kernel(T* out, const float* o_part, const float* m_part, const float* l_part,
                                         int head_dim, int n_splits, const float* sinks, int n_heads) {
  const size_t rh = blockIdx.x;  // row * n_heads + head
  const float* m = m_part + rh * n_splits;
  const float* l = l_part + rh * n_splits;
  float mx = -INFINITY;
  for (int s = 0; s < n_splits; ++s)
    if (l[s] > 0.0f) mx = fmaxf(mx, m[s]);
  const float sink = sinks ? sinks[rh % n_heads] : 0.0f;
  if (sinks) mx = fmaxf(mx, sink);
  float denom = 0.0f;
  for (int s = 0; s < n_splits; ++s)
    if (l[s] > 0.0f) denom += l[s] * __expf(m[s] - mx);
  if (sinks) denom += __expf(sink - mx);
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n_splits; ++s)
      if (l[s] > 0.0f) acc += o_part[(rh * n_splits + s) * head_dim + d] * __expf(m[s] - mx);
    out[rh * head_dim + d] = from_f32<T>(acc * inv);
  }
}

size_t attention_decode_scratch_floats(const cpu::AttentionShape& s) {
  const int group = s.n_heads / s.n_kv_heads;
  const int rows = s.batch * s.tokens;
  const int n_max = s.window > 0 ? std::min(s.window, s.max_context) : s.max_context;
  const int cmax = std::max(32, decode_chunk_max(group, s.head_dim));
  const int wanted =
      std::max(1, (kDecodeBlocksPerSm * sm_count() + rows * s.n_kv_heads - 1) / std::max(1, rows * s.n_kv_heads));
  // decode_plan's splits: <= 2 wanted while the chunk follows n_chunk >= n / 2 (a bucket's
  // smallest count), else the keys over the largest chunk.
  const int splits = std::max(2 * wanted + 1, (n_max + cmax - 1) / cmax + 1);
  return static_cast<size_t>(rows) * s.n_heads * splits * (s.head_dim + 2);
}

void attention_decode(void* out, const void* q, const void* k_cache, const void* v_cache, const cpu::AttentionShape& s,
                      float* partial, DType t, cudaStream_t stream, int plan_keys, const int* pos0_dev) {
  const int rows = s.batch * s.tokens;
  if (rows == 0) return;
  if (s.head_dim > kMaxHeadDim) {
    throw UserError("decode attention supports head_dim <= " + std::to_string(kMaxHeadDim) + ", got " +
                    std::to_string(s.head_dim));
  }
  const int group = s.n_heads / s.n_kv_heads;
  DecodeParams p{s.tokens,  s.pos0,    s.max_context, s.n_heads, s.n_kv_heads, s.head_dim,
                 s.window,  s.scale,   s.softcap,     0,         0,            pos0_dev};
  const int attended = max_attended(s.pos0, s.tokens, s.window);
  const int cache_keys = s.window > 0 ? std::min(s.window, s.max_context) : s.max_context;
  if (plan_keys > 0 && (plan_keys < attended || plan_keys > cache_keys)) {
    throw InternalError("attention_decode: planned for " + std::to_string(plan_keys) + " keys, but the call attends " +
                        std::to_string(attended) + " of a cache of " + std::to_string(cache_keys));
  }
  // A bucket of plan_keys starts just above plan_keys / 2 keys: chunks for that many.
  const int n_keys = plan_keys > 0 ? plan_keys : attended;
  const int n_chunk = plan_keys > 0 ? plan_keys / 2 + 1 : attended;
  decode_plan(rows, s.n_kv_heads, group, s.head_dim, n_chunk, n_keys, &p.chunk, &p.n_splits);
  const size_t parts = static_cast<size_t>(rows) * s.n_heads * p.n_splits;
  if (parts * (s.head_dim + 2) > attention_decode_scratch_floats(s))
    throw InternalError("attention_decode: scratch too small for " + std::to_string(p.n_splits) + " splits");
  float* o_part = partial;
  float* m_part = o_part + parts * s.head_dim;
  float* l_part = m_part + parts;
  const size_t smem = (static_cast<size_t>(group) * s.head_dim + static_cast<size_t>(group) * p.chunk + 2 * group) * sizeof(float);
  const dim3 grid(p.n_splits, s.n_kv_heads, rows);
  PPB_DISPATCH_DTYPE(t, T, {
    attention_decode_kernel<T><<<grid, kDecodeThreads, smem, stream>>>(o_part, m_part, l_part, static_cast<const T*>(q),
                                                                      static_cast<const T*>(k_cache),
                                                                      static_cast<const T*>(v_cache), p);
    CUDA_CHECK(cudaGetLastError());
    attention_combine_kernel<T><<<static_cast<unsigned>(rows * s.n_heads), 128, 0, stream>>>(
        static_cast<T*>(out), o_part, m_part, l_part, s.head_dim, p.n_splits, s.sinks, s.n_heads);
  });
  CUDA_CHECK(cudaGetLastError());
}

// ---- ragged batches (continuous batching, issue 37) ----------------------------------------

namespace {

/// The device view of a cpu::RaggedBatch, with what the kernel checks it against.
struct RaggedParams {
  const int32_t* slot;
  const int32_t* pos;
  const int32_t* offset;
  int rows, n_slots;
  int* bad;  // set to 1 where a row is outside the cache or the plan; null = not reported
};

/// Chunk and split count of a ragged call: decode_plan over `tokens` query rows, every row's
/// keys within plan_keys (so the chunks are sized for the longest row; shorter rows' blocks
/// past their last key write empty partials, as a bucket's do).
void ragged_plan(const cpu::AttentionShape& s, int tokens, int plan_keys, int* chunk, int* n_splits) {
  decode_plan(tokens, s.n_kv_heads, s.n_heads / s.n_kv_heads, s.head_dim, plan_keys, plan_keys, chunk, n_splits);
}

}  // namespace

// Napkin math: a decode row costs what attention_decode's row costs (its slot's K/V rows read
// once per KV head and chunk: bandwidth-bound, 14 µs for Llama-3-8B's 67 MB at B=8, ctx 2048).
// A prefill row of n tokens is n query rows here, each reading its own keys: n x (keys) K/V
// rows per KV head instead of the tensor-core path's once per query block of attention_prefill,
// e.g. a 512-token prompt at hd 128, 8 KV heads, bf16: 512 x 256 avg keys x 8 x 128 x 4 B =
// 0.5 GB, ~0.1 ms at 4.8 TB/s, against ~4 MB for attention_prefill. Fine for the chunked
// prefills and decode-heavy steps of a serving step; a long prompt is better sent to
// attention_prefill (batch 1 at its slot). Launch geometry: one 256-thread block per (key
// chunk, KV head, packed query token): grid (n_splits, n_kv_heads, tokens), every block
// independent (no serialisation across rows or tokens); the block finds its row by a binary
// search of `offset` (log2(rows) reads, from L1/L2), then runs decode_chunk at its own slot and
// position; attention_combine_kernel merges the splits of each (token, head).
template <typename T>
__global__ void __launch_bounds__(kDecodeThreads) attention_ragged_kernel(float* o_part, float* m_part, float* l_part,
                                                                           const T* q, const T* k_cache,
                                                                           const T* v_cache, DecodeParams p,
                                                                           RaggedParams rb) {
  const int i = blockIdx.z;  // packed query token
  int r = 0, hi = rb.rows - 1;  // the last row with offset[r] <= i (empty rows before it skipped)
  while (r < hi) {
    const int mid = (r + hi + 1) / 2;
    if (rb.offset[mid] <= i) r = mid;
    else hi = mid - 1;
  }
  const int slot = rb.slot[r], pos0 = rb.pos[r], n = rb.offset[r + 1] - rb.offset[r];
  const int pos = pos0 + (i - rb.offset[r]);
  const int keys = p.window > 0 ? min(p.window, pos + 1) : pos + 1;
  const bool ok = i < rb.offset[r + 1] && slot >= 0 && slot < rb.n_slots && pos0 >= 0 && n >= 0 &&
                  pos0 + n <= p.max_context && keys <= p.chunk * p.n_splits;
  if (!ok) {  // the token's output is left as zeros (the merge of empty partials), reported in *bad
    empty_partial(m_part, l_part, p, blockIdx.x, blockIdx.y, i);
    if (rb.bad != nullptr && threadIdx.x == 0) atomicExch(rb.bad, 1);
    return;
  }
  decode_chunk<T>(o_part, m_part, l_part, q, k_cache, v_cache, p, blockIdx.x, blockIdx.y, i, slot, pos);
}

size_t attention_ragged_scratch_floats(const cpu::AttentionShape& s, int tokens, int plan_keys) {
  if (tokens <= 0 || plan_keys <= 0) return 0;
  int chunk = 0, n_splits = 0;
  ragged_plan(s, tokens, plan_keys, &chunk, &n_splits);
  return static_cast<size_t>(tokens) * s.n_heads * n_splits * (s.head_dim + 2);
}

void attention_ragged(void* out, const void* q, const void* k_cache, const void* v_cache, const cpu::AttentionShape& s,
                      const cpu::RaggedBatch& rb, int tokens, int plan_keys, float* partial, int* bad, DType t,
                      cudaStream_t stream) {
  if (tokens == 0) return;
  if (s.head_dim > kMaxHeadDim) {
    throw UserError("ragged attention supports head_dim <= " + std::to_string(kMaxHeadDim) + ", got " +
                    std::to_string(s.head_dim));
  }
  const int cache_keys = s.window > 0 ? std::min(s.window, s.max_context) : s.max_context;
  if (tokens < 0 || tokens > 65535 || rb.rows <= 0 || plan_keys < 1 || plan_keys > cache_keys) {  // grid.z <= 65535
    throw InternalError("attention_ragged: " + std::to_string(tokens) + " tokens in " + std::to_string(rb.rows) +
                        " rows planned for " + std::to_string(plan_keys) + " keys (the cache holds " +
                        std::to_string(cache_keys) + ")");
  }
  DecodeParams p{1, 0, s.max_context, s.n_heads, s.n_kv_heads, s.head_dim, s.window, s.scale, s.softcap, 0, 0, nullptr};
  ragged_plan(s, tokens, plan_keys, &p.chunk, &p.n_splits);
  const RaggedParams r{rb.slot, rb.pos, rb.offset, rb.rows, s.batch, bad};
  const size_t parts = static_cast<size_t>(tokens) * s.n_heads * p.n_splits;
  float* o_part = partial;
  float* m_part = o_part + parts * s.head_dim;
  float* l_part = m_part + parts;
  const int group = s.n_heads / s.n_kv_heads;
  const size_t smem = (static_cast<size_t>(group) * s.head_dim + static_cast<size_t>(group) * p.chunk + 2 * group) * sizeof(float);
  const dim3 grid(p.n_splits, s.n_kv_heads, tokens);
  PPB_DISPATCH_DTYPE(t, T, {
    attention_ragged_kernel<T><<<grid, kDecodeThreads, smem, stream>>>(o_part, m_part, l_part, static_cast<const T*>(q),
                                                                      static_cast<const T*>(k_cache),
                                                                      static_cast<const T*>(v_cache), p, r);
    CUDA_CHECK(cudaGetLastError());
    attention_combine_kernel<T><<<static_cast<unsigned>(tokens * s.n_heads), 128, 0, stream>>>(
        static_cast<T*>(out), o_part, m_part, l_part, s.head_dim, p.n_splits, s.sinks, s.n_heads);
  });
  CUDA_CHECK(cudaGetLastError());
}

// ---- prefill ----------------------------------------------------------------------------------

// Napkin math (the softmax between the two batched GEMMs): per query block, n_heads x rows x
// keys fp32 scores read twice and probabilities (2 B) written once: Llama-3-8B prefill of 2048
// tokens in blocks of 512 averages 32 x 512 x 1280 x 10 B = 210 MB per block, 4 blocks
// ~0.17 ms at 4.8 TB/s, beside 4 x 2 x 2048^2/2 x 128 x 32 = 69 GFLOP of tensor-core GEMMs
// (~0.1 ms). A fused flash-attention kernel would save the score traffic (~10% of the layer).
// sinks (gpt-oss; null = none): the row's head's sink logit joins the max and the sum.
template <typename T>
__global__ void prefill_softmax_kernel(T* probs, float* scores, int rows_per_head, int n, int ld, int p_first,
                                       int k_begin, int window, float softcap, const float* sinks) {
  __shared__ float red[32];
  const size_t row = blockIdx.x;  // head * rows_per_head + r
  const int r = static_cast<int>(row % rows_per_head);
  const int p = p_first + r;
  const int lo = (window > 0 ? max(0, p - window + 1) : 0) - k_begin;
  const int hi = p - k_begin;  // inclusive, < n
  float* s = scores + row * ld;
  T* out = probs + row * ld;
  float m = -INFINITY;
  for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) {
    float v = s[j];
    if (softcap > 0.0f) {
      v = softcap * tanhf(v / softcap);
      s[j] = v;
    }
    m = fmaxf(m, v);
  }
  m = warp_max(m);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = (threadIdx.x & 31) < static_cast<int>(blockDim.x >> 5) ? red[threadIdx.x & 31] : -INFINITY;
  m = warp_max(m);
  const float sink = sinks ? sinks[row / rows_per_head] : 0.0f;
  if (sinks) m = fmaxf(m, sink);
  float sum = 0.0f;
  for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) sum += __expf(s[j] - m);
  sum = block_sum(sum, red);
  if (sinks) sum += __expf(sink - m);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < ld; j += blockDim.x)
    out[j] = from_f32<T>(j >= lo && j <= hi ? __expf(s[j] - m) * inv : 0.0f);
  (void)n;
}

size_t attention_prefill_scratch_elems(const cpu::AttentionShape& s, int query_block) {
  const int keys = s.window > 0 ? std::min(s.max_context, query_block + s.window - 1) : s.max_context;
  return static_cast<size_t>(query_block) * s.n_heads * round_up(keys, 8);
}

void attention_prefill(cublasHandle_t handle, void* out, const void* q, const void* k_cache, const void* v_cache,
                       const cpu::AttentionShape& s, int query_block, float* scores, void* probs, DType t,
                       cudaStream_t stream) {
  const int T_ = s.tokens, hd = s.head_dim, nh = s.n_heads, nkv = s.n_kv_heads, group = nh / nkv;
  const cudaDataType_t ct = cuda_type(t);
  const size_t es = static_cast<size_t>(dtype_bytes(t));
  const long long q_ld = static_cast<long long>(nh) * hd, kv_ld = static_cast<long long>(nkv) * hd;
  const float one = 1.0f, zero = 0.0f;
  const size_t cap = attention_prefill_scratch_elems(s, query_block);
  for (int b = 0; b < s.batch; ++b) {
    const char* kb = static_cast<const char*>(k_cache) + static_cast<size_t>(b) * s.max_context * kv_ld * es;
    const char* vb = static_cast<const char*>(v_cache) + static_cast<size_t>(b) * s.max_context * kv_ld * es;
    for (int t0 = 0; t0 < T_; t0 += query_block) {
      const int tq = std::min(query_block, T_ - t0);
      const int p_first = s.pos0 + t0, p_last = p_first + tq - 1;
      const int k_begin = s.window > 0 ? std::max(0, p_first - s.window + 1) : 0;
      const int n = p_last + 1 - k_begin;
      const int ld = round_up(n, 8);  // 16-byte aligned rows keep cuBLAS on tensor cores
      if (static_cast<size_t>(tq) * nh * ld > cap) throw InternalError("attention_prefill: scratch too small");
      const char* qb = static_cast<const char*>(q) + (static_cast<size_t>(b) * T_ + t0) * q_ld * es;
      char* ob = static_cast<char*>(out) + (static_cast<size_t>(b) * T_ + t0) * q_ld * es;
      const char* kbeg = kb + static_cast<size_t>(k_begin) * kv_ld * es;
      const char* vbeg = vb + static_cast<size_t>(k_begin) * kv_ld * es;
      const long long s_stride = static_cast<long long>(group) * tq * ld;
      // Query head h = g * group + j reads KV head g: one strided batch over g per j.
      for (int j = 0; j < group; ++j) {
        // scores[h] (tq x n, ld) = scale * Q_h K_g^T; column-major: S' (n x tq) = K_g'^T Q_h'.
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_T, CUBLAS_OP_N, n, tq, hd, &s.scale, kbeg, ct, static_cast<int>(kv_ld), hd,
            qb + static_cast<size_t>(j) * hd * es, ct, static_cast<int>(q_ld), static_cast<long long>(group) * hd, &zero,
            scores + static_cast<size_t>(j) * tq * ld, CUDA_R_32F, ld, s_stride, nkv, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
      }
      PPB_DISPATCH_DTYPE(t, Tp,
                         prefill_softmax_kernel<Tp><<<static_cast<unsigned>(nh * tq), 256, 0, stream>>>(
                             static_cast<Tp*>(probs), scores, tq, n, ld, p_first, k_begin, s.window, s.softcap, s.sinks));
      CUDA_CHECK(cudaGetLastError());
      for (int j = 0; j < group; ++j) {
        // out[h] (tq x hd, ld nh*hd) = P_h V_g; column-major: O' (hd x tq) = V_g' P_h'.
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, hd, tq, n, &one, vbeg, ct, static_cast<int>(kv_ld), hd,
            static_cast<const char*>(probs) + static_cast<size_t>(j) * tq * ld * es, ct, ld, s_stride, &zero,
            ob + static_cast<size_t>(j) * hd * es, ct, static_cast<int>(q_ld), static_cast<long long>(group) * hd, nkv,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
  }
}

}  // namespace ppb::cuda
