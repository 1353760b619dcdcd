#include "common/check.h"

namespace ppb {

namespace {
std::string& context_storage() {
  static std::string ctx;
  return ctx;
}
}  // namespace

void set_error_context(int rank, const std::string& host) {
  context_storage() = "rank " + std::to_string(rank) + " on " + host;
}

const std::string& error_context() { return context_storage(); }

void throw_call_failure(const char* library, const char* call, const std::string& detail,
                        const char* file, int line) {
  std::ostringstream os;
  if (!error_context().empty()) os << error_context() << ": ";
  os << library << " call failed at " << file << ":" << line << ": " << call;
  if (!detail.empty()) os << ": " << detail;
  throw InternalError(os.str());
}

}  // namespace ppb
