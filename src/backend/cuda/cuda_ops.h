// The CUDA kernels of a decoder-only transformer forward: host launchers, one per kernel.
//
// Each launcher is the GPU twin of a ppb::cpu op (backend/cpu/cpu_ops.h) with the same shapes
// and semantics, for activations in f32, f16 or bf16 (`t`) with fp32 arithmetic inside; the
// napkin math (bytes, FLOPs, floor) sits above each kernel in the .cu files. Every launcher
// enqueues on `stream`, checks the launch (CUDA_CHECK(cudaGetLastError())) and returns at once.
// Layouts are the CPU twins' (row-major; a token row of heads is [n_heads, head_dim]).
//
// tests/unit/test_cuda_kernels.cpp, test_cuda_moe.cpp and test_cuda_mla.cpp run each launcher against
// its twin on random data.
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
/// (gate = columns [0, inter), up = [inter, 2*inter)) -> out [rows, inter]. `limit`: gpt-oss's
/// swiglu_limit for Activation::swiglu_clamped (else unused).
void gated_activation(void* out, const void* gate_up, size_t rows, int inter, model::Activation act, DType t,
                      cudaStream_t stream, float limit = 0.0f);

/// y[r, c] += bias[c] for r < rows, c < n (cpu::linear's bias): y in `t`, or in fp32 where
/// y_f32 (router logits); bias [n] in `t`.
void add_bias_rows(void* y, bool y_f32, const void* bias, size_t rows, int n, DType t, cudaStream_t stream);

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
  /// A ragged step (continuous batching, issue 37): where both are non-null, device int32 arrays
  /// [batch * tokens] giving each token row its position and its cache sequence (slot), in place
  /// of (pos0 + row % tokens, row / tokens); pos0 and pos0_dev are then not read.
  const int32_t* token_pos = nullptr;
  const int32_t* token_slot = nullptr;
};

/// Everything between the fused QKV GEMM and attention, in one pass: per token row and head,
/// + bias (if non-null, [nq + 2 nkv]), q/k RMSNorm over head_dim (if qk_norm), RoPE on q and k
/// (cos/sin fp32 [>= pos0 + tokens, head_dim/2]), q -> q_out, k/v -> the caches at pos0 + t
/// (s.token_pos / s.token_slot: at each row's own position and slot, a ragged step's).
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
/// gather_last_rows for a ragged step: last[r, :] = x[index[r], :] for r < rows (index: device
/// int32 [rows], each row's last new token in the packed x [*, hidden]), *checksum += their sum
/// in gather_last_rows' order (the same bits where index[b] = b tokens + tokens - 1).
void gather_rows(void* last, const void* x, const int32_t* index, int rows, int hidden, double* checksum, DType t,
                 cudaStream_t stream);

// ---- matrix products ------------------------------------------------------------------------

/// cpu::linear without bias: y[M, N] = x[M, K] · W[N, K]^T, cublasGemmEx with fp32 accumulate
/// (CUBLAS_COMPUTE_32F: no TF32 for f32). x and W in `t`; y in `y_type` (t, or f32 for logits).
void linear(cublasHandle_t handle, void* y, cudaDataType_t y_type, const void* x, const void* w, DType t, int M,
            int N, int K);

// ---- attention (twin: cpu::attention) ---------------------------------------------------------

/// gpt-oss attention sinks (both attention kernels): s.sinks, where non-null, is a device fp32
/// array [n_heads] (this call's heads) whose logit joins every row's softmax max and denominator
/// and attends to no value (cpu::attention's rule).
///
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

/// cpu::attention_ragged (continuous batching: row r at its own slot, position pos_r and n_r
/// new tokens) as one flash-decoding launch over the packed query tokens: one block per (key
/// chunk, KV head, token) computes attention_decode's partial for its token's own slot and
/// position, attention_decode's merge follows. Any mix of decodes and (short) prefills; a long
/// prompt re-reads its keys per token (kernels_attention.cu's napkin math): give it
/// attention_prefill instead. Sinks, window and softcap as attention_decode.
/// rb: device arrays (slot, pos [rows], offset [rows + 1], cpu::RaggedBatch's meaning) with
/// rb.rows (host) >= 1; tokens (host) = offset[rows], the packed query rows of q and out
/// [tokens, n_heads, head_dim]; caches [s.batch = slots, s.max_context, n_kv_heads, head_dim];
/// s.tokens and s.pos0 are not read. plan_keys (host) >= every token's attended keys
/// (max_r min(window, pos_r + n_r)), <= the cache's: the chunks and the grid are planned for it.
/// partial: attention_ragged_scratch_floats(s, tokens, plan_keys) floats.
/// A kernel cannot throw: a row whose slot or positions fall outside the cache or whose keys
/// exceed plan_keys leaves its tokens' outputs zero and sets *bad = 1 (where non-null; the
/// caller reads it after synchronising, as embedding's bad_token).
/// @throws ppb::InternalError if rows < 1, tokens > 65535 or plan_keys is outside [1, the
/// cache's keys]; ppb::UserError for head_dim > 256 or a GQA group too large for shared memory.
void attention_ragged(void* out, const void* q, const void* k_cache, const void* v_cache, const cpu::AttentionShape& s,
                      const cpu::RaggedBatch& rb, int tokens, int plan_keys, float* partial, int* bad, DType t,
                      cudaStream_t stream);
/// Floats of `partial` attention_ragged needs (0 for no tokens).
size_t attention_ragged_scratch_floats(const cpu::AttentionShape& s, int tokens, int plan_keys);

// ---- mixture of experts (twins: cpu::route_tokens, CpuStage::moe_mlp) ------------------------
//
// A MoE layer on the GPU, without a host round trip (so that it runs inside a held lane and a
// decode graph): router logits (linear, fp32 out) -> route_tokens -> moe_dispatch (the choices
// sorted by expert, a tile map) -> moe_grouped_linear (gate|up) -> gated_activation ->
// moe_grouped_linear (down) -> moe_combine; the shared experts are a dense MLP added after.

/// Token rows per tile of moe_grouped_linear: each tile holds rows of one expert.
constexpr int kMoeTileRows = 32;
/// The CUDA MoE kernels' limits (route_tokens: a choice per lane of a warp, an expert per bit of
/// a lane's 64-bit mask; moe_dispatch: the experts' counters in one block's shared memory). The
/// stage refuses larger configs by name; the largest published (Kimi-K2 384 experts, top-8) fit.
constexpr int kMoeMaxTopK = 32;
constexpr int kMoeMaxExperts = 2048;

/// The upper bound of moe_dispatch's tiles for `choices` = rows x top_k routed rows over
/// `n_experts` experts: every expert with rows adds at most one partial tile.
inline int moe_max_tiles(int choices, int n_experts) {
  return (choices + kMoeTileRows - 1) / kMoeTileRows + (choices < n_experts ? choices : n_experts);
}

/// cpu::route_tokens on the GPU (same rules: softmax, topk_softmax or sigmoid_grouped with the
/// correction bias and group-limited top-k; ties to the lower expert and group index; scores in
/// double; the weights renormalised and scaled as the config says). logits fp32 [M, E] (the
/// router bias already added); correction fp32 [E] (sigmoid_grouped) or null. skew_log_p: the
/// layer's --expert-skew popularity law, double [E] (cpu::expert_popularity_log_p), or null
/// for the router's own choice; skew_key its key (cpu::RouteSkew: the same hash of the token's
/// logits' bits, so a GPU and a CPU stage fed the same logits choose the same experts).
/// Writes experts int32 [M, top_k] (best first) and weights fp32 [M, top_k].
/// @throws ppb::InternalError for a shape cpu::route_tokens refuses (checked on the host).
void route_tokens(int32_t* experts, float* weights, const float* logits, int M, const model::MoeShape& moe,
                  const float* correction, const double* skew_log_p, uint64_t skew_key, cudaStream_t stream);

/// The routed rows of one MoE layer, sorted by expert (device buffers; sizes for `choices` =
/// M x top_k and E experts; moe_dispatch_bytes gives the total).
struct MoeDispatch {
  int32_t* counts = nullptr;     ///< [E] rows routed to each expert
  int32_t* offsets = nullptr;    ///< [E + 1] first sorted row of each expert (exclusive scan)
  int32_t* sorted_row = nullptr; ///< [choices] choice i = m * top_k + j -> its row in expert order
  int32_t* row_token = nullptr;  ///< [choices] sorted row -> its token m
  int32_t* tile_expert = nullptr;  ///< [moe_max_tiles] the expert of each tile
  int32_t* tile_row0 = nullptr;    ///< [moe_max_tiles] the tile's first sorted row
  int32_t* tile_rows = nullptr;    ///< [moe_max_tiles] its rows, 1 .. kMoeTileRows
  int32_t* n_tiles = nullptr;      ///< [1] tiles in use
};
/// Bytes of a MoeDispatch for `choices` routed rows over `n_experts` experts.
size_t moe_dispatch_bytes(int choices, int n_experts);
/// Carves a MoeDispatch out of `base` (moe_dispatch_bytes(choices, n_experts) bytes, 16-aligned).
MoeDispatch moe_dispatch_at(void* base, int choices, int n_experts);

/// Sorts the M x top_k choices of `experts` [M, top_k] by expert (CpuStage::moe_mlp's counting
/// sort; the order of rows within an expert is free: every row's result is its own) and builds
/// the tile map of kMoeTileRows-row tiles, one expert per tile, in expert order. Adds each
/// expert's rows to expert_tokens int64 [E] where non-null (the run's /moe/expert_tokens).
void moe_dispatch(const MoeDispatch& d, const int32_t* experts, int M, int top_k, int n_experts,
                  int64_t* expert_tokens, cudaStream_t stream);

/// The grouped expert GEMM: for every tile of `d` (blocks past *d.n_tiles return before reading
/// a weight, so decode reads only the experts its tokens chose), rows r of expert e:
///   y[r, :] = x[src(r), :] . W_e^T (+ bias_e),  W_e = w + e N K ([N, K] row-major),
///   bias_e = bias + e N (null: none), src(r) = d.row_token[r] if gather else r.
/// x rows of K values, y [choices, N], all in `t`; fp32 accumulation (a tiled SIMT GEMM: no
/// tensor cores, so prefill's expert GEMMs are slower than a cuBLAS grouped GEMM would be).
/// max_tiles: moe_max_tiles(choices, E) (the grid).
void moe_grouped_linear(void* y, const void* x, bool gather, const void* w, const void* bias, const MoeDispatch& d,
                        int N, int K, int max_tiles, DType t, cudaStream_t stream);

/// out[m, :] = sum over m's top_k choices, in ascending expert order (CpuStage::moe_mlp's
/// order), of weights[m, j] * y[d.sorted_row[m top_k + j], :], in fp32 then rounded to `t`.
/// y [choices, H]; out [M, H] (may not alias y).
void moe_combine(void* out, const void* y, const float* weights, const int32_t* experts, const MoeDispatch& d, int M,
                 int top_k, int H, DType t, cudaStream_t stream);

// ---- multi-head latent attention (twin: CpuStage::mla_attention, absorbed form) --------------
//
// DeepSeek-V3's MLA with W_UK absorbed into the query and W_UV applied after attention: the
// cache holds one latent row per token, [c_kv (kv_lora_rank = L) | k_rope (qk_rope = R)], D = L + R
// values, shared by every head (MQA over D-dimensional keys whose first L values are the values).

/// Shapes of one MLA call. Positions as QkvShape (pos0_dev: a decode graph's position).
struct MlaCallShape {
  int batch = 1;
  int tokens = 1;
  int pos0 = 0;
  int max_context = 0;
  int n_heads = 0;
  int qk_nope = 0;    ///< per head: the query's non-rotated part
  int qk_rope = 0;    ///< R
  int v_head_dim = 0;
  int kv_lora_rank = 0;  ///< L
  float eps = 1e-6f;     ///< kv_a_layernorm's epsilon
  float scale = 1.0f;    ///< softmax scale (LayerShape::attn_scale: YaRN's mscale^2 included)
  const int* pos0_dev = nullptr;
  /// A ragged step's per-token position and cache sequence, as QkvShape's (mla_kv_cache_write
  /// reads both, mla_absorb_queries token_pos; mla_attention neither: call it per row).
  const int32_t* token_pos = nullptr;
  const int32_t* token_slot = nullptr;
};

/// The new tokens' latent rows into the cache: per row m = (b, t) of kva [batch*tokens, D] (the
/// kv_a GEMM output, c_kv | k_rope): RMSNorm of c_kv with kv_norm [L] (plain), RoPE of k_rope
/// at position pos0 + t (cos/sin fp32 [>= pos0 + tokens, R/2], cpu::rope's pairing), written to
/// cache [batch, max_context, D] at (b, pos0 + t). Twins: cpu::rmsnorm, cpu::rope, cpu::kv_cache_write.
void mla_kv_cache_write(void* cache, const void* kva, const void* kv_norm, const float* cos_table,
                        const float* sin_table, const MlaCallShape& s, DType t, cudaStream_t stream);

/// The absorbed queries qa [batch*tokens, n_heads, D]: qa[m, h, :L] = q_nope[m, h] . W_UK_h
/// (one strided-batched GEMM over heads; W_UK_h = rows [h (nope + v), h (nope + v) + nope) of
/// kv_b [n_heads (nope + v), L]) and qa[m, h, L:] = RoPE(q_rope[m, h]) at position pos0 + t.
/// q [batch*tokens, n_heads, nope + R] (the q_b GEMM output).
void mla_absorb_queries(cublasHandle_t handle, void* qa, const void* q, const void* kv_b, const float* cos_table,
                        const float* sin_table, const MlaCallShape& s, DType t, cudaStream_t stream);

/// Causal attention of the absorbed queries over the latent cache, every sequence of the batch
/// at once (strided-batched GEMMs): per query block of `query_block` tokens,
/// S = scale qa . K^T (fp32), the row softmax (keys <= the query's position), O = P . V with
/// V = the cache rows' first L values. o_lat [batch*tokens, n_heads, L].
/// plan_keys > 0: the GEMMs span that many keys (a decode graph's context bucket, >= the call's
/// attended keys, <= max_context) and the softmax masks keys past the position read from
/// s.pos0_dev (the latent cache is zeroed at allocation: masked keys are finite).
/// scores: mla_attention_scratch_elems floats; probs: as many `t` values.
/// @throws ppb::InternalError if plan_keys is below the attended keys or above the cache.
void mla_attention(cublasHandle_t handle, void* o_lat, const void* qa, const void* cache, const MlaCallShape& s,
                   int query_block, float* scores, void* probs, DType t, cudaStream_t stream, int plan_keys = 0);
/// Elements of mla_attention's `scores` (and `probs`) for shape s (its batch, heads, the cache's
/// max_context keys) and `query_block` query tokens per block.
size_t mla_attention_scratch_elems(const MlaCallShape& s, int query_block);

/// Each head's values: values[m, h v : (h + 1) v] = o_lat[m, h, :] . W_UV_h^T (W_UV_h = rows
/// [h (nope + v) + nope, (h + 1)(nope + v)) of kv_b), one strided-batched GEMM over heads.
/// values [batch*tokens, n_heads v].
void mla_values(cublasHandle_t handle, void* values, const void* o_lat, const void* kv_b, const MlaCallShape& s, DType t,
                cudaStream_t stream);

// ---- multi-token prediction (twin: CpuStage::mtp_forward) --------------------------------------

/// The MTP module's input rows: cat[m, :H] = RMSNorm(embed[draft[m / tokens]], enorm) and
/// cat[m, H:] = RMSNorm(x[m], hnorm) (plain norms), m < batch * tokens. cat [batch*tokens, 2H];
/// embed [vocab, H]; draft int32 [batch] device; x [batch*tokens, H]. token_row (a ragged step:
/// device int32 [batch * tokens], each packed token's row) replaces m / tokens where non-null.
void mtp_concat(void* cat, const int32_t* draft, const void* embed, const void* x, const void* enorm,
                const void* hnorm, int batch, int tokens, int hidden, float eps, DType t, cudaStream_t stream,
                const int32_t* token_row = nullptr);

/// *dst = value, one thread: sets a CUDA graph's device-side parameter (the decode position)
/// in stream order before the graph is launched.
void set_device_int(int* dst, int value, cudaStream_t stream);

// ---- lanes ----------------------------------------------------------------------------------

/// A one-thread kernel that spins (with __nanosleep) until *counter >= value: the fallback of
/// CudaLane's stream wait where cuStreamWaitValue32 is unavailable. counter: mapped pinned memory.
void launch_wait_counter(const uint32_t* counter, uint32_t value, cudaStream_t stream);

/// Reads `bytes` of device memory `buf` (16-byte aligned; a zeroed buffer) once, storing
/// nothing (`sink`: one unsigned of device memory, written only on an impossible fold): evicts
/// the L2 with clean lines, so the next forward's reads pay no write-back of dirty ones (as a
/// memset of the same buffer would leave them: ~10 µs of extra traffic on an H200's 50 MB).
void read_evict(const void* buf, size_t bytes, unsigned* sink, cudaStream_t stream);

/// Streaming multiprocessors of the current device (cached per device).
int sm_count();

}  // namespace ppb::cuda
