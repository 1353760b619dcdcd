// cpu::attention_ragged (continuous batching, issue 37) against a per-row reference: each row
// computed alone by cpu::attention with batch 1 at that row's position over a copy of its slot.
// Both run attention_sequence, the one code path, so the reference is bitwise, not a tolerance:
// the same shapes go to the same sgemm calls in the same order (cpu::attention itself is held to
// a double reference in test_cpu_ops.cpp, CpuOps.AttentionMatchesReference).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "common/error.h"
#include "ragged_test_batch.h"

namespace {

namespace cpu = ppb::cpu;
using fvec = std::vector<float>;
using ppb_ragged_test::RaggedArrays;
using ppb_ragged_test::RaggedRow;

fvec random_floats(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  fvec v(n);
  for (float& x : v) x = d(gen);
  return v;
}

/// GQA with 2 query heads per KV head, as the brief asks.
cpu::AttentionShape gqa_shape(int slots, int max_context, int window, float softcap, const float* sinks) {
  cpu::AttentionShape s;
  s.batch = slots;
  s.max_context = max_context;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.window = window;
  s.scale = 1.0f / std::sqrt(16.0f);
  s.softcap = softcap;
  s.sinks = sinks;
  return s;
}

/// A cache [slots, max_context, n_kv, hd] with random rows where a row of `rows` holds positions
/// [0, pos + n) and NaN everywhere else (idle slots, positions not yet written): a read outside
/// a row's own keys turns its output into NaN.
fvec cache_for(const std::vector<RaggedRow>& rows, const cpu::AttentionShape& s, uint32_t seed) {
  const size_t row = static_cast<size_t>(s.n_kv_heads) * s.head_dim;
  fvec c(static_cast<size_t>(s.batch) * s.max_context * row, std::numeric_limits<float>::quiet_NaN());
  const fvec r = random_floats(c.size(), seed);
  for (const RaggedRow& q : rows) {
    const size_t first = static_cast<size_t>(q.slot) * s.max_context * row;
    std::copy(r.begin() + first, r.begin() + first + (q.pos + q.n) * row, c.begin() + first);
  }
  return c;
}

/// Runs `fn` on every GEMM library this build has, at 1 and 2 threads (the row path is sgemm's).
template <typename Fn>
void for_each_gemm_library(Fn fn) {
  std::vector<cpu::GemmLibrary> libs{cpu::GemmLibrary::openblas};
  if (cpu::have_onednn()) libs.push_back(cpu::GemmLibrary::onednn);
  for (cpu::GemmLibrary lib : libs)
    for (int threads : {1, 2}) {
      cpu::set_gemm_library(lib);
      cpu::set_gemm_threads(threads);
      fn(cpu::gemm_library_name(lib) + " x" + std::to_string(threads));
    }
  cpu::set_gemm_library(cpu::GemmLibrary::openblas);
  cpu::set_gemm_threads(1);
}

/// attention_ragged over `rows` against each row alone (attention, batch 1, tokens n_r, pos0
/// pos_r, over a copy of the row's slot): bitwise, and every output finite.
void check_rows_alone(const std::vector<RaggedRow>& rows, const cpu::AttentionShape& s, const std::string& what) {
  const RaggedArrays a = ppb_ragged_test::ragged_arrays(rows);
  const size_t tok = static_cast<size_t>(s.n_heads) * s.head_dim;
  const size_t seq = static_cast<size_t>(s.max_context) * s.n_kv_heads * s.head_dim;
  const fvec q = random_floats(a.tokens() * tok, 1);
  const fvec kc = cache_for(rows, s, 2), vc = cache_for(rows, s, 3);
  fvec out(q.size(), 12345.0f), scratch(cpu::attention_scratch_floats(s.max_context));
  cpu::attention_ragged(out.data(), q.data(), kc.data(), vc.data(), s, a.view(), scratch.data());
  for (size_t r = 0; r < rows.size(); ++r) {
    const RaggedRow& row = rows[r];
    if (row.n == 0) continue;
    cpu::AttentionShape one = s;
    one.batch = 1;
    one.tokens = row.n;
    one.pos0 = row.pos;
    const size_t q0 = a.offset[r] * tok, nq = row.n * tok, k0 = row.slot * seq;
    const fvec qr(q.begin() + q0, q.begin() + q0 + nq);
    const fvec kr(kc.begin() + k0, kc.begin() + k0 + seq), vr(vc.begin() + k0, vc.begin() + k0 + seq);
    fvec ref(nq);
    cpu::attention(ref.data(), qr.data(), kr.data(), vr.data(), one, scratch.data());
    EXPECT_EQ(std::memcmp(ref.data(), out.data() + q0, nq * sizeof(float)), 0)
        << what << ": row " << r << " (slot " << row.slot << ", pos " << row.pos << ", n " << row.n << ")";
    for (size_t i = 0; i < nq; ++i) ASSERT_TRUE(std::isfinite(out[q0 + i])) << what << ": row " << r << " read NaN";
  }
}

/// The brief's step (prefills of 5 at 0 and 2 at 9, decodes at 17 and 3, an empty row; slots
/// 5, 0, 3, 1, 6 of 7), plain and with a sliding window of 4, softcap and sinks (the window cuts
/// the decode at 17 and the prefill at 9; the prefill at 0 straddles it), per GEMM library.
TEST(RaggedAttention, EachRowEqualsAttentionAloneBitwise) {
  const std::vector<RaggedRow> rows = ppb_ragged_test::brief_step();
  const fvec sinks = random_floats(4, 4, -1.0f, 1.0f);
  for_each_gemm_library([&](const std::string& lib) {
    check_rows_alone(rows, gqa_shape(ppb_ragged_test::kBriefSlots, ppb_ragged_test::kBriefContext, 0, 0.0f, nullptr),
                     lib + " global");
    check_rows_alone(rows, gqa_shape(ppb_ragged_test::kBriefSlots, ppb_ragged_test::kBriefContext, 4, 1.5f, sinks.data()),
                     lib + " window 4, softcap, sinks");
  });
}

/// A prefill longer than attention's query block (64) beside decodes, so a row takes several
/// blocks; the slots in reverse order.
TEST(RaggedAttention, LongPrefillBesideDecodesEqualsAttentionAlone) {
  const std::vector<RaggedRow> rows{{3, 0, 70}, {2, 40, 1}, {1, 99, 1}, {0, 10, 30}};
  check_rows_alone(rows, gqa_shape(4, 100, 0, 0.0f, nullptr), "long prefill");
}

/// Rows of equal position and length in slots 0..B-1 are attention()'s batch: the ragged call
/// gives its bits (prefill-shaped rows and decode rows).
TEST(RaggedAttention, UniformRowsEqualTheBatchedCall) {
  for (int n : {3, 1}) {
    const int B = 4, pos = 6;
    std::vector<RaggedRow> rows;
    for (int b = 0; b < B; ++b) rows.push_back({b, pos, n});
    cpu::AttentionShape s = gqa_shape(B, 16, 0, 0.0f, nullptr);
    s.tokens = n;
    s.pos0 = pos;
    const RaggedArrays a = ppb_ragged_test::ragged_arrays(rows);
    const fvec q = random_floats(static_cast<size_t>(B) * n * s.n_heads * s.head_dim, 5);
    const fvec kc = cache_for(rows, s, 6), vc = cache_for(rows, s, 7);
    fvec out(q.size()), ref(q.size()), scratch(cpu::attention_scratch_floats(s.max_context));
    cpu::attention_ragged(out.data(), q.data(), kc.data(), vc.data(), s, a.view(), scratch.data());
    cpu::attention(ref.data(), q.data(), kc.data(), vc.data(), s, scratch.data());
    EXPECT_EQ(std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)), 0) << "n " << n;
  }
}

/// rope_ragged and kv_cache_write_ragged (the stage's per-row RoPE and cache writes) on the
/// brief's step: each row's tokens rotated at its own positions, bitwise rope() of the row alone;
/// each row's K rows in its slot at its positions, every other cache entry untouched (NaN).
TEST(RaggedAttention, RopeAndCacheWriteRowByRow) {
  const std::vector<RaggedRow> rows = ppb_ragged_test::brief_step();
  const RaggedArrays a = ppb_ragged_test::ragged_arrays(rows);
  const int heads = 3, hd = 8, half = hd / 2, ctx = ppb_ragged_test::kBriefContext;
  const size_t tok = static_cast<size_t>(heads) * hd;
  fvec cos_t(static_cast<size_t>(ctx) * half), sin_t(cos_t.size());
  const std::vector<double> inv{1.0, 0.1, 0.01, 0.001};
  cpu::rope_tables(cos_t.data(), sin_t.data(), inv.data(), half, ctx);
  const fvec x0 = random_floats(a.tokens() * tok, 8);
  fvec x = x0;
  cpu::rope_ragged(x.data(), a.view(), heads, hd, cos_t.data(), sin_t.data());
  fvec cache(static_cast<size_t>(ppb_ragged_test::kBriefSlots) * ctx * tok, std::numeric_limits<float>::quiet_NaN());
  cpu::kv_cache_write_ragged(cache.data(), x.data(), a.view(), ctx, static_cast<int>(tok));
  std::vector<bool> written(cache.size() / tok, false);
  for (size_t r = 0; r < rows.size(); ++r) {
    const RaggedRow& row = rows[r];
    fvec one(x0.begin() + a.offset[r] * tok, x0.begin() + a.offset[r + 1] * tok);
    cpu::rope(one.data(), 1, row.n, heads, hd, row.pos, cos_t.data(), sin_t.data());
    if (!one.empty())  // a row of no tokens: nothing to compare (memcmp of a null vector's data is undefined)
      EXPECT_EQ(std::memcmp(one.data(), x.data() + a.offset[r] * tok, one.size() * sizeof(float)), 0) << "row " << r;
    for (int t = 0; t < row.n; ++t) {
      const size_t at = static_cast<size_t>(row.slot) * ctx + row.pos + t;
      written[at] = true;
      EXPECT_EQ(std::memcmp(cache.data() + at * tok, x.data() + (a.offset[r] + t) * tok, tok * sizeof(float)), 0)
          << "row " << r << " token " << t;
    }
  }
  for (size_t p = 0; p < written.size(); ++p)
    if (!written[p]) ASSERT_TRUE(std::isnan(cache[p * tok])) << "cache position " << p << " written";
}

/// A scheduler's bug is refused by name before anything is read: a slot outside the cache,
/// positions past its capacity, a negative position, offsets that decrease or do not start at 0.
TEST(RaggedAttention, RejectsRowsOutsideTheCache) {
  const cpu::AttentionShape s = gqa_shape(2, 8, 0, 0.0f, nullptr);
  fvec q(16 * 64), kc(2 * 8 * 32), vc(kc.size()), out(q.size()), scratch(cpu::attention_scratch_floats(8));
  auto run = [&](const std::vector<int32_t>& slot, const std::vector<int32_t>& pos, const std::vector<int32_t>& off) {
    const cpu::RaggedBatch rb{static_cast<int>(slot.size()), slot.data(), pos.data(), off.data()};
    cpu::attention_ragged(out.data(), q.data(), kc.data(), vc.data(), s, rb, scratch.data());
  };
  EXPECT_NO_THROW(run({1, 0}, {7, 0}, {0, 1, 9}));  // both end at the capacity, 8
  EXPECT_THROW(run({2, 0}, {0, 0}, {0, 1, 2}), ppb::InternalError);   // slot 2 of 2
  EXPECT_THROW(run({0, -1}, {0, 0}, {0, 1, 2}), ppb::InternalError);  // negative slot
  EXPECT_THROW(run({0, 1}, {7, 0}, {0, 2, 3}), ppb::InternalError);   // positions 7, 8 of 8
  EXPECT_THROW(run({0, 1}, {-1, 0}, {0, 1, 2}), ppb::InternalError);  // negative position
  EXPECT_THROW(run({0, 1}, {0, 0}, {0, 2, 1}), ppb::InternalError);   // offsets decrease
  EXPECT_THROW(run({0, 1}, {0, 0}, {1, 2, 3}), ppb::InternalError);   // offset[0] = 1
}

}  // namespace
