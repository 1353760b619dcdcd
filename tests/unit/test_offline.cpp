// Unit tests of the offline commands (src/runtime/offline_commands) and the memory report
// (src/balance/memory_report): latency JSON parsing and its error messages, the --json output
// of `ppbench balance`, manual and uniform splits, and per-stage KV capacity.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "balance/memory_report.h"
#include "common/error.h"
#include "runtime/offline_commands.h"

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
