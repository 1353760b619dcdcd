#include "run/closed_rounds.h"

#include "run/memory_checks.h"

namespace ppb::run {

namespace {

/// The pipeline of partition `p`: the run's workload at p's M.
PipelineConfig pipeline_config(const RunContext& ctx, const balance::Partition& p) {
  PipelineConfig pc;
  pc.work = ctx.workload;
  pc.work.groups = partition_groups(ctx, p);
  pc.warmup = ctx.opt.warmup;
  pc.iters = ctx.opt.iters;
  pc.vocab = ctx.spec.vocab;
  pc.mode = ctx.opt.overlap ? LaneMode::overlap : LaneMode::no_overlap;
  return pc;
}

/// Appends one run_pipeline record (its timed repetitions) to the partition's record so far.
void append_record(StageRecord& to, const StageRecord& one) {
  to.events.insert(to.events.end(), one.events.begin(), one.events.end());
  to.rep_start_s.insert(to.rep_start_s.end(), one.rep_start_s.begin(), one.rep_start_s.end());
  to.tokens = one.tokens;
  to.checksum = one.checksum;
  to.expert_tokens = one.expert_tokens;  // the last repetition's, as the checksum
  to.compute_lane_cpu_s += one.compute_lane_cpu_s;
  to.recv_lane_cpu_s += one.recv_lane_cpu_s;
  to.send_lane_cpu_s += one.send_lane_cpu_s;
  to.timed_wall_s += one.timed_wall_s;
}

}  // namespace

void ClosedRounds::play_turn(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j, bool warm_up) {
  PipelineConfig pc = pipeline_config(ctx, p);
  pc.iters = 1;
  pc.warmup = warm_up ? ctx.opt.warmup : 0;
  StageRecord one;
  ctx.phase("benchmark of partition " + p.solver, [&] { one = run_pipeline(*ctx.device, *ctx.transport, *b.stage, b.place, pc); });
  append_record(turns_.at(j).rec, one);
}

void ClosedRounds::record_round(RunContext& ctx, const PartitionSet& set, std::vector<Bench>& benches, int rounds) {
  ctx.phase("gather of round " + std::to_string(rounds), [&] { gather_round(ctx, set, benches, turns_); });
  // This round's rows appended, not the whole file rewritten.
  ctx.phase("write after round " + std::to_string(rounds), [&] {
    if (ctx.root) ctx.record().rounds = rounds;
    ctx.append_snapshot();
  });
}

std::vector<RoundFigure> ClosedRounds::figures(const RunContext& ctx, size_t pi) const {
  const PartitionRecord& pr = ctx.record().partitions.at(pi);
  return {{&pr.rep_tokens_per_s, &pr.rep_round}, {&pr.rep_decode_tokens_per_s, &pr.rep_round}};
}

void ClosedRounds::validate(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j) {
  ctx.phase("validation of partition " + p.solver, [&] {
    PipelineConfig vc = pipeline_config(ctx, p);
    vc.warmup = 0;
    vc.iters = 1;
    vc.mode = LaneMode::serialized;
    turns_.at(j).ref = run_pipeline(*ctx.device, *ctx.transport, *b.stage, b.place, vc);
  });
  ctx.progress.say("validation " + p.solver + ": serialized reference run done");
}

void ClosedRounds::finish(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) {
  gather_final(ctx, set, benches, turns_);
}

}  // namespace ppb::run
