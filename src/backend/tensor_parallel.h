// Tensor parallelism inside a pipeline stage (issue 14; Megatron-LM's layout: Shoeybi et al.,
// "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism", 2019,
// §3): the t ranks of a stage each hold 1/t of every layer and meet twice per layer in an
// all-reduce.
//
// What each rank r of a group of width t holds and computes:
//   attention  query heads [r·n_heads/t, (r+1)·n_heads/t) (n_heads % t == 0); KV heads split the
//              same way when n_kv_heads % t == 0, else (t % n_kv_heads == 0, fewer KV heads
//              than ranks) the one KV head its query heads read, replicated on t/n_kv_heads
//              ranks, as vLLM does. q/k/v projections are column-parallel (rows of [out, in]),
//              o_proj row-parallel (columns): each rank's o_proj gives a partial [M, hidden]
//              that the all-reduce sums.
//   MLP        gate/up column-parallel and down row-parallel over intermediate slices
//              tp_range(intermediate, t, r) (any intermediate >= t), then the second all-reduce.
//   head       lm_head vocabulary-parallel: rank r scores tokens tp_range(vocab, t, r), takes its
//              local argmax, and the group's argmax picks the largest logit, ties to the lowest
//              token id: the answer of width 1 (cpu::argmax_rows) whenever the logits agree.
//   embed      replicated: a lookup costs nothing next to a layer, and a vocabulary-split
//              embedding would put a third all-reduce ([B, T, hidden]) on the critical path of
//              every forward to save vocab x hidden of memory per rank.
//   norms      replicated (the hidden state is whole on every rank after each all-reduce).
// Every rank of the group ends a layer with the same hidden state, bit for bit (TpGroup's
// contract), so each of them can hand it to the next stage and the head's checksum is the
// group's.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/dtype.h"

namespace ppb::model {
struct ModelSpec;
}  // namespace ppb::model

namespace ppb {

/// The communicator of a stage's tensor-parallel group, used inside a forward (on the lane that
/// runs it). Collective over the group: every rank calls the same operations in the same order.
class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int width() const = 0;  ///< t, ranks in the group
  virtual int rank() const = 0;   ///< this rank's index in the group, [0, t)
  /// In place: data[i] = sum over the group's ranks of their data[i], n floats. Every rank gets
  /// the same bits, and the same inputs always give the same bits (a fixed reduction order).
  /// @throws ppb::InternalError on timeout or abort (naming the operation).
  virtual void allreduce_sum(float* data, size_t n) = 0;
  /// In place, per row i in [0, rows): the group's (value[i], id[i]) with the largest value,
  /// ties to the smallest id, a NaN never winning (tp_argmax_in_rank_order). Identical on every rank.
  virtual void allreduce_argmax(float* value, int32_t* id, int rows) = 0;
  /// Device memory this rank's communicator of the group holds, bytes: the drop of the device's
  /// free memory across its creation and warm-up (the NCCL group's; NVLS buffers can be
  /// gigabytes). 0 for host groups (MPI, threads), whose buffers are the process's heap.
  virtual size_t device_bytes() const { return 0; }
  /// Returns once every rank of the group called it (an all-reduce of one float).
  virtual void barrier() {
    float x = 0.0f;
    allreduce_sum(&x, 1);
  }

  // Device-side collectives of a GPU stage (the NCCL group, transport/nccl): enqueued on the
  // forward's stream (`stream` is its cudaStream_t) over device memory, in the stage's dtype.
  // A host group (MPI, threads) has none: a GPU stage given one fails with InternalError.

  /// Enqueues the in-place sum over the group of n elements of `dtype` at `data`: every rank
  /// gets the same bits (NCCL's ring and tree all-reduces reduce each chunk once and broadcast it).
  virtual void enqueue_allreduce_sum(void* data, size_t n, DType dtype, void* stream);
  /// Enqueues recv[r * bytes, (r + 1) * bytes) = rank r's `send` (bytes each), for every r.
  virtual void enqueue_allgather(const void* send, void* recv, size_t bytes, void* stream);
};

/// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ... : the one reduction order of every
/// TpGroup's allreduce_sum (so that an MPI group and ThreadTpGroups give the same bits). `out`
/// may alias none of the parts but parts[0].
void tp_sum_in_rank_order(float* out, const float* const* parts, int t, size_t n);

/// Per row, the (value, id) pair with the largest value, ties to the smallest id, a NaN never
/// winning over a number (cpu::argmax_rows' order), over the t pairs values[r][i], ids[r][i];
/// into value[i], id[i] (which may be parts[0]).
void tp_argmax_in_rank_order(float* value, int32_t* id, const float* const* values, const int32_t* const* ids, int t,
                             int rows);

/// t tensor-parallel groups' worth of ranks inside one process: thread r uses group(r). For
/// tests (a stage of width t against width 1 without MPI) and for anything that wants the TP
/// arithmetic without ranks; the same bits as create_mpi_tp_group's groups.
class ThreadTpGroups {
 public:
  explicit ThreadTpGroups(int width);
  ~ThreadTpGroups();
  TpGroup& group(int r);
  int width() const { return width_; }

 private:
  class Member;
  friend class Member;
  /// Blocks until all `width_` threads arrived (a reusable generation barrier).
  void arrive_and_wait();
  int width_;
  std::vector<std::unique_ptr<Member>> members_;
  std::vector<const void*> slot_a_, slot_b_;  // each thread's published pointers
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
};

/// Rank r's slice [begin, end) of n items split over t ranks as evenly as possible (the first
/// n % t ranks get one more). @throws ppb::InternalError unless 1 <= t, 0 <= r < t.
std::pair<size_t, size_t> tp_range(size_t n, int t, int r);

/// Query and KV heads of rank r in a group of width t for a layer of n_heads query heads and
/// n_kv KV heads: [q_begin, q_begin + q_count) and [kv_begin, kv_begin + kv_count).
struct TpHeads {
  int q_begin = 0, q_count = 0, kv_begin = 0, kv_count = 0;
};
/// @throws ppb::UserError unless n_heads % t == 0 and (n_kv % t == 0 or t % n_kv == 0), naming
///         the counts and the widths that would work.
TpHeads tp_heads(int n_heads, int n_kv, int t, int r);

/// Whether every layer of `m` can be split over `t` ranks (heads as tp_heads, intermediate and
/// vocab >= t); "" if so, else why not (for the error that names --tp).
std::string tp_unsupported_reason(const model::ModelSpec& m, int t);

}  // namespace ppb
