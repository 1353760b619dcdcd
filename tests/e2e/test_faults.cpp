// Reliability: a rank killed in the middle of the benchmark, and a rank that stops answering,
// must end the job non-zero within --timeout plus a few seconds, with the results file holding
// the profile (complete=0) and, where rank 0 lives, the failure recorded; a stall leaves every
// rank's flight record (its lanes' running, queued and last items, its waits and its threads'
// stacks) in the log and in /failure/flight_record.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "scratch_dir.h"
#include "results/h5.h"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

std::string temp_dir() { return ppb_test::scratch_dir("ppbench_faults_"); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// PID of the ppbench process of world rank `rank` whose command line mentions `marker`.
pid_t find_rank(const std::string& marker, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_file(e.path() / "cmdline");
    if (cmd.find("ppbench") == std::string::npos || cmd.find(marker) == std::string::npos) continue;
    if (cmd.rfind("mpirun", 0) == 0) continue;
    std::string env = read_file(e.path() / "environ");
    if (env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos) return std::stoi(name);
  }
  return -1;
}

/// Starts `cmd` in the background (its output to `log`), returns the shell's pid.
pid_t spawn(const std::string& cmd, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    std::string full = "cd " PPB_SOURCE_DIR " && exec " + cmd + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", full.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

/// Waits for `pid` up to `limit_s`; returns its exit status, or -1 on timeout (then kills it).
int wait_for(pid_t pid, double limit_s, double* seconds) {
  auto t0 = clock_type::now();
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    *seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (*seconds > limit_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string mpirun_env() {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 ";
}

/// The file holds the profile, is marked incomplete, and says why when rank 0 could record it.
void check_partial_file(const std::string& path, int world) {
  ASSERT_TRUE(fs::exists(path)) << path;
  auto root = ppb::h5::File::open(path).root();
  EXPECT_EQ(root.get_attr<int64_t>("complete"), 0);
  auto lat = root.open_group("profile").open_dataset("latency_ms");
  EXPECT_EQ(lat.dims()[0], static_cast<hsize_t>(world));
  for (double v : lat.read<double>()) EXPECT_GT(v, 0.0);
  EXPECT_TRUE(root.exists("partitions/uniform"));
}

TEST(Faults, RankKilledMidBenchmarkEndsJobAndKeepsProfile) {
  const std::string dir = temp_dir(), out = dir + "/killed.h5", log = dir + "/killed.log";
  const double timeout = 10;
  // A long benchmark (many decode steps) so that the kill lands in its middle.
  pid_t job = spawn(mpirun_env() + "mpirun --oversubscribe -np 4 " PPBENCH_BIN " run --model tests/data/tiny-llama.json "
                    "-g 400 --iters 200 --timeout 10 -o " + out, log);
  // Wait for the snapshot written after the profile ("running: benchmark"), then a bit more.
  auto t0 = clock_type::now();
  bool benchmarking = false;
  while (std::chrono::duration<double>(clock_type::now() - t0).count() < 60) {
    if (read_file(log).find("benchmark round 2:") != std::string::npos) {
      benchmarking = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(benchmarking) << read_file(log);
  pid_t victim = find_rank(out, 2);
  ASSERT_GT(victim, 0) << "rank 2 not found";
  const auto kill_time = clock_type::now();
  kill(victim, SIGKILL);
  double seconds = 0;
  int status = wait_for(job, timeout + 20, &seconds);
  const double after_kill = std::chrono::duration<double>(clock_type::now() - kill_time).count();
  EXPECT_NE(status, -1) << "the job did not end within --timeout + 20 s of the kill\n" << read_file(log);
  EXPECT_NE(status, 0) << read_file(log);
  EXPECT_LT(after_kill, timeout + 10);
  std::printf("killed rank 2: job ended %.1f s later with status %d\n", after_kill, status);
  check_partial_file(out, 4);
  // Every round finished before the kill is in the file (its rows appended after the round;
  // "benchmark round N:" is printed after that append): N rounds printed, N or N + 1 rows (the
  // kill may land between a round's append and its line), of every measured partition; none
  // validated yet.
  const std::string text = read_file(log);
  int printed = 0;
  for (size_t at = text.find("benchmark round "); at != std::string::npos; at = text.find("benchmark round ", at + 1))
    printed = std::max(printed, std::atoi(text.c_str() + at + 16));
  ASSERT_GE(printed, 2) << text;
  auto root = ppb::h5::File::open(out).root();
  int measured = 0;
  for (const std::string& name : root.get_attr<std::vector<std::string>>("partition_order")) {
    if (!root.exists("benchmark/" + name) || !root.open_group("partitions/" + name).get_attr<std::string>("same_as").empty()) continue;
    ++measured;
    const size_t rows = root.open_group("benchmark/" + name).open_dataset("rep_tokens_per_s").read<double>().size();
    EXPECT_GE(rows, static_cast<size_t>(printed)) << name;
    EXPECT_LE(rows, static_cast<size_t>(printed) + 1) << name;
  }
  EXPECT_GE(measured, 1);
  EXPECT_EQ(root.open_group("validation/uniform").get_attr<int64_t>("validated"), 0);
}

TEST(Faults, StalledRankEndsJobNamingTheWaitingStage) {
  const std::string dir = temp_dir(), out = dir + "/stalled.h5", log = dir + "/stalled.log";
  const double timeout = 5;
  // Rank 1 stops answering at item 3 of its first timed repetition (PPBENCH_FAULT).
  pid_t job = spawn(mpirun_env() + "PPBENCH_FAULT=stall:1:3 mpirun --oversubscribe -x PPBENCH_FAULT -np 4 " PPBENCH_BIN
                    " run --model tests/data/tiny-llama.json --timeout 5 -o " + out, log);
  double seconds = 0;
  int status = wait_for(job, 60, &seconds);
  std::string text = read_file(log);
  ASSERT_NE(status, -1) << "hang\n" << text;
  EXPECT_NE(status, 0) << text;
  EXPECT_NE(text.find("timed out"), std::string::npos) << text;
  EXPECT_NE(text.find("stage "), std::string::npos) << text;
  EXPECT_NE(text.find("--timeout"), std::string::npos) << text;
  std::printf("stalled rank 1: job ended after %.1f s (timeout %.0f s) with status %d\n", seconds, timeout, status);
  check_partial_file(out, 4);
  auto root = ppb::h5::File::open(out).root();
  std::string failure = root.get_attr<std::string>("failure");
  EXPECT_NE(failure.find("timed out"), std::string::npos) << failure;
  EXPECT_EQ(root.get_attr<std::string>("status"), "failed");
}

/// The lines of `log` that rank `rank` printed with its flight record ("[rank R] " stripped).
std::string rank_lines(const std::string& log, int rank) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  std::istringstream in(log);
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) out += line.substr(prefix.size()) + "\n";
  return out;
}

/// A thread's stack in a record: a "thread <tid> ..." line followed by frame "#0".
bool has_a_stack(const std::string& record) {
  const size_t at = record.find("\n  thread ");
  return at != std::string::npos && record.find("\n    #0 ", at) != std::string::npos;
}

/// Issue 35, item 9: rank 1's compute lane stops at item 3 of its first timed repetition; rank
/// 0's receive times out, and every rank's flight record (log and file) says what each was
/// doing: rank 1's names its compute lane running that item, with its queue behind it, and
/// every thread's stack.
TEST(Faults, FlightRecordNamesTheStuckLaneAndItem) {
  const std::string dir = temp_dir(), out = dir + "/flight.h5", log = dir + "/flight.log";
  pid_t job = spawn(mpirun_env() + "PPBENCH_FAULT=stall:1:3 mpirun --oversubscribe -x PPBENCH_FAULT -np 2 " PPBENCH_BIN
                    " run --model tests/data/tiny-llama.json --timeout 5 -o " + out, log);
  double seconds = 0;
  const int status = wait_for(job, 60, &seconds);
  const std::string text = read_file(log);
  ASSERT_NE(status, -1) << "hang\n" << text;
  EXPECT_NE(status, 0) << text;
  auto root = ppb::h5::File::open(out).root();
  const auto work = root.open_group("config/workload");
  const int64_t M = work.get_attr<int64_t>("microbatches"), warmup = work.get_attr<int64_t>("warmup");
  // Item 3 of the first timed repetition: group 3 % M, step 3 / M.
  const std::string stuck = "task rep " + std::to_string(warmup) + " group " + std::to_string(3 % M) + " step " +
                            std::to_string(3 / M) + " injected stall (PPBENCH_FAULT)\n";
  const std::string r1 = rank_lines(text, 1);
  EXPECT_NE(r1.find("flight record: rank 1 of 2"), std::string::npos) << text;
  EXPECT_NE(r1.find("phase 'benchmark of partition uniform'"), std::string::npos) << r1;
  EXPECT_NE(r1.find("note: pipeline: stage 1 (units"), std::string::npos) << r1;
  const size_t lane = r1.find("lane compute #");
  ASSERT_NE(lane, std::string::npos) << r1;
  const std::string compute = r1.substr(lane, r1.find('\n', lane) - lane + 1);
  EXPECT_NE(compute.find("): running for "), std::string::npos) << compute;
  EXPECT_NE(compute.find(" s: " + stuck), std::string::npos) << compute << "expected: " << stuck;
  EXPECT_NE(r1.find("  queued "), std::string::npos) << r1;  // the items behind it
  EXPECT_NE(r1.find("wait for lane #"), std::string::npos) << r1;  // recv and send wait for compute
  EXPECT_NE(r1.find("\"lane:compute\" [lane compute #"), std::string::npos) << r1;  // its thread's stack
  EXPECT_TRUE(has_a_stack(r1)) << r1;
  const std::string r0 = rank_lines(text, 0);
  EXPECT_NE(r0.find("flight record: rank 0 of 2"), std::string::npos) << text;
  EXPECT_NE(r0.find("timed out"), std::string::npos) << r0;
  EXPECT_TRUE(has_a_stack(r0)) << r0;
  // The file holds both records, rank 1's naming the same lane and item.
  ASSERT_TRUE(root.exists("failure/flight_record")) << text;
  const auto records = root.open_group("failure").open_dataset("flight_record").read_strings();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_NE(records[0].find("flight record: rank 0 of 2"), std::string::npos) << records[0];
  EXPECT_NE(records[1].find("flight record: rank 1 of 2"), std::string::npos) << records[1];
  EXPECT_NE(records[1].find(" s: " + stuck), std::string::npos) << records[1];
  EXPECT_TRUE(has_a_stack(records[1])) << records[1];
  std::printf("flight record of the stalled rank (%.1f s, status %d):\n%s\n", seconds, status, compute.c_str());
}

/// Every rank stuck where nothing polls (each main thread asleep at the start of the profile):
/// no transfer times out, the watchdog ends the job after --timeout + 15 s, and each rank's
/// flight record names the phase, the wait and the sleeping function in its main thread's stack.
TEST(Faults, WatchdogWritesEveryRanksFlightRecord) {
  const std::string dir = temp_dir(), out = dir + "/watchdog.h5", log = dir + "/watchdog.log";
  pid_t job = spawn(mpirun_env() + "PPBENCH_FAULT=hang:-1:profile mpirun --oversubscribe -x PPBENCH_FAULT -np 2 " PPBENCH_BIN
                    " run --model tests/data/tiny-llama.json --timeout 1 -o " + out, log);
  double seconds = 0;
  const int status = wait_for(job, 90, &seconds);
  const std::string text = read_file(log);
  ASSERT_NE(status, -1) << "hang\n" << text;
  EXPECT_NE(status, 0) << text;
  EXPECT_GT(seconds, 16.0) << text;  // the watchdog's limit: --timeout 1 s + 15 s
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    const std::string r = rank_lines(text, rank);
    EXPECT_NE(r.find("flight record: rank " + std::to_string(rank) + " of 2"), std::string::npos) << text;
    EXPECT_NE(r.find("phase 'profile'"), std::string::npos) << r;
    EXPECT_NE(r.find("no progress for "), std::string::npos) << r;
    EXPECT_NE(r.find(": sleep for injected hang (PPBENCH_FAULT), for "), std::string::npos) << r;
    EXPECT_NE(r.find("ppb::run::PhaseRunner::hang_if_injected"), std::string::npos) << r;
    EXPECT_TRUE(has_a_stack(r)) << r;
  }
  auto root = ppb::h5::File::open(out).root();
  EXPECT_EQ(root.get_attr<int64_t>("complete"), 0);
  EXPECT_NE(root.get_attr<std::string>("failure").find("failed in profile: no progress for"), std::string::npos);
  const auto records = root.open_group("failure").open_dataset("flight_record").read_strings();
  ASSERT_EQ(records.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(records[rank].find("flight record: rank " + std::to_string(rank) + " of 2"), std::string::npos) << records[rank];
    EXPECT_NE(records[rank].find("injected hang"), std::string::npos) << records[rank];
  }
  std::printf("watchdog: job ended after %.1f s with status %d\n", seconds, status);
}

}  // namespace
