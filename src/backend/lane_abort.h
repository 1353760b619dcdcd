// The process-wide lane-abort flag: once a lane or a peer fails, every blocking wait of every
// lane (CPU events, CUDA stream polls, transport polls) stops and throws instead of hanging.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace ppb {

/// Asks every lane of this process to stop waiting (a lane or peer failed); waits then throw.
/// The first call's `reason` is kept and quoted by the waits it interrupts.
void request_lane_abort(const std::string& reason = "");
/// The reason given to the first request_lane_abort(), "" if none.
std::string lane_abort_reason();
/// True once request_lane_abort() was called.
bool lane_abort_requested();

/// Runs one task of lane `lane_name`, the failure handling every backend's lanes share: when
/// `task` throws, `keep_error` gets the exception first (for the lane to rethrow from
/// synchronize()), then every lane is asked to stop waiting (request_lane_abort, quoting the
/// lane and the error). Never throws; `keep_error` must not throw either.
void run_lane_task(const std::function<void()>& task, const std::string& lane_name,
                   const std::function<void(std::exception_ptr)>& keep_error) noexcept;

}  // namespace ppb
