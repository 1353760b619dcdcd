// End-to-end: `mpirun ppbench run --scenario ...` (issue 37): requests that arrive, every split
// under the same arrivals, the file's /scenario and /benchmark/<name>/requests read back and
// checked against the scenario's definitions, and the serving flags' bad inputs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "results/h5.h"

namespace {

struct Result {
  int status = -1;
  std::string output;
  double seconds = 0;
};

Result run(const std::string& cmd) {
  auto t0 = std::chrono::steady_clock::now();
  const std::string full = "cd " PPB_SOURCE_DIR " && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                           "OPENBLAS_NUM_THREADS=1 " + cmd + " 2>&1";
  Result r;
  FILE* p = popen(full.c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof(buf), p)) r.output += buf;
  const int st = p ? pclose(p) : -1;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string mpirun(int np) {
  return "mpirun --oversubscribe -np " + std::to_string(np) + " " PPBENCH_BIN " run --target-ci 0 ";
}

/// Checks one partition's requests against the scenario and the definitions of the metrics.
/// slo_ttft_ms / slo_tpot_ms: the run's --goodput limits (NaN: none given).
void check_requests(ppb::h5::Group& root, const std::string& part, const std::vector<double>& arrivals,
                    const std::vector<int64_t>& gen_len, double slo_ttft_ms = NAN, double slo_tpot_ms = NAN) {
  SCOPED_TRACE(part);
  auto b = root.open_group("benchmark/" + part);
  auto r = b.open_group("requests");
  const auto arrival = r.open_dataset("arrival_s").read<double>();
  const auto admitted = r.open_dataset("admitted_s").read<double>();
  const auto first = r.open_dataset("first_token_s").read<double>();
  const auto finish = r.open_dataset("finish_s").read<double>();
  const auto gen = r.open_dataset("gen_len").read<int64_t>();
  const auto offset = r.open_dataset("token_offset").read<int64_t>();
  const auto token_s = r.open_dataset("token_s").read<double>();
  const auto tokens = r.open_dataset("tokens").read<int64_t>();
  const size_t N = arrivals.size();
  ASSERT_EQ(arrival.size(), N);
  ASSERT_EQ(offset.size(), N + 1);
  ASSERT_EQ(static_cast<size_t>(offset.back()), token_s.size());
  ASSERT_EQ(tokens.size(), token_s.size());
  std::vector<double> ttft;
  int good = 0;
  for (size_t q = 0; q < N; ++q) {
    EXPECT_DOUBLE_EQ(arrival[q], arrivals[q]) << "every split sees the scenario's arrivals";
    EXPECT_EQ(gen[q], gen_len[q]);
    EXPECT_GE(admitted[q], arrival[q]);
    EXPECT_GT(first[q], admitted[q]);
    EXPECT_GE(finish[q], first[q]);
    EXPECT_DOUBLE_EQ(token_s[offset[q]], first[q]);
    EXPECT_DOUBLE_EQ(token_s[offset[q + 1] - 1], finish[q]);
    ttft.push_back((first[q] - arrival[q]) * 1e3);
    // vLLM's goodput rule: TPOT = (E2E - TTFT) / (out - 1), 0 for one token; limits inclusive.
    const double tpot = gen[q] > 1 ? (finish[q] - first[q]) / (gen[q] - 1) * 1e3 : 0.0;
    good += ttft.back() <= slo_ttft_ms && tpot <= slo_tpot_ms ? 1 : 0;
  }
  // The steps: every prompt prefilled once, every later token one decode row; each step timed
  // on each of the two stages.
  auto st = b.open_group("steps");
  const auto prefill = st.open_dataset("prefill_tokens").read<int64_t>();
  const auto decode = st.open_dataset("decode_rows").read<int64_t>();
  const auto prompt = r.open_dataset("prompt_len").read<int64_t>();
  int64_t want_prefill = 0, want_decode = 0, got_prefill = 0, got_decode = 0;
  for (size_t q = 0; q < N; ++q) want_prefill += prompt[q], want_decode += gen[q] - 1;
  for (size_t i = 0; i < prefill.size(); ++i) got_prefill += prefill[i], got_decode += decode[i];
  EXPECT_EQ(got_prefill, want_prefill);
  EXPECT_EQ(got_decode, want_decode);
  auto cm = st.open_dataset("compute_ms");
  ASSERT_EQ(cm.dims(), (std::vector<hsize_t>{prefill.size(), 2}));
  for (double ms : cm.read<double>()) EXPECT_GT(ms, 0.0);
  // The stored p50 is over every round's requests; this round's TTFTs bound it loosely.
  const double p50 = b.get_attr<double>("ttft_p50_ms");
  EXPECT_GT(p50, 0.0);
  EXPECT_GE(b.get_attr<double>("ttft_p99_ms"), p50);
  EXPECT_GE(b.get_attr<double>("tpot_p99_ms"), b.get_attr<double>("tpot_p50_ms"));
  EXPECT_GT(b.get_attr<double>("output_tokens_per_s"), 0.0);
  EXPECT_EQ(b.get_attr<int64_t>("validated"), 1);
  EXPECT_EQ(b.get_attr<int64_t>("replay_tokens_differing"), 0);
  EXPECT_GE(b.get_attr<int64_t>("alone_tokens_differing"), 0);
  const auto rep_att = b.open_dataset("rep_slo_attainment").read<double>();
  if (std::isnan(slo_ttft_ms)) {
    EXPECT_TRUE(std::isnan(b.get_attr<double>("slo_attainment")));
  } else {
    // The last round's attainment, recomputed from its requests.
    EXPECT_DOUBLE_EQ(rep_att.back(), static_cast<double>(good) / static_cast<double>(N));
  }
}

TEST(ServingE2E, PoissonScenarioRunsEverySplitUnderTheSameArrivals) {
  const std::string out = ppb_test::scratch_dir("ppbench_serving_") + "/poisson.h5";
  auto r = run(mpirun(2) + "--model tests/data/tiny-llama.json --scenario poisson --request-rate 40 --requests 24 "
               "-p 24 -g 8 --prompt-lens lognormal:10,0.5 --gen-lens uniform:1,8 -b 3 -M 2 --iters 3 "
               "--goodput ttft:500 tpot:100 -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("serving scenario: poisson, 24 requests"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TTFT p99"), std::string::npos) << r.output;
  auto root = ppb::h5::File::open(out).root();
  EXPECT_EQ(root.get_attr<int64_t>("complete"), 1);
  EXPECT_EQ(root.get_attr<std::string>("validation"), "ok");
  auto sc = root.open_group("scenario");
  EXPECT_EQ(sc.get_attr<std::string>("kind"), "poisson");
  EXPECT_DOUBLE_EQ(sc.get_attr<double>("request_rate"), 40.0);
  EXPECT_EQ(sc.get_attr<int64_t>("requests"), 24);
  EXPECT_EQ(sc.get_attr<int64_t>("rounds"), 3);
  const auto arrivals = sc.open_dataset("arrival_s").read<double>();
  const auto gen = sc.open_dataset("gen_len").read<int64_t>();
  const auto prompt = sc.open_dataset("prompt_len").read<int64_t>();
  ASSERT_EQ(arrivals.size(), 24u);
  // vLLM's rescale: the last arrival at N / R.
  EXPECT_NEAR(arrivals.back(), 24.0 / 40.0, 1e-9);
  for (size_t q = 0; q < 24; ++q) {
    EXPECT_GE(prompt[q], 1);
    EXPECT_LE(prompt[q], 24);
    EXPECT_GE(gen[q], 1);
    EXPECT_LE(gen[q], 8);
  }
  for (const char* part : {"uniform", "balanced"}) check_requests(root, part, arrivals, gen, 500.0, 100.0);
  // The balancer's objective: G = B (mean output - 1) / decode rows per decode step (B = 3).
  const double rows = sc.get_attr<double>("objective_decode_rows");
  EXPECT_GE(rows, 1.0);
  EXPECT_LE(rows, 3.0);
  double mean_decode = 0;
  for (int64_t g : gen) mean_decode += static_cast<double>(g - 1) / 24.0;
  EXPECT_EQ(sc.get_attr<int64_t>("objective_gen_len"), std::max<int64_t>(1, std::lround(3 * mean_decode / rows)));
  auto bal = root.open_group("benchmark/balanced");
  EXPECT_EQ(bal.get_attr<int64_t>("tokens_gain_n"), 3);
  EXPECT_TRUE(std::isfinite(bal.get_attr<double>("tokens_gain")));
  EXPECT_EQ(bal.open_dataset("rep_output_tokens_per_s").read<double>().size(), 3u);
}

TEST(ServingE2E, TraceScenarioReadsItsRequests) {
  const std::string dir = ppb_test::scratch_dir("ppbench_serving_");
  {
    std::ofstream f(dir + "/trace.csv");
    f << "arrival_s,prompt_len,gen_len\n0.0,6,3\n0.01,9,1\n0.02,4,5\n0.05,30,2\n0.08,7,4\n";
  }
  const std::string out = dir + "/trace.h5";
  auto r = run(mpirun(2) + "--model tests/data/tiny-llama.json --scenario trace --trace " + dir +
               "/trace.csv -p 20 -g 6 -b 2 --partition uniform --iters 1 -o " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  auto root = ppb::h5::File::open(out).root();
  auto sc = root.open_group("scenario");
  EXPECT_EQ(sc.get_attr<std::string>("trace_format"), "ppbench");
  const auto prompt = sc.open_dataset("prompt_len").read<int64_t>();
  ASSERT_EQ(prompt.size(), 5u);
  EXPECT_EQ(prompt[3], 20) << "clamped to -p";
  const std::vector<double> arrivals{0.0, 0.01, 0.02, 0.05, 0.08};
  check_requests(root, "uniform", arrivals, sc.open_dataset("gen_len").read<int64_t>());
}

TEST(ServingE2E, BadServingFlagsExitTwo) {
  const std::string dir = ppb_test::scratch_dir("ppbench_serving_");
  const std::string tiny = "--model tests/data/tiny-llama.json ";
  struct Case {
    const char* name;
    std::string args, expect;
  };
  const std::vector<Case> cases{
      {"rate without a scenario", tiny + "--request-rate 4", "--scenario poisson"},
      {"poisson without a rate", tiny + "--scenario poisson", "--request-rate"},
      {"unknown scenario", tiny + "--scenario burst --request-rate 2", "--scenario 'burst'"},
      {"negative rate", tiny + "--scenario poisson --request-rate -1", "--request-rate"},
      {"poisson with burstiness", tiny + "--scenario poisson --request-rate 2 --burstiness 0.5", "gamma"},
      {"bad length spec", tiny + "--scenario poisson --request-rate 2 --prompt-lens normal:4", "--prompt-lens"},
      {"bad goodput", tiny + "--scenario poisson --request-rate 2 --goodput ttfb:100", "--goodput"},
      {"trace missing", tiny + "--scenario trace --trace " + dir + "/none.csv", "none.csv"},
      {"trace without file", tiny + "--scenario trace", "--trace"},
      {"scenario with tp", tiny + "--scenario poisson --request-rate 2 --tp 2", "--tp 1"},
      {"scenario with plan", tiny + "--scenario poisson --request-rate 2 --plan 2", "--plan"},
      {"unknown step policy", tiny + "--scenario poisson --request-rate 2 --step-policy chunked", "--step-policy"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = run(mpirun(2) + c.args + " -o " + dir + "/bad.h5 --timeout 30");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in:\n" << r.output;
    EXPECT_LT(r.seconds, 30.0);
    EXPECT_FALSE(std::filesystem::exists(dir + "/bad.h5"));
  }
}

}  // namespace
