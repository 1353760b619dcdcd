// Cache-line-aligned float storage for the CPU backend's weights, KV cache and activations.
//
// Why: operator new / malloc align to 16 bytes, and glibc serves large blocks from mmap with a
// 16-byte header, so a 64-byte (one zmm) load at a multiple of 16 floats into such a block
// always straddles two cache lines. Measured here (small-M kernel, M = 8, a weight in L2):
// 57-72 GFLOP/s with 16-byte alignment against 107-113 GFLOP/s with 64-byte alignment. oneDNN
// and OpenBLAS gain from it too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace ppb::cpu {

/// Alignment in bytes of every buffer below: one cache line, one AVX-512 register.
inline constexpr size_t kBufferAlignment = 64;

/// Standard allocator returning kBufferAlignment-aligned storage (C++17 aligned operator new),
/// for std::vector.
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() noexcept = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>& /*other*/) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kBufferAlignment}));
  }
  void deallocate(T* p, size_t /*n*/) noexcept { ::operator delete(p, std::align_val_t{kBufferAlignment}); }
  template <class U>
  bool operator==(const AlignedAllocator<U>& /*other*/) const noexcept {
    return true;
  }
};

/// A float vector whose data() is kBufferAlignment-aligned.
using AlignedFloatVector = std::vector<float, AlignedAllocator<float>>;

struct AlignedDelete {
  void operator()(float* p) const noexcept { ::operator delete[](p, std::align_val_t{kBufferAlignment}); }
};

/// An owned float array aligned to kBufferAlignment.
using AlignedFloats = std::unique_ptr<float[], AlignedDelete>;

/// `n` uninitialised floats aligned to kBufferAlignment (zeroed when `zero`).
/// @throws std::bad_alloc when the memory is not there.
inline AlignedFloats make_aligned_floats(size_t n, bool zero = false) {
  auto* p = static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t{kBufferAlignment}));
  if (zero) std::fill_n(p, n, 0.0f);
  return AlignedFloats(p);
}

}  // namespace ppb::cpu
