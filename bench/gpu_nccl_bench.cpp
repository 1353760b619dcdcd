#include "gpu_nccl_bench.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_raii.h"

namespace ppb::bench {

namespace {

constexpr int kGpus = 2;
constexpr size_t kMaxBytes = size_t(256) << 20;

/// One GPU's side: its communicator, stream, send and receive buffers, timing events.
struct Side {
  int device = 0;
  ncclComm_t comm = nullptr;
  std::unique_ptr<cuda::Stream> stream;
  std::unique_ptr<cuda::DeviceMemory> send, recv;
  std::unique_ptr<cuda::EventHandle> start, stop;
};

/// The operation on every side, as one NCCL group (one thread drives both GPUs).
using Op = std::function<void(Side&, int peer, size_t bytes)>;

void enqueue_all(std::vector<Side>& sides, const Op& op, size_t bytes) {
  NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < kGpus; ++i) op(sides[i], (i + 1) % kGpus, bytes);
  NCCL_CHECK(ncclGroupEnd());
}

/// Seconds per call of `op` at `bytes`: the slower GPU's events over `iters` back-to-back calls.
double time_op(std::vector<Side>& sides, const Op& op, size_t bytes, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) enqueue_all(sides, op, bytes);
  for (Side& s : sides) {
    CUDA_CHECK(cudaSetDevice(s.device));
    CUDA_CHECK(cudaEventRecord(s.start->get(), s.stream->get()));
  }
  for (int i = 0; i < iters; ++i) enqueue_all(sides, op, bytes);
  double worst_ms = 0;
  for (Side& s : sides) {
    CUDA_CHECK(cudaSetDevice(s.device));
    CUDA_CHECK(cudaEventRecord(s.stop->get(), s.stream->get()));
    CUDA_CHECK(cudaEventSynchronize(s.stop->get()));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, s.start->get(), s.stop->get()));
    worst_ms = std::max(worst_ms, static_cast<double>(ms));
  }
  return worst_ms / 1e3 / iters;
}

/// Elements of `bytes` at `dev_ptr` (device `device`) that differ from `expect`, read as T.
template <typename T>
size_t count_wrong(int device, const void* dev_ptr, size_t bytes, T expect) {
  std::vector<T> host(bytes / sizeof(T));
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpy(host.data(), dev_ptr, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return static_cast<size_t>(std::count_if(host.begin(), host.end(), [&](T v) { return std::memcmp(&v, &expect, sizeof(T)) != 0; }));
}

/// One checked call of each operation at `bytes`: send/recv of bytes set to (GPU + 1) arrives
/// as the other GPU's value; an all-reduce of floats of bytes 0x3F (0.7470...) gives exactly
/// twice that on both GPUs (one rounding-free addition).
size_t check_sendrecv(std::vector<Side>& sides, const Op& op, size_t bytes) {
  for (Side& s : sides) {
    CUDA_CHECK(cudaSetDevice(s.device));
    CUDA_CHECK(cudaMemset(s.send->get(), s.device + 1, bytes));
  }
  enqueue_all(sides, op, bytes);
  size_t wrong = 0;
  for (int i = 0; i < kGpus; ++i) {
    CUDA_CHECK(cudaSetDevice(sides[i].device));
    CUDA_CHECK(cudaStreamSynchronize(sides[i].stream->get()));
    wrong += count_wrong<uint8_t>(sides[i].device, sides[i].recv->get(), bytes,
                                  static_cast<uint8_t>(sides[(i + 1) % kGpus].device + 1));
  }
  return wrong;
}

size_t check_allreduce(std::vector<Side>& sides, const Op& op, size_t bytes) {
  float x = 0;
  const uint32_t bits = 0x3F3F3F3Fu;
  std::memcpy(&x, &bits, sizeof x);
  for (Side& s : sides) {
    CUDA_CHECK(cudaSetDevice(s.device));
    CUDA_CHECK(cudaMemset(s.recv->get(), 0x3F, bytes));
  }
  enqueue_all(sides, op, bytes);
  size_t wrong = 0;
  for (Side& s : sides) {
    CUDA_CHECK(cudaSetDevice(s.device));
    CUDA_CHECK(cudaStreamSynchronize(s.stream->get()));
    wrong += count_wrong<float>(s.device, s.recv->get(), bytes, 2.0f * x);
  }
  return wrong;
}

std::vector<Side> open_sides() {
  std::vector<Side> sides(kGpus);
  std::vector<int> devs(kGpus);
  std::vector<ncclComm_t> comms(kGpus, nullptr);
  for (int i = 0; i < kGpus; ++i) devs[i] = i;
  NCCL_CHECK(ncclCommInitAll(comms.data(), kGpus, devs.data()));
  for (int i = 0; i < kGpus; ++i) {
    Side& s = sides[i];
    s.device = i;
    s.comm = comms[i];
    CUDA_CHECK(cudaSetDevice(i));
    s.stream = std::make_unique<cuda::Stream>();
    s.send = std::make_unique<cuda::DeviceMemory>(kMaxBytes);
    s.recv = std::make_unique<cuda::DeviceMemory>(kMaxBytes);
    s.start = std::make_unique<cuda::EventHandle>();
    s.stop = std::make_unique<cuda::EventHandle>();
  }
  return sides;
}

}  // namespace

int run_nccl_sweeps(int warmup, int iters) {
  const int visible = cuda_visible_device_count();
  if (visible < kGpus) {
    std::fprintf(stderr, "ppb_gpu_bench --nccl: needs two GPUs in this process, %d visible%s\n", std::max(visible, 0),
                 visible <= 0 ? (" (" + cuda_unavailable_reason() + ")").c_str() : "");
    return 2;
  }
  std::vector<Side> sides = open_sides();
  const Op sendrecv = [](Side& s, int peer, size_t bytes) {  // each GPU sends to the other at once
    NCCL_CHECK(ncclSend(s.send->get(), bytes, ncclUint8, peer, s.comm, s.stream->get()));
    NCCL_CHECK(ncclRecv(s.recv->get(), bytes, ncclUint8, peer, s.comm, s.stream->get()));
  };
  const Op allreduce = [](Side& s, int, size_t bytes) {
    NCCL_CHECK(ncclAllReduce(s.recv->get(), s.recv->get(), bytes / 4, ncclFloat32, ncclSum, s.comm, s.stream->get()));
  };
  std::printf("\nnccl (%d GPUs, one process, ncclCommInitAll; nccl-tests' columns: busbw = algbw for send/recv, "
              "algbw x 2(n-1)/n for all-reduce)\n", kGpus);
  std::printf("nccl %-10s %12s %10s %10s %10s %8s\n", "op", "size(B)", "time(us)", "algbw", "busbw", "#wrong");
  for (const bool reduce : {false, true}) {
    for (size_t bytes = 8; bytes <= kMaxBytes; bytes = bytes == 8 ? 64 : bytes * 4) {
      const Op& op = reduce ? allreduce : sendrecv;
      const size_t wrong = reduce ? check_allreduce(sides, op, bytes) : check_sendrecv(sides, op, bytes);
      const double s = time_op(sides, op, bytes, warmup, iters);
      const double algbw = static_cast<double>(bytes) / s / 1e9;
      const double busbw = reduce ? algbw * 2.0 * (kGpus - 1) / kGpus : algbw;
      std::printf("nccl %-10s %12zu %10.2f %10.2f %10.2f %8zu\n", reduce ? "allreduce" : "sendrecv", bytes, s * 1e6, algbw,
                  busbw, wrong);
    }
  }
  for (Side& s : sides) ncclCommDestroy(s.comm);
  return 0;
}

}  // namespace ppb::bench
