// The link probe through the pipeline's transport (transport/link_probe.h, issue 35 item 3) on
// CPU ranks, where it is the MPI transport on host memory with its lanes' polling: every rank
// gets the same sweeps, each pair's fit reproduces every size it measured within the fit's own
// bound, and a run's record carries the sweeps, the fits and which of them the link model took.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "mpi_test_main.h"
#include "run/context.h"
#include "run/options.h"
#include "run/startup.h"
#include "transport/link_probe.h"
#include "transport/transport.h"

namespace ppb {
namespace {

std::vector<std::pair<int, int>> all_pairs(int n) {
  std::vector<std::pair<int, int>> p;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) p.emplace_back(a, b);
  return p;
}

/// |fit - median| / median of each size, and the worst of them.
double worst_rel_error(const LinkSweep& s) {
  double worst = 0;
  for (const LinkSample& x : s.samples)
    worst = std::max(worst, std::abs(link_fit_time_s(s.fit, x.bytes) - x.median_s) / x.median_s);
  return worst;
}

/// The sweeps as one row of doubles per sample, for comparing ranks.
std::vector<double> flatten(const std::vector<LinkSweep>& sweeps) {
  std::vector<double> v;
  for (const LinkSweep& s : sweeps) {
    v.insert(v.end(), {double(s.src), double(s.dst), s.fit.latency_s, s.fit.bandwidth_Bps, s.fit.max_rel_error, s.wall_s});
    for (const LinkSample& x : s.samples) v.insert(v.end(), {x.bytes, x.min_s, x.median_s, double(x.reps)});
  }
  return v;
}

TEST(LinkProbe, EveryPairsFitReproducesEachMeasuredSizeWithinItsBound) {
  const auto& mpi = test::mpi();
  auto device = create_cpu_device(1);
  auto transport = create_mpi_transport(mpi, {});
  const auto pairs = all_pairs(mpi.size());
  const LinkProbeConfig cfg;
  const auto sweeps = probe_links(mpi, *device, *transport, pairs, cfg);
  const auto all = mpi.gatherv_doubles(flatten(sweeps));
  if (mpi.is_root())
    for (int r = 1; r < mpi.size(); ++r) EXPECT_EQ(all[r], all[0]) << "rank " << r << "'s sweeps";
  ASSERT_EQ(sweeps.size(), pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const LinkSweep& s = sweeps[i];
    EXPECT_EQ(s.src, pairs[i].first);
    EXPECT_EQ(s.dst, pairs[i].second);
    ASSERT_FALSE(s.samples.empty());
    const auto ladder = link_sweep_sizes(cfg.max_bytes);
    for (size_t k = 0; k < s.samples.size(); ++k) {
      const LinkSample& x = s.samples[k];
      EXPECT_EQ(x.bytes, double(ladder[k]));
      EXPECT_GE(x.reps, cfg.min_reps);
      EXPECT_LE(x.reps, cfg.max_reps);
      EXPECT_GT(x.min_s, 0.0);
      EXPECT_LE(x.min_s, x.median_s);
    }
    // A sweep ends at the largest size or on the budget, which spares every size up to 1 MiB.
    EXPECT_TRUE(s.samples.size() == ladder.size() || s.budget_stop);
    EXPECT_GE(s.samples.back().bytes, double(1 << 20));
    EXPECT_GT(s.fit.latency_s, 0.0);
    EXPECT_GT(s.fit.bandwidth_Bps, 0.0);
    // The bound the fit states is the one it meets: every size within max_rel_error of the
    // model, and the worst size at it (it is no looser than the data).
    EXPECT_NEAR(worst_rel_error(s), s.fit.max_rel_error, 1e-12 * (1 + s.fit.max_rel_error));
    // And the model is of use: every size's median within a factor 3 of it. (Measured here:
    // 0.23-0.66 over 10 pairs, on this 2-core VM loaded to 7: the worst size is 16 or 64 MiB,
    // which moves at 1/2-1/3 of the bandwidth of 4 MiB, a message that stays in the caches.)
    EXPECT_LT(s.fit.max_rel_error, 2.0) << "pair " << s.src << "-" << s.dst;
    if (mpi.is_root() && i == 0) {
      std::printf("pair %d-%d: %.3f s, fit %.1f us + bytes / %.3f GB/s, within %.0f%%\n", s.src, s.dst, s.wall_s,
                  1e6 * s.fit.latency_s, s.fit.bandwidth_Bps / 1e9, 100 * s.fit.max_rel_error);
      for (const LinkSample& x : s.samples)
        std::printf("  %10.0f B  reps %2d  min %9.1f us  median %9.1f us  fit %9.1f us\n", x.bytes, x.reps, 1e6 * x.min_s,
                    1e6 * x.median_s, 1e6 * link_fit_time_s(s.fit, x.bytes));
    }
  }
}

/// The MPI transport, reported as not carrying MPI messages of host memory: the link model
/// must then come from the probe (as with NCCL, or MPI staged through pinned buffers).
class NotHostTransport final : public Transport {
 public:
  explicit NotHostTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  void enqueue_send(Lane& lane, const void* buf, size_t bytes, int peer, int tag) override {
    inner_->enqueue_send(lane, buf, bytes, peer, tag);
  }
  void enqueue_recv(Lane& lane, void* buf, size_t bytes, int peer, int tag) override {
    inner_->enqueue_recv(lane, buf, bytes, peer, tag);
  }
  void enqueue_barrier(Lane& lane) override { inner_->enqueue_barrier(lane); }
  bool mpi_host_messages() const override { return false; }

 private:
  std::unique_ptr<Transport> inner_;
};

/// A run context on tiny-llama described up to its links and memory (as ppbench run's
/// start-up), the transport replaced by NotHostTransport when `not_host`.
std::unique_ptr<run::RunContext> described_run(RunFlags& flags, run::RunOptions& opt, bool not_host) {
  flags.model_path = PPB_SOURCE_DIR "/tests/data/tiny-llama.json";
  flags.prompt_len = 4;
  flags.gen_len = 2;
  flags.batch = 2;
  flags.quiet = true;
  flags.output = (std::filesystem::temp_directory_path() / ("ppbench_link_probe_" + std::to_string(::getpid()) + ".h5")).string();
  flags.force = true;
  opt = run::parse_run_options(flags);
  auto ctx = std::make_unique<run::RunContext>(test::mpi(), opt);
  run::start_up(*ctx);
  run::open_device(*ctx);
  run::open_transport(*ctx);
  if (not_host) ctx->transport = std::make_unique<NotHostTransport>(std::move(ctx->transport));
  run::describe_run(*ctx);
  return ctx;
}

/// Rank 0's record: the probe's matrices, sweep rows and the model taken from `expect_by`.
void expect_record_carries_the_links(const RunRecord& run, int R, const std::string& expect_by) {
  const size_t n = static_cast<size_t>(R) * R;
  EXPECT_EQ(run.link_measured_by, expect_by);
  ASSERT_EQ(run.link_probe_latency_matrix_s.size(), n);
  ASSERT_EQ(run.link_probe_bandwidth_matrix_Bps.size(), n);
  ASSERT_EQ(run.link_probe_max_rel_error.size(), n);
  ASSERT_EQ(run.link_host_latency_matrix_s.size(), n);
  EXPECT_GT(run.link_probe_s, 0.0);
  const bool probe = expect_by == kLinkByTransportProbe;
  for (int a = 0; a < R; ++a)
    for (int b = 0; b < R; ++b) {
      const size_t k = static_cast<size_t>(a) * R + b;
      if (a == b) {
        EXPECT_TRUE(std::isnan(run.link_probe_latency_matrix_s[k]));
        continue;
      }
      EXPECT_GT(run.link_probe_latency_matrix_s[k], 0.0);
      EXPECT_EQ(run.link_probe_latency_matrix_s[k], run.link_probe_latency_matrix_s[static_cast<size_t>(b) * R + a]);
      // The model is the probe's fit or the host ping-pong, exactly.
      EXPECT_EQ(run.link_latency_matrix_s[k], probe ? run.link_probe_latency_matrix_s[k] : run.link_host_latency_matrix_s[k]);
      EXPECT_EQ(run.link_bandwidth_matrix_Bps[k],
                probe ? run.link_probe_bandwidth_matrix_Bps[k] : run.link_host_bandwidth_matrix_Bps[k]);
    }
  EXPECT_EQ(run.link_latency_s, run.link_latency_matrix_s[1]);
  EXPECT_EQ(run.link_bandwidth_Bps, run.link_bandwidth_matrix_Bps[1]);
  // Every pair's rows, each size's median within the pair's stated bound of its fit.
  std::vector<int> rows(n, 0);
  for (const LinkSweepRow& row : run.link_sweep) {
    const size_t k = static_cast<size_t>(row.src) * R + row.dst;
    ++rows[k];
    const LinkFit fit{run.link_probe_latency_matrix_s[k], run.link_probe_bandwidth_matrix_Bps[k], 0};
    EXPECT_LE(std::abs(link_fit_time_s(fit, row.sample.bytes) - row.sample.median_s),
              run.link_probe_max_rel_error[k] * row.sample.median_s * (1 + 1e-12))
        << row.src << " -> " << row.dst << " at " << row.sample.bytes << " B";
  }
  for (int a = 0; a < R; ++a)
    for (int b = a + 1; b < R; ++b) EXPECT_GE(rows[static_cast<size_t>(a) * R + b], 9) << "pair " << a << "-" << b;
}

TEST(LinkProbe, RunRecordKeepsTheHostPingPongAsTheModelOfTheMpiTransport) {
  RunFlags flags;
  run::RunOptions opt;
  auto ctx = described_run(flags, opt, false);
  EXPECT_GT(ctx->cluster.memory_limit, 0u);
  if (ctx->root) expect_record_carries_the_links(ctx->record(), ctx->ranks, kLinkByHostPingPong);
}

TEST(LinkProbe, RunRecordTakesTheProbeAsTheModelOfATransportThatIsNotMpiOnHostMemory) {
  RunFlags flags;
  run::RunOptions opt;
  auto ctx = described_run(flags, opt, true);
  if (ctx->root) expect_record_carries_the_links(ctx->record(), ctx->ranks, kLinkByTransportProbe);
}

}  // namespace
}  // namespace ppb
