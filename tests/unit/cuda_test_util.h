// Shared by the CUDA unit tests (tests/unit/test_cuda_*.cpp): the GPU guard, device buffers of
// one dtype read back as fp32, random data and the relative error of llm.c's checks.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/device.h"
#include "backend/dtype.h"

namespace ppb_cuda_test {

using ppb::DType;
using fvec = std::vector<float>;
namespace cu = ppb::cuda;

/// GPUs the machine is known to have (PPB_EXPECT_GPUS, set by scripts/gpu_check.sh from
/// nvidia-smi); 0 when unset.
inline int expected_gpus() {
  const char* v = std::getenv("PPB_EXPECT_GPUS");
  return v ? std::atoi(v) : 0;
}

// Skips where no GPU is visible; but where PPB_EXPECT_GPUS > 0 (scripts/gpu_check.sh sets it
// from nvidia-smi) a GPU that CUDA cannot see is a failure, not a skip: a binary built with a
// newer CUDA than the driver supports sees zero devices, and every test would "pass" skipped.
#define REQUIRE_GPU()                                                                      \
  do {                                                                                     \
    if (ppb::cuda_visible_device_count() <= 0) {                                           \
      if (::ppb_cuda_test::expected_gpus() > 0)                                                             \
        FAIL() << "nvidia-smi lists " << ::ppb_cuda_test::expected_gpus() << " GPU(s) but CUDA sees none: "  \
               << ppb::cuda_unavailable_reason() << " (driver older than the CUDA runtime?)"; \
      GTEST_SKIP() << "no CUDA device visible: " << ppb::cuda_unavailable_reason();        \
    }                                                                                      \
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);                                              \
  } while (0)

inline const DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};

/// Tolerance of ‖out − ref‖/‖ref‖: `f32` for f32, else the 16-bit types' rounding (2^-11, 2^-8)
/// a few times over.
inline double tol(DType t, double f32 = 1e-5) {
  switch (t) {
    case DType::f32: return f32;
    case DType::f16: return 3e-3;
    case DType::bf16: return 2e-2;
  }
  return f32;
}

inline fvec random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  fvec v(n);
  for (float& x : v) x = d(gen);
  return v;
}

inline double rel_err(const fvec& out, const fvec& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

/// Device values of one dtype, filled from / read back as fp32.
class DBuf {
 public:
  DBuf(size_t n, DType t) : n_(n), t_(t), mem_(std::max<size_t>(n, 1) * ppb::dtype_bytes(t)) {}
  static DBuf from(const fvec& host, DType t) {
    DBuf b(host.size(), t);
    cu::DeviceMemory tmp(std::max<size_t>(host.size(), 1) * sizeof(float));
    EXPECT_EQ(cudaMemcpy(tmp.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    cu::convert_from_f32(b.get(), t, tmp.as<float>(), host.size(), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return b;
  }
  fvec host() const {
    cu::DeviceMemory tmp(std::max<size_t>(n_, 1) * sizeof(float));
    cu::convert_to_f32(tmp.as<float>(), mem_.get(), t_, n_, nullptr);
    fvec v(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), tmp.get(), n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void* get() const { return mem_.get(); }

 private:
  size_t n_;
  DType t_;
  cu::DeviceMemory mem_;
};

/// `v` rounded to `t` (what the kernel sees), for the CPU twin's input.
inline fvec rounded(const fvec& v, DType t) { return DBuf::from(v, t).host(); }

inline void sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

/// An attention call's shape: GQA heads over a cache of ctx positions, T new tokens at pos0.
struct AttnCase {
  const char* name;
  int batch, tokens, pos0, ctx, nh, nkv, hd, window;
  float softcap;
};

/// The cpu::AttentionShape of a case (scale 1/sqrt(head_dim), no sinks).
inline ppb::cpu::AttentionShape attention_shape_of(const AttnCase& c) {
  ppb::cpu::AttentionShape s;
  s.batch = c.batch;
  s.tokens = c.tokens;
  s.pos0 = c.pos0;
  s.max_context = c.ctx;
  s.n_heads = c.nh;
  s.n_kv_heads = c.nkv;
  s.head_dim = c.hd;
  s.window = c.window;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  s.softcap = c.softcap;
  return s;
}

/// The gate and up halves [rows, inter] of a fused gate|up GEMM output [rows, 2 inter] (the
/// CUDA gated_activation's input; the CPU twin takes them apart).
inline std::pair<fvec, fvec> split_gate_up(const fvec& gu, size_t rows, int inter) {
  fvec gate(rows * inter), up(rows * inter);
  for (size_t r = 0; r < rows; ++r)
    for (int i = 0; i < inter; ++i) {
      gate[r * inter + i] = gu[r * 2 * inter + i];
      up[r * inter + i] = gu[r * 2 * inter + inter + i];
    }
  return {gate, up};
}

}  // namespace ppb_cuda_test
