// What the benches print of repeated ratios: "median [min..max]".
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "common/stats.h"

namespace ppb::bench {

/// "1.019 [0.990..1.039]": the median of `v` (ppb::median) and its extremes, 3 decimals. `v` non-empty.
inline std::string median_range(const std::vector<double>& v) {
  char b[80];
  std::snprintf(b, sizeof b, "%.3f [%.3f..%.3f]", ppb::median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  return b;
}

}  // namespace ppb::bench
