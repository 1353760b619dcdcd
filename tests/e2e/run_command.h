// The e2e tests' way to run a command: through the shell from the source root, with MPI allowed
// as root and one OpenBLAS thread per rank, stdout and stderr captured together, timed. run_all
// runs a table of commands a few at a time: a bad-input case is a launch that ends in about 1.5
// s, nearly all of it mpirun's start-up waiting, not computing: run_e2e's 40 cases took 72 s one
// after the other and take 12-16 s 8 at a time on a 2-core machine (serving's 23: 40 s, 7-8 s).
//
// Launches in flight together each get their own Open MPI session directory base
// (OMPI_MCA_orte_tmpdir_base): Open MPI 4.x mpiruns started at once race to create the shared
// /tmp/ompi.<host>.<uid> and one fails with "A call to mkdir was unable to create the desired
// directory ... File exists" (open-mpi/ompi#8510; seen in CI on 2026-12-07).
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace ppb_test {

struct Result {
  int status = -1;      ///< exit status; -1 when the shell did not exit (a signal)
  std::string output;   ///< stdout and stderr, interleaved as written
  double seconds = 0;   ///< wall time of the whole command, launcher included
};

/// Runs `cmd` through /bin/sh from PPB_SOURCE_DIR and waits for it.
/// Thread-safe (popen/pclose), so run_all may call it from several threads.
inline Result run(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string full = "cd " PPB_SOURCE_DIR " && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                           "OPENBLAS_NUM_THREADS=1 " + cmd + " 2>&1";
  Result r;
  FILE* p = popen(full.c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof(buf), p)) r.output += buf;
  const int st = p ? pclose(p) : -1;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

/// Runs one command of run_all in its own fresh Open MPI session directory base under
/// std::filesystem::temp_directory_path() ($TMPDIR, or /tmp), removed after it; `cmd` must be
/// one simple command (the variable is set for it alone), as `mpirun ...` is. A base that cannot
/// be made gives status -1 and says why.
inline Result run_in_own_session(const std::string& cmd) {
  std::string base = (std::filesystem::temp_directory_path() / "ppb_ompi_XXXXXX").string();
  if (!::mkdtemp(base.data())) {
    Result r;
    r.output = "run_all: cannot make a session directory from " + base + ": " + std::strerror(errno);
    return r;
  }
  Result r = run("OMPI_MCA_orte_tmpdir_base='" + base + "' " + cmd);
  std::error_code ignored;  // a session directory mpirun left behind is not the test's failure
  std::filesystem::remove_all(base, ignored);
  return r;
}

/// Runs every command of `cmds` with `in_flight` of them running at a time (at least 1): a pool
/// of that many threads, each taking the next command not yet started when its last one ends, so
/// one slow command holds up no other. Returns their results in the order of `cmds`. The
/// commands must not share an output file; each has its own Open MPI session directory base
/// (run_in_own_session).
/// A command's `seconds` counts from its own start, so a time limit asserted on it still holds
/// for one launch (8 in flight on 2 cores: each about 3.5 s against 1.5 s alone).
inline std::vector<Result> run_all(const std::vector<std::string>& cmds, std::size_t in_flight = 8) {
  std::vector<Result> out(cmds.size());
  std::atomic<std::size_t> next{0};
  const auto worker = [&] {
    for (std::size_t i = next++; i < cmds.size(); i = next++) {
      try {
        out[i] = run_in_own_session(cmds[i]);
      } catch (const std::exception& e) {  // the test reads it as a failed command, not a terminate
        out[i].output = std::string("run_all: ") + e.what();
      }
    }
  };
  std::vector<std::jthread> pool;  // joined on every way out
  for (std::size_t t = 0; t < std::clamp<std::size_t>(in_flight, 1, std::max<std::size_t>(1, cmds.size())); ++t)
    pool.emplace_back(worker);
  pool.clear();
  return out;
}

}  // namespace ppb_test
