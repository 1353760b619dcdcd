// Check macros: every failing library call reports rank, host, file:line and the call's text.
//
// One generic macro (PPB_CHECK_CALL) and one thin macro per library, like nccl-tests' NCCLCHECK.
// The rank/host prefix is set once by the runtime (set_error_context) so that messages from any
// layer say where they came from.
#pragma once

#include <sstream>
#include <string>

#include "common/error.h"

namespace ppb {

/// Sets the "rank R on HOST" prefix of every check failure message (called once at start-up).
void set_error_context(int rank, const std::string& host);
/// "rank R on HOST" or "" before set_error_context.
const std::string& error_context();

/// Builds the message of a failed call and throws InternalError.
[[noreturn]] void throw_call_failure(const char* library, const char* call, const std::string& detail,
                                     const char* file, int line);

}  // namespace ppb

/// Evaluates `ok_expr` (true = success) and throws with `library`, the call text and `detail`.
#define PPB_CHECK_CALL(library, call_text, ok_expr, detail)                           \
  do {                                                                                 \
    if (!(ok_expr)) ::ppb::throw_call_failure(library, call_text, detail, __FILE__, __LINE__); \
  } while (0)

/// MPI_CHECK(MPI_Send(...)): MPI calls return MPI_SUCCESS; the error string comes from
/// MPI_Error_string (see mpi/mpi_context.cpp: mpi_error_string).
#define MPI_CHECK(call)                                                                \
  do {                                                                                 \
    int ppb_mpi_rc_ = (call);                                                          \
    PPB_CHECK_CALL("MPI", #call, ppb_mpi_rc_ == 0, ::ppb::mpi_error_string(ppb_mpi_rc_)); \
  } while (0)

namespace ppb {
/// Text of an MPI error code (defined in mpi/).
std::string mpi_error_string(int code);
}  // namespace ppb
