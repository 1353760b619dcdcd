// Test helper shared by the offline commands' tests: the message of the UserError a call throws.
#pragma once

#include <string>

#include "common/error.h"

namespace ppb::test {

/// The message of the ppb::UserError that `fn` throws ("no error" when it throws none; any
/// other exception propagates).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace ppb::test
