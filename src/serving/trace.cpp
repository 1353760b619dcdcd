// Trace CSV reader (formats and sources in trace.h).
#include "serving/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>

#include "common/error.h"

namespace ppb::serving {
namespace {

/// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (H. Hinnant,
/// "chrono-Compatible Low-Level Date Algorithms", days_from_civil).
long long days_from_civil(long long y, unsigned m, unsigned d) {
  y -= m <= 2;
  const long long era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<long long>(doe) - 719468;
}

bool digits(const std::string& s, std::size_t pos, std::size_t n, int& out) {
  if (pos + n > s.size()) return false;
  out = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    out = out * 10 + (s[i] - '0');
  }
  return true;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string::size_type start = 0;
  while (true) {
    const auto end = line.find(',', start);
    out.push_back(trim(line.substr(start, end == std::string::npos ? end : end - start)));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

/// Where a row came from, for error messages: "FILE line N, field NAME".
struct RowPlace {
  const std::string& path;
  int line;
  [[noreturn]] void fail(const std::string& field, const std::string& value,
                         const std::string& valid) const {
    throw UserError("--trace " + path + " line " + std::to_string(line) + ", field " + field +
                    ": '" + value + "' is not " + valid);
  }
};

int parse_length(const RowPlace& at, const std::string& field, const std::string& value,
                 int max_len, bool& clamped) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty() || v < 0)
    at.fail(field, value, "a token count (an integer >= 0)");
  const long long c = std::clamp<long long>(v, 1, max_len);
  clamped = clamped || c != v;
  return static_cast<int>(c);
}

double parse_seconds(const RowPlace& at, const std::string& value) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty() ||
      !std::isfinite(v) || v < 0.0)
    at.fail("arrival_s", value, "a time in seconds >= 0");
  return v;
}

}  // namespace

const char* format_name(Trace::Format f) {
  return f == Trace::Format::azure2023 ? "azure2023" : "ppbench";
}

bool parse_datetime_ns(const std::string& text, long long& ns) {
  const std::string s = trim(text);
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  if (s.size() < 19 || !digits(s, 0, 4, y) || s[4] != '-' || !digits(s, 5, 2, mo) ||
      s[7] != '-' || !digits(s, 8, 2, d) || (s[10] != ' ' && s[10] != 'T') ||
      !digits(s, 11, 2, h) || s[13] != ':' || !digits(s, 14, 2, mi) || s[16] != ':' ||
      !digits(s, 17, 2, sec))
    return false;
  static const int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] || (mo == 2 && d == 29 && !leap) ||
      h > 23 || mi > 59 || sec > 60)
    return false;
  long long frac_ns = 0;
  if (s.size() > 19) {
    const std::size_t n = s.size() - 20;
    if (s[19] != '.' || n < 1 || n > 9) return false;
    int part = 0;
    for (std::size_t i = 0; i < 9; ++i) {
      if (i < n && !digits(s, 20 + i, 1, part)) return false;
      frac_ns = frac_ns * 10 + (i < n ? part : 0);
    }
  }
  const long long days = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  ns = ((days * 24 + h) * 60 + mi) * 60LL + sec;
  ns = ns * 1000000000LL + frac_ns;
  return true;
}

Trace read_trace(const std::string& path, int max_prompt_len, int max_gen_len) {
  std::ifstream in(path);
  if (!in) throw UserError("--trace " + path + ": cannot open the file");
  if (max_prompt_len < 1 || max_gen_len < 1)
    throw UserError("--trace " + path + ": the context leaves no room for a request");
  Trace trace;
  std::string line;
  int line_no = 0;
  bool have_header = false;
  long long first_ns = 0, prev_ns = 0;
  double prev_s = 0.0;
  while (std::getline(in, line)) {
    ++line_no;
    if (trim(line).empty()) continue;
    const std::vector<std::string> f = split_csv(line);
    const RowPlace at{path, line_no};
    if (!have_header) {
      const std::string h = trim(line);
      if (h == "arrival_s,prompt_len,gen_len") trace.format = Trace::Format::ppbench;
      else if (h == "TIMESTAMP,ContextTokens,GeneratedTokens")
        trace.format = Trace::Format::azure2023;
      else
        throw UserError("--trace " + path + " line " + std::to_string(line_no) + ": header '" +
                        h + "' is neither ppbench's 'arrival_s,prompt_len,gen_len' nor the " +
                        "Azure LLM inference trace's 'TIMESTAMP,ContextTokens,GeneratedTokens'");
      have_header = true;
      continue;
    }
    if (f.size() != 3)
      throw UserError("--trace " + path + " line " + std::to_string(line_no) + ": " +
                      std::to_string(f.size()) + " fields, expected 3");
    const bool azure = trace.format == Trace::Format::azure2023;
    Request r;
    if (azure) {
      long long ns = 0;
      if (!parse_datetime_ns(f[0], ns))
        at.fail("TIMESTAMP", f[0], "a datetime YYYY-MM-DD HH:MM:SS[.fraction]");
      if (trace.requests.empty()) first_ns = prev_ns = ns;
      if (ns < prev_ns) at.fail("TIMESTAMP", f[0], "at or after the row before (rows in time order)");
      prev_ns = ns;
      r.arrival_s = static_cast<double>(ns - first_ns) * 1e-9;
    } else {
      r.arrival_s = parse_seconds(at, f[0]);
      if (r.arrival_s < prev_s) at.fail("arrival_s", f[0], "at or after the row before (rows in time order)");
      prev_s = r.arrival_s;
    }
    bool clamped = false;
    r.prompt_len = parse_length(at, azure ? "ContextTokens" : "prompt_len", f[1], max_prompt_len, clamped);
    r.gen_len = parse_length(at, azure ? "GeneratedTokens" : "gen_len", f[2], max_gen_len, clamped);
    trace.clamped_rows += clamped ? 1 : 0;
    trace.requests.push_back(r);
  }
  if (!have_header) throw UserError("--trace " + path + ": empty file (no header line)");
  if (trace.requests.empty()) throw UserError("--trace " + path + ": a header but no requests");
  return trace;
}

}  // namespace ppb::serving
