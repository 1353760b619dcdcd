// cuda::attention_ragged (continuous batching, issue 37) against its CPU twin
// cpu::attention_ragged on the same inputs (rounded to the dtype first), per dtype, with
// ‖out − ref‖ / ‖ref‖ and the tolerances of check_attention in test_cuda_kernels.cpp (the same
// flash-decoding partials and merge: f32 2e-5, f16 3e-3, bf16 2e-2, cuda_test_util.h's tol).
// The CPU twin is itself held bitwise to cpu::attention per row (test_ragged_attention.cpp).
// Every test skips when no GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
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
