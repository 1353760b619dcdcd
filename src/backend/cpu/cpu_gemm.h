// Matrix products of the CPU backend: one entry point for the GEMM library a rank uses
// (OpenBLAS or oneDNN, whichever is faster on this CPU, chosen once per process) and a
// weight-streaming kernel of ours for decode-sized products (M <= kSmallM rows).
//
// Why two libraries: OpenBLAS picks its kernels by CPU model at load time, and on CPUs it does
// not recognise (seen here: a virtualised Sapphire Rapids, detected as "Prescott") it falls
// back to SSE3 kernels, ~8x below the core's FMA rate; oneDNN JIT-compiles for the ISA it finds
// (cpuid). Why a kernel of ours: with M = B*T <= 16 rows, sgemm packs the [N, K] weight and
// re-reads it; a decode product is bound by streaming the weight once (2*M FLOPs per 4 bytes),
// which a dot-product kernel with register blocking and software prefetch does near the memory
// bandwidth (build/ppb_cpu_bench prints both against the floor).
#pragma once

#include <string>

namespace ppb::cpu {

/// Largest row count M that linear() sends to the small-M kernel.
inline constexpr int kSmallM = 16;

enum class GemmLibrary { openblas, onednn };

/// "openblas" or "onednn".
std::string gemm_library_name(GemmLibrary lib);

/// Sets the threads every product of this process uses (the rank's BLAS threads, >= 1):
/// OpenBLAS, oneDNN's OpenMP pool (set on each thread that calls sgemm: OpenMP's count is per
/// thread) and the small-M kernel. Not while another thread runs a product.
void set_gemm_threads(int threads);
int gemm_threads();

/// Times one prefill-shaped product (M = 256, N = K = 1024; best of 3, after one untimed) with
/// each available library at the current thread count and makes the faster one the process's
/// GEMM library. Runs once per process; later calls return the first choice. Returns it.
GemmLibrary choose_gemm_library();

/// The library gemm() uses now (OpenBLAS until choose_gemm_library or set_gemm_library).
GemmLibrary gemm_library();

/// Forces the library (tests; `ppbench run`, so that all ranks use the one agreed on). Not
/// while another thread runs a product.
/// @throws ppb::UserError if `lib` was not compiled in (oneDNN is optional at build time).
void set_gemm_library(GemmLibrary lib);

/// Whether oneDNN was found at build time.
bool have_onednn();

/// oneDNN's "major.minor.patch (git hash)", or "" without it.
std::string onednn_version();

/// Row-major C[M, N] = alpha * A[M, K] * op(B) + beta * C, op(B) = B^T (B is [N, K], ldb >= K)
/// when trans_b, else B ([K, N], ldb >= N); lda, ldc are row strides in floats. Through the
/// process's GEMM library (cblas_sgemm or dnnl_sgemm, which have these semantics).
void sgemm(bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc);

/// The instruction set the small-M kernel runs with on this CPU: "avx512", "avx2", or "" (none:
/// linear() then uses sgemm for every M).
const char* small_m_isa();

/// Selects the small-M kernel's instruction set ("avx512", "avx2", or "" for none: sgemm for
/// every M), for tests and benchmarks; the default is the widest this CPU has. Returns false,
/// changing nothing, if this CPU lacks it.
bool set_small_m_isa(const std::string& isa);

/// y[M, N] = x[M, K] w[N, K]^T for 1 <= M <= kSmallM, each weight row read from memory once;
/// N split over gemm_threads() threads. Summation order: per row of W, kWidth-strided partial
/// sums then a horizontal sum, so within Higham's gamma_{K} bound like any sgemm.
/// @throws ppb::InternalError if small_m_isa() is "" or M is outside [1, kSmallM].
void small_m_linear(float* y, const float* x, const float* w, int M, int N, int K);

/// Streaming read bandwidth in GB/s (1e9 B/s): the best of 5 passes (after one that faults
/// the pages in; the best, as a ceiling is what the hardware can do, and a shared machine's
/// noise only ever slows a pass) of small_m_linear with M = 1 over a `bytes` buffer viewed as a [N, 4096]
/// weight, i.e. the rate the decode kernel streams weights at with gemm_threads() threads
/// (cblas_sgemv where the CPU has no small-M kernel). Pass a buffer well above the last-level
/// cache to measure memory, not cache. Allocates `bytes` for the call.
double stream_read_GBps(size_t bytes);

/// GEMM rate in GFLOP/s (1e9 FLOP/s) of sgemm through the process's library at
/// M = N = K = 1024 (2 M N K FLOPs), best of 10 after one untimed: the compute ceiling of
/// prefill-sized products with gemm_threads() threads.
double gemm_gflops();

}  // namespace ppb::cpu
