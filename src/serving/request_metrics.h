// Per-request and per-run latency metrics of a serving scenario (issue 37), with vLLM's
// definitions (vllm/benchmarks/serve.py, `calculate_metrics`, `benchmark`), so that a ppbench
// table reads like `vllm bench serve`'s:
//  - TTFT = first token - arrival; E2E = finish (last token) - arrival;
//  - TPOT = (E2E - TTFT) / (out - 1), only for out > 1 (vLLM appends no TPOT for out = 1; for
//    goodput it counts that request's TPOT as 0, so a TPOT limit never fails it);
//  - ITL = the gaps between consecutive output tokens of a request (out - 1 per request), pooled
//    over all requests;
//  - queue time = admitted - arrival (ppbench's own: vLLM's client cannot see it);
//  - mean, p50, p90, p99 with numpy's default percentile (linear interpolation between closest
//    ranks, np.percentile as vLLM calls it; ppb::percentile);
//  - duration = last finish - the scenario's start (vLLM: benchmark_start_time is taken before
//    the first request's gap is slept, benchmark_duration after every request finished; the
//    first arrival is one gap after the start, and at the start in vLLM before its
//    get_request precomputed the delays);
//  - request throughput = completed / duration; output tokens/s = sum(out) / duration; total
//    tokens/s = (sum(prompt) + sum(out)) / duration;
//  - peak output tokens/s and peak concurrency: vLLM's one-second buckets (ServingMetrics);
//  - goodput (`--goodput ttft:MS tpot:MS e2e:MS`, vLLM's `request_goodput`): requests that meet
//    every given limit (value <= limit, compared in seconds as vLLM does: limit_ms / 1000), per
//    second of duration; attainment = those requests / completed requests.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace ppb::serving {

/// What a run recorded for one finished request, on one clock (seconds from the scenario's
/// start).
struct RequestTimes {
  double arrival_s = 0.0;      ///< arrived
  double admitted_s = 0.0;     ///< first got a slot (its prefill step started)
  double first_token_s = 0.0;  ///< its first output token was out (end of its prefill step)
  double finish_s = 0.0;       ///< its last output token was out
  std::vector<double> token_s; ///< when each output token was out, shape [gen_len]:
                               ///< token_s.front() = first_token_s, token_s.back() = finish_s
  int prompt_len = 0;
  int gen_len = 0;             ///< output tokens (out), >= 1
  int preemptions = 0;         ///< times its KV blocks were taken back (recomputed; scheduler.h)
  int preempted_tokens = 0;    ///< the KV positions those preemptions discarded (run again)
};

/// The latencies of one request (seconds).
struct RequestLatency {
  double queue_s = 0.0;  ///< admitted - arrival
  double ttft_s = 0.0;   ///< first token - arrival
  double tpot_s = std::numeric_limits<double>::quiet_NaN();  ///< NaN for out = 1
  double e2e_s = 0.0;    ///< finish - arrival
  std::vector<double> itl_s;  ///< shape [out - 1]: token_s[k] - token_s[k-1]
};

/// The latencies of `r`. Throws ppb::InternalError when the times are inconsistent (gen_len < 1,
/// token_s not of gen_len entries, token_s not non-decreasing, first/last token not
/// first_token_s/finish_s, admitted before arrival or after the first token): an engine bug.
RequestLatency request_latency(const RequestTimes& r);

/// One latency over the requests, in ms. n = 0: mean and percentiles NaN (vLLM prints 0).
struct LatencySummary {
  std::size_t n = 0;
  double mean_ms = std::numeric_limits<double>::quiet_NaN();
  double p50_ms = std::numeric_limits<double>::quiet_NaN();
  double p90_ms = std::numeric_limits<double>::quiet_NaN();
  double p99_ms = std::numeric_limits<double>::quiet_NaN();
};

/// Summary of `values_s` (seconds; NaN entries ignored): mean and numpy-linear percentiles, ms.
LatencySummary summarize_ms(const std::vector<double>& values_s);

/// Limits of `--goodput` (ms); NaN = not given.
struct GoodputSpec {
  double ttft_ms = std::numeric_limits<double>::quiet_NaN();
  double tpot_ms = std::numeric_limits<double>::quiet_NaN();
  double e2e_ms = std::numeric_limits<double>::quiet_NaN();
  bool any() const;
};

/// Parses `--goodput` items such as {"ttft:200", "tpot:50"} (one item per token of the flag;
/// an item may also hold several separated by spaces): KEY:MS with KEY one of ttft, tpot, e2e
/// (vLLM's name e2el accepted too) and MS a number >= 0 of milliseconds (vLLM's check), each key
/// at most once. Throws ppb::UserError naming --goodput, the item and what would be valid.
GoodputSpec parse_goodput(const std::vector<std::string>& items);

/// Whether a request meets every limit given (TPOT of out = 1 counted as 0, as vLLM does).
bool meets_slo(const RequestLatency& l, const GoodputSpec& slo);

/// The run's metrics (file comment for each definition).
struct ServingMetrics {
  std::size_t completed = 0;
  long long total_input_tokens = 0;   ///< sum of prompt_len
  long long total_output_tokens = 0;  ///< sum of gen_len
  double duration_s = 0.0;            ///< last finish - start_s
  double request_throughput = 0.0;    ///< requests/s
  double output_tokens_per_s = 0.0;
  double total_tokens_per_s = 0.0;
  LatencySummary queue, ttft, tpot, itl, e2e;
  std::size_t good = 0;               ///< requests meeting every limit (0 without limits)
  double goodput_req_per_s = std::numeric_limits<double>::quiet_NaN();  ///< NaN without limits
  double slo_attainment = std::numeric_limits<double>::quiet_NaN();     ///< good / completed
  /// vLLM's peaks (serve.py calculate_metrics): one-second buckets from the earliest arrival; the
  /// most output tokens out in one bucket, and the most requests active (arrival to finish, both
  /// buckets included) in one. Pooled over rounds: the highest round's.
  double peak_output_tokens_per_s = 0.0;
  int peak_concurrency = 0;
  /// Preemptions (RequestTimes::preemptions) over the requests; pooled: over every round's.
  long long preemptions = 0;
};

/// Metrics of the finished requests `requests` (every one completed; shape [N], N >= 1) of a
/// scenario that started at `start_s` on their clock (0: times are seconds from its start).
/// Throws ppb::InternalError on no request, a request's inconsistent times
/// (request_latency) or a duration <= 0.
ServingMetrics serving_metrics(const std::vector<RequestTimes>& requests, const GoodputSpec& slo,
                               double start_s = 0.0);

/// The metrics of several rounds of one scenario pooled (each round's requests on its own clock,
/// started at `start_s`): latencies (and their percentiles) over every round's requests, rates
/// as the rounds' total work over their summed durations, attainment over every request.
/// serving_metrics(r) = pooled_metrics({r}). Throws as serving_metrics, and on no round.
ServingMetrics pooled_metrics(const std::vector<std::vector<RequestTimes>>& rounds, const GoodputSpec& slo,
                              double start_s = 0.0);

/// "ttft:2000 tpot:500" (the limits given, in --goodput's form); "" without any.
std::string goodput_text(const GoodputSpec& slo);

}  // namespace ppb::serving
