// Error types shared by every module.
//
// UserError: the input is wrong (bad config, impossible partition, bad flag). main() turns it
// into exit status 2 on every rank. Its message names the field/value and what would be valid.
// Everything else (a failing library call, a broken invariant) is an InternalError or a
// std::runtime_error and gives exit status 1.
#pragma once

#include <stdexcept>
#include <string>

namespace ppb {

/// The user gave input that cannot be run; exit status 2.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what) : std::runtime_error(what) {}
};

/// A library call failed or an invariant broke; exit status 1.
class InternalError : public std::runtime_error {
 public:
  explicit InternalError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ppb
