// A small work-sharing loop for the planners' independent simulations (balance/plan.cpp,
// balance/plan_serving.cpp): fn(0) .. fn(n-1) on up to parallel_threads() threads (the caller's
// among them), each index taken once from a shared counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace ppb {

/// The threads parallel_for uses: the machine's cores, at most 8.
inline std::size_t parallel_threads() {
  return std::max<std::size_t>(1, std::min<std::size_t>(8, std::thread::hardware_concurrency()));
}

/// Calls fn(i) for every i in [0, n), concurrently; fn must be safe to call from several threads
/// on distinct i. Every index runs even when one throws; then the exception of the lowest index
/// that threw is rethrown.
template <typename Fn>
void parallel_for(std::size_t n, Fn&& fn) {
  std::vector<std::exception_ptr> error(n);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        error[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < std::min(parallel_threads(), n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : error)
    if (e) std::rethrow_exception(e);
}

}  // namespace ppb
