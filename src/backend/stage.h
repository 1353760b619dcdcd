// Stages: a device's instance of units [first, last] of a model (StageExecutor), the shape it
// is built for (StageConfig) and the bytes it allocates (StageBytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/dtype.h"
#include "backend/lane.h"
#include "common/workload.h"
#include "model/model_spec.h"

namespace ppb {

class TpGroup;  // backend/tensor_parallel.h

/// Shape of the work a stage is built for.
struct StageConfig {
  /// B sequences per request group (micro-batch); work.groups request groups in flight, each
  /// with its own KV cache of work.max_context() = P + G positions per sequence; the stage's
  /// element type; weights are a pure function of (work.seed, unit index).
  Workload work;
  /// CUDA: capture each decode forward (per request group and context bucket,
  /// backend/decode_graphs.h) in a CUDA graph and replay it (--no-cuda-graphs: false). CPU: ignored.
  bool cuda_graphs = true;
  /// --expert-skew A (>= 0; 0 = the router's own choice): MoE layers route to a Zipf law of
  /// expert popularity of exponent A (cpu::expert_popularity_log_p, cpu::route_tokens).
  double expert_skew = 0.0;
  /// Tensor parallelism (backend/tensor_parallel.h): this stage is shard `tp_rank` of a group of
  /// `tp_width` ranks that all-reduce twice per layer through `tp` (not owned; it must outlive
  /// the stage). Width 1: the whole stage, `tp` unused. stage_bytes needs only the width and
  /// rank; create_stage needs `tp` when the width is > 1.
  int tp_width = 1;
  int tp_rank = 0;
  TpGroup* tp = nullptr;
  /// Tokens of KV cache a serving scheduler's pool lets this stage hold at once, over all its
  /// groups and slots (M x --kv-blocks x --kv-block-size; serving/scheduler.h); 0: every slot of
  /// every group at max_context (closed batches, or a pool that does not bind). A backend whose
  /// KV storage is demand-paged (StageBytes::kv_paged: the CPU) then holds only the pages of the
  /// positions written and not given back (RaggedStep::released), and counts the pool's tokens
  /// in stage_bytes; one that allocates every slot (CUDA, today) ignores it.
  int64_t kv_pool_tokens = 0;
};

/// Bytes a stage allocates (cpu_stage_bytes, cuda_stage_bytes): computed before anything is
/// allocated, to check --memory-limit.
struct StageBytes {
  size_t weights = 0;
  /// The KV cache the stage holds at most: every slot at max_context, or with a demand-paged
  /// store and StageConfig::kv_pool_tokens > 0 the pool's tokens plus kv_page_slack (whichever
  /// is less).
  size_t kv_cache = 0;
  size_t scratch = 0;  ///< activations, attention and library workspace
  /// Bytes of KV cache one token position of one slot takes over the stage's layers (K and V,
  /// or MLA's latent row); the cache of every slot at max_context is this x slots x max_context.
  size_t kv_token_bytes = 0;
  /// Whether the KV storage is demand-paged (a slot's pages are resident only once written and
  /// until released: the CPU store, after vAttention's design) rather than allocated whole.
  bool kv_paged = false;
  /// Paged storage: the most bytes its pages hold beyond the pool's tokens (a partly written
  /// page at each end of every slot's region of every layer); 0 otherwise.
  size_t kv_page_slack = 0;
  size_t total() const { return weights + kv_cache + scratch; }
};

/// One step of continuous batching for StageExecutor::enqueue_forward_ragged (issue 37): row r
/// is one request in KV-cache row (slot) slot[r] of the group, in [0, B), with pos[r] tokens
/// already cached and tokens[r] >= 1 new tokens at positions [pos[r], pos[r] + tokens[r]) (a
/// prefill: pos 0 and its prompt; a decode: 1 token). The rows' tokens are packed in row order:
/// row r's are token rows [offset(r), offset(r) + tokens[r]) of the input and of a non-head
/// output, offset(r) = tokens[0] + ... + tokens[r-1] (flash-attention's cu_seqlens_q). No two
/// rows share a slot; rows <= B.
struct RaggedStep {
  std::vector<int32_t> slot, pos, tokens;  ///< [rows] each
  /// Slots of the group whose request left (finished, or preempted) since the group's pool formed
  /// its previous step, in [0, B), each once: their KV positions are free before this step's
  /// rows run (a new request may take the slot in this very step). A demand-paged store gives
  /// their pages back; a whole one ignores it.
  std::vector<int32_t> released{};
  int rows() const { return static_cast<int>(slot.size()); }
  /// Sum of tokens: the token rows of the input.
  int total_tokens() const {
    int n = 0;
    for (int32_t t : tokens) n += t;
    return n;
  }
};

/// The units [first, last] of a model, instantiated on a device with weights and KV caches.
///
/// Input of a forward: int32 token ids [B, T] if the stage holds `embed`, else activations
/// [B, T, hidden] in the stage dtype. Output: int32 greedy token ids [B] if it holds `head`
/// (the last position of each sequence), else activations [B, T, hidden].
class StageExecutor {
 public:
  virtual ~StageExecutor() = default;
  virtual int first_unit() const = 0;
  virtual int last_unit() const = 0;
  /// Bytes of the input / output of one forward of T tokens per sequence.
  virtual size_t input_bytes(int tokens) const = 0;
  virtual size_t output_bytes(int tokens) const = 0;
  /// Enqueues one forward on `lane`: group `group` (its own KV cache), T = `tokens` new tokens
  /// per sequence at positions [pos, pos + T). Prefill: pos = 0, T = prompt_len. Decode:
  /// pos = current length, T = 1. Writes K/V of the new positions into the group's cache.
  /// `in`/`out` are device pointers that stay valid until the enqueued work completes.
  virtual void enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos,
                               int tokens) = 0;
  /// Bytes of the input / output of one ragged forward of `rows` rows and `total_tokens` packed
  /// tokens (RaggedStep): ids int32 [total_tokens] or activations [total_tokens, hidden] in;
  /// token ids int32 [rows] (head) or activations [total_tokens, hidden] out.
  virtual size_t ragged_input_bytes(int total_tokens) const = 0;
  virtual size_t ragged_output_bytes(int rows, int total_tokens) const = 0;
  /// Enqueues one ragged forward on `lane` (continuous batching, RaggedStep): group `group`'s
  /// KV cache gets K/V of every row's new positions in the row's slot; every row attends its
  /// own slot's positions [0, pos + t] (window rules as enqueue_forward's). With the head, the
  /// output is each row's greedy token at its last new position, [rows]. `step` is copied (the
  /// caller's object may be gone before the lane runs the work); `in`/`out` as enqueue_forward's.
  /// The same bits as enqueue_forward where every row has the same pos and tokens and the rows
  /// are slots 0..B-1 in order. A row's results equal its request's alone up to rounding (the
  /// step's token rows share each GEMM). MTP modules (--mtp): the CPU stage runs them, each row
  /// drafting from its own head token; another backend may refuse them (InternalError).
  /// @throws InternalError (check_ragged_step) on a step outside the stage's shape (a group
  /// out of range, no rows or rows > B, a slot out of range or twice, tokens < 1, pos < 0,
  /// pos + tokens > max_context), before anything is enqueued.
  virtual void enqueue_forward_ragged(Lane& lane, const void* in, void* out, int group, const RaggedStep& step) = 0;
  /// Sum (in double) of the final hidden states entering the head, over every forward since
  /// the last reset_checksum(); 0 if the stage has no head. Call after the lane synchronised.
  virtual double checksum() const = 0;
  /// Resets the per-repetition records: the checksum and the expert counts.
  virtual void reset_checksum() = 0;
  /// MoE layers of the stage: per layer [0] its index in ModelSpec::layers (MTP module k:
  /// n_layers + k), then the tokens routed to each of its experts since reset_checksum()
  /// (a token counts once per expert it reaches). Empty without MoE layers.
  virtual std::vector<std::vector<int64_t>> expert_tokens() const { return {}; }
  /// The host memory a forward reads, as blocks (address, bytes): the weights and the KV store
  /// of a CPU stage (Device::flush_caches evicts them to time a unit cold); empty where the
  /// stage's memory is not host memory (CUDA).
  virtual std::vector<std::pair<const void*, size_t>> host_blocks() const { return {}; }
  /// Resident weight bytes and KV-cache bytes of the stage.
  virtual size_t weight_bytes() const = 0;
  virtual size_t kv_cache_bytes() const = 0;
  /// KV-cache bytes resident now: a demand-paged store's pages written and not released
  /// (StageBytes::kv_paged), else kv_cache_bytes().
  virtual size_t kv_resident_bytes() const { return kv_cache_bytes(); }
  /// Upper bound of the work items (kernel launches; a library call counts as two, e.g. a
  /// cuBLAS GEMM and its split-K reduction) that one enqueue_forward of `tokens` tokens per
  /// sequence puts on a device's launch queue; 0 where the backend has no such queue (CPU lanes
  /// run host tasks). A lane held while more than ~1,000 launches wait blocks the launching host
  /// thread itself: the profiler holds a lane only below kMaxHeldLaunches (backend/lane_hold.h).
  virtual size_t launches_per_forward(int tokens) const { return 0; }
  /// Does now, outside any timed window, the one-time host work a forward of these arguments
  /// would otherwise do inside it (CUDA: capture and instantiate the decode graph of the group
  /// and context bucket). Optional: enqueue_forward does it itself when it was not called.
  /// Enqueues nothing on any lane.
  virtual void prepare_forward(int group, int pos, int tokens) {}
  /// Decode forwards captured in CUDA graphs so far (0 on the CPU, or with cuda_graphs off).
  virtual size_t decode_graphs() const { return 0; }
};

/// Checks a ragged step against the shape a stage is built for (enqueue_forward_ragged's
/// refusals, every backend's): group in [0, work.groups); slot, pos and tokens of one length,
/// 1 <= rows <= B; each row's slot in [0, B) and no slot twice, tokens >= 1, pos >= 0 and
/// pos + tokens <= work.max_context(); each released slot in [0, B), none twice. Then
/// total_tokens <= B * max_context, the token rows a stage's scratch holds (each row fits one
/// sequence's context, and there are at most B rows).
/// @throws ppb::InternalError naming the group or the first bad row (a scheduler's bug, not a
///         user's error).
void check_ragged_step(const RaggedStep& step, int group, const Workload& work);

/// Checks that a stage can build decoder layer `layer` of shape s in a model of hidden size
/// `hidden` (every backend's rule): attention heads that group (n_kv_heads | n_heads, an even
/// head_dim; MLA: qk_nope, v_head_dim >= 1, an even qk_rope >= 2), an MLP (intermediate >= 1; MoE:
/// 1 <= top_k <= experts, expert_intermediate >= 1), hidden = the model's.
/// @throws ppb::UserError naming the layer and every size.
void check_stage_layer(const model::LayerShape& s, int hidden, int layer);

}  // namespace ppb
