// Number formatting for what people read (progress lines, summaries).
#pragma once

#include <cstdio>
#include <string>

namespace ppb {

/// `v` with exactly `decimals` digits after the point ("6325.46" for 6325.459736, 2), as
/// printf's %.*f; NaN as "nan". For progress lines and summaries, never for stored values.
inline std::string format_fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace ppb
