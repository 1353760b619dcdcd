// The e2e tests' scratch directory: one per test process, made with mkdtemp (unique even where
// an earlier run left a directory behind under a PID now reused: a name from getpid() alone
// once made a run refuse its output, "exists; pass --force"), and removed when the process
// exits unless PPBENCH_KEEP_TEST_FILES=1 (then its path is printed, for a failure's files).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace ppb_test {

/// This process's scratch directory under the system's temporary directory, named
/// `<prefix>XXXXXX`; made on the first call.
/// @throws std::runtime_error if it cannot be made.
inline const std::string& scratch_dir(const std::string& prefix) {
  struct Dir {
    std::string path;
    explicit Dir(const std::string& pfx) {
      std::string t = (std::filesystem::temp_directory_path() / (pfx + "XXXXXX")).string();
      if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + t);
      path = t;
    }
    ~Dir() {
      const char* keep = std::getenv("PPBENCH_KEEP_TEST_FILES");
      if (keep != nullptr && std::string(keep) == "1") {
        std::fprintf(stderr, "test files kept in %s\n", path.c_str());
        return;
      }
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir(prefix);
  return dir.path;
}

}  // namespace ppb_test
