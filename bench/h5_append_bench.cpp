// The results file's per-round update: append_results (the round's rows, in place) against
// write_results (the whole snapshot, temporary file + rename), over 1,000 benchmark rounds of a
// tiny model's shape: M = 2 groups, G = 4 decode steps, S = 2 stages on 2 ranks, U = 4 units,
// two partitions, a profile cycle between rounds every 10 rounds. Prints the mean
// append_results time over the first and the last 100 rounds, the whole write_results time of
// the same record at round 100 and round 1,000, and the files' sizes. Not a test: the figures
// depend on the machine and its disk.
//
//   ppb_h5_append_bench [DIR [M G]]  (DIR: where the files go, default a new
//                                     /tmp/ppb_h5_append_*; they are kept, for h5py or `ppbench
//                                     report`. M G: another shape, e.g. 8 128 for a GPU run's
//                                     events: 99 KB a repetition instead of 960 B)
//
// With --kill N [DIR] it measures instead what a killed rank 0 leaves (results/README.md,
// "What an append risks"): N times, a child process appends round after round and nothing
// else (so that the kill lands inside an append: the worst case; a run spends ~1 ms of a
// round there), is SIGKILLed after a random 5-60 ms, and the file is opened and its rows
// checked: unreadable, readable with a partly applied append (datasets of different row
// counts), or consistent.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "results/h5.h"
#include "results/run_record.h"
#include "results/writer.h"

namespace {

using ppb::PartitionRecord;
using ppb::RunRecord;

constexpr int kRanks = 2, kUnits = 4, kStages = 2, kBatch = 1;
int g_groups = 2, g_gen = 4;  // M, G (the command line may change them)

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The run as its snapshot after the partitions holds it: metadata, profile, two splits.
RunRecord record_before_rounds() {
  RunRecord r;
  r.ppbench_version = "0.1.0+bench";
  r.created_utc = "2025-01-01T00:00:00Z";
  r.command_line = "ppbench run --model tests/data/tiny-llama.json -g 4";
  r.backend = "cpu";
  r.transport = "mpi";
  r.world_size = kRanks;
  r.status = "running: benchmark";
  r.model_source = "tests/data/tiny-llama.json";
  r.model_config_json = "{}";
  r.workload.batch = kBatch;
  r.workload.prompt_len = 8;
  r.workload.gen_len = g_gen;
  r.workload.microbatches = g_groups;
  r.workload.dtype = "f32";
  r.workload.iters = 5;
  r.workload.objective = "workload";
  r.ranks = {{"node0", "cpu", "", 0, 0.0}, {"node0", "cpu", "", 1, 0.0}};
  auto& p = r.profile;
  p.unit_name = {"embed", "layer.0", "layer.1", "head"};
  p.unit_signature = {0, 1, 1, 2};
  p.signature_name = {"embed", "layer", "head"};
  for (int i = 0; i < kRanks * kUnits * 2; ++i) {
    p.latency_ms.push_back(1.0 + i);
    p.latency_min_ms.push_back(0.5 + i);
    p.latency_max_ms.push_back(2.0 + i);
  }
  p.decode_contexts = {8, 12};
  p.decode_context_ms.assign(kRanks * kUnits * 2, 0.5);
  p.cost_ms.assign(kRanks * kUnits, 3.0);
  p.unit_params = {100, 200, 200, 300};
  p.unit_weight_bytes = {400, 800, 800, 1200};
  p.unit_kv_bytes = {0, 64, 64, 0};
  r.round_profile_status = "together cycles between rounds, at most 20% of the rounds' time";
  for (const char* name : {"uniform", "balanced"}) {
    PartitionRecord pr;
    pr.name = pr.solver = name;
    pr.first_unit = {0, std::string(name) == "uniform" ? 2 : 3};
    pr.last_unit = {pr.first_unit[1] - 1, kUnits - 1};
    pr.device_rank = {0, 1};
    pr.predicted_stage_ms = {10.0, 12.0};
    pr.predicted_phase_ms = {5.0, 2.5, 6.0, 3.0};
    pr.stage_weight_bytes = {1200, 2000};
    pr.stage_kv_bytes = {64, 64};
    pr.predicted_bottleneck_ms = 12.0;
    r.partitions.push_back(pr);
  }
  return r;
}

// One benchmark round: a repetition of each partition (its events and rep_* values), the gap,
// and every 10th round a profile cycle.
void add_round(RunRecord& r, int round) {
  const int row = g_groups * (g_gen + 1) * kStages * 6;
  for (size_t i = 0; i < r.partitions.size(); ++i) {
    PartitionRecord& p = r.partitions[i];
    if (!p.measured) {  // the summary write_results needs (the run loop recomputes it per round)
      p.measured = true;
      p.stage_compute_ms = {1.0, 0.5, 1.0, 0.5};
      p.stage_workload_ms = {3.0, 3.0};
      p.bubble_fraction = {0.1, 0.1};
      p.recv_wait_ms = {0.0, 0.1};
      p.lane_cpu_s = {0.1, 0.0, 0.0, 0.1, 0.0, 0.0};
      p.metrics = {{"tokens_per_s", 400.0}, {"decode_tokens_per_s", 500.0}};
    }
    const double t0 = 0.05 * round + 0.025 * static_cast<double>(i);
    for (int k = 0; k < row; ++k) p.events.push_back(t0 + 1e-4 * k);
    p.rep_wall_s.push_back(0.02);
    p.rep_tokens_per_s.push_back(400.0 + round % 7);
    p.rep_decode_tokens_per_s.push_back(500.0 + round % 5);
    p.rep_ttft_p50_ms.push_back(4.0);
    p.rep_tpot_p50_ms.push_back(2.0);
    p.rep_round.push_back(round);
  }
  if ((round + 1) % 10 == 0) {
    for (int i = 0; i < kRanks * kUnits * 2; ++i) r.profile.latency_rounds_ms.push_back(1.0 + i);
    r.profile.latency_rounds_after.push_back(round + 1);
    r.round_profile_s += 0.01;
  }
  r.round_gap_s.push_back(0.003);
  r.rounds = round + 1;
  r.elapsed_s = 1.0 + 0.05 * round;
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to),
                         0.0) /
         static_cast<double>(to - from);
}

// Mean of 5 whole writes of `r` as a snapshot to `path` (what the run did after every round).
double whole_write_s(const std::string& path, const RunRecord& r) {
  double total = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ppb::write_results(path, r, /*complete=*/false);
    total += seconds_since(t0);
  }
  return total / 5;
}

// The rows of partition `name` in the file as each of its datasets holds them (-1: unreadable
// or not in round order).
std::vector<long> row_counts(const ppb::h5::Group& root, const std::string& name) {
  const auto b = root.open_group("benchmark/" + name);
  std::vector<long> n;
  n.push_back(static_cast<long>(b.open_dataset("events").dims()[0]));
  for (const char* d : {"rep_wall_s", "rep_tokens_per_s", "rep_decode_tokens_per_s", "rep_ttft_p50_ms",
                        "rep_tpot_p50_ms"})
    n.push_back(static_cast<long>(b.open_dataset(d).read<double>().size()));
  const auto rounds = b.open_dataset("rep_round").read<std::int64_t>();
  bool in_order = true;
  for (size_t i = 0; i < rounds.size(); ++i) in_order = in_order && rounds[i] == static_cast<std::int64_t>(i);
  n.push_back(in_order ? static_cast<long>(rounds.size()) : -1);
  return n;
}

int kill_experiment(int trials, const std::string& dir) {
  std::mt19937 rng(7);
  int unreadable = 0, partial = 0, consistent = 0;
  const std::string path = dir + "/killed.h5";
  for (int t = 0; t < trials; ++t) {
    RunRecord r = record_before_rounds();
    ppb::write_results(path, r, /*complete=*/false);
    int round = 0;
    for (; round < 20; ++round) {
      add_round(r, round);
      ppb::append_results(path, r);
    }
    const pid_t child = fork();
    if (child == 0) {
      for (;; ++round) {
        add_round(r, round);
        ppb::append_results(path, r);
      }
    }
    usleep(static_cast<useconds_t>(std::uniform_int_distribution<int>(5000, 60000)(rng)));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    try {
      auto f = ppb::h5::File::open(path);
      auto counts = row_counts(f.root(), "uniform");
      const auto other = row_counts(f.root(), "balanced");
      counts.insert(counts.end(), other.begin(), other.end());
      const bool ordered = std::find(counts.begin(), counts.end(), -1) == counts.end();
      const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
      if (ordered && *lo == *hi) {
        ++consistent;
      } else {
        ++partial;
        std::printf("  trial %d: rows per dataset from %ld to %ld%s\n", t, *lo, *hi,
                    ordered ? "" : ", rep_round out of order");
      }
    } catch (const std::exception& e) {
      ++unreadable;
      std::printf("  trial %d: unreadable: %.200s\n", t, e.what());
    }
  }
  std::printf("h5_append_bench --kill: %d kills inside appends: %d consistent, %d with a partly applied append, "
              "%d unreadable\n",
              trials, consistent, partial, unreadable);
  return 0;
}

std::string output_dir(const char* given) {
  if (given) {
    std::filesystem::create_directories(given);
    return given;
  }
  char tmpl[] = "/tmp/ppb_h5_append_XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  return tmpl;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--kill") {
    const int trials = argc > 2 ? std::atoi(argv[2]) : 100;
    return kill_experiment(trials, output_dir(argc > 3 ? argv[3] : nullptr));
  }
  const std::string dir = output_dir(argc > 1 ? argv[1] : nullptr);
  if (argc > 3) {
    g_groups = std::max(1, std::atoi(argv[2]));
    g_gen = std::max(1, std::atoi(argv[3]));
  }
  const std::string appended = dir + "/appended.h5", whole = dir + "/whole.h5", final_file = dir + "/final.h5";
  constexpr int kRounds = 1000;
  RunRecord r = record_before_rounds();
  ppb::write_results(appended, r, /*complete=*/false);
  std::vector<double> append_s;
  double whole_100 = 0, whole_1000 = 0;
  for (int round = 0; round < kRounds; ++round) {
    add_round(r, round);
    const auto t0 = std::chrono::steady_clock::now();
    ppb::append_results(appended, r);
    append_s.push_back(seconds_since(t0));
    if (round + 1 == 100) whole_100 = whole_write_s(whole, r);
  }
  whole_1000 = whole_write_s(whole, r);
  const auto t0 = std::chrono::steady_clock::now();
  r.status = "complete";
  ppb::write_results(final_file, r);
  const double final_s = seconds_since(t0);
  std::vector<double> sorted = append_s;
  std::sort(sorted.begin(), sorted.end());
  std::printf("h5_append_bench: %d rounds, M=%d G=%d S=%d, 2 partitions, a profile cycle every 10 rounds\n", kRounds,
              g_groups, g_gen, kStages);
  std::printf("  append_results  mean rounds    1-100:  %7.3f ms\n", 1e3 * mean(append_s, 0, 100));
  std::printf("  append_results  mean rounds  901-1000: %7.3f ms   (median of all %.3f ms, max %.3f ms)\n",
              1e3 * mean(append_s, 900, 1000), 1e3 * sorted[sorted.size() / 2], 1e3 * sorted.back());
  std::printf("  write_results   snapshot at round  100: %7.3f ms\n", 1e3 * whole_100);
  std::printf("  write_results   snapshot at round 1000: %7.3f ms\n", 1e3 * whole_1000);
  std::printf("  write_results   final file (complete):  %7.3f ms\n", 1e3 * final_s);
  std::printf("  sizes: appended snapshot %ju B, whole snapshot %ju B, final file %ju B (in %s)\n",
              static_cast<uintmax_t>(std::filesystem::file_size(appended)),
              static_cast<uintmax_t>(std::filesystem::file_size(whole)),
              static_cast<uintmax_t>(std::filesystem::file_size(final_file)), dir.c_str());
  return 0;
}
