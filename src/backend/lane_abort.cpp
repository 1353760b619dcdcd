#include "backend/lane_abort.h"

#include <atomic>
#include <mutex>

namespace ppb {

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
