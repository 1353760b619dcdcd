// The CPU device: host buffers, worker-thread lanes, and the BLAS stage executor.
#include <cblas.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu_evict.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_lane.h"
#include "backend/cpu/cpu_memory.h"
#include "backend/cpu/cpu_stage.h"
#include "backend/cpu/cpu_weight_cache.h"
#include "backend/device.h"
#include "common/cgroup.h"
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

/// The unsigned integer that is the whole of `text` but for surrounding white space.
std::optional<uint64_t> parse_u64(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return std::nullopt;
  const auto last = text.find_last_not_of(" \t\r\n");
  text = text.substr(first, last - first + 1);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// The value of `key` in a "key value" per line file (memory.stat, /proc/meminfo with "key:").
std::optional<uint64_t> keyed_value(std::string_view text, std::string_view key) {
  for (std::string_view line : split_fields(text, '\n')) {
    if (line.size() > key.size() && line.substr(0, key.size()) == key &&
        (line[key.size()] == ' ' || line[key.size()] == '\t')) {
      line.remove_prefix(key.size());
      const auto unit = line.find(" kB");  // /proc/meminfo
      if (unit != std::string_view::npos) {
        auto kib = parse_u64(line.substr(0, unit));
        if (kib) return *kib * 1024;
        return std::nullopt;
      }
      return parse_u64(line);
    }
  }
  return std::nullopt;
}

/// A cgroup's headroom and the directory that sets it.
struct Headroom {
  size_t bytes = 0;
  std::filesystem::path dir;
};

/// Headroom of the cgroup directories from root/rel up to root (the smallest, with its
/// directory; nullopt if none has a limit). limit_file: the limit ("max" or a value >= 2^62 =
/// unlimited); usage_file: the charged bytes; inactive_key: the reclaimable page cache in
/// memory.stat.
std::optional<Headroom> hierarchy_headroom(const std::filesystem::path& root, std::string_view rel,
                                           const char* limit_file, const char* usage_file,
                                           const char* inactive_key) {
  std::optional<Headroom> best;
  for (const std::filesystem::path& dir : cgroup_dirs_up(root, rel)) {
    const auto limit = parse_u64(read_text(dir / limit_file));  // "max" does not parse: no limit
    if (!limit || *limit >= (uint64_t(1) << 62)) continue;
    const auto usage = parse_u64(read_text(dir / usage_file));
    if (!usage) continue;
    const uint64_t inactive = keyed_value(read_text(dir / "memory.stat"), inactive_key).value_or(0);
    const uint64_t used = *usage > inactive ? *usage - inactive : 0;
    const size_t headroom = *limit > used ? static_cast<size_t>(*limit - used) : 0;
    if (!best || headroom < best->bytes) best = Headroom{headroom, dir};
  }
  return best;
}

/// The tightest headroom of every memory hierarchy the process belongs to (v1 and v2).
std::optional<Headroom> tightest_headroom(std::string_view self_cgroup, const std::filesystem::path& cgroup_root) {
  std::optional<Headroom> best;
  auto take = [&best](std::optional<Headroom> h) {
    if (h && (!best || h->bytes < best->bytes)) best = std::move(h);
  };
  for (const CgroupMembership& m : cgroup_memberships(self_cgroup)) {
    if (m.v2) {
      take(hierarchy_headroom(cgroup_root, m.path, "memory.max", "memory.current", "inactive_file"));
    } else if (m.has("memory")) {
      take(hierarchy_headroom(cgroup_root / "memory", m.path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                              "total_inactive_file"));
    }
  }
  return best;
}

/// The identity of a directory within one kernel: "<device>:<inode>" (a cgroup directory's
/// inode is the kernel's, the same seen from any container or cgroup namespace, where the path
/// is not: every container sees its own cgroup as "/"), or the path where stat fails.
std::string directory_identity(const std::filesystem::path& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return dir.string();
  return std::to_string(static_cast<uint64_t>(st.st_dev)) + ":" + std::to_string(static_cast<uint64_t>(st.st_ino));
}

}  // namespace

std::optional<size_t> cgroup_memory_headroom(std::string_view self_cgroup,
                                             const std::filesystem::path& cgroup_root) {
  const auto h = tightest_headroom(self_cgroup, cgroup_root);
  return h ? std::optional<size_t>(h->bytes) : std::nullopt;
}

std::vector<MemoryPool> cpu_memory_pools(const std::filesystem::path& proc_root,
                                         const std::filesystem::path& cgroup_root) {
  std::vector<MemoryPool> pools;
  if (const auto available = keyed_value(read_text(proc_root / "meminfo"), "MemAvailable:"))
    pools.push_back({static_cast<size_t>(*available), "kernel"});
  if (const auto h = tightest_headroom(read_text(proc_root / "self" / "cgroup"), cgroup_root))
    pools.push_back({h->bytes, "cgroup:" + directory_identity(h->dir)});
  return pools;
}

size_t cpu_free_memory(const std::filesystem::path& proc_root, const std::filesystem::path& cgroup_root) {
  const std::vector<MemoryPool> pools = cpu_memory_pools(proc_root, cgroup_root);
  return memory_share(pools, std::vector<int>(pools.size(), 1));  // the smallest pool; 0 if none
}

size_t cpu_last_level_cache_bytes() {
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

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int blas_threads) {
    int threads = blas_threads;
    if (threads <= 0) {
      const char* env = std::getenv("OPENBLAS_NUM_THREADS");
      threads = env ? std::atoi(env) : 1;
      if (threads <= 0) threads = 1;
    }
    cpu::set_gemm_threads(threads);
    threads_ = threads;
    cpu::choose_gemm_library();
  }
  std::string backend() const override { return "cpu"; }
  std::string name() const override {
    std::ostringstream os;
    os << cpu_model_name() << " (" << threads_ << " BLAS thread" << (threads_ == 1 ? "" : "s") << ", "
       << cpu::gemm_library_name(cpu::gemm_library()) << " GEMM";
    if (cpu::small_m_isa()[0] != '\0') os << ", " << cpu::small_m_isa() << " decode kernel";
    os << ")";
    return os.str();
  }
  std::string bus_id() const override { return ""; }
  int compute_threads() const override { return threads_; }
  /// MemAvailable of the node, capped by the memory cgroup limit of this process (Slurm's
  /// --mem/--mem-per-cpu under cgroup enforcement, a container's limit): cpu_free_memory().
  size_t free_memory() const override { return cpu_free_memory(); }
  /// MemAvailable, shared by the machine's ranks, and the memory cgroup's headroom, shared by
  /// the ranks in that cgroup: cpu_memory_pools().
  std::vector<MemoryPool> memory_pools() const override { return cpu_memory_pools(); }
  void flush_caches(Lane& lane, size_t resident_bytes, const StageExecutor* stage) override {
    // Weights that fit in half the last-level cache stay there during the pipeline too.
    if (resident_bytes <= cpu_last_level_cache_bytes() / 2) return;
    if (stage != nullptr && cpu::can_evict_lines()) {
      // The stage's own lines, evicted one by one: a write stream through a larger buffer left
      // a block the profile reads again and again in this VM's L3 (cpu_evict.h's figures).
      lane.host_task([blocks = stage->host_blocks()] {
        for (const auto& [p, n] : blocks) cpu::evict_lines(p, n);
      });
      return;
    }
    if (!flush_) {
      // 1.5x the last-level cache, at least 64 MiB, at most 2 GiB.
      flush_bytes_ = std::clamp<size_t>(cpu_last_level_cache_bytes() * 3 / 2, size_t(64) << 20, size_t(2) << 30);
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
  bool node_ranks_share_memory() const override { return true; }
  double measure_read_bandwidth_GBps() override {
    return cpu::stream_read_GBps(std::clamp<size_t>(2 * cpu_last_level_cache_bytes(), size_t(64) << 20, size_t(512) << 20));
  }
  double measure_gemm_gflops(DType dtype) override {
    if (dtype != DType::f32) throw UserError("the CPU backend computes in f32 only, not " + dtype_name(dtype));
    return cpu::gemm_gflops();
  }
  std::map<std::string, std::string> library_versions() const override {
    std::map<std::string, std::string> v{{"openblas", openblas_get_config()},
                                         {"gemm_library", cpu::gemm_library_name(cpu::gemm_library())},
                                         {"small_m_kernel", cpu::small_m_isa()}};
    if (cpu::have_onednn()) v["onednn"] = cpu::onednn_version();
    return v;
  }
  std::unique_ptr<Lane> create_lane(const std::string& name) override {
    return std::make_unique<CpuLane>(name);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return std::make_unique<CpuBuffer>(bytes); }
  std::unique_ptr<StageExecutor> create_stage(const model::ModelSpec& model, int first, int last,
                                              const StageConfig& config) override {
    return create_cpu_stage(model, first, last, config, weights_);
  }
  StageBytes stage_bytes(const model::ModelSpec& model, int first, int last,
                         const StageConfig& config) const override {
    return cpu_stage_bytes(model, first, last, config);
  }

 private:
  int threads_ = 1;
  // One copy of each weight tensor on this rank, shared by the stages built side by side
  // (every partition of the rounds, the profile's units): cpu_weight_cache.h says why.
  std::shared_ptr<cpu::WeightCache> weights_ = std::make_shared<cpu::WeightCache>();
  std::unique_ptr<CpuBuffer> flush_;
  size_t flush_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Device> create_cpu_device(int blas_threads) {
  return std::make_unique<CpuDevice>(blas_threads);
}

}  // namespace ppb
