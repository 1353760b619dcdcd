#include "backend/device.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>

#include "common/error.h"

namespace ppb {

int dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
  }
  return 4;
}

std::string dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  std::string v = s;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "f32" || v == "fp32" || v == "float32") return DType::f32;
  if (v == "f16" || v == "fp16" || v == "float16") return DType::f16;
  if (v == "bf16" || v == "bfloat16") return DType::bf16;
  throw UserError("--dtype '" + s + "' is not a data type; valid: f32, f16, bf16");
}

double monotonic_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

namespace {
std::atomic<bool> g_abort{false};
std::mutex g_abort_mutex;
std::string g_abort_reason;
}  // namespace

void request_lane_abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(g_abort_mutex);
    if (!g_abort.load() && !reason.empty()) g_abort_reason = reason;
  }
  g_abort.store(true);
}

std::string lane_abort_reason() {
  std::lock_guard<std::mutex> lock(g_abort_mutex);
  return g_abort_reason;
}
bool lane_abort_requested() { return g_abort.load(std::memory_order_relaxed); }

}  // namespace ppb
