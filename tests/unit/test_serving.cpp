// The serving scenario's pure parts (issue 37): arrivals against vLLM's definition and an
// independent reference, length specs, both trace formats, the metrics against hand-computed
// per-request times, and the continuous-batching scheduler on hand-made schedules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "serving/arrivals.h"
#include "serving/scenario.h"
#include "serving/request_metrics.h"
#include "serving/scheduler.h"
#include "serving/trace.h"
#include "user_error_of.h"

namespace ppb::serving {
namespace {

using ppb::test::error_of;
constexpr double kInf = std::numeric_limits<double>::infinity();

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- arrivals -------------------------------------------------------------------------------

// Mean gap and squared coefficient of variation of n Gamma(K, theta = 1/(R K)) gaps: the mean is
// 1/R and CV^2 = 1/K. Tolerances are 5 standard errors of each estimator for this n:
//  - mean: SE = sigma / sqrt(n) with sigma = sqrt(K) theta = (1/R) / sqrt(K).
//  - CV^2 = s^2 / xbar^2, by the delta method: Var(c^)/c^2 = Var(s^2)/sigma^4
//    + 4 Var(xbar)/mu^2 - 4 Cov(s^2, xbar)/(sigma^2 mu), with Gamma's moments mu = K theta,
//    sigma^2 = K theta^2, mu3 = 2 K theta^3, excess kurtosis 6/K: Var(s^2)/sigma^4 = (2 + 6/K)/n,
//    Var(xbar)/mu^2 = 1/(K n), Cov(s^2, xbar) = mu3 / n gives 2/(K n); so the relative SE of
//    CV^2 is sqrt((2 + 2/K) / n) (K = 0.5, n = 200,000: 0.55%, 5 SE = 2.7%).
TEST(ServingArrivals, GapsHaveMeanOneOverRateAndCv2OneOverShape) {
  const int n = 200000;
  const double rate = 8.0;
  for (double k : {0.5, 1.0, 4.0}) {
    std::mt19937_64 rng(42);
    const std::vector<double> gaps = draw_gaps({rate, k, true}, n, rng);
    ASSERT_EQ(gaps.size(), static_cast<std::size_t>(n));
    const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / n;
    double ss = 0.0;
    for (double g : gaps) ss += (g - mean) * (g - mean);
    const double var = ss / (n - 1);
    const double cv2 = var / (mean * mean);
    const double mean_se = (1.0 / rate) / std::sqrt(k) / std::sqrt(static_cast<double>(n));
    EXPECT_NEAR(mean, 1.0 / rate, 5 * mean_se) << "K = " << k;
    const double cv2_se = (1.0 / k) * std::sqrt((2.0 + 2.0 / k) / n);
    EXPECT_NEAR(cv2, 1.0 / k, 5 * cv2_se) << "K = " << k;
  }
}

// An independent implementation of vLLM's get_request: gamma(shape = K, scale = 1/(R K)) with
// the same engine and seed, running sums, and the rescale to N / R.
TEST(ServingArrivals, EqualsAnIndependentReferenceOfVllmsDefinition) {
  const double rate = 3.5, k = 0.7;
  const int n = 500;
  ScenarioSpec spec;
  spec.arrivals = {rate, k, /*rescale_to_rate=*/false};
  spec.requests = n;
  spec.prompt_lens = parse_length_spec("fixed:16", "--prompt-lens");
  spec.gen_lens = parse_length_spec("fixed:4", "--gen-lens");
  spec.max_prompt_len = spec.max_gen_len = 64;
  spec.seed = 1234;

  std::mt19937_64 ref_rng(1234);
  std::gamma_distribution<double> ref_gamma(k, 1.0 / (rate * k));
  std::vector<double> ref_gaps(n), ref(n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    ref_gaps[i] = ref_gamma(ref_rng);
    ref[i] = sum += ref_gaps[i];
  }

  std::mt19937_64 rng(1234);
  const std::vector<double> gaps = draw_gaps(spec.arrivals, n, rng);
  const std::vector<Request> raw = generate_requests(spec);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(raw[i].arrival_s, ref[i]) << i;  // bitwise: same engine, same distribution
    ASSERT_EQ(gaps[i], ref_gaps[i]) << i;
  }
  EXPECT_GT(raw[0].arrival_s, 0.0);  // one gap before the first request, as in vLLM

  spec.arrivals.rescale_to_rate = true;
  const std::vector<Request> scaled = generate_requests(spec);
  const double factor = (n / rate) / ref.back();
  for (int i = 0; i < n; ++i) ASSERT_EQ(scaled[i].arrival_s, ref[i] * factor) << i;
  EXPECT_NEAR(scaled.back().arrival_s, n / rate, 1e-12 * n / rate);
}

TEST(ServingArrivals, SameSeedSameRequestsOtherSeedOthers) {
  ScenarioSpec spec;
  spec.arrivals = {2.0, 1.0, true};
  spec.requests = 64;
  spec.prompt_lens = parse_length_spec("lognormal:128,0.8", "--prompt-lens");
  spec.gen_lens = parse_length_spec("uniform:1,64", "--gen-lens");
  spec.max_prompt_len = 512;
  spec.max_gen_len = 64;
  spec.seed = 7;
  const std::vector<Request> a = generate_requests(spec), b = generate_requests(spec);
  ASSERT_EQ(a.size(), 64u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_len, b[i].prompt_len);
    EXPECT_EQ(a[i].gen_len, b[i].gen_len);
    if (i > 0) EXPECT_GE(a[i].arrival_s, a[i - 1].arrival_s);
  }
  // Streams are independent: other output lengths leave arrivals and prompts as they were.
  ScenarioSpec other_gen = spec;
  other_gen.gen_lens = parse_length_spec("fixed:3", "--gen-lens");
  const std::vector<Request> c = generate_requests(other_gen);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(c[i].arrival_s, a[i].arrival_s);
    EXPECT_EQ(c[i].prompt_len, a[i].prompt_len);
    EXPECT_EQ(c[i].gen_len, 3);
  }
  spec.seed = 8;
  const std::vector<Request> d = generate_requests(spec);
  int same = 0;
  for (std::size_t i = 0; i + 1 < a.size(); ++i) same += d[i].arrival_s == a[i].arrival_s;
  EXPECT_EQ(same, 0);
  // ... but the last arrival is N / R whatever the seed (vLLM's rescale).
  EXPECT_NEAR(d.back().arrival_s, 32.0, 1e-12);
  EXPECT_NEAR(a.back().arrival_s, 32.0, 1e-12);
}

// vLLM's ramp-up: request i's rate start + (end - start) i / (N - 1) (linear) or
// start (end / start)^(i / (N - 1)) (exponential), its gap drawn at it, nothing rescaled.
// Constant gaps (burstiness inf) make them hand-computable: linear 1 -> 3 req/s: gaps 1, 1/2,
// 1/3; exponential 1 -> 4: gaps 1, 1/2, 1/4.
TEST(ServingArrivals, RampUpRatesAsVllmComputesThem) {
  ScenarioSpec spec;
  spec.arrivals.burstiness = std::numeric_limits<double>::infinity();
  spec.arrivals.ramp = RampUp::linear;
  spec.arrivals.ramp_start_rps = 1;
  spec.arrivals.ramp_end_rps = 3;
  spec.requests = 3;
  spec.prompt_lens = parse_length_spec("fixed:4", "--prompt-lens");
  spec.gen_lens = parse_length_spec("fixed:2", "--gen-lens");
  spec.max_prompt_len = spec.max_gen_len = 8;
  auto r = generate_requests(spec);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_NEAR(r[0].arrival_s, 1.0, 1e-12);
  EXPECT_NEAR(r[1].arrival_s, 1.5, 1e-12);
  EXPECT_NEAR(r[2].arrival_s, 1.5 + 1.0 / 3, 1e-12);
  spec.arrivals.ramp = RampUp::exponential;
  spec.arrivals.ramp_end_rps = 4;
  r = generate_requests(spec);
  EXPECT_NEAR(r[1].arrival_s, 1.5, 1e-12);
  EXPECT_NEAR(r[2].arrival_s, 1.75, 1e-12);
  // Poisson gaps at a linear ramp 1 -> 100 req/s: the last tenth of 2,000 requests arrives far
  // faster than the first (mean rates ~95 and ~6 req/s by the formula).
  spec.arrivals.burstiness = 1;
  spec.arrivals.ramp = RampUp::linear;
  spec.arrivals.ramp_end_rps = 100;
  spec.requests = 2000;
  r = generate_requests(spec);
  const double first = r[199].arrival_s - r[0].arrival_s, last = r[1999].arrival_s - r[1800].arrival_s;
  EXPECT_GT(first / last, 8.0);
  EXPECT_TRUE(contains(error_of([] { parse_ramp_up("sine"); }), "--ramp-up-strategy 'sine'"));
}

TEST(ServingArrivals, InfiniteRateAllAtZeroInfiniteBurstinessConstantGaps) {
  std::mt19937_64 rng(1);
  const std::vector<double> t0 = arrival_times({kInf, 1.0, true}, draw_gaps({kInf, 1.0, true}, 5, rng));
  EXPECT_EQ(t0, std::vector<double>(5, 0.0));
  const ArrivalSpec regular{4.0, kInf, true};
  const std::vector<double> t = arrival_times(regular, draw_gaps(regular, 4, rng));
  EXPECT_EQ(t, (std::vector<double>{0.25, 0.5, 0.75, 1.0}));
}

TEST(ServingArrivals, InvalidRateOrBurstinessNamesTheFlag) {
  std::mt19937_64 rng(1);
  const std::string rate = error_of([&] { draw_gaps({0.0, 1.0, true}, 3, rng); });
  EXPECT_TRUE(contains(rate, "--request-rate 0")) << rate;
  EXPECT_TRUE(contains(rate, "> 0")) << rate;
  const std::string k = error_of([&] { draw_gaps({1.0, -2.0, true}, 3, rng); });
  EXPECT_TRUE(contains(k, "--burstiness -2")) << k;
  const std::string nan = error_of([&] { validate({std::nan(""), 1.0, true}); });
  EXPECT_TRUE(contains(nan, "--request-rate")) << nan;
  ScenarioSpec spec;
  spec.requests = 0;
  EXPECT_TRUE(contains(error_of([&] { generate_requests(spec); }), "--requests 0"));
}

// ---- lengths --------------------------------------------------------------------------------

TEST(ServingLengths, ParsesTheThreeFormsAndNamesTheFlagOnBadInput) {
  const LengthSpec f = parse_length_spec("fixed:7", "--gen-lens");
  EXPECT_EQ(f.kind, LengthSpec::Kind::fixed);
  EXPECT_EQ(f.n, 7);
  const LengthSpec u = parse_length_spec("uniform:3,9", "--gen-lens");
  EXPECT_EQ(u.kind, LengthSpec::Kind::uniform);
  EXPECT_EQ(u.lo, 3);
  EXPECT_EQ(u.hi, 9);
  const LengthSpec l = parse_length_spec("lognormal:256,0.5", "--prompt-lens");
  EXPECT_EQ(l.kind, LengthSpec::Kind::lognormal);
  EXPECT_EQ(l.median, 256.0);
  EXPECT_EQ(l.sigma, 0.5);
  EXPECT_EQ(l.text, "lognormal:256,0.5");
  for (const char* bad : {"fixed:0", "fixed:x", "uniform:5", "uniform:9,3", "uniform:0,3",
                          "lognormal:-1,1", "lognormal:10,-1", "lognormal:10", "poisson:4",
                          "256", "fixed:3,4"}) {
    const std::string e = error_of([&] { parse_length_spec(bad, "--prompt-lens"); });
    EXPECT_TRUE(contains(e, std::string("--prompt-lens '") + bad + "'")) << e;
    EXPECT_TRUE(contains(e, "uniform:a,b")) << e;  // says what would be valid
  }
}

TEST(ServingLengths, ClampsToOneAndTheContextLimit) {
  std::mt19937_64 rng(3);
  EXPECT_EQ(draw_length(parse_length_spec("fixed:5000", "--prompt-lens"), 100, rng), 100);
  EXPECT_EQ(draw_length(parse_length_spec("lognormal:1000,0", "--prompt-lens"), 64, rng), 64);
  EXPECT_EQ(draw_length(parse_length_spec("lognormal:0.2,0", "--prompt-lens"), 64, rng), 1);
  EXPECT_EQ(draw_length(parse_length_spec("lognormal:37,0", "--prompt-lens"), 64, rng), 37);
  const LengthSpec u = parse_length_spec("uniform:1,10", "--gen-lens");
  std::vector<int> seen(11, 0);
  for (int i = 0; i < 2000; ++i) {
    const int v = draw_length(u, 5, rng);
    ASSERT_GE(v, 1);
    ASSERT_LE(v, 5);
    ++seen[v];
  }
  // 1..4 each ~10% of the draws, 5 takes 5..10 (~60%).
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[5], 1000);
}

// The sample median of n lognormal draws estimates exp(mu) = median: its log has standard error
// sigma * sqrt(pi / (2 n)) (the median of a normal sample); 5 SE with sigma = 1, n = 20001 is
// 4.4%, plus 1 token for the rounding to integers.
TEST(ServingLengths, LognormalHasTheGivenMedian) {
  const LengthSpec spec = parse_length_spec("lognormal:256,1.0", "--prompt-lens");
  std::mt19937_64 rng(11);
  const int n = 20001;
  std::vector<int> v(n);
  for (int& x : v) x = draw_length(spec, 1 << 30, rng);
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  const double tol = 5 * 1.0 * std::sqrt(std::acos(-1.0) / (2.0 * n));
  EXPECT_GE(v[n / 2], 256.0 * std::exp(-tol) - 1);
  EXPECT_LE(v[n / 2], 256.0 * std::exp(tol) + 1);
}

// ---- traces ---------------------------------------------------------------------------------

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "ppb_serving_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ServingTrace, ReadsPpbenchsOwnFormat) {
  const std::string path = write_file("own.csv",
                                      "arrival_s,prompt_len,gen_len\n"
                                      "0,16,4\n"
                                      "0.25,300,8\r\n"
                                      "\n"
                                      "1.5,0,2\n");
  const Trace t = read_trace(path, 256, 64);
  EXPECT_EQ(t.format, Trace::Format::ppbench);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[0].arrival_s, 0.0);
  EXPECT_EQ(t.requests[1].arrival_s, 0.25);
  EXPECT_EQ(t.requests[1].prompt_len, 256);  // clamped from 300
  EXPECT_EQ(t.requests[1].gen_len, 8);
  EXPECT_EQ(t.requests[2].prompt_len, 1);    // clamped from 0
  EXPECT_EQ(t.requests[2].gen_len, 2);
  EXPECT_EQ(t.clamped_rows, 2);
}

// The first rows of AzureLLMInferenceTrace_code.csv as published, and a midnight crossing.
TEST(ServingTrace, ReadsTheAzure2023TraceAsItIs) {
  const std::string path = write_file("azure.csv",
                                      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      "2023-11-16 18:17:03.9799600,4808,10\n"
                                      "2023-11-16 18:17:04.0319600,3180,8\n"
                                      "2023-11-16 18:17:04.0781490,110,27\n"
                                      "2023-11-17 00:00:00,7,1\n");
  const Trace t = read_trace(path, 4096, 64);
  EXPECT_EQ(t.format, Trace::Format::azure2023);
  EXPECT_STREQ(format_name(t.format), "azure2023");
  ASSERT_EQ(t.requests.size(), 4u);
  EXPECT_EQ(t.requests[0].arrival_s, 0.0);
  EXPECT_NEAR(t.requests[1].arrival_s, 0.052, 1e-12);
  EXPECT_NEAR(t.requests[2].arrival_s, 0.098189, 1e-12);
  EXPECT_NEAR(t.requests[3].arrival_s, 20576.02004, 1e-9);
  EXPECT_EQ(t.requests[0].prompt_len, 4096);  // 4808 clamped to the context
  EXPECT_EQ(t.requests[0].gen_len, 10);
  EXPECT_EQ(t.requests[2].prompt_len, 110);
  EXPECT_EQ(t.requests[2].gen_len, 27);
  EXPECT_EQ(t.clamped_rows, 1);
}

// The Azure 2024 week-long traces: the same header, UTC offsets, whole seconds without a fraction.
TEST(ServingTrace, ReadsTheAzure2024TraceWithItsOffsets) {
  const std::string path = write_file("azure2024.csv",
                                      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      "2024-05-10 00:00:00.009930+00:00,2162,5\n"
                                      "2024-05-10 00:00:01+00:00,1500,12\n"
                                      "2024-05-10 02:00:02.5+02:00,100,1\n");  // 00:00:02.5 UTC
  const Trace t = read_trace(path, 4096, 64);
  EXPECT_EQ(t.format, Trace::Format::azure2024);
  EXPECT_STREQ(format_name(t.format), "azure2024");
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[0].arrival_s, 0.0);
  EXPECT_NEAR(t.requests[1].arrival_s, 0.990070, 1e-12);
  EXPECT_NEAR(t.requests[2].arrival_s, 2.490070, 1e-12);
  EXPECT_EQ(t.requests[0].prompt_len, 2162);
  EXPECT_EQ(t.requests[0].gen_len, 5);
  EXPECT_EQ(t.rows, 3);
}

// BurstGPT's rows as its README publishes them (BurstGPT_1.csv), a failed request (0 response
// tokens: dropped, as vLLM's loader does), and the later releases' extra columns read by name.
TEST(ServingTrace, ReadsBurstGptAndDropsTheFailedRequests) {
  const std::string v1 = write_file("burstgpt.csv",
                                    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                    "5,ChatGPT,472,18,490,Conversation log\n"
                                    "45,ChatGPT,1087,230,1317,Conversation log\n"
                                    "60,ChatGPT,600,0,600,Conversation log\n"
                                    "118,GPT-4,417,276,693,Conversation log\n");
  const Trace t = read_trace(v1, 1024, 256);
  EXPECT_EQ(t.format, Trace::Format::burstgpt);
  EXPECT_EQ(t.rows, 4);
  EXPECT_EQ(t.dropped_rows, 1);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[0].arrival_s, 0.0);  // from the first row
  EXPECT_EQ(t.requests[1].arrival_s, 40.0);
  EXPECT_EQ(t.requests[2].arrival_s, 113.0);
  EXPECT_EQ(t.requests[1].prompt_len, 1024);  // 1087 clamped
  EXPECT_EQ(t.requests[1].gen_len, 230);
  EXPECT_EQ(t.requests[2].prompt_len, 417);
  EXPECT_EQ(t.requests[2].gen_len, 256);  // 276 clamped
  EXPECT_EQ(t.clamped_rows, 2);
  const std::string v2 = write_file("burstgpt2.csv",
                                    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
                                    "Log Type\n"
                                    "0,abc,1.5,GPT-4,100,10,110,Conversation log\n"
                                    "2.5,abc,0.7,GPT-4,200,20,220,API log\n");
  const Trace u = read_trace(v2, 1024, 256);
  ASSERT_EQ(u.requests.size(), 2u);
  EXPECT_EQ(u.requests[1].arrival_s, 2.5);
  EXPECT_EQ(u.requests[1].prompt_len, 200);
  EXPECT_EQ(u.requests[1].gen_len, 20);
}

// Mooncake's JSON lines (the row its trace README shows, then rows sharing its prefix blocks):
// times in ms, the prompt blocks counted and those an earlier request had.
TEST(ServingTrace, ReadsMooncakeJsonLinesAndCountsTheSharedPrefixBlocks) {
  const std::string path = write_file(
      "mooncake.jsonl",
      "{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47, 48, 49, 50, 51, 52, "
      "53, 54, 55, 56, 57, 2353, 2354]}\n"
      "{\"timestamp\": 27500, \"input_length\": 1500, \"output_length\": 8, \"hash_ids\": [46, 47, 9000]}\n"
      "{\"timestamp\": 30482, \"input_length\": 300, \"output_length\": 1, \"hash_ids\": [9000]}\n");
  const Trace t = read_trace(path, 8192, 64);
  EXPECT_EQ(t.format, Trace::Format::mooncake);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[0].arrival_s, 0.0);
  EXPECT_NEAR(t.requests[1].arrival_s, 0.018, 1e-12);
  EXPECT_NEAR(t.requests[2].arrival_s, 3.0, 1e-12);
  EXPECT_EQ(t.requests[0].prompt_len, 6955);
  EXPECT_EQ(t.requests[0].gen_len, 52);
  EXPECT_EQ(t.prefix_blocks, 18);
  EXPECT_EQ(t.reused_prefix_blocks, 3);  // 46, 47 of the second; 9000 of the third
  const std::string bad = write_file("mooncake_bad.jsonl", "{\"timestamp\": 1, \"input_length\": -3, \"output_length\": 1}\n");
  const std::string e = error_of([&] { read_trace(bad, 100, 100); });
  EXPECT_TRUE(contains(e, bad + " line 1, field input_length: '-3'")) << e;
}

// --trace-window keeps the rows of [START, END) of the trace's own clock, from START;
// --trace-speedup divides the times.
TEST(ServingTrace, WindowAndSpeedupReplayASliceAtAnotherRate) {
  const std::string path = write_file("window.csv",
                                      "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                      "100,ChatGPT,10,1,11,Conversation log\n"
                                      "110,ChatGPT,20,2,22,Conversation log\n"
                                      "130,ChatGPT,30,3,33,Conversation log\n"
                                      "150,ChatGPT,40,4,44,Conversation log\n");
  TraceOptions o;
  o.window_start_s = 10;  // the rows at 110 and 130
  o.window_end_s = 50;
  o.speedup = 4;
  const Trace t = read_trace(path, 100, 100, o);
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.outside_window, 2);
  EXPECT_EQ(t.requests[0].arrival_s, 0.0);
  EXPECT_EQ(t.requests[1].arrival_s, 5.0);  // (30 - 10) / 4
  EXPECT_EQ(t.requests[1].prompt_len, 30);
  o.window_start_s = 60;
  o.window_end_s = 70;
  const std::string e = error_of([&] { read_trace(path, 100, 100, o); });
  EXPECT_TRUE(contains(e, "no request to replay (4 rows, 0 with 0 response tokens dropped, 4 outside --trace-window)")) << e;
  o = {};
  o.speedup = 0;
  EXPECT_TRUE(contains(error_of([&] { read_trace(path, 100, 100, o); }), "--trace-speedup"));
}

TEST(ServingTrace, DatetimesAgainstKnownEpochSeconds) {
  long long ns = -1;
  ASSERT_TRUE(parse_datetime_ns("1970-01-01 00:00:00", ns));
  EXPECT_EQ(ns, 0);
  ASSERT_TRUE(parse_datetime_ns("2000-03-01T00:00:00", ns));
  EXPECT_EQ(ns, 11017LL * 86400 * 1000000000LL);
  ASSERT_TRUE(parse_datetime_ns("2024-02-29 12:00:00.5", ns));
  EXPECT_EQ(ns, 1709208000LL * 1000000000LL + 500000000LL);
  ASSERT_TRUE(parse_datetime_ns("2023-11-16 18:17:03.9799600", ns));
  EXPECT_EQ(ns, 1700158623LL * 1000000000LL + 979960000LL);
  long long utc = 0;  // offsets: the same instant in UTC
  bool zoned = false;
  ASSERT_TRUE(parse_datetime_ns("2024-05-10 00:00:00", utc, &zoned));
  EXPECT_FALSE(zoned);
  for (const char* same : {"2024-05-10 00:00:00+00:00", "2024-05-10 02:00:00+02:00", "2024-05-09 18:30:00-05:30",
                           "2024-05-10T00:00:00Z", "2024-05-10 01:00:00+0100"}) {
    ASSERT_TRUE(parse_datetime_ns(same, ns, &zoned)) << same;
    EXPECT_EQ(ns, utc) << same;
    EXPECT_TRUE(zoned) << same;
  }
  for (const char* bad : {"2023-02-29 00:00:00", "2023-13-01 00:00:00", "2023-11-16",
                          "2023-11-16 24:00:00", "2023-11-16 18:17:03.", "2023-11-16 18:17:03,5",
                          "2023-11-16 18:17:03.1234567890", "2024-05-10 00:00:00+24:00", "2024-05-10 00:00:00+2:00",
                          "2024-05-10 00:00:00.+00:00"})
    EXPECT_FALSE(parse_datetime_ns(bad, ns)) << bad;
}

TEST(ServingTrace, ErrorsNameTheFileTheLineAndTheField) {
  const std::string a = write_file("bad_time.csv",
                                   "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   "2023-11-16 18:17:03.9799600,4808,10\n"
                                   "2023-11-16 25:17:04,3180,8\n");
  std::string e = error_of([&] { read_trace(a, 100, 100); });
  EXPECT_TRUE(contains(e, a + " line 3, field TIMESTAMP")) << e;
  const std::string b = write_file("bad_len.csv", "arrival_s,prompt_len,gen_len\n0,4,-1\n");
  e = error_of([&] { read_trace(b, 100, 100); });
  EXPECT_TRUE(contains(e, b + " line 2, field gen_len: '-1'")) << e;
  const std::string c = write_file("backwards.csv", "arrival_s,prompt_len,gen_len\n2,4,1\n1,4,1\n");
  e = error_of([&] { read_trace(c, 100, 100); });
  EXPECT_TRUE(contains(e, c + " line 3, field arrival_s")) << e;
  const std::string d = write_file("header.csv", "time,in,out\n0,1,1\n");
  e = error_of([&] { read_trace(d, 100, 100); });
  EXPECT_TRUE(contains(e, d + " line 1: header 'time,in,out'")) << e;
  const std::string f = write_file("fields.csv", "arrival_s,prompt_len,gen_len\n0,1\n");
  e = error_of([&] { read_trace(f, 100, 100); });
  EXPECT_TRUE(contains(e, f + " line 2: 2 fields, expected 3")) << e;
  e = error_of([&] { read_trace("/nonexistent/trace.csv", 100, 100); });
  EXPECT_TRUE(contains(e, "/nonexistent/trace.csv: cannot open")) << e;
}


// ---- metrics --------------------------------------------------------------------------------

RequestTimes times(double arrival, double admitted, std::vector<double> tokens, int prompt) {
  RequestTimes r;
  r.arrival_s = arrival;
  r.admitted_s = admitted;
  r.first_token_s = tokens.front();
  r.finish_s = tokens.back();
  r.gen_len = static_cast<int>(tokens.size());
  r.token_s = std::move(tokens);
  r.prompt_len = prompt;
  return r;
}

// Three requests by hand (seconds):
//   A: arrival 0,   admitted 0.5, tokens 1, 1.25, 1.5, 2 (out 4), prompt 10:
//      queue 0.5, TTFT 1, E2E 2, TPOT (2 - 1)/3 = 1/3, ITL 0.25 0.25 0.5
//   B: arrival 0.5, admitted 0.5, token 1.5 (out 1), prompt 20:
//      queue 0, TTFT 1, E2E 1, no TPOT (out = 1), no ITL
//   C: arrival 1,   admitted 2,   tokens 2.5, 3 (out 2), prompt 30:
//      queue 1, TTFT 1.5, E2E 2, TPOT 0.5, ITL 0.5
// Duration 3 - 0 = 3 s. numpy-linear percentiles of sorted x at h = p/100 (n - 1):
//   TTFT [1, 1, 1.5]: mean 7/6, p50 1, p90 x1 + 0.8 (x2 - x1) = 1.4, p99 1.49
//   TPOT [1/3, 1/2]:  mean 5/12, p50 1/3 + 0.5/6, p90 1/3 + 0.9/6, p99 1/3 + 0.99/6
//   ITL [0.25, 0.25, 0.5, 0.5]: mean 0.375, p50 (h 1.5) 0.375, p90 (h 2.7) 0.5, p99 0.5
//   E2E [1, 2, 2]: mean 5/3, p50 p90 p99 2;  queue [0, 0.5, 1]: mean 0.5, p50 0.5, p90 0.9, p99 0.99
std::vector<RequestTimes> hand_made_requests() {
  return {times(0.0, 0.5, {1.0, 1.25, 1.5, 2.0}, 10), times(0.5, 0.5, {1.5}, 20),
          times(1.0, 2.0, {2.5, 3.0}, 30)};
}

void expect_summary(const LatencySummary& s, std::size_t n, double mean, double p50, double p90,
                    double p99) {
  EXPECT_EQ(s.n, n);
  EXPECT_NEAR(s.mean_ms, mean, 1e-9);
  EXPECT_NEAR(s.p50_ms, p50, 1e-9);
  EXPECT_NEAR(s.p90_ms, p90, 1e-9);
  EXPECT_NEAR(s.p99_ms, p99, 1e-9);
}

TEST(ServingMetrics, PerRequestLatenciesByHand) {
  const std::vector<RequestTimes> r = hand_made_requests();
  const RequestLatency a = request_latency(r[0]);
  EXPECT_DOUBLE_EQ(a.queue_s, 0.5);
  EXPECT_DOUBLE_EQ(a.ttft_s, 1.0);
  EXPECT_DOUBLE_EQ(a.e2e_s, 2.0);
  EXPECT_DOUBLE_EQ(a.tpot_s, 1.0 / 3.0);
  EXPECT_EQ(a.itl_s, (std::vector<double>{0.25, 0.25, 0.5}));
  const RequestLatency b = request_latency(r[1]);
  EXPECT_TRUE(std::isnan(b.tpot_s));  // out = 1: no TPOT, as vLLM
  EXPECT_TRUE(b.itl_s.empty());
  EXPECT_DOUBLE_EQ(b.ttft_s, 1.0);
  const RequestLatency c = request_latency(r[2]);
  EXPECT_DOUBLE_EQ(c.queue_s, 1.0);
  EXPECT_DOUBLE_EQ(c.tpot_s, 0.5);
}

TEST(ServingMetrics, RunMetricsByHand) {
  const ServingMetrics m = serving_metrics(hand_made_requests(), GoodputSpec{});
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.total_input_tokens, 60);
  EXPECT_EQ(m.total_output_tokens, 7);
  EXPECT_DOUBLE_EQ(m.duration_s, 3.0);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s, 7.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.total_tokens_per_s, 67.0 / 3.0);
  expect_summary(m.ttft, 3, 7000.0 / 6.0, 1000.0, 1400.0, 1490.0);
  const double third = 1000.0 / 3.0, sixth = 1000.0 / 6.0;
  expect_summary(m.tpot, 2, 5000.0 / 12.0, third + 0.5 * sixth, third + 0.9 * sixth,
                 third + 0.99 * sixth);
  expect_summary(m.itl, 4, 375.0, 375.0, 500.0, 500.0);
  expect_summary(m.e2e, 3, 5000.0 / 3.0, 2000.0, 2000.0, 2000.0);
  expect_summary(m.queue, 3, 500.0, 500.0, 900.0, 990.0);
  EXPECT_EQ(m.good, 0u);
  EXPECT_TRUE(std::isnan(m.goodput_req_per_s));  // no --goodput: none
  EXPECT_TRUE(std::isnan(m.slo_attainment));
  // The duration counts from the scenario's start, not from the first arrival.
  EXPECT_DOUBLE_EQ(serving_metrics(hand_made_requests(), GoodputSpec{}, -1.0).duration_s, 4.0);
}

// vLLM's peaks: one-second buckets from the first arrival. r0 arrives at 0 (tokens 0.5, 1.2),
// r1 at 0.2 (tokens 1.5, 1.7, 2.1): tokens per bucket 1, 3, 1 -> 3; active per bucket (arrival to
// finish, both included) 2, 2, 1 -> 2. Pooled: the highest round's.
TEST(ServingMetrics, PeaksAsVllmBucketsThem) {
  const std::vector<RequestTimes> round{times(0.0, 0.0, {0.5, 1.2}, 4), times(0.2, 0.2, {1.5, 1.7, 2.1}, 4)};
  const ServingMetrics m = serving_metrics(round, {});
  EXPECT_EQ(m.peak_output_tokens_per_s, 3.0);
  EXPECT_EQ(m.peak_concurrency, 2);
  const std::vector<RequestTimes> quiet{times(0.0, 0.0, {0.5}, 4)};
  const ServingMetrics p = pooled_metrics({quiet, round}, {});
  EXPECT_EQ(p.peak_output_tokens_per_s, 3.0);
  EXPECT_EQ(p.peak_concurrency, 2);
}

TEST(ServingMetrics, GoodputIsRequestsMeetingEveryLimitPerSecond) {
  // ttft:1000 tpot:400: A (TTFT 1 <= 1, TPOT 1/3) and B (TTFT 1, TPOT counted as 0) meet both,
  // C (TTFT 1.5) not: 2 good requests in 3 s.
  ServingMetrics m = serving_metrics(hand_made_requests(), parse_goodput({"ttft:1000", "tpot:400"}));
  EXPECT_EQ(m.good, 2u);
  EXPECT_DOUBLE_EQ(m.goodput_req_per_s, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.slo_attainment, 2.0 / 3.0);
  // tpot:300 fails A (1/3 s) and C (0.5 s); B's out = 1 never fails a TPOT limit.
  m = serving_metrics(hand_made_requests(), parse_goodput({"tpot:300"}));
  EXPECT_EQ(m.good, 1u);
  // e2e:1999 (vLLM's key e2el too): only B (E2E 1 s).
  m = serving_metrics(hand_made_requests(), parse_goodput({"e2el:1999"}));
  EXPECT_EQ(m.good, 1u);
  EXPECT_DOUBLE_EQ(m.slo_attainment, 1.0 / 3.0);
  m = serving_metrics(hand_made_requests(), parse_goodput({"e2e:2000 ttft:1500"}));
  EXPECT_EQ(m.good, 3u);
  EXPECT_DOUBLE_EQ(m.goodput_req_per_s, 1.0);
}

TEST(ServingMetrics, GoodputSpecErrorsSayWhatIsValid) {
  const GoodputSpec g = parse_goodput({"ttft:250.5", "tpot:0"});
  EXPECT_EQ(g.ttft_ms, 250.5);
  EXPECT_EQ(g.tpot_ms, 0.0);
  EXPECT_TRUE(std::isnan(g.e2e_ms));
  for (const char* bad : {"ttft", "ttft:", "ttft:-1", "itl:5", "ttft:5:6", "tpot:abc"}) {
    const std::string e = error_of([&] { parse_goodput({bad}); });
    EXPECT_TRUE(contains(e, std::string("--goodput '") + bad + "'")) << e;
    EXPECT_TRUE(contains(e, "KEY ttft, tpot or e2e")) << e;
  }
  EXPECT_TRUE(contains(error_of([&] { parse_goodput({"ttft:1", "ttft:2"}); }), "given twice"));
}

TEST(ServingMetrics, InconsistentTimesAreAnInternalError) {
  RequestTimes r = times(1.0, 0.5, {2.0}, 4);  // admitted before it arrived
  EXPECT_THROW(request_latency(r), InternalError);
  r = times(0.0, 0.0, {2.0, 1.0}, 4);  // tokens out of order
  EXPECT_THROW(request_latency(r), InternalError);
  r = times(0.0, 0.0, {1.0, 2.0}, 4);
  r.gen_len = 3;  // fewer token times than output tokens
  EXPECT_THROW(request_latency(r), InternalError);
  EXPECT_THROW(serving_metrics({}, GoodputSpec{}), InternalError);
}


// ---- scheduler ------------------------------------------------------------------------------

void expect_row(const BatchRow& r, int request, int slot, int position, int tokens, bool prefill) {
  EXPECT_EQ(r.request, request);
  EXPECT_EQ(r.slot, slot);
  EXPECT_EQ(r.position, position);
  EXPECT_EQ(r.tokens, tokens);
  EXPECT_EQ(r.prefill, prefill);
}

// One group of 2 slots. r0 (P 3, G 2) and r1 (P 2, G 3) arrive at 0, r2 (P 4, G 1) at 0.5,
// while both slots are held: it waits until r0 leaves after step 2, then takes r0's slot 0.
// Steps end at 1, 2, 3.
std::vector<Request> three_requests() { return {{0.0, 3, 2}, {0.0, 2, 3}, {0.5, 4, 1}}; }

TEST(ServingScheduler, HandMadeScheduleMixedSteps) {
  Scheduler s(three_requests(), {1, 2, StepPolicy::mixed});
  const Step& s1 = s.next_step(0, 0.0);
  EXPECT_EQ(s1.admitted, (std::vector<int>{0, 1}));  // FCFS, lowest slot first
  ASSERT_EQ(s1.rows.size(), 2u);
  expect_row(s1.rows[0], 0, 0, 0, 3, true);
  expect_row(s1.rows[1], 1, 1, 0, 2, true);
  EXPECT_EQ(s1.total_tokens(), 5);
  EXPECT_TRUE(s.in_flight(0));
  s.complete_step(0, 1.0);

  EXPECT_EQ(s.waiting(1.0), 1);  // r2 arrived at 0.5; no free slot
  const Step& s2 = s.next_step(0, 1.0);
  EXPECT_TRUE(s2.admitted.empty());
  ASSERT_EQ(s2.rows.size(), 2u);
  expect_row(s2.rows[0], 0, 0, 3, 1, false);  // ragged: r0 decodes at 3, r1 at 2
  expect_row(s2.rows[1], 1, 1, 2, 1, false);
  s.complete_step(0, 2.0);  // r0's 2nd token: it leaves, slot 0 is free
  EXPECT_EQ(s.running(0), 1);

  const Step& s3 = s.next_step(0, 2.0);
  EXPECT_EQ(s3.admitted, (std::vector<int>{2}));
  ASSERT_EQ(s3.rows.size(), 2u);
  expect_row(s3.rows[0], 2, 0, 0, 4, true);  // r2 prefilled in r0's old slot ...
  expect_row(s3.rows[1], 1, 1, 3, 1, false);  // ... beside r1's decode at position 3
  s.complete_step(0, 3.0);
  EXPECT_TRUE(s.finished());
  EXPECT_TRUE(s.next_step(0, 3.0).rows.empty());
  EXPECT_FALSE(s.in_flight(0));
  EXPECT_EQ(s.slot_of(2), 0);
  EXPECT_EQ(s.group_of(2), 0);

  const std::vector<RequestTimes>& t = s.times();
  EXPECT_EQ(t[0].token_s, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(t[1].token_s, (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_EQ(t[2].token_s, (std::vector<double>{3.0}));
  EXPECT_EQ(t[2].admitted_s, 2.0);
  EXPECT_EQ(t[2].first_token_s, 3.0);
  EXPECT_EQ(t[1].finish_s, 3.0);
  // The recorded times feed the metrics: r2 queued 1.5 s, TTFT 2.5 s.
  const ServingMetrics m = serving_metrics(t, GoodputSpec{});
  EXPECT_EQ(m.completed, 3u);
  EXPECT_DOUBLE_EQ(m.duration_s, 3.0);
  EXPECT_DOUBLE_EQ(m.queue.p99_ms, 1000.0 * (0.0 + 0.98 * 1.5));  // sorted [0, 0, 1.5]
  EXPECT_DOUBLE_EQ(request_latency(t[2]).ttft_s, 2.5);
  EXPECT_EQ(m.total_output_tokens, 6);
}

// vLLM V0's default: a step that admits a request runs only its prefill; r1's decode waits.
TEST(ServingScheduler, PrefillFirstStepsHoldTheDecodes) {
  Scheduler s(three_requests(), {1, 2, StepPolicy::prefill_first});
  EXPECT_EQ(s.next_step(0, 0.0).rows.size(), 2u);  // two prefills, nothing running yet
  s.complete_step(0, 1.0);
  EXPECT_EQ(s.next_step(0, 1.0).rows.size(), 2u);  // two decodes
  s.complete_step(0, 2.0);
  const Step& s3 = s.next_step(0, 2.0);
  ASSERT_EQ(s3.rows.size(), 1u);
  expect_row(s3.rows[0], 2, 0, 0, 4, true);
  s.complete_step(0, 3.0);
  EXPECT_FALSE(s.finished());
  const Step& s4 = s.next_step(0, 3.0);
  ASSERT_EQ(s4.rows.size(), 1u);
  expect_row(s4.rows[0], 1, 1, 3, 1, false);
  s.complete_step(0, 4.0);
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.times()[1].token_s, (std::vector<double>{1.0, 2.0, 4.0}));
}

/// A row a hand-made schedule expects (request, position, tokens, prefill, emits).
struct WantRow {
  int request, position, tokens;
  bool prefill, emits;
};

/// Plays group 0 of `s` through `steps`, step k formed at t = k and ended at k + 1, each row as
/// expected; `after_form(k)` (if set) runs once step k is formed.
void expect_steps(Scheduler& s, const std::vector<std::vector<WantRow>>& steps,
                  const std::function<void(size_t)>& after_form = {}) {
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& st = s.next_step(0, static_cast<double>(k));
    ASSERT_EQ(st.rows.size(), steps[k].size()) << "step " << k + 1;
    for (size_t r = 0; r < st.rows.size(); ++r) {
      SCOPED_TRACE("step " + std::to_string(k + 1) + " row " + std::to_string(r));
      const BatchRow& row = st.rows[r];
      EXPECT_EQ(row.request, steps[k][r].request);
      EXPECT_EQ(row.position, steps[k][r].position);
      EXPECT_EQ(row.tokens, steps[k][r].tokens);
      EXPECT_EQ(row.prefill, steps[k][r].prefill);
      EXPECT_EQ(row.emits, steps[k][r].emits);
    }
    if (after_form) after_form(k);
    s.complete_step(0, k + 1.0);
  }
}

// Two groups of one slot: a waiting request goes to the group whose next step starts first.
// vLLM V1 with chunked prefill, a budget of 4 tokens, one group of 2 slots; r0 (prompt 6, 2
// outputs) and r1 (prompt 3, 2 outputs) at t = 0:
//  step 1: r0's first chunk, positions 0..3 (no token); the budget is spent: r1 waits.
//  step 2: r0's last chunk 4..5 (its first token), r1 admitted with 2 tokens 0..1.
//  step 3: r0 decodes at 6 (done), r1's last chunk at 2 (its first token).
//  step 4: r1 decodes at 3 (done).
TEST(ServingScheduler, VllmV1ChunksPromptsUnderTheTokenBudget) {
  SchedulerConfig cfg;
  cfg.groups = 1;
  cfg.slots = 2;
  cfg.policy = StepPolicy::vllm_v1;
  cfg.max_batched_tokens = 4;
  Scheduler s({{0.0, 6, 2}, {0.0, 3, 2}}, cfg);
  expect_steps(s, {{{0, 0, 4, true, false}},
                   {{0, 4, 2, true, true}, {1, 0, 2, true, false}},
                   {{0, 6, 1, false, true}, {1, 2, 1, true, true}},
                   {{1, 3, 1, false, true}}});
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.times()[0].token_s, (std::vector<double>{2.0, 3.0}));  // first token with the last chunk
  EXPECT_EQ(s.times()[1].token_s, (std::vector<double>{3.0, 4.0}));
  EXPECT_EQ(s.times()[1].admitted_s, 1.0);
  cfg.max_batched_tokens = 0;
  EXPECT_TRUE(contains(error_of([&] { Scheduler({{0.0, 1, 1}}, cfg); }), "--max-batched-tokens 0"));
}

// A KV pool of 3 blocks of 4 tokens, one group of 2 slots (mixed): r0 (prompt 4, 4 outputs) and
// r1 (prompt 4, 3 outputs) at t = 0, by hand:
//  step 1: both prefilled (a block each; 1 left), each gets its first token.
//  step 2: r0's decode at 4 takes the last block; r1's at 4 needs one more: the request admitted
//          last, r1 itself, is preempted (its block freed; the step admits nothing).
//  steps 3, 4: r0 decodes at 5, 6 and leaves (its 2 blocks freed); r1, waiting at the front,
//          needed 2 blocks for its recompute (prompt 4 + 1 output = 5 tokens) and 0 were free.
//  step 5: r1 readmitted: prefills positions 0..4, its second token.
//  step 6: r1 decodes at 5, its third: done.
TEST(ServingScheduler, KvPoolPreemptsTheLastAdmittedAndRecomputesIt) {
  SchedulerConfig cfg;
  cfg.groups = 1;
  cfg.slots = 2;
  cfg.kv_block_size = 4;
  cfg.kv_blocks = 3;
  Scheduler s({{0.0, 4, 4}, {0.0, 4, 3}}, cfg);
  expect_steps(s,
               {{{0, 0, 4, true, true}, {1, 0, 4, true, true}},
                {{0, 4, 1, false, true}},
                {{0, 5, 1, false, true}},
                {{0, 6, 1, false, true}},
                {{1, 0, 5, true, true}},
                {{1, 5, 1, false, true}}},
               [&](size_t k) {
                 if (k == 1) EXPECT_EQ(s.waiting(1.0), 1);  // r1, preempted
               });
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(s.kv_pool_blocks(), 3);
  EXPECT_EQ(s.kv_blocks_peak(), 3);
  const std::vector<RequestTimes>& t = s.times();
  EXPECT_EQ(t[0].token_s, (std::vector<double>{1.0, 2.0, 3.0, 4.0}));
  EXPECT_EQ(t[1].token_s, (std::vector<double>{1.0, 5.0, 6.0}));
  EXPECT_EQ(t[0].preemptions, 0);
  EXPECT_EQ(t[1].preemptions, 1);
  EXPECT_EQ(t[1].preempted_tokens, 4);  // its prompt's positions; its first token was not fed back
  EXPECT_EQ(t[1].first_token_s, 1.0);  // the recompute's token is its second
  EXPECT_EQ(t[1].admitted_s, 0.0);     // queue time to the first admission
  // The slots each step releases (what a paged KV store gives back before its rows): step 2 r1's
  // slot 1 (preempted while that step formed), step 5 r0's slot 0 (finished at step 4's end),
  // which r1 takes in that very step.
  {
    Scheduler r({{0.0, 4, 4}, {0.0, 4, 3}}, cfg);
    std::vector<std::vector<int>> released;
    for (int k = 0; !r.finished(); ++k) {
      released.push_back(r.next_step(0, k).released);
      r.complete_step(0, k + 1.0);
    }
    EXPECT_EQ(released, (std::vector<std::vector<int>>{{}, {1}, {}, {}, {0}, {}}));
  }
  // Unbounded (kv_blocks 0: both slots at the longest request, 2 blocks each): no preemption.
  cfg.kv_blocks = 0;
  Scheduler u({{0.0, 4, 4}, {0.0, 4, 3}}, cfg);
  EXPECT_EQ(u.kv_pool_blocks(), 4);
  EXPECT_EQ(u.next_step(0, 0.0).rows.size(), 2u);
  u.complete_step(0, 1.0);
  EXPECT_EQ(u.next_step(0, 1.0).rows.size(), 2u);
  // A pool smaller than one request's positions would never finish it.
  cfg.kv_blocks = 1;
  const std::string e = error_of([&] { Scheduler({{0.0, 4, 4}, {0.0, 4, 3}}, cfg); });
  EXPECT_TRUE(contains(e, "--kv-blocks 1")) << e;
  EXPECT_TRUE(contains(e, "valid: >= 2")) << e;
  cfg.kv_blocks = 0;
  cfg.kv_block_size = 0;
  EXPECT_TRUE(contains(error_of([&] { Scheduler({{0.0, 4, 4}}, cfg); }), "--kv-block-size 0"));
}

// vllm_v1 with a pool: a prompt being chunked is preempted like a decode, and recomputes from 0.
// One group of 2 slots, budget 4, blocks of 2 tokens, pool of 4 blocks; r0 (prompt 3, 3
// outputs: 5 positions, 3 blocks) and r1 (prompt 6, 1 output: 6 positions, 3 blocks) at 0:
//  step 1: r0's prompt 0..2 (2 blocks, first token), r1's first chunk 0 (1 token: 1 block).
//  step 2: r0 decodes at 3 (2 blocks cover 0..3); r1's chunk 1..3 needs 1 more: the last block.
//  step 3: r0 decodes at 4: needs a 3rd block, none free: r1 (admitted last) is preempted.
//  step 4: r0 is done (3 tokens at 1, 2, 3); r1 readmitted, chunk 0..3 (2 blocks).
//  step 5: r1's last chunk 4..5, its token.
TEST(ServingScheduler, KvPoolPreemptsAChunkedPrefillUnderVllmV1) {
  SchedulerConfig cfg;
  cfg.groups = 1;
  cfg.slots = 2;
  cfg.policy = StepPolicy::vllm_v1;
  cfg.max_batched_tokens = 4;
  cfg.kv_block_size = 2;
  cfg.kv_blocks = 4;
  Scheduler s({{0.0, 3, 3}, {0.0, 6, 1}}, cfg);
  expect_steps(s, {{{0, 0, 3, true, true}, {1, 0, 1, true, false}},
                   {{0, 3, 1, false, true}, {1, 1, 3, true, false}},
                   {{0, 4, 1, false, true}},
                   {{1, 0, 4, true, false}},
                   {{1, 4, 2, true, true}}});
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.times()[0].token_s, (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_EQ(s.times()[1].token_s, (std::vector<double>{5.0}));
  EXPECT_EQ(s.times()[1].preemptions, 1);
  EXPECT_EQ(s.times()[1].preempted_tokens, 4);  // chunks 0 and 1..3
  EXPECT_EQ(s.preemptions(), 1);
}

// vLLM V1's batch queue under pipeline parallelism: M = 2 batches in flight over one pool of
// 2 x 1 slots. r0 (P 2, G 3), r1 (P 2, G 2), r2 (P 3, G 1) at t = 0, mixed steps:
//  batch 0 at 0: both free slots, r0 and r1 prefilled together (groups would pin one per group);
//  batch 1 at 0: nothing (r0, r1 in flight; r2 has no slot): no step;
//  batch 1 at 1 (batch 0 back): r0 and r1 decode at 2; batch 0 at 1: nothing not in flight;
//  batch 0 at 2 (r1 done, its slot free): r0 decodes at 3 beside r2's prefill in slot 1.
TEST(ServingScheduler, BatchQueueTakesEveryRunningRequestNotInFlight) {
  SchedulerConfig cfg{2, 1, StepPolicy::mixed};
  cfg.pp_schedule = PpSchedule::batch_queue;
  EXPECT_EQ(cfg.pool_slots(), 2);
  Scheduler s({{0.0, 2, 3}, {0.0, 2, 2}, {0.0, 3, 1}}, cfg);
  const Step& b0 = s.next_step(0, 0.0);
  ASSERT_EQ(b0.rows.size(), 2u);
  expect_row(b0.rows[0], 0, 0, 0, 2, true);
  expect_row(b0.rows[1], 1, 1, 0, 2, true);
  EXPECT_TRUE(s.next_step(1, 0.0).rows.empty());
  EXPECT_FALSE(s.in_flight(1));
  EXPECT_EQ(s.running(1), 2);  // the one pool
  s.complete_step(0, 1.0);
  const Step& b1 = s.next_step(1, 1.0);
  ASSERT_EQ(b1.rows.size(), 2u);
  expect_row(b1.rows[0], 0, 0, 2, 1, false);
  expect_row(b1.rows[1], 1, 1, 2, 1, false);
  EXPECT_TRUE(s.next_step(0, 1.0).rows.empty());  // both are in batch 1
  s.complete_step(1, 2.0);
  const Step& b2 = s.next_step(0, 2.0);
  EXPECT_EQ(b2.admitted, (std::vector<int>{2}));
  ASSERT_EQ(b2.rows.size(), 2u);
  expect_row(b2.rows[0], 0, 0, 3, 1, false);
  expect_row(b2.rows[1], 2, 1, 0, 3, true);
  s.complete_step(0, 3.0);
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.times()[0].token_s, (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_EQ(s.times()[1].token_s, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(s.times()[2].token_s, (std::vector<double>{3.0}));
  // A stage of the batch queue holds one KV cache of the pool's slots: B rows of the longest.
  EXPECT_EQ(max_step_tokens({{0.0, 2, 3}, {0.0, 5, 2}}, cfg), 2 * 5);
  EXPECT_STREQ(pp_schedule_name(PpSchedule::batch_queue), "batch-queue");
  EXPECT_EQ(parse_pp_schedule("groups"), PpSchedule::groups);
  EXPECT_TRUE(contains(error_of([] { parse_pp_schedule("virtual"); }), "--pp-schedule 'virtual' is unknown"));
}

TEST(ServingScheduler, TwoGroupsShareOneFcfsQueue) {
  Scheduler s({{0.0, 2, 1}, {0.0, 2, 3}, {0.1, 5, 2}}, {2, 1, StepPolicy::mixed});
  EXPECT_EQ(s.next_step(0, 0.0).admitted, (std::vector<int>{0}));
  EXPECT_EQ(s.next_step(1, 0.05).admitted, (std::vector<int>{1}));
  s.complete_step(0, 1.0);  // r0 (G 1) leaves group 0
  s.complete_step(1, 1.05);
  const Step& g1 = s.next_step(1, 1.05);  // group 1 is full: r1 decodes, r2 keeps waiting
  EXPECT_TRUE(g1.admitted.empty());
  ASSERT_EQ(g1.rows.size(), 1u);
  expect_row(g1.rows[0], 1, 0, 2, 1, false);
  EXPECT_EQ(s.waiting(1.05), 1);
  const Step& g0 = s.next_step(0, 1.1);
  EXPECT_EQ(g0.admitted, (std::vector<int>{2}));
  EXPECT_EQ(g0.group, 0);
  EXPECT_EQ(s.group_of(2), 0);
  EXPECT_EQ(s.group_of(1), 1);
  EXPECT_EQ(s.times()[2].admitted_s, 1.1);
}

TEST(ServingScheduler, NothingArrivedGivesAnEmptyStep) {
  Scheduler s({{5.0, 4, 2}}, {1, 1, StepPolicy::mixed});
  EXPECT_TRUE(s.next_step(0, 0.0).rows.empty());
  EXPECT_FALSE(s.in_flight(0));
  EXPECT_EQ(s.waiting(0.0), 0);
  EXPECT_EQ(s.next_arrival_s(), 5.0);
  const Step& step = s.next_step(0, 5.0);
  EXPECT_EQ(step.admitted, (std::vector<int>{0}));
  EXPECT_EQ(s.next_arrival_s(), kInf);
  EXPECT_EQ(s.times()[0].admitted_s, 5.0);
}

TEST(ServingScheduler, MisuseAndBadConfigAreCaught) {
  Scheduler s(three_requests(), {1, 2, StepPolicy::mixed});
  s.next_step(0, 0.0);
  EXPECT_THROW(s.next_step(0, 0.5), InternalError);     // a step already in flight
  EXPECT_THROW(s.complete_step(0, -1.0), InternalError);  // ends before it started
  s.complete_step(0, 1.0);
  EXPECT_THROW(s.complete_step(0, 2.0), InternalError);  // nothing in flight
  EXPECT_THROW(s.next_step(0, 0.9), InternalError);      // before the previous step ended
  EXPECT_THROW(s.next_step(1, 1.0), InternalError);      // no group 1
  EXPECT_TRUE(contains(error_of([] { Scheduler({}, {0, 1, StepPolicy::mixed}); }),
                       "-M/--microbatches 0"));
  EXPECT_TRUE(contains(error_of([] { Scheduler({}, {1, 0, StepPolicy::mixed}); }), "-b/--batch 0"));
  EXPECT_TRUE(contains(error_of([] { Scheduler({{0.0, 0, 1}}, {1, 1, StepPolicy::mixed}); }),
                       "request 0: prompt_len 0"));
}

// A simulator drives the scheduler: each group's step lasts 10 ms + 0.1 ms per token, groups
// run side by side. Whatever the arrivals, every request gets its gen_len tokens at
// consecutive positions, a group never holds more than B requests, and admission is FCFS.
// With a KV pool small enough to preempt (kv_blocks > 0) the same holds, a readmitted request
// restarting at position 0 with its prompt and the tokens it had, and nothing is lost.
TEST(ServingScheduler, SimulatedRunKeepsTheInvariants) {
  struct Case {
    StepPolicy policy;
    int kv_blocks;
    PpSchedule schedule = PpSchedule::groups;
  };
  for (const Case& c : {Case{StepPolicy::mixed, 0}, Case{StepPolicy::prefill_first, 0}, Case{StepPolicy::vllm_v1, 0},
                        Case{StepPolicy::mixed, 40}, Case{StepPolicy::prefill_first, 40}, Case{StepPolicy::vllm_v1, 40},
                        Case{StepPolicy::mixed, 0, PpSchedule::batch_queue},
                        Case{StepPolicy::mixed, 24, PpSchedule::batch_queue},
                        Case{StepPolicy::vllm_v1, 24, PpSchedule::batch_queue}}) {
    const StepPolicy policy = c.policy;
    SCOPED_TRACE(std::string(step_policy_name(policy)) + ", kv_blocks " + std::to_string(c.kv_blocks) + ", " +
                 pp_schedule_name(c.schedule));
    ScenarioSpec spec;
    spec.arrivals = {200.0, 0.5, true};
    spec.requests = 300;
    spec.prompt_lens = parse_length_spec("lognormal:64,0.8", "--prompt-lens");
    spec.gen_lens = parse_length_spec("uniform:1,24", "--gen-lens");
    spec.max_prompt_len = 256;
    spec.max_gen_len = 24;
    spec.seed = 5;
    const std::vector<Request> reqs = generate_requests(spec);
    const int groups = 3, slots = 4;
    SchedulerConfig cfg{groups, slots, policy};
    cfg.max_batched_tokens = 96;
    cfg.kv_block_size = 16;
    cfg.kv_blocks = c.kv_blocks;
    cfg.pp_schedule = c.schedule;
    Scheduler s(reqs, cfg);
    // Each group's step is in flight until ready[g] (the groups' steps overlap in time); the
    // earliest event first, a step's end before a new step at the same time.
    std::vector<double> ready(groups, 0.0);
    std::vector<int> next_pos(reqs.size(), 0), out(reqs.size(), 0);
    std::vector<char> in_step(reqs.size(), 0);  // a row of it is in a step in flight
    // Each pool's slots as the stages see them: a slot's request changes only after a step
    // released it (Step::released, what a paged KV store gives back), and only a slot in use is.
    std::vector<std::vector<int>> owner(c.schedule == PpSchedule::batch_queue ? 1 : groups,
                                        std::vector<int>(cfg.pool_slots(), -1));
    int steps = 0, restarts = 0, releases = 0;
    long long run_tokens = 0;
    while (!s.finished()) {
      int g = 0;
      for (int h = 1; h < groups; ++h)
        if (ready[h] < ready[g] || (ready[h] == ready[g] && s.in_flight(h) && !s.in_flight(g))) g = h;
      ASSERT_LT(ready[g], kInf);
      if (s.in_flight(g)) {
        s.complete_step(g, ready[g]);
        for (int q = 0; q < static_cast<int>(reqs.size()); ++q)
          if (in_step[q] == g + 1) in_step[q] = 0;
      }
      const Step& step = s.next_step(g, ready[g]);
      if (step.rows.empty()) {  // idle until the next arrival or another group's step ends
        double next = s.next_arrival_s() > ready[g] ? s.next_arrival_s() : kInf;
        for (int h = 0; h < groups; ++h)
          if (h != g && s.in_flight(h)) next = std::min(next, ready[h]);  // >= ready[g]; a tie goes to h first
        ready[g] = next;
        continue;
      }
      ASSERT_LE(step.rows.size(), static_cast<std::size_t>(cfg.pool_slots()));
      std::vector<int>& slots_of = owner[c.schedule == PpSchedule::batch_queue ? 0 : g];
      for (int slot : step.released) {
        ASSERT_NE(slots_of.at(slot), -1) << "slot " << slot << " released twice or unused";
        slots_of[slot] = -1;
        ++releases;
      }
      for (const BatchRow& row : step.rows) {
        if (slots_of[row.slot] == -1) slots_of[row.slot] = row.request;
        ASSERT_EQ(slots_of[row.slot], row.request) << "slot " << row.slot << " taken over without a release";
      }
      for (const BatchRow& row : step.rows) {
        ASSERT_EQ(in_step[row.request], 0) << "request " << row.request << " in two steps in flight";
        in_step[row.request] = static_cast<char>(g + 1);
      }
      ASSERT_LE(step.total_tokens(), max_step_tokens(reqs, cfg));
      int kv_tokens = 0;  // the step's rows' positions: within the pool's blocks
      for (const BatchRow& row : step.rows) {
        const int q = row.request;
        if (row.prefill && row.position == 0 && next_pos[q] > 0) {  // readmitted: recompute
          ASSERT_GT(c.kv_blocks, 0);
          next_pos[q] = 0;
          ++restarts;
        }
        ASSERT_EQ(row.position, next_pos[q]) << "request " << q;
        next_pos[q] += row.tokens;
        // A prefill covers the prompt and the tokens out so far; whole unless vllm_v1 chunks it.
        if (row.prefill && policy != StepPolicy::vllm_v1) ASSERT_EQ(row.tokens, reqs[q].prompt_len + out[q]);
        if (row.prefill) ASSERT_LE(next_pos[q], reqs[q].prompt_len + out[q]);
        out[q] += row.emits;
        kv_tokens += (next_pos[q] + 15) / 16;
      }
      if (c.kv_blocks > 0 && c.schedule == PpSchedule::groups) ASSERT_LE(kv_tokens, c.kv_blocks);
      ready[g] += 0.010 + 1e-4 * step.total_tokens();
      run_tokens += step.total_tokens();
      ++steps;
      // A group parked at +inf (nothing of its own to do) looks again when this step ends.
      for (int h = 0; h < groups; ++h)
        if (h != g && !s.in_flight(h) && ready[h] == kInf) ready[h] = ready[g];
    }
    int preempted = 0;
    long long want_tokens = 0;  // every position once, and those preemptions discarded once more
    for (const RequestTimes& t : s.times()) preempted += t.preemptions, want_tokens += t.preempted_tokens;
    for (const Request& q : reqs) want_tokens += q.prompt_len + q.gen_len - 1;
    EXPECT_EQ(run_tokens, want_tokens);
    EXPECT_EQ(preempted, s.preemptions());
    EXPECT_EQ(restarts, s.preemptions());
    // Every request's slot is released when it finishes and when it is preempted, once; those
    // freed after the last step with rows are never sent (at most every slot of every pool).
    const int freed = static_cast<int>(reqs.size()) + s.preemptions();
    EXPECT_LE(releases, freed);
    EXPECT_GE(releases, freed - static_cast<int>(owner.size()) * cfg.pool_slots());
    if (c.kv_blocks > 0) {
      EXPECT_GT(s.preemptions(), 0);  // the pool binds: 40 blocks for 4 slots of up to 18 blocks (batch queue: 3 x 24 for 12)
      EXPECT_EQ(s.kv_blocks_peak(), c.kv_blocks * (c.schedule == PpSchedule::batch_queue ? groups : 1));
    } else {
      EXPECT_EQ(s.preemptions(), 0);
    }
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const RequestTimes& t = s.times()[i];
      ASSERT_EQ(t.token_s.size(), static_cast<std::size_t>(reqs[i].gen_len));
      // The last token out is not fed back: P + G - 1 positions were run.
      EXPECT_EQ(next_pos[i], reqs[i].prompt_len + reqs[i].gen_len - 1);
      EXPECT_EQ(out[i], reqs[i].gen_len);
      EXPECT_GE(t.admitted_s, t.arrival_s);
      if (i > 0) EXPECT_GE(t.admitted_s, s.times()[i - 1].admitted_s);  // FCFS
    }
    const ServingMetrics m = serving_metrics(s.times(), GoodputSpec{});
    EXPECT_EQ(m.completed, reqs.size());
    EXPECT_GT(steps, 0);
  }
}

}  // namespace
}  // namespace ppb::serving
