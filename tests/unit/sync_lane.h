// Test helper shared by the CPU stage's tests: a Lane that runs each task at once.
#pragma once

#include <cstring>
#include <functional>
#include <string>

#include "backend/lane.h"

namespace ppb::test {

/// A Lane whose host_task runs the function immediately, on the calling thread; counts the
/// tasks (a refused step enqueues none).
class SyncLane final : public Lane {
 public:
  const std::string& name() const override { return name_; }
  void record(Event&) override {}
  void wait(const Event&) override {}
  void host_task(std::function<void()> fn) override {
    ++tasks;
    fn();
  }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
  double cpu_time_s() const override { return -1.0; }
  int tasks = 0;

 private:
  std::string name_ = "sync";
};

}  // namespace ppb::test
