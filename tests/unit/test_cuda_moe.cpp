// The mixture-of-experts kernels (backend/cuda/kernels_moe.cu) against their CPU twins
// (cpu::route_tokens, CpuStage::moe_mlp's counting sort and expert sum) and a double reference
// of a whole routed MLP; gpt-oss's clamped SwiGLU and the bias add. Every test skips when no
// GPU is visible.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "cuda_test_util.h"
#include "fp_bounds.h"
#include "model/model_spec.h"

namespace {

using namespace ppb_cuda_test;
using ppb::model::Activation;
using ppb::model::MoeShape;
using ppb::model::RouterKind;
namespace cpu = ppb::cpu;

/// Unit roundoff of a dtype: 2^-24, 2^-11, 2^-8.
double unit_roundoff(DType t) {
  switch (t) {
    case DType::f32: return 0x1p-24;
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
  }
  return 0x1p-24;
}

template <typename V>
cu::DeviceMemory upload(const std::vector<V>& v) {
  cu::DeviceMemory m(std::max<size_t>(v.size(), 1) * sizeof(V));
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(m.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return m;
}

template <typename V>
std::vector<V> download(const void* p, size_t n) {
  std::vector<V> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(V), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

MoeShape moe_shape(RouterKind kind, int E, int k, bool norm_topk = true, int n_group = 1, int topk_group = 1,
                   double scaling = 1.0) {
  MoeShape m;
  m.n_experts = E;
  m.top_k = k;
  m.router = kind;
  m.norm_topk = norm_topk;
  m.n_group = n_group;
  m.topk_group = topk_group;
  m.routed_scaling = scaling;
  return m;
}

struct Route {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Route route_on_cpu(const MoeShape& moe, const fvec& logits, int M, const fvec& correction,
                   const std::vector<double>& log_p, uint64_t key) {
  Route r{std::vector<int32_t>(static_cast<size_t>(M) * moe.top_k), fvec(static_cast<size_t>(M) * moe.top_k)};
  const cpu::RouteSkew skew{log_p.data(), key};
  cpu::route_tokens(r.experts.data(), r.weights.data(), logits.data(), M, moe,
                    correction.empty() ? nullptr : correction.data(), log_p.empty() ? nullptr : &skew);
  return r;
}

Route route_on_gpu(const MoeShape& moe, const fvec& logits, int M, const fvec& correction,
                   const std::vector<double>& log_p, uint64_t key) {
  const size_t n = static_cast<size_t>(M) * moe.top_k;
  cu::DeviceMemory dz = upload(logits), dc = upload(correction), dp = upload(log_p);
  cu::DeviceMemory de(std::max<size_t>(n, 1) * sizeof(int32_t)), dw(std::max<size_t>(n, 1) * sizeof(float));
  cu::route_tokens(de.as<int32_t>(), dw.as<float>(), dz.as<float>(), M, moe,
                   correction.empty() ? nullptr : dc.as<float>(), log_p.empty() ? nullptr : dp.as<double>(), key,
                   nullptr);
  return Route{download<int32_t>(de.get(), n), download<float>(dw.get(), n)};
}

/// The GPU's choice equals the CPU's: the same experts in the same order, and weights within
/// 1e-6 relative. Both compute every score and weight in double from the same fp32 logits and
/// round once to float; the only differences are the last bits of the double exp/log of CUDA's
/// libdevice vs glibc (<= 1-2 ulp of double), far below one float rounding, so a float weight
/// differs by at most one float ulp (6e-8 relative) and only at a rounding boundary.
void expect_same_route(const MoeShape& moe, const fvec& logits, int M, const fvec& correction,
                       const std::vector<double>& log_p, uint64_t key, const std::string& what) {
  const Route c = route_on_cpu(moe, logits, M, correction, log_p, key);
  const Route g = route_on_gpu(moe, logits, M, correction, log_p, key);
  ASSERT_EQ(g.experts, c.experts) << what;
  for (size_t i = 0; i < c.weights.size(); ++i)
    ASSERT_NEAR(g.weights[i], c.weights[i], 1e-6 * std::fabs(c.weights[i])) << what << " choice " << i;
}

TEST(CudaMoe, RouteTokensMatchesCpu) {
  REQUIRE_GPU();
  const int M = 37;  // several blocks of warps, the last one partial
  const std::vector<double> none;
  for (int E : {8, 64, 384}) {
    const fvec z = random_floats(static_cast<size_t>(M) * E, 100 + E, -4.0f, 4.0f);
    const int k = std::min(8, E / 2);
    for (bool norm : {true, false})
      expect_same_route(moe_shape(RouterKind::softmax, E, k, norm), z, M, {}, none, 0,
                        "softmax E=" + std::to_string(E) + " norm_topk=" + std::to_string(norm));
    expect_same_route(moe_shape(RouterKind::topk_softmax, E, std::min(4, E)), z, M, {}, none, 0,
                      "topk_softmax E=" + std::to_string(E));
  }
  // DeepSeek-V3's router: sigmoid scores, a correction bias, 4 groups of which 2, scaling 2.5;
  // and the full-size 256 experts, 8 groups of which 4.
  for (int E : {16, 64, 256}) {
    const int G = E == 256 ? 8 : 4, TG = E == 256 ? 4 : 2, k = E == 16 ? 4 : 8;
    const fvec z = random_floats(static_cast<size_t>(M) * E, 200 + E, -4.0f, 4.0f);
    const fvec corr = random_floats(E, 300 + E, -0.2f, 0.2f);
    for (bool norm : {true, false})
      expect_same_route(moe_shape(RouterKind::sigmoid_grouped, E, k, norm, G, TG, 2.5), z, M, corr, none, 0,
                        "sigmoid_grouped E=" + std::to_string(E) + " norm_topk=" + std::to_string(norm));
  }
}

TEST(CudaMoe, RouteTokensSkewMatchesCpu) {
  REQUIRE_GPU();
  const int M = 45;
  for (int E : {16, 128, 384}) {
    const std::vector<double> log_p = cpu::expert_popularity_log_p(E, 1.2, 77 + E);
    const fvec z = random_floats(static_cast<size_t>(M) * E, 400 + E, -2.0f, 2.0f);
    const fvec corr = random_floats(E, 500 + E, -0.2f, 0.2f);
    const uint64_t key = 0x1234567890ABCDEFULL + E;
    expect_same_route(moe_shape(RouterKind::softmax, E, 8), z, M, {}, log_p, key, "skew softmax E=" + std::to_string(E));
    expect_same_route(moe_shape(RouterKind::topk_softmax, E, 4), z, M, {}, log_p, key,
                      "skew topk_softmax E=" + std::to_string(E));
    expect_same_route(moe_shape(RouterKind::sigmoid_grouped, E, 8, true, 4, 2, 2.5), z, M, corr, log_p, key,
                      "skew sigmoid_grouped E=" + std::to_string(E));
  }
}

TEST(CudaMoe, RouteTokensTiesGoToTheLowerIndex) {
  REQUIRE_GPU();
  const int E = 16, k = 3, M = 3;
  fvec z(static_cast<size_t>(M) * E, 0.0f);  // row 0: all equal
  for (int e : {9, 5, 2}) z[E + e] = 1.0f;     // row 1: three equal winners
  for (int e : {12, 3}) z[2 * E + e] = -0.5f;  // row 2: all equal but two losers
  const std::vector<double> none;
  for (RouterKind kind : {RouterKind::softmax, RouterKind::topk_softmax, RouterKind::sigmoid_grouped}) {
    const bool grouped = kind == RouterKind::sigmoid_grouped;
    const MoeShape moe = moe_shape(kind, E, k, true, grouped ? 4 : 1, grouped ? 2 : 1, 2.5);
    const fvec corr = grouped ? fvec(E, 0.0f) : fvec();
    expect_same_route(moe, z, M, corr, none, 0, "ties, router " + std::to_string(static_cast<int>(kind)));
    const Route g = route_on_gpu(moe, z, M, corr, none, 0);
    EXPECT_EQ(std::vector<int32_t>(g.experts.begin(), g.experts.begin() + k), (std::vector<int32_t>{0, 1, 2}));
    // Grouped (4 groups of 4, 2 kept): groups 0, 1, 2 tie (1 + 0 best two), 0 and 1 win: 2, 5,
    // then the lowest of the equal rest inside them: 0.
    EXPECT_EQ(std::vector<int32_t>(g.experts.begin() + k, g.experts.begin() + 2 * k),
              grouped ? (std::vector<int32_t>{2, 5, 0}) : (std::vector<int32_t>{2, 5, 9}));
    EXPECT_EQ(std::vector<int32_t>(g.experts.begin() + 2 * k, g.experts.end()), (std::vector<int32_t>{0, 1, 2}));
    for (int j = 0; j < k; ++j) EXPECT_FLOAT_EQ(g.weights[j], grouped ? 2.5f / k : 1.0f / k);
  }
}

TEST(CudaMoe, RouteTokensRefusesWhatTheCpuRefuses) {
  REQUIRE_GPU();
  cu::DeviceMemory buf(4096);
  auto call = [&](const MoeShape& moe, bool corr) {
    cu::route_tokens(buf.as<int32_t>(), buf.as<float>(), buf.as<float>(), 1, moe, corr ? buf.as<float>() : nullptr,
                     nullptr, 0, nullptr);
  };
  EXPECT_THROW(call(moe_shape(RouterKind::softmax, 4, 5), false), ppb::InternalError);
  EXPECT_THROW(call(moe_shape(RouterKind::softmax, 4, 0), false), ppb::InternalError);
  EXPECT_THROW(call(moe_shape(RouterKind::sigmoid_grouped, 16, 4, true, 3, 1), true), ppb::InternalError);
  EXPECT_THROW(call(moe_shape(RouterKind::sigmoid_grouped, 16, 4, true, 4, 5), true), ppb::InternalError);
  EXPECT_THROW(call(moe_shape(RouterKind::sigmoid_grouped, 16, 4, true, 4, 2), false), ppb::InternalError);
}

// ---- dispatch -------------------------------------------------------------------------------

/// M tokens' k distinct experts of E, uniform, or with `hot` experts taken first by most tokens
/// (several tiles for them).
std::vector<int32_t> random_choices(int M, int k, int E, uint32_t seed, int hot = 0) {
  std::mt19937 gen(seed);
  std::vector<int32_t> out(static_cast<size_t>(M) * k), perm(E);
  for (int m = 0; m < M; ++m) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    if (hot > 0 && gen() % 8 != 0)  // 7 of 8 tokens take the hot experts 0 .. hot-1 first
      for (int h = 0; h < hot && h < k; ++h) std::swap(perm[h], *std::find(perm.begin(), perm.end(), h));
    std::copy(perm.begin(), perm.begin() + k, out.begin() + static_cast<long>(m) * k);
  }
  return out;
}

void check_dispatch(const std::vector<int32_t>& experts, int M, int k, int E, const std::string& what) {
  SCOPED_TRACE(what);
  const int choices = M * k;
  cu::DeviceMemory buf(cu::moe_dispatch_bytes(choices, E));
  const cu::MoeDispatch d = cu::moe_dispatch_at(buf.get(), choices, E);
  std::vector<int64_t> tokens0(E);
  for (int e = 0; e < E; ++e) tokens0[e] = 1000LL * e + 7;
  cu::DeviceMemory dex = upload(experts), dtok = upload(tokens0);
  for (int call = 0; call < 2; ++call)  // the same choices twice: expert_tokens accumulates
    cu::moe_dispatch(d, dex.as<int32_t>(), M, k, E, dtok.as<int64_t>(), nullptr);
  ppb_cuda_test::sync();

  // The host's counting sort (CpuStage::moe_mlp).
  std::vector<int32_t> count(E, 0), offset(E + 1, 0);
  for (int32_t e : experts) ++count[e];
  for (int e = 0; e < E; ++e) offset[e + 1] = offset[e] + count[e];
  EXPECT_EQ(download<int32_t>(d.counts, E), count);
  EXPECT_EQ(download<int32_t>(d.offsets, E + 1), offset);
  const std::vector<int64_t> tokens = download<int64_t>(dtok.get(), E);
  for (int e = 0; e < E; ++e) EXPECT_EQ(tokens[e], tokens0[e] + 2 * count[e]) << "expert " << e;

  // sorted_row: a permutation of [0, choices), each choice inside its expert's range; row_token.
  const std::vector<int32_t> sorted = download<int32_t>(d.sorted_row, choices);
  const std::vector<int32_t> row_token = download<int32_t>(d.row_token, choices);
  std::vector<int> seen(choices, 0);
  for (int i = 0; i < choices; ++i) {
    const int r = sorted[i], e = experts[i];
    ASSERT_TRUE(r >= 0 && r < choices) << "choice " << i;
    ++seen[r];
    EXPECT_GE(r, offset[e]) << "choice " << i;
    EXPECT_LT(r, offset[e] + count[e]) << "choice " << i;
    EXPECT_EQ(row_token[r], i / k) << "choice " << i;
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));

  // Tiles: in expert order, 1..kMoeTileRows rows each inside their expert, covering every row once.
  const int n_tiles = download<int32_t>(d.n_tiles, 1)[0];
  ASSERT_GE(n_tiles, 0);
  ASSERT_LE(n_tiles, cu::moe_max_tiles(choices, E));
  const std::vector<int32_t> te = download<int32_t>(d.tile_expert, n_tiles), t0 = download<int32_t>(d.tile_row0, n_tiles),
                             tr = download<int32_t>(d.tile_rows, n_tiles);
  std::vector<int> covered(choices, 0);
  for (int t = 0; t < n_tiles; ++t) {
    const int e = te[t];
    ASSERT_TRUE(e >= 0 && e < E) << "tile " << t;
    if (t > 0) {
      EXPECT_GE(e, te[t - 1]) << "tile " << t;
    }
    ASSERT_GE(tr[t], 1) << "tile " << t;
    ASSERT_LE(tr[t], cu::kMoeTileRows) << "tile " << t;
    ASSERT_GE(t0[t], offset[e]) << "tile " << t;
    ASSERT_LE(t0[t] + tr[t], offset[e] + count[e]) << "tile " << t;
    for (int r = t0[t]; r < t0[t] + tr[t]; ++r) ++covered[r];
  }
  EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
}

TEST(CudaMoe, DispatchSortsByExpertAndTiles) {
  REQUIRE_GPU();
  check_dispatch(random_choices(1, 1, 8, 1), 1, 1, 8, "M=1 k=1 E=8");
  check_dispatch(random_choices(1, 8, 384, 2), 1, 8, 384, "decode M=1 k=8 E=384");
  check_dispatch(random_choices(5, 2, 8, 3), 5, 2, 8, "M=5 k=2 E=8");
  check_dispatch(random_choices(70, 4, 16, 4, 2), 70, 4, 16, "M=70 k=4 E=16, two hot experts");
  check_dispatch(random_choices(100, 2, 4, 5, 2), 100, 2, 4, "M=100 k=2 E=4: 3-4 tiles per hot expert");
  check_dispatch(random_choices(3000, 1, 2000, 6), 3000, 1, 2000, "E=2000 > the block's threads");
  check_dispatch(random_choices(4096, 8, 384, 7), 4096, 8, 384, "prefill M=4096 k=8 E=384");
}

TEST(CudaMoe, DispatchOfNoTokensHasNoTiles) {
  REQUIRE_GPU();
  const int E = 8;
  cu::DeviceMemory buf(cu::moe_dispatch_bytes(0, E));
  const cu::MoeDispatch d = cu::moe_dispatch_at(buf.get(), 0, E);
  cu::DeviceMemory dex(16);
  EXPECT_EQ(cudaMemset(d.n_tiles, 0x7f, sizeof(int32_t)), cudaSuccess);
  cu::moe_dispatch(d, dex.as<int32_t>(), 0, 2, E, nullptr, nullptr);
  EXPECT_EQ(download<int32_t>(d.n_tiles, 1)[0], 0);
  EXPECT_EQ(download<int32_t>(d.offsets, E + 1), std::vector<int32_t>(E + 1, 0));
}

// ---- a whole routed MLP ---------------------------------------------------------------------

struct MoeCase {
  const char* name;
  MoeShape moe;
  Activation act;
  float limit;
  bool biases;  // gpt-oss: router bias and expert biases
};

double act_ref(Activation act, double g, double u, double limit) {
  if (act == Activation::swiglu_clamped) {
    g = std::min(g, limit);
    u = std::clamp(u, -limit, limit);
    return (u + 1.0) * g / (1.0 + std::exp(-1.702 * g));
  }
  return g / (1.0 + std::exp(-g)) * u;  // silu
}

// router logits (+ router bias: add_bias_rows) -> route_tokens -> moe_dispatch -> grouped
// gate|up (gathered rows, expert biases) -> gated_activation -> grouped down -> moe_combine,
// against a double reference of CpuStage::moe_mlp computed from the same rounded inputs.
//
// Tolerance, from the arithmetic: the GPU accumulates in fp32 over K = H (gate|up), K = I (down)
// and the k-term expert sum, and rounds to the dtype at each of its four stores (gate|up, the
// activation, the expert output, the sum). The fp32 sums give fp_bounds.h's chain bound
// λ u32 (H + I + k) + 16 u32; each store a relative error <= u_t (normwise too), which the
// activation (condition ~1.3 for silu, |u/(u+1)| growth only on small terms for the clamped
// SwiGLU), the random down projection and the positive-weight sum pass on without growth: ~5
// roundings of u_t, bounded by 8 u_t (u_t = 2^-24, 2^-11, 2^-8).
TEST(CudaMoe, RoutedMlpMatchesDoubleReference) {
  REQUIRE_GPU();
  const int H = 72, I = 40;  // neither a multiple of the 64-column tile nor of the 32-wide K chunk
  std::vector<MoeCase> cases;
  cases.push_back({"mixtral E=8 k=2", moe_shape(RouterKind::softmax, 8, 2, true), Activation::silu, 0.0f, false});
  cases.push_back({"gpt-oss E=16 k=4", moe_shape(RouterKind::topk_softmax, 16, 4), Activation::swiglu_clamped, 0.5f,
                   true});
  cases.push_back({"deepseek E=16 k=4", moe_shape(RouterKind::sigmoid_grouped, 16, 4, true, 4, 2, 2.5),
                   Activation::silu, 0.0f, false});
  for (const MoeCase& c : cases) {
    const int E = c.moe.n_experts, k = c.moe.top_k;
    for (DType t : kDTypes) {
      // Expert weights [E, 2I, H] (gate rows, then up rows) and [E, H, I], scaled 1/sqrt(K) so
      // that activations stay O(1); biases [E, 2I], [E, H]; the rounded values for the reference.
      fvec wgu_h = random_floats(static_cast<size_t>(E) * 2 * I * H, 11, -1.0f, 1.0f);
      fvec wdn_h = random_floats(static_cast<size_t>(E) * H * I, 12, -1.0f, 1.0f);
      for (float& v : wgu_h) v /= std::sqrt(static_cast<float>(H));
      for (float& v : wdn_h) v /= std::sqrt(static_cast<float>(I));
      DBuf wgu = DBuf::from(wgu_h, t), wdn = DBuf::from(wdn_h, t);
      const fvec wgu_r = wgu.host(), wdn_r = wdn.host();
      DBuf bgu = DBuf::from(random_floats(static_cast<size_t>(E) * 2 * I, 13, -0.1f, 0.1f), t);
      DBuf bdn = DBuf::from(random_floats(static_cast<size_t>(E) * H, 14, -0.1f, 0.1f), t);
      DBuf brt = DBuf::from(random_floats(E, 15, -0.5f, 0.5f), t);
      const fvec bgu_r = bgu.host(), bdn_r = bdn.host(), brt_r = brt.host();
      const bool grouped = c.moe.router == RouterKind::sigmoid_grouped;
      fvec corr = grouped ? random_floats(E, 16, -0.2f, 0.2f) : fvec();
      // Expert 1 popular, so that M = 70 fills several tiles of one expert. Grouped: through the
      // correction bias (the choice only: the weights stay the sigmoid scores), +2 puts expert 1
      // (choice >= 2.06) and its group (>= 2.13) above any other (choices <= 0.94, groups <= 1.87):
      // all 70 tokens, 3 tiles (32, 32, 6). Else +1.5 on its logit: most tokens, not all.
      if (grouped) corr[1] += 2.0f;
      cu::DeviceMemory dcorr = upload(corr);

      for (int M : {1, 3, 70}) {
        SCOPED_TRACE(std::string(c.name) + " " + ppb::dtype_name(t) + " M=" + std::to_string(M));
        const int choices = M * k, max_tiles = cu::moe_max_tiles(choices, E);
        DBuf x = DBuf::from(random_floats(static_cast<size_t>(M) * H, 20 + M, -1.0f, 1.0f), t);
        const fvec xr = x.host();
        fvec logits = random_floats(static_cast<size_t>(M) * E, 30 + M, -1.0f, 1.0f);
        if (!grouped)
          for (int m = 0; m < M; ++m) logits[static_cast<size_t>(m) * E + 1] += 1.5f;
        cu::DeviceMemory dlogits = upload(logits);
        if (c.biases) {  // fp32 logits + the t router bias, one fp32 add on both sides
          cu::add_bias_rows(dlogits.get(), true, brt.get(), M, E, t, nullptr);
          for (int m = 0; m < M; ++m)
            for (int e = 0; e < E; ++e) logits[static_cast<size_t>(m) * E + e] += brt_r[e];
        }

        cu::DeviceMemory dex(choices * sizeof(int32_t)), dw(choices * sizeof(float));
        cu::route_tokens(dex.as<int32_t>(), dw.as<float>(), dlogits.as<float>(), M, c.moe,
                         corr.empty() ? nullptr : dcorr.as<float>(), nullptr, 0, nullptr);
        cu::DeviceMemory dbuf(cu::moe_dispatch_bytes(choices, E));
        const cu::MoeDispatch d = cu::moe_dispatch_at(dbuf.get(), choices, E);
        cu::moe_dispatch(d, dex.as<int32_t>(), M, k, E, nullptr, nullptr);
        DBuf gu(static_cast<size_t>(choices) * 2 * I, t), a(static_cast<size_t>(choices) * I, t),
            y(static_cast<size_t>(choices) * H, t), out(static_cast<size_t>(M) * H, t);
        cu::moe_grouped_linear(gu.get(), x.get(), true, wgu.get(), c.biases ? bgu.get() : nullptr, d, 2 * I, H,
                               max_tiles, t, nullptr);
        cu::gated_activation(a.get(), gu.get(), choices, I, c.act, t, nullptr, c.limit);
        cu::moe_grouped_linear(y.get(), a.get(), false, wdn.get(), c.biases ? bdn.get() : nullptr, d, H, I,
                               max_tiles, t, nullptr);
        cu::moe_combine(out.get(), y.get(), dw.as<float>(), dex.as<int32_t>(), d, M, k, H, t, nullptr);
        ppb_cuda_test::sync();

        const std::vector<int32_t> ex = download<int32_t>(dex.get(), choices);
        const std::vector<float> wt = download<float>(dw.get(), choices);
        const Route cpu_route = route_on_cpu(c.moe, logits, M, corr, {}, 0);
        ASSERT_EQ(ex, cpu_route.experts);
        if (grouped) {  // every token chose expert 1: M = 70 gives it 3 tiles, the last partial
          std::vector<int> per(E, 0);
          for (int32_t e : ex) ++per[e];
          EXPECT_EQ(per[1], M);
        }

        // The double reference: per token, its experts in ascending order (the order is
        // immaterial in double), gate|up, activation, down, weighted sum.
        fvec ref(static_cast<size_t>(M) * H);
        std::vector<double> g(2 * I), act(I), acc(H);
        for (int m = 0; m < M; ++m) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int j = 0; j < k; ++j) {
            const int e = ex[static_cast<size_t>(m) * k + j];
            const double w = wt[static_cast<size_t>(m) * k + j];
            for (int n = 0; n < 2 * I; ++n) {
              double s = c.biases ? bgu_r[static_cast<size_t>(e) * 2 * I + n] : 0.0;
              const float* wr = wgu_r.data() + (static_cast<size_t>(e) * 2 * I + n) * H;
              for (int h = 0; h < H; ++h) s += static_cast<double>(xr[static_cast<size_t>(m) * H + h]) * wr[h];
              g[n] = s;
            }
            for (int i = 0; i < I; ++i) act[i] = act_ref(c.act, g[i], g[I + i], c.limit);
            for (int h = 0; h < H; ++h) {
              double s = c.biases ? bdn_r[static_cast<size_t>(e) * H + h] : 0.0;
              const float* wr = wdn_r.data() + (static_cast<size_t>(e) * H + h) * I;
              for (int i = 0; i < I; ++i) s += act[i] * wr[i];
              acc[h] += w * s;
            }
          }
          for (int h = 0; h < H; ++h) ref[static_cast<size_t>(m) * H + h] = static_cast<float>(acc[h]);
        }
        const double bound = ppb::test::chain_bound_f32({H, I, k}) + 8.0 * unit_roundoff(t);
        EXPECT_LT(rel_err(out.host(), ref), bound);
      }
    }
  }
}

// ---- elementwise --------------------------------------------------------------------------

TEST(CudaMoe, AddBiasRows) {
  REQUIRE_GPU();
  const int rows = 13, n = 77;
  for (DType t : kDTypes) {
    SCOPED_TRACE(ppb::dtype_name(t));
    DBuf bias = DBuf::from(random_floats(n, 1, -0.5f, 0.5f), t);
    const fvec br = bias.host();
    // y in fp32 (router logits): one fp32 add, bit-identical.
    const fvec y = random_floats(static_cast<size_t>(rows) * n, 2, -3.0f, 3.0f);
    cu::DeviceMemory dy = upload(y);
    cu::add_bias_rows(dy.get(), true, bias.get(), rows, n, t, nullptr);
    fvec want = y;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < n; ++c) want[static_cast<size_t>(r) * n + c] += br[c];
    EXPECT_EQ(download<float>(dy.get(), y.size()), want);
    // y in t: the fp32 sum rounded once to t, bit-identical.
    DBuf yt = DBuf::from(y, t);
    const fvec yr = yt.host();
    cu::add_bias_rows(yt.get(), false, bias.get(), rows, n, t, nullptr);
    fvec sum = yr;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < n; ++c) sum[static_cast<size_t>(r) * n + c] += br[c];
    EXPECT_EQ(yt.host(), rounded(sum, t));
  }
}

// The clamped SwiGLU against cpu::gated_activation on the same rounded gate|up values: the fp32
// formula is the same, expf vs std::exp differ by <= 2 ulp (f32: within 1e-6), and the output
// is rounded once to t (normwise <= u_t).
TEST(CudaMoe, GatedActivationSwigluClamped) {
  REQUIRE_GPU();
  const size_t rows = 37;
  const int I = 100;
  const float limit = 0.7f;  // inputs in [-2, 2]: both clamps active
  for (DType t : kDTypes) {
    const fvec gu = rounded(random_floats(rows * 2 * I, 8, -2.0f, 2.0f), t);
    const auto [gate, up] = split_gate_up(gu, rows, I);
    DBuf dgu = DBuf::from(gu, t), dout(rows * I, t);
    cu::gated_activation(dout.get(), dgu.get(), rows, I, Activation::swiglu_clamped, t, nullptr, limit);
    ppb_cuda_test::sync();
    fvec ref(rows * I);
    cpu::gated_activation(ref.data(), gate.data(), up.data(), ref.size(), Activation::swiglu_clamped, limit);
    const double bound = t == DType::f32 ? 1e-6 : unit_roundoff(t) + 1e-6;
    EXPECT_LT(rel_err(dout.host(), ref), bound) << ppb::dtype_name(t);
  }
}

}  // namespace
