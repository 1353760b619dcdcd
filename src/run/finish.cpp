#include "run/finish.h"

#include <iostream>

#include "balance/partition.h"
#include "common/clock.h"
#include "common/stats.h"
#include "results/summary.h"
#include "results/writer.h"
#include "run/rounds.h"

namespace ppb::run {

namespace {

/// "7,5,6,6 on ranks 0,1,2,3": a split's unit counts and device order.
std::string split_text(const balance::Partition& p) {
  std::string ranks;
  for (size_t k = 0; k < p.device_rank.size(); ++k) {  // (appends: GCC 12 warns -Wrestrict on "," + to_string)
    if (k) ranks += ',';
    ranks += std::to_string(p.device_rank[k]);
  }
  return p.counts_string() + " on ranks " + ranks;
}

}  // namespace

void share_measurements(RunContext& ctx, const PartitionSet& set) {
  const balance::SplitEquivalence& eq = ctx.cluster.equivalence;
  for (size_t pi = 0; pi < set.size(); ++pi) {
    if (set.measured_alone(pi, eq)) continue;
    const size_t of = static_cast<size_t>(balance::same_split_as(set.splits, pi, eq));
    const balance::Partition &p = set.splits[pi], &q = set.splits[of];
    const bool identical = balance::compare_splits(q, p, eq) == balance::Sameness::identical;
    if (ctx.root) {
      std::vector<PartitionRecord>& parts = ctx.record().partitions;
      PartitionRecord shared = parts[of];
      shared.name = parts[pi].name;
      shared.solver = parts[pi].solver;
      shared.same_as = parts[of].name;
      shared.same_as_reason = identical ? "identical" : "equivalent";
      if (!identical) shared.solver_split = split_text(p);
      parts[pi] = std::move(shared);
    }
    ctx.progress.say("partition " + p.solver + ": " +
                     (identical ? "the same split as " + q.solver + " (" + p.counts_string() + ")"
                                : split_text(p) + " is " + q.solver + "'s " + split_text(q) +
                                      " with identical devices' stages in another order") +
                     ", measured once");
    ctx.phase("write after partition " + p.solver, [&] { ctx.snapshot("benchmark"); });
  }
}

void compare_with_reference(RunContext& ctx, const PartitionSet& set) {
  if (!ctx.root || set.reference.empty()) return;
  std::vector<PartitionRecord>& parts = ctx.record().partitions;
  const int ri = set.index_of(set.reference);
  if (ri < 0 || !parts[static_cast<size_t>(ri)].measured) return;
  const PartitionRecord& ref = parts[static_cast<size_t>(ri)];
  for (PartitionRecord& pr : parts) {
    if (&pr == &ref || !pr.measured) continue;
    if (pr.same_as == set.reference) {
      const int n = static_cast<int>(ref.rep_tokens_per_s.size());
      pr.gain = PairedComparison{1.0, 1.0, 1.0, n};
      pr.decode_gain = PairedComparison{1.0, 1.0, 1.0, n};
      pr.gain_verdict = pr.decode_gain_verdict = "same split";
      continue;
    }
    // A partition sharing another's measurement pairs like that one.
    auto [ga, gb] = same_rounds(ref.rep_tokens_per_s, ref.rep_round, pr.rep_tokens_per_s, pr.rep_round);
    auto [da, db] = same_rounds(ref.rep_decode_tokens_per_s, ref.rep_round, pr.rep_decode_tokens_per_s, pr.rep_round);
    pr.gain = compare_paired(ga, gb);
    pr.decode_gain = compare_paired(da, db);
    pr.gain_verdict = comparison_verdict(pr.gain);
    pr.decode_gain_verdict = comparison_verdict(pr.decode_gain);
  }
}

void cross_calibrate_partitions(RunContext& ctx) {
  if (!ctx.root) return;
  std::vector<std::string> warnings;
  try {
    balance::cross_calibrate(ctx.predictor(), ctx.record(), warnings);
  } catch (const std::exception& e) {
    warnings.push_back(std::string("the cross-calibrated predictions failed: ") + e.what());
  }
  print_warnings(warnings);
}

void write_complete(RunContext& ctx, const std::string& validation) {
  RunRecord& run = ctx.record();
  run.validation = validation;
  run.validation_ok = run.validation == "ok";
  run.elapsed_s = monotonic_s() - run.run_start_s;
  run.status = "complete";
  write_results(ctx.output, run);
  print_summary(std::cout, run);
  std::cout << "results: " << ctx.output << std::endl;
}

int finish_run(RunContext& ctx, const PartitionSet& set) {
  ctx.phase("write", [&] {
    if (!ctx.root) return;
    RunRecord& run = ctx.record();
    const PartitionRecord* ref = nullptr;
    const PartitionRecord* bal = nullptr;
    bool failed = false, all_validated = true;
    for (auto& pr : run.partitions) {
      failed = failed || !pr.tokens_match_first_partition || (pr.validated && !(pr.tokens_match && pr.checksum_match));
      all_validated = all_validated && pr.validated;
      if (pr.name == set.reference) ref = &pr;
      if (pr.name == "balanced") bal = &pr;
    }
    if (ref && bal) {
      run.balance_gain = bal->metrics.at("tokens_per_s") / ref->metrics.at("tokens_per_s");
      run.decode_balance_gain = bal->metrics.at("decode_tokens_per_s") / ref->metrics.at("decode_tokens_per_s");
      run.balance_cmp = bal->gain;
      run.decode_balance_cmp = bal->decode_gain;
      run.balance_verdict = bal->gain_verdict;
      run.decode_balance_verdict = bal->decode_gain_verdict;
    }
    write_complete(ctx, failed ? "failed" : all_validated ? "ok" : "skipped");
  });
  return ctx.mpi.agree(ctx.root && ctx.record().validation == "failed" ? 1 : 0);
}

int finish_profile_only(RunContext& ctx) {
  ctx.phase("write", [&] {
    if (!ctx.root) return;
    RunRecord& run = ctx.record();
    run.validation = "n/a";
    run.validation_ok = false;
    run.elapsed_s = monotonic_s() - run.run_start_s;
    run.status = "complete";
    write_results(ctx.output, run);
    print_summary(std::cout, run);
    std::cout << "results: " << ctx.output << " (profile only: ppbench balance " << ctx.output << " --stages K)" << std::endl;
  });
  return ctx.mpi.agree(0);
}

}  // namespace ppb::run
