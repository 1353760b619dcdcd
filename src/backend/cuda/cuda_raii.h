// Move-only RAII owners of CUDA handles (HighFive style: each C call wrapped once and checked;
// destructors never throw, they release and ignore a failing release).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace ppb::cuda {

/// A cudaStream_t created with cudaStreamNonBlocking (no implicit sync with the legacy stream).
class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

/// A cudaEvent_t with timing enabled (flags = cudaEventDefault) unless told otherwise.
class EventHandle {
 public:
  explicit EventHandle(unsigned flags = cudaEventDefault) { CUDA_CHECK(cudaEventCreateWithFlags(&e_, flags)); }
  ~EventHandle() {
    if (e_) cudaEventDestroy(e_);
  }
  EventHandle(EventHandle&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  EventHandle& operator=(EventHandle&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  EventHandle(const EventHandle&) = delete;
  EventHandle& operator=(const EventHandle&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

/// A cublasHandle_t.
class CublasHandle {
 public:
  CublasHandle() { CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() {
    if (h_) cublasDestroy(h_);
  }
  CublasHandle(CublasHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

/// cudaMalloc'ed device memory, zeroed on allocation (like the CPU backend's buffers).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  /// @throws ppb::InternalError naming the size if cudaMalloc fails.
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMalloc(&p_, bytes));
    // cudaMemset may return before it ran, and work on non-blocking streams does not wait for
    // the legacy stream: finish it here, or a kernel could write before the zeros land.
    CUDA_CHECK(cudaMemset(p_, 0, bytes));
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  ~DeviceMemory() {
    if (p_) cudaFree(p_);
  }
  DeviceMemory(DeviceMemory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

/// Page-locked host memory (cudaHostAlloc), optionally mapped into the device address space.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(size_t bytes, unsigned flags = cudaHostAllocDefault) : bytes_(bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaHostAlloc(&p_, bytes, flags));
  }
  ~PinnedMemory() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedMemory(PinnedMemory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedMemory& operator=(PinnedMemory&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ppb::cuda
