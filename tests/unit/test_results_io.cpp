// Unit tests of src/results/reader and report: a RunRecord written by write_results reads back
// field for field; files that are not HDF5, not ppbench or incomplete are refused with a
// UserError naming the path; the comparison table and its CSV have the documented columns.
// And append_results: a snapshot grown round by round holds the record's rows exactly, as
// write_results stores them.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "results/h5.h"
#include "results/reader.h"
#include "results/report.h"
#include "results/summary.h"
#include "results/writer.h"
#include "stepcost/step_model.h"

namespace {

using ppb::PartitionRecord;
using ppb::RunRecord;
using ppb::UserError;

// A small but complete record: 2 ranks, U=4 units, S=2 stages, iters=2, M=2, G=1, B=1.
RunRecord make_record() {
  RunRecord r;
  r.ppbench_version = "0.1.0+test";
  r.created_utc = "2025-01-02T03:04:05Z";
  r.command_line = "ppbench run --model m.json -o x.h5";
  r.backend = "cpu";
  r.transport = "mpi";
  r.mpi_version = "Open MPI v4.1.4";
  r.slurm_job_id = "42";
  r.slurm_job_name = "ppbench-cpu";
  r.slurm_nodelist = "node[01-02]";
  r.slurm_array_task_id = "3";
  r.environment = {{"OMP_NUM_THREADS", "1"}, {"NCCL_DEBUG", "INFO"}};
  r.library_versions = {{"openblas", "0.3.21"}, {"nccl", "2.21.5"}};
  r.world_size = 2;
  r.elapsed_s = 12.5;
  r.model_source = "inputs/models/qwen3-0.6b.json";
  r.model_config_json = "{\"model_type\": \"qwen3\"}";
  r.model_attrs_str = {{"architecture", "Qwen3ForCausalLM"}, {"model_type", "qwen3"}};
  r.model_attrs_num = {{"hidden_size", 1024}, {"num_hidden_layers", 2}, {"total_params", 6e8}};
  r.workload = {1, 4, 1, 2, "f32", 1, 2, 0, 3, true, 7, "workload", 5.0, 120.0, true, "alone+together"};
  r.ranks = {{"node01", "Xeon", "", 0, 0.0}, {"node02", "Xeon", "0000:3b:00.0", 1, 1.5e-6}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.link_latency_matrix_s = {nan, 6e-6, 6e-6, nan};
  r.link_bandwidth_matrix_Bps = {nan, 1.2e8, 1.2e8, nan};
  r.ranks[0].read_bandwidth_GBps = 12.5;
  r.ranks[0].read_bandwidth_shared_GBps = 9.5;
  r.ranks[0].peak_gflops = 140.0;
  r.ranks[1].read_bandwidth_GBps = 4800.0;
  r.ranks[1].read_bandwidth_shared_GBps = 4700.0;
  r.ranks[1].peak_gflops = 7.5e5;
  r.ranks[0].cpu_affinity = "0-3,8";
  r.ranks[0].cpu_governor = "performance";
  r.ranks[0].compute_threads = 4;
  r.ranks[1].cpu_affinity = "0";
  r.ranks[1].cpu_quota_cores = 0.5;
  r.ranks[1].cpu_quota_period_ms = 2.0;
  r.ranks[1].cpu_quota_cgroup = "/sys/fs/cgroup/cpu/ppbench_quota_1591";
  r.ranks[1].cpu_quota_cgroup_id = "35:4021";
  // Its own quota inside a container's 2 cores (a directory name with a quote, a ';' and a space).
  r.ranks[1].cpu_quota_levels = {{"35:4021", 0.5, "/sys/fs/cgroup/cpu/ppbench_quota_1591"},
                                 {"35:12", 2.0, "/sys/fs/cgroup/cpu/docker/a \"b\";c"}};
  r.ranks[1].compute_threads = 1;
  r.ranks[0].machine_id = "3f1c2d9e-0000-4000-8000-00000000abcd";
  r.ranks[1].machine_id = "host:gpu-node-7";
  auto& p = r.profile;
  p.unit_name = {"embed", "layer.0", "layer.1", "head"};
  p.unit_signature = {0, 1, 1, 2};
  p.signature_name = {"embed", "layer", "head"};
  for (int i = 0; i < 2 * 4 * 2; ++i) {
    p.latency_ms.push_back(1.0 + i);
    p.latency_min_ms.push_back(0.5 + i);
    p.latency_max_ms.push_back(2.0 + i);
    p.latency_alone_ms.push_back(0.9 + i);
  }
  r.workload.profile_repeats = 2;  // two cycles around each table
  r.workload.profile_order = "interleaved";
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 2 * 4 * 2; ++i) {
      p.latency_cycles_ms.push_back(1.0 + i + (k ? 0.1 : -0.1));
      p.latency_alone_cycles_ms.push_back(0.9 + i + (k ? 0.2 : -0.2));
    }
  for (int k = 0; k < 3; ++k)  // three cycles between rounds, after rounds 2, 4 and 7
    for (int i = 0; i < 2 * 4 * 2; ++i) p.latency_rounds_ms.push_back(1.05 + i + 0.01 * k);
  p.latency_rounds_after = {2, 4, 7};
  p.decode_contexts = {4, 5};
  for (int i = 0; i < 2 * 4 * 2; ++i) p.decode_context_ms.push_back(0.25 * i);
  for (int i = 0; i < 2 * 4; ++i) p.cost_ms.push_back(3.0 * i);
  p.unit_params = {100, 200, 200, 300};
  p.unit_weight_bytes = {400, 800, 800, 1200};
  p.unit_kv_bytes = {0, 64, 64, 0};
  p.unit_flops = {0.0, 0.0, 1e6, 2e5, 1e6, 2e5, 3e5, 3e5};
  p.unit_bytes = {512, 1024, 900, 860, 900, 860, 1300, 1300};
  for (int i = 0; i < 2 * 4 * 2; ++i) p.floor_ms.push_back(0.125 * (i + 1));
  // The width axis (issue 14): ranks 0..1 profiled together at width 2.
  ppb::ProfileTable::TpGroupProfile tpg;
  tpg.first_rank = 0;
  tpg.width = 2;
  for (int i = 0; i < 4 * 2; ++i) {
    tpg.latency_ms.push_back(0.5 + i);
    tpg.latency_min_ms.push_back(0.25 + i);
    tpg.latency_max_ms.push_back(0.75 + i);
  }
  // The step model's grid (issue 47) on both ranks and on the width-2 group (/profile/tp step_ms).
  {
    ppb::stepcost::GridSpec spec;
    spec.max_rows = 2, spec.max_tokens = 4, spec.max_context = 6, spec.contexts = {4, 5};
    const ppb::stepcost::FlatGrid f = ppb::stepcost::flatten(ppb::stepcost::plan_grid(spec));
    p.step_rows = f.rows, p.step_pos = f.pos, p.step_tokens = f.tokens, p.step_role = f.role;
    p.step_by_rows = {0, 0, 1};
    p.step_attempts = 2;
    const std::size_t N = f.rows.size();
    for (std::size_t i = 0; i < 2 * 3 * N; ++i) p.step_ms.push_back(0.5 + 0.01 * static_cast<double>(i));
    for (std::size_t i = 0; i < 3 * N; ++i) tpg.step_ms.push_back(0.3 + 0.02 * static_cast<double>(i));
    tpg.step_attempts = 3;
    // A forward's fixed cost's pairs [2 ranks][2 kinds][18]: 2·one - two = 0.15 x (kind + 1) on rank 1.
    p.fixed_unit = 1;
    const int K = ppb::stepcost::kFixedCostSamples;
    for (int i = 0; i < 2 * 2 * K; ++i) {
      const int r = i / (2 * K), kind = i / K % 2;
      p.fixed_one_ms.push_back(1.0 + 0.001 * i);
      p.fixed_two_ms.push_back(2 * p.fixed_one_ms.back() - (r == 1 ? 0.15 * (kind + 1) : 0.0));
    }
  }
  p.tp.push_back(tpg);
  r.tp_auto_layout = "2";
  r.run_start_s = 0.0;  // never stored

  for (const char* name : {"uniform", "balanced"}) {  // run order differs from name order
    PartitionRecord pr;
    pr.name = name;
    pr.solver = name;
    pr.same_as = std::string(name) == "balanced" ? "uniform" : "";  // the same split, measured once
    pr.first_unit = {0, 2};
    pr.last_unit = {1, 3};
    pr.device_rank = {0, 1};
    pr.tp_width = {1, 1};
    if (std::string(name) == "uniform") {  // a layout of widths 1,2 (a third rank would hold stage 1's second shard)
      pr.tp_width = {1, 2};
      pr.layout = "1,2";
    }
    pr.predicted_stage_ms = {10.0, 12.0};
    pr.predicted_phase_ms = {5.0, 2.5, 6.0, 3.0};
    pr.predicted_stage_rounds_ms = {10.5, 12.25};
    pr.predicted_phase_rounds_ms = {5.25, 2.625, 6.125, 3.0625};
    pr.predicted_stage_cross_ms = {10.25, 12.5};
    pr.predicted_phase_cross_ms = {5.125, 2.5625, 6.25, 3.125};
    pr.cross_calibrated_by = std::string(name) == "uniform" ? "balanced" : "uniform";
    pr.stage_weight_bytes = {1200, 2000};
    pr.stage_kv_bytes = {64, 64};
    pr.stage_floor_ms = {4.0, 5.0};
    pr.stage_floor_phase_ms = {2.0, 1.0, 2.5, 1.25};
    pr.predicted_bottleneck_ms = 12.0;
    pr.measured = true;
    for (int i = 0; i < 2 * 2 * 2 * 2 * 6; ++i) pr.events.push_back(i == 0 ? NAN : 0.001 * i);
    pr.stage_compute_ms = {5.5, 2.6, 6.5, 3.5};
    pr.stage_compute_mean_ms = {5.75, 2.8, 6.625, 3.75};
    pr.measured_stage_mean_ms = {11.35, 13.375};
    pr.stage_workload_ms = {8.1, 10.0};
    pr.bubble_fraction = {0.4, std::string(name) == "uniform" ? 0.1 : 0.2};
    pr.recv_wait_ms = {0.0, 1.0};
    pr.rep_wall_s = {0.02, 0.021};
    pr.rep_tokens_per_s = {100.0, 95.0};
    pr.rep_decode_tokens_per_s = {150.0, NAN};
    pr.rep_ttft_p50_ms = {8.0, 8.5};
    pr.rep_tpot_p50_ms = {3.0, 3.25};
    if (std::string(name) == "balanced") {
      pr.gain = ppb::PairedComparison{117.0 / 97.5, 1.1, 1.3, 2};  // the ratio is stored as balance_gain
      pr.decode_gain = ppb::PairedComparison{1.0, NAN, NAN, 1};
      pr.gain_verdict = "faster";
      pr.decode_gain_verdict = "too few repetitions";
    }
    pr.lane_cpu_s = {0.1, 0.01, 0.01, 0.2, 0.02, 0.02};
    pr.timed_wall_s = 0.041;
    pr.bottleneck_stage = 1;
    const double tps = std::string(name) == "uniform" ? 97.5 : 117.0;
    pr.metrics = {{"tokens_per_s", tps}, {"decode_tokens_per_s", 150.0}, {"ttft_p50_ms", 8.0},
                  {"ttft_p99_ms", 9.0}, {"tpot_p50_ms", 3.0}, {"tpot_p99_ms", 4.0},
                  {"pipeline_efficiency", 0.9}};
    pr.tokens = {1, 2, 3, 4};
    pr.reference_tokens = {1, 2, 3, 4};
    pr.checksum = pr.reference_checksum = 1.25;
    pr.tokens_match = pr.checksum_match = true;
    r.partitions.push_back(pr);
  }
  r.validation_ok = true;
  r.validation = "ok";
  r.balance_gain = 117.0 / 97.5;
  r.decode_balance_gain = 1.0;
  r.balance_cmp = ppb::PairedComparison{117.0 / 97.5, 1.1, 1.3, 2};
  r.decode_balance_cmp = ppb::PairedComparison{1.0, NAN, NAN, 1};
  r.balance_verdict = "faster";
  r.decode_balance_verdict = "too few repetitions";
  r.schedule = "interleaved, stages resident";
  r.rounds = 2;
  r.stop_reason = "--iters rounds done (--target-ci 0)";
  r.round_gap_s = {0.004, 0.0045};
  return r;
}

// NaN-aware equality of double vectors.
void expect_same(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]))
      EXPECT_TRUE(std::isnan(b[i])) << what << "[" << i << "]";
    else
      EXPECT_EQ(a[i], b[i]) << what << "[" << i << "]";
  }
}

class ResultsIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ppb_test_results_XXXXXX";
    int fd = mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    close(fd);
    path_ = std::string(tmpl) + ".h5";
    std::rename(tmpl, path_.c_str());
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_;
};

TEST_F(ResultsIoTest, RoundTripEveryField) {
  const RunRecord w = make_record();
  ppb::write_results(path_, w);
  const RunRecord r = ppb::read_results(path_);

  EXPECT_EQ(r.ppbench_version, w.ppbench_version);
  EXPECT_EQ(r.created_utc, w.created_utc);
  EXPECT_EQ(r.command_line, w.command_line);
  EXPECT_EQ(r.backend, w.backend);
  EXPECT_EQ(r.transport, w.transport);
  EXPECT_EQ(r.mpi_version, w.mpi_version);
  EXPECT_EQ(r.hdf5_version, ppb::hdf5_version());
  EXPECT_EQ(r.library_versions, w.library_versions);
  EXPECT_EQ(r.slurm_job_id, w.slurm_job_id);
  EXPECT_EQ(r.slurm_job_name, w.slurm_job_name);
  EXPECT_EQ(r.slurm_nodelist, w.slurm_nodelist);
  EXPECT_EQ(r.slurm_array_task_id, w.slurm_array_task_id);
  EXPECT_EQ(r.environment, w.environment);
  EXPECT_EQ(r.world_size, w.world_size);
  EXPECT_EQ(r.elapsed_s, w.elapsed_s);
  EXPECT_EQ(r.model_source, w.model_source);
  EXPECT_EQ(r.model_config_json, w.model_config_json);
  EXPECT_EQ(r.model_attrs_str, w.model_attrs_str);
  EXPECT_EQ(r.model_attrs_num, w.model_attrs_num);
  EXPECT_EQ(r.validation_ok, w.validation_ok);
  EXPECT_EQ(r.validation, w.validation);
  EXPECT_EQ(r.balance_gain, w.balance_gain);
  EXPECT_EQ(r.decode_balance_gain, w.decode_balance_gain);
  for (const auto& [a, b] : {std::pair{r.balance_cmp, w.balance_cmp}, std::pair{r.decode_balance_cmp, w.decode_balance_cmp}}) {
    EXPECT_EQ(a.n, b.n);
    expect_same({a.ratio, a.ci_low, a.ci_high}, {b.ratio, b.ci_low, b.ci_high}, "balance comparison");
  }
  EXPECT_EQ(r.balance_verdict, w.balance_verdict);
  EXPECT_EQ(r.decode_balance_verdict, w.decode_balance_verdict);
  EXPECT_EQ(r.schedule, w.schedule);
  EXPECT_EQ(r.rounds, w.rounds);
  EXPECT_EQ(r.stop_reason, w.stop_reason);
  EXPECT_EQ(r.round_gap_s, w.round_gap_s);

  const auto &a = w.workload, &b = r.workload;
  EXPECT_EQ(b.batch, a.batch);
  EXPECT_EQ(b.prompt_len, a.prompt_len);
  EXPECT_EQ(b.gen_len, a.gen_len);
  EXPECT_EQ(b.microbatches, a.microbatches);
  EXPECT_EQ(b.dtype, a.dtype);
  EXPECT_EQ(b.warmup, a.warmup);
  EXPECT_EQ(b.iters, a.iters);
  EXPECT_EQ(b.profile_warmup, a.profile_warmup);
  EXPECT_EQ(b.profile_iters, a.profile_iters);
  EXPECT_EQ(b.overlap, a.overlap);
  EXPECT_EQ(b.seed, a.seed);
  EXPECT_EQ(b.objective, a.objective);
  EXPECT_EQ(b.target_ci_pct, a.target_ci_pct);
  EXPECT_EQ(b.max_time_s, a.max_time_s);
  EXPECT_EQ(b.cuda_graphs, a.cuda_graphs);  // written true: not the reader's default (older files)
  EXPECT_EQ(b.profile_passes, a.profile_passes);
  EXPECT_EQ(b.profile_repeats, a.profile_repeats);
  EXPECT_EQ(b.profile_order, a.profile_order);

  ASSERT_EQ(r.ranks.size(), w.ranks.size());
  for (size_t i = 0; i < w.ranks.size(); ++i) {
    EXPECT_EQ(r.ranks[i].hostname, w.ranks[i].hostname);
    for (size_t j = 0; j < w.ranks.size(); ++j) {  // the link matrix, NaN on the diagonal
      const size_t k = i * w.ranks.size() + j;
      EXPECT_TRUE(r.link_latency_matrix_s[k] == w.link_latency_matrix_s[k] || (i == j && std::isnan(r.link_latency_matrix_s[k])));
      EXPECT_TRUE(r.link_bandwidth_matrix_Bps[k] == w.link_bandwidth_matrix_Bps[k] ||
                  (i == j && std::isnan(r.link_bandwidth_matrix_Bps[k])));
    }
    EXPECT_EQ(r.ranks[i].device_name, w.ranks[i].device_name);
    EXPECT_EQ(r.ranks[i].bus_id, w.ranks[i].bus_id);
    EXPECT_EQ(r.ranks[i].local_rank, w.ranks[i].local_rank);
    EXPECT_EQ(r.ranks[i].clock_offset_s, w.ranks[i].clock_offset_s);
    EXPECT_EQ(r.ranks[i].read_bandwidth_GBps, w.ranks[i].read_bandwidth_GBps);
    EXPECT_EQ(r.ranks[i].read_bandwidth_shared_GBps, w.ranks[i].read_bandwidth_shared_GBps);
    EXPECT_EQ(r.ranks[i].peak_gflops, w.ranks[i].peak_gflops);
    EXPECT_EQ(r.ranks[i].cpu_affinity, w.ranks[i].cpu_affinity);
    EXPECT_EQ(r.ranks[i].cpu_governor, w.ranks[i].cpu_governor);
    EXPECT_EQ(r.ranks[i].compute_threads, w.ranks[i].compute_threads);
    EXPECT_EQ(r.ranks[i].machine_id, w.ranks[i].machine_id);
    EXPECT_EQ(r.ranks[i].cpu_quota_cgroup, w.ranks[i].cpu_quota_cgroup);
    EXPECT_EQ(r.ranks[i].cpu_quota_cgroup_id, w.ranks[i].cpu_quota_cgroup_id);
    EXPECT_EQ(r.ranks[i].cpu_quota_levels, w.ranks[i].cpu_quota_levels);
    EXPECT_EQ(rank_machine(r.ranks[i]), w.ranks[i].machine_id);
    if (std::isnan(w.ranks[i].cpu_quota_cores)) {
      EXPECT_TRUE(std::isnan(r.ranks[i].cpu_quota_cores));
      EXPECT_TRUE(std::isnan(r.ranks[i].cpu_quota_period_ms));
    } else {
      EXPECT_EQ(r.ranks[i].cpu_quota_cores, w.ranks[i].cpu_quota_cores);
      EXPECT_EQ(r.ranks[i].cpu_quota_period_ms, w.ranks[i].cpu_quota_period_ms);
    }
  }

  const auto &pw = w.profile, &pr = r.profile;
  EXPECT_EQ(pr.unit_name, pw.unit_name);
  EXPECT_EQ(pr.unit_signature, pw.unit_signature);
  EXPECT_EQ(pr.signature_name, pw.signature_name);
  expect_same(pr.latency_ms, pw.latency_ms, "latency_ms");
  expect_same(pr.latency_min_ms, pw.latency_min_ms, "latency_min_ms");
  expect_same(pr.latency_max_ms, pw.latency_max_ms, "latency_max_ms");
  expect_same(pr.latency_alone_ms, pw.latency_alone_ms, "latency_alone_ms");
  expect_same(pr.latency_cycles_ms, pw.latency_cycles_ms, "latency_cycles_ms");
  expect_same(pr.latency_alone_cycles_ms, pw.latency_alone_cycles_ms, "latency_alone_cycles_ms");
  expect_same(pr.latency_rounds_ms, pw.latency_rounds_ms, "latency_rounds_ms");
  EXPECT_EQ(pr.latency_rounds_after, pw.latency_rounds_after);
  EXPECT_EQ(pr.decode_contexts, pw.decode_contexts);
  expect_same(pr.decode_context_ms, pw.decode_context_ms, "decode_context_ms");
  expect_same(pr.cost_ms, pw.cost_ms, "cost_ms");
  EXPECT_EQ(pr.unit_params, pw.unit_params);
  EXPECT_EQ(pr.unit_weight_bytes, pw.unit_weight_bytes);
  EXPECT_EQ(pr.unit_kv_bytes, pw.unit_kv_bytes);
  expect_same(pr.unit_flops, pw.unit_flops, "unit_flops");
  expect_same(pr.unit_bytes, pw.unit_bytes, "unit_bytes");
  expect_same(pr.floor_ms, pw.floor_ms, "floor_ms");
  ASSERT_EQ(pr.tp.size(), 1u);
  EXPECT_EQ(pr.tp[0].first_rank, 0);
  EXPECT_EQ(pr.tp[0].width, 2);
  expect_same(pr.tp[0].latency_ms, pw.tp[0].latency_ms, "tp latency_ms");
  expect_same(pr.tp[0].latency_min_ms, pw.tp[0].latency_min_ms, "tp latency_min_ms");
  expect_same(pr.tp[0].latency_max_ms, pw.tp[0].latency_max_ms, "tp latency_max_ms");
  EXPECT_EQ(pr.step_rows, pw.step_rows);
  EXPECT_EQ(pr.step_pos, pw.step_pos);
  EXPECT_EQ(pr.step_tokens, pw.step_tokens);
  EXPECT_EQ(pr.step_role, pw.step_role);
  EXPECT_EQ(pr.step_by_rows, pw.step_by_rows);
  EXPECT_EQ(pr.step_attempts, 2);
  expect_same(pr.step_ms, pw.step_ms, "step_ms");
  expect_same(pr.tp[0].step_ms, pw.tp[0].step_ms, "tp step_ms");
  EXPECT_EQ(pr.tp[0].step_attempts, 3);
  EXPECT_EQ(pr.fixed_unit, 1);
  expect_same(pr.fixed_one_ms, pw.fixed_one_ms, "fixed_one_ms");
  expect_same(pr.fixed_two_ms, pw.fixed_two_ms, "fixed_two_ms");
  {  // the estimates beside the pairs, for h5py: rank 1's F = 0.15, 0.3 ms (taken: >= 10% of ~1.05 ms), rank 0's 0
    auto g = ppb::h5::File::open(path_).root().open_group("profile/step_model");
    const auto f = g.open_dataset("fixed_ms").read<double>();
    const auto taken = g.open_dataset("fixed_taken").read<int64_t>();
    ASSERT_EQ(f.size(), 4u);
    ASSERT_EQ(taken.size(), 4u);
    const double want[4] = {0.0, 0.0, 0.15, 0.3};
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], want[i], 1e-12) << i;
    EXPECT_EQ(taken, (std::vector<int64_t>{0, 0, 1, 1}));
    EXPECT_EQ(g.get_attr<int64_t>("fixed_unit"), 1);
  }
  EXPECT_EQ(r.tp_auto_layout, "2");

  ASSERT_EQ(r.partitions.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto &x = w.partitions[i], &y = r.partitions[i];
    SCOPED_TRACE(x.name);
    EXPECT_EQ(y.name, x.name);  // run order, not HDF5's name order
    EXPECT_EQ(y.solver, x.solver);
    EXPECT_EQ(y.same_as, x.same_as);
    EXPECT_EQ(y.first_unit, x.first_unit);
    EXPECT_EQ(y.last_unit, x.last_unit);
    EXPECT_EQ(y.device_rank, x.device_rank);
    EXPECT_EQ(y.tp_width, x.tp_width);
    EXPECT_EQ(y.layout, x.layout);
    expect_same(y.predicted_stage_ms, x.predicted_stage_ms, "predicted_stage_ms");
    expect_same(y.predicted_phase_ms, x.predicted_phase_ms, "predicted_phase_ms");
    expect_same(y.predicted_stage_rounds_ms, x.predicted_stage_rounds_ms, "predicted_stage_rounds_ms");
    expect_same(y.predicted_phase_rounds_ms, x.predicted_phase_rounds_ms, "predicted_phase_rounds_ms");
    expect_same(y.predicted_stage_cross_ms, x.predicted_stage_cross_ms, "predicted_stage_cross_ms");
    expect_same(y.predicted_phase_cross_ms, x.predicted_phase_cross_ms, "predicted_phase_cross_ms");
    EXPECT_EQ(y.cross_calibrated_by, x.cross_calibrated_by);
    EXPECT_EQ(y.stage_weight_bytes, x.stage_weight_bytes);
    EXPECT_EQ(y.stage_kv_bytes, x.stage_kv_bytes);
    expect_same(y.stage_floor_ms, x.stage_floor_ms, "stage_floor_ms");
    expect_same(y.stage_floor_phase_ms, x.stage_floor_phase_ms, "stage_floor_phase_ms");
    EXPECT_EQ(y.predicted_bottleneck_ms, x.predicted_bottleneck_ms);
    EXPECT_EQ(y.measured, x.measured);
    expect_same(y.events, x.events, "events");
    expect_same(y.stage_compute_ms, x.stage_compute_ms, "stage_compute_ms");
    expect_same(y.stage_compute_mean_ms, x.stage_compute_mean_ms, "stage_compute_mean_ms");
    expect_same(y.measured_stage_mean_ms, x.measured_stage_mean_ms, "measured_stage_mean_ms");
    expect_same(y.stage_workload_ms, x.stage_workload_ms, "stage_workload_ms");
    expect_same(y.bubble_fraction, x.bubble_fraction, "bubble_fraction");
    expect_same(y.recv_wait_ms, x.recv_wait_ms, "recv_wait_ms");
    expect_same(y.rep_wall_s, x.rep_wall_s, "rep_wall_s");
    expect_same(y.rep_tokens_per_s, x.rep_tokens_per_s, "rep_tokens_per_s");
    expect_same(y.rep_decode_tokens_per_s, x.rep_decode_tokens_per_s, "rep_decode_tokens_per_s");
    expect_same(y.rep_ttft_p50_ms, x.rep_ttft_p50_ms, "rep_ttft_p50_ms");
    expect_same(y.rep_tpot_p50_ms, x.rep_tpot_p50_ms, "rep_tpot_p50_ms");
    for (const auto& [a, b] : {std::pair{y.gain, x.gain}, std::pair{y.decode_gain, x.decode_gain}}) {
      EXPECT_EQ(a.n, b.n);
      expect_same({a.ratio, a.ci_low, a.ci_high}, {b.ratio, b.ci_low, b.ci_high}, "gain vs uniform");
    }
    EXPECT_EQ(y.gain_verdict, x.gain_verdict);
    EXPECT_EQ(y.decode_gain_verdict, x.decode_gain_verdict);
    expect_same(y.lane_cpu_s, x.lane_cpu_s, "lane_cpu_s");
    EXPECT_EQ(y.timed_wall_s, x.timed_wall_s);
    EXPECT_EQ(y.bottleneck_stage, x.bottleneck_stage);
    EXPECT_EQ(y.metrics, x.metrics);
    EXPECT_EQ(y.tokens, x.tokens);
    EXPECT_EQ(y.reference_tokens, x.reference_tokens);
    EXPECT_EQ(y.checksum, x.checksum);
    EXPECT_EQ(y.reference_checksum, x.reference_checksum);
    EXPECT_EQ(y.tokens_match, x.tokens_match);
    EXPECT_EQ(y.checksum_match, x.checksum_match);
    EXPECT_EQ(y.tokens_match_first_partition, x.tokens_match_first_partition);
  }
}

/// Files before /ranks/machine_id: one machine per hostname, the id MpiContext falls back to.
TEST(RankMachine, FilesWithoutAMachineIdTakeOneMachinePerHostname) {
  ppb::RankInfo a, b;
  a.hostname = b.hostname = "node3";
  EXPECT_EQ(ppb::rank_machine(a), "host:node3");
  EXPECT_EQ(ppb::rank_machine(a), ppb::rank_machine(b));
  b.hostname = "node4";
  EXPECT_NE(ppb::rank_machine(a), ppb::rank_machine(b));
  a.machine_id = b.machine_id = "0b5e";  // two namespaces of one kernel
  EXPECT_EQ(ppb::rank_machine(a), ppb::rank_machine(b));
}

/// The reader of a file without /ranks/machine_id (files before it): empty ids, so that
/// rank_machine takes the hostname.
TEST_F(ResultsIoTest, FileWithoutMachineIdReadsEmptyIds) {
  ppb::write_results(path_, make_record());
  {
    const hid_t f = H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    ASSERT_GE(H5Ldelete(f, "/ranks/machine_id", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(f, "/ranks/cpu_quota_cgroup", H5P_DEFAULT), 0);  // and files before the quota's cgroup
    ASSERT_GE(H5Ldelete(f, "/ranks/cpu_quota_cgroup_id", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(f, "/ranks/cpu_quota_levels", H5P_DEFAULT), 0);
    H5Fclose(f);
  }
  const RunRecord r = ppb::read_results(path_);
  ASSERT_FALSE(r.ranks.empty());
  for (const auto& rank : r.ranks) {
    EXPECT_TRUE(rank.cpu_quota_levels.empty());
    EXPECT_EQ(rank.cpu_quota_cgroup, "");
    EXPECT_EQ(rank.cpu_quota_cgroup_id, "");
    EXPECT_EQ(rank.machine_id, "");
    EXPECT_EQ(ppb::rank_machine(rank), "host:" + rank.hostname);
  }
}

/// The file's efficiency is floor / latency element by element (the alone pass's latency: the
/// record has two passes, and the floors use the ceilings alone), and the summary's floor and eff
/// columns are the partition's stage_floor_ms and stage_floor_ms / measured (here the
/// stage_workload_ms fallback: 4.0 / 8.1 = 49%, 5.0 / 10.0 = 50%), and the ceilings line
/// repeats /ranks.
TEST_F(ResultsIoTest, FloorsEfficiencyAndSummaryAgree) {
  const RunRecord w = make_record();
  ppb::write_results(path_, w);
  {
    auto f = ppb::h5::File::open(path_);
    const auto eff = f.root().open_group("profile").open_dataset("efficiency").read<double>();
    ASSERT_EQ(eff.size(), w.profile.floor_ms.size());
    ASSERT_EQ(w.profile.latency_alone_ms.size(), eff.size());
    for (size_t i = 0; i < eff.size(); ++i) EXPECT_DOUBLE_EQ(eff[i], w.profile.floor_ms[i] / w.profile.latency_alone_ms[i]);
  }
  std::ostringstream out;
  ppb::print_summary(out, ppb::read_results(path_));
  const std::string text = out.str();
  EXPECT_NE(text.find("ceilings (read GB/s alone / all ranks reading, GEMM GFLOP/s): rank 0 12.5 / 9.5, 140; rank 1 "
                      "4800.0 / 4700.0, 750000"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("   10.00      8.10  -19.0%      4.00   49%"), std::string::npos) << text;
  EXPECT_NE(text.find("   12.00     10.00  -16.7%      5.00   50%"), std::string::npos) << text;
}

/// A stage measured outside the profile's spread for it is flagged in the file and the summary,
/// and the balance gain is qualified; one inside is not.
TEST_F(ResultsIoTest, StageOutsideTheProfilesSpreadIsSaid) {
  RunRecord w = make_record();
  w.balance_gain = 1.1;
  w.decode_balance_gain = 1.05;
  for (auto& p : w.partitions) {
    p.predicted_stage_min_ms = {9.0, 11.0};
    p.predicted_stage_max_ms = {11.0, 13.0};
    p.measured_stage_ms = {10.5, p.name == "balanced" ? 14.3 : 12.9};  // balanced stage 1: above 13
    p.same_as.clear();  // two splits, each measured (make_record's balanced shares uniform's)
  }
  EXPECT_FALSE(ppb::outside_profile_spread(w.partitions[0], 1));
  EXPECT_TRUE(ppb::outside_profile_spread(w.partitions[1], 1));
  EXPECT_FALSE(ppb::outside_profile_spread(w.partitions[1], 0));
  ppb::write_results(path_, w);
  {
    auto f = ppb::h5::File::open(path_);
    EXPECT_EQ(f.root().open_dataset("benchmark/balanced/outside_profile_spread").read<int64_t>(),
              (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(f.root().open_dataset("benchmark/uniform/outside_profile_spread").read<int64_t>(),
              (std::vector<int64_t>{0, 0}));
  }
  const RunRecord r = ppb::read_results(path_);
  ASSERT_EQ(r.partitions[1].predicted_stage_max_ms, w.partitions[1].predicted_stage_max_ms);
  std::ostringstream out;
  ppb::print_summary(out, r);
  const std::string text = out.str();
  EXPECT_NE(text.find("profile did not hold for stage 1: measured 14.30 ms, outside the spread 11.00..13.00 ms"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("profile did not hold for stage 0"), std::string::npos) << text;
  EXPECT_NE(text.find("qualified: 1 stage(s)"), std::string::npos) << text;
  // A balanced split that shares uniform's measurement (same_as) is counted once, not twice.
  RunRecord same = w;
  for (auto& p : same.partitions) p.measured_stage_ms = {10.5, 14.3};  // both above the spread
  same.partitions[1].same_as = "uniform";
  std::ostringstream out2;
  ppb::print_summary(out2, same);
  EXPECT_NE(out2.str().find("qualified: 1 stage(s)"), std::string::npos) << out2.str();
}

/// Under the balance gain, the summary says whether the profile's relative costs held: each
/// split's cross-calibrated stages (predicted from the other's measurement) against its mean
/// steps, and its simulator against its decode rate, within +-5%; a stage outside the profile's
/// spread then qualifies the verdict as the machine's state, not the split's choice.
TEST_F(ResultsIoTest, SummarySaysWhetherTheRelativeCostsHeld) {
  RunRecord w = make_record();
  w.balance_gain = 1.1;
  w.decode_balance_gain = 1.05;
  for (auto& p : w.partitions) {
    p.same_as.clear();
    p.predicted_stage_min_ms = {9.0, 11.0};
    p.predicted_stage_max_ms = {11.0, 13.0};
    p.measured_stage_ms = {10.5, p.name == "balanced" ? 14.3 : 12.9};  // balanced stage 1: above its spread
    p.predicted_stage_cross_ms = {10.0, 12.0};
    p.measured_stage_mean_ms = {10.3, p.name == "balanced" ? 11.6 : 12.48};  // +3.0%; -3.3% / +4.0%
    p.metrics["simulated_cross_decode_error"] = p.name == "balanced" ? -0.021 : 0.012;
  }
  auto summary = [&](const RunRecord& run) {
    ppb::write_results(path_, run);
    std::ostringstream out;
    ppb::print_summary(out, ppb::read_results(path_));
    return out.str();
  };
  std::string text = summary(w);
  EXPECT_NE(text.find("relative costs (each split predicted from the other's stages measured in the same rounds): "
                      "stage errors (measured / predicted - 1) -3.3..+4.0%, simulator decode (predicted / measured - 1) "
                      "-2.1..+1.2%: held within +-5%"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("qualified: 1 stage(s) of these splits ran outside the profile's spread (above): the profile's "
                      "absolute times did not hold in the pipeline, its relative costs did"),
            std::string::npos)
      << text;
  // Balanced's stage 1 runs 8% above its cross-calibrated prediction: the relative costs did not hold.
  w.partitions[1].measured_stage_mean_ms = {10.3, 12.96};
  text = summary(w);
  EXPECT_NE(text.find("+3.0..+8.0%, simulator decode (predicted / measured - 1) -2.1..+1.2%: did not hold within +-5%"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("the balanced split was solved from numbers that did not hold in the pipeline"), std::string::npos)
      << text;
  // Inside the profile's spread too: the relative costs alone qualify the verdict.
  for (auto& p : w.partitions) p.measured_stage_ms = {10.5, 12.5};
  text = summary(w);
  EXPECT_NE(text.find("qualified: the profile's relative costs did not hold in the pipeline"), std::string::npos) << text;
  // A file without cross predictions (one split measured, or older): no such line.
  for (auto& p : w.partitions) p.predicted_stage_cross_ms.clear();
  text = summary(w);
  EXPECT_EQ(text.find("relative costs"), std::string::npos) << text;
  EXPECT_EQ(text.find("qualified"), std::string::npos) << text;
}

/// Every gain is against the record's reference_partition, whatever its name: the summary's
/// "vs" line and balance gain, the report's gains, the file's per-partition balance_gain.
TEST_F(ResultsIoTest, GainsAreAgainstTheReferencePartitionByItsName) {
  RunRecord w = make_record();
  w.partitions[0].name = "uniform_tp1-2";
  w.partitions[1].same_as.clear();
  w.reference_partition = "uniform_tp1-2";
  ppb::write_results(path_, w);
  const RunRecord r = ppb::read_results(path_);
  EXPECT_EQ(r.reference_partition, "uniform_tp1-2");
  {
    auto f = ppb::h5::File::open(path_);
    EXPECT_DOUBLE_EQ(f.root().open_group("benchmark/balanced").get_attr<double>("balance_gain"), 117.0 / 97.5);
  }
  std::ostringstream out;
  ppb::print_summary(out, r);
  const std::string text = out.str();
  EXPECT_NE(text.find("  vs uniform_tp1-2 (2 paired rounds, 95% CI): tokens/s 1.200x"), std::string::npos) << text;
  EXPECT_NE(text.find("balance gain (balanced / uniform_tp1-2, 2 paired rounds"), std::string::npos) << text;
  EXPECT_EQ(text.find("vs uniform ("), std::string::npos) << text;
  const auto rows = ppb::report_rows(path_, r);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].balance_gain, 1.0);
  EXPECT_DOUBLE_EQ(rows[1].balance_gain, 117.0 / 97.5);
  EXPECT_DOUBLE_EQ(rows[1].balance_gain_ci_low, 1.1);
  // No reference ("": no uniform measured): no gain anywhere.
  RunRecord none = r;
  none.reference_partition.clear();
  for (const auto& row : ppb::report_rows(path_, none)) EXPECT_TRUE(std::isnan(row.balance_gain));
}

/// The summary's slowest link: each boundary's message (B x hidden x dtype bytes between
/// stages, B int32 token ids back to stage 0) over its own measured link, 1e3 (latency + bytes
/// / bandwidth) ms (common/transfer.h), against the slowest stage's decode step.
TEST_F(ResultsIoTest, SlowestLinkIsTheBoundarysMessageOverItsLink) {
  RunRecord w = make_record();  // B = 1, hidden 1024, 6 us and 1.2e8 B/s between node01 and node02
  auto summary = [&](const RunRecord& run) {
    std::ostringstream out;
    ppb::print_summary(out, run);
    return out.str();
  };
  // f32: 4096 bytes, 1e3 (6e-6 + 4096 / 1.2e8) = 0.040 ms, 1.1% of the 3.5 ms decode step.
  std::string text = summary(w);
  EXPECT_NE(text.find("  slowest link: stage 0 -> 1 (ranks 0 -> 1, between nodes node01 and node02): 0.040 ms per "
                      "decode step, 1.1% of the slowest stage's decode step"),
            std::string::npos)
      << text;
  w.workload.dtype = "bf16";  // 2048 bytes: 0.023 ms
  text = summary(w);
  EXPECT_NE(text.find("stage 0 -> 1 (ranks 0 -> 1, between nodes node01 and node02): 0.023 ms"), std::string::npos)
      << text;
  w.workload.dtype = "";  // a file without its dtype: no activation to size, no line
  EXPECT_EQ(summary(w).find("slowest link"), std::string::npos);
}

/// The links (results/links_io.h): the host ping-pong, the probe's fits and sweep rows and what
/// the model took read back as written; the summary names the model's source and the other
/// measurement; a file without them (before the probe) reads empty fields and says nothing more.
TEST_F(ResultsIoTest, LinksRoundTripWithTheProbeAndTheSummaryNamesTheirSource) {
  RunRecord w = make_record();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  w.link_measured_by = ppb::kLinkByTransportProbe;
  w.transport = "nccl";
  w.backend = "cuda";
  w.link_host_latency_matrix_s = {nan, 6e-6, 6e-6, nan};
  w.link_host_bandwidth_matrix_Bps = {nan, 1.2e8, 1.2e8, nan};
  w.link_probe_latency_matrix_s = {nan, 8e-6, 8e-6, nan};
  w.link_probe_bandwidth_matrix_Bps = {nan, 1.5e11, 1.5e11, nan};
  w.link_probe_max_rel_error = {nan, 0.13, 0.13, nan};
  w.link_latency_matrix_s = w.link_probe_latency_matrix_s;
  w.link_bandwidth_matrix_Bps = w.link_probe_bandwidth_matrix_Bps;
  w.link_latency_s = 8e-6;
  w.link_bandwidth_Bps = 1.5e11;
  w.link_probe_s = 0.25;
  w.link_sweep = {{0, 1, {8, 7.5e-6, 8.1e-6, 20}}, {0, 1, {268435456, 1.7e-3, 1.8e-3, 3}}};
  ppb::write_results(path_, w);
  const RunRecord r = ppb::read_results(path_);
  EXPECT_EQ(r.link_measured_by, w.link_measured_by);
  EXPECT_EQ(r.link_probe_s, w.link_probe_s);
  auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
    return true;
  };
  EXPECT_TRUE(same(r.link_host_latency_matrix_s, w.link_host_latency_matrix_s));
  EXPECT_TRUE(same(r.link_host_bandwidth_matrix_Bps, w.link_host_bandwidth_matrix_Bps));
  EXPECT_TRUE(same(r.link_probe_latency_matrix_s, w.link_probe_latency_matrix_s));
  EXPECT_TRUE(same(r.link_probe_bandwidth_matrix_Bps, w.link_probe_bandwidth_matrix_Bps));
  EXPECT_TRUE(same(r.link_probe_max_rel_error, w.link_probe_max_rel_error));
  EXPECT_TRUE(same(r.link_latency_matrix_s, w.link_latency_matrix_s));
  ASSERT_EQ(r.link_sweep.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.link_sweep[i].src, w.link_sweep[i].src);
    EXPECT_EQ(r.link_sweep[i].dst, w.link_sweep[i].dst);
    EXPECT_EQ(r.link_sweep[i].sample.bytes, w.link_sweep[i].sample.bytes);
    EXPECT_EQ(r.link_sweep[i].sample.min_s, w.link_sweep[i].sample.min_s);
    EXPECT_EQ(r.link_sweep[i].sample.median_s, w.link_sweep[i].sample.median_s);
    EXPECT_EQ(r.link_sweep[i].sample.reps, w.link_sweep[i].sample.reps);
  }
  std::ostringstream out;
  ppb::print_summary(out, r);
  EXPECT_NE(out.str().find("link rank 0 <-> 1: 8.0 us latency, 150.00 GB/s (the nccl transport's probe on cuda buffers, "
                           "within 13% of every size)"),
            std::string::npos)
      << out.str();
  RunRecord host = w;  // a CPU run: the model is the host ping-pong, the probe beside it
  host.link_measured_by = ppb::kLinkByHostPingPong;
  host.transport = "mpi";
  host.link_latency_s = 6e-6;
  host.link_bandwidth_Bps = 1.2e8;
  std::ostringstream out2;
  ppb::print_summary(out2, host);
  EXPECT_NE(out2.str().find("link rank 0 <-> 1: 6.0 us latency, 0.12 GB/s (MPI host ping-pong; through the mpi "
                            "transport's lanes 8.0 us, 150.00 GB/s, within 13% of every size)"),
            std::string::npos)
      << out2.str();
  ppb::write_results(path_, make_record());  // before the probe: nothing of it
  const RunRecord old = ppb::read_results(path_);
  EXPECT_EQ(old.link_measured_by, "");
  EXPECT_TRUE(old.link_sweep.empty());
  EXPECT_TRUE(old.link_probe_latency_matrix_s.empty());
}

/// A file written before the root attributes partition_order and reference_partition: its
/// reference is uniform (kLegacyReferencePartition), listed first, then the others by name.
TEST_F(ResultsIoTest, FileWithoutPartitionOrderListsItsReferenceFirst) {
  RunRecord w = make_record();
  std::swap(w.partitions[0], w.partitions[1]);  // run order balanced, uniform
  w.partitions[0].same_as.clear();
  ppb::write_results(path_, w);
  EXPECT_EQ(ppb::read_results(path_).partitions[0].name, "balanced");  // partition_order
  {
    auto f = ppb::h5::File::open_rw(path_);
    auto root = f.root();
    root.delete_attr("partition_order");
    root.delete_attr("reference_partition");
  }
  const RunRecord r = ppb::read_results(path_);
  EXPECT_EQ(r.reference_partition, "uniform");
  ASSERT_EQ(r.partitions.size(), 2u);
  EXPECT_EQ(r.partitions[0].name, "uniform");
  EXPECT_EQ(r.partitions[1].name, "balanced");
}

// run --plan's search and verdict (/plan, the root's plan_* attributes) and each partition's own
// M (/partitions/<name> microbatches; the workload's where a file has none) read back as written.
TEST_F(ResultsIoTest, PlanAndEachPartitionsMRoundTrip) {
  RunRecord w = make_record();
  EXPECT_EQ(ppb::partition_groups(w, w.partitions[0]), w.workload.microbatches);  // 0: the workload's
  ppb::PlanRecord& p = w.plan;
  p.devices = 2;
  p.points = 1;
  p.mode = "every layout";
  p.layouts_possible = 2;
  p.layouts_evaluated = 2;
  p.curve_layout = "1";
  p.predicted_best = p.measured_best = "uniform";
  p.best_within_ci = 1;
  p.best_cmp = ppb::PairedComparison{1.0, 1.0, 1.0, 2};
  for (int m = 1; m <= 2; ++m) {
    ppb::PlanRecord::Candidate c;
    c.label = "PP2 M" + std::to_string(m);
    c.widths = "1,1";
    c.counts = "2,2";
    c.groups = m;
    c.batch = 1;
    c.tokens_per_s = 10.0 * m;
    c.tokens_per_s_per_device = 5.0 * m;
    c.ttft_p50_ms = 100.0 + m;
    c.tpot_p50_ms = 20.0 * m;
    c.tokens_per_s_per_user = 1000.0 / c.tpot_p50_ms;
    c.bottleneck_stage = m - 1;
    c.on_front = true;
    c.measured_as = m == 2 ? "uniform" : "";
    c.role = m == 2 ? "front" : "";
    p.candidates.push_back(c);
  }
  p.front = {0, 1};
  ppb::write_results(path_, w);
  const RunRecord r = ppb::read_results(path_);
  EXPECT_EQ(r.partitions[0].groups, w.workload.microbatches);
  {
    auto root = ppb::h5::File::open(path_).root();
    EXPECT_EQ(root.get_attr<std::string>("plan_predicted_best"), "uniform");
    EXPECT_EQ(root.get_attr<int64_t>("plan_best_within_ci"), 1);
  }
  const ppb::PlanRecord& q = r.plan;
  EXPECT_EQ(q.devices, 2);
  EXPECT_EQ(q.mode, p.mode);
  EXPECT_EQ(q.curve_layout, "1");
  EXPECT_EQ(q.measured_best, "uniform");
  EXPECT_EQ(q.best_cmp.n, 2);
  EXPECT_EQ(q.front, p.front);
  ASSERT_EQ(q.candidates.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(q.candidates[i].label, p.candidates[i].label);
    EXPECT_EQ(q.candidates[i].groups, p.candidates[i].groups);
    EXPECT_EQ(q.candidates[i].measured_as, p.candidates[i].measured_as);
    EXPECT_EQ(q.candidates[i].role, p.candidates[i].role);
    EXPECT_EQ(q.candidates[i].tokens_per_s, p.candidates[i].tokens_per_s);
    EXPECT_EQ(q.candidates[i].tpot_p50_ms, p.candidates[i].tpot_p50_ms);
    EXPECT_EQ(q.candidates[i].bottleneck_stage, p.candidates[i].bottleneck_stage);
  }
  std::ostringstream os;
  ppb::print_summary(os, r);
  EXPECT_NE(os.str().find("plan: predicted best uniform, measured best uniform: the same point"), std::string::npos) << os.str();
}

TEST_F(ResultsIoTest, UnmeasuredPartitionHasNoBenchmark) {
  RunRecord w = make_record();
  w.partitions[1].measured = false;
  ppb::write_results(path_, w);
  const RunRecord r = ppb::read_results(path_);
  ASSERT_EQ(r.partitions.size(), 2u);
  EXPECT_TRUE(r.partitions[0].measured);
  EXPECT_FALSE(r.partitions[1].measured);
  EXPECT_EQ(r.partitions[1].first_unit, w.partitions[1].first_unit);
  EXPECT_TRUE(r.partitions[1].events.empty());
}

// The message of the UserError read_results throws for `path`, or "" when none is thrown.
std::string refusal(const std::string& path) {
  try {
    ppb::read_results(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST_F(ResultsIoTest, RefusesMissingFile) {
  const std::string msg = refusal(path_ + ".missing");
  EXPECT_NE(msg.find(path_ + ".missing"), std::string::npos) << msg;
}

TEST_F(ResultsIoTest, RefusesNonHdf5File) {
  std::ofstream(path_) << "step,loss\n1,2.5\n";
  const std::string msg = refusal(path_);
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;
}

TEST_F(ResultsIoTest, RefusesHdf5FileThatIsNotPpbench) {
  {
    auto f = ppb::h5::File::create(path_);
    f.root().write_dataset("x", std::vector<double>{1, 2, 3});
    f.root().set_attr("complete", static_cast<int64_t>(1));
  }
  const std::string msg = refusal(path_);
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a ppbench results file"), std::string::npos) << msg;
}

TEST_F(ResultsIoTest, RefusesIncompleteFile) {
  ppb::write_results(path_, make_record());
  {
    // Mark it as a crashed run would have left it.
    hid_t f = H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t a = H5Aopen(f, "complete", H5P_DEFAULT);
    int64_t zero = 0;
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &zero), 0);
    H5Aclose(a);
    H5Fclose(f);
  }
  const std::string msg = refusal(path_);
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
  EXPECT_NE(msg.find("last status '"), std::string::npos) << msg;  // how far the run got
}

TEST_F(ResultsIoTest, RefusesFileMissingARequiredGroup) {
  {
    auto f = ppb::h5::File::create(path_);
    auto root = f.root();
    root.set_attr("format_version", static_cast<int64_t>(1));
    root.set_attr("ppbench_version", "0.1.0");
    root.set_attr("world_size", static_cast<int64_t>(1));
    root.set_attr("complete", static_cast<int64_t>(1));
  }
  const std::string msg = refusal(path_);
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("layout"), std::string::npos) << msg;
}

TEST_F(ResultsIoTest, ReportRowsAndCsv) {
  ppb::write_results(path_, make_record());
  const auto rows = ppb::report_rows(path_, ppb::read_results(path_));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].partition, "uniform");
  EXPECT_EQ(rows[0].counts, "2,2");
  EXPECT_EQ(rows[0].model, "qwen3-0.6b");
  EXPECT_DOUBLE_EQ(rows[0].balance_gain, 1.0);
  EXPECT_DOUBLE_EQ(rows[1].balance_gain, 117.0 / 97.5);
  EXPECT_DOUBLE_EQ(rows[1].max_bubble, 0.4);
  EXPECT_EQ(rows[1].validation, "OK");

  std::ostringstream csv;
  ppb::print_report_csv(csv, rows);
  std::istringstream lines(csv.str());
  std::string header, first;
  std::getline(lines, header);
  std::getline(lines, first);
  EXPECT_EQ(header.rfind("file,model,backend,world_size,", 0), 0u) << header;
  EXPECT_NE(first.find(",uniform,\"2,2\","), std::string::npos) << first;  // quoted counts
  // Every line has the header's number of fields once quoted commas are skipped.
  auto fields = [](const std::string& s) {
    int n = 1;
    bool quoted = false;
    for (char c : s) {
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) ++n;
    }
    return n;
  };
  EXPECT_EQ(fields(first), fields(header));

  std::ostringstream text;
  ppb::run_report(text, {path_, path_}, false);
  EXPECT_NE(text.str().find("balanced"), std::string::npos);
  std::ostringstream single;
  ppb::run_report(single, {path_}, false);
  EXPECT_NE(single.str().find("== ppbench summary"), std::string::npos);
  EXPECT_NE(single.str().find("slurm: job 42 task 3"), std::string::npos);
}

// ---- append_results -------------------------------------------------------------------------

// make_record's run as the snapshot after its partitions holds it, before the first benchmark
// round: the profile and two splits, nothing measured (both partitions measured on their own).
RunRecord record_before_rounds() {
  RunRecord r = make_record();
  r.status = "running: benchmark";
  r.validation_ok = false;
  r.validation = "pending";
  r.rounds = 0;
  r.round_gap_s.clear();
  r.profile.latency_rounds_ms.clear();
  r.profile.latency_rounds_after.clear();
  for (auto& p : r.partitions) {
    p.measured = false;
    p.same_as.clear();
    p.events.clear();
    p.rep_wall_s.clear();
    p.rep_tokens_per_s.clear();
    p.rep_decode_tokens_per_s.clear();
    p.rep_ttft_p50_ms.clear();
    p.rep_tpot_p50_ms.clear();
    p.rep_round.clear();
    p.validated = p.tokens_match = p.checksum_match = false;
  }
  return r;
}

// Benchmark round `round` (0-based) of that run, as the run loop adds it: one repetition of
// every partition (events [M=2][G+1=2][S=2][6], the rep_* values, distinct per round and
// partition, NaN where the record has one), a profile cycle after rounds 2, 4 and 7, the gap.
void add_round(RunRecord& r, int round) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < r.partitions.size(); ++i) {
    PartitionRecord& p = r.partitions[i];
    p.measured = true;
    for (int k = 0; k < 2 * 2 * 2 * 6; ++k)
      p.events.push_back(k % 6 < 2 && k < 12 ? nan : 1000.0 * round + 100.0 * static_cast<double>(i) + 0.001 * k);
    p.rep_wall_s.push_back(0.02 + 0.001 * round + 0.0001 * static_cast<double>(i));
    p.rep_tokens_per_s.push_back(100.0 - round - 0.5 * static_cast<double>(i));
    p.rep_decode_tokens_per_s.push_back(round == 3 ? nan : 150.0 + round);
    p.rep_ttft_p50_ms.push_back(8.0 + 0.25 * round);
    p.rep_tpot_p50_ms.push_back(3.0 + 0.125 * round + static_cast<double>(i));
    p.rep_round.push_back(round);
  }
  const int done = round + 1;
  if (done == 2 || done == 4 || done == 7) {
    for (int i = 0; i < 2 * 4 * 2; ++i) r.profile.latency_rounds_ms.push_back(1.0 + i + 0.01 * done);
    r.profile.latency_rounds_after.push_back(done);
  }
  r.round_gap_s.push_back(0.004 + 0.0005 * round);
  r.rounds = done;
  r.elapsed_s = 10.0 + round;
  r.round_profile_s = 0.125 * static_cast<double>(r.profile.latency_rounds_after.size());
}

// The datasets that gain rows round by round, as paths, with the record's data (as doubles);
// those of measured partitions.
std::map<std::string, std::vector<double>> row_datasets(const RunRecord& r) {
  std::map<std::string, std::vector<double>> out;
  auto as_double = [](const auto& v) { return std::vector<double>(v.begin(), v.end()); };
  for (const auto& p : r.partitions) {
    if (!p.measured) continue;
    const std::string b = "benchmark/" + p.name + "/";
    out[b + "events"] = p.events;
    out[b + "rep_wall_s"] = p.rep_wall_s;
    out[b + "rep_tokens_per_s"] = p.rep_tokens_per_s;
    out[b + "rep_decode_tokens_per_s"] = p.rep_decode_tokens_per_s;
    out[b + "rep_ttft_p50_ms"] = p.rep_ttft_p50_ms;
    out[b + "rep_tpot_p50_ms"] = p.rep_tpot_p50_ms;
    out[b + "rep_round"] = as_double(p.rep_round);
  }
  out["profile/latency_rounds_ms"] = r.profile.latency_rounds_ms;
  out["profile/latency_rounds_after"] = as_double(r.profile.latency_rounds_after);
  out["rounds/gap_s"] = r.round_gap_s;
  return out;
}

// Every attribute of `obj` as text (name -> values), whatever its type.
std::map<std::string, std::string> attrs_text(const ppb::h5::Object& obj) {
  std::map<std::string, std::string> out;
  for (const auto& name : obj.attr_names()) {
    hid_t a = H5Aopen(obj.id(), name.c_str(), H5P_DEFAULT);
    hid_t t = H5Aget_type(a);
    const bool is_string = H5Tget_class(t) == H5T_STRING;
    std::string text = std::to_string(H5Tget_class(t)) + ":" + std::to_string(H5Tget_size(t)) + ":";
    H5Tclose(t);
    H5Aclose(a);
    if (is_string)
      for (const auto& v : obj.get_attr<std::vector<std::string>>(name)) text += v + "|";
    else
      for (double v : obj.get_attr<std::vector<double>>(name)) text += std::to_string(v) + "|";
    out[name] = text;
  }
  return out;
}

// The element type of dataset `ds` in the file equals `other`'s.
bool same_type(const ppb::h5::Dataset& ds, const ppb::h5::Dataset& other) {
  hid_t a = H5Dget_type(ds.id()), b = H5Dget_type(other.id());
  const bool same = H5Tequal(a, b) > 0;
  H5Tclose(a);
  H5Tclose(b);
  return same;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(ResultsIoTest, AppendedRoundByRoundTheFileHoldsTheRecordsRowsAsWriteResultsStoresThem) {
  RunRecord r = record_before_rounds();
  ppb::write_results(path_, r, /*complete=*/false);
  const int rounds = 10;
  for (int round = 0; round < rounds; ++round) {
    add_round(r, round);
    if (round == 5)  // a whole rewrite in the middle of the rounds: the appends go on from it
      ppb::write_results(path_, r, /*complete=*/false);
    else
      ppb::append_results(path_, r);
    auto f = ppb::h5::File::open(path_);
    ASSERT_EQ(f.root().open_dataset("benchmark/balanced/events").dims()[0], static_cast<hsize_t>(round + 1));
  }
  const std::string ref = path_ + ".whole.h5";
  ppb::write_results(ref, r);  // the final file of the same record
  {
    auto f = ppb::h5::File::open(path_);
    auto whole = ppb::h5::File::open(ref);
    const auto root = f.root(), wroot = whole.root();
    // The rows: exactly the record's, in the shape, element type and attributes write_results
    // gives them.
    for (const auto& [name, data] : row_datasets(r)) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(root.exists(name));
      ASSERT_TRUE(wroot.exists(name));
      const auto ds = root.open_dataset(name), wds = wroot.open_dataset(name);
      EXPECT_EQ(ds.dims(), wds.dims());
      EXPECT_TRUE(same_type(ds, wds));
      EXPECT_EQ(attrs_text(ds), attrs_text(wds));
      expect_same(ds.read<double>(), data, name.c_str());
      expect_same(wds.read<double>(), data, name.c_str());
      EXPECT_TRUE(ds.extendible());  // the snapshot's rows can grow; the final file's are fixed
      EXPECT_FALSE(wds.extendible());
    }
    EXPECT_EQ(root.open_dataset("benchmark/uniform/events").dims(), (std::vector<hsize_t>{10, 2, 2, 2, 6}));
    EXPECT_EQ(root.open_dataset("profile/latency_rounds_ms").dims(), (std::vector<hsize_t>{3, 2, 4, 2}));
    EXPECT_EQ(root.open_dataset("rounds/gap_s").dims(), (std::vector<hsize_t>{10}));
    // The root: what append_results updates.
    EXPECT_EQ(root.get_attr<int64_t>("complete"), 0);
    EXPECT_EQ(root.get_attr<std::string>("status"), "running: benchmark");
    EXPECT_EQ(root.get_attr<double>("elapsed_s"), 19.0);
    EXPECT_EQ(root.get_attr<int64_t>("benchmark_rounds"), 10);
    EXPECT_EQ(root.get_attr<double>("round_profile_s"), 0.375);
    // The summary is the whole rewrite's (after round 6), and says so.
    for (const char* name : {"uniform", "balanced"}) {
      const auto bench = root.open_group(std::string("benchmark/") + name);
      EXPECT_EQ(bench.get_attr<int64_t>("summary_repetitions"), 6) << name;
      EXPECT_EQ(bench.get_attr<int64_t>("repetitions"), 6) << name;
      EXPECT_NE(bench.get_attr<std::string>("snapshot").find("summary_repetitions"), std::string::npos);
      EXPECT_FALSE(wroot.open_group(std::string("benchmark/") + name).has_attr("snapshot"));
      EXPECT_FALSE(wroot.open_group(std::string("benchmark/") + name).has_attr("summary_repetitions"));
      EXPECT_EQ(root.open_group(std::string("validation/") + name).get_attr<int64_t>("validated"), 0);
    }
  }
  std::remove(ref.c_str());

  // An append with nothing new changes nothing, to the byte.
  const std::string before = file_bytes(path_);
  ppb::append_results(path_, r);
  EXPECT_TRUE(file_bytes(path_) == before);

  // The project's reader refuses the snapshot as incomplete, as any snapshot; marked complete,
  // it reads the rows back.
  const std::string msg = refusal(path_);
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
  EXPECT_NE(msg.find("last status 'running: benchmark'"), std::string::npos) << msg;
  {
    auto f = ppb::h5::File::open_rw(path_);
    f.root().set_attr("complete", int64_t{1});
  }
  const RunRecord back = ppb::read_results(path_);
  ASSERT_EQ(back.partitions.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    expect_same(back.partitions[i].events, r.partitions[i].events, "events");
    expect_same(back.partitions[i].rep_decode_tokens_per_s, r.partitions[i].rep_decode_tokens_per_s, "decode");
    EXPECT_EQ(back.partitions[i].rep_round, r.partitions[i].rep_round);
  }
  EXPECT_EQ(back.round_gap_s, r.round_gap_s);
  EXPECT_EQ(back.profile.latency_rounds_after, r.profile.latency_rounds_after);
  EXPECT_EQ(back.rounds, 10);
}

TEST_F(ResultsIoTest, AppendCreatesTheGroupsOfAPartitionMeasuredAfterTheLastWholeWrite) {
  RunRecord r = record_before_rounds();
  ppb::write_results(path_, r, /*complete=*/false);
  add_round(r, 0);
  ppb::append_results(path_, r);  // creates /benchmark/<name>, /validation/<name>
  // A third split joins the rounds from round 2 (as an adaptive one does).
  PartitionRecord adaptive = record_before_rounds().partitions[0];
  adaptive.name = adaptive.solver = "adaptive";
  r.partitions.push_back(adaptive);
  add_round(r, 1);
  r.partitions[2].rep_round = {1};
  PartitionRecord later = record_before_rounds().partitions[1];  // solved, not measured yet
  later.name = later.solver = "adaptive_2";
  r.partitions.push_back(later);
  ppb::append_results(path_, r);
  auto f = ppb::h5::File::open(path_);
  const auto root = f.root();
  EXPECT_EQ(root.get_attr<std::vector<std::string>>("partition_order"),
            (std::vector<std::string>{"uniform", "balanced", "adaptive", "adaptive_2"}));
  EXPECT_TRUE(root.exists("partitions/adaptive/first_unit"));
  EXPECT_TRUE(root.exists("partitions/adaptive_2/first_unit"));  // every name in partition_order has its split
  EXPECT_FALSE(root.exists("benchmark/adaptive_2"));
  for (const auto& [name, data] : row_datasets(r)) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(root.exists(name));
    expect_same(root.open_dataset(name).read<double>(), data, name.c_str());
  }
  EXPECT_EQ(root.open_dataset("benchmark/adaptive/events").dims(), (std::vector<hsize_t>{1, 2, 2, 2, 6}));
  EXPECT_EQ(root.open_dataset("benchmark/uniform/events").dims(), (std::vector<hsize_t>{2, 2, 2, 2, 6}));
  for (const char* name : {"uniform", "adaptive"}) {
    const auto bench = root.open_group(std::string("benchmark/") + name);
    EXPECT_EQ(bench.get_attr<int64_t>("summary_repetitions"), 0) << name;  // no summary yet
    EXPECT_FALSE(bench.has_attr("tokens_per_s")) << name;
    EXPECT_FALSE(bench.exists("stage_compute_ms")) << name;
    const auto val = root.open_group(std::string("validation/") + name);
    EXPECT_EQ(val.get_attr<int64_t>("validated"), 0);
    EXPECT_EQ(val.get_attr<int64_t>("tokens_match"), 0);
    EXPECT_EQ(val.get_attr<int64_t>("checksum_match"), 0);
  }
  // Finished, the run writes the whole file: the normal layout, no snapshot attributes.
  ppb::write_results(path_, r);
  const RunRecord back = ppb::read_results(path_);
  ASSERT_EQ(back.partitions.size(), 4u);
  expect_same(back.partitions[2].events, r.partitions[2].events, "adaptive events");
  EXPECT_FALSE(back.partitions[3].measured);
  auto g = ppb::h5::File::open(path_);
  EXPECT_FALSE(g.root().open_group("benchmark/uniform").has_attr("snapshot"));
  EXPECT_TRUE(g.root().open_group("benchmark/uniform").has_attr("tokens_per_s"));
  EXPECT_EQ(g.root().open_group("validation/uniform").get_attr<int64_t>("validated"), 0);  // as the record says
}

// The message of the InternalError append_results throws, or "" when none is thrown.
std::string append_refusal(const std::string& path, const RunRecord& r) {
  try {
    ppb::append_results(path, r);
  } catch (const ppb::InternalError& e) {
    return e.what();
  }
  return "";
}

TEST_F(ResultsIoTest, AppendRefusesAFileThatIsNotThisRunsSnapshot) {
  RunRecord r = record_before_rounds();
  add_round(r, 0);
  std::string msg = append_refusal(path_ + ".missing", r);
  EXPECT_NE(msg.find(path_ + ".missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  ppb::write_results(path_, r);  // complete
  msg = append_refusal(path_, r);
  EXPECT_NE(msg.find("complete"), std::string::npos) << msg;

  RunRecord other = r;
  other.created_utc = "2025-02-03T04:05:06Z";
  ppb::write_results(path_, other, /*complete=*/false);
  msg = append_refusal(path_, r);
  EXPECT_NE(msg.find("not a snapshot of this run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("created_utc"), std::string::npos) << msg;

  ppb::write_results(path_, r, /*complete=*/false);
  RunRecord fewer = r;  // the file holds a row the record lacks
  fewer.partitions[0].rep_wall_s.clear();
  msg = append_refusal(path_, fewer);
  EXPECT_NE(msg.find("rep_wall_s holds 1 rows, the record only 0"), std::string::npos) << msg;

  std::ofstream(path_) << "not HDF5\n";
  msg = append_refusal(path_, r);
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;
}

TEST_F(ResultsIoTest, AppendToAFileOpenElsewhereRewritesItWhole) {
  RunRecord r = record_before_rounds();
  add_round(r, 0);
  ppb::write_results(path_, r, /*complete=*/false);
  add_round(r, 1);
  {
    // A reader holds the file open (here in this process: HDF5 refuses to open it for writing
    // too, as another process's lock makes it): the append rewrites the whole snapshot.
    auto reader = ppb::h5::File::open(path_);
    ppb::append_results(path_, r);
    EXPECT_EQ(reader.root().open_dataset("benchmark/uniform/events").dims()[0], 1u);  // its own, old file
  }
  auto f = ppb::h5::File::open(path_);
  EXPECT_EQ(f.root().open_dataset("benchmark/uniform/events").dims()[0], 2u);
  EXPECT_TRUE(f.root().open_dataset("benchmark/uniform/events").extendible());
  EXPECT_EQ(f.root().get_attr<int64_t>("benchmark_rounds"), 2);
}

}  // namespace

/// A long model name (or partition name, or many files) widens its column instead of pushing
/// the row's other fields out of their columns.
TEST(ReportTable, LongModelNameKeepsRowsAligned) {
  RunRecord run = make_record();
  std::vector<ppb::ReportRow> rows = ppb::report_rows("a.h5", run);
  ASSERT_FALSE(rows.empty());
  ppb::ReportRow long_row = rows.front();
  long_row.file = "b.h5";
  long_row.model = "tinyllama-1.1b-chat-v1.0-with-an-even-longer-suffix";
  long_row.partition = "balanced-by-hand";
  rows.push_back(long_row);
  std::ostringstream os;
  ppb::print_report_table(os, rows);
  const std::string text = os.str();
  // Every table line has its "ranks" field ending at the same column as the header's.
  std::istringstream in(text);
  std::string line;
  size_t header_ranks = std::string::npos;
  int table_lines = 0;
  while (std::getline(in, line)) {
    if (line.rfind("run ", 0) == 0) {
      header_ranks = line.find("ranks") + 5;
      continue;
    }
    if (header_ranks == std::string::npos || line.empty() || line[0] != '[') continue;  // rows start "[file]"
    ++table_lines;
    ASSERT_GE(line.size(), header_ranks) << line;
    EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(line[header_ranks - 1]))) << "ranks column moved:\n" << text;
    EXPECT_EQ(line[header_ranks], ' ') << text;
  }
  EXPECT_EQ(table_lines, static_cast<int>(rows.size())) << text;
  EXPECT_NE(text.find(long_row.model), std::string::npos);
}
