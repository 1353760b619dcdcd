// The flight recorder (common/flight_recorder.h, common/thread_stacks.h): tags as a report
// writes them, a CPU lane's running, queued and last tasks, waits between lanes, pending waits,
// retired lanes, notes, and every thread's stack, also with a thread that cannot answer.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "backend/cpu/cpu_lane.h"
#include "common/flight_recorder.h"
#include "common/thread_stacks.h"

/// A function the stack test finds by name (external linkage, not inlined; the test binary is
/// linked with -rdynamic).
extern "C" __attribute__((noinline)) void ppb_test_blocked_in_here(std::atomic<bool>* go, std::atomic<bool>* entered) {
  entered->store(true);
  while (!go->load()) {
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
  }
  asm volatile("" ::: "memory");  // no tail call: the frame stays
}

namespace {

using namespace ppb;

void wait_until(const std::function<bool()>& cond) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!cond() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(cond());
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

flight::Tag item(const char* op, int rep, int group, int step) { return {op, rep, group, step}; }

TEST(FlightRecorder, DescribesTagsAsTheReportWritesThem) {
  EXPECT_EQ(flight::describe(item("compute", 3, 1, 7)), "rep 3 group 1 step 7 compute");
  flight::Tag recv = item("recv", 0, 2, 0);
  recv.peer = 1;
  recv.msg_tag = 12;
  recv.bytes = 4096;
  EXPECT_EQ(flight::describe(recv), "rep 0 group 2 step 0 recv from rank 1 (tag 12, 4096 B)");
  flight::Tag prof;
  prof.op = "profile decode";
  prof.unit = 5;
  EXPECT_EQ(flight::describe(prof), "unit 5 profile decode");
  EXPECT_EQ(flight::describe(flight::Tag{}), "-");
  EXPECT_EQ(flight::describe(flight::Task{"wait", item("send", 1, 0, 2), 4}), "wait for lane #4's record of rep 1 group 0 step 2 send");
}

TEST(FlightRecorder, ScopesNestAndTransfersAddToTheItem) {
  EXPECT_EQ(flight::current().op, nullptr);
  {
    flight::Scope outer(item("recv", 2, 1, 3));
    const flight::Tag t = flight::transfer("recv", 0, 7, 64);
    EXPECT_EQ(flight::describe(t), "rep 2 group 1 step 3 recv from rank 0 (tag 7, 64 B)");
    {
      flight::Scope inner(item("compute", 2, 1, 3));
      EXPECT_STREQ(flight::current().op, "compute");
    }
    EXPECT_STREQ(flight::current().op, "recv");
  }
  EXPECT_EQ(flight::current().op, nullptr);
}

/// A lane stuck in item (rep 3, group 1, step 7)'s compute with two tasks queued behind it.
TEST(FlightRecorder, ReportNamesTheLaneItsRunningItemAndItsQueue) {
  CpuLane lane("compute");
  std::atomic<bool> go{false}, started{false};
  {
    flight::Scope s(item("compute", 3, 1, 7));
    lane.host_task([&] {
      started = true;
      while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  {
    flight::Scope s(item("compute", 3, 0, 8));
    lane.host_task([] {});
    CpuEvent ev;
    lane.record(ev);
  }
  wait_until([&] { return started.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string r = flight::report("test", /*stacks=*/false);
  EXPECT_TRUE(contains(r, "flight record: test\n")) << r;
  EXPECT_TRUE(contains(r, "lane compute #")) << r;
  EXPECT_TRUE(contains(r, ": running for ")) << r;
  EXPECT_TRUE(contains(r, " s: task rep 3 group 1 step 7 compute\n")) << r;
  EXPECT_TRUE(contains(r, "  queued 2: task rep 3 group 0 step 8 compute | record rep 3 group 0 step 8 compute\n")) << r;
  go = true;
  lane.synchronize();
  wait_until([] { return contains(flight::report("after", false), "idle for "); });  // the record's task logged
  const std::string after = flight::report("after", false);
  EXPECT_TRUE(contains(after, "idle for ")) << after;
  EXPECT_TRUE(contains(after, "  queued 0\n")) << after;
}

/// The ring keeps the last 16 finished tasks, oldest first.
TEST(FlightRecorder, LastTasksAreTheLatestSixteenInOrder) {
  CpuLane lane("ring");
  for (int i = 0; i < 40; ++i) {
    flight::Scope s(item("compute", 0, 0, i));
    lane.host_task([] {});
  }
  {
    flight::Scope s(item("done", 0, 0, 99));
    lane.synchronize();  // its own record is the 41st task
  }
  // synchronize() returns once the record's event completed, a moment before the lane logs
  // that task finished.
  wait_until([] { return contains(flight::report("ring", false), "41 tasks done"); });
  const std::string r = flight::report("ring", false);
  const size_t at = r.find("lane ring #");
  ASSERT_NE(at, std::string::npos) << r;
  const std::string mine = r.substr(at, r.find("\nlane ", at + 1) - at);
  EXPECT_TRUE(contains(mine, "41 tasks done")) << mine;
  EXPECT_TRUE(contains(mine, "last 16 (oldest first")) << mine;
  EXPECT_FALSE(contains(mine, "step 24 compute")) << mine;  // 41 - 16 = 25 tasks fell out
  size_t prev = 0;
  for (int i = 25; i < 40; ++i) {
    const size_t pos = mine.find("task rep 0 group 0 step " + std::to_string(i) + " compute\n");
    ASSERT_NE(pos, std::string::npos) << i << "\n" << mine;
    EXPECT_GT(pos, prev) << i;
    prev = pos;
  }
  EXPECT_GT(mine.find("record rep 0 group 0 step 99 done\n"), prev) << mine;
}

/// A lane waiting for another lane's record says whose and of what; the waiting main thread
/// is a pending wait on that lane.
TEST(FlightRecorder, WaitsNameTheLaneAndRecordTheyWaitFor) {
  CpuLane recv("recv"), compute("compute");
  std::atomic<bool> go{false}, started{false};
  CpuEvent ev;
  {
    flight::Scope s(item("recv", 1, 0, 4));
    recv.host_task([&] {
      started = true;
      while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    recv.record(ev);
  }
  compute.wait(ev);
  wait_until([&] { return started.load(); });
  std::thread waiter([&] {
    flight::Scope s(item("synchronize", 1, 0, 4));
    compute.synchronize();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string r = flight::report("waits", false);
  const std::string recv_id = r.substr(r.find("lane recv #") + 11, r.find(' ', r.find("lane recv #") + 11) - r.find("lane recv #") - 11);
  EXPECT_TRUE(contains(r, "running for")) << r;
  EXPECT_TRUE(contains(r, "wait for lane #" + recv_id + "'s record of rep 1 group 0 step 4 recv\n")) << r;
  EXPECT_TRUE(contains(r, ": lane synchronize for rep 1 group 0 step 4 synchronize on lane compute #")) << r;
  go = true;
  waiter.join();
  const std::string after = flight::report("after", false);
  EXPECT_FALSE(contains(after, "lane synchronize")) << after;
}

TEST(FlightRecorder, PendingWaitsNestAndEnd) {
  std::atomic<int> stage{0};
  std::atomic<bool> go{false};
  std::thread t([&] {
    flight::Waiting outer("MPI_Barrier", item("profile", -1, -1, -1));
    {
      flight::Waiting inner("MPI_Irecv", item("recv", 0, 1, 2), -1);
      stage = 1;
      while (stage.load() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stage = 3;
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  wait_until([&] { return stage.load() == 1; });
  std::string r = flight::report("nest", false);
  EXPECT_TRUE(contains(r, ": MPI_Irecv for rep 0 group 1 step 2 recv, for ")) << r;
  EXPECT_FALSE(contains(r, "MPI_Barrier")) << r;  // the innermost wait is shown
  stage = 2;
  wait_until([&] { return stage.load() == 3; });
  r = flight::report("outer", false);
  EXPECT_TRUE(contains(r, ": MPI_Barrier for profile, for ")) << r;
  go = true;
  t.join();
  r = flight::report("none", false);
  EXPECT_FALSE(contains(r, "MPI_Barrier")) << r;
  EXPECT_FALSE(contains(r, "MPI_Irecv")) << r;
}

TEST(FlightRecorder, DestroyedLanesAreKeptAmongTheRetiredWithTheirLastTasks) {
  {
    CpuLane lane("short-lived");
    flight::Scope s(item("send", 2, 3, 4));
    lane.host_task([] {});
    lane.synchronize();
  }
  const std::string r = flight::report("retired", false);
  const size_t retired = r.find("retired lanes (destroyed, the latest first):\n");
  ASSERT_NE(retired, std::string::npos) << r;
  const size_t at = r.find("lane short-lived #", retired);
  ASSERT_NE(at, std::string::npos) << r;
  EXPECT_TRUE(contains(r.substr(at), "destroyed): idle for")) << r;
  EXPECT_TRUE(contains(r.substr(at), "task rep 2 group 3 step 4 send\n")) << r;
}

TEST(FlightRecorder, NotesHeadTheReportUntilErased) {
  flight::note("pipeline", "stage 1 of 2, repetition 3 of 5");
  EXPECT_TRUE(contains(flight::report("n", false), "note: pipeline: stage 1 of 2, repetition 3 of 5\n"));
  flight::note("pipeline", "");
  EXPECT_FALSE(contains(flight::report("n", false), "note: pipeline"));
}

/// Every thread's stack: a helper blocked in a known function shows it by name, a lane thread
/// its name and lane; a thread that blocks the signal is reported as not answering, in time.
TEST(FlightRecorder, ThreadStacksNameTheBlockedFunctionAndSurviveAThreadThatCannotAnswer) {
  std::atomic<bool> go{false}, masked{false}, entered{false};
  std::thread blocked([&] { ppb_test_blocked_in_here(&go, &entered); });
  std::thread deaf([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, flight::stack_signal());
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    masked = true;
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  CpuLane lane("stacks");
  wait_until([&] { return masked.load() && entered.load(); });
  const auto t0 = std::chrono::steady_clock::now();
  const std::string s = flight::thread_stacks(0.2);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  go = true;
  blocked.join();
  deaf.join();
  EXPECT_TRUE(contains(s, "ppb_test_blocked_in_here")) << s;
  EXPECT_TRUE(contains(s, "\"lane:stacks\" [lane stacks #")) << s;
  EXPECT_TRUE(contains(s, "ppb::CpuLane::run()")) << s;
  EXPECT_TRUE(contains(s, "[writing this record]")) << s;
  EXPECT_TRUE(contains(s, "(no answer within 200 ms: signals blocked, or stuck in the kernel)")) << s;
  EXPECT_LT(took, 3.5) << s;  // at most 0.2 s for the deaf thread, 3 s in all
  // The full report has the stacks after the lanes.
  const std::string r = flight::report("all", true, 0.2);
  EXPECT_LT(r.find("lane stacks #"), r.find("threads: ")) << r;
}

}  // namespace
