// CUDA multi-head latent attention (DeepSeek-V3 MLA, absorbed form), attention sinks (gpt-oss)
// and the MTP input (backend/cuda/cuda_ops.h) against their CPU twins (CpuStage::mla_attention's
// chain of cpu:: ops, cpu::attention, cpu::rmsnorm) on fresh random data, per dtype, with
// ‖out − ref‖ / ‖ref‖ (llm.c's check). Every test skips when no GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "common/error.h"
#include "cuda_test_util.h"
#include "model/model_spec.h"

namespace {

using namespace ppb_cuda_test;
namespace cpu = ppb::cpu;

/// Unit roundoff of a dtype (half the gap between 1 and the next value): what one rounding to
/// it costs, relatively.
double unit_roundoff(DType t) {
  switch (t) {
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
  }
  return 1.0;
}

// ---- MLA: the whole block (kv write + absorbed queries + attention + values) -------------------

struct MlaDims {
  int B = 2, nh = 4, nope = 16, R = 8, vd = 16, L = 32, ctx = 64;
  float eps = 1e-6f;
  int D() const { return L + R; }
  int qk() const { return nope + R; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(qk())); }
};

/// One call of the block: `T` tokens at position `pos` (the true one). host_pos0 >= 0: the
/// position is read from device memory by every kernel while the host is told host_pos0,
/// another position of a decode graph's bucket of plan_keys keys.
struct MlaPhase {
  const char* name;
  int pos, T, query_block, plan_keys, host_pos0;
};

/// The fp32 twin, step by step as CpuStage::mla_attention does it, with its persistent cache.
struct MlaRef {
  MlaDims d;
  fvec kv_b, kv_norm, cos, sin, cache;
  fvec qa, o_lat, values;
  double sum_q2k2 = 0.0;  // sum over attended (query row, key) of sum_d q_d^2 k_d^2
  size_t pairs = 0;

  void step(const fvec& q_in, const fvec& kva_in, int pos, int T) {
    const int B = d.B, M = B * T, nh = d.nh, nope = d.nope, rd = d.R, qk = d.qk(), L = d.L, D = d.D(), vd = d.vd;
    fvec q = q_in, kva = kva_in;
    for (int m = 0; m < M; ++m)
      cpu::rmsnorm(kva.data() + static_cast<size_t>(m) * D, kva.data() + static_cast<size_t>(m) * D, kv_norm.data(), 1,
                   L, d.eps, false);
    fvec r(static_cast<size_t>(M) * nh * rd);
    for (int m = 0; m < M; ++m)
      std::memcpy(r.data() + static_cast<size_t>(m) * rd, kva.data() + static_cast<size_t>(m) * D + L, rd * sizeof(float));
    cpu::rope(r.data(), B, T, 1, rd, pos, cos.data(), sin.data());
    for (int m = 0; m < M; ++m)
      std::memcpy(kva.data() + static_cast<size_t>(m) * D + L, r.data() + static_cast<size_t>(m) * rd, rd * sizeof(float));
    cpu::kv_cache_write(cache.data(), kva.data(), B, T, pos, d.ctx, D);
    qa.assign(static_cast<size_t>(M) * nh * D, 0.0f);
    for (int h = 0; h < nh; ++h)
      cpu::sgemm(false, M, L, nope, 1.0f, q.data() + static_cast<size_t>(h) * qk, nh * qk,
                 kv_b.data() + static_cast<size_t>(h) * (nope + vd) * L, L, 0.0f, qa.data() + static_cast<size_t>(h) * D,
                 nh * D);
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < nh; ++h)
        std::memcpy(r.data() + (static_cast<size_t>(m) * nh + h) * rd,
                    q.data() + static_cast<size_t>(m) * nh * qk + static_cast<size_t>(h) * qk + nope, rd * sizeof(float));
    cpu::rope(r.data(), B, T, nh, rd, pos, cos.data(), sin.data());
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < nh; ++h)
        std::memcpy(qa.data() + (static_cast<size_t>(m) * nh + h) * D + L, r.data() + (static_cast<size_t>(m) * nh + h) * rd,
                    rd * sizeof(float));
    cpu::AttentionShape as;
    as.batch = B;
    as.tokens = T;
    as.pos0 = pos;
    as.max_context = d.ctx;
    as.n_heads = nh;
    as.n_kv_heads = 1;
    as.head_dim = D;
    as.scale = d.scale();
    fvec attn(static_cast<size_t>(M) * nh * D), scratch(cpu::attention_scratch_floats(d.ctx));
    cpu::attention(attn.data(), qa.data(), cache.data(), cache.data(), as, scratch.data());
    o_lat.assign(static_cast<size_t>(M) * nh * L, 0.0f);
    for (size_t i = 0; i < static_cast<size_t>(M) * nh; ++i)
      std::memcpy(o_lat.data() + i * L, attn.data() + i * D, L * sizeof(float));
    values.assign(static_cast<size_t>(M) * nh * vd, 0.0f);
    for (int h = 0; h < nh; ++h)
      cpu::sgemm(true, M, vd, L, 1.0f, attn.data() + static_cast<size_t>(h) * D, nh * D,
                 kv_b.data() + (static_cast<size_t>(h) * (nope + vd) + nope) * L, L, 0.0f,
                 values.data() + static_cast<size_t>(h) * vd, nh * vd);
    // The logits' sensitivity (see mla_tolerance).
    sum_q2k2 = 0.0;
    pairs = 0;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < nh; ++h) {
          const float* qr = qa.data() + ((static_cast<size_t>(b) * T + t) * nh + h) * D;
          for (int j = 0; j <= pos + t; ++j) {
            const float* kr = cache.data() + (static_cast<size_t>(b) * d.ctx + j) * D;
            for (int x = 0; x < D; ++x) sum_q2k2 += static_cast<double>(qr[x]) * qr[x] * kr[x] * kr[x];
            ++pairs;
          }
        }
  }
};

/// Tolerance of the block's ‖out − ref‖/‖ref‖ (and of every intermediate: each is a prefix of
/// the chain), from the arithmetic. Inputs are rounded to `t` with rounded(), so both sides
/// start from the same values; the reference then runs in fp32, the GPU rounds to `t` five
/// times on the way: the latent cache rows, qa, the probabilities, o_lat and the values
/// (u = unit_roundoff(t), 2^-24 / 2^-11 / 2^-8). Round-to-nearest errors are independent and
/// zero-mean (rms u/√3 relative), and a product with random zero-mean factors (qa = q W_UK,
/// o_lat = P V, values = o_lat W_UV^T) carries an elementwise relative error of its input to
/// about the same relative error of its output. The logits amplify: relative errors of q and
/// k (rms u/√3 each) move a logit by rms (u/√3)·√2·A, A = scale·sqrt(mean Σ_d q_d² k_d²) over
/// the attended pairs (computed from the reference), and a logit's absolute error is its
/// probability's relative error. So the 16-bit part is (u/√3)·sqrt(5 + 2A²). On top, the
/// fp32 arithmetic of both sides: a reduction of length k accumulates ~2^-24·√k relatively
/// (random walk), summed over the chain's reductions (RMSNorm L, absorb nope, scores D, P·V
/// keys, values L; 16 for rsqrtf/expf's ulps), amplified by the logits (1 + A), for two
/// independent sides (√2). The test allows 4x that estimate: the norm of thousands of
/// independent errors sits within a few percent of its expectation, so 4x is headroom for
/// the model, not for a bug (a wrong mask, pairing or stride moves the result by O(1)).
double mla_tolerance(const MlaRef& ref, DType t, int keys) {
  const MlaDims& d = ref.d;
  const double u = unit_roundoff(t), u32 = std::ldexp(1.0, -24);
  const double A = d.scale() * std::sqrt(ref.sum_q2k2 / static_cast<double>(std::max<size_t>(ref.pairs, 1)));
  const double rounding = u / std::sqrt(3.0) * std::sqrt(5.0 + 2.0 * A * A);
  const double k_total = d.L + d.nope + d.D() + keys + d.L + 16;
  const double fp32 = std::sqrt(2.0) * u32 * std::sqrt(k_total) * (1.0 + A);
  return 4.0 * (rounding + fp32);
}

TEST(CudaMla, BlockMatchesCpuTwinPrefillThenDecode) {
  REQUIRE_GPU();
  const MlaDims d;
  const int B = d.B, nh = d.nh, qk = d.qk(), L = d.L, D = d.D(), vd = d.vd;
  // Prefill of 37 tokens in blocks of 16 (16, 16, 5), a chunked prefill after the cache (4, 2),
  // eager decode steps (query_block 1 and one larger than the call), then decode as a graph runs
  // it: 52 planned keys (ld rounded to 56, keys past the position masked), the position read from
  // the device while the host holds another position of the bucket.
  const MlaPhase phases[] = {
      {"prefill", 0, 37, 16, 0, -1},         {"chunked_prefill", 37, 6, 4, 0, -1},
      {"decode", 43, 1, 1, 0, -1},           {"decode_qb16", 44, 1, 16, 0, -1},
      {"decode_graph_a", 45, 1, 1, 52, 50},  {"decode_graph_b", 46, 1, 1, 52, 50},
  };
  const int max_qb = 16;
  ppb::model::Rope rope;
  rope.theta = 10000.0;
  const std::vector<double> inv = cpu::rope_inv_freq(rope, d.R);
  fvec cs(static_cast<size_t>(d.ctx) * d.R / 2), sn(cs.size());
  cpu::rope_tables(cs.data(), sn.data(), inv.data(), d.R / 2, d.ctx);
  DBuf dcs = DBuf::from(cs, DType::f32), dsn = DBuf::from(sn, DType::f32);
  const float* cos_d = static_cast<const float*>(dcs.get());
  const float* sin_d = static_cast<const float*>(dsn.get());
  cu::CublasHandle handle;
  for (DType t : kDTypes) {
    MlaRef ref;
    ref.d = d;
    ref.kv_b = rounded(random_floats(static_cast<size_t>(nh) * (d.nope + vd) * L, 50, -0.5f, 0.5f), t);
    ref.kv_norm = rounded(random_floats(L, 51, 0.5f, 1.5f), t);
    ref.cos = cs;
    ref.sin = sn;
    ref.cache.assign(static_cast<size_t>(B) * d.ctx * D, 0.0f);
    DBuf dkvb = DBuf::from(ref.kv_b, t), dnorm = DBuf::from(ref.kv_norm, t);
    DBuf dcache(ref.cache.size(), t);  // zeroed, as the stage allocates it
    cu::MlaCallShape s0;
    s0.batch = B;
    s0.max_context = d.ctx;
    s0.n_heads = nh;
    s0.qk_nope = d.nope;
    s0.qk_rope = d.R;
    s0.v_head_dim = vd;
    s0.kv_lora_rank = L;
    s0.eps = d.eps;
    s0.scale = d.scale();
    const size_t scratch = cu::mla_attention_scratch_elems(s0, max_qb);
    cu::DeviceMemory scores(scratch * sizeof(float)), pos_dev(sizeof(int));
    DBuf probs(scratch, t);
    uint32_t seed = 60;
    for (const MlaPhase& ph : phases) {
      const int M = B * ph.T;
      const fvec q = rounded(random_floats(static_cast<size_t>(M) * nh * qk, seed++, -2.0f, 2.0f), t);
      const fvec kva = rounded(random_floats(static_cast<size_t>(M) * D, seed++, -1.0f, 1.0f), t);
      DBuf dq = DBuf::from(q, t), dkva = DBuf::from(kva, t);
      DBuf dqa(static_cast<size_t>(M) * nh * D, t), dolat(static_cast<size_t>(M) * nh * L, t),
          dvalues(static_cast<size_t>(M) * nh * vd, t);
      cu::MlaCallShape s = s0;
      s.tokens = ph.T;
      s.pos0 = ph.pos;
      if (ph.host_pos0 >= 0) {
        CUDA_CHECK(cudaMemcpy(pos_dev.get(), &ph.pos, sizeof(int), cudaMemcpyHostToDevice));
        s.pos0 = ph.host_pos0;
        s.pos0_dev = pos_dev.as<int>();
      }
      cu::mla_kv_cache_write(dcache.get(), dkva.get(), dnorm.get(), cos_d, sin_d, s, t, nullptr);
      cu::mla_absorb_queries(handle.get(), dqa.get(), dq.get(), dkvb.get(), cos_d, sin_d, s, t, nullptr);
      cu::mla_attention(handle.get(), dolat.get(), dqa.get(), dcache.get(), s, ph.query_block,
                        scores.as<float>(), probs.get(), t, nullptr, ph.plan_keys);
      cu::mla_values(handle.get(), dvalues.get(), dolat.get(), dkvb.get(), s, t, nullptr);
      ppb_cuda_test::sync();
      ref.step(q, kva, ph.pos, ph.T);
      const double tl = mla_tolerance(ref, t, ph.plan_keys > 0 ? ph.plan_keys : ph.pos + ph.T);
      const std::string what = std::string(ph.name) + " " + ppb::dtype_name(t) + " tol " + std::to_string(tl);
      EXPECT_LT(rel_err(dcache.host(), ref.cache), tl) << "cache " << what;
      EXPECT_LT(rel_err(dqa.host(), ref.qa), tl) << "qa " << what;
      EXPECT_LT(rel_err(dolat.host(), ref.o_lat), tl) << "o_lat " << what;
      EXPECT_LT(rel_err(dvalues.host(), ref.values), tl) << "values " << what;
    }
    // A plan below the attended keys, or beyond the cache, is refused before any launch.
    cu::MlaCallShape bad = s0;
    bad.pos0 = 40;
    EXPECT_THROW(cu::mla_attention(handle.get(), nullptr, nullptr, dcache.get(), bad, 1, scores.as<float>(),
                                   probs.get(), t, nullptr, 40),
                 ppb::InternalError);
    EXPECT_THROW(cu::mla_attention(handle.get(), nullptr, nullptr, dcache.get(), bad, 1, scores.as<float>(),
                                   probs.get(), t, nullptr, d.ctx + 8),
                 ppb::InternalError);
  }
}

// ---- attention sinks (gpt-oss) --------------------------------------------------------------------

/// attention_decode (prefill = false) or attention_prefill with s.sinks against cpu::attention
/// with the same sinks. Tolerance: the existing attention tests' (tol(t, 2e-5)): the sink adds
/// one exp to each row's denominator and nothing to its rounding chain.
void check_sinks(const AttnCase& c, DType t, bool prefill) {
  const cpu::AttentionShape s = attention_shape_of(c);
  const size_t nq = static_cast<size_t>(c.nh) * c.hd, nk = static_cast<size_t>(c.nkv) * c.hd;
  const fvec q = rounded(random_floats(static_cast<size_t>(c.batch) * c.tokens * nq, 70, -2, 2), t);
  const fvec kc = rounded(random_floats(static_cast<size_t>(c.batch) * c.ctx * nk, 71, -2, 2), t);
  const fvec vc = rounded(random_floats(kc.size(), 72), t);
  // Sink logits around the scores' range: some rows dominated by the sink, some barely touched.
  const fvec sinks = random_floats(c.nh, 73, -2.0f, 3.0f);
  DBuf dq = DBuf::from(q, t), dk = DBuf::from(kc, t), dv = DBuf::from(vc, t), dout(q.size(), t);
  DBuf dsinks = DBuf::from(sinks, DType::f32);
  cpu::AttentionShape sd = s;
  sd.sinks = static_cast<const float*>(dsinks.get());
  if (prefill) {
    cu::CublasHandle h;
    const int qb = 16;
    const size_t n = cu::attention_prefill_scratch_elems(s, qb);
    cu::DeviceMemory scores(n * sizeof(float));
    DBuf probs(n, t);
    cu::attention_prefill(h.get(), dout.get(), dq.get(), dk.get(), dv.get(), sd, qb, scores.as<float>(), probs.get(), t,
                          nullptr);
  } else {
    cu::DeviceMemory partial(cu::attention_decode_scratch_floats(s) * sizeof(float));
    cu::attention_decode(dout.get(), dq.get(), dk.get(), dv.get(), sd, partial.as<float>(), t, nullptr);
  }
  ppb_cuda_test::sync();
  fvec ref(q.size());
  std::vector<float> scratch(cpu::attention_scratch_floats(c.ctx));
  cpu::AttentionShape sh = s;
  sh.sinks = sinks.data();
  cpu::attention(ref.data(), q.data(), kc.data(), vc.data(), sh, scratch.data());
  EXPECT_LT(rel_err(dout.host(), ref), tol(t, 2e-5))
      << c.name << " " << ppb::dtype_name(t) << (prefill ? " prefill" : " decode");
  // The sinks must matter here, or the test could not see them ignored: by far more than the
  // f32 tolerance (a long context dilutes a sink below the 16-bit types' tolerances).
  if (t == DType::f32) {
    fvec plain(q.size());
    cpu::attention(plain.data(), q.data(), kc.data(), vc.data(), s, scratch.data());
    EXPECT_GT(rel_err(plain, ref), 10 * tol(t, 2e-5)) << c.name;
  }
}

TEST(CudaAttentionSinks, DecodeMatchesCpu) {
  REQUIRE_GPU();
  const AttnCase cases[] = {
      {"gqa_short", 3, 1, 6, 16, 8, 2, 64, 0, 0.0f},
      {"gqa_long_splits", 2, 1, 1500, 1600, 8, 2, 64, 0, 0.0f},  // several chunks: the sink joins once
      {"window", 2, 1, 900, 1000, 8, 2, 64, 128, 0.0f},
      {"two_tokens_window", 2, 2, 50, 64, 4, 2, 32, 7, 0.0f},
  };
  for (DType t : kDTypes)
    for (const AttnCase& c : cases) check_sinks(c, t, /*prefill=*/false);
}

TEST(CudaAttentionSinks, PrefillMatchesCpu) {
  REQUIRE_GPU();
  const AttnCase cases[] = {
      {"gqa_from_zero", 2, 37, 0, 40, 8, 2, 64, 0, 0.0f},
      {"gqa_after_cache", 2, 20, 13, 40, 8, 2, 64, 0, 0.0f},
      {"window", 2, 60, 3, 64, 8, 2, 32, 9, 0.0f},
  };
  for (DType t : kDTypes)
    for (const AttnCase& c : cases) check_sinks(c, t, /*prefill=*/true);
}

// ---- MTP input --------------------------------------------------------------------------------

TEST(CudaMla, MtpConcatMatchesCpu) {
  REQUIRE_GPU();
  const int vocab = 37, batch = 3, tokens = 2;
  const std::vector<int32_t> draft = {5, 36, 0};
  for (DType t : kDTypes) {
    for (int H : {64, 1000}) {
      const int M = batch * tokens;
      const fvec embed = rounded(random_floats(static_cast<size_t>(vocab) * H, 90), t);
      const fvec x = rounded(random_floats(static_cast<size_t>(M) * H, 91, -3, 3), t);
      const fvec en = rounded(random_floats(H, 92, 0.5f, 1.5f), t), hn = rounded(random_floats(H, 93, 0.5f, 1.5f), t);
      DBuf de = DBuf::from(embed, t), dx = DBuf::from(x, t), den = DBuf::from(en, t), dhn = DBuf::from(hn, t);
      DBuf dcat(static_cast<size_t>(M) * 2 * H, t);
      cu::DeviceMemory ddraft(draft.size() * sizeof(int32_t));
      ASSERT_EQ(cudaMemcpy(ddraft.get(), draft.data(), draft.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                cudaSuccess);
      cu::mtp_concat(dcat.get(), ddraft.as<int32_t>(), de.get(), dx.get(), den.get(), dhn.get(), batch, tokens, H,
                     1e-6f, t, nullptr);
      ppb_cuda_test::sync();
      fvec ref(static_cast<size_t>(M) * 2 * H);  // CpuStage::mtp_forward's loop
      for (int m = 0; m < M; ++m) {
        cpu::rmsnorm(ref.data() + static_cast<size_t>(m) * 2 * H, embed.data() + static_cast<size_t>(draft[m / tokens]) * H,
                     en.data(), 1, H, 1e-6f, false);
        cpu::rmsnorm(ref.data() + static_cast<size_t>(m) * 2 * H + H, x.data() + static_cast<size_t>(m) * H, hn.data(), 1,
                     H, 1e-6f, false);
      }
      EXPECT_LT(rel_err(dcat.host(), ref), tol(t, 1e-6)) << ppb::dtype_name(t) << " H " << H;
    }
  }
}

}  // namespace
