// `ppbench run` as the sequence of its phases (DESIGN.md §1; each phase in src/run, collective
// over every rank, under the failure policy of run/phase.h). Rank 0 holds the run's record and
// writes the results file phase by phase; the other ranks hand it their measurements.
#include "app/run_job.h"

#include <iostream>
#include <vector>

#include "balance/predict.h"
#include "run/closed_rounds.h"
#include "run/context.h"
#include "run/finish.h"
#include "run/memory_checks.h"
#include "run/options.h"
#include "run/phase.h"
#include "run/plan.h"
#include "run/plan_points.h"
#include "run/profile_phase.h"
#include "run/round_hooks.h"
#include "run/rounds.h"
#include "run/serving_rounds.h"
#include "run/startup.h"

namespace ppb {

namespace {

/// The phases after the options are typed: start-up, profile, plan, rounds, finish.
int run_phases(run::RunContext& ctx) {
  using namespace run;
  // 1-2. Start-up: the model and what to measure; the backend's device and transport; what runs
  // where (clocks, links, memory, conditions) and the hardware's ceilings.
  start_up(ctx);
  open_device(ctx);
  open_transport(ctx);
  describe_run(ctx);
  measure_ceilings(ctx);
  check_memory_for_profile(ctx);

  // 3. Profile every unit on every rank (and every tensor-parallel group a layout needs).
  const ProfileOutcome profile = profile_units(ctx);
  profile_tp_groups(ctx, profile.cycles);
  reserve_tp_communicators(ctx);  // their communicators' device memory, measured just now
  ctx.phase("write of the profile", [&] { ctx.snapshot("balance"); });
  if (ctx.opt.profile_only) return finish_profile_only(ctx);

  // 4. Plan: rank 0 solves the splits of every layout and broadcasts them; each is predicted
  // from the profile (rank 0: balance::Predictor, the functions `ppbench simulate` uses).
  PartitionSet set = plan_partitions(ctx);
  resolve_kv_pools(ctx, set);
  ctx.phase("predictions", [&] { ctx.make_predictor(); });
  describe_partitions(ctx, set);
  ctx.phase("write of the partitions", [&] { ctx.snapshot("benchmark"); });
  check_memory_of_partitions(ctx, set);

  if (ctx.opt.scenario.on()) {
    // 5'. Requests that arrive (issue 37): every partition under the same scenario, validated.
    run_serving_benchmark(ctx, set);
    return finish_serving_run(ctx);
  }

  // 5. Benchmark every distinct split in interleaved rounds until the stop rule says stop,
  // profile cycles and the adaptive re-solve between rounds; validate against serialized runs.
  StopRule rule;
  rule.min_rounds = ctx.opt.iters;
  rule.target_ci_pct = ctx.opt.target_ci_pct;
  rule.max_time_s = ctx.opt.max_time_s;
  RoundProfileHook round_profile(profile.two_passes);
  AdaptiveHook adaptive(ctx.plan.adaptive);
  ClosedRounds closed;
  const RoundsOutcome rounds = run_interleaved_rounds(ctx, set, closed, rule, {&round_profile, &adaptive});
  if (ctx.root) {
    RunRecord& record = ctx.record();
    record.schedule = rounds.schedule;
    record.rounds = rounds.rounds;
    record.stop_reason = rounds.stop_reason;
  }

  // 6-7. Shared measurements, gains against the reference, cross-calibrated predictions; the
  // complete file and the summary.
  share_measurements(ctx, set);
  compare_with_reference(ctx, set);
  plan_verdict(ctx);
  cross_calibrate_partitions(ctx);
  ctx.phase("write after the benchmark", [&] { ctx.snapshot("write"); });
  return finish_run(ctx, set);
}

}  // namespace

int run_job(const MpiContext& mpi, const RunFlags& flags) {
  // The options are typed and checked on every rank before anything else (the same flags give
  // the same verdict everywhere); a bad flag ends the run with status 2 on every rank.
  run::RunOptions opt;
  const int status = [&] {
    std::string message;
    try {
      opt = run::parse_run_options(flags);
    } catch (const UserError& e) {
      message = e.what();
    }
    if (mpi.agree(message.empty() ? 0 : 2) == 0) return 0;
    if (mpi.is_root()) std::cerr << "ppbench: error in start-up (all ranks): " << message << std::endl;
    return 2;
  }();
  if (status != 0) return status;
  run::RunContext ctx(mpi, opt);
  try {
    return run_phases(ctx);
  } catch (const run::PhaseFailed& f) {
    return f.status;
  }
}

}  // namespace ppb
