#include "run/rounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "common/clock.h"
#include "common/format.h"
#include "run/gather.h"
#include "run/memory_checks.h"

namespace ppb::run {

std::pair<std::vector<double>, std::vector<double>> same_rounds(const std::vector<double>& a, const std::vector<int>& ra,
                                                                const std::vector<double>& b, const std::vector<int>& rb) {
  std::pair<std::vector<double>, std::vector<double>> out;
  size_t j = 0;
  for (size_t i = 0; i < a.size() && i < ra.size(); ++i) {
    while (j < rb.size() && rb[j] < ra[i]) ++j;
    if (j >= rb.size() || j >= b.size()) break;
    if (rb[j] != ra[i]) continue;
    out.first.push_back(a[i]);
    out.second.push_back(b[j]);
  }
  return out;
}

namespace {

/// Bytes this rank's stage of partition `p` needs (weights, KV cache and scratch).
size_t stage_total_bytes(const RunContext& ctx, const balance::Partition& p) {
  const StagePlacement place = PartitionSet::placement(p, ctx.mpi.rank());
  const int k = place.stage;
  return stage_bytes(ctx, p.first_unit[k], p.last_unit[k], partition_groups(ctx, p), place.tp_width, place.tp_rank).total();
}

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

void build_stage(RunContext& ctx, const PartitionSet& set, Bench& b) {
  const balance::Partition& p = set.splits[b.pi];
  ctx.phase("build of partition " + p.solver, [&] {
    b.stage = ctx.device->create_stage(ctx.spec, p.first_unit[b.place.stage], p.last_unit[b.place.stage],
                                       stage_config(ctx, partition_groups(ctx, p), b.place.tp_width, b.place.tp_rank, b.tp.get()));
  });
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

/// The partition's turn in round `round`: its warm-up (on its first turn when its stage stays
/// built; on every turn when it is rebuilt), then one timed repetition.
void take_turn(RunContext& ctx, const PartitionSet& set, Bench& b, int round) {
  const balance::Partition& p = set.splits[b.pi];
  if (!b.stage) build_stage(ctx, set, b);
  PipelineConfig pc = pipeline_config(ctx, p);
  pc.iters = 1;
  pc.warmup = b.resident && b.warmed ? 0 : ctx.opt.warmup;
  StageRecord one;
  ctx.phase("benchmark of partition " + p.solver, [&] { one = run_pipeline(*ctx.device, *ctx.transport, *b.stage, b.place, pc); });
  b.warmed = true;
  append_record(b.rec, one);
  b.rounds.push_back(round);
  if (!b.resident) b.stage.reset();
}

/// Adds partition `pi` to the benchmark: resident when this rank and every other can hold its
/// stage beside the resident ones (collective), built now if so.
void add_bench(RunContext& ctx, const PartitionSet& set, std::vector<Bench>& benches, size_t pi) {
  size_t resident_bytes = stage_total_bytes(ctx, set.splits[pi]);
  for (const Bench& b : benches)
    if (b.resident) resident_bytes += stage_total_bytes(ctx, set.splits[b.pi]);
  Bench b;
  b.pi = pi;
  b.place = PartitionSet::placement(set.splits[pi], ctx.mpi.rank());
  // Collective (every rank adds the same benches in the same order): the stage's group.
  ctx.phase("tensor-parallel group of partition " + set.splits[pi].solver,
            [&] { b.tp = ctx.make_tp_group(b.place.tp_width > 1 ? b.place.stage : -1, b.place.tp_rank); });
  ctx.phase("memory check of the partitions side by side",
            [&] { b.resident = ctx.mpi.agree(resident_bytes <= ctx.cluster.memory_limit ? 0 : 1) == 0; });
  if (b.resident) build_stage(ctx, set, b);
  benches.push_back(std::move(b));
}

/// Rank 0's gains against the reference so far, at a cost per round that does not grow with
/// the rounds (issue 34): each round's new pairs (same_rounds' pairing, advanced from where the
/// last round left it) enter a StreamingPairedComparison, O(resamples) each, and its interval is
/// read in O(resamples). A bootstrap from scratch each round would cost O(resamples x rounds)
/// per round, O(rounds^2) over the run. A reason to stop is stated with compare_paired's
/// intervals on every pair (`full`: O(pairs), once at the end), those the summary reports; a
/// --target-ci met by the streaming interval is confirmed with them before the rounds stop, and
/// a confirmation that fails is not tried again before the pairs grew by 2%.
class GainTracker {
 public:
  struct Gains {
    PairedComparison tokens, decode;
  };
  /// Brings bench j's comparison with the reference bench up to date with their new rounds.
  void update(const std::vector<PartitionRecord>& parts, const std::vector<Bench>& benches, size_t ref, size_t j) {
    const PartitionRecord& a = parts[benches[ref].pi];
    const PartitionRecord& b = parts[benches[j].pi];
    Stream& st = streams_[benches[j].pi];
    while (st.i < a.rep_round.size() && st.i < a.rep_tokens_per_s.size()) {
      while (st.j < b.rep_round.size() && b.rep_round[st.j] < a.rep_round[st.i]) ++st.j;
      if (st.j >= b.rep_round.size() || st.j >= b.rep_tokens_per_s.size()) break;  // b's turn of it may come
      if (b.rep_round[st.j] == a.rep_round[st.i]) {
        st.tokens.add(a.rep_tokens_per_s[st.i], b.rep_tokens_per_s[st.j]);
        st.decode.add(a.rep_decode_tokens_per_s[st.i], b.rep_decode_tokens_per_s[st.j]);
        ++st.pairs;
      }
      ++st.i;
    }
  }
  /// Bench j's gains against the reference bench: streaming, or compare_paired's on every pair
  /// (`full`). Call update first.
  Gains gains(const std::vector<PartitionRecord>& parts, const std::vector<Bench>& benches, size_t ref, size_t j,
              bool full = false) {
    const Stream& st = streams_[benches[j].pi];
    if (!full) return {st.tokens.current(), st.decode.current()};
    const PartitionRecord& a = parts[benches[ref].pi];
    const PartitionRecord& b = parts[benches[j].pi];
    auto [ta, tb] = same_rounds(a.rep_tokens_per_s, a.rep_round, b.rep_tokens_per_s, b.rep_round);
    auto [da, db] = same_rounds(a.rep_decode_tokens_per_s, a.rep_round, b.rep_decode_tokens_per_s, b.rep_round);
    return {compare_paired(ta, tb), compare_paired(da, db)};
  }
  /// Whether a --target-ci met by the streaming intervals may be confirmed now: the first time,
  /// or once the pairs grew by 2% since the last confirmation that failed.
  bool may_confirm(size_t pairs) const { return confirmed_at_ == 0 || pairs * 50 >= confirmed_at_ * 51; }
  void confirmation_failed(size_t pairs) { confirmed_at_ = pairs; }
  /// The pairs of bench j so far.
  size_t pairs(const std::vector<Bench>& benches, size_t j) { return streams_[benches[j].pi].pairs; }

 private:
  struct Stream {
    size_t i = 0, j = 0;  // the pairing's position in the reference's and the bench's repetitions
    size_t pairs = 0;
    StreamingPairedComparison tokens, decode;
  };
  std::map<size_t, Stream> streams_;
  size_t confirmed_at_ = 0;
};

/// Index in `benches` of the reference partition (the set's), else the first.
size_t reference_bench(const PartitionSet& set, const std::vector<Bench>& benches) {
  for (size_t j = 0; j < benches.size(); ++j)
    if (set.splits[benches[j].pi].solver == set.reference) return j;
  return 0;
}

/// Rank 0, after each round: prints the round's figures and returns why the rounds stop
/// ("" = another round). `hold`: a hook still needs rounds.
std::string round_verdict(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches, GainTracker& tracker,
                          const StopRule& rule, const RoundState& state, bool hold) {
  const std::vector<PartitionRecord>& parts = ctx.record().partitions;
  const size_t ref = reference_bench(set, benches);
  std::ostringstream os;
  os << "benchmark round " << state.rounds << ":";
  for (size_t j = 0; j < benches.size(); ++j)
    os << (j ? "," : "") << " " << set.splits[benches[j].pi].solver << " "
       << format_fixed(parts[benches[j].pi].rep_tokens_per_s.back(), 2);
  os << " tokens/s";
  double worst = 0.0;  // the widest relative CI half-width of the gains (inf while one has none)
  size_t fewest_pairs = std::numeric_limits<size_t>::max();
  for (size_t j = 0; j < benches.size(); ++j) {
    if (j == ref) continue;
    tracker.update(parts, benches, ref, j);
    fewest_pairs = std::min(fewest_pairs, tracker.pairs(benches, j));
    const GainTracker::Gains g = tracker.gains(parts, benches, ref, j);
    os << "; " << set.splits[benches[j].pi].solver << "/" << set.splits[benches[ref].pi].solver << " so far "
       << format_fixed(g.tokens.ratio, 3) << "x";
    for (const PairedComparison* c : {&g.tokens, &g.decode}) {
      if (c->n == 0) continue;  // no decode rate (G = 1)
      worst = std::max(worst, std::isnan(c->ci_low) ? std::numeric_limits<double>::infinity() : c->half_width());
    }
    if (!std::isnan(g.tokens.ci_low))
      os << " [" << format_fixed(g.tokens.ci_low, 3) << ", " << format_fixed(g.tokens.ci_high, 3) << "]";
    if (g.decode.n > 0) {  // --target-ci waits for the decode gain's CI too: show it
      os << ", decode " << format_fixed(g.decode.ratio, 3) << "x";
      if (!std::isnan(g.decode.ci_low))
        os << " [" << format_fixed(g.decode.ci_low, 3) << ", " << format_fixed(g.decode.ci_high, 3) << "]";
    }
  }
  const double left = rule.max_time_s - state.elapsed_s;
  os << " (" << format_fixed(state.elapsed_s, 0) << " s";
  if (state.elapsed_s <= rule.max_time_s)
    os << " of --max-time " << format_fixed(rule.max_time_s, 0) << ")";
  else  // only --iters keeps the rounds going past it
    os << ": past --max-time " << format_fixed(rule.max_time_s, 0) << "; --iters " << rule.min_rounds
       << " rounds run whatever the time)";
  ctx.progress.say(os.str());
  // A reason to stop states the CIs of the full resamples (those the summary reports).
  auto widest_full = [&] {
    double w = 0.0;
    for (size_t j = 0; j < benches.size(); ++j)
      if (j != ref) {
        const GainTracker::Gains g = tracker.gains(parts, benches, ref, j, true);
        for (const PairedComparison* c : {&g.tokens, &g.decode})
          if (c->n > 0) w = std::max(w, std::isnan(c->ci_low) ? std::numeric_limits<double>::infinity() : c->half_width());
      }
    return w;
  };
  auto hw = [](double w) {
    return std::isfinite(w) ? "+-" + format_fixed(100.0 * w, 1) + "%"
                            : "not every gain has one yet (fewer than " + std::to_string(kMinPairsForCI) + " paired rounds)";
  };
  int fewest = state.rounds;  // rounds of the partition that joined last
  for (const Bench& b : benches) fewest = std::min(fewest, static_cast<int>(b.rounds.size()));
  if (fewest < rule.min_rounds) return "";  // --iters rounds of every partition, whatever the time
  if (hold) {
    if (state.round_s <= left) return "";
    return "--max-time " + format_fixed(rule.max_time_s, 0) +
           " s: another round would end after it, before the adaptive split converged; widest gain CI " + hw(widest_full());
  }
  if (benches.size() < 2) return "--iters rounds done (one split: no gain to narrow)";
  if (rule.target_ci_pct <= 0) return "--iters rounds done (--target-ci 0); widest gain CI " + hw(widest_full());
  if (worst <= rule.target_ci_pct / 100.0 && tracker.may_confirm(fewest_pairs)) {
    worst = widest_full();  // confirmed with every pair
    if (worst <= rule.target_ci_pct / 100.0)
      return "every gain's 95% CI within " + hw(worst) + " (--target-ci " + format_fixed(rule.target_ci_pct, 1) + "%)";
    tracker.confirmation_failed(fewest_pairs);
  }
  if (state.round_s > left)
    return "--max-time " + format_fixed(rule.max_time_s, 0) + " s: another round would end after it; widest gain CI " +
           hw(widest_full());
  if (state.rounds >= rule.max_rounds)
    return std::to_string(rule.max_rounds) + " rounds (the most); widest gain CI " + hw(widest_full());
  return "";
}

/// Collective: partitions a hook proposed on rank 0 (their records already appended there) to
/// every rank, checked against memory and added to the rounds.
void add_proposed(RunContext& ctx, PartitionSet& set, std::vector<Bench>& benches, std::vector<balance::Partition> proposed,
                  int rounds) {
  ctx.phase("adaptive split", [&] { broadcast_partitions(ctx.mpi, proposed, ctx.spec.num_units()); });
  for (balance::Partition& p : proposed) {
    set.splits.push_back(p);
    ctx.phase("memory check of partition " + p.solver, [&] {
      if (stage_total_bytes(ctx, p) > ctx.cluster.memory_limit)
        throw UserError("the adaptive split " + p.counts_string() + " does not fit rank " + std::to_string(ctx.mpi.rank()) +
                        "'s --memory-limit");
    });
    add_bench(ctx, set, benches, set.size() - 1);
    ctx.progress.say("benchmark: partition " + p.solver + " (" + p.counts_string() + ") joins the rounds from round " +
                     std::to_string(rounds + 1));
  }
}

/// Collective: the serialized reference run of every bench (validation), its stage rebuilt
/// where it is not resident, then freed.
void validate_benches(RunContext& ctx, const PartitionSet& set, std::vector<Bench>& benches) {
  for (Bench& b : benches) {
    const balance::Partition& p = set.splits[b.pi];
    if (!b.stage) build_stage(ctx, set, b);
    ctx.phase("validation of partition " + p.solver, [&] {
      PipelineConfig vc = pipeline_config(ctx, p);
      vc.warmup = 0;
      vc.iters = 1;
      vc.mode = LaneMode::serialized;
      b.ref = run_pipeline(*ctx.device, *ctx.transport, *b.stage, b.place, vc);
    });
    b.stage.reset();
    ctx.progress.say("validation " + p.solver + ": serialized reference run done");
  }
}

/// Collective: a bench for every partition measured on its own, built side by side with the
/// others' where memory allows.
std::vector<Bench> build_benches(RunContext& ctx, const PartitionSet& set) {
  std::vector<Bench> benches;
  const balance::SplitEquivalence& eq = ctx.cluster.equivalence;
  size_t to_measure = 0;
  for (size_t i = 0; i < set.size(); ++i) to_measure += set.measured_alone(i, eq) ? 1 : 0;
  for (size_t i = 0; i < set.size(); ++i)
    if (set.measured_alone(i, eq)) {
      ctx.progress.say("benchmark: building partition " + set.splits[i].solver + "'s stages (" + set.splits[i].counts_string() +
                       ")" + (to_measure > 1 ? ", side by side with the others' where memory allows" : ""));
      add_bench(ctx, set, benches, i);
    }
  return benches;
}

long resident_count(const std::vector<Bench>& benches) {
  return std::count_if(benches.begin(), benches.end(), [](const Bench& b) { return b.resident; });
}

}  // namespace

RoundsOutcome run_interleaved_rounds(RunContext& ctx, PartitionSet& set, const StopRule& rule,
                                     const std::vector<RoundHook*>& hooks) {
  std::vector<Bench> benches = build_benches(ctx, set);
  if (benches.size() > 1)
    ctx.progress.say("benchmark: " + std::to_string(benches.size()) + " partitions in interleaved rounds, " +
                     (resident_count(benches) == static_cast<long>(benches.size())
                          ? "all stages built side by side"
                          : "each stage rebuilt (and warmed up) on every turn: memory holds one partition's stages at a "
                            "time, so rounds take longer"));
  for (RoundHook* h : hooks) h->before_rounds(ctx, set, benches);
  GainTracker tracker;
  RoundState state;
  state.benches = &benches;
  RoundsOutcome out;
  const double t0 = monotonic_s();
  double gap_start = std::numeric_limits<double>::quiet_NaN();  // rank 0: the last round's last turn ended
  while (out.stop_reason.empty()) {
    const double round_start = monotonic_s();
    if (ctx.root && !std::isnan(gap_start)) ctx.record().round_gap_s.push_back(round_start - gap_start);
    for (size_t j = 0; j < benches.size(); ++j) take_turn(ctx, set, benches[(j + state.rounds) % benches.size()], state.rounds);
    gap_start = monotonic_s();
    state.turns_s += gap_start - round_start;
    ++state.rounds;
    state.elapsed_s = monotonic_s() - t0;
    state.round_s = monotonic_s() - round_start;
    for (RoundHook* h : hooks) h->after_round(ctx, state);
    ctx.phase("gather of round " + std::to_string(state.rounds), [&] { gather_round(ctx, set, benches); });
    // What the rounds measured so far is in the file if the run fails later (complete=0): this
    // round's rows appended, not the whole file rewritten.
    ctx.phase("write after round " + std::to_string(state.rounds), [&] {
      if (ctx.root) ctx.record().rounds = state.rounds;
      ctx.append_snapshot();
    });
    std::vector<balance::Partition> proposed;
    if (ctx.root) {
      const double now = monotonic_s();
      state.elapsed_s = now - t0;
      state.round_s = now - round_start;
      const bool hold = std::any_of(hooks.begin(), hooks.end(), [](const RoundHook* h) { return h->holds_rounds(); });
      out.stop_reason = round_verdict(ctx, set, benches, tracker, rule, state, hold);
      if (out.stop_reason.empty())
        for (RoundHook* h : hooks) {
          auto more = h->propose(ctx, set, state);
          proposed.insert(proposed.end(), more.begin(), more.end());
        }
    }
    ctx.mpi.bcast_string(out.stop_reason);
    add_proposed(ctx, set, benches, std::move(proposed), state.rounds);
  }
  if (ctx.root) ctx.record().round_gap_s.push_back(monotonic_s() - gap_start);  // the last round's
  const long resident = resident_count(benches);
  out.rounds = state.rounds;
  out.schedule = resident == static_cast<long>(benches.size()) ? "interleaved, stages resident"
                 : resident == 0                               ? "interleaved, stages rebuilt every round"
                                                               : "interleaved, some stages rebuilt every round (memory)";
  ctx.progress.say("benchmark: " + std::to_string(out.rounds) + " round(s), " + out.stop_reason);
  for (RoundHook* h : hooks) h->finish(ctx);
  if (ctx.opt.validate) validate_benches(ctx, set, benches);
  for (Bench& b : benches) b.stage.reset();
  gather_final(ctx, set, benches);
  return out;
}

}  // namespace ppb::run
