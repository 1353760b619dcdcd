// Move-only RAII owners of CUDA handles (HighFive style: each C call wrapped once and checked;
// destructors never throw, they release and ignore a failing release).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/lane_abort.h"

namespace ppb::cuda {

/// Owns one handle `T` of a C library (a pointer type; null = none), released by
/// `Destroy(handle)`: the pattern of every owner below (and a fit for ncclComm_t and the like).
/// Move-only; a moved-from owner is empty. Move-assigning releases the handle held before. The
/// destructor releases a non-null handle and ignores a failing release (it never throws).
template <class T, auto Destroy>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  /// Takes ownership of `handle` (null: none).
  explicit UniqueHandle(T handle) noexcept : h_(handle) {}
  ~UniqueHandle() { destroy(); }
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) {
      destroy();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  T get() const { return h_; }
  /// Gives the handle up without destroying it (the owner is then empty), as
  /// std::unique_ptr::release: for a handle that work still pending on the device may use while
  /// the process is being aborted.
  T release() noexcept { return std::exchange(h_, nullptr); }

 protected:
  /// Where a creating call writes the new handle: `CUDA_CHECK(cudaStreamCreate(out()))`. For
  /// constructors of derived owners, while still empty (a held handle would be overwritten).
  T* out() { return &h_; }

 private:
  void destroy() noexcept {
    if (h_) (void)Destroy(std::exchange(h_, nullptr));
  }
  T h_ = nullptr;
};

/// A cudaStream_t created with cudaStreamNonBlocking (no implicit sync with the legacy stream).
class Stream : public UniqueHandle<cudaStream_t, cudaStreamDestroy> {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(out(), cudaStreamNonBlocking)); }
};

/// A cudaEvent_t with timing enabled (flags = cudaEventDefault) unless told otherwise.
class EventHandle : public UniqueHandle<cudaEvent_t, cudaEventDestroy> {
 public:
  explicit EventHandle(unsigned flags = cudaEventDefault) { CUDA_CHECK(cudaEventCreateWithFlags(out(), flags)); }
};

/// A cublasHandle_t.
class CublasHandle : public UniqueHandle<cublasHandle_t, cublasDestroy> {
 public:
  CublasHandle() { CUBLAS_CHECK(cublasCreate(out())); }
};

/// A captured CUDA graph (cudaStreamEndCapture) and its instantiation (cudaGraphInstantiate).
using GraphHandle = UniqueHandle<cudaGraph_t, cudaGraphDestroy>;
using GraphExecHandle = UniqueHandle<cudaGraphExec_t, cudaGraphExecDestroy>;

/// Memory released by `Free(pointer)`, with its size: a UniqueHandle<void*, Free> that also
/// moves its byte count (0 when empty or moved from).
///
/// While a lane abort is pending (backend/lane_abort.h) the memory is given up, not freed:
/// cudaFree and cudaFreeHost wait for the whole device, and a stream left waiting on a dead
/// peer (or an NCCL kernel spinning on one) would make that wait, and the failing rank, hang
/// instead of exiting; the process is about to end anyway.
template <auto Free>
class UniqueAllocation : public UniqueHandle<void*, Free> {
 public:
  UniqueAllocation() = default;
  ~UniqueAllocation() {
    if (lane_abort_requested()) (void)release();
  }
  UniqueAllocation(UniqueAllocation&& o) noexcept
      : UniqueHandle<void*, Free>(std::move(o)), bytes_(std::exchange(o.bytes_, 0)) {}
  UniqueAllocation& operator=(UniqueAllocation&& o) noexcept {
    if (this != &o) {
      UniqueHandle<void*, Free>::operator=(std::move(o));
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  size_t bytes() const { return bytes_; }
  /// As UniqueHandle::release; the size becomes 0.
  void* release() noexcept {
    bytes_ = 0;
    return UniqueHandle<void*, Free>::release();
  }

 protected:
  /// Empty, sized `bytes`: the derived constructor then allocates into out().
  explicit UniqueAllocation(size_t bytes) : bytes_(bytes) {}

 private:
  size_t bytes_ = 0;
};

/// cudaMalloc'ed device memory, zeroed on allocation (like the CPU backend's buffers).
class DeviceMemory : public UniqueAllocation<cudaFree> {
 public:
  DeviceMemory() = default;
  /// @throws ppb::InternalError naming the size if cudaMalloc fails.
  explicit DeviceMemory(size_t bytes) : UniqueAllocation(bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMalloc(out(), bytes));
    // cudaMemset may return before it ran, and work on non-blocking streams does not wait for
    // the legacy stream: finish it here, or a kernel could write before the zeros land.
    CUDA_CHECK(cudaMemset(get(), 0, bytes));
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  template <typename T>
  T* as() const { return static_cast<T*>(get()); }
};

/// Page-locked host memory (cudaHostAlloc), optionally mapped into the device address space.
class PinnedMemory : public UniqueAllocation<cudaFreeHost> {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(size_t bytes, unsigned flags = cudaHostAllocDefault) : UniqueAllocation(bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaHostAlloc(out(), bytes, flags));
  }
};

}  // namespace ppb::cuda
