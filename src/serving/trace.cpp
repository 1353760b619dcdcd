// Trace CSV reader (formats and sources in trace.h).
#include "serving/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

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

/// A token count as given (an integer >= 0).
long long parse_count(const RowPlace& at, const std::string& field, const std::string& value) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty() || v < 0)
    at.fail(field, value, "a token count (an integer >= 0)");
  return v;
}

double parse_seconds(const RowPlace& at, const std::string& field, const std::string& value) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty() ||
      !std::isfinite(v) || v < 0.0)
    at.fail(field, value, "a time in seconds >= 0");
  return v;
}

/// One row as read: its time (s, on the file's clock), its lengths as given, its prompt blocks.
struct RawRow {
  double t_s = 0.0;
  long long t_ns = 0;  ///< Azure: the UTC time exactly (t_s rounds it)
  long long prompt = 0, gen = 0;
  std::vector<long long> hashes;
};

/// The rows of a trace file and its format; every row's time checked against the one before.
struct RawTrace {
  Trace::Format format = Trace::Format::ppbench;
  std::vector<RawRow> rows;
  double prev_t = -std::numeric_limits<double>::infinity();
  void add(const RowPlace& at, const std::string& field, const std::string& value, RawRow r) {
    if (r.t_s < prev_t) at.fail(field, value, "at or after the row before (rows in time order)");
    prev_t = r.t_s;
    rows.push_back(std::move(r));
  }
};

/// The columns of a CSV format: the time's, the prompt's and the output's names and indices.
struct CsvColumns {
  std::string time, prompt, gen;
  std::size_t t = 0, p = 1, g = 2, fields = 3;
};

/// The format a CSV header names (its columns), or throws naming the file and the valid headers.
CsvColumns csv_format(const std::string& path, int line_no, const std::string& header, Trace::Format& format) {
  if (header == "arrival_s,prompt_len,gen_len") {
    format = Trace::Format::ppbench;
    return {"arrival_s", "prompt_len", "gen_len"};
  }
  if (header == "TIMESTAMP,ContextTokens,GeneratedTokens") {
    format = Trace::Format::azure2023;  // azure2024 once a row has an offset
    return {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};
  }
  const std::vector<std::string> h = split_csv(header);
  auto col = [&](const char* name) { return static_cast<std::size_t>(std::find(h.begin(), h.end(), name) - h.begin()); };
  CsvColumns c{"Timestamp", "Request tokens", "Response tokens", col("Timestamp"), col("Request tokens"),
               col("Response tokens"), h.size()};
  if (c.t < h.size() && c.p < h.size() && c.g < h.size()) {
    format = Trace::Format::burstgpt;
    return c;
  }
  throw UserError("--trace " + path + " line " + std::to_string(line_no) + ": header '" + header +
                  "' is none of ppbench's 'arrival_s,prompt_len,gen_len', the Azure LLM inference trace's "
                  "'TIMESTAMP,ContextTokens,GeneratedTokens', BurstGPT's (Timestamp, Request tokens, Response "
                  "tokens, ...), nor a Mooncake JSON line ({\"timestamp\": ms, \"input_length\": ...})");
}

/// A CSV row of `c`'s columns into `raw`.
void read_csv_row(const RowPlace& at, const std::string& line, const CsvColumns& c, RawTrace& raw) {
  const std::vector<std::string> f = split_csv(line);
  if (f.size() != c.fields)
    throw UserError("--trace " + at.path + " line " + std::to_string(at.line) + ": " + std::to_string(f.size()) +
                    " fields, expected " + std::to_string(c.fields));
  RawRow r;
  const std::string& time = f[c.t];
  if (raw.format == Trace::Format::azure2023 || raw.format == Trace::Format::azure2024) {
    long long ns = 0;
    bool zoned = false;
    if (!parse_datetime_ns(time, ns, &zoned))
      at.fail(c.time, time, "a datetime YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]");
    if (zoned) raw.format = Trace::Format::azure2024;
    r.t_ns = ns;
    r.t_s = static_cast<double>(ns) * 1e-9;
  } else {
    r.t_s = parse_seconds(at, c.time, time);
  }
  r.prompt = parse_count(at, c.prompt, f[c.p]);
  r.gen = parse_count(at, c.gen, f[c.g]);
  raw.add(at, c.time, time, std::move(r));
}

/// A Mooncake JSON line into `raw`.
void read_json_row(const RowPlace& at, const std::string& line, RawTrace& raw) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("--trace " + at.path + " line " + std::to_string(at.line) + ": not a JSON object");
  auto count = [&](const char* key) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<long long>() < 0)
      at.fail(key, it == j.end() ? "(missing)" : it->dump(), "an integer >= 0");
    return it->get<long long>();
  };
  RawRow r;
  const long long ms = count("timestamp");
  r.t_s = static_cast<double>(ms) * 1e-3;
  r.prompt = count("input_length");
  r.gen = count("output_length");
  if (const auto h = j.find("hash_ids"); h != j.end()) {
    if (!h->is_array()) at.fail("hash_ids", h->dump(), "an array of block hashes");
    for (const auto& x : *h) {
      if (!x.is_number_integer()) at.fail("hash_ids", x.dump(), "an integer block hash");
      r.hashes.push_back(x.get<long long>());
    }
  }
  raw.add(at, "timestamp", std::to_string(ms), std::move(r));
}

/// Every row of `path`, its format told by its first line.
RawTrace read_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError("--trace " + path + ": cannot open the file");
  RawTrace raw;
  std::string line;
  int line_no = 0;
  bool started = false;
  CsvColumns cols;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string t = trim(line);
    if (t.empty()) continue;
    const RowPlace at{path, line_no};
    if (!started) {
      started = true;
      if (t.front() == '{') raw.format = Trace::Format::mooncake;
      else {
        cols = csv_format(path, line_no, t, raw.format);
        continue;
      }
    }
    if (raw.format == Trace::Format::mooncake) read_json_row(at, t, raw);
    else read_csv_row(at, t, cols, raw);
  }
  if (!started) throw UserError("--trace " + path + ": empty file (no header line)");
  if (raw.rows.empty()) throw UserError("--trace " + path + ": a header but no requests");
  return raw;
}

void check_options(const TraceOptions& o) {
  if (!(o.speedup > 0) || !std::isfinite(o.speedup))
    throw UserError("--trace-speedup " + std::to_string(o.speedup) + ": a factor > 0 (2: twice the trace's rate)");
  if (!(o.window_start_s >= 0) || !(o.window_end_s > o.window_start_s))
    throw UserError("--trace-window " + std::to_string(o.window_start_s) + ":" + std::to_string(o.window_end_s) +
                    ": START:END seconds of the trace's own clock with 0 <= START < END");
}

}  // namespace

const char* format_name(Trace::Format f) {
  switch (f) {
    case Trace::Format::azure2023: return "azure2023";
    case Trace::Format::azure2024: return "azure2024";
    case Trace::Format::burstgpt: return "burstgpt";
    case Trace::Format::mooncake: return "mooncake";
    case Trace::Format::ppbench: break;
  }
  return "ppbench";
}

bool parse_datetime_ns(const std::string& text, long long& ns, bool* zoned) {
  std::string s = trim(text);
  // The offset: Z, +HH:MM, -HH:MM or +HHMM after the seconds (and their fraction).
  long long offset_s = 0;
  if (zoned) *zoned = false;
  if (s.size() > 19) {
    const std::size_t z = s.find_first_of("Z+-", 19);
    if (z != std::string::npos) {
      const std::string off = s.substr(z);
      int oh = 0, om = 0;
      const bool colon = off.size() == 6 && off[3] == ':';
      if (off == "Z") {
      } else if ((colon || off.size() == 5) && digits(off, 1, 2, oh) && digits(off, colon ? 4 : 3, 2, om) && oh <= 23 &&
                 om <= 59) {
        offset_s = (off[0] == '-' ? -1 : 1) * (oh * 3600LL + om * 60LL);
      } else {
        return false;
      }
      if (zoned) *zoned = true;
      s = s.substr(0, z);
    }
  }
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
  ns = ((days * 24 + h) * 60 + mi) * 60LL + sec - offset_s;
  ns = ns * 1000000000LL + frac_ns;
  return true;
}

Trace read_trace(const std::string& path, int max_prompt_len, int max_gen_len, const TraceOptions& options) {
  if (max_prompt_len < 1 || max_gen_len < 1)
    throw UserError("--trace " + path + ": the context leaves no room for a request");
  check_options(options);
  RawTrace raw = read_rows(path);
  Trace trace;
  trace.format = raw.format;
  trace.rows = static_cast<int>(raw.rows.size());
  const bool azure = raw.format == Trace::Format::azure2023 || raw.format == Trace::Format::azure2024;
  const long long first_ns = raw.rows.front().t_ns;
  // ppbench's own times are the scenario's as given; the others' count from the first row.
  const double first_s = raw.format == Trace::Format::ppbench ? 0.0 : raw.rows.front().t_s;
  std::unordered_set<long long> seen;  // Mooncake: blocks of the kept requests so far
  for (RawRow& r : raw.rows) {
    // Seconds since the first row (Azure: from integer nanoseconds, exact to the nanosecond).
    const double t = azure ? static_cast<double>(r.t_ns - first_ns) * 1e-9 : r.t_s - first_s;
    if (raw.format == Trace::Format::burstgpt && r.gen == 0) {  // a failed request (vLLM drops them)
      ++trace.dropped_rows;
      continue;
    }
    if (t < options.window_start_s || t >= options.window_end_s) {
      ++trace.outside_window;
      continue;
    }
    Request q;
    q.arrival_s = (t - options.window_start_s) / options.speedup;
    q.prompt_len = static_cast<int>(std::clamp<long long>(r.prompt, 1, max_prompt_len));
    q.gen_len = static_cast<int>(std::clamp<long long>(r.gen, 1, max_gen_len));
    trace.clamped_rows += (q.prompt_len != r.prompt || q.gen_len != r.gen) ? 1 : 0;
    if (raw.format == Trace::Format::mooncake)
      for (long long h : r.hashes) {
        ++trace.prefix_blocks;
        trace.reused_prefix_blocks += seen.insert(h).second ? 0 : 1;
      }
    trace.requests.push_back(q);
  }
  if (trace.requests.empty())
    throw UserError("--trace " + path + ": no request to replay (" + std::to_string(trace.rows) + " rows, " +
                    std::to_string(trace.dropped_rows) + " with 0 response tokens dropped, " +
                    std::to_string(trace.outside_window) + " outside --trace-window)");
  return trace;
}

}  // namespace ppb::serving
