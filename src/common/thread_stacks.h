// Every thread's stack, for the flight recorder (common/flight_recorder.h): the threads of
// /proc/self/task are signalled one at a time (tgkill, kStackSignal); the handler stores its
// raw return addresses (backtrace(), async-signal-safe once libgcc's unwinder is loaded, which
// install does ahead) and the reporting thread names them (backtrace_symbols, demangled),
// outside the handler. A thread that does not answer within the timeout (stuck with signals
// blocked, or in the kernel uninterruptibly) is listed as such: a stuck thread cannot hang the
// report. Function names of the executable need it linked with -rdynamic (ENABLE_EXPORTS);
// static functions show as module+offset (addr2line -e <binary> resolves them).
#pragma once

#include <string>

namespace ppb::flight {

/// The real-time signal the stack dump uses (SIGRTMIN + 5; nothing else in ppbench uses it).
int stack_signal();

/// Installs the handler (idempotent). Call early (e.g. when the watchdog starts) so that
/// libgcc's unwinder is loaded before any report: loading it inside a handler is not safe.
void install_stack_handler();

/// Every thread's stack: "thread <tid> "<comm>" [<lane>]:" then "    #i function+0x.. (module) [addr]",
/// at most `timeout_s` per thread and 3 s in all. Threads of other processes are not touched.
std::string thread_stacks(double timeout_s = 0.3);

}  // namespace ppb::flight
