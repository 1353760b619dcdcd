// The CUDA stage's forward of B sequences (cuda_stage_impl.h; StageExecutor::enqueue_forward):
// a decode graph's replay or the eager launches, and the layer body that the ragged forward
// (cuda_stage_ragged.cpp) shares: one decoder layer over a pass's token rows, its attention
// (GQA, MLA), its MLP (dense, MoE), the head and the --mtp modules.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_lane.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_stage_impl.h"
#include "backend/cuda/cuda_stage_plan.h"
#include "backend/decode_graphs.h"
#include "backend/tensor_parallel.h"
#include "common/error.h"
#include "model/model_spec.h"

namespace ppb::cuda {

using model::LayerShape;

void CudaStage::bind_cublas(cudaStream_t st) {
  cublasHandle_t hb = cublas_.get();
  CUBLAS_CHECK(cublasSetStream(hb, st));
  // After cublasSetStream (which resets it): a fixed workspace keeps cuBLAS's algorithm choice,
  // hence the bits, independent of the stream (pipelined and serialized runs must agree), and
  // lets cuBLAS run inside a stream capture (no allocation of its own).
  CUBLAS_CHECK(cublasSetWorkspace(hb, workspace_, kCublasWorkspaceBytes));
}

void CudaStage::enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) {
  if (group < 0 || group >= cfg_.work.groups || pos < 0 || tokens < 1 || pos + tokens > cfg_.work.max_context()) {
    throw InternalError("enqueue_forward(group=" + std::to_string(group) + ", pos=" + std::to_string(pos) +
                        ", tokens=" + std::to_string(tokens) + ") is outside the stage's groups=" +
                        std::to_string(cfg_.work.groups) + ", max_context=" + std::to_string(cfg_.work.max_context()));
  }
  const cudaStream_t st = as_cuda_lane(lane).stream();
  const int B = cfg_.work.batch;
  const size_t rows = static_cast<size_t>(B) * tokens;
  const size_t H = hidden_;
  if (tokens == 1 && cfg_.cuda_graphs) {
    if (cudaGraphExec_t graph = decode_graph(group, pos)) {
      // Replay: the position and the input into the graph's fixed buffers, one launch for every
      // kernel of the stage, the output out of them. Stream order makes the buffers safe: the
      // stage's forwards all run on one stream (x_ and the scratch are shared anyway).
      set_device_int(pos_dev_, pos, st);
      if (plan_.has_embed) {
        CUDA_CHECK(cudaMemcpyAsync(graph_tokens_, in, B * sizeof(int32_t), cudaMemcpyDefault, st));
      } else {
        CUDA_CHECK(cudaMemcpyAsync(x_, in, rows * H * dt_, cudaMemcpyDefault, st));
      }
      CUDA_CHECK(cudaGraphLaunch(graph, st));
      if (plan_.has_head) {
        CUDA_CHECK(cudaMemcpyAsync(out, graph_out_, B * sizeof(int32_t), cudaMemcpyDefault, st));
      } else {
        CUDA_CHECK(cudaMemcpyAsync(out, x_, rows * H * dt_, cudaMemcpyDefault, st));
      }
      return;
    }
  }
  forward_eager(st, in, out, group, pos, tokens);
}

void CudaStage::forward_eager(cudaStream_t st, const void* in, void* out, int group, int pos, int tokens) {
  const size_t rows = static_cast<size_t>(cfg_.work.batch) * tokens;
  const size_t H = hidden_;
  bind_cublas(st);
  if (plan_.has_embed) {
    embedding(x_, static_cast<const int32_t*>(in), rows, embed_, vocab_, static_cast<int>(H), embed_scale_,
              bad_token_dev_, cfg_.work.dtype, st);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(x_, in, rows * H * dt_, cudaMemcpyDefault, st));
  }
  // Decode is planned per context bucket, as its graph would be: the same bits either way.
  const int bucket = tokens == 1 ? decode_context_bucket(pos, cfg_.work.max_context()) : 0;
  run_layers(layers_.data(), layers_.size(), st, pos, tokens, group, bucket);
  if (plan_.has_head) {
    head_forward(st, tokens, static_cast<int32_t*>(out));
    if (!mtp_.empty()) mtp_forward(st, static_cast<const int32_t*>(out), pos, tokens, group, bucket);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(out, x_, rows * H * dt_, cudaMemcpyDefault, st));
  }
}

void CudaStage::run_layers(const LayerWeights* ls, size_t n, cudaStream_t st, int pos, int tokens, int group,
                           int bucket, const int* pos_dev) {
  if (n == 0) return;
  const int B = cfg_.work.batch;
  if (static_cast<size_t>(B) * tokens <= static_cast<size_t>(plan_.rows)) {
    LayerPass pass;
    pass.M = B * tokens;
    pass.nb = B;
    pass.pos = pos;
    pass.tokens = tokens;
    pass.bucket = bucket;
    pass.pos_dev = pos_dev;
    for (size_t i = 0; i < n; ++i) layer_forward(ls[i], st, static_cast<char*>(x_), pass, group);
    return;
  }
  // Chunked prefill, sequence by sequence: chunk c of a sequence runs every layer after chunk
  // c-1 wrote its keys and values into the cache.
  for (int b = 0; b < B; ++b) {
    for (int t0 = 0; t0 < tokens; t0 += plan_.rows) {
      LayerPass pass;
      pass.tokens = std::min(plan_.rows, tokens - t0);
      pass.M = pass.tokens;
      pass.b0 = b;
      pass.nb = 1;
      pass.pos = pos + t0;
      char* xb = at(x_, (static_cast<size_t>(b) * tokens + t0) * hidden_);
      for (size_t i = 0; i < n; ++i) layer_forward(ls[i], st, xb, pass, group);
    }
  }
}

void CudaStage::mtp_forward(cudaStream_t st, const int32_t* head_tokens, int pos, int tokens, int group, int bucket,
                            const int* pos_dev) {
  const int B = cfg_.work.batch, H = static_cast<int>(hidden_), V = static_cast<int>(plan_.vocab_local);
  const DType t = cfg_.work.dtype;
  const float eps = final_eps_;  // the model's rms_norm_eps (CpuStage's mtp_eps_)
  CUDA_CHECK(cudaMemcpyAsync(draft_, head_tokens, static_cast<size_t>(B) * sizeof(int32_t), cudaMemcpyDefault, st));
  for (size_t k = 0; k < mtp_.size(); ++k) {
    const MtpModule& mod = mtp_[k];
    mtp_concat(mtp_cat_, draft_, mtp_embed_, x_, mod.enorm, mod.hnorm, B, tokens, H, eps, t, st);
    linear(cublas_.get(), x_, cuda_type(t), mtp_cat_, mod.eh_proj, t, B * tokens, H, 2 * H);
    run_layers(&mtp_layers_[k], 1, st, pos, tokens, group, bucket, pos_dev);
    gather_last_rows(last_rows_, x_, B, tokens, H, checksum_dev_, t, st);
    rmsnorm(last_rows_, last_rows_, mod.shared_norm, B, H, eps, false, t, st);
    linear(cublas_.get(), logits_, CUDA_R_32F, last_rows_, lm_head_, t, B, V, H);
    argmax_rows(draft_, logits_, B, V, st);
  }
}

void CudaStage::head_forward(cudaStream_t st, int tokens, int32_t* out) {
  gather_last_rows(last_rows_, x_, cfg_.work.batch, tokens, static_cast<int>(hidden_), checksum_dev_, cfg_.work.dtype,
                   st);
  head_logits_argmax(st, cfg_.work.batch, out);
}

void CudaStage::head_logits_argmax(cudaStream_t st, int rows, int32_t* out) {
  const int B = rows;  // the head's rows: B, or a ragged step's
  const int H = static_cast<int>(hidden_);
  rmsnorm(last_rows_, last_rows_, final_norm_, B, H, final_eps_, final_norm_plus_one_, cfg_.work.dtype, st);
  const int V = static_cast<int>(plan_.vocab_local);  // this rank's vocabulary slice (all at width 1)
  linear(cublas_.get(), logits_, CUDA_R_32F, last_rows_, lm_head_, cfg_.work.dtype, B, V, H);
  if (final_softcap_ > 0.0f) softcap_inplace(logits_, static_cast<size_t>(B) * V, final_softcap_, st);
  if (!tp_) {
    argmax_rows(out, logits_, B, V, st);
    return;
  }
  // Vocabulary-parallel: this rank's best (logit, id) per row, the group's pairs, their best.
  argmax_pairs(pairs_, logits_, B, V, static_cast<int>(plan_.vocab_begin), st);
  tp_->enqueue_allgather(pairs_, all_pairs_, static_cast<size_t>(B) * sizeof(ArgmaxPair), st);
  argmax_of_pairs(out, all_pairs_, tp_->width(), B, st);
}

cudaGraphExec_t CudaStage::decode_graph(int group, int pos) {
  const int bucket = decode_context_bucket(pos, cfg_.work.max_context());
  const std::pair<int, int> key{group, bucket};
  if (auto it = graphs_.find(key); it != graphs_.end()) return it->second.get();
  if (graphs_.size() >= kMaxDecodeGraphs) return nullptr;
  // Captured on a private stream in thread-local mode: another thread's CUDA calls (the
  // transport's, other lanes') neither join nor break the capture. Nothing captured runs now.
  const cudaStream_t cs = capture_stream_.get();
  bind_cublas(cs);
  CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  try {
    if (plan_.has_embed) {
      embedding(x_, graph_tokens_, static_cast<size_t>(cfg_.work.batch), embed_, vocab_, static_cast<int>(hidden_),
                embed_scale_, bad_token_dev_, cfg_.work.dtype, cs);
    }
    run_layers(layers_.data(), layers_.size(), cs, pos, 1, group, bucket, pos_dev_);
    if (plan_.has_head) {
      head_forward(cs, 1, graph_out_);
      if (!mtp_.empty()) mtp_forward(cs, graph_out_, pos, 1, group, bucket, pos_dev_);
    }
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(cs, &partial);
    if (partial) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();  // an invalidated capture's error, not to be blamed on a later launch
    throw;
  }
  cudaGraph_t raw = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(cs, &raw));
  const GraphHandle graph(raw);
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
  return graphs_.emplace(key, GraphExecHandle(exec)).first->second.get();
}

void CudaStage::layer_forward(const LayerWeights& w, cudaStream_t st, char* x, const LayerPass& pass, int group) {
  const LayerShape& s = w.plan.shape;
  const DType t = cfg_.work.dtype;
  const int M = pass.M, H = static_cast<int>(hidden_);
  const float eps = static_cast<float>(s.rms_eps);
  const bool p1 = s.norm_plus_one;

  // Attention block.
  rmsnorm(h_, x, w.input_norm, M, H, eps, p1, t, st);
  if (s.is_mla()) {
    mla_attention_block(w, st, pass, group);
  } else {
    gqa_attention(w, st, pass, group);
  }
  if (tp_) tp_->enqueue_allreduce_sum(h_, static_cast<size_t>(M) * H, t, st);  // row-parallel o_proj
  if (s.sandwich_norm) rmsnorm(h_, h_, w.post_attention_norm, M, H, eps, p1, t, st);
  // x += attention output; h = pre-MLP norm(x).
  add_rmsnorm(x, h_, h_, s.sandwich_norm ? w.pre_feedforward_norm : w.post_attention_norm, M, H, eps, p1, t, st);

  // MLP block.
  if (s.is_moe()) {
    moe_mlp(w, st, M);
  } else {
    dense_mlp(w, st, M);
  }
  if (tp_) tp_->enqueue_allreduce_sum(h_, static_cast<size_t>(M) * H, t, st);  // row-parallel down_proj
  if (s.sandwich_norm) rmsnorm(h_, h_, w.post_feedforward_norm, M, H, eps, p1, t, st);
  add_inplace(x, h_, static_cast<size_t>(M) * H, t, st);
}

void CudaStage::gqa_attention(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, int group) {
  const LayerShape& s = w.plan.shape;
  const DType t = cfg_.work.dtype;
  cublasHandle_t hb = cublas_.get();
  const int M = pass.M, H = static_cast<int>(hidden_), hd = s.head_dim;
  const int nb = pass.nb, tokens = pass.tokens, pos = pass.pos;
  const int nq = s.n_heads * hd, nkv = s.n_kv_heads * hd;
  const size_t cache_off = static_cast<size_t>(pass.b0) * cfg_.work.max_context() * nkv;
  void* kc = at(w.k_cache[group], cache_off);
  void* vc = at(w.v_cache[group], cache_off);
  linear(hb, qkv_, cuda_type(t), h_, w.qkv, t, M, nq + 2 * nkv, H);
  QkvShape qs;
  qs.batch = pass.ragged ? 1 : nb;
  qs.tokens = pass.ragged ? M : tokens;
  qs.pos0 = pos;
  qs.max_context = cfg_.work.max_context();
  qs.n_heads = s.n_heads;
  qs.n_kv_heads = s.n_kv_heads;
  qs.head_dim = hd;
  qs.qk_norm = s.qk_norm;
  qs.plus_one = s.norm_plus_one;
  qs.eps = static_cast<float>(s.rms_eps);
  qs.pos0_dev = pass.pos_dev;
  if (pass.ragged) {  // each token's own position and slot (kc, vc: the group's whole caches)
    qs.token_pos = ragged_meta(pass.ragged->token_pos + pass.chunk->t0);
    qs.token_slot = ragged_meta(pass.ragged->token_slot + pass.chunk->t0);
  }
  qkv_rope_cache(q_, kc, vc, qkv_, w.bias, w.q_norm, w.k_norm, rope_cos_[w.plan.rope], rope_sin_[w.plan.rope], qs, t, st);
  if (pass.ragged) {
    ragged_gqa_attention(w, st, pass, kc, vc);  // kc, vc: the group's whole caches
  } else {
    cpu::AttentionShape as = attention_shape(s, nb, tokens, pos, cfg_.work.max_context());
    as.sinks = w.sinks;
    if (tokens == 1) {
      attention_decode(attn_, q_, kc, vc, as, partial_, t, st,
                       pass.bucket > 0 ? decode_plan_keys(pass.bucket, s.sliding_window) : 0, pass.pos_dev);
    } else {
      attention_prefill(hb, attn_, q_, kc, vc, as, plan_.query_block, scores_, probs_, t, st);
    }
  }
  linear(hb, h_, cuda_type(t), attn_, w.o, t, M, H, nq);
  if (w.o_bias) add_bias_rows(h_, false, w.o_bias, static_cast<size_t>(M), H, t, st);
}

// Absorbed MLA (CpuStage::mla_attention): q (through q_a and its norm where q_lora_rank > 0),
// the latent rows into the cache, the absorbed queries, MQA over the latent cache, each head's
// values through W_UV, o_proj.
void CudaStage::mla_attention_block(const LayerWeights& w, cudaStream_t st, const LayerPass& pass, int group) {
  const LayerShape& s = w.plan.shape;
  const model::MlaShape& a = s.mla;
  const DType t = cfg_.work.dtype;
  cublasHandle_t hb = cublas_.get();
  const int M = pass.M, H = static_cast<int>(hidden_), nh = s.n_heads;
  const int qk = a.qk_nope + a.qk_rope, D = a.kv_lora_rank + a.qk_rope;
  const float eps = static_cast<float>(s.rms_eps);
  if (a.q_lora_rank > 0) {
    linear(hb, mla_qa_, cuda_type(t), h_, w.q_a, t, M, a.q_lora_rank, H);
    rmsnorm(mla_qa_, mla_qa_, w.q_a_norm, M, a.q_lora_rank, eps, false, t, st);
    linear(hb, q_, cuda_type(t), mla_qa_, w.q_b, t, M, nh * qk, a.q_lora_rank);
  } else {
    linear(hb, q_, cuda_type(t), h_, w.q_b, t, M, nh * qk, H);
  }
  linear(hb, mla_kva_, cuda_type(t), h_, w.kv_a, t, M, D, H);
  // A ragged chunk: its M tokens as one sequence, each at its own position and slot.
  MlaCallShape ms = pass.ragged ? mla_call_shape(s, 1, M, 0, cfg_.work.max_context())
                                : mla_call_shape(s, pass.nb, pass.tokens, pass.pos, cfg_.work.max_context());
  ms.pos0_dev = pass.pos_dev;
  if (pass.ragged) {
    ms.token_pos = ragged_meta(pass.ragged->token_pos + pass.chunk->t0);
    ms.token_slot = ragged_meta(pass.ragged->token_slot + pass.chunk->t0);
  }
  void* cache = at(w.k_cache[group], static_cast<size_t>(pass.b0) * cfg_.work.max_context() * D);
  const float* cos_t = rope_cos_[w.plan.rope];
  const float* sin_t = rope_sin_[w.plan.rope];
  mla_kv_cache_write(cache, mla_kva_, w.kv_a_norm, cos_t, sin_t, ms, t, st);
  mla_absorb_queries(hb, mla_qabs_, q_, w.kv_b, cos_t, sin_t, ms, t, st);
  if (pass.ragged) {
    ragged_mla_attention(w, st, pass, group);
  } else {
    mla_attention(hb, mla_olat_, mla_qabs_, cache, ms, plan_.mla_query_block, scores_, probs_, t, st,
                  pass.tokens == 1 && pass.bucket > 0 ? decode_plan_keys(pass.bucket, 0) : 0);
  }
  mla_values(hb, attn_, mla_olat_, w.kv_b, ms, t, st);
  linear(hb, h_, cuda_type(t), attn_, w.o, t, M, H, nh * a.v_head_dim);
}

void CudaStage::dense_mlp(const LayerWeights& w, cudaStream_t st, int M) {
  const LayerShape& s = w.plan.shape;
  const DType t = cfg_.work.dtype;
  cublasHandle_t hb = cublas_.get();
  const int H = static_cast<int>(hidden_), I = s.intermediate;
  linear(hb, gu_, cuda_type(t), h_, w.gate_up, t, M, 2 * I, H);
  gated_activation(act_, gu_, M, I, s.act, t, st, static_cast<float>(s.swiglu_limit));
  linear(hb, h_, cuda_type(t), act_, w.down, t, M, H, I);
}

// Routed experts over only the rows routed to each (CpuStage::moe_mlp), without a host round
// trip: the router, the choice, the rows sorted by expert, two grouped GEMMs around the
// activation, each token's weighted sum in expert order; then the shared experts added.
void CudaStage::moe_mlp(const LayerWeights& w, cudaStream_t st, int M) {
  const LayerShape& s = w.plan.shape;
  const model::MoeShape& e = s.moe;
  const DType t = cfg_.work.dtype;
  const int H = static_cast<int>(hidden_), E = e.n_experts, k = e.top_k, Ie = e.expert_intermediate;
  const int choices = M * k, tiles = moe_max_tiles(choices, E);
  linear(cublas_.get(), moe_logits_, CUDA_R_32F, h_, w.router, t, M, E, H);
  if (w.router_bias) add_bias_rows(moe_logits_, true, w.router_bias, static_cast<size_t>(M), E, t, st);
  route_tokens(route_experts_, route_weights_, moe_logits_, M, e, w.correction, w.skew_log_p, w.skew_key, st);
  moe_dispatch(dispatch_, route_experts_, M, k, E, w.expert_tokens, st);
  moe_grouped_linear(moe_gu_, h_, /*gather=*/true, w.expert_gate_up, w.expert_gate_up_bias, dispatch_, 2 * Ie, H, tiles,
                     t, st);
  gated_activation(moe_act_, moe_gu_, static_cast<size_t>(choices), Ie, s.act, t, st, static_cast<float>(s.swiglu_limit));
  moe_grouped_linear(moe_y_, moe_act_, /*gather=*/false, w.expert_down, w.expert_down_bias, dispatch_, H, Ie, tiles, t,
                     st);
  if (s.intermediate > 0) {  // shared experts: every token, then the routed sum added
    moe_combine(moe_sum_, moe_y_, route_weights_, route_experts_, dispatch_, M, k, H, t, st);
    dense_mlp(w, st, M);
    add_inplace(h_, moe_sum_, static_cast<size_t>(M) * H, t, st);
  } else {
    moe_combine(h_, moe_y_, route_weights_, route_experts_, dispatch_, M, k, H, t, st);
  }
}

}  // namespace ppb::cuda
