#include "run/rounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "common/clock.h"
#include "common/format.h"
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

/// Bytes this rank's stage of partition `p` needs (weights, KV cache and scratch: partition_stage_config).
size_t stage_total_bytes(const RunContext& ctx, const balance::Partition& p) {
  const StagePlacement place = PartitionSet::placement(p, ctx.mpi.rank());
  const int k = place.stage;
  return ctx.device->stage_bytes(ctx.spec, p.first_unit[k], p.last_unit[k], partition_stage_config(ctx, p, place)).total();
}

void build_stage(RunContext& ctx, const PartitionSet& set, Bench& b) {
  const balance::Partition& p = set.splits[b.pi];
  ctx.phase("build of partition " + p.solver, [&] {
    b.stage = ctx.device->create_stage(ctx.spec, p.first_unit[b.place.stage], p.last_unit[b.place.stage],
                                       partition_stage_config(ctx, p, b.place, b.tp.get()));
  });
}

/// Bench j's turn in round `round`: its stage built if it is not, the scenario's turn (its
/// warm-up on its first turn when its stage stays built, on every turn when it is rebuilt), the
/// stage freed again if it is rebuilt.
void take_turn(RunContext& ctx, RoundScenario& scenario, const PartitionSet& set, std::vector<Bench>& benches, size_t j,
               int round) {
  Bench& b = benches[j];
  if (!b.stage) build_stage(ctx, set, b);
  scenario.play_turn(ctx, set.splits[b.pi], b, j, !(b.resident && b.warmed));
  b.warmed = true;
  b.rounds.push_back(round);
  if (!b.resident) b.stage.reset();
}

/// Adds partition `pi` to the benchmark: resident when this rank and every other can hold its
/// stage beside the resident ones (collective), built now if so.
void add_bench(RunContext& ctx, RoundScenario& scenario, const PartitionSet& set, std::vector<Bench>& benches, size_t pi) {
  size_t resident_bytes = stage_total_bytes(ctx, set.splits[pi]);
  for (const Bench& b : benches)
    if (b.resident) resident_bytes += stage_total_bytes(ctx, set.splits[b.pi]);
  Bench b;
  b.pi = pi;
  b.place = PartitionSet::placement(set.splits[pi], ctx.mpi.rank());
  // Collective (every rank adds the same benches in the same order): the stage's group, one
  // colour per stage of each replica.
  const int colour = b.place.replica * set.splits[pi].num_stages() + b.place.stage;
  ctx.phase("tensor-parallel group of partition " + set.splits[pi].solver,
            [&] { b.tp = ctx.make_tp_group(b.place.tp_width > 1 ? colour : -1, b.place.tp_rank); });
  ctx.phase("memory check of the partitions side by side",
            [&] { b.resident = ctx.mpi.agree(resident_bytes <= ctx.cluster.memory_limit ? 0 : 1) == 0; });
  if (b.resident) build_stage(ctx, set, b);
  scenario.add_bench(benches.size());
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
  /// Brings bench j's comparisons with the reference bench up to date with their new rounds:
  /// `ref` and `mine` are their figures (RoundScenario::figures), in the same order.
  void update(const std::vector<RoundFigure>& ref, const std::vector<RoundFigure>& mine, size_t pi) {
    Stream& st = streams_[pi];
    st.gains.resize(ref.size());
    const std::vector<int>& ra = *ref[0].rounds;
    const std::vector<int>& rb = *mine[0].rounds;
    const size_t na = std::min(ra.size(), ref[0].values->size()), nb = std::min(rb.size(), mine[0].values->size());
    while (st.i < na) {
      while (st.j < nb && rb[st.j] < ra[st.i]) ++st.j;
      if (st.j >= nb) break;  // the bench's turn of it may come
      if (rb[st.j] == ra[st.i]) {
        for (size_t f = 0; f < ref.size(); ++f)
          if (st.i < ref[f].values->size() && st.j < mine[f].values->size())
            st.gains[f].add((*ref[f].values)[st.i], (*mine[f].values)[st.j]);
        ++st.pairs;
      }
      ++st.i;
    }
  }
  /// Bench pi's gains against the reference, one per figure: streaming, or compare_paired's on
  /// every pair (`full`). Call update first.
  std::vector<PairedComparison> gains(const std::vector<RoundFigure>& ref, const std::vector<RoundFigure>& mine, size_t pi,
                                      bool full = false) {
    std::vector<PairedComparison> out;
    const Stream& st = streams_[pi];
    for (size_t f = 0; f < ref.size(); ++f) {
      if (!full) {
        out.push_back(f < st.gains.size() ? st.gains[f].current() : PairedComparison{});
        continue;
      }
      auto [a, b] = same_rounds(*ref[f].values, *ref[f].rounds, *mine[f].values, *mine[f].rounds);
      out.push_back(compare_paired(a, b));
    }
    return out;
  }
  /// Whether a --target-ci met by the streaming intervals may be confirmed now: the first time,
  /// or once the pairs grew by 2% since the last confirmation that failed.
  bool may_confirm(size_t pairs) const { return confirmed_at_ == 0 || pairs * 50 >= confirmed_at_ * 51; }
  void confirmation_failed(size_t pairs) { confirmed_at_ = pairs; }
  /// The pairs of partition pi so far.
  size_t pairs(size_t pi) { return streams_[pi].pairs; }

 private:
  struct Stream {
    size_t i = 0, j = 0;  // the pairing's position in the reference's and the bench's turns
    size_t pairs = 0;
    std::vector<StreamingPairedComparison> gains;  // one per figure
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

/// Rank 0: the gains of every bench against the reference, brought up to date with the round.
struct RoundGains {
  double worst = 0.0;  ///< the widest relative CI half-width of the streaming gains (inf while one has none)
  size_t fewest_pairs = std::numeric_limits<size_t>::max();
  std::string text;    ///< "; balanced/uniform so far 1.050x [1.01, 1.09], decode ..."
};

RoundGains update_gains(const RunContext& ctx, const RoundScenario& scenario, const PartitionSet& set,
                        const std::vector<Bench>& benches, GainTracker& tracker) {
  const std::vector<std::string> labels = scenario.figure_labels();
  const size_t ref = reference_bench(set, benches);
  const std::vector<RoundFigure> rf = scenario.figures(ctx, benches[ref].pi);
  RoundGains out;
  std::ostringstream os;
  for (size_t j = 0; j < benches.size(); ++j) {
    if (j == ref) continue;
    const size_t pi = benches[j].pi;
    const std::vector<RoundFigure> mf = scenario.figures(ctx, pi);
    tracker.update(rf, mf, pi);
    out.fewest_pairs = std::min(out.fewest_pairs, tracker.pairs(pi));
    const std::vector<PairedComparison> g = tracker.gains(rf, mf, pi);
    os << "; " << set.splits[pi].solver << "/" << set.splits[benches[ref].pi].solver << " so far";
    for (size_t f = 0; f < g.size(); ++f) {
      const PairedComparison& c = g[f];
      if (c.n == 0) continue;  // no such figure (a decode rate at G = 1)
      out.worst = std::max(out.worst, std::isnan(c.ci_low) ? std::numeric_limits<double>::infinity() : c.half_width());
      os << (f ? ", " + labels[f] : std::string()) << " " << format_fixed(c.ratio, 3) << "x";
      if (!std::isnan(c.ci_low)) os << " [" << format_fixed(c.ci_low, 3) << ", " << format_fixed(c.ci_high, 3) << "]";
    }
  }
  out.text = os.str();
  return out;
}

/// Rank 0: the widest relative CI half-width of compare_paired's gains on every pair (those the
/// summary reports; inf while one has none).
double widest_full(const RunContext& ctx, const RoundScenario& scenario, const PartitionSet& set,
                   const std::vector<Bench>& benches, GainTracker& tracker) {
  const size_t ref = reference_bench(set, benches);
  const std::vector<RoundFigure> rf = scenario.figures(ctx, benches[ref].pi);
  double w = 0.0;
  for (size_t j = 0; j < benches.size(); ++j)
    if (j != ref)
      for (const PairedComparison& c : tracker.gains(rf, scenario.figures(ctx, benches[j].pi), benches[j].pi, true))
        if (c.n > 0) w = std::max(w, std::isnan(c.ci_low) ? std::numeric_limits<double>::infinity() : c.half_width());
  return w;
}

/// Rank 0, after each round: prints the round's figures and returns why the rounds stop
/// ("" = another round). `hold`: a hook still needs rounds.
std::string round_verdict(RunContext& ctx, const RoundScenario& scenario, const PartitionSet& set,
                          const std::vector<Bench>& benches, GainTracker& tracker, const StopRule& rule,
                          const RoundState& state, bool hold) {
  std::ostringstream os;
  os << "benchmark round " << state.rounds << ":";
  for (size_t j = 0; j < benches.size(); ++j)
    os << (j ? "," : "") << " " << set.splits[benches[j].pi].solver << " "
       << format_fixed(scenario.figures(ctx, benches[j].pi)[0].values->back(), 2);
  os << " " << scenario.figure_labels()[0];
  const RoundGains g = update_gains(ctx, scenario, set, benches, tracker);
  os << g.text;
  const double left = rule.max_time_s - state.elapsed_s;
  os << " (" << format_fixed(state.elapsed_s, 0) << " s";
  if (state.elapsed_s <= rule.max_time_s)
    os << " of --max-time " << format_fixed(rule.max_time_s, 0) << ")";
  else  // only --iters keeps the rounds going past it
    os << ": past --max-time " << format_fixed(rule.max_time_s, 0) << "; --iters " << rule.min_rounds
       << " rounds run whatever the time)";
  ctx.progress.say(os.str());
  // A reason to stop states the CIs of the full resamples (those the summary reports).
  auto full = [&] { return widest_full(ctx, scenario, set, benches, tracker); };
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
           " s: another round would end after it, before the adaptive split converged; widest gain CI " + hw(full());
  }
  if (benches.size() < 2) return "--iters rounds done (one split: no gain to narrow)";
  if (rule.target_ci_pct <= 0) return "--iters rounds done (--target-ci 0); widest gain CI " + hw(full());
  if (g.worst <= rule.target_ci_pct / 100.0 && tracker.may_confirm(g.fewest_pairs)) {
    const double worst = full();  // confirmed with every pair
    if (worst <= rule.target_ci_pct / 100.0)
      return "every gain's 95% CI within " + hw(worst) + " (--target-ci " + format_fixed(rule.target_ci_pct, 1) + "%)";
    tracker.confirmation_failed(g.fewest_pairs);
  }
  if (state.round_s > left)
    return "--max-time " + format_fixed(rule.max_time_s, 0) + " s: another round would end after it; widest gain CI " +
           hw(full());
  if (state.rounds >= rule.max_rounds)
    return std::to_string(rule.max_rounds) + " rounds (the most); widest gain CI " + hw(full());
  return "";
}

/// Collective: partitions a hook proposed on rank 0 (their records already appended there) to
/// every rank, checked against memory and added to the rounds.
void add_proposed(RunContext& ctx, RoundScenario& scenario, PartitionSet& set, std::vector<Bench>& benches,
                  std::vector<balance::Partition> proposed, int rounds) {
  ctx.phase("adaptive split", [&] { broadcast_partitions(ctx.mpi, proposed, ctx.spec.num_units()); });
  for (balance::Partition& p : proposed) {
    set.splits.push_back(p);
    ctx.phase("memory check of partition " + p.solver, [&] {
      if (stage_total_bytes(ctx, p) > ctx.cluster.memory_limit)
        throw UserError("the adaptive split " + p.counts_string() + " does not fit rank " + std::to_string(ctx.mpi.rank()) +
                        "'s --memory-limit");
    });
    add_bench(ctx, scenario, set, benches, set.size() - 1);
    ctx.progress.say("benchmark: partition " + p.solver + " (" + p.counts_string() + ") joins the rounds from round " +
                     std::to_string(rounds + 1));
  }
}

/// Collective: every bench's validation (the scenario's), its stage rebuilt where it is not
/// resident, then freed.
void validate_benches(RunContext& ctx, RoundScenario& scenario, const PartitionSet& set, std::vector<Bench>& benches) {
  for (size_t j = 0; j < benches.size(); ++j) {
    Bench& b = benches[j];
    if (!b.stage) build_stage(ctx, set, b);
    scenario.validate(ctx, set.splits[b.pi], b, j);
    b.stage.reset();
  }
}

/// Collective: a bench for every partition measured on its own, built side by side with the
/// others' where memory allows.
std::vector<Bench> build_benches(RunContext& ctx, RoundScenario& scenario, const PartitionSet& set) {
  std::vector<Bench> benches;
  const balance::SplitEquivalence& eq = ctx.cluster.equivalence;
  size_t to_measure = 0;
  for (size_t i = 0; i < set.size(); ++i) to_measure += set.measured_alone(i, eq) ? 1 : 0;
  for (size_t i = 0; i < set.size(); ++i)
    if (set.measured_alone(i, eq)) {
      ctx.progress.say("benchmark: building partition " + set.splits[i].solver + "'s stages (" + set.splits[i].counts_string() +
                       ")" + (to_measure > 1 ? ", side by side with the others' where memory allows" : ""));
      add_bench(ctx, scenario, set, benches, i);
    }
  return benches;
}

long resident_count(const std::vector<Bench>& benches) {
  return std::count_if(benches.begin(), benches.end(), [](const Bench& b) { return b.resident; });
}

}  // namespace

RoundsOutcome run_interleaved_rounds(RunContext& ctx, PartitionSet& set, RoundScenario& scenario, const StopRule& rule,
                                     const std::vector<RoundHook*>& hooks) {
  std::vector<Bench> benches = build_benches(ctx, scenario, set);
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
    for (size_t j = 0; j < benches.size(); ++j)
      take_turn(ctx, scenario, set, benches, (j + state.rounds) % benches.size(), state.rounds);
    gap_start = monotonic_s();
    state.turns_s += gap_start - round_start;
    ++state.rounds;
    state.elapsed_s = monotonic_s() - t0;
    state.round_s = monotonic_s() - round_start;
    for (RoundHook* h : hooks) h->after_round(ctx, state);
    // What the rounds measured so far is in the file if the run fails later (complete=0).
    scenario.record_round(ctx, set, benches, state.rounds);
    std::vector<balance::Partition> proposed;
    if (ctx.root) {
      const double now = monotonic_s();
      state.elapsed_s = now - t0;
      state.round_s = now - round_start;
      const bool hold = std::any_of(hooks.begin(), hooks.end(), [](const RoundHook* h) { return h->holds_rounds(); });
      out.stop_reason = round_verdict(ctx, scenario, set, benches, tracker, rule, state, hold);
      if (out.stop_reason.empty())
        for (RoundHook* h : hooks) {
          auto more = h->propose(ctx, set, state);
          proposed.insert(proposed.end(), more.begin(), more.end());
        }
    }
    ctx.mpi.bcast_string(out.stop_reason);
    add_proposed(ctx, scenario, set, benches, std::move(proposed), state.rounds);
  }
  if (ctx.root) ctx.record().round_gap_s.push_back(monotonic_s() - gap_start);  // the last round's
  const long resident = resident_count(benches);
  out.rounds = state.rounds;
  out.schedule = resident == static_cast<long>(benches.size()) ? "interleaved, stages resident"
                 : resident == 0                               ? "interleaved, stages rebuilt every round"
                                                               : "interleaved, some stages rebuilt every round (memory)";
  ctx.progress.say("benchmark: " + std::to_string(out.rounds) + " round(s), " + out.stop_reason);
  for (RoundHook* h : hooks) h->finish(ctx);
  if (ctx.opt.validate && scenario.validates()) validate_benches(ctx, scenario, set, benches);
  for (Bench& b : benches) b.stage.reset();
  scenario.finish(ctx, set, benches);
  return out;
}

}  // namespace ppb::run
