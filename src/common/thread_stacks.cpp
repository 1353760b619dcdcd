#include "common/thread_stacks.h"

#include <cxxabi.h>
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/clock.h"
#include "common/flight_recorder.h"

namespace ppb::flight {

namespace {

constexpr int kMaxFrames = 48;

/// One thread's answer. Allocated per request and never freed when the thread did not answer in
/// time (its handler may still run later and write into it): kept in abandoned() instead.
struct Request {
  int tid = 0;
  void* frames[kMaxFrames];
  std::atomic<int> count{-1};
};

/// The requests of threads that did not answer (reachable: not a leak to a leak checker).
std::vector<std::unique_ptr<Request>>& abandoned() {
  static auto* list = new std::vector<std::unique_ptr<Request>>;
  return *list;
}

std::atomic<Request*> g_request{nullptr};

extern "C" void on_stack_signal(int, siginfo_t*, void*) {
  const int saved = errno;
  Request* r = g_request.load(std::memory_order_acquire);
  if (r && r->tid == static_cast<int>(syscall(SYS_gettid))) r->count.store(backtrace(r->frames, kMaxFrames), std::memory_order_release);
  errno = saved;
}

std::once_flag g_installed;

/// A demangled name with the argument lists that name library types shortened to "(...)":
/// "f(std::__cxx11::basic_string<...> const&)" -> "f(...)"; "(anonymous namespace)" and short
/// lists stay.
std::string short_name(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '(') {
      out += name[i];
      continue;
    }
    int depth = 0;
    size_t j = i;
    for (; j < name.size(); ++j) {
      depth += name[j] == '(' ? 1 : name[j] == ')' ? -1 : 0;
      if (depth == 0) break;
    }
    const std::string inner = name.substr(i + 1, j - i - 1);
    out += inner.find("std::") != std::string::npos || inner.size() > 40 ? "(...)" : "(" + inner + ")";
    i = j;
  }
  return out.size() > 160 ? out.substr(0, 160) + "..." : out;
}

/// "ppb::CpuLane::run()+0x1f (ppbench) [0x55..]" from backtrace_symbols' "path(mangled+0x1f) [0x55..]".
std::string readable_frame(const std::string& s) {
  const size_t open = s.find('(');
  const size_t close = open == std::string::npos ? std::string::npos : s.find(')', open);
  if (close == std::string::npos) return s;
  const size_t slash = s.rfind('/', open);
  const std::string module = s.substr(slash == std::string::npos ? 0 : slash + 1, open - (slash == std::string::npos ? 0 : slash + 1));
  const size_t plus = s.find('+', open);
  const size_t name_end = plus < close ? plus : close;
  std::string name = s.substr(open + 1, name_end - open - 1);
  if (name.empty()) {
    name = "??";
  } else {
    int status = 0;
    char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
    if (status == 0 && d) name = short_name(d);
    std::free(d);
  }
  return name + s.substr(name_end, close - name_end) + " (" + module + ")" + s.substr(close + 1);
}

/// The frames as lines, skipping the first `skip` (the handler and the signal trampoline).
std::string format_frames(void* const* frames, int n, int skip) {
  std::ostringstream os;
  char** syms = backtrace_symbols(frames, n);
  for (int i = skip; i < n; ++i)
    os << "    #" << i - skip << " " << (syms ? readable_frame(syms[i]) : std::string("?")) << "\n";
  std::free(syms);
  return os.str();
}

std::vector<int> thread_ids() {
  std::vector<int> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(std::atoi(e->d_name));
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string thread_name(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

/// Signals `tid` and waits up to `timeout_s` for its frames; "" if it did not answer.
std::string stack_of(int tid, double timeout_s) {
  auto* r = new Request;
  r->tid = tid;
  g_request.store(r, std::memory_order_release);
  if (syscall(SYS_tgkill, getpid(), tid, stack_signal()) != 0) {
    g_request.store(nullptr);
    delete r;
    return "    (gone)\n";
  }
  const double t0 = monotonic_s();
  while (r->count.load(std::memory_order_acquire) < 0 && monotonic_s() - t0 < timeout_s) {
    timespec ts{0, 200000};
    nanosleep(&ts, nullptr);
  }
  g_request.store(nullptr, std::memory_order_release);
  const int n = r->count.load(std::memory_order_acquire);
  if (n < 0) {
    abandoned().emplace_back(r);  // thread_stacks() holds its lock: one caller at a time
    return "    (no answer within " + std::to_string(static_cast<int>(timeout_s * 1e3)) + " ms: signals blocked, or stuck in the kernel)\n";
  }
  std::string out = format_frames(r->frames, n, 2);  // the handler, then the signal trampoline
  delete r;  // answered: its handler has returned or only returns now
  return out;
}

}  // namespace

int stack_signal() { return SIGRTMIN + 5; }

void install_stack_handler() {
  std::call_once(g_installed, [] {
    void* warm[2];
    backtrace(warm, 2);  // loads libgcc's unwinder now, not inside a handler
    struct sigaction sa {};
    sa.sa_sigaction = on_stack_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(stack_signal(), &sa, nullptr);
  });
}

std::string thread_stacks(double timeout_s) {
  static std::mutex one_at_a_time;  // one request in flight: the handler finds it by tid
  std::lock_guard<std::mutex> lock(one_at_a_time);
  install_stack_handler();
  const std::vector<int> tids = thread_ids();
  const int me = this_thread_id();
  std::ostringstream os;
  os << "threads: " << tids.size() << "\n";
  const double t0 = monotonic_s();
  for (int tid : tids) {
    const std::string lane = lane_of_thread(tid);
    os << "  thread " << tid << " \"" << thread_name(tid) << "\"" << (lane.empty() ? "" : " [" + lane + "]")
       << (tid == me ? " [writing this record]" : "") << ":\n";
    if (tid == me) {
      void* frames[kMaxFrames];
      os << format_frames(frames, backtrace(frames, kMaxFrames), 1);
    } else if (monotonic_s() - t0 > 3.0) {
      os << "    (skipped: the stacks took 3 s already)\n";
    } else {
      os << stack_of(tid, timeout_s);
    }
  }
  return os.str();
}

}  // namespace ppb::flight
