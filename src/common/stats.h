// Summary statistics shared by the profiler, the benchmark metrics and the report.
#pragma once

#include <vector>

namespace ppb {

/// Percentile q in [0, 100] of `v` with linear interpolation between closest ranks
/// (numpy's default "linear" method). NaN values are ignored; NaN if none remain.
double percentile(std::vector<double> v, double q);
inline double median(const std::vector<double>& v) { return percentile(v, 50.0); }
/// Arithmetic mean ignoring NaN; NaN if empty.
double mean(const std::vector<double>& v);

}  // namespace ppb
