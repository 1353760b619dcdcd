#include "backend/cpu/cpu_gemm.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#if PPBENCH_HAVE_ONEDNN
#include <dnnl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_aligned.h"
#include "common/error.h"

namespace ppb::cpu {
namespace {

/// Weight-row blocks the small-M kernel prefetches ahead of the one it reads, into L2 (measured
/// here, M = 4 and 8, a weight from memory: 1-2 blocks into L2 beat 1, 2 or 4 into L1 by
/// ~10%: a K = 1024 row is one 4 KiB page, where the hardware's streamer stops, and 4 blocks of
/// 6 rows ahead overflow L1).
constexpr int kPrefetchBlocks = 2;

}  // namespace

// One copy of the small-M kernel per instruction set, each compiled for it (see the .inc), with
// GCC's #pragma GCC target (the project builds with g++: scripts/install_deps.sh).
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
// GCC 12 flags the _mm512_undefined_ps() inside its own AVX-512 intrinsics (_mm512_shuffle_f32x4,
// _mm512_reduce_add_ps) as uninitialised: a false positive (GCC PR 105593), silenced here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace {  // internal linkage: nothing compiled for an ISA can be merged into another TU's copy
namespace avx512 {
struct Ops {
  using V = __m512;
  static constexpr int kWidth = 16;
  // 4 x rows x 6 weight rows: 24 zmm accumulators + 6 weight vectors + 1 x vector of 32
  // registers. Measured here against 8x2, 8x3, 4x2, 4x3, 4x4 and 2x8 (-O3, M = 1..8, a
  // 151936 x 1024 weight from memory and a 3072 x 1024 one from cache): the best or within 5%
  // of it at every M, and 10-40% ahead at M = 8, where the kernel becomes FMA-bound.
  static constexpr int kRowsX = 4;
  static constexpr int kRowsW = 6;
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V load(const float* p) { return _mm512_loadu_ps(p); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // Halves added by shuffles (not a store and 16 scalar adds: ~25% slower at M = 8, where one
  // sum per 64 FMAs matters).
  static inline float sum(V v) {
    V t = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // 256-bit halves swapped
    t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xB1));     // 128-bit quarters swapped
    __m128 x = _mm512_castps512_ps128(t);
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
  }
};
#include "backend/cpu/cpu_small_m_kernel.inc"
}  // namespace avx512
}  // namespace
#pragma GCC diagnostic pop
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace {
namespace avx2 {
struct Ops {
  using V = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kRowsX = 4;  // 4 x 2 ymm accumulators of 16 registers
  static constexpr int kRowsW = 2;
  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V load(const float* p) { return _mm256_loadu_ps(p); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline float sum(V v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
};
#include "backend/cpu/cpu_small_m_kernel.inc"
}  // namespace avx2
}  // namespace
#pragma GCC pop_options

namespace {

int g_threads = 1;
GemmLibrary g_library = GemmLibrary::openblas;
std::once_flag g_choose_once;

using RangeFn = void (*)(float*, const float*, const float*, int, int, int, int, int);

RangeFn detect_small_m_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return &avx512::small_m_linear_range;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &avx2::small_m_linear_range;
  return nullptr;
}

RangeFn g_small_m = detect_small_m_kernel();

RangeFn small_m_range_fn() { return g_small_m; }

/// Best time (ms) of `reps` products after one untimed.
double time_product_ms(int M, int N, int K, int reps) {
  AlignedFloatVector a(static_cast<size_t>(M) * K, 0.5f), b(static_cast<size_t>(N) * K, 0.25f),
      c(static_cast<size_t>(M) * N);
  double best = 1e300;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    sgemm(true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, ms);
  }
  return best;
}

}  // namespace

std::string gemm_library_name(GemmLibrary lib) { return lib == GemmLibrary::onednn ? "onednn" : "openblas"; }

bool have_onednn() { return PPBENCH_HAVE_ONEDNN != 0; }

std::string onednn_version() {
#if PPBENCH_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " (" +
         v->hash + ")";
#else
  return "";
#endif
}

void set_gemm_threads(int threads) {
  if (threads < 1) throw InternalError("set_gemm_threads: need >= 1 thread");
  g_threads = threads;
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);  // this thread's; sgemm() sets it on every other calling thread
}

int gemm_threads() { return g_threads; }

GemmLibrary gemm_library() { return g_library; }

void set_gemm_library(GemmLibrary lib) {
  if (lib == GemmLibrary::onednn && !have_onednn()) {
    throw UserError("oneDNN was not found when ppbench was built (apt-get install libdnnl-dev, rebuild)");
  }
  g_library = lib;
}

GemmLibrary choose_gemm_library() {
  std::call_once(g_choose_once, [] {
    if (!have_onednn()) return;
    set_gemm_library(GemmLibrary::openblas);
    const double openblas_ms = time_product_ms(256, 1024, 1024, 3);
    set_gemm_library(GemmLibrary::onednn);
    const double onednn_ms = time_product_ms(256, 1024, 1024, 3);
    set_gemm_library(onednn_ms < openblas_ms ? GemmLibrary::onednn : GemmLibrary::openblas);
  });
  return g_library;
}

void sgemm(bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc) {
#if PPBENCH_HAVE_ONEDNN
  if (g_library == GemmLibrary::onednn) {
    // OpenMP's thread count is per calling thread (an ICV of its task): the stages' products
    // run on lane threads, which start with OpenMP's default (every CPU), not the rank's count.
    if (omp_get_max_threads() != g_threads) omp_set_num_threads(g_threads);
    const dnnl_status_t st = dnnl_sgemm('N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (st != dnnl_success) throw InternalError("dnnl_sgemm failed with status " + std::to_string(st));
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
              beta, C, ldc);
}

const char* small_m_isa() {
  const RangeFn fn = small_m_range_fn();
  if (fn == &avx512::small_m_linear_range) return "avx512";
  if (fn == &avx2::small_m_linear_range) return "avx2";
  return "";
}

bool set_small_m_isa(const std::string& isa) {
  __builtin_cpu_init();
  if (isa == "avx512" && __builtin_cpu_supports("avx512f")) {
    g_small_m = &avx512::small_m_linear_range;
  } else if (isa == "avx2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    g_small_m = &avx2::small_m_linear_range;
  } else if (isa.empty()) {
    g_small_m = nullptr;
  } else {
    return false;
  }
  return true;
}

void small_m_linear(float* y, const float* x, const float* w, int M, int N, int K) {
  const RangeFn fn = small_m_range_fn();
  if (fn == nullptr) throw InternalError("small_m_linear: this CPU has neither AVX-512 nor AVX2+FMA");
  if (M < 1 || M > kSmallM) throw InternalError("small_m_linear: M outside [1, kSmallM]");
  const int threads = std::min(g_threads, std::max(1, N / 64));
  if (threads <= 1) {
    fn(y, x, w, M, N, K, 0, N);
    return;
  }
  // Contiguous slices of W per thread, in whole 24-row blocks (a multiple of either instruction
  // set's kRowsW) dealt evenly: thread t takes blocks [t*B/T, (t+1)*B/T).
  const int blocks = (N + 23) / 24;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const int begin = std::min(N, static_cast<int>(static_cast<long long>(t) * blocks / threads) * 24);
    const int end = std::min(N, static_cast<int>(static_cast<long long>(t + 1) * blocks / threads) * 24);
    if (begin < end) fn(y, x, w, M, N, K, begin, end);
  }
}

double stream_read_GBps(size_t bytes) {
  constexpr int K = 4096;
  const int N = static_cast<int>(std::max<size_t>(bytes / (sizeof(float) * K), 64));
  AlignedFloatVector w(static_cast<size_t>(N) * K, 0.5f), x(K, 0.25f), y(N);
  double best = 1e300;
  for (int pass = 0; pass < 6; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    if (small_m_range_fn() != nullptr) {
      small_m_linear(y.data(), x.data(), w.data(), 1, N, K);
    } else {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w.data(), K, x.data(), 1, 0.0f, y.data(), 1);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass > 0) best = std::min(best, s);
  }
  return static_cast<double>(w.size()) * sizeof(float) / best / 1e9;
}

double gemm_gflops() {
  constexpr int n = 1024;
  return 2.0 * n * n * n / (time_product_ms(n, n, n, 10) * 1e-3) / 1e9;
}

}  // namespace ppb::cpu
