#include "run/gather.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "balance/metrics.h"
#include "balance/problem.h"
#include "common/events.h"
#include "common/format.h"

namespace ppb::run {

namespace {

/// Issue 14's bound on the final-hidden-state checksum across layouts (fp32, sums reordered).
constexpr double kLayoutChecksumTol = 1e-4;

/// Doubles of one repetition of one stage of partition `p`: [M][G+1][kNumEvents] (its own M).
size_t rep_events(const RunContext& ctx, const balance::Partition& p) {
  return static_cast<size_t>(partition_groups(ctx, p)) * (ctx.workload.gen_len + 1) * kNumEvents;
}

/// Appends repetition `rep` of every stage of every replica (their ranks' slices `slice[r x S +
/// k]`, this rank's clock) to partition record `pr`'s events on rank 0's clock (replica 0's in
/// `events`, every replica's in `replica_events` with R > 1), and its per-repetition metrics
/// (over every replica's groups: replica r's group g is group r x M + g of one timeline).
void append_repetition(const RunContext& ctx, const balance::Partition& p, PartitionRecord& pr,
                       const std::vector<const double*>& slice, int round) {
  const Workload& w = ctx.workload;
  const int S = p.num_stages(), steps = w.gen_len + 1, M = partition_groups(ctx, p), R = p.replicas;
  const EventShape all{1, R * M, steps, S};
  std::vector<double> events(rep_events(ctx, p) * S * R, std::nan(""));
  // A tensor-parallel stage's timeline is its first rank's (the group computes in lockstep).
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < S; ++k) {
      const int rank = p.first_rank(r, k);
      const double shift = ctx.cluster.clock_offsets_s[rank] + ctx.record().run_start_s;
      const double* from = slice[static_cast<size_t>(r) * S + k];
      for (int g = 0; g < M; ++g)
        for (int t = 0; t < steps; ++t)
          for (int x = 0; x < kNumEvents; ++x)
            events[all.index(0, r * M + g, t, k, x)] = from[(static_cast<size_t>(g) * steps + t) * kNumEvents + x] - shift;
    }
  const PartitionMetrics m = compute_metrics(events, all, w.batch, w.gen_len);
  const auto replica0_end = events.begin() + static_cast<std::ptrdiff_t>(rep_events(ctx, p) * S);  // groups 0..M-1
  pr.events.insert(pr.events.end(), events.begin(), replica0_end);
  if (R > 1) pr.replica_events.insert(pr.replica_events.end(), events.begin(), events.end());
  pr.rep_round.push_back(round);
  pr.rep_wall_s.push_back(m.rep_wall_s.at(0));
  pr.rep_tokens_per_s.push_back(m.rep_tokens_per_s.at(0));
  pr.rep_decode_tokens_per_s.push_back(m.rep_decode_tokens_per_s.at(0));
  pr.rep_ttft_p50_ms.push_back(m.rep_ttft_p50_ms.at(0));
  pr.rep_tpot_p50_ms.push_back(m.rep_tpot_p50_ms.at(0));
  pr.measured = true;  // validated stays false (describe_partition) until validate_record
}

/// Collective: the tokens each expert of each MoE layer received in partition `p`'s last timed
/// repetition (StageRecord::expert_tokens of the first rank of each stage), into rank 0's
/// record.expert_tokens ([layers + MTP modules][max experts]).
void gather_expert_tokens(RunContext& ctx, const balance::Partition& p, const StageRecord& rec) {
  std::vector<double> mine;  // per MoE layer: layer, experts, counts...
  for (const auto& row : rec.expert_tokens) {
    mine.push_back(static_cast<double>(row[0]));
    mine.push_back(static_cast<double>(row.size() - 1));
    for (size_t i = 1; i < row.size(); ++i) mine.push_back(static_cast<double>(row[i]));
  }
  const auto all = ctx.mpi.gatherv_doubles(mine);
  if (!ctx.root) return;
  const model::ModelSpec& spec = ctx.spec;
  int cols = 0;
  for (const model::LayerShape& l : spec.layers) cols = std::max(cols, l.moe.n_experts);
  if (cols == 0) return;
  RunRecord& run = ctx.record();
  const int rows = spec.n_layers + (spec.mtp ? spec.mtp_modules : 0);
  run.expert_rows = rows;
  run.expert_cols = cols;
  run.expert_skew = ctx.opt.expert_skew;
  run.expert_tokens_partition = p.solver;
  run.expert_tokens.assign(static_cast<size_t>(rows) * cols, 0);
  for (int k = 0; k < p.num_stages(); ++k) {
    const auto& v = all[p.device_rank[k]];
    for (size_t i = 0; i + 1 < v.size();) {
      const int layer = static_cast<int>(v[i]), n = static_cast<int>(v[i + 1]);
      for (int e = 0; e < n && layer < rows && e < cols; ++e)
        run.expert_tokens[static_cast<size_t>(layer) * cols + e] = static_cast<int64_t>(v[i + 2 + e]);
      i += 2 + static_cast<size_t>(n);
    }
  }
}

/// Rank 0: partition `pr`'s tokens and checksums against its serialized run and against the
/// first partition of the run. `toks`/`refs`: every rank's; `sums`: [R][6] as gather_final sends.
void validate_record(RunContext& ctx, const balance::Partition& p, PartitionRecord& pr,
                     const std::vector<std::vector<int>>& toks, const std::vector<std::vector<int>>& refs,
                     const std::vector<double>& sums) {
  const int S = p.num_stages();
  const int lr = p.device_rank[S - 1];
  pr.tokens.assign(toks[lr].begin(), toks[lr].end());
  pr.reference_tokens.assign(refs[lr].begin(), refs[lr].end());
  pr.checksum = sums[lr * 6 + 0];
  pr.reference_checksum = sums[lr * 6 + 1];
  // Every rank of a tensor-parallel last stage samples the tokens: they must agree, bit for bit.
  bool group_agrees = true;
  for (int r = lr + 1; r < lr + p.width(S - 1); ++r)
    group_agrees = group_agrees && toks[r] == toks[lr] && sums[r * 6] == sums[lr * 6];
  if (!group_agrees)
    std::cerr << "ppbench: partition " << p.solver << ": the ranks of the last stage sampled different tokens" << std::endl;
  // Every replica runs the same prompts (group g's depend on (seed, g) alone): the same tokens,
  // pipelined and serialized, as replica 0's.
  pr.replica_tokens_differing = 0;
  for (int r = 1; r < p.replicas; ++r) {
    const int rr = p.first_rank(r, S - 1);
    const auto& t = toks[rr];
    const auto& f = refs[rr];
    for (size_t i = 0; i < pr.tokens.size(); ++i)
      pr.replica_tokens_differing += (i >= t.size() || t[i] != pr.tokens[i]) + (i >= f.size() || f[i] != pr.reference_tokens[i]);
  }
  pr.validated = ctx.opt.validate;
  pr.tokens_match = pr.validated && pr.tokens == pr.reference_tokens && group_agrees && pr.replica_tokens_differing == 0;
  pr.checksum_match = pr.validated && pr.checksum == pr.reference_checksum;
  // Across partitions and layouts: the same tokens, and the same final hidden states but for the
  // order of the tensor-parallel sums (fp32: within kLayoutChecksumTol relative).
  // Group g's prompts depend on (seed, g) alone (pipeline.cpp prompt_token), so partitions of
  // different M (`run --plan`) compare the groups both ran: the tokens are [M][G+1][B], the
  // common groups their first rows.
  const PartitionRecord& first = ctx.record().partitions[0];
  const size_t common = std::min(pr.tokens.size(), first.tokens.size());
  pr.tokens_differing_first_partition = 0;
  for (size_t i = 0; i < common; ++i) pr.tokens_differing_first_partition += pr.tokens[i] != first.tokens[i] ? 1 : 0;
  const bool same_tokens = std::equal(pr.tokens.begin(), pr.tokens.begin() + static_cast<std::ptrdiff_t>(common), first.tokens.begin());
  pr.checksum_rel_diff_first_partition = first.checksum != 0.0 ? std::fabs(pr.checksum / first.checksum - 1.0) : 0.0;
  // Judged in f32 and within a layout (the same sums in the same order); across layouts in
  // f16/bf16 the reordered sums round at 2^-8: reported, not judged.
  const bool judged = ctx.workload.dtype == DType::f32 || pr.layout == first.layout;
  pr.tokens_match_first_partition =
      group_agrees && (!judged || (same_tokens && (pr.groups != first.groups || pr.checksum_rel_diff_first_partition <= kLayoutChecksumTol)));
}

/// Rank 0: every metric of DESIGN.md §3 of partition `pr` from all its events, and the
/// simulator's predictions beside them.
void complete_metrics(RunContext& ctx, const balance::Partition& p, PartitionRecord& pr) {
  const Workload& w = ctx.workload;
  const int S = p.num_stages();
  const int M = partition_groups(ctx, p), R = p.replicas;
  const EventShape sh{static_cast<int>(pr.rep_round.size()), M, w.gen_len + 1, S};
  // The stages' figures from replica 0's timeline (one pipeline); with replicas, the rates and
  // latencies from every replica's groups as one timeline (R x M groups), the bound R pipelines'.
  const auto m = compute_metrics(pr.events, sh, w.batch, w.gen_len);
  PartitionMetrics rates = m;
  if (R > 1) {
    rates = compute_metrics(pr.replica_events, EventShape{sh.iters, R * M, sh.steps, S}, w.batch, w.gen_len);
    rates.bottleneck_bound_tok_s = R * m.bottleneck_bound_tok_s;
    rates.pipeline_efficiency = rates.bottleneck_bound_tok_s > 0 ? rates.decode_tokens_per_s / rates.bottleneck_bound_tok_s : 0.0;
  }
  pr.stage_compute_ms.clear();
  pr.measured_stage_ms.clear();
  pr.stage_compute_mean_ms.clear();
  pr.measured_stage_mean_ms.clear();
  for (int k = 0; k < S; ++k) pr.stage_compute_ms.insert(pr.stage_compute_ms.end(), {m.stage_prefill_ms[k], m.stage_decode_ms[k]});
  pr.stage_workload_ms = m.stage_workload_ms;
  for (int k = 0; k < S; ++k) {  // measured stage cost in the balancer's objective
    pr.measured_stage_ms.push_back(balance::objective_cost(ctx.opt.objective, m.stage_prefill_ms[k], m.stage_decode_ms[k], w.gen_len));
    pr.stage_compute_mean_ms.insert(pr.stage_compute_mean_ms.end(), {m.stage_prefill_mean_ms[k], m.stage_decode_mean_ms[k]});
    pr.measured_stage_mean_ms.push_back(
        balance::objective_cost(ctx.opt.objective, m.stage_prefill_mean_ms[k], m.stage_decode_mean_ms[k], w.gen_len));
  }
  pr.bubble_fraction = m.bubble_fraction;
  pr.recv_wait_ms = m.recv_wait_ms;
  pr.rep_wall_s = rates.rep_wall_s;
  pr.rep_tokens_per_s = rates.rep_tokens_per_s;
  pr.rep_decode_tokens_per_s = rates.rep_decode_tokens_per_s;
  pr.rep_ttft_p50_ms = rates.rep_ttft_p50_ms;
  pr.rep_tpot_p50_ms = rates.rep_tpot_p50_ms;
  pr.bottleneck_stage = m.bottleneck_stage;
  pr.metrics = {{"tokens_per_s", rates.tokens_per_s},
                {"decode_tokens_per_s", rates.decode_tokens_per_s},
                {"ttft_p50_ms", rates.ttft_p50_ms},
                {"ttft_p99_ms", rates.ttft_p99_ms},
                {"tpot_p50_ms", rates.tpot_p50_ms},
                {"tpot_p99_ms", rates.tpot_p99_ms},
                {"bottleneck_bound_tok_s", rates.bottleneck_bound_tok_s},
                {"pipeline_efficiency", rates.pipeline_efficiency},
                {"predicted_bottleneck_ms", pr.predicted_bottleneck_ms},
                {"measured_bottleneck_ms", *std::max_element(pr.measured_stage_ms.begin(), pr.measured_stage_ms.end())}};
  std::vector<std::string> warnings;
  balance::add_simulated_metrics(ctx.predictor(), p, pr, rates.decode_tokens_per_s, balance::rounds_profile(ctx.record()), warnings);
  print_warnings(warnings);
  pr.measured = true;
  ctx.progress.say("benchmark " + p.solver + ": " + format_fixed(rates.tokens_per_s, 2) + " tokens/s, validation " +
                   (!pr.validated ? "skipped" : pr.tokens_match && pr.checksum_match ? "OK" : "FAILED"));
}

}  // namespace

void gather_round(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches,
                  std::vector<ClosedTurns>& turns) {
  // Each bench's new repetitions and their offset in every rank's message (every rank took the
  // same turns, so the offsets are the same on every rank).
  std::vector<size_t> fresh(benches.size()), offset(benches.size());
  std::vector<double> mine;  // each bench's new repetitions, in bench order
  for (size_t i = 0; i < benches.size(); ++i) {
    const Bench& b = benches[i];
    const ClosedTurns& t = turns.at(i);
    const size_t per_rep = rep_events(ctx, set.splits[b.pi]);
    const size_t have = t.rec.events.size() / per_rep;
    if (have < t.reps_gathered) throw InternalError("gather_round: a partition lost repetitions");
    fresh[i] = have - t.reps_gathered;
    offset[i] = mine.size();
    mine.insert(mine.end(), t.rec.events.begin() + static_cast<std::ptrdiff_t>(t.reps_gathered * per_rep), t.rec.events.end());
  }
  const auto all = ctx.mpi.gatherv_doubles(mine);
  for (size_t i = 0; i < benches.size(); ++i) {
    const Bench& b = benches[i];
    ClosedTurns& t = turns[i];
    if (ctx.root) {
      const balance::Partition& p = set.splits[b.pi];
      const size_t per_rep = rep_events(ctx, p);
      for (size_t j = 0; j < fresh[i]; ++j) {
        std::vector<const double*> slice;  // [R][S]
        for (int r = 0; r < p.replicas; ++r)
          for (int k = 0; k < p.num_stages(); ++k) slice.push_back(all[p.first_rank(r, k)].data() + offset[i] + j * per_rep);
        append_repetition(ctx, p, ctx.record().partitions[b.pi], slice, b.rounds[t.reps_gathered + j]);
      }
    }
    t.reps_gathered += fresh[i];
  }
}

void gather_final(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches,
                  const std::vector<ClosedTurns>& turns) {
  for (size_t j = 0; j < benches.size(); ++j) {
    const Bench& b = benches[j];
    const ClosedTurns& t = turns.at(j);
    const balance::Partition& p = set.splits[b.pi];
    const std::vector<int> toks_mine(t.rec.tokens.begin(), t.rec.tokens.end());
    const std::vector<int> ref_mine(t.ref.tokens.begin(), t.ref.tokens.end());
    const auto toks = ctx.mpi.gatherv_ints(toks_mine);
    const auto refs = ctx.mpi.gatherv_ints(ref_mine);
    const auto sums = ctx.mpi.gather_doubles({t.rec.checksum, t.ref.checksum, t.rec.compute_lane_cpu_s, t.rec.recv_lane_cpu_s,
                                              t.rec.send_lane_cpu_s, t.rec.timed_wall_s});
    if (b.pi == 0) gather_expert_tokens(ctx, p, t.rec);
    if (!ctx.root) continue;
    PartitionRecord& pr = ctx.record().partitions[b.pi];
    pr.lane_cpu_s.clear();
    for (int k = 0; k < p.num_stages(); ++k) {
      const int r = p.device_rank[k];
      pr.lane_cpu_s.insert(pr.lane_cpu_s.end(), {sums[r * 6 + 2], sums[r * 6 + 3], sums[r * 6 + 4]});
    }
    pr.timed_wall_s = sums[p.device_rank[0] * 6 + 5];
    validate_record(ctx, p, pr, toks, refs, sums);
    complete_metrics(ctx, p, pr);
  }
}

}  // namespace ppb::run
