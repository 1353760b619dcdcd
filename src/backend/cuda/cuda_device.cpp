// The CUDA device: device memory buffers, stream lanes, CUDA events and the CUDA stage.
#include "backend/cuda/cuda_device.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_lane.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/cuda/cuda_stage.h"
#include "common/error.h"

namespace ppb {
namespace {

/// Device memory with synchronous upload/download on a private stream (a non-blocking stream
/// of its own: "synchronous" then means the bytes have landed, and no lane is waited for).
class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(size_t bytes, std::shared_ptr<cuda::Stream> copy_stream)
      : mem_(bytes), copy_stream_(std::move(copy_stream)) {}
  void* data() override { return mem_.get(); }
  size_t bytes() const override { return mem_.bytes(); }
  void upload(const void* host, size_t bytes, size_t offset) override {
    if (offset + bytes > mem_.bytes()) throw InternalError("CudaBuffer::upload out of range");
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(mem_.get()) + offset, host, bytes, cudaMemcpyDefault,
                               copy_stream_->get()));
    CUDA_CHECK(cudaStreamSynchronize(copy_stream_->get()));
  }
  void download(void* host, size_t bytes, size_t offset) const override {
    if (offset + bytes > mem_.bytes()) throw InternalError("CudaBuffer::download out of range");
    CUDA_CHECK(cudaMemcpyAsync(host, static_cast<const char*>(mem_.get()) + offset, bytes, cudaMemcpyDefault,
                               copy_stream_->get()));
    CUDA_CHECK(cudaStreamSynchronize(copy_stream_->get()));
  }

 private:
  cuda::DeviceMemory mem_;
  std::shared_ptr<cuda::Stream> copy_stream_;
};

/// Best time (ms) of 5 runs of `enqueue` on `stream` after 2 untimed, by CUDA events.
template <class Fn>
double time_ms(cudaStream_t stream, Fn&& enqueue) {
  cuda::EventHandle start, stop;
  for (int i = 0; i < 2; ++i) enqueue();
  double best = 1e300;
  for (int i = 0; i < 5; ++i) {
    CUDA_CHECK(cudaEventRecord(start.get(), stream));
    enqueue();
    CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    best = std::min(best, static_cast<double>(ms));
  }
  return best;
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = prop.name;
    char bus[64] = {};
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
    bus_id_ = bus;
    l2_bytes_ = prop.l2CacheSize > 0 ? static_cast<size_t>(prop.l2CacheSize) : 0;
    clock_ = std::make_shared<cuda::DeviceClock>(device);
    copy_stream_ = std::make_shared<cuda::Stream>();
    // flush_caches' buffer, allocated here and not on first use: that use is inside the
    // profiler's first held forward, and cudaMalloc may synchronize the device implicitly,
    // waiting for the held stream whose release is behind this very call.
    flush_ = std::make_unique<cuda::DeviceMemory>(std::max<size_t>(2 * l2_bytes_, size_t(64) << 20));
  }
  int ordinal() const { return device_; }
  std::string backend() const override { return "cuda"; }
  std::string name() const override { return name_; }
  std::string bus_id() const override { return bus_id_; }
  double measure_read_bandwidth_GBps() override {
    const size_t bytes = size_t(1) << 30;
    cuda::DeviceMemory src(bytes), dst(bytes);
    cuda::Stream stream;
    const double ms = time_ms(stream.get(), [&] {
      CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
    });
    return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  }
  double measure_gemm_gflops(DType dtype) override {
    const int n = 8192;
    const size_t elems = size_t(n) * n;
    cuda::DeviceMemory a(elems * dtype_bytes(dtype)), b(elems * dtype_bytes(dtype)), c(elems * dtype_bytes(dtype));
    cuda::Stream stream;
    cuda::fill_uniform(a.get(), dtype, elems, 1, 1.0f, 0.0f, stream.get());
    cuda::fill_uniform(b.get(), dtype, elems, 2, 1.0f, 0.0f, stream.get());
    cuda::CublasHandle handle;
    CUBLAS_CHECK(cublasSetStream(handle.get(), stream.get()));
    const double ms = time_ms(stream.get(), [&] {
      cuda::linear(handle.get(), c.get(), cuda::cuda_type(dtype), a.get(), b.get(), dtype, n, n, n);
    });
    return 2.0 * n * n * double(n) / (ms * 1e-3) / 1e9;
  }
  std::map<std::string, std::string> library_versions() const override {
    int runtime = 0, driver = 0, cublas = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    cublasGetProperty(MAJOR_VERSION, &cublas);
    int cublas_minor = 0, cublas_patch = 0;
    cublasGetProperty(MINOR_VERSION, &cublas_minor);
    cublasGetProperty(PATCH_LEVEL, &cublas_patch);
    auto cuda_ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); };
    return {{"cuda_runtime", cuda_ver(runtime)},
            {"cuda_driver", cuda_ver(driver)},
            {"cublas", std::to_string(cublas) + "." + std::to_string(cublas_minor) + "." + std::to_string(cublas_patch)}};
  }
  void flush_caches(Lane& lane, size_t resident_bytes, const StageExecutor* /*stage*/) override {
    // As the CPU device: weights that fit in half the L2 (H200: 60 MB) stay there in the
    // pipeline too, so a unit is profiled warm only then; otherwise it would be timed from a
    // warm L2 (a Qwen3-0.6B layer is ~30 MB in bf16) while the stage streams it from HBM.
    if (resident_bytes <= l2_bytes_ / 2) return;
    // Reading twice the L2 evicts what the last forward left there: ~30 µs at ~4 TB/s, in
    // stream order before the profiler's start event. Reads, not a memset: a memset leaves the
    // L2 full of dirty lines whose write-back the timed forward would pay (measured on an H200:
    // +13 µs per Qwen3-0.6B layer's decode, the profile's sum of units 16% over the pipeline's
    // one-stage decode step); the pipeline's previous unit leaves clean weight lines.
    cuda::read_evict(flush_->get(), flush_->bytes() - 16, flush_->as<unsigned>() + (flush_->bytes() - 16) / sizeof(unsigned),
                     cuda::as_cuda_lane(lane).stream());
  }
  size_t free_memory() const override {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
  }
  std::unique_ptr<Lane> create_lane(const std::string& name) override {
    CUDA_CHECK(cudaSetDevice(device_));
    return std::make_unique<cuda::CudaLane>(device_, name, clock_);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<cuda::CudaEvent>(device_, clock_); }
  std::unique_ptr<Buffer> allocate(size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    return std::make_unique<CudaBuffer>(bytes, copy_stream_);
  }
  std::unique_ptr<StageExecutor> create_stage(const model::ModelSpec& model, int first, int last,
                                              const StageConfig& config) override {
    CUDA_CHECK(cudaSetDevice(device_));
    return cuda::create_cuda_stage(model, first, last, config);
  }
  StageBytes stage_bytes(const model::ModelSpec& model, int first, int last,
                         const StageConfig& config) const override {
    return cuda_stage_bytes(model, first, last, config);
  }

 private:
  int device_ = 0;
  std::string name_, bus_id_;
  size_t l2_bytes_ = 0;
  std::shared_ptr<cuda::DeviceClock> clock_;
  std::shared_ptr<cuda::Stream> copy_stream_;
  std::unique_ptr<cuda::DeviceMemory> flush_;  ///< flush_caches' buffer, made with the device
};

}  // namespace

int cuda_visible_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(rc);
  }
  return n > 0 ? "" : "no CUDA device is visible";
}

int cuda_device_ordinal(const Device& device) {
  const auto* d = dynamic_cast<const CudaDevice*>(&device);
  if (!d) throw InternalError("device '" + device.name() + "' is not a CUDA device");
  return d->ordinal();
}

std::unique_ptr<Device> create_cuda_device(int local_rank) {
  const int n = cuda_visible_device_count();
  if (n <= 0) {
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    throw UserError("--device cuda: no GPU is visible (" + cuda_unavailable_reason() + "; CUDA_VISIBLE_DEVICES=" +
                    (vis ? std::string("'") + vis + "'" : std::string("unset")) + "); use --device cpu");
  }
  return std::make_unique<CudaDevice>((local_rank < 0 ? 0 : local_rank) % n);
}

}  // namespace ppb
