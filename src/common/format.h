// Number formatting for what people read (progress lines, summaries).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdarg>
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

/// `v` through printf format `f`, which takes exactly one double ("%+6.1f%%", "%8.1f"): widths
/// and signs format_fixed does not give. For summaries' columns, never for stored values.
inline std::string format_printf(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// A latency (or any figure people read) with the digits its size needs: one decimal from 10 up
/// (and 0), two from 1, below 1 three or as many as two significant digits take (up to 9:
/// "123.4", "4.56", "0.042", "0.00037"); `sign` prints "+" before a positive value. A tiny
/// model's TPOT of 0.042 ms is not "0.0". NaN as "nan".
inline std::string format_digits(double v, bool sign = false) {
  const double a = v < 0 ? -v : v;
  int decimals = a >= 10 || a == 0 ? 1 : a >= 1 ? 2 : 3;
  if (a > 0 && a < 1e-2) decimals = std::min(9, 1 - static_cast<int>(std::floor(std::log10(a))));
  char buf[64];
  std::snprintf(buf, sizeof buf, sign ? "%+.*f" : "%.*f", decimals, v);
  return buf;
}

/// printf of any arguments into a string (a progress line of several figures); at most 1023
/// characters, the rest cut. For what people read, never for stored values.
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string format_line(const char* f, ...) {
  char buf[1024];
  va_list args;
  va_start(args, f);
  std::vsnprintf(buf, sizeof buf, f, args);
  va_end(args);
  return buf;
}

/// `bytes` in binary units with 3 significant digits ("8 B", "4.00 KiB", "256 MiB", "1.50 GiB";
/// negative as "-12.0 MiB"), for progress lines and summaries.
inline std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = bytes < 0 ? -bytes : bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%.*f %s", bytes < 0 ? "-" : "", u == 0 ? 0 : v < 10 ? 2 : v < 100 ? 1 : 0, v, units[u]);
  return buf;
}

}  // namespace ppb
