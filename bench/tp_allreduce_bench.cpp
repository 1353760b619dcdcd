// The tensor-parallel all-reduce of the CPU backend against the MPI library's own (issue 14: "it
// sits twice in every layer's critical path: pick and measure the algorithm").
//
//   mpirun -np 2 build/ppb_tp_allreduce_bench [--reps N]
//
// For the sizes a Qwen3-0.6B layer all-reduces at the main job's workload (B=4 sequences,
// hidden 1024: decode [4, 1, 1024], prefill [4, 32, 1024]) and a larger prefill, it times, in
// interleaved repetitions on every rank of MPI_COMM_WORLD:
//   ppbench  create_mpi_tp_group's all-reduce: MPI_Iallgather + a sum in group-rank order,
//            polled as the stage polls it (the same bits on every rank and in every run);
//   library  MPI_Allreduce(MPI_SUM) (the library picks the algorithm; its bits may depend on it),
// and prints each one's median and the ratio ppbench / library with the spread over
// repetitions (10th-90th percentile of the per-repetition ratio). Rank 0 prints.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/tensor_parallel.h"
#include "common/clock.h"
#include "mpi/mpi_context.h"
#include "transport/transport.h"

namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double at = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - lo);
}

}  // namespace

int main(int argc, char** argv) {
  ppb::MpiContext mpi(&argc, &argv);
  int reps = 200;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::max(5, std::atoi(argv[i + 1]));
  ppb::MpiPollConfig poll;  // run_job's tp_poll()
  poll.timeout_s = 60;
  poll.spin_us = 200;
  poll.min_sleep_us = 5;
  poll.max_sleep_us = 50;
  auto group = ppb::create_mpi_tp_group(mpi, 0, mpi.rank(), poll);
  struct Size {
    const char* what;
    size_t n;
  };
  const Size sizes[] = {{"decode  [4, 1, 1024]", 4 * 1024},
                        {"prefill [4, 32, 1024]", 4 * 32 * 1024},
                        {"prefill [4, 512, 1024]", 4 * 512 * 1024}};
  if (mpi.is_root())
    std::printf("tensor-parallel all-reduce, %d ranks, %d interleaved repetitions per size (median us; ratio: "
                "median of ppbench/library per repetition, [p10, p90])\n%-24s %12s %12s %24s\n",
                mpi.size(), reps, "size (floats)", "ppbench us", "library us", "ppbench / library");
  for (const Size& sz : sizes) {
    std::vector<float> a(sz.n), b(sz.n);
    std::vector<double> ours, lib, ratio;
    for (int r = -3; r < reps; ++r) {  // 3 untimed
      for (size_t i = 0; i < sz.n; ++i) a[i] = b[i] = 0.001f * static_cast<float>((i * 7 + mpi.rank()) % 1000);
      double t_ours = 0, t_lib = 0;
      for (int order = 0; order < 2; ++order) {  // A B, then B A on the next repetition
        const bool ours_first = (r % 2 == 0) == (order == 0);
        mpi.barrier();
        const double t0 = ppb::monotonic_s();
        if (ours_first)
          group->allreduce_sum(a.data(), sz.n);
        else
          MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(sz.n), MPI_FLOAT, MPI_SUM, mpi.comm());
        const double dt = ppb::monotonic_s() - t0;
        (ours_first ? t_ours : t_lib) = dt;
      }
      // The slowest rank decides when the layer can go on.
      double worst[2] = {t_ours, t_lib}, all[2];
      MPI_Allreduce(worst, all, 2, MPI_DOUBLE, MPI_MAX, mpi.comm());
      if (r < 0) continue;
      ours.push_back(1e6 * all[0]);
      lib.push_back(1e6 * all[1]);
      ratio.push_back(all[0] / all[1]);
    }
    if (mpi.is_root())
      std::printf("%-24s %12.1f %12.1f %10.2fx [%.2f, %.2f]\n", sz.what, percentile(ours, 0.5), percentile(lib, 0.5),
                  percentile(ratio, 0.5), percentile(ratio, 0.1), percentile(ratio, 0.9));
  }
  return 0;
}
