// The process's monotonic clock: the time base of lane events (Event::time_s) and of the
// pipeline's and transports' host timestamps.
#pragma once

namespace ppb {

/// Seconds on this process's monotonic clock (CLOCK_MONOTONIC); the common time base of
/// events before they are mapped onto rank 0's clock.
double monotonic_s();

}  // namespace ppb
