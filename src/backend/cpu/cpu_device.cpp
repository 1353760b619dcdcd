// The CPU device: host buffers, worker-thread lanes, and the BLAS stage executor.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "backend/cpu/cpu_lane.h"
#include "backend/cpu/cpu_stage.h"
#include "backend/device.h"
#include "common/error.h"

namespace ppb {
namespace {

/// 64-byte aligned, zero-initialised host memory.
class CpuBuffer final : public Buffer {
 public:
  explicit CpuBuffer(size_t bytes) : bytes_(bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, rounded == 0 ? 64 : rounded);
  }
  ~CpuBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset) override {
    if (offset + bytes > bytes_) throw InternalError("CpuBuffer::upload out of range");
    std::memcpy(static_cast<char*>(data_) + offset, host, bytes);
  }
  void download(void* host, size_t bytes, size_t offset) const override {
    if (offset + bytes > bytes_) throw InternalError("CpuBuffer::download out of range");
    std::memcpy(host, static_cast<const char*>(data_) + offset, bytes);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) {
        std::string name = line.substr(pos + 1);
        size_t first = name.find_first_not_of(' ');
        return first == std::string::npos ? name : name.substr(first);
      }
    }
  }
  return "CPU";
}

/// MemAvailable of /proc/meminfo in bytes (0 if unknown).
size_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

/// Size of the largest CPU cache in bytes (sysfs), 32 MiB if unknown.
size_t last_level_cache_bytes() {
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    size_t mult = 1;
    if (text.back() == 'K') mult = 1024;
    if (text.back() == 'M') mult = 1024 * 1024;
    best = std::max(best, static_cast<size_t>(std::atoll(text.c_str())) * mult);
  }
  return best ? best : size_t(32) << 20;
}

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int blas_threads) {
    int threads = blas_threads;
    if (threads <= 0) {
      const char* env = std::getenv("OPENBLAS_NUM_THREADS");
      threads = env ? std::atoi(env) : 1;
      if (threads <= 0) threads = 1;
    }
    openblas_set_num_threads(threads);
    threads_ = threads;
  }
  std::string backend() const override { return "cpu"; }
  std::string name() const override {
    std::ostringstream os;
    os << cpu_model_name() << " (" << threads_ << " BLAS thread" << (threads_ == 1 ? "" : "s") << ")";
    return os.str();
  }
  std::string bus_id() const override { return ""; }
  size_t free_memory() const override { return mem_available_bytes(); }
  void flush_caches(Lane& lane, size_t resident_bytes) override {
    // Weights that fit in half the last-level cache stay there during the pipeline too.
    if (resident_bytes <= last_level_cache_bytes() / 2) return;
    if (!flush_) {
      // 1.5x the last-level cache, at least 64 MiB, at most 2 GiB.
      flush_bytes_ = std::clamp<size_t>(last_level_cache_bytes() * 3 / 2, size_t(64) << 20, size_t(2) << 30);
      flush_ = std::make_unique<CpuBuffer>(flush_bytes_);
      std::memset(flush_->data(), 1, flush_bytes_);  // real pages, not the shared zero page
    }
    auto* p = static_cast<unsigned char*>(flush_->data());
    const size_t n = flush_bytes_;
    // Touch every cache line: ~n / memory bandwidth (0.7 GB at ~10 GB/s: ~70 ms).
    lane.host_task([p, n] {
      for (size_t i = 0; i < n; i += 64) p[i] = static_cast<unsigned char>(p[i] + 1);
    });
  }
  std::map<std::string, std::string> library_versions() const override {
    return {{"openblas", openblas_get_config()}};
  }
  std::unique_ptr<Lane> create_lane(const std::string& name) override {
    return std::make_unique<CpuLane>(name);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return std::make_unique<CpuBuffer>(bytes); }
  std::unique_ptr<StageExecutor> create_stage(const model::ModelSpec& model, int first, int last,
                                              const StageConfig& config) override {
    return create_cpu_stage(model, first, last, config);
  }

 private:
  int threads_ = 1;
  std::unique_ptr<CpuBuffer> flush_;
  size_t flush_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Device> create_cpu_device(int blas_threads) {
  return std::make_unique<CpuDevice>(blas_threads);
}

}  // namespace ppb
