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

void run_lane_task(const std::function<void()>& task, const std::string& lane_name,
                   const std::function<void(std::exception_ptr)>& keep_error) noexcept {
  try {
    task();
  } catch (const std::exception& e) {
    keep_error(std::current_exception());
    request_lane_abort(lane_name + " lane: " + e.what());
  } catch (...) {
    keep_error(std::current_exception());
    request_lane_abort(lane_name + " lane: unknown exception");
  }
}

}  // namespace ppb
