// The flight recorder (issue 35, item 9): what every lane of this process is running, what it
// has queued and what it ran last, which transfers and waits are pending on which thread, and
// (common/thread_stacks.h) every thread's stack, written when the watchdog finds no progress or
// a rank aborts the job, as NCCL's and PyTorch's flight recorders do.
//
// Cost on the hot path: a lane task copies a Tag (48 bytes) into its queue entry and takes its
// own lane's log lock twice (start, finish: uncontended but while a report reads it, ~20 ns
// each); a wait (Waiting) takes its own thread's slot lock twice. No global lock is taken per
// task or per transfer: the registry's lock guards only lanes coming and going, threads' first
// waits and the notes (once per repetition). Tags are formatted only when a report is written.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ppb::flight {

/// What a piece of work is, for a report: set by whoever enqueues it (Scope), copied into each
/// lane task, formatted only when a report is written. -1 / null where it does not apply.
struct Tag {
  const char* op = nullptr;  ///< static text: "compute", "recv", "send", "barrier", "profile decode", ...
  int rep = -1, group = -1, step = -1;  ///< the pipeline item: repetition, request group, step (0 = prefill)
  int unit = -1;                        ///< a profiled unit
  int peer = -1, msg_tag = -1;          ///< a transfer's peer rank and message tag
  long long bytes = -1;                 ///< a transfer's bytes
};

/// "rep 3 group 1 step 7 recv from rank 0 (tag 7, 4096 B)"; "-" for an empty tag.
std::string describe(const Tag& tag);

/// The tag of this thread's innermost Scope (a lane's thread: the task it runs); empty outside.
const Tag& current();

/// Sets this thread's current tag for the Scope's lifetime, then restores the previous one.
class Scope {
 public:
  explicit Scope(const Tag& tag);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Tag saved_;
};

/// current() with a transfer's fields: op, peer, message tag, bytes.
Tag transfer(const char* op, int peer, int msg_tag, long long bytes);

/// One task of a lane as a report names it: its kind ("task", "record", "wait"), its tag and,
/// for a wait, the lane whose record it waits for (LaneLog::id, -1 if none).
struct Task {
  const char* kind = "task";
  Tag tag;
  int lane = -1;
};

/// "task rep 3 group 1 step 7 compute", "wait for lane recv's record of rep 3 ... recv".
std::string describe(const Task& task);

/// A lane's queue as a report sees it: how many tasks wait, the first few of them; `busy` when
/// its lock could not be taken in time (the count is then unknown).
struct QueueView {
  size_t count = 0;
  std::vector<Task> first;
  bool busy = false;
};

/// What one lane ran: the task it runs now (with its start) and a ring of its last kRing
/// finished tasks. The lane owns it; the registry shares it and keeps the logs of the last
/// lanes destroyed (a failure often unwinds the lanes before the report is written).
class LaneLog {
 public:
  static constexpr int kRing = 16;
  static constexpr size_t kQueuedShown = 6;
  /// Registers a lane named `name`. `queue(max)` returns its queued tasks (at most `max` of
  /// them listed), is called by a report on any thread and must not block for long (try-lock).
  static std::shared_ptr<LaneLog> open(const std::string& name, std::function<QueueView(size_t)> queue);
  /// Moves the log among the retired ones (the last kRetired are kept) and drops the queue
  /// callback: call first thing in the lane's destructor.
  void close();
  static constexpr size_t kRetired = 8;

  /// On the lane's own thread, once: records its thread id and names the thread "lane:<name>".
  void bind_thread();
  /// The lane's thread starts `task` / finishes the task it started.
  void start(const Task& task);
  void finish();

  int id() const { return id_; }
  const std::string& name() const { return name_; }
  /// The lane's part of a report: its log (lock taken with a bounded try) and, while it lives,
  /// its queue. Called with the registry's lock held (it guards the queue callback).
  std::string report(double now_s) const;
  int thread_id() const;

  LaneLog(int id, std::string name, std::function<QueueView(size_t)> queue);

 private:
  std::string report_log(double now_s) const;
  struct Entry {
    Task task;
    double start_s = 0.0, end_s = 0.0;
  };
  const int id_;
  const std::string name_;
  mutable std::mutex mutex_;
  std::function<QueueView(size_t)> queue_;  ///< null once closed; guarded by the registry's lock
  int tid_ = 0;
  bool running_ = false;
  Entry now_;
  Entry ring_[kRing];
  long long done_ = 0;  ///< tasks finished (ring_[(done_ - 1) % kRing] the last)
  double idle_since_s_ = 0.0;
  bool closed_ = false;
};

/// Marks this thread as blocked in `what` (a static text: "MPI recv", "MPI_Barrier", "lane
/// synchronize") for the object's lifetime; nests (the innermost is shown). `lane`: the lane it
/// waits for (LaneLog::id), -1 if none.
class Waiting {
 public:
  explicit Waiting(const char* what, const Tag& tag = current(), int lane = -1);
  ~Waiting();
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  const char* saved_what_;
  Tag saved_tag_;
  int saved_lane_;
  double saved_since_;
};

/// Sets a note shown at the top of every report (e.g. "pipeline" -> "stage 1 of 2, repetition
/// 3 of 5"); "" removes it. Takes the registry's lock: call per repetition, not per item.
void note(const std::string& key, const std::string& value);

/// The report of this process now, after a header line `header`: the notes, every lane (then
/// the retired ones), the pending waits, and with `stacks` every thread's stack
/// (common/thread_stacks.h, `thread_timeout_s` per thread). Callable from any thread; takes no
/// lock without a bound, so a stuck lane cannot hang it.
std::string report(const std::string& header, bool stacks = true, double thread_timeout_s = 0.3);

/// The name a report gives thread `tid`: its lane ("lane compute #3") or "" if none.
std::string lane_of_thread(int tid);

/// This thread's kernel id (gettid).
int this_thread_id();

}  // namespace ppb::flight
