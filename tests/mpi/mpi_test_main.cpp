// main() of the MPI test binaries (ctest launches them with mpirun -np 2 or 4). Only rank 0
// prints gtest's progress; a failure on any rank makes that rank, and so mpirun, exit non-zero.
#include <gtest/gtest.h>

#include <memory>

#include "backend/cpu/cpu_gemm.h"
#include "mpi_test_main.h"

namespace ppb::test {
namespace {
std::unique_ptr<MpiContext> g_mpi;
}
const MpiContext& mpi() { return *g_mpi; }
}  // namespace ppb::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ppb::test::g_mpi = std::make_unique<ppb::MpiContext>(&argc, &argv);
  // One GEMM library on every rank, as `ppbench run` agrees on one: each process times OpenBLAS
  // against oneDNN once (create_cpu_device), and on a busy machine two ranks can pick
  // differently; a unit then computes other bits on another rank, and a pipelined checksum
  // differs from the sequential reference in its last digits (seen: 1.3e-7 relative, in
  // MpiPipeline.ReversedRanksOverlapEqualsSequential under ctest -j2).
  using ppb::cpu::GemmLibrary;
  const bool onednn = ppb::cpu::choose_gemm_library() == GemmLibrary::onednn;
  ppb::cpu::set_gemm_library(ppb::test::g_mpi->agree(onednn ? 1 : 0) ? GemmLibrary::onednn : GemmLibrary::openblas);
  if (ppb::test::g_mpi->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  // Agree so that every rank exits with the worst status (a failure on rank 3 fails rank 0 too).
  rc = ppb::test::g_mpi->agree(rc);
  ppb::test::g_mpi.reset();
  return rc;
}
