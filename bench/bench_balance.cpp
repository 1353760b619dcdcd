// Benchmark of the exact balancers (src/balance/solver.h): the fast probe-based solver
// (Pinar & Aykanat 2004) on up to 100,000 units x 1,024 stages, and the O(U^2 S) DP beside it
// on the sizes it can do. Every size where both run is cross-checked (same bottleneck, same
// spread) before timing; a mismatch exits with status 1.
//
// Napkin math: the DP does 2 * U^2 * S / 2 stage-time evaluations (~1 ns each): U=2,000,
// S=32 is 1.3e8 (~0.1-0.3 s); U=100,000, S=1,024 would be 1e13 (hours). The fast solver does
// ~50-100 probes of O(S log U) searches each: 1,024 * 17 * 100 ~ 2e6 evaluations, plus O(U R)
// for the prefix sums of R device classes.
//
//   build-*/bench/bench_balance                      # all sizes
//   build-*/bench/bench_balance --benchmark_filter=Fast
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "balance/solver.h"

namespace {

using ppb::balance::BalanceProblem;

/// U units on S devices of 4 classes (speed x1, x1.3, x0.8, x2), a heavy head (large
/// vocabulary), 90% of the units' bytes spread over the devices as memory headroom of 1.5x,
/// and uniform activation transfers (1 MB at 25 GB/s + 5 us) with overlap when `hetero`; one
/// class, no limits and no transfers otherwise.
BalanceProblem make_problem(int U, int S, bool hetero) {
  std::mt19937 rng(12345 + U + S);
  std::uniform_real_distribution<double> cost(0.5, 1.5);
  std::vector<double> base(U);
  for (double& c : base) c = cost(rng);
  base[U - 1] *= 8.0;
  BalanceProblem p;
  const double speed[4] = {1.0, 1.3, 0.8, 2.0};
  const int classes = hetero ? 4 : 1;
  for (int r = 0; r < classes; ++r) {
    p.cost.push_back(base);
    for (double& c : p.cost.back()) c *= speed[r];
  }
  for (int d = 0; d < S; ++d) p.device_row.push_back(d % classes);
  if (hetero) {
    std::uniform_int_distribution<int64_t> bytes(1 << 20, 3 << 20);
    int64_t total = 0;
    for (int u = 0; u < U; ++u) {
      p.weight_bytes.push_back(bytes(rng));
      total += p.weight_bytes.back();
    }
    p.device_memory_bytes.assign(S, static_cast<int64_t>(1.5 * static_cast<double>(total) / S) + (8 << 20));
    p.activation_bytes.assign(U - 1, 1e6);
    p.link_bandwidth_GBps = 25.0;
    p.link_latency_us = 5.0;
  }
  return p;
}

void run_solver(benchmark::State& state, bool fast, bool hetero) {
  const int U = static_cast<int>(state.range(0)), S = static_cast<int>(state.range(1));
  const BalanceProblem p = make_problem(U, S, hetero);
  const std::vector<int> order = ppb::balance::rank_order(p, S);
  double bottleneck = 0;
  for (auto _ : state) {
    const auto part = fast ? ppb::balance::solve_fast(p, order) : ppb::balance::solve_dp(p, order);
    // The const overload: benchmark 1.7's "+m,r" lvalue overload can clobber a double.
    benchmark::DoNotOptimize(part);
    bottleneck = part.bottleneck_ms;
  }
  char label[64];
  std::snprintf(label, sizeof(label), "B*=%.6f ms", bottleneck);
  state.SetLabel(label);
}

/// Fast == DP (bit-identical bottleneck, spread within 1e-9) on every size the DP runs.
bool cross_check() {
  bool ok = true;
  for (bool hetero : {false, true})
    for (auto [U, S] : {std::pair{200, 8}, {1000, 16}, {2000, 32}}) {
      const BalanceProblem p = make_problem(U, S, hetero);
      const auto order = ppb::balance::rank_order(p, S);
      const auto f = ppb::balance::solve_fast(p, order), d = ppb::balance::solve_dp(p, order);
      const bool same = f.bottleneck_ms == d.bottleneck_ms &&
                        std::fabs(f.spread_ms - d.spread_ms) <= 1e-9 * d.bottleneck_ms;
      std::printf("cross-check %-6s U=%5d S=%3d: fast %.9f / %.9f ms, dp %.9f / %.9f ms (bottleneck / spread) %s\n",
                  hetero ? "hetero" : "homog", U, S, f.bottleneck_ms, f.spread_ms, d.bottleneck_ms, d.spread_ms,
                  same ? "OK" : "MISMATCH");
      ok = ok && same;
    }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!cross_check()) return 1;
  for (bool hetero : {false, true}) {
    const char* tag = hetero ? "hetero_mem_xfer" : "homogeneous";
    for (auto [U, S] : {std::pair{1000, 16}, {2000, 32}, {10000, 64}, {100000, 1024}})
      benchmark::RegisterBenchmark((std::string("Fast/") + tag).c_str(), run_solver, true, hetero)
          ->Args({U, S})
          ->Unit(benchmark::kMillisecond);
    for (auto [U, S] : {std::pair{1000, 16}, {2000, 32}})
      benchmark::RegisterBenchmark((std::string("Dp/") + tag).c_str(), run_solver, false, hetero)
          ->Args({U, S})
          ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
