// Per-request and per-run serving metrics (definitions and sources in request_metrics.h).
#include "serving/request_metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "common/stats.h"

namespace ppb::serving {
namespace {

[[noreturn]] void bad_times(const RequestTimes& r, const std::string& why) {
  std::ostringstream os;
  os << "serving metrics: inconsistent request times (arrival " << r.arrival_s << " s, gen_len "
     << r.gen_len << "): " << why;
  throw InternalError(os.str());
}

const char* kGoodputForms =
    "KEY:MS with KEY ttft, tpot or e2e (e2el) and MS milliseconds >= 0, each key once, e.g. "
    "--goodput ttft:500 tpot:50";

void add_goodput_item(const std::string& item, GoodputSpec& spec) {
  const auto colon = item.find(':');
  auto fail = [&](const std::string& why) {
    throw UserError("--goodput '" + item + "': " + why + "; valid: " + kGoodputForms);
  };
  if (colon == std::string::npos || item.find(':', colon + 1) != std::string::npos)
    fail("not one KEY:MS pair");
  const std::string key = item.substr(0, colon), value = item.substr(colon + 1);
  double ms = 0.0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty() ||
      !std::isfinite(ms) || ms < 0.0)
    fail("'" + value + "' is not a number of milliseconds >= 0");
  double* slot = key == "ttft" ? &spec.ttft_ms
                 : key == "tpot" ? &spec.tpot_ms
                 : (key == "e2e" || key == "e2el") ? &spec.e2e_ms
                                                   : nullptr;
  if (slot == nullptr) fail("unknown metric '" + key + "'");
  if (!std::isnan(*slot)) fail("'" + key + "' given twice");
  *slot = ms;
}

}  // namespace

RequestLatency request_latency(const RequestTimes& r) {
  if (r.gen_len < 1) bad_times(r, "gen_len < 1");
  if (r.token_s.size() != static_cast<std::size_t>(r.gen_len))
    bad_times(r, std::to_string(r.token_s.size()) + " token times for gen_len tokens");
  if (r.token_s.front() != r.first_token_s || r.token_s.back() != r.finish_s)
    bad_times(r, "first/last token time is not first_token_s/finish_s");
  if (r.admitted_s < r.arrival_s || r.first_token_s < r.admitted_s)
    bad_times(r, "not arrival <= admitted <= first token");
  RequestLatency l;
  l.queue_s = r.admitted_s - r.arrival_s;
  l.ttft_s = r.first_token_s - r.arrival_s;
  l.e2e_s = r.finish_s - r.arrival_s;
  if (r.gen_len > 1) l.tpot_s = (l.e2e_s - l.ttft_s) / (r.gen_len - 1);
  l.itl_s.reserve(r.token_s.size() - 1);
  for (std::size_t k = 1; k < r.token_s.size(); ++k) {
    if (r.token_s[k] < r.token_s[k - 1]) bad_times(r, "token times decrease");
    l.itl_s.push_back(r.token_s[k] - r.token_s[k - 1]);
  }
  return l;
}

LatencySummary summarize_ms(const std::vector<double>& values_s) {
  LatencySummary s;
  s.n = static_cast<std::size_t>(
      std::count_if(values_s.begin(), values_s.end(), [](double v) { return !std::isnan(v); }));
  if (s.n == 0) return s;
  s.mean_ms = mean(values_s) * 1e3;
  s.p50_ms = percentile(values_s, 50.0) * 1e3;
  s.p90_ms = percentile(values_s, 90.0) * 1e3;
  s.p99_ms = percentile(values_s, 99.0) * 1e3;
  return s;
}

namespace {

/// `v` in the fewest significant digits that read back as the same double.
std::string shortest(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace

std::string goodput_text(const GoodputSpec& slo) {
  std::string out;
  const std::pair<const char*, double> limits[] = {{"ttft", slo.ttft_ms}, {"tpot", slo.tpot_ms}, {"e2e", slo.e2e_ms}};
  for (const auto& [key, ms] : limits) {
    if (std::isnan(ms)) continue;
    if (!out.empty()) out += ' ';
    out.append(key).append(":").append(shortest(ms));
  }
  return out;
}

bool GoodputSpec::any() const {
  return !std::isnan(ttft_ms) || !std::isnan(tpot_ms) || !std::isnan(e2e_ms);
}

GoodputSpec parse_goodput(const std::vector<std::string>& items) {
  GoodputSpec spec;
  for (const std::string& item : items) {
    std::istringstream words(item);
    std::string word;
    bool any = false;
    while (words >> word) {
      add_goodput_item(word, spec);
      any = true;
    }
    if (!any) throw UserError(std::string("--goodput '") + item + "': empty; valid: " + kGoodputForms);
  }
  return spec;
}

bool meets_slo(const RequestLatency& l, const GoodputSpec& slo) {
  // vLLM: is_good_req = all(slo_s >= value_s) with slo_s = limit_ms / 1000.
  const double tpot = std::isnan(l.tpot_s) ? 0.0 : l.tpot_s;
  if (!std::isnan(slo.ttft_ms) && !(slo.ttft_ms / 1000.0 >= l.ttft_s)) return false;
  if (!std::isnan(slo.tpot_ms) && !(slo.tpot_ms / 1000.0 >= tpot)) return false;
  if (!std::isnan(slo.e2e_ms) && !(slo.e2e_ms / 1000.0 >= l.e2e_s)) return false;
  return true;
}

ServingMetrics serving_metrics(const std::vector<RequestTimes>& requests, const GoodputSpec& slo,
                               double start_s) {
  return pooled_metrics({requests}, slo, start_s);
}

namespace {

/// vLLM's peaks of one round (ServingMetrics): {tokens in the busiest second, requests active in
/// the busiest second}.
std::pair<double, int> peaks(const std::vector<RequestTimes>& requests) {
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  for (const RequestTimes& r : requests) t0 = std::min(t0, r.arrival_s), t1 = std::max(t1, r.finish_s);
  const std::size_t n = static_cast<std::size_t>(std::ceil(t1 - t0)) + 1;
  std::vector<double> tokens(n, 0.0);
  std::vector<int> active(n, 0);
  for (const RequestTimes& r : requests) {
    for (double t : r.token_s) {
      const auto b = static_cast<std::size_t>(t - t0);
      if (b < n) tokens[b] += 1;
    }
    for (auto b = static_cast<std::size_t>(r.arrival_s - t0); b <= static_cast<std::size_t>(r.finish_s - t0) && b < n; ++b)
      ++active[b];
  }
  return {*std::max_element(tokens.begin(), tokens.end()), *std::max_element(active.begin(), active.end())};
}

}  // namespace

ServingMetrics pooled_metrics(const std::vector<std::vector<RequestTimes>>& rounds, const GoodputSpec& slo,
                              double start_s) {
  ServingMetrics m;
  std::vector<double> queue, ttft, tpot, itl, e2e;
  for (const std::vector<RequestTimes>& requests : rounds) {
    if (requests.empty()) throw InternalError("serving metrics: no request");
    double last_finish = -std::numeric_limits<double>::infinity();
    for (const RequestTimes& r : requests) {
      const RequestLatency l = request_latency(r);
      queue.push_back(l.queue_s);
      ttft.push_back(l.ttft_s);
      if (!std::isnan(l.tpot_s)) tpot.push_back(l.tpot_s);
      itl.insert(itl.end(), l.itl_s.begin(), l.itl_s.end());
      e2e.push_back(l.e2e_s);
      m.total_input_tokens += r.prompt_len;
      m.total_output_tokens += r.gen_len;
      m.preemptions += r.preemptions;
      m.good += slo.any() && meets_slo(l, slo) ? 1 : 0;
      last_finish = std::max(last_finish, r.finish_s);
    }
    m.completed += requests.size();
    const auto [peak_tokens, peak_active] = peaks(requests);
    m.peak_output_tokens_per_s = std::max(m.peak_output_tokens_per_s, peak_tokens);
    m.peak_concurrency = std::max(m.peak_concurrency, peak_active);
    const double duration = last_finish - start_s;
    if (!(duration > 0.0)) throw InternalError("serving metrics: duration " + std::to_string(duration) + " s <= 0");
    m.duration_s += duration;
  }
  if (rounds.empty()) throw InternalError("serving metrics: no round");
  m.request_throughput = static_cast<double>(m.completed) / m.duration_s;
  m.output_tokens_per_s = static_cast<double>(m.total_output_tokens) / m.duration_s;
  m.total_tokens_per_s =
      static_cast<double>(m.total_input_tokens + m.total_output_tokens) / m.duration_s;
  m.queue = summarize_ms(queue);
  m.ttft = summarize_ms(ttft);
  m.tpot = summarize_ms(tpot);
  m.itl = summarize_ms(itl);
  m.e2e = summarize_ms(e2e);
  if (slo.any()) {
    m.goodput_req_per_s = static_cast<double>(m.good) / m.duration_s;
    m.slo_attainment = static_cast<double>(m.good) / static_cast<double>(m.completed);
  }
  return m;
}

}  // namespace ppb::serving
