// Shared main of the MPI tests: MPI is initialised once for all tests of a binary.
#pragma once

#include "mpi/mpi_context.h"

namespace ppb::test {
/// The process's MPI context (valid inside tests).
const MpiContext& mpi();
}  // namespace ppb::test
