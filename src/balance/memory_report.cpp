#include "balance/memory_report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/error.h"

namespace ppb::balance {

MemoryReport memory_report(const Partition& p, const std::vector<int64_t>& weight_bytes,
                           const std::vector<int64_t>& kv_bytes, int64_t kv_tokens,
                           const std::vector<int64_t>& device_memory_bytes) {
  const int U = static_cast<int>(weight_bytes.size());
  if (kv_bytes.size() != weight_bytes.size())
    throw UserError("memory report: kv_bytes has " + std::to_string(kv_bytes.size()) + " units, weight_bytes " +
                    std::to_string(U));
  check_partition(p, U);
  MemoryReport r;
  r.kv_tokens = kv_tokens;
  for (int k = 0; k < p.num_stages(); ++k) {
    StageMemory m;
    m.stage = k;
    m.device = p.device_rank[k];
    m.first_unit = p.first_unit[k];
    m.last_unit = p.last_unit[k];
    for (int u = m.first_unit; u <= m.last_unit; ++u) {
      m.weight_bytes += weight_bytes[u];
      m.kv_bytes += kv_bytes[u];
    }
    m.total_bytes = m.weight_bytes + m.kv_bytes;
    if (!device_memory_bytes.empty()) {
      if (m.device >= static_cast<int>(device_memory_bytes.size()))
        throw UserError("memory report: stage " + std::to_string(k) + " runs on device " + std::to_string(m.device) +
                        " but device_memory_bytes has " + std::to_string(device_memory_bytes.size()) + " entries");
      m.limit_bytes = std::max<int64_t>(0, device_memory_bytes[m.device]);
    }
    m.kv_bytes_per_token = kv_tokens > 0 ? static_cast<double>(m.kv_bytes) / static_cast<double>(kv_tokens) : 0.0;
    if (m.limit_bytes > 0) {
      m.free_bytes = m.limit_bytes - m.total_bytes;
      if (m.kv_bytes_per_token > 0) {
        const double room = static_cast<double>(m.limit_bytes - m.weight_bytes);
        m.kv_token_capacity = room > 0 ? static_cast<int64_t>(std::floor(room / m.kv_bytes_per_token)) : 0;
        m.kv_tokens_left = m.kv_token_capacity - kv_tokens;
        if (r.pipeline_kv_token_capacity < 0 || m.kv_token_capacity < r.pipeline_kv_token_capacity) {
          r.pipeline_kv_token_capacity = m.kv_token_capacity;
          r.limiting_stage = k;
        }
      }
    }
    r.stages.push_back(m);
  }
  return r;
}

std::string format_memory_report(const MemoryReport& r) {
  auto gib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof(line), "%-5s %-11s %-6s %11s %11s %11s %11s %15s\n", "stage", "units", "device",
                "weights GiB", "KV GiB", "limit GiB", "free GiB", "KV tokens left");
  os << line;
  for (const auto& m : r.stages) {
    const std::string units = std::to_string(m.first_unit) + ".." + std::to_string(m.last_unit);
    std::snprintf(line, sizeof(line), "%-5d %-11s %-6d %11s %11s %11s %11s %15s\n", m.stage, units.c_str(), m.device,
                  gib(m.weight_bytes).c_str(), gib(m.kv_bytes).c_str(),
                  m.limit_bytes > 0 ? gib(m.limit_bytes).c_str() : "unlimited",
                  m.limit_bytes > 0 ? gib(m.free_bytes).c_str() : "-",
                  m.kv_tokens_left >= 0 || m.kv_token_capacity >= 0 ? std::to_string(m.kv_tokens_left).c_str() : "unlimited");
    os << line;
  }
  if (r.limiting_stage >= 0)
    os << "KV capacity: " << r.pipeline_kv_token_capacity << " cached tokens (workload: " << r.kv_tokens
       << "), limited by stage " << r.limiting_stage << "\n";
  return os.str();
}

}  // namespace ppb::balance
