// cuda::attention_ragged (continuous batching, issue 37) against its CPU twin
// cpu::attention_ragged on the same inputs (rounded to the dtype first), per dtype, with
// ‖out − ref‖ / ‖ref‖ and the tolerances of check_attention in test_cuda_kernels.cpp (the same
// flash-decoding partials and merge: f32 2e-5, f16 3e-3, bf16 2e-2, cuda_test_util.h's tol).
// The CPU twin is itself held bitwise to cpu::attention per row (test_ragged_attention.cpp).
// Then the ragged modes of the CUDA stage's per-token kernels (below). Every test skips when no
// GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "cuda_test_util.h"
#include "ragged_test_batch.h"

namespace {

namespace cpu = ppb::cpu;
using ppb::DType;
using ppb_cuda_test::DBuf;
using ppb_cuda_test::fvec;
using ppb_cuda_test::random_floats;
using ppb_cuda_test::rel_err;
using ppb_cuda_test::rounded;
using ppb_cuda_test::tol;
using ppb_ragged_test::RaggedArrays;
using ppb_ragged_test::RaggedRow;
namespace cu = ppb::cuda;

struct RaggedCase {
  const char* name;
  std::vector<RaggedRow> rows;
  int slots, ctx, nh, nkv, hd, window;
  float softcap;
  bool sinks;
};

cpu::AttentionShape shape_of(const RaggedCase& c) {
  cpu::AttentionShape s;
  s.batch = c.slots;
  s.max_context = c.ctx;
  s.n_heads = c.nh;
  s.n_kv_heads = c.nkv;
  s.head_dim = c.hd;
  s.window = c.window;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  s.softcap = c.softcap;
  return s;
}

/// A cache with random rows where a row holds positions [0, pos + n), NaN elsewhere (idle
/// slots, unwritten positions): a kernel reading outside a row's keys turns its output NaN.
fvec cache_for(const RaggedCase& c, uint32_t seed) {
  const size_t row = static_cast<size_t>(c.nkv) * c.hd;
  fvec v(static_cast<size_t>(c.slots) * c.ctx * row, std::numeric_limits<float>::quiet_NaN());
  const fvec r = random_floats(v.size(), seed, -2.0f, 2.0f);
  for (const RaggedRow& q : c.rows) {
    const size_t first = static_cast<size_t>(q.slot) * c.ctx * row;
    std::copy(r.begin() + first, r.begin() + first + (q.pos + q.n) * row, v.begin() + first);
  }
  return v;
}

/// int32 host values in device memory.
cu::DeviceMemory device_ints(const std::vector<int32_t>& v) {
  cu::DeviceMemory d(std::max<size_t>(v.size(), 1) * sizeof(int32_t));
  EXPECT_EQ(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

/// Runs the CUDA twin on the case's batch (planned for plan_keys; 0 = the longest row's keys)
/// and returns its output (fp32) and *bad; ref gets the CPU twin's on the same rounded inputs.
/// device_slots, where non-null, replaces the slots the kernel is given (a scheduler's bug).
fvec run_cuda(const RaggedCase& c, DType t, int plan_keys, fvec* ref, int* bad_out,
              const std::vector<int32_t>* device_slots = nullptr) {
  cpu::AttentionShape s = shape_of(c);
  const RaggedArrays a = ppb_ragged_test::ragged_arrays(c.rows);
  const size_t tok = static_cast<size_t>(c.nh) * c.hd;
  const fvec q = rounded(random_floats(a.tokens() * tok, 40, -2.0f, 2.0f), t);
  const fvec kc = rounded(cache_for(c, 41), t), vc = rounded(cache_for(c, 42), t);
  const fvec sinks = random_floats(c.nh, 43);
  if (plan_keys == 0) {
    plan_keys = ppb_ragged_test::max_keys(c.rows);
    if (c.window > 0) plan_keys = std::min(plan_keys, c.window);
  }
  DBuf dq = DBuf::from(q, t), dk = DBuf::from(kc, t), dv = DBuf::from(vc, t), dout(q.size(), t);
  cu::DeviceMemory dslot = device_ints(device_slots ? *device_slots : a.slot), dpos = device_ints(a.pos), doff = device_ints(a.offset);
  cu::DeviceMemory dsinks(sinks.size() * sizeof(float)), dbad(sizeof(int));
  EXPECT_EQ(cudaMemcpy(dsinks.get(), sinks.data(), sinks.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(dbad.get(), 0, sizeof(int)), cudaSuccess);
  cu::DeviceMemory partial(std::max<size_t>(cu::attention_ragged_scratch_floats(s, a.tokens(), plan_keys), 1) *
                           sizeof(float));
  cpu::AttentionShape sd = s;
  sd.sinks = c.sinks ? dsinks.as<float>() : nullptr;
  const cpu::RaggedBatch rb{static_cast<int>(a.slot.size()), dslot.as<int32_t>(), dpos.as<int32_t>(),
                            doff.as<int32_t>()};
  cu::attention_ragged(dout.get(), dq.get(), dk.get(), dv.get(), sd, rb, a.tokens(), plan_keys, partial.as<float>(),
                       dbad.as<int>(), t, nullptr);
  ppb_cuda_test::sync();
  EXPECT_EQ(cudaMemcpy(bad_out, dbad.get(), sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  s.sinks = c.sinks ? sinks.data() : nullptr;
  ref->assign(q.size(), 0.0f);
  fvec scratch(cpu::attention_scratch_floats(c.ctx));
  cpu::attention_ragged(ref->data(), q.data(), kc.data(), vc.data(), s, a.view(), scratch.data());
  return dout.host();
}

/// The brief's step (ragged_test_batch.h) and a larger one whose decode rows take several key
/// chunks beside prefills, GQA groups of 2 and 4, window + softcap + sinks: f32, f16 and bf16
/// against the CPU twin, *bad left 0, no output NaN (no read outside a row's keys).
TEST(CudaRagged, AttentionRaggedMatchesCpuTwin) {
  REQUIRE_GPU();
  const std::vector<RaggedRow> big{{4, 0, 40}, {0, 1100, 1}, {5, 3, 1}, {2, 500, 7}, {1, 700, 1}};
  const RaggedCase cases[] = {
      {"brief", ppb_ragged_test::brief_step(), ppb_ragged_test::kBriefSlots, ppb_ragged_test::kBriefContext, 4, 2, 16,
       0, 0.0f, false},
      {"brief_window_softcap_sinks", ppb_ragged_test::brief_step(), ppb_ragged_test::kBriefSlots,
       ppb_ragged_test::kBriefContext, 4, 2, 16, 4, 1.5f, true},
      {"splits_hd128_group4", big, 6, 1200, 8, 2, 128, 0, 0.0f, false},
      {"splits_window_sinks", big, 6, 1200, 8, 2, 128, 300, 0.0f, true},
  };
  for (DType t : ppb_cuda_test::kDTypes)
    for (const RaggedCase& c : cases) {
      fvec ref;
      int bad = -1;
      const fvec out = run_cuda(c, t, 0, &ref, &bad);
      EXPECT_EQ(bad, 0) << c.name;
      EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); })) << c.name;
      EXPECT_LT(rel_err(out, ref), tol(t, 2e-5)) << c.name << " " << ppb::dtype_name(t);
    }
}

/// A row whose keys exceed the plan (60 + 1 keys planned for 32: one chunk) and a slot outside
/// the cache (3 of 2): *bad = 1, that row's token zero; the other row still matches the twin.
TEST(CudaRagged, AttentionRaggedReportsRowsOutsideThePlanOrTheCache) {
  REQUIRE_GPU();
  const RaggedCase over_plan{"over_plan", {{0, 5, 2}, {1, 60, 1}}, 2, 64, 4, 2, 16, 0, 0.0f, false};
  const RaggedCase in_plan{"bad_slot", {{0, 5, 2}, {1, 6, 1}}, 2, 64, 4, 2, 16, 0, 0.0f, false};
  const std::vector<int32_t> bad_slots{0, 3};
  const size_t tok = 4 * 16;  // floats per token
  for (bool slot_case : {false, true}) {
    fvec ref;
    int bad = -1;
    const fvec out = slot_case ? run_cuda(in_plan, DType::f32, 0, &ref, &bad, &bad_slots)
                               : run_cuda(over_plan, DType::f32, 32, &ref, &bad);
    EXPECT_EQ(bad, 1) << (slot_case ? "slot 3 of 2" : "61 keys planned for 32");
    for (size_t i = 2 * tok; i < 3 * tok; ++i) ASSERT_EQ(out[i], 0.0f) << "the bad row's token, slot_case " << slot_case;
    const fvec good(out.begin(), out.begin() + 2 * tok), good_ref(ref.begin(), ref.begin() + 2 * tok);
    EXPECT_LT(rel_err(good, good_ref), 2e-5) << "slot_case " << slot_case;
  }
}

}  // namespace

// ---- the ragged modes of the stage's per-token kernels ------------------------------------------
//
// qkv_rope_cache, mla_kv_cache_write and mla_absorb_queries with per-token positions and slots
// (QkvShape / MlaCallShape token_pos, token_slot), gather_rows and mtp_concat's token_row, each
// against the uniform launch they generalise, row by row (those are held to the CPU twins by
// test_cuda_kernels.cpp and test_cuda_mla.cpp): the same arithmetic per element, so bitwise, but
// for mla_absorb_queries' GEMM (cuBLAS may pick another algorithm for M rows than for one row's).

namespace {

using ppb_ragged_test::RaggedRow;

/// A step over 4 slots of 12 positions: a 3-token prefill in slot 2, a decode at 5 in slot 0, a
/// 2-token continuation at 1 in slot 3 (slot 1 idle).
const std::vector<RaggedRow> kStep{{2, 0, 3}, {0, 5, 1}, {3, 1, 2}};
constexpr int kSlots = 4, kCtx = 12;

/// Per packed token: its position, its slot and its row (the stage's RaggedPlan::meta arrays).
struct TokenArrays {
  std::vector<int32_t> pos, slot, row;
};
TokenArrays token_arrays(const std::vector<RaggedRow>& rows) {
  TokenArrays a;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int t = 0; t < rows[r].n; ++t) {
      a.pos.push_back(rows[r].pos + t);
      a.slot.push_back(rows[r].slot);
      a.row.push_back(static_cast<int32_t>(r));
    }
  return a;
}

/// RoPE tables [kCtx, dims / 2] on the device.
std::pair<DBuf, DBuf> rope_tables(int dims) {
  ppb::model::Rope rope;
  rope.theta = 10000.0;
  const std::vector<double> inv = cpu::rope_inv_freq(rope, dims);
  fvec cs(static_cast<size_t>(kCtx) * dims / 2), sn(cs.size());
  cpu::rope_tables(cs.data(), sn.data(), inv.data(), dims / 2, kCtx);
  return {DBuf::from(cs, DType::f32), DBuf::from(sn, DType::f32)};
}

const char* elem(const DBuf& b, size_t i, DType t) { return static_cast<const char*>(b.get()) + i * ppb::dtype_bytes(t); }
char* elem(DBuf& b, size_t i, DType t) { return static_cast<char*>(b.get()) + i * ppb::dtype_bytes(t); }

}  // namespace

TEST(CudaRagged, QkvRopeCachePerTokenEqualsPerRowLaunches) {
  REQUIRE_GPU();
  const int nh = 4, nkv = 2, hd = 32, nq = nh * hd, nk = nkv * hd, n_all = nq + 2 * nk;
  const TokenArrays ta = token_arrays(kStep);
  const int M = static_cast<int>(ta.pos.size());
  auto [dcs, dsn] = rope_tables(hd);
  for (DType t : ppb_cuda_test::kDTypes) {
    const fvec qkv = rounded(random_floats(static_cast<size_t>(M) * n_all, 70), t);
    const fvec bias = rounded(random_floats(n_all, 71, -0.1f, 0.1f), t);
    const fvec qn = rounded(random_floats(hd, 72, 0.5f, 1.5f), t), kn = rounded(random_floats(hd, 73, 0.5f, 1.5f), t);
    DBuf dqkv = DBuf::from(qkv, t), db = DBuf::from(bias, t), dqn = DBuf::from(qn, t), dkn = DBuf::from(kn, t);
    const size_t cache = static_cast<size_t>(kSlots) * kCtx * nk;
    DBuf q1(static_cast<size_t>(M) * nq, t), k1(cache, t), v1(cache, t);  // one ragged launch
    DBuf q2(static_cast<size_t>(M) * nq, t), k2(cache, t), v2(cache, t);  // a launch per row
    cu::DeviceMemory dpos = device_ints(ta.pos), dslot = device_ints(ta.slot);
    cu::QkvShape s;
    s.max_context = kCtx;
    s.n_heads = nh;
    s.n_kv_heads = nkv;
    s.head_dim = hd;
    s.qk_norm = true;
    s.eps = 1e-6f;
    cu::QkvShape sr = s;
    sr.batch = 1;
    sr.tokens = M;
    sr.token_pos = dpos.as<int32_t>();
    sr.token_slot = dslot.as<int32_t>();
    const float* cs = static_cast<const float*>(dcs.get());
    const float* sn = static_cast<const float*>(dsn.get());
    cu::qkv_rope_cache(q1.get(), k1.get(), v1.get(), dqkv.get(), db.get(), dqn.get(), dkn.get(), cs, sn, sr, t, nullptr);
    int off = 0;
    for (const RaggedRow& r : kStep) {
      cu::QkvShape s1 = s;
      s1.batch = 1;
      s1.tokens = r.n;
      s1.pos0 = r.pos;
      const size_t c0 = static_cast<size_t>(r.slot) * kCtx * nk;
      cu::qkv_rope_cache(elem(q2, static_cast<size_t>(off) * nq, t), elem(k2, c0, t), elem(v2, c0, t),
                         elem(dqkv, static_cast<size_t>(off) * n_all, t), db.get(), dqn.get(), dkn.get(), cs, sn, s1, t,
                         nullptr);
      off += r.n;
    }
    ppb_cuda_test::sync();
    EXPECT_EQ(q1.host(), q2.host()) << ppb::dtype_name(t);
    EXPECT_EQ(k1.host(), k2.host()) << ppb::dtype_name(t);
    EXPECT_EQ(v1.host(), v2.host()) << ppb::dtype_name(t);
  }
}

TEST(CudaRagged, MlaCacheWriteAndQueryRopePerTokenEqualPerRowLaunches) {
  REQUIRE_GPU();
  const int nh = 2, nope = 16, R = 8, vd = 16, L = 32, D = L + R, qk = nope + R;
  const TokenArrays ta = token_arrays(kStep);
  const int M = static_cast<int>(ta.pos.size());
  auto [dcs, dsn] = rope_tables(R);
  const float* cs = static_cast<const float*>(dcs.get());
  const float* sn = static_cast<const float*>(dsn.get());
  cu::CublasHandle handle;
  for (DType t : ppb_cuda_test::kDTypes) {
    const fvec q = rounded(random_floats(static_cast<size_t>(M) * nh * qk, 80), t);
    const fvec kva = rounded(random_floats(static_cast<size_t>(M) * D, 81), t);
    const fvec kvb = rounded(random_floats(static_cast<size_t>(nh) * (nope + vd) * L, 82, -0.5f, 0.5f), t);
    const fvec norm = rounded(random_floats(L, 83, 0.5f, 1.5f), t);
    DBuf dq = DBuf::from(q, t), dkva = DBuf::from(kva, t), dkvb = DBuf::from(kvb, t), dnorm = DBuf::from(norm, t);
    const size_t cache = static_cast<size_t>(kSlots) * kCtx * D;
    DBuf c1(cache, t), c2(cache, t), qa1(static_cast<size_t>(M) * nh * D, t), qa2(static_cast<size_t>(M) * nh * D, t);
    cu::DeviceMemory dpos = device_ints(ta.pos), dslot = device_ints(ta.slot);
    cu::MlaCallShape s;
    s.max_context = kCtx;
    s.n_heads = nh;
    s.qk_nope = nope;
    s.qk_rope = R;
    s.v_head_dim = vd;
    s.kv_lora_rank = L;
    cu::MlaCallShape sr = s;
    sr.batch = 1;
    sr.tokens = M;
    sr.token_pos = dpos.as<int32_t>();
    sr.token_slot = dslot.as<int32_t>();
    CUBLAS_CHECK(cublasSetStream(handle.get(), nullptr));
    cu::mla_kv_cache_write(c1.get(), dkva.get(), dnorm.get(), cs, sn, sr, t, nullptr);
    cu::mla_absorb_queries(handle.get(), qa1.get(), dq.get(), dkvb.get(), cs, sn, sr, t, nullptr);
    int off = 0;
    for (const RaggedRow& r : kStep) {
      cu::MlaCallShape s1 = s;
      s1.batch = 1;
      s1.tokens = r.n;
      s1.pos0 = r.pos;
      cu::mla_kv_cache_write(elem(c2, static_cast<size_t>(r.slot) * kCtx * D, t), elem(dkva, static_cast<size_t>(off) * D, t),
                             dnorm.get(), cs, sn, s1, t, nullptr);
      cu::mla_absorb_queries(handle.get(), elem(qa2, static_cast<size_t>(off) * nh * D, t),
                             elem(dq, static_cast<size_t>(off) * nh * qk, t), dkvb.get(), cs, sn, s1, t, nullptr);
      off += r.n;
    }
    ppb_cuda_test::sync();
    EXPECT_EQ(c1.host(), c2.host()) << ppb::dtype_name(t);
    EXPECT_LT(rel_err(qa1.host(), qa2.host()), tol(t, 1e-6)) << ppb::dtype_name(t);
  }
}

TEST(CudaRagged, GatherRowsAndMtpConcatByRow) {
  REQUIRE_GPU();
  const int H = 48, batch = 3, tokens = 4, vocab = 11;
  for (DType t : ppb_cuda_test::kDTypes) {
    const fvec x = rounded(random_floats(static_cast<size_t>(batch) * tokens * H, 90), t);
    DBuf dx = DBuf::from(x, t), last1(static_cast<size_t>(batch) * H, t), last2(static_cast<size_t>(batch) * H, t);
    cu::DeviceMemory sums(2 * sizeof(double));
    // Each sequence's last token, as gather_last_rows takes it: the same rows and checksum bits.
    const std::vector<int32_t> last_index{3, 7, 11};
    cu::DeviceMemory didx = device_ints(last_index);
    cu::gather_last_rows(last1.get(), dx.get(), batch, tokens, H, sums.as<double>(), t, nullptr);
    cu::gather_rows(last2.get(), dx.get(), didx.as<int32_t>(), batch, H, sums.as<double>() + 1, t, nullptr);
    ppb_cuda_test::sync();
    double sum[2];
    ASSERT_EQ(cudaMemcpy(sum, sums.get(), sizeof sum, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(last1.host(), last2.host()) << ppb::dtype_name(t);
    EXPECT_EQ(sum[0], sum[1]) << ppb::dtype_name(t);
    // Any rows, any order: a host gather.
    const std::vector<int32_t> idx{9, 0, 5};
    cu::DeviceMemory didx2 = device_ints(idx), sum2(sizeof(double));
    cu::gather_rows(last2.get(), dx.get(), didx2.as<int32_t>(), 3, H, sum2.as<double>(), t, nullptr);
    ppb_cuda_test::sync();
    fvec ref;
    double ref_sum = 0.0;
    for (int32_t i : idx)
      for (int j = 0; j < H; ++j) {
        ref.push_back(x[static_cast<size_t>(i) * H + j]);
        ref_sum += ref.back();
      }
    double got_sum = 0.0;
    ASSERT_EQ(cudaMemcpy(&got_sum, sum2.get(), sizeof got_sum, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(last2.host(), ref) << ppb::dtype_name(t);
    EXPECT_NEAR(got_sum, ref_sum, 1e-9 * (1.0 + std::fabs(ref_sum))) << ppb::dtype_name(t);
    // mtp_concat: token_row = m / tokens is the uniform call; a ragged map picks each token's row.
    const fvec embed = rounded(random_floats(static_cast<size_t>(vocab) * H, 91), t);
    const fvec en = rounded(random_floats(H, 92, 0.5f, 1.5f), t), hn = rounded(random_floats(H, 93, 0.5f, 1.5f), t);
    DBuf de = DBuf::from(embed, t), den = DBuf::from(en, t), dhn = DBuf::from(hn, t);
    const size_t M = static_cast<size_t>(batch) * tokens;
    DBuf cat1(M * 2 * H, t), cat2(M * 2 * H, t), cat3(M * 2 * H, t);
    cu::DeviceMemory ddraft = device_ints({4, 10, 0});
    std::vector<int32_t> uniform_rows(M), ragged_rows{2, 2, 0, 1, 1, 1, 0, 2, 0, 0, 1, 2};
    for (size_t m = 0; m < M; ++m) uniform_rows[m] = static_cast<int32_t>(m / tokens);
    cu::DeviceMemory du = device_ints(uniform_rows), dr = device_ints(ragged_rows);
    const int32_t* draft = ddraft.as<int32_t>();
    cu::mtp_concat(cat1.get(), draft, de.get(), dx.get(), den.get(), dhn.get(), batch, tokens, H, 1e-6f, t, nullptr);
    cu::mtp_concat(cat2.get(), draft, de.get(), dx.get(), den.get(), dhn.get(), 1, static_cast<int>(M), H, 1e-6f, t,
                   nullptr, du.as<int32_t>());
    cu::mtp_concat(cat3.get(), draft, de.get(), dx.get(), den.get(), dhn.get(), 1, static_cast<int>(M), H, 1e-6f, t,
                   nullptr, dr.as<int32_t>());
    ppb_cuda_test::sync();
    EXPECT_EQ(cat1.host(), cat2.host()) << ppb::dtype_name(t);
    const std::vector<int32_t> draft_host{4, 10, 0};
    fvec ref_cat(M * 2 * H);
    for (size_t m = 0; m < M; ++m) {
      cpu::rmsnorm(ref_cat.data() + m * 2 * H, embed.data() + static_cast<size_t>(draft_host[ragged_rows[m]]) * H,
                   en.data(), 1, H, 1e-6f, false);
      cpu::rmsnorm(ref_cat.data() + m * 2 * H + H, x.data() + m * H, hn.data(), 1, H, 1e-6f, false);
    }
    EXPECT_LT(rel_err(cat3.host(), ref_cat), tol(t, 1e-6)) << ppb::dtype_name(t);
  }
}
