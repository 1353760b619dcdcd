// The CUDA stage's construction (cuda_stage_impl.h): weights generated on the device, KV
// caches, RoPE tables, scratch; its records (checksum, expert counts) and create_cuda_stage.
// The forwards: cuda_stage_forward.cpp, cuda_stage_ragged.cpp.
#include "backend/cuda/cuda_stage.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/cuda/cuda_ragged_plan.h"
#include "backend/cuda/cuda_stage_impl.h"
#include "backend/cuda/cuda_stage_plan.h"
#include "backend/tensor_parallel.h"
#include "backend/weights.h"
#include "common/error.h"
#include "model/model_spec.h"

namespace ppb {
namespace cuda {
namespace {

/// "1.23 GiB", for messages.
std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

using model::LayerShape;

void* CudaStage::alloc(size_t bytes) {
  memory_.emplace_back(bytes);
  return memory_.back().get();
}

void* CudaStage::proj(size_t rows, size_t fan_in, int unit, Tensor t, void* dst, size_t row0) {
  void* p = dst ? dst : alloc_elems(rows * fan_in);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  fill_uniform(p, cfg_.work.dtype, rows * fan_in, weight_key_at(weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), row0 * fan_in),
               scale, 0.0f, init_stream_.get());
  return p;
}

void* CudaStage::norm(size_t n, int unit, Tensor t, bool plus_one) {
  void* p = alloc_elems(n);
  fill_uniform(p, cfg_.work.dtype, n, weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), 0.1f, plus_one ? 0.0f : 1.0f,
               init_stream_.get());
  return p;
}

void* CudaStage::bias_weights(size_t n, int unit, Tensor t, void* dst, size_t first) {
  void* p = dst ? dst : alloc_elems(n);
  fill_uniform(p, cfg_.work.dtype, n, weight_key_at(weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), first), 0.02f, 0.0f,
               init_stream_.get());
  return p;
}

float* CudaStage::f32_weights(size_t n, int unit, Tensor t, float scale) {
  auto* p = static_cast<float*>(alloc(n * sizeof(float)));
  fill_uniform(p, DType::f32, n, weight_key(cfg_.work.seed, unit, static_cast<uint64_t>(t)), scale, 0.0f, init_stream_.get());
  return p;
}

void CudaStage::add_mla_weights(LayerWeights& w, const StagePlan::Layer& l) {
  // MoE and MLA layers refuse tensor parallelism (tp_unsupported_reason): the whole layer.
  const LayerShape& s = l.shape;
  const int u = l.unit;
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context());
  const model::MlaShape& a = s.mla;
  const size_t nh = static_cast<size_t>(s.n_heads), qk = static_cast<size_t>(a.qk_nope + a.qk_rope);
  const size_t L = static_cast<size_t>(a.kv_lora_rank), D = L + static_cast<size_t>(a.qk_rope);
  if (a.q_lora_rank > 0) {
    const size_t ql = static_cast<size_t>(a.q_lora_rank);
    w.q_a = proj(ql, H, u, Tensor::q_a_proj);
    w.q_a_norm = norm(ql, u, Tensor::q_a_norm, false);
    w.q_b = proj(nh * qk, ql, u, Tensor::q_b_proj);
  } else {
    w.q_b = proj(nh * qk, H, u, Tensor::q_proj);
  }
  w.kv_a = proj(D, H, u, Tensor::kv_a_proj);
  w.kv_a_norm = norm(L, u, Tensor::kv_a_norm, false);
  w.kv_b = proj(nh * (a.qk_nope + a.v_head_dim), L, u, Tensor::kv_b_proj);
  w.o = proj(H, nh * a.v_head_dim, u, Tensor::o_proj);
  for (int g = 0; g < cfg_.work.groups; ++g) {
    // Zeroed at allocation (DeviceMemory), as it must be: a decode graph's attention spans its
    // whole context bucket and masks the keys past the position, which must then be finite
    // (0 x NaN would reach the output).
    void* c = alloc_elems(B * ctx * D);
    w.k_cache.push_back(c);
    w.v_cache.push_back(c);
  }
}

void CudaStage::add_attention_weights(LayerWeights& w, const StagePlan::Layer& l) {
  const LayerShape& s = l.shape;  // this rank's shard (the whole layer at width 1)
  const int u = l.unit;
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context());
  const size_t nq = static_cast<size_t>(s.n_heads) * s.head_dim, nkv = static_cast<size_t>(s.n_kv_heads) * s.head_dim;
  const size_t hd = static_cast<size_t>(s.head_dim);
  const size_t q0 = l.heads.q_begin * hd, kv0 = l.heads.kv_begin * hd;  // first rows of q / k and v
  const size_t nq_all = static_cast<size_t>(l.full.n_heads) * hd;
  // Column-parallel q/k/v: rows of the whole tensors; row-parallel o: columns.
  w.qkv = alloc_elems((nq + 2 * nkv) * H);
  proj(nq, H, u, Tensor::q_proj, w.qkv, q0);
  proj(nkv, H, u, Tensor::k_proj, at(w.qkv, nq * H), kv0);
  proj(nkv, H, u, Tensor::v_proj, at(w.qkv, (nq + nkv) * H), kv0);
  w.o = alloc_elems(H * nq);
  fill_uniform_cols(w.o, cfg_.work.dtype, H, nq_all, q0, nq, weight_key(cfg_.work.seed, u, static_cast<uint64_t>(Tensor::o_proj)),
                    static_cast<float>(1.0 / std::sqrt(static_cast<double>(nq_all))), init_stream_.get());
  if (s.attn_bias) {
    w.bias = alloc_elems(nq + 2 * nkv);
    bias_weights(nq, u, Tensor::q_bias, w.bias, q0);
    bias_weights(nkv, u, Tensor::k_bias, at(w.bias, nq), kv0);
    bias_weights(nkv, u, Tensor::v_bias, at(w.bias, nq + nkv), kv0);
  }
  if (s.qk_norm) {
    w.q_norm = norm(s.head_dim, u, Tensor::q_norm, s.norm_plus_one);
    w.k_norm = norm(s.head_dim, u, Tensor::k_norm, s.norm_plus_one);
  }
  if (s.o_bias) w.o_bias = bias_weights(H, u, Tensor::o_bias);  // gpt-oss refuses --tp: the whole bias
  if (s.attn_sinks) w.sinks = f32_weights(static_cast<size_t>(s.n_heads), u, Tensor::sinks, 1.0f);
  for (int g = 0; g < cfg_.work.groups; ++g) {
    w.k_cache.push_back(alloc_elems(B * ctx * nkv));
    w.v_cache.push_back(alloc_elems(B * ctx * nkv));
  }
}

void CudaStage::add_expert_weights(LayerWeights& w, const StagePlan::Layer& l) {
  const int u = l.unit;
  const size_t H = hidden_;
  const model::MoeShape& e = l.shape.moe;
  const size_t E = static_cast<size_t>(e.n_experts), Ie = static_cast<size_t>(e.expert_intermediate);
  w.router = proj(E, H, u, Tensor::router);
  if (e.router_bias) w.router_bias = bias_weights(E, u, Tensor::router_bias);
  if (e.router == model::RouterKind::sigmoid_grouped) w.correction = f32_weights(E, u, Tensor::router_correction, 0.02f);
  // Expert x's tensors in one block per kind, expert-major (the grouped GEMM's layout), each
  // filled from its own key (CpuStage::add_expert_weights): the same values as the CPU's.
  w.expert_gate_up = alloc_elems(E * 2 * Ie * H);
  w.expert_down = alloc_elems(E * H * Ie);
  if (e.expert_bias) {
    w.expert_gate_up_bias = alloc_elems(E * 2 * Ie);
    w.expert_down_bias = alloc_elems(E * H);
  }
  for (int x = 0; x < e.n_experts; ++x) {
    const size_t xi = static_cast<size_t>(x);
    proj(Ie, H, u, expert_tensor(Tensor::expert_gate, x), at(w.expert_gate_up, xi * 2 * Ie * H));
    proj(Ie, H, u, expert_tensor(Tensor::expert_up, x), at(w.expert_gate_up, (xi * 2 + 1) * Ie * H));
    proj(H, Ie, u, expert_tensor(Tensor::expert_down, x), at(w.expert_down, xi * H * Ie));
    if (e.expert_bias) {
      bias_weights(Ie, u, expert_tensor(Tensor::expert_gate_bias, x), at(w.expert_gate_up_bias, xi * 2 * Ie));
      bias_weights(Ie, u, expert_tensor(Tensor::expert_up_bias, x), at(w.expert_gate_up_bias, (xi * 2 + 1) * Ie));
      bias_weights(H, u, expert_tensor(Tensor::expert_down_bias, x), at(w.expert_down_bias, xi * H));
    }
  }
  w.expert_tokens = static_cast<int64_t*>(alloc(E * sizeof(int64_t)));  // zeroed (DeviceMemory)
  if (cfg_.expert_skew > 0.0) {
    w.skew_key = weight_key(cfg_.work.seed, static_cast<uint64_t>(u), static_cast<uint64_t>(Tensor::expert_skew));
    const std::vector<double> log_p = cpu::expert_popularity_log_p(e.n_experts, cfg_.expert_skew, w.skew_key);
    w.skew_log_p = static_cast<double*>(alloc(E * sizeof(double)));
    // From pageable memory the call returns once the bytes are staged (CUDA's API sync
    // behaviour), so log_p may go; the constructor's final synchronisation covers the DMA.
    CUDA_CHECK(cudaMemcpyAsync(w.skew_log_p, log_p.data(), E * sizeof(double), cudaMemcpyHostToDevice,
                               init_stream_.get()));
  }
}

LayerWeights CudaStage::make_layer(const StagePlan::Layer& l) {
  const LayerShape& s = l.shape;  // this rank's shard (the whole layer at width 1)
  const int u = l.unit;
  const size_t H = hidden_;
  const size_t I = static_cast<size_t>(s.intermediate);
  LayerWeights w;
  w.plan = l;
  w.input_norm = norm(H, u, Tensor::input_layernorm, s.norm_plus_one);
  if (s.is_mla()) {
    add_mla_weights(w, l);
  } else {
    add_attention_weights(w, l);
  }
  w.post_attention_norm = norm(H, u, Tensor::post_attention_layernorm, s.norm_plus_one);
  if (s.sandwich_norm) {
    w.pre_feedforward_norm = norm(H, u, Tensor::pre_feedforward_layernorm, s.norm_plus_one);
    w.post_feedforward_norm = norm(H, u, Tensor::post_feedforward_layernorm, s.norm_plus_one);
  }
  if (I > 0) {  // the dense MLP, or a MoE layer's shared experts: column-parallel gate/up, row-parallel down
    const size_t I_all = static_cast<size_t>(l.full.intermediate);
    w.gate_up = alloc_elems(2 * I * H);
    proj(I, H, u, Tensor::gate_proj, w.gate_up, l.i0);
    proj(I, H, u, Tensor::up_proj, at(w.gate_up, I * H), l.i0);
    w.down = alloc_elems(H * I);
    fill_uniform_cols(w.down, cfg_.work.dtype, H, I_all, l.i0, I,
                      weight_key(cfg_.work.seed, u, static_cast<uint64_t>(Tensor::down_proj)),
                      static_cast<float>(1.0 / std::sqrt(static_cast<double>(I_all))), init_stream_.get());
  }
  if (s.is_moe()) add_expert_weights(w, l);
  return w;
}

CudaStage::CudaStage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg)
    : first_(first), last_(last), cfg_(cfg), plan_(make_plan(m, first, last, cfg)) {
  if (cfg.tp_width > 1 && (cfg.tp == nullptr || cfg.tp->width() != cfg.tp_width || cfg.tp->rank() != cfg.tp_rank))
    throw InternalError("a CUDA stage of tensor-parallel width " + std::to_string(cfg.tp_width) +
                        " needs its group's NCCL communicator, of that width and rank");
  tp_ = cfg.tp_width > 1 ? cfg.tp : nullptr;
  hidden_ = static_cast<size_t>(m.hidden);
  dt_ = static_cast<size_t>(dtype_bytes(cfg.work.dtype));
  vocab_ = m.vocab;
  embed_scale_ = m.embed_scale_sqrt_hidden ? static_cast<float>(std::sqrt(static_cast<double>(m.hidden))) : 1.0f;
  final_norm_plus_one_ = m.final_norm_plus_one;
  final_softcap_ = static_cast<float>(m.final_softcap);
  final_eps_ = static_cast<float>(m.rms_eps);

  check_free_memory(first, last);  // say what does not fit before cudaMalloc fails somewhere in the middle
  make_embed_and_head(m, last);
  upload_rope_tables();
  for (const StagePlan::Layer& l : plan_.layers) layers_.push_back(make_layer(l));
  if (!plan_.mtp_layers.empty()) make_mtp_modules(m);
  allocate_scratch();
  CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
}

void CudaStage::check_free_memory(int first, int last) const {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (plan_.bytes.total() > free_b) {
    throw UserError("stage units [" + std::to_string(first) + ", " + std::to_string(last) + "] needs " +
                    gib(plan_.bytes.total()) + " of GPU memory (weights " + gib(plan_.bytes.weights) + ", KV cache " +
                    gib(plan_.bytes.kv_cache) + ", scratch " + gib(plan_.bytes.scratch) + ") but only " +
                    gib(free_b) + " are free; use more stages, a smaller --batch/--microbatches/context, or a "
                    "smaller --dtype");
  }
}

void CudaStage::make_embed_and_head(const model::ModelSpec& m, int last) {
  const size_t H = hidden_, V = static_cast<size_t>(m.vocab);
  if (plan_.has_embed) {
    embed_ = alloc_elems(V * H);
    fill_uniform(embed_, cfg_.work.dtype, V * H, embed_key(), 1.0f, 0.0f, init_stream_.get());
  }
  if (plan_.has_head) {
    final_norm_ = norm(H, last, Tensor::final_norm, m.final_norm_plus_one);
    // This rank's vocabulary rows (all at width 1): of the shared embedding, a tied copy, or lm_head.
    const size_t v0 = plan_.vocab_begin, Vl = plan_.vocab_local;
    if (plan_.head_shares_embed) {
      lm_head_ = at(embed_, v0 * H);
    } else if (m.tie_embeddings) {
      lm_head_ = alloc_elems(Vl * H);
      fill_uniform(lm_head_, cfg_.work.dtype, Vl * H, weight_key_at(embed_key(), v0 * H), 1.0f, 0.0f, init_stream_.get());
    } else {
      lm_head_ = proj(Vl, H, last, Tensor::lm_head, nullptr, v0);
    }
  }
}

void CudaStage::upload_rope_tables() {
  const size_t ctx = static_cast<size_t>(cfg_.work.max_context());
  for (const auto& [rope, hd] : plan_.ropes) {
    const std::vector<double> inv = cpu::rope_inv_freq(rope, hd);
    const size_t half = static_cast<size_t>(hd / 2);
    std::vector<float> c(ctx * half), s(ctx * half);
    cpu::rope_tables(c.data(), s.data(), inv.data(), hd / 2, cfg_.work.max_context());
    auto* dc = static_cast<float*>(alloc(c.size() * sizeof(float)));
    auto* ds = static_cast<float*>(alloc(s.size() * sizeof(float)));
    // On init_stream_, whose synchronisation at the end of the constructor covers the DMA
    // (a plain cudaMemcpy from pageable memory may return before the bytes landed).
    CUDA_CHECK(cudaMemcpyAsync(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice, init_stream_.get()));
    CUDA_CHECK(cudaMemcpyAsync(ds, s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice, init_stream_.get()));
    rope_cos_.push_back(dc);
    rope_sin_.push_back(ds);
  }
}

void CudaStage::make_mtp_modules(const model::ModelSpec& m) {
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context()),
               V = static_cast<size_t>(m.vocab);
  // Keyed by the unit ids num_units() + k, which no real unit has (CpuStage::add_mtp_modules).
  if (plan_.mtp_own_embed) {
    mtp_embed_ = alloc_elems(V * H);
    fill_uniform(mtp_embed_, cfg_.work.dtype, V * H, embed_key(), 1.0f, 0.0f, init_stream_.get());
  } else {
    mtp_embed_ = embed_;
  }
  for (const StagePlan::Layer& l : plan_.mtp_layers) {
    MtpModule mod;
    mod.enorm = norm(H, l.unit, Tensor::mtp_enorm, false);
    mod.hnorm = norm(H, l.unit, Tensor::mtp_hnorm, false);
    mod.eh_proj = proj(H, 2 * H, l.unit, Tensor::mtp_eh_proj);
    mod.shared_norm = norm(H, l.unit, Tensor::mtp_shared_norm, false);
    mtp_.push_back(mod);
    mtp_layers_.push_back(make_layer(l));
  }
  mtp_cat_ = alloc_elems(B * ctx * 2 * H);
  draft_ = static_cast<int32_t*>(alloc(B * sizeof(int32_t)));
}

void CudaStage::allocate_scratch() {
  const size_t H = hidden_, B = static_cast<size_t>(cfg_.work.batch), ctx = static_cast<size_t>(cfg_.work.max_context());
  workspace_ = alloc(kCublasWorkspaceBytes);
  x_ = alloc_elems(B * ctx * H);
  if (!layers_.empty() || !mtp_layers_.empty()) {
    const size_t R = static_cast<size_t>(plan_.rows);
    h_ = alloc_elems(R * H);
    qkv_ = alloc_elems(R * plan_.max_qkv);
    q_ = alloc_elems(R * plan_.max_q);
    attn_ = alloc_elems(R * plan_.max_q);
    gu_ = alloc_elems(R * 2 * plan_.max_inter);
    act_ = alloc_elems(R * plan_.max_inter);
    scores_ = static_cast<float*>(alloc(plan_.scores_elems * sizeof(float)));
    probs_ = alloc_elems(plan_.scores_elems);
    partial_ = static_cast<float*>(alloc(plan_.decode_floats * sizeof(float)));
    if (plan_.max_mla_kva > 0) {
      if (plan_.max_mla_qa > 0) mla_qa_ = alloc_elems(R * plan_.max_mla_qa);
      mla_kva_ = alloc_elems(R * plan_.max_mla_kva);
      mla_qabs_ = alloc_elems(R * plan_.max_mla_qabs);
      mla_olat_ = alloc_elems(R * plan_.max_mla_olat);
    }
    if (plan_.max_experts > 0) {
      const size_t choices = R * plan_.max_top_k, E = plan_.max_experts, Ie = plan_.max_expert_inter;
      moe_logits_ = static_cast<float*>(alloc(R * E * sizeof(float)));
      route_experts_ = static_cast<int32_t*>(alloc(choices * sizeof(int32_t)));
      route_weights_ = static_cast<float*>(alloc(choices * sizeof(float)));
      dispatch_ = moe_dispatch_at(alloc(moe_dispatch_bytes(static_cast<int>(choices), static_cast<int>(E)) + 256),
                                  static_cast<int>(choices), static_cast<int>(E));
      moe_gu_ = alloc_elems(choices * 2 * Ie);
      moe_act_ = alloc_elems(choices * Ie);
      moe_y_ = alloc_elems(choices * H);
      moe_sum_ = alloc_elems(R * H);
    }
  }
  if (plan_.has_head) {
    last_rows_ = alloc_elems(B * H);
    logits_ = static_cast<float*>(alloc(B * plan_.vocab_local * sizeof(float)));
    if (tp_) {
      pairs_ = static_cast<ArgmaxPair*>(alloc(B * sizeof(ArgmaxPair)));
      all_pairs_ = static_cast<ArgmaxPair*>(alloc(static_cast<size_t>(cfg_.tp_width) * B * sizeof(ArgmaxPair)));
    }
  }
  checksum_dev_ = static_cast<double*>(alloc(sizeof(double)));
  bad_token_dev_ = static_cast<int*>(alloc(sizeof(int)));
  bad_ragged_dev_ = static_cast<int*>(alloc(sizeof(int)));
  ragged_meta_ = static_cast<int32_t*>(alloc(ragged_meta_ints(cfg_.work.batch, B * ctx) * sizeof(int32_t)));
  pos_dev_ = static_cast<int*>(alloc(sizeof(int)));
  graph_tokens_ = static_cast<int32_t*>(alloc(B * sizeof(int32_t)));
  graph_out_ = static_cast<int32_t*>(alloc(B * sizeof(int32_t)));
  // Pinned copies of ragged steps' metadata, allocated now rather than inside a forward
  // (cudaHostAlloc may synchronize the device): 64 KiB holds a step of ~2,000 tokens.
  for (int i = 0; i < kMetaStagingBuffers; ++i) {
    meta_staging_.push_back(std::make_unique<MetaStaging>());
    meta_staging_.back()->host = PinnedMemory(kMetaStagingBytes);
  }
}

std::vector<std::vector<int64_t>> CudaStage::expert_tokens() const {
  std::vector<std::vector<int64_t>> rows;
  for (const auto* ls : {&layers_, &mtp_layers_}) {
    for (const LayerWeights& w : *ls) {
      if (!w.expert_tokens) continue;
      const size_t E = static_cast<size_t>(w.plan.shape.moe.n_experts);
      std::vector<int64_t> row(E + 1);
      row[0] = w.plan.layer;
      CUDA_CHECK(cudaMemcpyAsync(row.data() + 1, w.expert_tokens, E * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                 init_stream_.get()));
      CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

double CudaStage::checksum() const {
  double sum = 0.0;
  int bad = 0, bad_ragged = 0;
  CUDA_CHECK(cudaMemcpyAsync(&sum, checksum_dev_, sizeof sum, cudaMemcpyDeviceToHost, init_stream_.get()));
  CUDA_CHECK(cudaMemcpyAsync(&bad, bad_token_dev_, sizeof bad, cudaMemcpyDeviceToHost, init_stream_.get()));
  CUDA_CHECK(cudaMemcpyAsync(&bad_ragged, bad_ragged_dev_, sizeof bad_ragged, cudaMemcpyDeviceToHost,
                             init_stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
  if (bad) {
    throw InternalError("stage units [" + std::to_string(first_) + ", " + std::to_string(last_) +
                        "]: a token id outside [0, " + std::to_string(vocab_) + ") reached the embedding");
  }
  if (bad_ragged) {  // the host checked every row: the ragged plan's keys or slots are wrong
    throw InternalError("stage units [" + std::to_string(first_) + ", " + std::to_string(last_) +
                        "]: a ragged step's attention met a token outside its slot or its planned keys");
  }
  return plan_.has_head ? sum : 0.0;
}

void CudaStage::reset_checksum() {
  CUDA_CHECK(cudaMemsetAsync(checksum_dev_, 0, sizeof(double), init_stream_.get()));
  for (const auto* ls : {&layers_, &mtp_layers_})
    for (const LayerWeights& w : *ls)
      if (w.expert_tokens)
        CUDA_CHECK(cudaMemsetAsync(w.expert_tokens, 0, static_cast<size_t>(w.plan.shape.moe.n_experts) * sizeof(int64_t),
                                   init_stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(init_stream_.get()));
}

std::unique_ptr<StageExecutor> create_cuda_stage(const model::ModelSpec& m, int first, int last, const StageConfig& cfg) {
  return std::make_unique<CudaStage>(m, first, last, cfg);
}

}  // namespace cuda
}  // namespace ppb
