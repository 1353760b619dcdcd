// The ppbench version string, "<project version>+<git describe>", written into every results
// file (root attribute ppbench_version) and printed by --version.
#pragma once

namespace ppb {

/// E.g. "0.1.0+af9fde1-dirty". Defined in a file CMake generates at configure time
/// (src/common/version.cpp.in), rewritten only when the string changes: a new commit recompiles that
/// one file, not every file that includes this header.
const char* ppbench_version();

}  // namespace ppb
