// The floor of a piece of work on a device (the roofline model: Williams, Waterman and
// Patterson, "Roofline: an insightful visual performance model for multicore architectures",
// CACM 52(4), 2009): it cannot run faster than its bytes at the memory ceiling nor than its
// FLOPs at the compute ceiling.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace ppb {

/// Floor in ms = max(bytes / (read_GBps * 1e9), flops / (gflops * 1e9)) * 1e3.
/// flops in FLOP, bytes in bytes, read_GBps in 1e9 B/s, gflops in 1e9 FLOP/s. NaN when a
/// ceiling is unknown (NaN or <= 0: a file written before ceilings were measured).
inline double roofline_floor_ms(double flops, double bytes, double read_GBps, double gflops) {
  if (!(read_GBps > 0.0) || !(gflops > 0.0)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(bytes / (read_GBps * 1e9), flops / (gflops * 1e9)) * 1e3;
}

}  // namespace ppb
