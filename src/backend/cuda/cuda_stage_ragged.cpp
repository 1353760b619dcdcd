// The CUDA stage's ragged forward (continuous batching, issue 37; cuda_stage_impl.h,
// StageExecutor::enqueue_forward_ragged): a step of rows at their own slots and positions,
// their new tokens packed, through the layer body of cuda_stage_forward.cpp.
//
// Per step on the host: the checks and the plan (cuda_ragged_plan.h: chunks of the scratch's
// rows, attention pieces, the per-token metadata), one upload of the metadata. Per chunk and
// layer on the device the uniform path's launches over M = the chunk's tokens, except where a
// token's position or slot matters: qkv_rope_cache and the MLA latent write / query RoPE read
// them from the uploaded per-token arrays (one launch each, as the uniform path), GQA attention
// is attention_ragged per piece (one per chunk for a decode step) or attention_prefill at batch 1
// per long row, MLA attention mla_attention per (sub-)row (<= B + chunks launches of its GEMMs).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_lane.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_ragged_plan.h"
#include "backend/cuda/cuda_stage_impl.h"
#include "backend/cuda/cuda_stage_plan.h"
#include "common/error.h"
#include "model/model_spec.h"

namespace ppb::cuda {

using model::LayerShape;

namespace {

/// Rows = slots 0..B-1 in order, one pos and one token count: enqueue_forward's step.
bool is_uniform(const RaggedStep& s, int batch) {
  if (s.rows() != batch) return false;
  for (int r = 0; r < batch; ++r)
    if (s.slot[r] != r || s.pos[r] != s.pos[0] || s.tokens[r] != s.tokens[0]) return false;
  return true;
}

/// The attention shapes (at `batch` slots) of the GQA layers of `layer_sets`, one per distinct
/// (heads, KV heads, head_dim, window): what attention_ragged's partials depend on.
std::vector<cpu::AttentionShape> distinct_gqa_shapes(std::initializer_list<const std::vector<LayerWeights>*> layer_sets,
                                                     int batch, int max_context) {
  std::vector<cpu::AttentionShape> shapes;
  for (const auto* ls : layer_sets) {
    for (const LayerWeights& w : *ls) {
      if (w.plan.shape.is_mla()) continue;
      const cpu::AttentionShape a = attention_shape(w.plan.shape, batch, 1, 0, max_context);
      const bool seen = std::any_of(shapes.begin(), shapes.end(), [&](const cpu::AttentionShape& b) {
        return b.n_heads == a.n_heads && b.n_kv_heads == a.n_kv_heads && b.head_dim == a.head_dim && b.window == a.window;
      });
      if (!seen) shapes.push_back(a);
    }
  }
  return shapes;
}

}  // namespace

void CudaStage::enqueue_forward_ragged(Lane& lane, const void* in, void* out, int group, const RaggedStep& step) {
  const int B = cfg_.work.batch, ctx = cfg_.work.max_context();
  if (group < 0 || group >= cfg_.work.groups) {
    throw InternalError("enqueue_forward_ragged(group=" + std::to_string(group) + ") is outside the stage's groups=" +
                        std::to_string(cfg_.work.groups));
  }
  check_ragged_step(step, B, ctx);
  const cudaStream_t st = as_cuda_lane(lane).stream();
  if (is_uniform(step, B)) {  // enqueue_forward's bits (its eager launches: a graph's are the same)
    forward_eager(st, in, out, group, step.pos[0], step.tokens[0]);
    return;
  }
  const RaggedPlan plan = plan_ragged_step(step, ragged_limits());
  upload_ragged_meta(plan, st);
  bind_cublas(st);
  const DType t = cfg_.work.dtype;
  const size_t T = static_cast<size_t>(plan.tokens), H = hidden_;
  if (plan_.has_embed) {
    embedding(x_, static_cast<const int32_t*>(in), T, embed_, vocab_, static_cast<int>(H), embed_scale_, bad_token_dev_,
              t, st);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(x_, in, T * H * dt_, cudaMemcpyDefault, st));
  }
  run_ragged_layers(layers_.data(), layers_.size(), st, plan, group);
  if (plan_.has_head) {
    gather_rows(last_rows_, x_, ragged_meta(plan.last), plan.rows, static_cast<int>(H), checksum_dev_, t, st);
    head_logits_argmax(st, plan.rows, static_cast<int32_t*>(out));
    if (!mtp_.empty()) ragged_mtp_forward(st, static_cast<const int32_t*>(out), plan, group);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(out, x_, T * H * dt_, cudaMemcpyDefault, st));
  }
}

RaggedLimits CudaStage::ragged_limits() const {
  RaggedLimits lim;
  lim.batch = cfg_.work.batch;
  lim.max_context = cfg_.work.max_context();
  lim.chunk_tokens = plan_.rows;
  lim.long_row_tokens = kRaggedLongRowTokens;
  lim.partial_capacity = plan_.decode_floats;  // partial_: attention_decode's B rows (>= B ragged tokens' partials)
  std::vector<cpu::AttentionShape> shapes = distinct_gqa_shapes({&layers_, &mtp_layers_}, lim.batch, lim.max_context);
  if (!shapes.empty()) {
    lim.partial_floats = [shapes = std::move(shapes)](int tokens, int keys) {
      size_t most = 0;
      for (const cpu::AttentionShape& s : shapes)
        most = std::max(most, attention_ragged_scratch_floats(s, tokens, s.window > 0 ? std::min(s.window, keys) : keys));
      return most;
    };
  }
  return lim;
}

void CudaStage::upload_ragged_meta(const RaggedPlan& plan, cudaStream_t st) {
  const size_t ints = plan.meta.size(), bytes = ints * sizeof(int32_t);
  const size_t capacity = ragged_meta_ints(cfg_.work.batch, static_cast<size_t>(cfg_.work.batch) * cfg_.work.max_context());
  if (ints > capacity) {  // plan_ragged_step keeps within ragged_meta_ints: a planner bug
    throw InternalError("ragged step: " + std::to_string(ints) + " ints of metadata exceed the stage's " +
                        std::to_string(capacity));
  }
  MetaStaging* buf = nullptr;
  for (const auto& m : meta_staging_) {
    if (m->host.bytes() < bytes) continue;
    const cudaError_t done = cudaEventQuery(m->uploaded.get());  // never recorded: cudaSuccess
    if (done == cudaSuccess) {
      buf = m.get();
      break;
    }
    if (done != cudaErrorNotReady) CUDA_CHECK(done);
  }
  if (buf == nullptr) {  // every buffer still waits for its copy, or is too small: one more
    auto m = std::make_unique<MetaStaging>();
    size_t n = kMetaStagingBytes;
    while (n < bytes) n *= 2;
    m->host = PinnedMemory(n);
    buf = m.get();
    meta_staging_.push_back(std::move(m));
  }
  std::memcpy(buf->host.get(), plan.meta.data(), bytes);
  CUDA_CHECK(cudaMemcpyAsync(ragged_meta_, buf->host.get(), bytes, cudaMemcpyHostToDevice, st));
  CUDA_CHECK(cudaEventRecord(buf->uploaded.get(), st));
}

void CudaStage::run_ragged_layers(const LayerWeights* ls, size_t n, cudaStream_t st, const RaggedPlan& plan,
                                  int group) {
  // Chunk by chunk through every layer: a row's later chunk attends its earlier one's K/V.
  for (const RaggedChunk& c : plan.chunks) {
    LayerPass pass;
    pass.M = c.tokens;
    pass.ragged = &plan;
    pass.chunk = &c;
    char* xc = at(x_, static_cast<size_t>(c.t0) * hidden_);
    for (size_t i = 0; i < n; ++i) layer_forward(ls[i], st, xc, pass, group);
  }
}

void CudaStage::ragged_gqa_attention(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, void* kc,
                                     void* vc) {
  const LayerShape& s = w.plan.shape;
  const DType t = cfg_.work.dtype;
  const RaggedPlan& p = *pass.ragged;
  const RaggedChunk& c = *pass.chunk;
  const int ctx = cfg_.work.max_context();
  const size_t nq = static_cast<size_t>(s.n_heads) * s.head_dim, nkv = static_cast<size_t>(s.n_kv_heads) * s.head_dim;
  for (int i = c.piece0; i < c.piece0 + c.pieces; ++i) {
    const RaggedPiece& pc = p.pieces[i];
    const size_t row0 = static_cast<size_t>(pc.t0 - c.t0);  // the piece's first row of q_ / attn_
    if (pc.prefill) {
      const RaggedSubRow& r = p.subs[pc.sub0];
      const size_t off = static_cast<size_t>(r.slot) * ctx * nkv;
      cpu::AttentionShape as = attention_shape(s, 1, r.n, r.pos, ctx);
      as.sinks = w.sinks;
      attention_prefill(cublas_.get(), at(attn_, row0 * nq), at(q_, row0 * nq), at(kc, off), at(vc, off), as,
                        plan_.query_block, scores_, probs_, t, st);
    } else {
      cpu::AttentionShape as = attention_shape(s, cfg_.work.batch, 1, 0, ctx);
      as.sinks = w.sinks;
      const cpu::RaggedBatch rb{pc.subs, ragged_meta(pc.meta_slot), ragged_meta(pc.meta_pos),
                                ragged_meta(pc.meta_offset)};
      const int keys = s.sliding_window > 0 ? std::min(s.sliding_window, pc.keys) : pc.keys;
      attention_ragged(at(attn_, row0 * nq), at(q_, row0 * nq), kc, vc, as, rb, pc.tokens, keys, partial_,
                       bad_ragged_dev_, t, st);
    }
  }
}

void CudaStage::ragged_mla_attention(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, int group) {
  const LayerShape& s = w.plan.shape;
  const int nh = s.n_heads, L = s.mla.kv_lora_rank, D = L + s.mla.qk_rope, ctx = cfg_.work.max_context();
  const RaggedPlan& p = *pass.ragged;
  const RaggedChunk& c = *pass.chunk;
  if (c.pieces == 0) return;
  const int sub_end = p.pieces[c.piece0 + c.pieces - 1].sub0 + p.pieces[c.piece0 + c.pieces - 1].subs;
  for (int j = p.pieces[c.piece0].sub0; j < sub_end; ++j) {  // the chunk's sub-rows, in token order
    const RaggedSubRow& r = p.subs[j];
    const size_t row0 = static_cast<size_t>(r.t0 - c.t0);
    const MlaCallShape ms = mla_call_shape(s, 1, r.n, r.pos, ctx);
    void* cache = at(w.k_cache[group], static_cast<size_t>(r.slot) * ctx * D);
    mla_attention(cublas_.get(), at(mla_olat_, row0 * nh * L), at(mla_qabs_, row0 * nh * D), cache, ms,
                  plan_.mla_query_block, scores_, probs_, cfg_.work.dtype, st);
  }
}

void CudaStage::ragged_mtp_forward(cudaStream_t st, const int32_t* head_tokens, const RaggedPlan& plan, int group) {
  const int rows = plan.rows, T = plan.tokens, H = static_cast<int>(hidden_), V = static_cast<int>(plan_.vocab_local);
  const DType t = cfg_.work.dtype;
  const float eps = final_eps_;  // as mtp_forward
  CUDA_CHECK(cudaMemcpyAsync(draft_, head_tokens, static_cast<size_t>(rows) * sizeof(int32_t), cudaMemcpyDefault, st));
  for (size_t k = 0; k < mtp_.size(); ++k) {
    const MtpModule& mod = mtp_[k];
    // Each packed token's input pairs its row's draft with its hidden state.
    mtp_concat(mtp_cat_, draft_, mtp_embed_, x_, mod.enorm, mod.hnorm, 1, T, H, eps, t, st, ragged_meta(plan.token_row));
    linear(cublas_.get(), x_, cuda_type(t), mtp_cat_, mod.eh_proj, t, T, H, 2 * H);
    run_ragged_layers(&mtp_layers_[k], 1, st, plan, group);
    gather_rows(last_rows_, x_, ragged_meta(plan.last), rows, H, checksum_dev_, t, st);
    rmsnorm(last_rows_, last_rows_, mod.shared_norm, rows, H, eps, false, t, st);
    linear(cublas_.get(), logits_, CUDA_R_32F, last_rows_, lm_head_, t, rows, V, H);
    argmax_rows(draft_, logits_, rows, V, st);
  }
}

}  // namespace ppb::cuda
