#include "common/flight_recorder.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <sstream>

#include "common/clock.h"
#include "common/thread_stacks.h"

namespace ppb::flight {

namespace {

/// One thread's innermost wait (Waiting), guarded by its own lock.
struct ThreadSlot {
  std::mutex mutex;
  int tid = 0;
  const char* what = nullptr;
  Tag tag;
  int lane = -1;
  double since = 0.0;
};

thread_local Tag t_current;

/// Takes `lock` within `limit_s` (try-lock and short sleeps); false if it could not.
bool lock_within(std::unique_lock<std::mutex>& lock, double limit_s) {
  for (double waited = 0.0;; waited += 1e-3) {
    if (lock.try_lock()) return true;
    if (waited >= limit_s) return false;
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
  }
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

/// The process-wide registry: live lanes, the last retired ones, the threads' wait slots, the
/// notes. Never destroyed (lane threads and thread_local slots may outlive static destruction).
struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<LaneLog>> live;
  std::vector<std::shared_ptr<LaneLog>> retired;  ///< the latest first
  std::vector<ThreadSlot*> slots;
  std::map<std::string, std::string> notes;
  int next_id = 1;
  static Registry& get() {
    static Registry* r = new Registry;
    return *r;
  }
};

/// This thread's wait slot, registered at its first use and unregistered when the thread ends.
ThreadSlot& this_slot() {
  struct Holder {
    ThreadSlot* slot = nullptr;
    ~Holder() {
      if (!slot) return;
      Registry& reg = Registry::get();
      {
        std::lock_guard<std::mutex> lock(reg.mutex);
        reg.slots.erase(std::remove(reg.slots.begin(), reg.slots.end(), slot), reg.slots.end());
      }
      delete slot;
    }
  };
  thread_local Holder holder;
  if (!holder.slot) {
    auto* s = new ThreadSlot;
    s->tid = this_thread_id();
    Registry& reg = Registry::get();
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.slots.push_back(s);
    holder.slot = s;
  }
  return *holder.slot;
}

}  // namespace

int this_thread_id() {
  thread_local const int tid = static_cast<int>(syscall(SYS_gettid));
  return tid;
}

std::string describe(const Tag& t) {
  std::ostringstream os;
  auto field = [&](const char* name, long long v) {
    if (v < 0) return;
    if (os.tellp() > 0) os << ' ';
    os << name << ' ' << v;
  };
  field("rep", t.rep);
  field("group", t.group);
  field("step", t.step);
  field("unit", t.unit);
  if (t.op) os << (os.tellp() > 0 ? " " : "") << t.op;
  if (t.peer >= 0) {
    const std::string op = t.op ? t.op : "";
    os << (op == "recv" ? " from" : op == "send" ? " to" : " with") << " rank " << t.peer;
  }
  if (t.msg_tag >= 0 || t.bytes >= 0) {
    os << " (";
    if (t.msg_tag >= 0) os << "tag " << t.msg_tag << (t.bytes >= 0 ? ", " : "");
    if (t.bytes >= 0) os << t.bytes << " B";
    os << ")";
  }
  return os.tellp() > 0 ? os.str() : std::string("-");
}

std::string describe(const Task& task) {
  std::string s = task.kind ? task.kind : "task";
  if (task.lane >= 0) s += " for lane #" + std::to_string(task.lane) + "'s record of";
  return s + " " + describe(task.tag);
}

const Tag& current() { return t_current; }

Scope::Scope(const Tag& tag) : saved_(t_current) { t_current = tag; }

Scope::~Scope() { t_current = saved_; }

Tag transfer(const char* op, int peer, int msg_tag, long long bytes) {
  Tag t = t_current;
  t.op = op;
  t.peer = peer;
  t.msg_tag = msg_tag;
  t.bytes = bytes;
  return t;
}

// ---- lanes --------------------------------------------------------------------------------

LaneLog::LaneLog(int id, std::string name, std::function<QueueView(size_t)> queue)
    : id_(id), name_(std::move(name)), queue_(std::move(queue)), idle_since_s_(monotonic_s()) {}

std::shared_ptr<LaneLog> LaneLog::open(const std::string& name, std::function<QueueView(size_t)> queue) {
  Registry& reg = Registry::get();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto log = std::make_shared<LaneLog>(reg.next_id++, name, std::move(queue));
  reg.live.push_back(log);
  return log;
}

void LaneLog::close() {
  Registry& reg = Registry::get();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = std::find_if(reg.live.begin(), reg.live.end(), [this](const auto& p) { return p.get() == this; });
  if (it == reg.live.end()) return;
  queue_ = nullptr;
  closed_ = true;
  reg.retired.insert(reg.retired.begin(), *it);
  reg.live.erase(it);
  if (reg.retired.size() > kRetired) reg.retired.pop_back();
}

void LaneLog::bind_thread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tid_ = this_thread_id();
  }
  const std::string thread_name = ("lane:" + name_).substr(0, 15);  // the kernel keeps 15 characters
  pthread_setname_np(pthread_self(), thread_name.c_str());
}

void LaneLog::start(const Task& task) {
  const double now = monotonic_s();
  std::lock_guard<std::mutex> lock(mutex_);
  now_.task = task;
  now_.start_s = now;
  running_ = true;
}

void LaneLog::finish() {
  const double now = monotonic_s();
  std::lock_guard<std::mutex> lock(mutex_);
  now_.end_s = now;
  ring_[done_ % kRing] = now_;
  ++done_;
  running_ = false;
  idle_since_s_ = now;
}

int LaneLog::thread_id() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tid_;
}

namespace {

/// The queue line of a live lane (its callback try-locks the lane's own lock).
std::string queue_line(const std::function<QueueView(size_t)>& queue) {
  if (!queue) return "";
  const QueueView q = queue(LaneLog::kQueuedShown);
  if (q.busy) return "  queued: unknown (the lane's queue is locked)\n";
  std::ostringstream os;
  os << "  queued " << q.count << (q.count ? ": " : "");
  for (size_t i = 0; i < q.first.size(); ++i) os << (i ? " | " : "") << describe(q.first[i]);
  if (q.count > q.first.size()) os << " | ... (" << q.count - q.first.size() << " more)";
  os << "\n";
  return os.str();
}

}  // namespace

std::string LaneLog::report(double now_s) const {
  return report_log(now_s) + queue_line(queue_);
}

std::string LaneLog::report_log(double now_s) const {
  std::ostringstream os;
  os << "lane " << name_ << " #" << id_;
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (!lock_within(lock, 0.05)) return os.str() + ": its log is locked (the lane's thread holds it): skipped\n";
  os << " (thread " << tid_ << ", " << done_ << " tasks done" << (closed_ ? ", destroyed" : "") << "): ";
  if (running_)
    os << "running for " << seconds(now_s - now_.start_s) << ": " << describe(now_.task) << "\n";
  else
    os << "idle for " << seconds(now_s - idle_since_s_) << "\n";
  const long long n = std::min<long long>(done_, kRing);
  if (n > 0) os << "  last " << n << " (oldest first; started ago, took):\n";
  for (long long i = done_ - n; i < done_; ++i) {
    const Entry& e = ring_[i % kRing];
    char buf[64];
    std::snprintf(buf, sizeof buf, "    %10.6f s ago  %10.6f s  ", now_s - e.start_s, e.end_s - e.start_s);
    os << buf << describe(e.task) << "\n";
  }
  return os.str();
}

// ---- waits and notes ----------------------------------------------------------------------

Waiting::Waiting(const char* what, const Tag& tag, int lane) {
  ThreadSlot& s = this_slot();
  const double now = monotonic_s();
  std::lock_guard<std::mutex> lock(s.mutex);
  saved_what_ = s.what;
  saved_tag_ = s.tag;
  saved_lane_ = s.lane;
  saved_since_ = s.since;
  s.what = what;
  s.tag = tag;
  s.lane = lane;
  s.since = now;
}

Waiting::~Waiting() {
  ThreadSlot& s = this_slot();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.what = saved_what_;
  s.tag = saved_tag_;
  s.lane = saved_lane_;
  s.since = saved_since_;
}

void note(const std::string& key, const std::string& value) {
  Registry& reg = Registry::get();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (value.empty())
    reg.notes.erase(key);
  else
    reg.notes[key] = value;
}

std::string lane_of_thread(int tid) {
  Registry& reg = Registry::get();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (const auto& l : reg.live)
    if (l->thread_id() == tid) return "lane " + l->name() + " #" + std::to_string(l->id());
  return "";
}

namespace {

/// The report's lanes, retired lanes and waits (registry lock held by the caller).
void report_registry(Registry& reg, double now, std::ostringstream& os) {
  for (const auto& [k, v] : reg.notes) os << "note: " << k << ": " << v << "\n";
  if (reg.live.empty()) os << "lanes: none\n";
  for (const auto& l : reg.live) os << l->report(now);
  if (!reg.retired.empty()) os << "retired lanes (destroyed, the latest first):\n";
  for (const auto& l : reg.retired) os << l->report(now);
  auto lane_name = [&](auto match) {
    for (const auto* list : {&reg.live, &reg.retired})
      for (const auto& l : *list)
        if (match(*l)) return "lane " + l->name() + " #" + std::to_string(l->id());
    return std::string();
  };
  std::ostringstream waits;
  int n = 0;
  for (ThreadSlot* s : reg.slots) {
    std::unique_lock<std::mutex> lock(s->mutex, std::defer_lock);
    if (!lock_within(lock, 0.05)) continue;
    if (!s->what) continue;
    ++n;
    const std::string own = lane_name([&](const LaneLog& l) { return l.thread_id() == s->tid; });
    waits << "  thread " << s->tid << (own.empty() ? "" : " (" + own + ")") << ": " << s->what;
    if (s->tag.op || s->tag.rep >= 0 || s->tag.unit >= 0) waits << " for " << describe(s->tag);
    if (s->lane >= 0) waits << " on " << lane_name([&](const LaneLog& l) { return l.id() == s->lane; });
    waits << ", for " << seconds(now - s->since) << "\n";
  }
  os << "pending waits and transfers: " << n << (n ? "\n" : " (no thread is in a recorded wait)\n") << waits.str();
}

}  // namespace

std::string report(const std::string& header, bool stacks, double thread_timeout_s) {
  std::ostringstream os;
  os << "flight record: " << header << "\n";
  {
    Registry& reg = Registry::get();
    std::lock_guard<std::mutex> lock(reg.mutex);
    report_registry(reg, monotonic_s(), os);
  }
  if (stacks) os << thread_stacks(thread_timeout_s);
  return os.str();
}

}  // namespace ppb::flight
