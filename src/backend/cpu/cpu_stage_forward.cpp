// The CPU stage's forwards (cpu_stage_impl.h): the decoder layers, MLA, the MLP and MoE, the MTP
// modules and the head, over uniform and ragged steps.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_stage_impl.h"
#include "backend/tensor_parallel.h"
#include "common/error.h"
#include "model/model_spec.h"

namespace ppb::cpu {

using model::LayerShape;

void CpuStage::enqueue_forward(Lane& lane, const void* in, void* out, int group, int pos, int tokens) {
  if (group < 0 || group >= cfg_.work.groups || pos < 0 || tokens < 1 || pos + tokens > cfg_.work.max_context()) {
    throw InternalError("enqueue_forward(group=" + std::to_string(group) + ", pos=" + std::to_string(pos) +
                        ", tokens=" + std::to_string(tokens) + ") is outside the stage's groups=" +
                        std::to_string(cfg_.work.groups) + ", max_context=" + std::to_string(cfg_.work.max_context()));
  }
  lane.host_task([this, in, out, group, pos, tokens] { forward(in, out, group, uniform_rows(pos, tokens)); });
}

void CpuStage::enqueue_forward_ragged(Lane& lane, const void* in, void* out, int group, const RaggedStep& step) {
  check_ragged_step(step, group, cfg_.work);
  // The task owns its copy of the rows: the caller's step may be gone before the lane runs it.
  struct Rows {
    std::vector<int32_t> slot, pos, offset, released;
  };
  Rows rows{step.slot, step.pos, std::vector<int32_t>(step.slot.size() + 1, 0), step.released};
  for (int r = 0; r < step.rows(); ++r) rows.offset[r + 1] = rows.offset[r] + step.tokens[r];
  lane.host_task([this, in, out, group, rows = std::move(rows)] {
    release_slots(group, rows.released);  // before the rows: a new request may take a released slot
    forward(in, out, group, {static_cast<int>(rows.slot.size()), rows.slot.data(), rows.pos.data(), rows.offset.data()});
  });
}

cpu::RaggedBatch CpuStage::uniform_rows(int pos, int tokens) {
  const int B = cfg_.work.batch;
  for (int b = 0; b < B; ++b) {
    uniform_pos_[b] = pos;
    uniform_offset_[b + 1] = (b + 1) * tokens;
  }
  return {B, uniform_slot_.data(), uniform_pos_.data(), uniform_offset_.data()};
}

void CpuStage::forward(const void* in, void* out, int group, const cpu::RaggedBatch& rows) {
  const size_t M = static_cast<size_t>(rows.offset[rows.rows]);  // token rows
  if (has_embed_) {
    cpu::embedding(x_.data(), static_cast<const int32_t*>(in), M, embed_, vocab_, static_cast<int>(hidden_),
                   embed_scale_);
  } else {
    std::memcpy(x_.data(), in, M * hidden_ * sizeof(float));
  }
  for (const LayerWeights& w : layers_) layer_forward(w, group, rows);
  if (has_head_) {
    head_forward(static_cast<int32_t*>(out), rows);
    if (!mtp_.empty()) mtp_forward(static_cast<const int32_t*>(out), group, rows);
  } else {
    std::memcpy(out, x_.data(), M * hidden_ * sizeof(float));
  }
}

// The whole layer works on the M packed token rows of the step (norms, projections, MLP, MoE,
// the TP all-reduces); only RoPE, the KV-cache write and the attention go row by row.
void CpuStage::layer_forward(const LayerWeights& w, int group, const cpu::RaggedBatch& rows) {
  const LayerShape& s = w.shape;
  const int M = rows.offset[rows.rows];
  const int H = static_cast<int>(hidden_);
  const float eps = static_cast<float>(s.rms_eps);
  const size_t MH = static_cast<size_t>(M) * H;
  float* x = x_.data();
  float* h = h_.data();

  // Attention block.
  cpu::rmsnorm(h, x, w.input_norm, M, H, eps, s.norm_plus_one);
  if (s.is_mla()) {
    mla_attention(w, group, rows, h);
  } else {
    self_attention(w, group, rows, h);
  }
  if (tp_width_ > 1) tp_->allreduce_sum(h, MH);  // row-parallel o_proj: sum the ranks' partials
  if (s.sandwich_norm) cpu::rmsnorm(h, h, w.post_attention_norm, M, H, eps, s.norm_plus_one);
  cpu::add_inplace(x, h, MH);

  // MLP block.
  const float* pre_mlp_norm = s.sandwich_norm ? w.pre_feedforward_norm : w.post_attention_norm;
  cpu::rmsnorm(h, x, pre_mlp_norm, M, H, eps, s.norm_plus_one);
  if (s.is_moe()) {
    moe_mlp(w, M, h);
  } else {
    gated_mlp(h, h, M, w.intermediate, {w.gate, w.up, w.down}, s);
  }
  if (tp_width_ > 1) tp_->allreduce_sum(h, MH);  // row-parallel down_proj
  if (s.sandwich_norm) cpu::rmsnorm(h, h, w.post_feedforward_norm, M, H, eps, s.norm_plus_one);
  cpu::add_inplace(x, h, MH);
}

void CpuStage::self_attention(const LayerWeights& w, int group, const cpu::RaggedBatch& rows, float* out) {
  const LayerShape& s = w.shape;
  const int M = rows.offset[rows.rows];
  const int H = static_cast<int>(hidden_);
  const int hd = s.head_dim;
  const int nq = s.n_heads * hd;  // this rank's heads
  const int nkv = s.n_kv_heads * hd;
  const float eps = static_cast<float>(s.rms_eps);
  const int ctx = cfg_.work.max_context();
  const float* hn = out;  // the normed input; overwritten only by the final o_proj
  cpu::linear(q_.data(), hn, w.q, w.q_bias, M, nq, H);
  cpu::linear(k_.data(), hn, w.k, w.k_bias, M, nkv, H);
  cpu::linear(v_.data(), hn, w.v, w.v_bias, M, nkv, H);
  if (s.qk_norm) {
    cpu::rmsnorm(q_.data(), q_.data(), w.q_norm, static_cast<size_t>(M) * s.n_heads, hd, eps, s.norm_plus_one);
    cpu::rmsnorm(k_.data(), k_.data(), w.k_norm, static_cast<size_t>(M) * s.n_kv_heads, hd, eps, s.norm_plus_one);
  }
  const RopeTable& rt = ropes_[w.rope_table];
  cpu::rope_ragged(q_.data(), rows, s.n_heads, hd, rt.cos.data(), rt.sin.data());
  cpu::rope_ragged(k_.data(), rows, s.n_kv_heads, hd, rt.cos.data(), rt.sin.data());
  float* kc = w.k_cache[group];
  float* vc = w.v_cache[group];
  cpu::kv_cache_write_ragged(kc, k_.data(), rows, ctx, nkv);
  cpu::kv_cache_write_ragged(vc, v_.data(), rows, ctx, nkv);
  cpu::AttentionShape as;
  as.batch = cfg_.work.batch;  // the group's slots
  as.max_context = ctx;
  as.n_heads = s.n_heads;
  as.n_kv_heads = s.n_kv_heads;
  as.head_dim = hd;
  as.window = s.sliding_window;
  as.scale = static_cast<float>(s.attn_scale > 0.0 ? s.attn_scale : 1.0 / std::sqrt(static_cast<double>(hd)));
  as.softcap = static_cast<float>(s.attn_softcap);
  as.sinks = w.sinks;
  cpu::attention_ragged(attn_.data(), q_.data(), kc, vc, as, rows, scores_.data());
  cpu::linear(out, attn_.data(), w.o, w.o_bias, M, H, nq);
}

// Absorbed MLA (DeepSeek-V2 paper §2.1.2; DeepSeek-V3 inference/model.py, attn_impl "absorb"):
// W_kvb's key half is folded into each head's query (q_lat = W_UK^T q_nope, [kv_lora]) and its
// value half applied after the attention (v = W_UV o_lat), so the attention itself is MQA over
// the latent cache rows [c_kv, k_rope] with keys and values in the same rows: scores
// q_lat . c_kv + q_rope . k_rope; outputs sum_j p_j [c_kv, k_rope]_j, of which the first
// kv_lora_rank features are o_lat. Equal, up to rounding, to expanding k_nope = W_UK c_kv and
// v = W_UV c_kv per position (tests/unit/test_cpu_ops.cpp checks it against that form).
void CpuStage::mla_attention(const LayerWeights& w, int group, const cpu::RaggedBatch& rows, float* out) {
  const LayerShape& s = w.shape;
  const model::MlaShape& a = s.mla;
  const int M = rows.offset[rows.rows], H = static_cast<int>(hidden_), nh = s.n_heads, ctx = cfg_.work.max_context();
  const int nope = a.qk_nope, rd = a.qk_rope, qk = nope + rd, L = a.kv_lora_rank, D = L + rd, vd = a.v_head_dim;
  const float eps = static_cast<float>(s.rms_eps);
  const float* hn = out;  // the normed input; overwritten only by the final o_proj
  float* q = q_.data();
  if (a.q_lora_rank > 0) {
    cpu::linear(mla_qa_.data(), hn, w.q_a, nullptr, M, a.q_lora_rank, H);
    cpu::rmsnorm(mla_qa_.data(), mla_qa_.data(), w.q_a_norm, M, a.q_lora_rank, eps, false);
    cpu::linear(q, mla_qa_.data(), w.q_b, nullptr, M, nh * qk, a.q_lora_rank);
  } else {
    cpu::linear(q, hn, w.q_b, nullptr, M, nh * qk, H);
  }
  float* kva = mla_kva_.data();
  cpu::linear(kva, hn, w.kv_a, nullptr, M, D, H);
  for (int m = 0; m < M; ++m) cpu::rmsnorm(kva + static_cast<size_t>(m) * D, kva + static_cast<size_t>(m) * D, w.kv_a_norm, 1, L, eps, false);
  // RoPE on k_rope (one "head" per token) and on each head's q_rope, staged contiguously.
  const RopeTable& rt = ropes_[w.rope_table];
  float* r = mla_rope_.data();
  for (int m = 0; m < M; ++m) std::memcpy(r + static_cast<size_t>(m) * rd, kva + static_cast<size_t>(m) * D + L, rd * sizeof(float));
  cpu::rope_ragged(r, rows, 1, rd, rt.cos.data(), rt.sin.data());
  for (int m = 0; m < M; ++m) std::memcpy(kva + static_cast<size_t>(m) * D + L, r + static_cast<size_t>(m) * rd, rd * sizeof(float));
  float* cache = w.k_cache[group];
  cpu::kv_cache_write_ragged(cache, kva, rows, ctx, D);
  // Absorbed queries [M, nh, D]: q_lat then the rotated q_rope.
  float* qa = mla_q_.data();
  for (int h = 0; h < nh; ++h)
    cpu::sgemm(false, M, L, nope, 1.0f, q + static_cast<size_t>(h) * qk, nh * qk,
               w.kv_b + static_cast<size_t>(h) * (nope + vd) * L, L, 0.0f, qa + static_cast<size_t>(h) * D, nh * D);
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < nh; ++h)
      std::memcpy(r + (static_cast<size_t>(m) * nh + h) * rd, q + static_cast<size_t>(m) * nh * qk + static_cast<size_t>(h) * qk + nope,
                  rd * sizeof(float));
  cpu::rope_ragged(r, rows, nh, rd, rt.cos.data(), rt.sin.data());
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < nh; ++h)
      std::memcpy(qa + (static_cast<size_t>(m) * nh + h) * D + L, r + (static_cast<size_t>(m) * nh + h) * rd, rd * sizeof(float));
  cpu::AttentionShape as;
  as.batch = cfg_.work.batch;  // the group's slots
  as.max_context = ctx;
  as.n_heads = nh;
  as.n_kv_heads = 1;
  as.head_dim = D;
  as.scale = static_cast<float>(s.attn_scale);
  cpu::attention_ragged(attn_.data(), qa, cache, cache, as, rows, scores_.data());
  // Each head's values: W_UV [v, kv_lora] times its o_lat.
  float* values = mla_values_.data();
  for (int h = 0; h < nh; ++h)
    cpu::sgemm(true, M, vd, L, 1.0f, attn_.data() + static_cast<size_t>(h) * D, nh * D,
               w.kv_b + (static_cast<size_t>(h) * (nope + vd) + nope) * L, L, 0.0f, values + static_cast<size_t>(h) * vd, nh * vd);
  cpu::linear(out, values, w.o, nullptr, M, H, nh * vd);
}

void CpuStage::gated_mlp(float* out, const float* in, int rows, int I, const MlpWeights& w, const LayerShape& s) {
  const int H = static_cast<int>(hidden_);
  cpu::linear(gate_.data(), in, w.gate, w.gate_bias, rows, I, H);
  cpu::linear(up_.data(), in, w.up, w.up_bias, rows, I, H);
  cpu::gated_activation(gate_.data(), gate_.data(), up_.data(), static_cast<size_t>(rows) * I, s.act,
                        static_cast<float>(s.swiglu_limit));
  cpu::linear(out, gate_.data(), w.down, w.down_bias, rows, H, I);
}

// Routed experts over only the tokens routed to each (grouped by expert, in expert order, so the
// sum of a token's contributions has one fixed order), then the shared experts.
void CpuStage::moe_mlp(const LayerWeights& w, int rows, float* out) {
  const LayerShape& s = w.shape;
  const model::MoeShape& e = s.moe;
  const int E = e.n_experts, k = e.top_k, Ie = e.expert_intermediate, H = static_cast<int>(hidden_);
  const float* hn = out;  // the normed input
  cpu::linear(moe_logits_.data(), hn, w.router, w.router_bias, rows, E, H);
  cpu::RouteSkew skew{w.skew_log_p.data(), w.skew_key};
  cpu::route_tokens(route_experts_.data(), route_weights_.data(), moe_logits_.data(), rows, e, w.router_correction,
                    w.skew_log_p.empty() ? nullptr : &skew);
  // Counting sort of the rows * k choices by expert, keeping token order within an expert.
  const int n_choices = rows * k;
  std::fill(expert_count_.begin(), expert_count_.begin() + E + 1, 0);
  for (int i = 0; i < n_choices; ++i) ++expert_count_[route_experts_[i] + 1];
  for (int x = 0; x < E; ++x) expert_count_[x + 1] += expert_count_[x];
  {
    std::vector<int> next(expert_count_.begin(), expert_count_.begin() + E);
    for (int i = 0; i < n_choices; ++i) expert_slots_[next[route_experts_[i]]++] = i;
  }
  float* sum = moe_sum_.data();
  std::fill(sum, sum + static_cast<size_t>(rows) * H, 0.0f);
  float* xr = moe_rows_.data();
  float* y = moe_out_.data();
  for (int x = 0; x < E; ++x) {
    const int begin = expert_count_[x], n = expert_count_[x + 1] - begin;
    expert_tokens_[w.moe_index][x + 1] += n;
    if (n == 0) continue;  // decode reads only the experts its tokens chose
    for (int r = 0; r < n; ++r)
      std::memcpy(xr + static_cast<size_t>(r) * H, hn + static_cast<size_t>(expert_slots_[begin + r] / k) * H, H * sizeof(float));
    gated_mlp(y, xr, n, Ie,
              {w.expert_gate[x], w.expert_up[x], w.expert_down[x], w.expert_gate_bias[x], w.expert_up_bias[x],
               w.expert_down_bias[x]},
              s);
    for (int r = 0; r < n; ++r) {
      const int slot = expert_slots_[begin + r];
      const float wt = route_weights_[slot];
      float* dst = sum + static_cast<size_t>(slot / k) * H;
      const float* src = y + static_cast<size_t>(r) * H;
      for (int j = 0; j < H; ++j) dst[j] += wt * src[j];
    }
  }
  if (w.intermediate > 0) {  // shared experts: every token
    gated_mlp(y, hn, rows, w.intermediate, {w.gate, w.up, w.down}, s);
    cpu::add_inplace(sum, y, static_cast<size_t>(rows) * H);
  }
  std::memcpy(out, sum, static_cast<size_t>(rows) * H * sizeof(float));
}

// DeepSeek-V3's MTP module k (inference/model.py, README_WEIGHTS): h' = eh_proj([enorm(E t),
// hnorm(h)]) then a decoder layer, then the shared head's norm and lm_head drafting the next
// token; module k + 1 starts from module k's hidden state and draft. The token input is the
// head's greedy token for every position of a sequence (this stage does not receive the
// prompt's ids; the cost is the module's either way), and the drafts are not verified: the
// pipeline's tokens stay the main model's. The modules' last hidden states join the checksum,
// so that validation covers them.
void CpuStage::mtp_forward(const int32_t* tokens, int group, const cpu::RaggedBatch& rows) {
  const int R = rows.rows, M = rows.offset[R], H = static_cast<int>(hidden_);
  std::copy(tokens, tokens + R, draft_.begin());
  float* cat = mtp_cat_.data();
  for (const MtpModule& mod : mtp_) {
    for (int r = 0; r < R; ++r) {
      const float* e = mtp_embed_ + static_cast<size_t>(draft_[r]) * H;  // the row's draft, every token
      for (int m = rows.offset[r]; m < rows.offset[r + 1]; ++m) {
        cpu::rmsnorm(cat + static_cast<size_t>(m) * 2 * H, e, mod.enorm, 1, H, mtp_eps_, false);
        cpu::rmsnorm(cat + static_cast<size_t>(m) * 2 * H + H, x_.data() + static_cast<size_t>(m) * H, mod.hnorm, 1, H,
                     mtp_eps_, false);
      }
    }
    cpu::linear(x_.data(), cat, mod.eh_proj, nullptr, M, H, 2 * H);
    layer_forward(mod.layer, group, rows);
    float* last = last_rows_.data();
    checksum_ += gather_last_rows(rows);
    cpu::rmsnorm(last, last, mod.shared_norm, R, H, mtp_eps_, false);
    cpu::linear(logits_.data(), last, lm_head_, nullptr, R, vocab_local_, H);
    cpu::argmax_rows(draft_.data(), logits_.data(), R, vocab_local_);
  }
}

double CpuStage::gather_last_rows(const cpu::RaggedBatch& rows) {
  const size_t H = hidden_;
  double sum = 0.0;
  for (int r = 0; r < rows.rows; ++r) {
    const float* row = x_.data() + static_cast<size_t>(rows.offset[r + 1] - 1) * H;
    std::memcpy(last_rows_.data() + r * H, row, H * sizeof(float));
    for (size_t j = 0; j < H; ++j) sum += row[j];
  }
  return sum;
}

void CpuStage::head_forward(int32_t* out, const cpu::RaggedBatch& rows) {
  const int R = rows.rows;
  const size_t H = hidden_;
  float* last = last_rows_.data();
  checksum_ += gather_last_rows(rows);
  cpu::rmsnorm(last, last, final_norm_, R, static_cast<int>(H), final_eps_, final_norm_plus_one_);
  const int V = vocab_local_;
  cpu::linear(logits_.data(), last, lm_head_, nullptr, R, V, static_cast<int>(H));
  if (final_softcap_ > 0.0f) cpu::softcap_inplace(logits_.data(), static_cast<size_t>(R) * V, final_softcap_);
  cpu::argmax_rows(out, logits_.data(), R, V);
  if (tp_width_ > 1) {
    // Vocabulary-parallel head: this rank's best token (ties: its lowest id, argmax_rows), then
    // the group's best, ties to the lowest id: width 1's answer.
    for (int r = 0; r < R; ++r) {
      best_[r] = logits_[static_cast<size_t>(r) * V + out[r]];
      out[r] += static_cast<int32_t>(vocab_begin_);
    }
    tp_->allreduce_argmax(best_.data(), out, R);
  }
}

}  // namespace ppb::cpu
