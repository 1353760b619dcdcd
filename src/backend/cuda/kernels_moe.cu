// Mixture-of-experts kernels of the CUDA stage (twins: cpu::route_tokens, CpuStage::moe_mlp):
// the router's choice, the counting sort of the choices by expert with its tile map, the grouped
// expert GEMM over that map, the weighted combine; and the router's / experts' bias add.
// Everything stays on the device (no host synchronisation, no allocation): the launchers run
// inside CUDA graph capture and on held lanes. H200 numbers as kernels_elementwise.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/weights.h"
#include "common/error.h"

namespace ppb::cuda {

namespace {

constexpr int kMaxTopK = kMoeMaxTopK;          // route_tokens keeps choice j in lane j of its warp
constexpr int kRouteMaxExperts = kMoeMaxExperts;  // a lane owns <= 64 experts (one bit each of a uint64)
constexpr int kRouteWarps = 4;
constexpr size_t kSmemLimit = 48 * 1024;  // without cudaFuncSetAttribute (a host call we avoid)

enum class RouteKind : int { softmax = 0, topk_softmax = 1, sigmoid_grouped = 2 };

struct RouteParams {
  int E = 0;
  int k = 0;
  int G = 1;           // groups (sigmoid_grouped), else 1
  int topk_group = 1;
  RouteKind kind = RouteKind::softmax;
  bool norm_topk = false;
  double routed_scaling = 1.0;
};

__device__ __forceinline__ double warp_max_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// cpu::route_tokens' order of a top-k: the larger value first, ties to the lower index; bi < 0
/// is "nothing yet". A strict total order over distinct indices, so any reduction tree (the warp
/// butterfly below) yields the CPU's partial_sort answer, -inf values (masked groups) included.
__device__ __forceinline__ bool route_better(double v, int i, double bv, int bi) {
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// Napkin math: one warp per token row. Per row E fp32 logits read (E = 256: 1 KiB), E double
// exp/sigmoid (+ E log for the skew), k rounds of a warp arg-max over E / 32 values per lane,
// k outputs. The CPU twin's sequential parts are kept sequential in lane 0 so that every
// double is the CPU's: the softmax denominator (E adds) and the skew's hash chain (E mix64,
// ~15 cycles each). E = 256, k = 8: ~10 k cycles per warp, ~5 µs at decode (latency-bound,
// M warps run in parallel); prefill of 4096 rows is 1024 blocks, ~20 µs, vs the expert GEMMs'
// milliseconds.
__global__ void route_tokens_kernel(int32_t* experts, float* weights, const float* logits, int M, RouteParams p,
                                    const float* correction, const double* skew_log_p, uint64_t skew_key) {
  extern __shared__ double route_smem[];  // per warp: score [E], choice [E], group score [G]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int m = blockIdx.x * (blockDim.x >> 5) + warp;
  if (m >= M) return;  // a whole warp; the kernel has no block barrier
  const int E = p.E, k = p.k, G = p.G;
  double* score = route_smem + static_cast<size_t>(warp) * (2 * E + G);
  double* choice = score + E;
  double* gscore = choice + E;
  const float* z = logits + static_cast<size_t>(m) * E;
  const double neg_inf = -INFINITY;

  // 1. The router's scores, in double.
  if (p.kind == RouteKind::softmax) {
    double mx = neg_inf;
    for (int e = lane; e < E; e += 32) mx = fmax(mx, static_cast<double>(z[e]));
    mx = warp_max_d(mx);  // a max is exact in any order
    for (int e = lane; e < E; e += 32) score[e] = exp(static_cast<double>(z[e]) - mx);
    __syncwarp();
    double total = 0.0;
    if (lane == 0)  // the CPU's order: e = 0, 1, ...
      for (int e = 0; e < E; ++e) total += score[e];
    total = __shfl_sync(0xffffffffu, total, 0);
    for (int e = lane; e < E; e += 32) score[e] /= total;
  } else if (p.kind == RouteKind::topk_softmax) {
    for (int e = lane; e < E; e += 32) score[e] = static_cast<double>(z[e]);
  } else {
    for (int e = lane; e < E; e += 32) score[e] = 1.0 / (1.0 + exp(-static_cast<double>(z[e])));
  }
  __syncwarp();

  // 2. The ranking: the skew's Gumbel-top-k sample, the group-limited biased scores, or the scores.
  const double* rank = score;
  if (skew_log_p != nullptr) {
    uint64_t h = skew_key;
    if (lane == 0)  // a chain: sequential by construction
      for (int e = 0; e < E; ++e) {
        const uint64_t bits = __float_as_uint(z[e]);
        h = mix64(h ^ (bits + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(e + 1)));
      }
    h = __shfl_sync(0xffffffffu, h, 0);
    for (int e = lane; e < E; e += 32) {
      const uint64_t r = mix64(h + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(e + 1));
      const double u = (static_cast<double>(r >> 11) + 0.5) * 0x1p-53;  // in (0, 1)
      choice[e] = skew_log_p[e] - log(-log(u));
    }
    rank = choice;
  } else if (p.kind == RouteKind::sigmoid_grouped) {
    for (int e = lane; e < E; e += 32) choice[e] = score[e] + static_cast<double>(correction[e]);
    if (G > 1) {
      __syncwarp();
      const int per = E / G;
      // Each group's score: the sum of its two largest biased scores (with multiplicity: the
      // CPU's running pair gives the same two values in any order).
      for (int g = lane; g < G; g += 32) {
        double a = neg_inf, b = neg_inf;
        for (int e = g * per; e < (g + 1) * per; ++e) {
          const double c = choice[e];
          if (c > a) {
            b = a;
            a = c;
          } else if (c > b) {
            b = c;
          }
        }
        gscore[g] = per >= 2 ? a + b : a;
      }
      __syncwarp();
      // Group g is kept iff fewer than topk_group groups rank before it (ties: lower index).
      for (int g = lane; g < G; g += 32) {
        const double s = gscore[g];
        int before = 0;
        for (int o = 0; o < G; ++o) before += (gscore[o] > s || (gscore[o] == s && o < g)) ? 1 : 0;
        if (before >= p.topk_group)
          for (int e = g * per; e < (g + 1) * per; ++e) choice[e] = neg_inf;
      }
    }
    rank = choice;
  }
  __syncwarp();

  // 3. Top-k: k rounds of a warp arg-max; lane j keeps the j-th choice.
  uint64_t taken = 0;  // bit s: expert lane + 32 s already chosen
  int mine = -1;
  for (int j = 0; j < k; ++j) {
    double bv = 0.0;
    int bi = -1;
    for (int e = lane, s = 0; e < E; e += 32, ++s)
      if (!((taken >> s) & 1u) && route_better(rank[e], e, bv, bi)) {
        bv = rank[e];
        bi = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const double ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && route_better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == (bi & 31)) taken |= uint64_t{1} << (bi >> 5);
    if (lane == j) mine = bi;
  }

  // 4. The weights, by the router's rule; sums in the CPU's order j = 0, 1, ... (every lane
  //    runs the same sequence of adds, so every lane holds the same sum).
  const bool active = lane < k;
  const double s = active ? score[mine] : 0.0;
  double w = 0.0;
  if (p.kind == RouteKind::topk_softmax) {
    const double mx = __shfl_sync(0xffffffffu, s, 0);
    const double ex = active ? exp(s - mx) : 0.0;
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += __shfl_sync(0xffffffffu, ex, j);
    w = ex / sum;
  } else {
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += __shfl_sync(0xffffffffu, s, j);
    if (p.kind == RouteKind::softmax)
      w = p.norm_topk ? s / sum : s;
    else
      w = (p.norm_topk ? s / (sum + 1e-20) : s) * p.routed_scaling;
  }
  if (active) {
    experts[static_cast<size_t>(m) * k + lane] = mine;
    weights[static_cast<size_t>(m) * k + lane] = static_cast<float>(w);
  }
}

/// Exclusive prefix sum of one int per thread over the block (blockDim.x a multiple of 32);
/// *total gets the block's sum. Every thread must call it (it has block barriers).
__device__ int block_exclusive_scan(int v, int* warp_buf, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // warp_buf may still be read by a previous call
  if (lane == 31) warp_buf[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < nwarps ? warp_buf[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    warp_buf[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  *total = warp_buf[nwarps - 1];
  return (warp > 0 ? warp_buf[warp - 1] : 0) + x - v;
}

constexpr int kDispatchThreads = 1024;

// Napkin math: one block (a counting sort needs a global order; ~33 k choices at most:
// prefill 4096 tokens x top-8). Per choice: one int read, two shared atomics, two int writes;
// per expert a scan slot and its tiles. Decode (64 choices): ~3 µs, launch- and latency-bound;
// 33 k choices: ~40 strided iterations of 1024 threads, ~15 µs. The order of rows within an
// expert depends on the atomics' order: free (every row's result is its own; moe_combine reads
// a choice's row through sorted_row).
__global__ void __launch_bounds__(kDispatchThreads)
    moe_dispatch_kernel(MoeDispatch d, const int32_t* experts, int choices, int top_k, int E, int64_t* expert_tokens) {
  extern __shared__ int dispatch_smem[];
  int* count = dispatch_smem;  // [E]
  int* cursor = count + E;     // [E]
  __shared__ int warp_buf[32];
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int e = tid; e < E; e += nt) count[e] = 0;
  __syncthreads();
  // An expert outside [0, E) (route_tokens never writes one) is clamped: a kernel cannot throw,
  // and a wrong count beats a write out of bounds.
  for (int i = tid; i < choices; i += nt) atomicAdd(&count[min(max(experts[i], 0), E - 1)], 1);
  __syncthreads();
  // Thread tid owns experts [e0, e1): their rows and tiles, scanned over the block.
  const int per = (E + nt - 1) / nt;
  const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
  int rows = 0, tiles = 0;
  for (int e = e0; e < e1; ++e) {
    rows += count[e];
    tiles += (count[e] + kMoeTileRows - 1) / kMoeTileRows;
  }
  int total_rows = 0, total_tiles = 0;
  int row = block_exclusive_scan(rows, warp_buf, &total_rows);
  int tile = block_exclusive_scan(tiles, warp_buf, &total_tiles);
  for (int e = e0; e < e1; ++e) {
    const int c = count[e];
    d.counts[e] = c;
    d.offsets[e] = row;
    cursor[e] = row;
    if (expert_tokens != nullptr) expert_tokens[e] += c;
    for (int r = 0; r < c; r += kMoeTileRows, ++tile) {
      d.tile_expert[tile] = e;
      d.tile_row0[tile] = row + r;
      d.tile_rows[tile] = min(kMoeTileRows, c - r);
    }
    row += c;
  }
  if (tid == 0) {
    d.offsets[E] = total_rows;
    *d.n_tiles = total_tiles;
  }
  __syncthreads();  // cursors set
  for (int i = tid; i < choices; i += nt) {
    const int e = min(max(experts[i], 0), E - 1);
    const int pos = atomicAdd(&cursor[e], 1);
    d.sorted_row[i] = pos;
    d.row_token[pos] = i / top_k;
  }
}

constexpr int kGemmN = 64;  // output columns per block
constexpr int kGemmK = 32;  // K per shared-memory chunk
constexpr int kGemmThreads = 256;

// Napkin math: 2 * rows * N * K FLOPs per tile; weights N * K * 2 bytes per tile (bf16).
// Decode (1-2 rows per chosen expert) streams the chosen experts' weights once, the floor:
// DeepSeek-V3's expert is 3 x 2048 x 7168 x 2 B = 88 MB, one token's 8 experts 0.7 GB (~150 µs
// at 4.8 TB/s), B=8 up to 64 experts; this SIMT tile reaches a part of it (64 B segments per
// weight row and chunk). Prefill is compute-bound at fp32 SIMT rate
// (~60 TFLOP/s on an H200, vs ~700 dense bf16 on tensor cores: the price of a simple kernel).
// Each block: one tile (<= 32 rows of one expert) x 64 columns; 256 threads, each 2 rows
// (ty, ty + 16) x 4 columns (tx + 16 j); K in chunks of 32 staged as fp32 in shared memory
// (padded rows: conflict-free reads). Rows past the tile's count are neither computed nor
// written, so a decode tile of 1 row costs one warp's FMAs per chunk.
template <typename T>
__global__ void __launch_bounds__(kGemmThreads)
    moe_grouped_linear_kernel(T* y, const T* x, bool gather, const T* w, const T* bias, MoeDispatch d, int N, int K) {
  const int tile = blockIdx.y;
  if (tile >= *d.n_tiles) return;  // before any weight is read
  const int e = d.tile_expert[tile], row0 = d.tile_row0[tile], rows = d.tile_rows[tile];
  const int n0 = blockIdx.x * kGemmN;
  __shared__ float xs[kMoeTileRows][kGemmK + 1];
  __shared__ float ws[kGemmN][kGemmK + 1];
  __shared__ int src[kMoeTileRows];  // each tile row's x row, -1 past the tile's rows
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  if (tid < kMoeTileRows) src[tid] = tid < rows ? (gather ? d.row_token[row0 + tid] : row0 + tid) : -1;
  const T* we = w + static_cast<size_t>(e) * N * K;
  float acc0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  __syncthreads();
  for (int k0 = 0; k0 < K; k0 += kGemmK) {
    for (int i = tid; i < kMoeTileRows * kGemmK; i += kGemmThreads) {
      const int r = i / kGemmK, kk = i % kGemmK, kx = k0 + kk, s = src[r];
      xs[r][kk] = (s >= 0 && kx < K) ? to_f32(x[static_cast<size_t>(s) * K + kx]) : 0.0f;
    }
    for (int i = tid; i < kGemmN * kGemmK; i += kGemmThreads) {
      const int c = i / kGemmK, kk = i % kGemmK, n = n0 + c, kx = k0 + kk;
      ws[c][kk] = (n < N && kx < K) ? to_f32(we[static_cast<size_t>(n) * K + kx]) : 0.0f;
    }
    __syncthreads();
    if (ty + 16 < rows) {
#pragma unroll 8
      for (int kk = 0; kk < kGemmK; ++kk) {
        const float a0 = xs[ty][kk], a1 = xs[ty + 16][kk];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float b = ws[tx + 16 * j][kk];
          acc0[j] += a0 * b;
          acc1[j] += a1 * b;
        }
      }
    } else if (ty < rows) {
#pragma unroll 8
      for (int kk = 0; kk < kGemmK; ++kk) {
        const float a0 = xs[ty][kk];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc0[j] += a0 * ws[tx + 16 * j][kk];
      }
    }
    __syncthreads();
  }
  const T* be = bias != nullptr ? bias + static_cast<size_t>(e) * N : nullptr;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int n = n0 + tx + 16 * j;
    if (n >= N) continue;
    const float b = be != nullptr ? to_f32(be[n]) : 0.0f;
    if (ty < rows) y[static_cast<size_t>(row0 + ty) * N + n] = from_f32<T>(acc0[j] + b);
    if (ty + 16 < rows) y[static_cast<size_t>(row0 + ty + 16) * N + n] = from_f32<T>(acc1[j] + b);
  }
}

// Napkin math: per output value k reads of y (2 bytes each) and one write: decode B=8 x top-8
// x 7168 = 0.9 MiB, launch-bound; prefill 4096 x 8 x 7168 x 2 B = 470 MiB, ~100 µs. One block
// per token row; thread 0 sorts the row's <= 32 choices by expert (insertion sort, stable) in
// shared memory; each value is the fp32 sum in that order, every product and add rounded as
// the CPU twin's `dst[j] += wt * src[j]` (no FMA contraction), then one rounding to t.
template <typename T>
__global__ void moe_combine_kernel(T* out, const T* y, const float* weights, const int32_t* experts,
                                   const int32_t* sorted_row, int top_k, int H) {
  __shared__ int s_expert[kMaxTopK];
  __shared__ int s_row[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const size_t m = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int j = 0; j < top_k; ++j) {
      const size_t c = m * top_k + j;
      const int ex = experts[c], row = sorted_row[c];
      const float wt = weights[c];
      int i = j;
      for (; i > 0 && s_expert[i - 1] > ex; --i) {
        s_expert[i] = s_expert[i - 1];
        s_row[i] = s_row[i - 1];
        s_w[i] = s_w[i - 1];
      }
      s_expert[i] = ex;
      s_row[i] = row;
      s_w[i] = wt;
    }
  }
  __syncthreads();
  T* o = out + m * H;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j)
      acc = __fadd_rn(acc, __fmul_rn(s_w[j], to_f32(y[static_cast<size_t>(s_row[j]) * H + c])));
    o[c] = from_f32<T>(acc);
  }
}

// Napkin math: rows * n values read and written plus the bias (L1/L2-resident): router logits
// 4096 x 128 x 4 B = 2 MiB, ~1 µs; an expert bias pass is part of the grouped GEMM instead.
template <typename Y, typename T>
__global__ void add_bias_rows_kernel(Y* y, const T* bias, size_t total, int n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = from_f32<Y>(to_f32(y[i]) + to_f32(bias[i % n]));
}

size_t align16(size_t bytes) { return (bytes + 15) & ~static_cast<size_t>(15); }

void check_dispatch_shape(int choices, int n_experts, const char* who) {
  if (choices < 0 || n_experts < 1)
    throw InternalError(std::string(who) + ": need choices >= 0 and n_experts >= 1");
}

}  // namespace

// ---- host launchers -----------------------------------------------------------------------

void route_tokens(int32_t* experts, float* weights, const float* logits, int M, const model::MoeShape& moe,
                  const float* correction, const double* skew_log_p, uint64_t skew_key, cudaStream_t stream) {
  // cpu::route_tokens' checks, then this kernel's own limits.
  cpu::check_route_shape(moe, correction != nullptr);
  const int E = moe.n_experts, k = moe.top_k;
  const bool grouped = moe.router == model::RouterKind::sigmoid_grouped;
  const int G = grouped ? moe.n_group : 1;
  if (k > kMaxTopK || E > kRouteMaxExperts)
    throw InternalError("route_tokens: the CUDA router supports top_k <= " + std::to_string(kMaxTopK) +
                        " and n_experts <= " + std::to_string(kRouteMaxExperts) + " (got " + std::to_string(k) +
                        ", " + std::to_string(E) + ")");
  if (M < 0) throw InternalError("route_tokens: M < 0");
  if (M == 0) return;
  RouteParams p;
  p.E = E;
  p.k = k;
  p.G = G;
  p.topk_group = grouped ? moe.topk_group : 1;
  p.kind = moe.router == model::RouterKind::softmax        ? RouteKind::softmax
           : moe.router == model::RouterKind::topk_softmax ? RouteKind::topk_softmax
                                                           : RouteKind::sigmoid_grouped;
  p.norm_topk = moe.norm_topk;
  p.routed_scaling = moe.routed_scaling;
  const size_t per_warp = static_cast<size_t>(2 * E + G) * sizeof(double);  // <= 48 KiB for E <= 2048
  const int warps = static_cast<int>(std::min<size_t>(kRouteWarps, std::max<size_t>(1, kSmemLimit / per_warp)));
  const unsigned blocks = static_cast<unsigned>((static_cast<size_t>(M) + warps - 1) / warps);
  route_tokens_kernel<<<blocks, warps * 32, warps * per_warp, stream>>>(experts, weights, logits, M, p, correction,
                                                                         skew_log_p, skew_key);
  CUDA_CHECK(cudaGetLastError());
}

size_t moe_dispatch_bytes(int choices, int n_experts) {
  check_dispatch_shape(choices, n_experts, "moe_dispatch_bytes");
  const size_t c = static_cast<size_t>(choices), e = static_cast<size_t>(n_experts);
  const size_t tiles = static_cast<size_t>(moe_max_tiles(choices, n_experts));
  return align16(e * 4) + align16((e + 1) * 4) + 2 * align16(c * 4) + 3 * align16(tiles * 4) + align16(4);
}

MoeDispatch moe_dispatch_at(void* base, int choices, int n_experts) {
  check_dispatch_shape(choices, n_experts, "moe_dispatch_at");
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0)
    throw InternalError("moe_dispatch_at: base must be non-null and 16-byte aligned");
  const size_t c = static_cast<size_t>(choices), e = static_cast<size_t>(n_experts);
  const size_t tiles = static_cast<size_t>(moe_max_tiles(choices, n_experts));
  char* p = static_cast<char*>(base);
  auto take = [&p](size_t ints) {
    int32_t* at = reinterpret_cast<int32_t*>(p);
    p += align16(ints * 4);
    return at;
  };
  MoeDispatch d;
  d.counts = take(e);
  d.offsets = take(e + 1);
  d.sorted_row = take(c);
  d.row_token = take(c);
  d.tile_expert = take(tiles);
  d.tile_row0 = take(tiles);
  d.tile_rows = take(tiles);
  d.n_tiles = take(1);
  return d;
}

void moe_dispatch(const MoeDispatch& d, const int32_t* experts, int M, int top_k, int n_experts,
                  int64_t* expert_tokens, cudaStream_t stream) {
  if (M < 0 || top_k < 1 || n_experts < 1)
    throw InternalError("moe_dispatch: need M >= 0, top_k >= 1, n_experts >= 1");
  const int64_t choices = static_cast<int64_t>(M) * top_k;
  if (choices > std::numeric_limits<int32_t>::max()) throw InternalError("moe_dispatch: too many choices");
  const size_t smem = 2 * static_cast<size_t>(n_experts) * sizeof(int);
  if (smem > kSmemLimit - 1024)  // the static arrays' share
    throw InternalError("moe_dispatch: at most " + std::to_string((kSmemLimit - 1024) / 8) + " experts");
  // Launched for M == 0 as well: counts, offsets and n_tiles become 0 (a grouped GEMM after it
  // then does nothing).
  moe_dispatch_kernel<<<1, kDispatchThreads, smem, stream>>>(d, experts, static_cast<int>(choices), top_k, n_experts,
                                                             expert_tokens);
  CUDA_CHECK(cudaGetLastError());
}

void moe_grouped_linear(void* y, const void* x, bool gather, const void* w, const void* bias, const MoeDispatch& d,
                        int N, int K, int max_tiles, DType t, cudaStream_t stream) {
  if (N < 1 || K < 1 || max_tiles < 0)
    throw InternalError("moe_grouped_linear: need N >= 1, K >= 1, max_tiles >= 0");
  if (max_tiles > 65535) throw InternalError("moe_grouped_linear: more than 65535 tiles (split the call)");
  if (max_tiles == 0) return;
  const dim3 grid(static_cast<unsigned>((N + kGemmN - 1) / kGemmN), static_cast<unsigned>(max_tiles));
  PPB_DISPATCH_DTYPE(t, T,
                     moe_grouped_linear_kernel<T><<<grid, kGemmThreads, 0, stream>>>(
                         static_cast<T*>(y), static_cast<const T*>(x), gather, static_cast<const T*>(w),
                         static_cast<const T*>(bias), d, N, K));
  CUDA_CHECK(cudaGetLastError());
}

void moe_combine(void* out, const void* y, const float* weights, const int32_t* experts, const MoeDispatch& d, int M,
                 int top_k, int H, DType t, cudaStream_t stream) {
  if (M < 0 || H < 1 || top_k < 1 || top_k > kMaxTopK)
    throw InternalError("moe_combine: need M >= 0, H >= 1, 1 <= top_k <= " + std::to_string(kMaxTopK));
  if (M == 0) return;
  const int block = H >= 1024 ? 256 : 128;
  PPB_DISPATCH_DTYPE(t, T,
                     moe_combine_kernel<T><<<static_cast<unsigned>(M), block, 0, stream>>>(
                         static_cast<T*>(out), static_cast<const T*>(y), weights, experts, d.sorted_row, top_k, H));
  CUDA_CHECK(cudaGetLastError());
}

void add_bias_rows(void* y, bool y_f32, const void* bias, size_t rows, int n, DType t, cudaStream_t stream) {
  if (n < 0) throw InternalError("add_bias_rows: n < 0");
  const size_t total = rows * static_cast<size_t>(n);
  if (total == 0) return;
  if (y_f32) {
    PPB_DISPATCH_DTYPE(t, T,
                       add_bias_rows_kernel<float, T><<<grid_for(total, 256), 256, 0, stream>>>(
                           static_cast<float*>(y), static_cast<const T*>(bias), total, n));
  } else {
    PPB_DISPATCH_DTYPE(t, T,
                       add_bias_rows_kernel<T, T><<<grid_for(total, 256), 256, 0, stream>>>(
                           static_cast<T*>(y), static_cast<const T*>(bias), total, n));
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ppb::cuda
