#include "backend/weights.h"

#include <cmath>

namespace ppb {

// Napkin math: per value 2 64-bit multiplies + 3 xor-shifts for mix64, 1 multiply for the
// counter, 1 int->float convert and 1 fp32 multiply: ~10 simple ops, no memory traffic but the
// 4-byte store. Scalar x86-64 sustains ~1 ns/value (~1 G values/s); the store stream
// (4 GB/s at that rate) is far below memory bandwidth. Blocks of 8 let the compiler interleave
// independent dependency chains (mix64 is latency-bound: ~15 cycles per chain).
void fill_uniform(float* dst, size_t n, uint64_t seed, uint64_t unit, uint64_t tensor, float scale,
                  size_t first) {
  const uint64_t key = weight_key(seed, unit, tensor) + first * 0x9E3779B97F4A7C15ULL;  // element first + i
  const float step = scale * 0x1p-23f;
  constexpr size_t kBlock = 8;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    uint64_t z[kBlock];
    for (size_t j = 0; j < kBlock; ++j) z[j] = mix64(key + (i + j + 1) * 0x9E3779B97F4A7C15ULL);
    for (size_t j = 0; j < kBlock; ++j) {
      dst[i + j] = static_cast<float>(static_cast<int32_t>(z[j] >> 40) - (1 << 23)) * step;
    }
  }
  for (; i < n; ++i) dst[i] = uniform_at(key, i, scale);  // key already advanced by `first`
}

void fill_projection(float* dst, size_t rows, size_t fan_in, uint64_t seed, uint64_t unit, Tensor t) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  fill_uniform(dst, rows * fan_in, seed, unit, static_cast<uint64_t>(t), scale);
}

void fill_projection_rows(float* dst, size_t row0, size_t rows, size_t fan_in, uint64_t seed, uint64_t unit,
                          Tensor t) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  fill_uniform(dst, rows * fan_in, seed, unit, static_cast<uint64_t>(t), scale, row0 * fan_in);
}

void fill_projection_cols(float* dst, size_t rows, size_t fan_in, size_t col0, size_t cols, uint64_t seed,
                          uint64_t unit, Tensor t) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  for (size_t r = 0; r < rows; ++r)
    fill_uniform(dst + r * cols, cols, seed, unit, static_cast<uint64_t>(t), scale, r * fan_in + col0);
}

void fill_norm(float* dst, size_t n, uint64_t seed, uint64_t unit, Tensor t, bool plus_one) {
  fill_uniform(dst, n, seed, unit, static_cast<uint64_t>(t), 0.1f);
  if (!plus_one) {
    for (size_t i = 0; i < n; ++i) dst[i] = 1.0f + dst[i];
  }
}

void fill_bias(float* dst, size_t n, uint64_t seed, uint64_t unit, Tensor t, size_t first) {
  fill_uniform(dst, n, seed, unit, static_cast<uint64_t>(t), 0.02f, first);
}

void fill_embedding(float* dst, size_t vocab, size_t hidden, uint64_t seed, size_t row0) {
  fill_uniform(dst, vocab * hidden, seed, /*unit=*/0, static_cast<uint64_t>(Tensor::embed), 1.0f, row0 * hidden);
}

}  // namespace ppb
