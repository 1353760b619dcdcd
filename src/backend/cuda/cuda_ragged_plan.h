// The host plan of the CUDA stage's ragged forward (continuous batching, issue 37;
// CudaStage::enqueue_forward_ragged): the step checked, cut into layer chunks of the stage's
// scratch and into attention calls, and the int32 metadata its kernels read, laid out for one
// upload per step. Pure host code (no CUDA call): tests/unit/test_cuda_stage_ragged.cpp runs it
// without a GPU.
//
// Why chunks and pieces: a layer pass holds StagePlan::rows token rows of scratch, so a step of
// more tokens runs chunk by chunk through every layer (the uniform path's chunked prefill: a
// row's earlier tokens are in the KV cache when its later ones attend). Within a chunk,
// attention_ragged (one flash-decoding launch over the packed tokens) takes decodes and short
// prefills; its partials grow with tokens x key chunks, so the short (sub-)rows are packed into
// pieces whose partials fit the stage's buffer, and a row of more than `long_row_tokens` new
// tokens goes alone to attention_prefill (tensor cores; attention_ragged would re-read its keys
// once per query token: kernels_attention.cu's napkin math).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/stage.h"

namespace ppb::cuda {

/// The stage's bounds on a ragged step.
struct RaggedLimits {
  int batch = 0;         ///< B: rows <= B, slots in [0, B)
  int max_context = 0;   ///< the KV cache's positions per slot
  int chunk_tokens = 0;  ///< token rows of one layer pass (StagePlan::rows), >= 1
  /// A (sub-)row of more new tokens than this attends alone through attention_prefill; 0: none do.
  int long_row_tokens = 0;
  int max_piece_tokens = 65535;  ///< attention_ragged's grid.z bound
  /// Floats of attention_ragged's partials for `tokens` packed query tokens whose rows attend at
  /// most `keys` keys (before any sliding window): the stage's largest over its layers. Null:
  /// no layer attends through attention_ragged (only max_piece_tokens bounds a piece).
  std::function<size_t(int tokens, int keys)> partial_floats;
  size_t partial_capacity = 0;  ///< floats of the stage's partials buffer
};

/// A contiguous run of one request's new tokens inside a chunk: packed token rows [t0, t0 + n)
/// of the step (global index), at positions [pos, pos + n) of cache slot `slot`.
struct RaggedSubRow {
  int t0 = 0, slot = 0, pos = 0, n = 0;
};

/// One attention call of a layer pass: sub-rows [sub0, sub0 + subs) of RaggedPlan::subs,
/// covering packed token rows [t0, t0 + tokens).
struct RaggedPiece {
  int t0 = 0, tokens = 0;
  int sub0 = 0, subs = 0;
  int keys = 0;          ///< the largest pos + n of its sub-rows: attention_ragged's plan_keys before the window
  bool prefill = false;  ///< one long sub-row: attention_prefill at batch 1
  /// attention_ragged's device arrays, as ints of RaggedPlan::meta: slot [subs] at meta_slot,
  /// pos [subs] at meta_pos, offset [subs + 1] (rebased: offset[0] = 0) at meta_offset. -1: prefill.
  int meta_slot = -1, meta_pos = -1, meta_offset = -1;
};

/// Token rows [t0, t0 + tokens) of the step through every layer at once; pieces [piece0, piece0 + pieces).
struct RaggedChunk {
  int t0 = 0, tokens = 0;
  int piece0 = 0, pieces = 0;
};

/// A checked step, cut for the stage.
struct RaggedPlan {
  int rows = 0, tokens = 0;
  std::vector<RaggedChunk> chunks;
  std::vector<RaggedPiece> pieces;
  std::vector<RaggedSubRow> subs;
  /// The ints uploaded once per step: per packed token its position [tokens] at token_pos, its
  /// cache slot [tokens] at token_slot, its row [tokens] at token_row; per row the packed index
  /// of its last new token [rows] at last; then the pieces' arrays.
  std::vector<int32_t> meta;
  int token_pos = 0, token_slot = 0, token_row = 0, last = 0;
};

/// Checks a step against a stage of `batch` slots of `max_context` positions: slot, pos and
/// tokens of one length, 1 <= rows <= batch, every slot in [0, batch) and used once, tokens >= 1,
/// pos >= 0, pos + tokens <= max_context.
/// @throws ppb::InternalError naming the first bad row and value (a scheduler's bug).
void check_ragged_step(const RaggedStep& step, int batch, int max_context);

/// The plan of a step (checked first, check_ragged_step). Chunks of at most chunk_tokens tokens
/// in packed order; within one, sub-rows in order, each long one (> long_row_tokens) a prefill
/// piece, the others packed greedily into ragged pieces of at most max_piece_tokens tokens whose
/// partial_floats fit partial_capacity (a sub-row that does not fit alone is split).
/// @throws ppb::InternalError as check_ragged_step, or if a single token's partials exceed
///         the capacity.
RaggedPlan plan_ragged_step(const RaggedStep& step, const RaggedLimits& lim);

/// The most ints RaggedPlan::meta holds for a step of at most `max_tokens` tokens in `batch`
/// rows (3 per token, 1 per row, and the pieces' arrays: at most one piece and one extra
/// sub-row per token): the stage's device buffer for them.
size_t ragged_meta_ints(int batch, size_t max_tokens);

}  // namespace ppb::cuda
