// Unit tests of the offline tools: `ppbench balance` and `simulate` (src/app/offline_commands),
// `ppbench report` of several files (src/results/report) and the memory report
// (src/balance/memory_report): latency and stage JSON parsing and its error messages (ranges,
// unknown keys), the --json output, manual and uniform splits, flags that would be ignored,
// results files (run order, another workload, more stages than ranks), per-stage KV capacity.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/device.h"
#include "model/model_spec.h"
#include "balance/memory_report.h"
#include "balance/problem.h"
#include "common/error.h"
#include "results/h5.h"
#include "results/report.h"
#include "results/writer.h"
#include "app/offline_commands.h"
#include "user_error_of.h"

namespace ppb {
namespace {

namespace fs = std::filesystem;

class OfflineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ppb_offline_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  nlohmann::json read(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
  }
  fs::path dir_;
};

const char* kLatency = R"({"units": ["embed","layer.0","layer.1","layer.2","head"],
  "latency_ms": [[1,2,2,2,5],[2,4,4,4,10]],
  "weight_bytes": [10,20,20,20,40], "kv_bytes": [0,5,5,5,0],
  "device_memory_bytes": [100, 100], "activation_bytes": 1000,
  "link_bandwidth_GBps": 0.001, "link_latency_us": 0, "overlap": false})";

TEST_F(OfflineTest, LoadsLatencyJson) {
  const auto p = load_balance_problem(write("lat.json", kLatency));
  EXPECT_EQ(p.units(), 5);
  EXPECT_EQ(p.devices(), 2);
  EXPECT_EQ(p.unit_names[4], "head");
  EXPECT_EQ(p.activation_bytes.size(), 4u);
  EXPECT_FALSE(p.overlap);
  const auto xfer = balance::boundary_transfer_ms(p);
  EXPECT_DOUBLE_EQ(xfer[0], 1.0);  // 1000 bytes at 1e3 bytes/ms
}

// A stage's fixed cost from the JSON: a number for every row or one per row; paid once per stage.
TEST_F(OfflineTest, LatencyJsonTakesAStagesFixedCost) {
  auto p = load_balance_problem(write("f1.json", R"({"latency_ms":[[1,1,1,1,6],[1,1,1,1,6]],"stage_fixed_ms":2})"));
  EXPECT_EQ(p.stage_fixed_ms, (std::vector<double>{2.0, 2.0}));
  p = load_balance_problem(write("f2.json", R"({"latency_ms":[[1,1,1,1,6],[1,1,1,1,6]],"stage_fixed_ms":[0,2]})"));
  balance::Partition q = balance::parse_manual("4,1", 5, 2);
  q.device_rank = {0, 1};
  balance::evaluate(p, q);
  EXPECT_EQ(q.predicted_stage_ms, (std::vector<double>{4.0, 8.0}));
  std::string m = test::error_of([&] { load_balance_problem(write("f3.json", R"({"latency_ms":[1,1],"stage_fixed_ms":[1,2]})")); });
  EXPECT_NE(m.find("stage_fixed_ms has 2 entries"), std::string::npos) << m;
  m = test::error_of([&] { load_balance_problem(write("f4.json", R"({"latency_ms":[1,1],"stage_fixed_ms":"x"})")); });
  EXPECT_NE(m.find("stage_fixed_ms"), std::string::npos) << m;
}

TEST_F(OfflineTest, BalanceWritesJson) {
  BalanceOptions o;
  o.input = write("lat.json", kLatency);
  o.stages = 2;
  o.json_out = (dir_ / "out.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("bottleneck"), std::string::npos);
  const auto j = read(o.json_out);
  ASSERT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["stages"][0]["first_unit"], 0);
  EXPECT_EQ(j["stages"][1]["last_unit"], 4);
  EXPECT_EQ(j["solver"], "balanced");
  // Device 1 is 2x slower; no overlap: stage time = compute + transfer (1 ms).
  // Best: [embed, l0, l1, l2] on device 0 (7 + 1 = 8) and [head] on device 1 (10 + 1 = 11).
  EXPECT_DOUBLE_EQ(j["bottleneck_ms"].get<double>(), 11.0);
  int64_t mem = j["stages"][0]["memory_bytes"];
  EXPECT_EQ(mem, 10 + 3 * 25);
}

TEST_F(OfflineTest, ManualAndUniformSplits) {
  BalanceOptions o;
  o.input = write("lat.json", kLatency);
  o.stages = 2;
  o.json_out = (dir_ / "m.json").string();
  o.force = true;  // written several times
  o.partition = "2,3";
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  EXPECT_EQ(read(o.json_out)["counts"], "2,3");
  o.partition = "2,2";
  EXPECT_THROW(balance_command(o), UserError);
  o.partition.clear();
  o.solver = "uniform";
  o.uniform_remainder = "last";  // 3 layers on 2 stages: 1 + 2
  EXPECT_EQ(balance_command(o), 0);
  EXPECT_EQ(read(o.json_out)["counts"], "2,3");
  o.uniform_remainder = "first";
  EXPECT_EQ(balance_command(o), 0);
  EXPECT_EQ(read(o.json_out)["counts"], "3,2");
  o.uniform_remainder = "middle";
  EXPECT_THROW(balance_command(o), UserError);
  testing::internal::GetCapturedStdout();
}

TEST_F(OfflineTest, BadInputNamesTheField) {
  auto message = [&](const std::string& text) {
    try {
      load_balance_problem(write("bad.json", text));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"units": 3})").find("latency_ms"), std::string::npos);
  EXPECT_NE(message(R"({"latency_ms": [1, "a"]})").find("latency_ms"), std::string::npos);
  EXPECT_NE(message(R"({"latency_ms": [1, 2], "units": 3})").find("units"), std::string::npos);
  EXPECT_NE(message(R"({"latency_ms": [1, 2], "kv_bytes": [1]})").find("kv_bytes"), std::string::npos);
  EXPECT_NE(message(R"({"latency_ms": [1, 2], "overlap": 3})").find("overlap"), std::string::npos);
  EXPECT_NE(message("not json").find("JSON"), std::string::npos);
  EXPECT_THROW(load_balance_problem((dir_ / "missing.json").string()), UserError);
}

TEST_F(OfflineTest, SimulateStageJson) {
  SimulateOptions o;
  o.input = write("st.json", R"({"stages": [{"prefill_ms": 10, "decode_ms": 2}], "gen_len": 2})");
  o.json_out = (dir_ / "sim.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(o), 0);
  testing::internal::GetCapturedStdout();
  const auto j = read(o.json_out);
  EXPECT_NEAR(j["predicted"]["ttft_p50_ms"].get<double>(), 10.0, 1e-9);
  EXPECT_NEAR(j["predicted"]["tpot_p50_ms"].get<double>(), 2.0, 1e-9);
  o.input = write("bad.json", R"({"stages": [{"prefill_ms": 1}]})");
  EXPECT_THROW(simulate_command(o), UserError);
}

using test::error_of;

TEST_F(OfflineTest, BalanceRefusesHugeLatencies) {
  // Sums of 1e308 overflow to inf: once a fatal "infeasible probe" (exit 1), once a bogus
  // "no split satisfies the memory limits" without any memory limit.
  BalanceOptions o;
  o.input = write("huge.json", R"({"units":["a","b"],"latency_ms":[1e308,1e308]})");
  o.stages = 2;
  std::string msg = error_of([&] { balance_command(o); });
  EXPECT_NE(msg.find("latency_ms[0][0] is 1e+308 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<= 1e+12 ms"), std::string::npos) << msg;
  o.stages = 1;
  o.solver = "dp";
  msg = error_of([&] { balance_command(o); });
  EXPECT_NE(msg.find("latency_ms[0][0]"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("memory"), std::string::npos) << msg;
}

TEST_F(OfflineTest, BalanceRangeChecksBytesBeforeConverting) {
  auto message = [&](const std::string& text) { return error_of([&] { load_balance_problem(write("b.json", text)); }); };
  std::string m = message(R"({"latency_ms":[1,1],"weight_bytes":[1e30,1e30]})");
  EXPECT_NE(m.find("weight_bytes[0] is 1e+30"), std::string::npos) << m;
  EXPECT_NE(m.find("2^50"), std::string::npos) << m;
  EXPECT_EQ(m.find("negative"), std::string::npos) << m;
  m = message(R"({"latency_ms":[1,1],"kv_bytes":[1e30,1]})");
  EXPECT_NE(m.find("kv_bytes[0]"), std::string::npos) << m;
  m = message(R"({"latency_ms":[1,1],"weight_bytes":[9e18,9e18]})");  // was: memory -416062840.921 GiB
  EXPECT_NE(m.find("weight_bytes[0]"), std::string::npos) << m;
  m = message(R"({"latency_ms":[1,1],"weight_bytes":[1.5,1]})");
  EXPECT_NE(m.find("whole number"), std::string::npos) << m;
  m = message(R"({"latency_ms":[1,1],"device_memory_bytes":-5})");
  EXPECT_NE(m.find("device_memory_bytes is -5"), std::string::npos) << m;
  m = message(R"({"latency_ms":[1,1],"device_memory_bytes":[10,-1]})");
  EXPECT_NE(m.find("device_memory_bytes[1] is -1"), std::string::npos) << m;
  m = message(R"({"latency_ms":[1,1],"link_bandwidth_GBps":-5})");
  EXPECT_NE(m.find("link_bandwidth_GBps is -5"), std::string::npos) << m;
  m = message(R"({"latency_ms":[1,1],"activation_bytes":1e9,"link_bandwidth_GBps":1e-300})");
  EXPECT_NE(m.find("transfer time"), std::string::npos) << m;

  // The largest accepted sizes sum without overflow.
  BalanceOptions o;
  o.input = write("max.json", R"({"latency_ms":[1,1],"weight_bytes":[1125899906842624,1125899906842624]})");
  o.stages = 1;
  o.json_out = (dir_ / "max_out.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("2097152.000"), std::string::npos) << out;  // 2 x 2^50 bytes in GiB
  EXPECT_EQ(read(o.json_out)["stages"][0]["memory_bytes"].get<int64_t>(), int64_t{1} << 51);
}

TEST_F(OfflineTest, UnknownKeysAreRefused) {
  // A typo would silently drop the limit.
  std::string m = error_of([&] { load_balance_problem(write("k.json", R"({"latency_ms":[1,1],"device_memory":5})")); });
  EXPECT_NE(m.find("unknown key 'device_memory'"), std::string::npos) << m;
  EXPECT_NE(m.find("device_memory_bytes"), std::string::npos) << m;  // the valid keys are listed
  SimulateOptions s;
  s.input = write("s.json", R"({"stages":[{"prefil_ms":1,"decode_ms":1}]})");
  m = error_of([&] { simulate_command(s); });
  EXPECT_NE(m.find("unknown key 'prefil_ms' (stages[0])"), std::string::npos) << m;
  EXPECT_NE(m.find("send_decode_ms"), std::string::npos) << m;
  s.input = write("s.json", R"({"stages":[{"prefill_ms":1,"decode_ms":1}],"microbatch":2})");
  m = error_of([&] { simulate_command(s); });
  EXPECT_NE(m.find("unknown key 'microbatch' (top level)"), std::string::npos) << m;
  EXPECT_NE(m.find("microbatches, gen_len, batch"), std::string::npos) << m;
}

TEST_F(OfflineTest, HugeValuesPrintCompactly) {
  BalanceOptions o;
  o.input = write("big.json", R"({"latency_ms":[1e11,1e11]})");
  o.stages = 1;
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("bottleneck 2e+11 ms"), std::string::npos) << out;
  EXPECT_FALSE(std::regex_search(out, std::regex("[0-9]{13}"))) << out;
}

TEST_F(OfflineTest, BalanceRefusesFlagsItWouldIgnore) {
  BalanceOptions o;
  o.input = write("lat.json", kLatency);
  o.stages = 2;
  o.uniform_remainder = "last";  // with the default solver (auto)
  EXPECT_NE(error_of([&] { balance_command(o); }).find("--uniform-remainder applies to --solver uniform"), std::string::npos);
  o.uniform_remainder.clear();
  o.order = "auto";
  o.partition = "2,3";
  EXPECT_NE(error_of([&] { balance_command(o); }).find("--order auto"), std::string::npos);
  o.partition.clear();
  o.solver = "uniform";
  EXPECT_NE(error_of([&] { balance_command(o); }).find("--order auto"), std::string::npos);
  o.order = "rank";
  o.solver = "dp";
  o.partition = "2,3";
  EXPECT_NE(error_of([&] { balance_command(o); }).find("--partition"), std::string::npos);
  o.partition.clear();
  o.objective = "decode";  // a latency JSON has one cost per unit
  EXPECT_NE(error_of([&] { balance_command(o); }).find("--objective decode"), std::string::npos);
}

TEST_F(OfflineTest, SimulateRefusesATimelineTooLargeForMemory) {
  // -M 100000 -g 100000 was std::bad_alloc (exit 1).
  SimulateOptions o;
  o.input = write("st.json", R"({"stages": [{"prefill_ms": 1, "decode_ms": 1}, {"prefill_ms": 1, "decode_ms": 1}]})");
  o.microbatches = 100000;
  o.gen_len = 100000;
  const std::string m = error_of([&] { simulate_command(o); });
  EXPECT_NE(m.find("-M/--microbatches 100000"), std::string::npos) << m;
  EXPECT_NE(m.find("-g/--gen-len 100000"), std::string::npos) << m;
}

TEST_F(OfflineTest, SimulateRefusesMeaninglessStageTimes) {
  SimulateOptions o;
  auto message = [&](const std::string& text) {
    o.input = write("st.json", text);
    return error_of([&] { simulate_command(o); });
  };
  // All-zero stage times printed "tokens/s -nan" with exit 0.
  std::string m = message(R"({"stages": [{"prefill_ms": 0, "decode_ms": 0}]})");
  EXPECT_NE(m.find("decode_ms"), std::string::npos) << m;
  m = message(R"({"stages": [{"prefill_ms": -1, "decode_ms": 1}]})");
  EXPECT_NE(m.find("stages[0].prefill_ms is -1"), std::string::npos) << m;
  m = message(R"({"stages": [{"prefill_ms": 1, "decode_ms": 1}], "microbatches": "2"})");
  EXPECT_NE(m.find("'microbatches' is \"2\""), std::string::npos) << m;
  m = message(R"({"stages": [{"prefill_ms": 1, "decode_ms": 1}], "gen_len": 0})");
  EXPECT_NE(m.find("'gen_len' is 0"), std::string::npos) << m;
  // The documented keys work.
  o.input = write("ok.json", R"({"stages": [{"prefill_ms": 4, "decode_ms": 1}, {"prefill_ms": 4, "decode_ms": 1,
      "send_prefill_ms": 0, "send_decode_ms": 0}], "microbatches": 2, "gen_len": 8, "batch": 4, "overlap": true})");
  o.json_out = (dir_ / "ok_out.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(o), 0);
  testing::internal::GetCapturedStdout();
  const auto j = read(o.json_out);
  EXPECT_EQ(j["microbatches"], 2);
  EXPECT_EQ(j["gen_len"], 8);
  EXPECT_EQ(j["batch"], 4);
}

// ---- results files ------------------------------------------------------------------------

/// A small complete run: 2 ranks (devices `dev0`, `dev1`), 4 units, partitions "uniform" then
/// "balanced" (run order differs from name order), workload B=1 P=4 G=1 M=2.
RunRecord make_run(const std::string& dev0 = "Xeon", const std::string& dev1 = "Xeon") {
  RunRecord r;
  r.ppbench_version = "test";
  r.created_utc = "2025-01-02T03:04:05Z";
  r.backend = "cpu";
  r.transport = "mpi";
  r.world_size = 2;
  r.model_source = "m.json";
  r.model_config_json = "{}";
  r.model_attrs_num = {{"hidden_size", 64}};
  r.workload = {1, 4, 1, 2, "f32", 1, 2, 0, 3, true, 7, "workload"};
  r.ranks = {{"node01", dev0, "", 0, 0.0}, {"node01", dev1, "", 1, 0.0}};
  auto& p = r.profile;
  p.unit_name = {"embed", "layer.0", "layer.1", "head"};
  p.unit_signature = {0, 1, 1, 2};
  p.signature_name = {"embed", "layer", "head"};
  for (int i = 0; i < 2 * 4 * 2; ++i) {
    p.latency_ms.push_back(1.0 + (i % 8));
    p.latency_min_ms.push_back(1.0);
    p.latency_max_ms.push_back(9.0);
  }
  p.decode_contexts = {4};
  p.decode_context_ms.assign(2 * 4, 1.0);
  p.cost_ms.assign(2 * 4, 3.0);
  p.unit_params = {100, 200, 200, 300};
  p.unit_weight_bytes = {400, 800, 800, 1200};
  p.unit_kv_bytes = {0, 64, 64, 0};
  for (const char* name : {"uniform", "balanced"}) {
    PartitionRecord pr;
    pr.name = pr.solver = name;
    pr.first_unit = {0, 2};
    pr.last_unit = {1, 3};
    pr.device_rank = {0, 1};
    pr.predicted_stage_ms = {10.0, 12.0};
    pr.predicted_phase_ms = {5.0, 2.5, 6.0, 3.0};
    pr.stage_weight_bytes = {1200, 2000};
    pr.stage_kv_bytes = {64, 64};
    pr.predicted_bottleneck_ms = 12.0;
    pr.measured = true;
    for (int i = 0; i < 2 * 2 * 2 * 2 * 6; ++i) pr.events.push_back(0.001 * i);
    pr.stage_compute_ms = {5.5, 2.6, 6.5, 3.5};
    pr.stage_workload_ms = {8.1, 10.0};
    pr.bubble_fraction = {0.4, 0.2};
    pr.recv_wait_ms = {0.0, 1.0};
    pr.rep_wall_s = {0.02, 0.021};
    pr.rep_tokens_per_s = {100.0, 95.0};
    pr.lane_cpu_s = {0.1, 0.01, 0.01, 0.2, 0.02, 0.02};
    pr.timed_wall_s = 0.041;
    pr.bottleneck_stage = 1;
    pr.metrics = {{"tokens_per_s", 100.0},     {"decode_tokens_per_s", 150.0}, {"ttft_p50_ms", 8.0},
                  {"ttft_p99_ms", 9.0},        {"tpot_p50_ms", 3.0},           {"tpot_p99_ms", 4.0},
                  {"pipeline_efficiency", 0.9}, {"bottleneck_bound_tok_s", 200.0}};
    pr.tokens = pr.reference_tokens = {1, 2, 3, 4};
    pr.checksum = pr.reference_checksum = 1.25;
    pr.tokens_match = pr.checksum_match = true;
    r.partitions.push_back(pr);
  }
  r.validation_ok = true;
  r.validation = "ok";
  return r;
}

/// `ppbench balance FILE --tp auto --devices N` (issue 14) on a 2-rank profile with widths 1
/// and 2 (workload cost = prefill + G decode, G = 1; free link): one device costs embed 1,
/// layer 4, layer 4, head 12; a group of two costs 1, 2.5, 2.5, 7. On 2 devices the best is
/// 1 + 1 with the head alone (bottleneck 12; all four units on a group of two cost 13); on 3,
/// one device for embed..layer.1 (9) and the head on a group of two (7): bottleneck 9, a gain
/// of 12 / 9, "widen stage 1 from 1 to 2 devices".
TEST_F(OfflineTest, TpAutoSaysWhatOneMoreDeviceBuys) {
  RunRecord r = make_run();
  const std::vector<double> one = {1, 0, 3, 1, 3, 1, 8, 4};
  r.profile.latency_ms.clear();
  for (int rank = 0; rank < 2; ++rank) r.profile.latency_ms.insert(r.profile.latency_ms.end(), one.begin(), one.end());
  ProfileTable::TpGroupProfile g;
  g.first_rank = 0;
  g.width = 2;
  g.latency_ms = {1, 0, 2, 0.5, 2, 0.5, 5, 2};
  g.latency_min_ms = g.latency_max_ms = g.latency_ms;
  r.profile.tp.push_back(g);
  BalanceOptions o;
  o.input = (dir_ / "tp.h5").string();
  write_results(o.input, r);
  o.tp = "auto";
  o.devices = 3;
  o.json_out = (dir_ / "tp.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  const std::string text = testing::internal::GetCapturedStdout();
  EXPECT_NE(text.find("widen stage 1 from 1 to 2 devices"), std::string::npos) << text;
  const auto j = read(o.json_out);
  EXPECT_EQ(j["layout"]["tp_width"], (std::vector<int>{1, 2}));
  EXPECT_EQ(j["layout"]["first_unit"], (std::vector<int>{0, 3}));
  EXPECT_DOUBLE_EQ(j["layout"]["bottleneck_ms"].get<double>(), 9.0);
  EXPECT_EQ(j["layout_on_file_ranks"]["tp_width"], (std::vector<int>{1, 1}));
  EXPECT_DOUBLE_EQ(j["layout_on_file_ranks"]["bottleneck_ms"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(j["predicted_gain"].get<double>(), 12.0 / 9.0);
  // Without a width axis, or with flags --tp auto decides itself, a clear error.
  BalanceOptions bad = o;
  bad.json_out.clear();
  bad.stages = 2;
  EXPECT_NE(error_of([&] { balance_command(bad); }).find("drop --stages"), std::string::npos);
  r.profile.tp.clear();
  bad = o;
  bad.json_out.clear();
  bad.input = (dir_ / "no_tp.h5").string();
  write_results(bad.input, r);
  EXPECT_NE(error_of([&] { balance_command(bad); }).find("/profile/tp"), std::string::npos);
}

/// `ppbench describe` (issue 15): the units as ppbench splits them, with the published total
/// (Llama-3.1-8B: 8,030,261,248 parameters, its model card's 8.03 B), per-unit numbers that sum
/// to it, and the KV bytes per token of GQA (8 KV heads x 128 x 2 x 2 bytes per layer in bf16).
TEST_F(OfflineTest, DescribeListsUnitsWithThePublishedTotal) {
  DescribeOptions o;
  o.model = std::string(PPB_MODELS_DIR) + "/llama-3.1-8b.json";
  o.json_out = (dir_ / "describe.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(describe_command(o), 0);
  const std::string text = testing::internal::GetCapturedStdout();
  EXPECT_NE(text.find("8030261248 parameters"), std::string::npos) << text;
  const auto j = read(o.json_out);
  EXPECT_EQ(j["total_params"].get<int64_t>(), 8030261248);
  // Active per token: all but the embedding table (128256 x 4096), of which a token reads a row.
  EXPECT_EQ(j["active_params"].get<int64_t>(), 8030261248 - 128256ll * 4096);
  ASSERT_EQ(j["units"].size(), 34u);  // embed, 32 layers, head
  int64_t sum = 0, kv = 0;
  for (const auto& u : j["units"]) {
    sum += u["params"].get<int64_t>();
    kv += u["kv_bytes_per_token"].get<int64_t>();
  }
  EXPECT_EQ(sum, 8030261248);
  EXPECT_EQ(j["units"][1]["kv_bytes_per_token"].get<int64_t>(), 2 * 8 * 128 * 2);
  EXPECT_EQ(kv, 32 * 2 * 8 * 128 * 2);
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), kv);
  EXPECT_EQ(j["units"][0]["kind"], "embed");
  EXPECT_EQ(j["units"][33]["kind"], "head");
  // A decode step of a layer at context C: 2 x matmul params + 4 x 32 heads x 128 x C.
  const double layer = j["units"][1]["params"].get<double>() - 2 * 4096;  // less the two norms
  EXPECT_DOUBLE_EQ(j["units"][1]["flops_per_token"].get<double>(), 2 * layer + 4.0 * 32 * 128 * 4096);
  o.dtype = "f8";
  o.json_out.clear();
  EXPECT_NE(error_of([&] { describe_command(o); }).find("f8"), std::string::npos);
}

/// describe of the MoE and MLA models: DeepSeek-V3's 671 B (+ the 11.6 B MTP module), 36.6 B
/// active per token, its dense and MoE signatures, and the MLA cache of 576 values per token.
TEST_F(OfflineTest, DescribeMixtureOfExpertsTotalsActiveAndMtp) {
  DescribeOptions o;
  o.model = std::string(PPB_MODELS_DIR) + "/deepseek-v3.json";
  o.json_out = (dir_ / "ds.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(describe_command(o), 0);
  const std::string text = testing::internal::GetCapturedStdout();
  EXPECT_NE(text.find("3 dense + 58 mixture-of-experts (256 routed experts of width 2048, top 8, 1 shared)"),
            std::string::npos) << text;
  EXPECT_NE(text.find("multi-token prediction: 1 module(s), 11610068224 parameters"), std::string::npos) << text;
  const auto j = read(o.json_out);
  EXPECT_EQ(j["total_params"].get<int64_t>(), 671026419200 + 11610068224);
  EXPECT_EQ(j["mtp_params"].get<int64_t>(), 11610068224);
  EXPECT_EQ(j["active_params"].get<int64_t>(), 36625618432);
  int64_t active = 0;
  for (const auto& u : j["units"]) active += u["active_params"].get<int64_t>();
  EXPECT_EQ(active, 36625618432);
  EXPECT_EQ(j["units"][1]["signature"], "layer.dense");
  EXPECT_EQ(j["units"][4]["signature"], "layer.moe");
  EXPECT_EQ(j["units"][4]["kv_bytes_per_token"].get<int64_t>(), (512 + 64) * 2);
  o.dtype = "bf16";
  o.context = 0;
  EXPECT_NE(error_of([&] { describe_command(o); }).find("--context"), std::string::npos);
}

TEST_F(OfflineTest, SimulateListsPartitionsInRunOrder) {
  SimulateOptions o;
  o.input = (dir_ / "run.h5").string();
  write_results(o.input, make_run());
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  const auto u = out.find("partition uniform"), b = out.find("partition balanced");
  ASSERT_NE(u, std::string::npos) << out;
  ASSERT_NE(b, std::string::npos) << out;
  EXPECT_LT(u, b) << out;  // run order, not the alphabetical order of the HDF5 groups
  // The run's own workload: measured row and the comparison.
  EXPECT_NE(out.find("  measured   "), std::string::npos) << out;
  EXPECT_NE(out.find("predicted / measured - 1"), std::string::npos) << out;
}

/// The replay plays the measured mean steps where the file has them (a rate follows the mean
/// step), the medians in older files; the cross-calibrated row plays predicted_phase_cross_ms.
/// Rows fed the same step times through the same link and simulator agree exactly.
TEST_F(OfflineTest, SimulateReplaysTheMeanStepsAndTheCrossCalibratedPrediction) {
  SimulateOptions o;
  o.input = (dir_ / "run.h5").string();
  o.json_out = (dir_ / "sim.json").string();
  o.force = true;
  RunRecord run = make_run();
  for (auto& pr : run.partitions) {
    pr.stage_compute_mean_ms = {6.0, 3.0, 7.0, 4.5};  // above the medians {5.5, 2.6, 6.5, 3.5}
    pr.measured_stage_mean_ms = {9.0, 11.5};
    pr.predicted_phase_cross_ms = pr.stage_compute_mean_ms;
    pr.predicted_stage_cross_ms = {9.0, 11.5};
    pr.cross_calibrated_by = pr.name == "uniform" ? "balanced" : "uniform";
  }
  write_results(o.input, run);
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(o), 0);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("replayed (mean steps)"), std::string::npos) << out;
  EXPECT_NE(out.find("cross-calibrated by balanced: "), std::string::npos) << out;
  auto j = read(o.json_out);
  for (const char* name : {"uniform", "balanced"}) {
    const auto& p = j["partitions"][name];
    EXPECT_EQ(p["replayed_steps"], "mean");
    EXPECT_EQ(p["cross_calibrated_by"], std::string(name) == "uniform" ? "balanced" : "uniform");
    EXPECT_DOUBLE_EQ(p["cross_calibrated"]["decode_tokens_per_s"].get<double>(),
                     p["replayed"]["decode_tokens_per_s"].get<double>());
    EXPECT_DOUBLE_EQ(p["cross_calibrated_decode_tokens_per_s_error"].get<double>(),
                     p["cross_calibrated"]["decode_tokens_per_s"].get<double>() /
                             p["measured"]["decode_tokens_per_s"].get<double>() - 1.0);
  }
  const double mean_replay = j["partitions"]["uniform"]["replayed"]["decode_tokens_per_s"].get<double>();
  // An older file: medians replayed (faster steps, a higher rate), no cross-calibrated row.
  RunRecord older = make_run();
  write_results(o.input, older);
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(o), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("replayed (median steps)"), std::string::npos) << out;
  EXPECT_EQ(out.find("cross-calibrated"), std::string::npos) << out;
  j = read(o.json_out);
  EXPECT_EQ(j["partitions"]["uniform"]["replayed_steps"], "median");
  EXPECT_FALSE(j["partitions"]["uniform"].contains("cross_calibrated"));
  EXPECT_GT(j["partitions"]["uniform"]["replayed"]["decode_tokens_per_s"].get<double>(), mean_replay);
}

TEST_F(OfflineTest, SimulateOfAnotherWorkloadDoesNotCompare) {
  SimulateOptions o;
  o.input = (dir_ / "run.h5").string();
  o.json_out = (dir_ / "sim.json").string();
  write_results(o.input, make_run());
  o.gen_len = 64;
  o.batch = 16;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(simulate_command(o), 0);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find("predicted / measured"), std::string::npos) << out;
  EXPECT_NE(out.find("measured (M=2 G=1 B=1)"), std::string::npos) << out;  // labelled with the run's workload
  EXPECT_NE(out.find("the run measured M=2 G=1 B=1"), std::string::npos) << out;
  EXPECT_NE(err.find("-b 16 differs from the run's B=1"), std::string::npos) << err;
  const auto j = read(o.json_out);
  EXPECT_FALSE(j["partitions"]["uniform"].contains("decode_tokens_per_s_error"));
  EXPECT_TRUE(j["partitions"]["uniform"].contains("measured"));
  EXPECT_EQ(j["run_workload"]["gen_len"], 1);
}

TEST_F(OfflineTest, BalanceMoreStagesThanRanks) {
  BalanceOptions o;
  o.input = (dir_ / "run.h5").string();
  o.json_out = (dir_ / "b.json").string();
  o.force = true;  // written twice
  o.stages = 3;
  // Identical devices: the mean of the 2 rows, any K <= U.
  write_results(o.input, make_run("Xeon", "Xeon"));
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(balance_command(o), 0);
  const std::string err = testing::internal::GetCapturedStderr();
  testing::internal::GetCapturedStdout();
  EXPECT_NE(err.find("identical devices"), std::string::npos) << err;
  EXPECT_EQ(read(o.json_out)["stages"].size(), 3u);
  // Different devices: why, and what to do.
  write_results(o.input, make_run("A100", "V100"));
  const std::string m = error_of([&] { balance_command(o); });
  EXPECT_NE(m.find("one profile row per rank (2 ranks: A100, V100)"), std::string::npos) << m;
  EXPECT_NE(m.find("--stages <= 2"), std::string::npos) << m;
}

TEST_F(OfflineTest, ResultsFileCarriesTheRunsMemoryAndLink) {
  // The run's balancer saw each rank's memory limit and the measured link: so does balance.
  RunRecord run = make_run();
  run.ranks[0].memory_limit_bytes = 3000;
  run.ranks[1].memory_limit_bytes = 2500;
  run.link_bandwidth_Bps = 2e9;
  run.link_latency_s = 5e-6;
  const std::string path = (dir_ / "run.h5").string();
  write_results(path, run);
  const balance::BalanceProblem p = load_balance_problem(path, "workload");
  EXPECT_EQ(p.device_memory_bytes, (std::vector<int64_t>{3000, 2500}));
  EXPECT_DOUBLE_EQ(p.link_bandwidth_GBps, 2.0);
  EXPECT_DOUBLE_EQ(p.link_latency_us, 5.0);
  // Weights 400, 800, 800, 1200 and KV 0, 64, 64, 0: device 1's 2500 bytes cannot hold
  // layer.0 + layer.1 + head (2928), so the split is 3 | 1 or 2 | 2, never 1 | 3.
  BalanceOptions o;
  o.input = path;
  o.json_out = (dir_ / "b.json").string();
  o.force = true;  // written twice
  o.stages = 2;
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("constraints: memory per device"), std::string::npos) << out;
  EXPECT_NE(out.find("link 5 us + bytes / 2 GB/s"), std::string::npos) << out;
  const auto split = read(o.json_out)["stages"];
  ASSERT_EQ(split.size(), 2u);
  EXPECT_LE(split[0]["memory_bytes"].get<int64_t>(), 3000);
  EXPECT_LE(split[1]["memory_bytes"].get<int64_t>(), 2500);
  EXPECT_NE(split[1]["first_unit"].get<int>(), 1);  // 1 | 3 would need 2928 bytes on device 1
  // More stages than ranks on identical devices: the smallest limit for every stage.
  o.stages = 3;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(balance_command(o), 0);
  testing::internal::GetCapturedStderr();
  const std::string out3 = testing::internal::GetCapturedStdout();
  EXPECT_NE(out3.find("memory per device 2500 B"), std::string::npos) << out3;
}

TEST_F(OfflineTest, ReportOfSeveralFilesSkipsTheUnreadable) {
  const std::string good = (dir_ / "good.h5").string(), bad = (dir_ / "bad.h5").string(),
                    missing = (dir_ / "missing.h5").string();
  write_results(good, make_run());
  write_results(bad, make_run(), /*complete=*/false);  // a failed task of a sweep
  std::ostringstream out, err;
  EXPECT_EQ(run_report(out, {bad, good, missing}, true, err), 0);
  int lines = 0;
  for (char c : out.str()) lines += c == '\n';
  EXPECT_EQ(lines, 3) << out.str();  // header + uniform + balanced of the good file
  EXPECT_NE(err.str().find("skipped: '" + bad + "' is an incomplete"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find(missing), std::string::npos) << err.str();
  // None readable: exit 2 (UserError) listing each.
  std::ostringstream none;
  const std::string m = error_of([&] { run_report(none, {bad, missing}, false, err); });
  EXPECT_NE(m.find(bad), std::string::npos) << m;
  EXPECT_NE(m.find(missing), std::string::npos) << m;
  EXPECT_TRUE(none.str().empty());
  // One file: refused as before.
  EXPECT_THROW(run_report(none, {bad}, false, err), UserError);
  // A file given twice: its rows once, and the legend agrees.
  std::ostringstream twice, note;
  EXPECT_EQ(run_report(twice, {good, good}, false, note), 0);
  EXPECT_EQ(twice.str().find("[1]"), std::string::npos) << twice.str();
  size_t rows = 0;  // table rows of file [0] (its "[0] <path>" line above the table aside)
  std::istringstream lines_of(twice.str());
  for (std::string line; std::getline(lines_of, line);) rows += line.rfind("[0] ", 0) == 0 && line.find(good) == std::string::npos;
  EXPECT_EQ(rows, 2u) << twice.str();
  EXPECT_NE(note.str().find("given more than once"), std::string::npos);
}

// ---- new-user findings ----------------------------------------------------------------------

TEST_F(OfflineTest, JsonOutputIsCheckedBeforeAnythingIsPrinted) {
  const std::string h5 = (dir_ / "run.h5").string();
  write_results(h5, make_run());
  const auto h5_size = fs::file_size(h5);
  BalanceOptions b;
  b.input = h5;
  b.stages = 2;
  // The input itself: refused even with --force, and the results file stays intact.
  b.json_out = h5;
  b.force = true;
  testing::internal::CaptureStdout();
  std::string m = error_of([&] { balance_command(b); });
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_NE(m.find("--json '" + h5 + "' is the input file"), std::string::npos) << m;
  EXPECT_EQ(fs::file_size(h5), h5_size);
  EXPECT_EQ(std::ifstream(h5).get(), 0x89);  // still HDF5
  // The same file by another path (equivalent, not string-equal).
  b.json_out = (dir_ / "." / "run.h5").string();
  EXPECT_NE(error_of([&] { balance_command(b); }).find("is the input file"), std::string::npos);
  // An existing file: only with --force.
  b.force = false;
  b.json_out = write("old.json", "{}");
  testing::internal::CaptureStdout();
  m = error_of([&] { balance_command(b); });
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_NE(m.find("--json '" + b.json_out + "' exists; give --force"), std::string::npos) << m;
  EXPECT_EQ(read(b.json_out), nlohmann::json::object());
  b.force = true;
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(b), 0);
  testing::internal::GetCapturedStdout();
  EXPECT_EQ(read(b.json_out)["stages"].size(), 2u);
  // A directory, and a missing directory: refused before printing, saying why.
  b.json_out = dir_.string();
  testing::internal::CaptureStdout();
  m = error_of([&] { balance_command(b); });
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_NE(m.find("is a directory; give a file path"), std::string::npos) << m;
  b.json_out = (dir_ / "nodir" / "x.json").string();
  m = error_of([&] { balance_command(b); });
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
  // simulate: the same rules.
  SimulateOptions s;
  s.input = h5;
  s.json_out = h5;
  s.force = true;
  testing::internal::CaptureStdout();
  m = error_of([&] { simulate_command(s); });
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_NE(m.find("is the input file"), std::string::npos) << m;
  s.force = false;
  s.json_out = write("old2.json", "{}");
  EXPECT_NE(error_of([&] { simulate_command(s); }).find("exists; give --force"), std::string::npos);
  s.json_out = dir_.string();
  EXPECT_NE(error_of([&] { simulate_command(s); }).find("is a directory"), std::string::npos);
}

TEST_F(OfflineTest, SplitOverMemoryIsEvaluatedWithAWarning) {
  // kLatency: both devices hold 100 bytes; weights + KV 10, 25, 25, 25, 40.
  BalanceOptions o;
  o.input = write("lat.json", kLatency);
  o.stages = 2;
  o.json_out = (dir_ / "m.json").string();
  o.force = true;
  o.partition = "1,4";  // stage 1: 25 + 25 + 25 + 40 = 115 > 100
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  std::string out = testing::internal::GetCapturedStdout();
  const auto w = out.find("warning: stage 1 needs 115 bytes of weights + KV cache");
  ASSERT_NE(w, std::string::npos) << out;
  EXPECT_GT(w, out.find("split 1,4"));  // after the table
  EXPECT_NE(out.find("but device 1 holds 100 bytes"), std::string::npos) << out;
  EXPECT_EQ(out.find("warning: stage 0"), std::string::npos) << out;
  auto j = read(o.json_out);
  EXPECT_EQ(j["fits_memory"], false);
  EXPECT_EQ(j["stages"][1]["memory_limit_bytes"], 100);
  EXPECT_EQ(j["stages"][1]["memory_bytes"], 115);
  // uniform (3 + 2 = 2,3 with remainder last: stage 1 = 25 + 25 + 40 = 90) fits; so does the solver's split.
  o.partition.clear();
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find("warning:"), std::string::npos) << out;
  EXPECT_EQ(read(o.json_out)["fits_memory"], true);
  // seed ignores memory: the 10 ms head alone on stage 1 puts 10 + 20 + 20 + 20 = 70 bytes on device 0 (50).
  o.solver = "seed";
  o.input = write("seed.json", R"({"latency_ms": [[1,1,1,1,10],[1,1,1,1,10]], "weight_bytes": [10,20,20,20,40],
      "device_memory_bytes": [50, 100]})");
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(read(o.json_out)["counts"], "4,1");
  EXPECT_NE(out.find("warning: stage 0 needs 70 bytes of weights + KV cache but device 0 holds 50 bytes"),
            std::string::npos) << out;
  EXPECT_EQ(read(o.json_out)["fits_memory"], false);
  // A large stage prints GiB.
  o.solver = "auto";
  o.partition = "1,4";
  o.input = write("big.json", R"({"latency_ms": [1,1,1,1,1], "weight_bytes": [0,0,0,0,3221225472],
      "device_memory_bytes": 2147483648})");
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("stage 1 needs 3 GiB (3221225472 bytes) of weights + KV cache but device 1 holds 2 GiB"),
            std::string::npos) << out;
}

TEST_F(OfflineTest, RefusesHdf5FilesNotFromPpbenchOrNewer) {
  const std::string other = (dir_ / "other.h5").string(), newer = (dir_ / "newer.h5").string();
  { h5::File::create(other).root().create_group("data"); }
  {
    h5::File f = h5::File::create(newer);
    f.root().set_attr("format_version", static_cast<int64_t>(kResultsFormatVersion + 1));
    f.root().set_attr("ppbench_version", "9.9");
    f.root().set_attr("complete", static_cast<int64_t>(1));
  }
  BalanceOptions b;
  b.stages = 2;
  SimulateOptions s;
  for (const auto& [path, want] : {std::pair{other, std::string("is not a ppbench results file")},
                                   std::pair{newer, std::string("use a newer ppbench")}}) {
    b.input = s.input = path;
    std::string m = error_of([&] { balance_command(b); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
    EXPECT_EQ(m.find("incomplete"), std::string::npos) << m;
    m = error_of([&] { simulate_command(s); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
  }
  EXPECT_NE(error_of([&] { balance_command(b); }).find("format_version " + std::to_string(kResultsFormatVersion + 1)),
            std::string::npos);
}

TEST_F(OfflineTest, BalanceUsesTheRunsObjective) {
  RunRecord run = make_run();
  run.workload.objective = "prefill";
  const std::string path = (dir_ / "run.h5").string();
  write_results(path, run);
  // Default: the run's objective (prefill: latency column 0 only).
  const auto prefill = load_balance_problem(path, "prefill"), dflt = load_balance_problem(path);
  EXPECT_EQ(dflt.cost, prefill.cost);
  EXPECT_NE(load_balance_problem(path, "workload").cost, prefill.cost);
  BalanceOptions o;
  o.input = path;
  o.stages = 2;
  o.json_out = (dir_ / "b.json").string();
  o.force = true;
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("balance: 4 units on 2 stages, objective prefill (the run's), solver"), std::string::npos) << out;
  EXPECT_EQ(read(o.json_out)["objective"], "prefill");
  // An explicit objective still wins.
  o.objective = "decode";
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(o), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("objective decode, solver"), std::string::npos) << out;
  EXPECT_EQ(read(o.json_out)["objective"], "decode");
  o.objective = "tokens";
  EXPECT_NE(error_of([&] { balance_command(o); }).find("--objective 'tokens' is unknown"), std::string::npos);
}

TEST_F(OfflineTest, SimulateUsesTheRunsLinkByDefault) {
  RunRecord run = make_run();
  run.link_bandwidth_Bps = 1e6;  // slow: 64 floats = 256 bytes per token take 0.256 ms
  run.link_latency_s = 1e-4;
  const std::string path = (dir_ / "run.h5").string();
  write_results(path, run);
  SimulateOptions s;
  s.input = path;
  s.partition_name = "balanced";
  s.json_out = (dir_ / "s.json").string();
  s.force = true;
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(s), 0);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("link 100 us + bytes / 0.001 GB/s (the run's)"), std::string::npos) << out;
  const double with_run_link = read(s.json_out)["partitions"]["balanced"]["predicted"]["tokens_per_s"];
  EXPECT_DOUBLE_EQ(read(s.json_out)["link_bandwidth_GBps"].get<double>(), 1e-3);
  // The same link given explicitly: the same prediction; 0 0: free transfers, faster.
  s.link_bandwidth_GBps = 1e-3;
  s.link_latency_us = 100;
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(s), 0);
  testing::internal::GetCapturedStdout();
  EXPECT_DOUBLE_EQ(read(s.json_out)["partitions"]["balanced"]["predicted"]["tokens_per_s"].get<double>(), with_run_link);
  s.link_bandwidth_GBps = s.link_latency_us = 0;
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(s), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find(", link free\n"), std::string::npos) << out;
  EXPECT_GT(read(s.json_out)["partitions"]["balanced"]["predicted"]["tokens_per_s"].get<double>(), with_run_link);
  // A file without a measured link (1-rank run): balance and simulate say so.
  write_results(path, make_run());
  BalanceOptions b;
  b.input = path;
  b.stages = 2;
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(b), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("; link free (none measured: 1-rank run)\n"), std::string::npos) << out;
  s.link_bandwidth_GBps = s.link_latency_us = -1;
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(s), 0);
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("link free (none measured: 1-rank run)"), std::string::npos) << out;
}

TEST_F(OfflineTest, SimulateStageJsonRefusesResultsFlagsAndOneDecodeStep) {
  SimulateOptions s;
  s.input = write("st.json", R"({"stages": [{"prefill_ms": 4, "decode_ms": 1}, {"prefill_ms": 4, "decode_ms": 1}]})");
  s.link_bandwidth_GBps = 10;
  EXPECT_NE(error_of([&] { simulate_command(s); }).find("--link-bandwidth/--link-latency apply to results files only"),
            std::string::npos);
  s.link_bandwidth_GBps = -1;
  s.link_latency_us = 0;
  EXPECT_NE(error_of([&] { simulate_command(s); }).find("--link-bandwidth/--link-latency"), std::string::npos);
  s.link_latency_us = -1;
  s.partition_name = "balanced";
  EXPECT_NE(error_of([&] { simulate_command(s); }).find("--partition-name applies to results files only"),
            std::string::npos);
  s.partition_name.clear();
  // M = G = 1: one decode step, no decode tokens/s.
  s.json_out = (dir_ / "s.json").string();
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(s), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("decode tokens/s n/a (one decode step)"), std::string::npos) << out;
  EXPECT_EQ(out.find("0.00  TTFT"), std::string::npos) << out;
  EXPECT_TRUE(read(s.json_out)["predicted"]["decode_tokens_per_s"].is_null());
  // Results file with M = G = 1 (the run measured one decode step too).
  RunRecord run = make_run();
  run.workload.microbatches = 1;
  for (auto& pr : run.partitions) pr.events.resize(pr.events.size() / 2);  // [reps][M][stages][G+1][6]
  SimulateOptions r;
  r.input = (dir_ / "run.h5").string();
  write_results(r.input, run);
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(r), 0);
  const std::string out2 = testing::internal::GetCapturedStdout();
  EXPECT_NE(out2.find("predicted (profile)        tokens/s"), std::string::npos) << out2;
  EXPECT_EQ(out2.find("predicted / measured"), std::string::npos) << out2;
  EXPECT_NE(out2.find("n/a (one decode step)"), std::string::npos) << out2;
}

TEST_F(OfflineTest, DuplicateJsonKeysAreRefused) {
  std::string m = error_of([&] { load_balance_problem(write("d.json", R"({"latency_ms": [1, 2],
      "device_memory_bytes": 10, "device_memory_bytes": 0})")); });
  EXPECT_NE(m.find("duplicate key 'device_memory_bytes' at the top level"), std::string::npos) << m;
  SimulateOptions s;
  s.input = write("s.json", R"({"stages": [{"prefill_ms": 1, "decode_ms": 1},
      {"prefill_ms": 1, "decode_ms": 1, "decode_ms": 5}]})");
  m = error_of([&] { simulate_command(s); });
  EXPECT_NE(m.find("duplicate key 'decode_ms' in 'stages'"), std::string::npos) << m;
  // The same key in different objects is fine.
  s.input = write("ok.json", R"({"stages": [{"prefill_ms": 1, "decode_ms": 1}, {"prefill_ms": 1, "decode_ms": 1}]})");
  testing::internal::CaptureStdout();
  EXPECT_EQ(simulate_command(s), 0);
  testing::internal::GetCapturedStdout();
}

TEST(MemoryReport, KvCapacityPerStage) {
  balance::Partition p = balance::parse_manual("2,2", 4, 2);
  // 1000 cached tokens: units 1 and 2 hold 1 byte per token each; head 500 bytes of weights.
  const std::vector<int64_t> w = {100, 200, 200, 500}, kv = {0, 1000, 1000, 0};
  const auto r = balance::memory_report(p, w, kv, 1000, {2000, 2000});
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].weight_bytes, 300);
  EXPECT_EQ(r.stages[0].kv_bytes, 1000);
  EXPECT_EQ(r.stages[0].free_bytes, 700);
  EXPECT_EQ(r.stages[0].kv_token_capacity, 1700);  // (2000 - 300) / 1 byte per token
  EXPECT_EQ(r.stages[0].kv_tokens_left, 700);
  EXPECT_EQ(r.stages[1].kv_token_capacity, 1300);  // (2000 - 700) / 1
  EXPECT_EQ(r.limiting_stage, 1);
  EXPECT_EQ(r.pipeline_kv_token_capacity, 1300);
  const std::string table = balance::format_memory_report(r);
  EXPECT_NE(table.find("limited by stage 1"), std::string::npos) << table;
  const auto unlimited = balance::memory_report(p, w, kv, 1000, {});
  EXPECT_EQ(unlimited.limiting_stage, -1);
  EXPECT_EQ(unlimited.stages[0].kv_token_capacity, -1);
  EXPECT_THROW(balance::memory_report(p, w, {1, 2}, 1000, {}), UserError);
}

}  // namespace
}  // namespace ppb

namespace ppb {
namespace {

// ---- one problem builder: the run's problem is the one `balance FILE.h5` rebuilds ----------

void expect_same_problem(const balance::BalanceProblem& a, const balance::BalanceProblem& b, const std::string& what) {
  EXPECT_EQ(a.cost, b.cost) << what;  // bit for bit
  EXPECT_EQ(a.device_row, b.device_row) << what;
  EXPECT_EQ(a.weight_bytes, b.weight_bytes) << what;
  EXPECT_EQ(a.kv_bytes, b.kv_bytes) << what;
  EXPECT_EQ(a.device_memory_bytes, b.device_memory_bytes) << what;
  EXPECT_EQ(a.activation_bytes, b.activation_bytes) << what;
  EXPECT_EQ(a.link_bandwidth_GBps, b.link_bandwidth_GBps) << what;
  EXPECT_EQ(a.link_latency_us, b.link_latency_us) << what;
  EXPECT_EQ(a.messages_per_boundary, b.messages_per_boundary) << what;
  EXPECT_EQ(a.overlap, b.overlap) << what;
  EXPECT_EQ(a.unit_names, b.unit_names) << what;
  auto same_nan = [](const std::vector<double>& x, const std::vector<double>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
    return true;
  };
  EXPECT_TRUE(same_nan(a.pair_bandwidth_GBps, b.pair_bandwidth_GBps)) << what;
  EXPECT_TRUE(same_nan(a.pair_latency_us, b.pair_latency_us)) << what;
}

/// Issue 16: on several nodes the balancer's links are per pair of nodes (the median of the
/// node pair's measured rank pairs, so ranks of one node stay interchangeable); on one node, or
/// without a matrix, there are none and the one link serves every boundary as before. The
/// offline problem from the file is the run's.
TEST_F(OfflineTest, PairLinksArePerPairOfNodes) {
  RunRecord run = make_run();
  const balance::Objective o = balance::parse_objective(run.workload.objective);  // what the file reloads
  EXPECT_TRUE(balance::node_pair_links(run).latency_s.empty());  // no matrix
  run.link_latency_matrix_s = {NAN, 1e-6, 1e-6, NAN};
  run.link_bandwidth_matrix_Bps = {NAN, 8e9, 8e9, NAN};
  EXPECT_TRUE(balance::node_pair_links(run).latency_s.empty());  // one node
  EXPECT_TRUE(balance::problem_from_run(run, o).pair_bandwidth_GBps.empty());
  // Four ranks, two per node; within node01 7 and 9 GB/s ... one noisy pair each.
  run.ranks = {{"node01", "Xeon", "", 0, 0.0}, {"node01", "Xeon", "", 1, 0.0}, {"node02", "Xeon", "", 0, 0.0},
               {"node02", "Xeon", "", 1, 0.0}};
  run.world_size = 4;
  auto& t = run.profile;
  for (auto* v : {&t.latency_ms, &t.latency_min_ms, &t.latency_max_ms}) v->insert(v->end(), v->begin(), v->end());  // [4][U][2]
  t.decode_context_ms.insert(t.decode_context_ms.end(), t.decode_context_ms.begin(), t.decode_context_ms.end());
  t.cost_ms.insert(t.cost_ms.end(), t.cost_ms.begin(), t.cost_ms.end());
  run.partitions.clear();
  const double n = NAN;
  run.link_latency_matrix_s = {n, 1e-6, 5e-5, 6e-5, 1e-6, n, 7e-5, 5e-5, 5e-5, 7e-5, n, 2e-6, 6e-5, 5e-5, 2e-6, n};
  run.link_bandwidth_matrix_Bps = {n, 7e9, 1.1e8, 1.3e8, 7e9, n, 1.2e8, 1.0e8, 1.1e8, 1.2e8, n, 9e9, 1.3e8, 1.0e8, 9e9, n};
  const balance::PairLinks links = balance::node_pair_links(run);
  ASSERT_EQ(links.bandwidth_Bps.size(), 16u);
  EXPECT_TRUE(std::isnan(links.bandwidth_Bps[0]));
  EXPECT_EQ(links.bandwidth_Bps[0 * 4 + 1], 7e9);  // node01 alone: its one pair
  EXPECT_EQ(links.bandwidth_Bps[2 * 4 + 3], 9e9);
  for (int a : {0, 1})
    for (int b : {2, 3}) {
      EXPECT_DOUBLE_EQ(links.bandwidth_Bps[a * 4 + b], 1.15e8) << a << " " << b;  // median of the four
      EXPECT_DOUBLE_EQ(links.latency_s[b * 4 + a], 5.5e-5) << a << " " << b;
    }
  // The simulators' lookup: a measured pair's link, nothing where the matrix has none (a rank
  // with itself, a rank out of range), and the transfer over it.
  const auto l12 = links.measured(1, 2, 4);
  ASSERT_TRUE(l12.has_value());
  EXPECT_DOUBLE_EQ(l12->second, 1.15e8);
  EXPECT_DOUBLE_EQ(l12->first, links.latency_s[1 * 4 + 2]);
  EXPECT_FALSE(links.measured(2, 2, 4).has_value());
  EXPECT_FALSE(links.measured(0, 4, 4).has_value());
  EXPECT_FALSE(balance::PairLinks{}.measured(0, 1, 2).has_value());
  EXPECT_DOUBLE_EQ(ppb::link_transfer_ms(l12->first, l12->second, 1.15e6), 1e3 * l12->first + 10.0);
  EXPECT_DOUBLE_EQ(ppb::link_transfer_ms(2e-6, 0.0, 1e9), 2e-3);  // no bandwidth: latency only
  const balance::BalanceProblem p = balance::problem_from_run(run, o);
  ASSERT_EQ(p.pair_bandwidth_GBps.size(), 16u);
  EXPECT_DOUBLE_EQ(p.pair_bandwidth_GBps[1 * 4 + 2], 0.115);
  EXPECT_DOUBLE_EQ(p.pair_latency_us[1 * 4 + 2], 55.0);
  // The boundary between the nodes costs the network, one inside a node shared memory.
  EXPECT_GT(balance::boundary_transfer_ms(p, 1, 2)[0], 10 * balance::boundary_transfer_ms(p, 0, 1)[0]);
  const std::string path = (dir_ / "two_nodes.h5").string();
  write_results(path, run);
  expect_same_problem(p, load_balance_problem(path), "two nodes");
  // `ppbench balance --link-bandwidth/--link-latency` is the link of every boundary (as
  // `simulate` applies it), not only where the run measured no pair: a 1 kB/s override gives
  // the bottleneck of that link everywhere, far above what the run's pair links give.
  BalanceOptions bo;
  bo.input = path;
  bo.stages = 4;
  bo.json_out = (dir_ / "two_nodes_slow.json").string();
  bo.link_bandwidth_GBps = 1e-6;
  bo.link_latency_us = 0;
  testing::internal::CaptureStdout();
  EXPECT_EQ(balance_command(bo), 0);
  testing::internal::GetCapturedStdout();
  balance::BalanceProblem slow = p;
  slow.pair_bandwidth_GBps.clear();
  slow.pair_latency_us.clear();
  slow.link_bandwidth_GBps = 1e-6;
  slow.link_latency_us = 0;
  const double slow_b = balance::solve_with_order(slow, 4, balance::OrderMode::rank).bottleneck_ms;
  EXPECT_DOUBLE_EQ(read(bo.json_out)["bottleneck_ms"].get<double>(), slow_b);
  EXPECT_GT(slow_b, 10 * balance::solve_with_order(p, 4, balance::OrderMode::rank).bottleneck_ms);
  // A pair of nodes without a measured rank pair takes the slowest measured pair of nodes, not
  // the default (shared-memory) link: three nodes, node03's links to node01 unmeasured.
  run.ranks[3].hostname = "node03";
  for (int a : {0, 1}) {
    run.link_latency_matrix_s[a * 4 + 3] = run.link_latency_matrix_s[3 * 4 + a] = NAN;
    run.link_bandwidth_matrix_Bps[a * 4 + 3] = run.link_bandwidth_matrix_Bps[3 * 4 + a] = NAN;
  }
  const balance::PairLinks three = balance::node_pair_links(run);
  // Measured: node01-node02 (median 1.15e8), node02-node03 (ranks 2-3: 9e9, its one pair).
  EXPECT_DOUBLE_EQ(three.bandwidth_Bps[2 * 4 + 3], 9e9);
  EXPECT_DOUBLE_EQ(three.bandwidth_Bps[0 * 4 + 2], 1.15e8);
  EXPECT_DOUBLE_EQ(three.bandwidth_Bps[0 * 4 + 3], 1.15e8);  // unmeasured: the slowest measured pair of nodes
  EXPECT_DOUBLE_EQ(three.bandwidth_Bps[3 * 4 + 1], 1.15e8);
  EXPECT_DOUBLE_EQ(three.latency_s[3 * 4 + 1], 6e-5);  // the largest measured latency between nodes (ranks 0-2, 1-2)
}

/// For each objective, the problem built from the run's in-memory record (what `run` solves on
/// rank 0) equals the one `ppbench balance FILE.h5` rebuilds from the file, field for field, and
/// gives the same bottleneck bit for bit; the transfers scale with the objective (regression:
/// the run charged every boundary a whole group's activations and G+1 messages whatever the
/// objective, so with --objective decode it balanced one decode step against a group's transfers).
TEST_F(OfflineTest, RunAndOfflineBalanceSolveTheSameProblem) {
  for (const char* name : {"workload", "decode", "prefill"}) {
    RunRecord run = make_run();
    run.workload.objective = name;
    run.workload.prompt_len = 16;  // B = 1, G = 1 as make_run's tables
    run.link_latency_s = 7e-6;
    run.link_bandwidth_Bps = 3.3e9;
    run.ranks[0].memory_limit_bytes = 1'000'000;
    run.ranks[1].memory_limit_bytes = 2'000'000;
    const std::string path = (dir_ / (std::string(name) + ".h5")).string();
    write_results(path, run);
    const balance::Objective o = balance::parse_objective(name);
    const balance::BalanceProblem in_run = balance::problem_from_run(run, o);
    const balance::BalanceProblem offline = load_balance_problem(path);  // the run's objective
    expect_same_problem(in_run, offline, name);
    // What each objective charges a boundary: B x tokens x hidden x 4 bytes, in messages.
    const double tokens = o == balance::Objective::workload ? 16 + 1 : o == balance::Objective::decode ? 1 : 16;
    ASSERT_EQ(in_run.activation_bytes.size(), 3u);
    EXPECT_EQ(in_run.activation_bytes[0], 1 * tokens * 64 * 4) << name;
    EXPECT_EQ(in_run.messages_per_boundary, o == balance::Objective::workload ? 2 : 1) << name;
    EXPECT_EQ(in_run.device_memory_bytes, (std::vector<int64_t>{1'000'000, 2'000'000}));
    for (const PartitionRecord& pr : run.partitions) {
      balance::Partition p;
      p.first_unit = pr.first_unit;
      p.last_unit = pr.last_unit;
      p.device_rank = pr.device_rank;
      balance::Partition q = p;
      balance::evaluate(in_run, p);
      balance::evaluate(offline, q);
      EXPECT_EQ(p.predicted_stage_ms, q.predicted_stage_ms) << name;
      EXPECT_EQ(p.bottleneck_ms, q.bottleneck_ms) << name;
    }
  }
}

/// make_split: each method gives what its solver gives, evaluated on the problem, named by the
/// method; names round-trip; a bad name or manual split is a UserError.
/// The record's dtype name gives the boundary's element size (common/dtype.h, with parse_dtype's
/// spellings); another name is refused naming the file's attribute and the valid names.
TEST(WorkloadDtype, ParsedFromTheRecordOrRefusedByName) {
  ppb::WorkloadInfo w;
  w.dtype = "bf16";
  EXPECT_EQ(balance::workload_dtype(w), ppb::DType::bf16);
  w.dtype = "fp32";
  EXPECT_EQ(ppb::dtype_bytes(balance::workload_dtype(w)), 4);
  for (const char* bad : {"f8", ""}) {
    w.dtype = bad;
    try {
      balance::workload_dtype(w);
      ADD_FAILURE() << "no error for dtype '" << bad << "'";
    } catch (const ppb::UserError& e) {
      EXPECT_NE(std::string(e.what()).find("/config/workload dtype '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("valid: f32, f16, bf16"), std::string::npos) << e.what();
    }
  }
}

TEST(MakeSplit, EachMethodEqualsItsSolver) {
  balance::BalanceProblem prob;
  prob.cost = {{1, 5, 5, 5, 5, 9}, {1, 4, 4, 4, 4, 7}, {2, 6, 6, 6, 6, 12}};
  prob.activation_bytes.assign(5, 1e6);
  prob.link_bandwidth_GBps = 1.0;
  prob.link_latency_us = 10.0;
  balance::SplitRequest req;
  req.stages = 3;
  auto evaluated = [&](balance::Partition p) {
    balance::evaluate(prob, p);
    return p;
  };
  req.method = balance::Method::uniform;
  balance::Partition got = balance::make_split(prob, req), want = evaluated(balance::solve_uniform(6, 3));
  EXPECT_EQ(got.first_unit, want.first_unit);
  EXPECT_EQ(got.predicted_stage_ms, want.predicted_stage_ms);
  EXPECT_EQ(got.solver, "uniform");
  req.method = balance::Method::seed;
  got = balance::make_split(prob, req), want = evaluated(balance::solve_seed(prob.cost[0], 3));
  EXPECT_EQ(got.first_unit, want.first_unit);
  EXPECT_EQ(got.bottleneck_ms, want.bottleneck_ms);
  EXPECT_EQ(got.solver, "seed");
  req.method = balance::Method::balanced;
  got = balance::make_split(prob, req), want = balance::solve(prob, {0, 1, 2});
  EXPECT_EQ(got.first_unit, want.first_unit);
  EXPECT_EQ(got.bottleneck_ms, want.bottleneck_ms);
  EXPECT_EQ(got.solver, "balanced");
  req.method = balance::Method::manual;
  req.manual = "1,4,1";
  got = balance::make_split(prob, req);
  EXPECT_EQ(got.first_unit, (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(got.device_rank, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(got.bottleneck_ms, evaluated(got).bottleneck_ms);
  req.manual = "1,4";
  EXPECT_THROW(balance::make_split(prob, req), UserError);
  for (auto m : {balance::Method::uniform, balance::Method::seed, balance::Method::balanced, balance::Method::manual})
    EXPECT_EQ(balance::parse_method(balance::method_name(m)), m);
  EXPECT_THROW(balance::parse_method("greedy"), UserError);
}

TEST(Objective, CostsTokensMessagesAndNames) {
  using balance::Objective;
  EXPECT_EQ(balance::objective_cost(Objective::workload, 2.0, 0.5, 4), 4.0);
  EXPECT_EQ(balance::objective_cost(Objective::decode, 2.0, 0.5, 4), 0.5);
  EXPECT_EQ(balance::objective_cost(Objective::prefill, 2.0, 0.5, 4), 2.0);
  EXPECT_EQ(balance::objective_tokens(Objective::workload, 16, 4), 20);
  EXPECT_EQ(balance::objective_tokens(Objective::decode, 16, 4), 1);
  EXPECT_EQ(balance::objective_tokens(Objective::prefill, 16, 4), 16);
  EXPECT_EQ(balance::objective_messages(Objective::workload, 4), 5);
  EXPECT_EQ(balance::objective_messages(Objective::decode, 4), 1);
  for (Objective o : {Objective::workload, Objective::decode, Objective::prefill})
    EXPECT_EQ(balance::parse_objective(balance::objective_name(o)), o);
  try {
    balance::parse_objective("latency");
    ADD_FAILURE() << "no throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--objective 'latency' is unknown; valid: workload, decode, prefill"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace ppb

namespace ppb {
namespace {

/// One memory model: the balancer, fed the backend's per-unit bytes and the ranks' limits net of
/// the largest stage's scratch (problem_from_run, as `run` does), never returns a split that
/// the run's memory check (the backend's stage_bytes of the whole stage: weights + KV cache +
/// scratch, against the rank's limit) refuses — over real and tiny configs (tied embeddings,
/// sliding windows, a large vocabulary), workloads and limits from generous to infeasible.
TEST(MemoryModel, BalancerNeverReturnsASplitTheMemoryCheckRefuses) {
  const std::unique_ptr<Device> cpu = create_cpu_device(1);
  std::mt19937 gen(7);
  int checked = 0, infeasible = 0;
  for (const char* path : {PPB_SOURCE_DIR "/tests/data/tiny-llama.json", PPB_SOURCE_DIR "/tests/data/tiny-gemma3.json",
                           PPB_MODELS_DIR "/qwen3-0.6b.json", PPB_MODELS_DIR "/gemma-3-1b-it.json"}) {
    const model::ModelSpec spec = model::load_model_config(path);
    const int U = spec.num_units();
    for (int trial = 0; trial < 12; ++trial) {
      const int S = 2 + trial % 3, M = 1 + trial % 2;
      StageConfig cfg;
      cfg.work.batch = 1 + trial % 4;
      cfg.work.prompt_len = cfg.work.gen_len = 4 << (trial % 4);  // KV capacity 8 << (trial % 4)
      cfg.work.groups = M;
      RunRecord run;
      run.workload = {cfg.work.batch, cfg.work.prompt_len, cfg.work.gen_len, M, "f32", 0, 1, 0, 1, true, 1, "workload"};
      run.model_attrs_num = {{"hidden_size", spec.hidden}};
      run.link_bandwidth_Bps = 1e9;
      int64_t total = 0;
      for (int u = 0; u < U; ++u) {
        const StageBytes b = cpu->stage_bytes(spec, u, u, cfg);
        run.profile.unit_name.push_back(spec.units[u].name);
        run.profile.unit_weight_bytes.push_back(static_cast<int64_t>(b.weights));
        run.profile.unit_kv_bytes.push_back(static_cast<int64_t>(b.kv_cache));
        total += static_cast<int64_t>(b.weights + b.kv_cache);
      }
      std::uniform_real_distribution<double> ms(0.5, 2.0);
      for (int r = 0; r < S; ++r)
        for (int u = 0; u < U; ++u) run.profile.latency_ms.insert(run.profile.latency_ms.end(), {ms(gen), ms(gen)});
      const int64_t scratch = static_cast<int64_t>(cpu->stage_bytes(spec, 0, U - 1, cfg).scratch);
      // Limits from 0.3x to 2x of an even share of the model, plus the scratch reserve.
      std::uniform_real_distribution<double> share(0.3, 2.0);
      for (int r = 0; r < S; ++r)
        run.ranks.push_back({"n", "cpu", "", r, 0.0, static_cast<int64_t>(share(gen) * total / S) + scratch, scratch});
      const balance::BalanceProblem prob = balance::problem_from_run(run, balance::Objective::workload);
      balance::Partition p;
      try {
        p = balance::solve_with_order(prob, S, balance::OrderMode::rank);
      } catch (const UserError&) {
        ++infeasible;  // no split fits: the run stops before building anything
        continue;
      }
      for (int k = 0; k < S; ++k) {
        const StageBytes b = cpu->stage_bytes(spec, p.first_unit[k], p.last_unit[k], cfg);
        EXPECT_LE(static_cast<int64_t>(b.total()), run.ranks[p.device_rank[k]].memory_limit_bytes)
            << path << " trial " << trial << " stage " << k << " split " << p.counts_string();
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);     // feasible cases were checked...
  EXPECT_GT(infeasible, 0);   // ...and tight limits were tried
}

}  // namespace
}  // namespace ppb
