#include "run/serving_rounds.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "common/clock.h"
#include "balance/serving_calibration.h"
#include "balance/serving_step_model.h"
#include "common/events.h"
#include "common/format.h"
#include "pipeline/serving_pipeline.h"
#include "results/serving_summary.h"
#include "results/summary.h"
#include "results/writer.h"
#include "run/finish.h"
#include "run/memory_checks.h"
#include "run/rounds.h"
#include "run/serving_search.h"
#include "serving/arrivals.h"
#include "serving/pipeline_sim.h"
#include "serving/request_metrics.h"
#include "stepcost/step_model.h"

namespace ppb::run {

namespace {

ServingConfig serving_config(const RunContext& ctx, const balance::Partition& p) {
  ServingConfig c;
  c.scheduler = serving_sim_config(ctx, p).scheduler;
  c.seed = ctx.workload.seed;
  c.vocab = ctx.spec.vocab;
  return c;
}

/// What stage 0 of a partition recorded, on rank 0.
struct Stage0View {
  std::vector<serving::RequestTimes> times;
  std::vector<int> group, slot;
  std::vector<int32_t> tokens;  ///< [sum of gen_len] request after request
  int steps = 0;
  double rows_mean = 0;
};

/// Collective: stage 0's part of `rec` on rank 0 (one gatherv of doubles: per request its four
/// times, group, slot, preemptions and preempted tokens, then every request's token times and token ids; then steps
/// and rows).
Stage0View gather_stage0(const RunContext& ctx, const ServingRecord& rec, bool stage0) {
  const auto& reqs = ctx.scenario_requests;
  std::vector<double> mine;
  if (stage0) {
    for (size_t q = 0; q < reqs.size(); ++q) {
      const bool timed = q < rec.times.size();
      const serving::RequestTimes t = timed ? rec.times[q] : serving::RequestTimes{};
      mine.insert(mine.end(), {t.arrival_s, t.admitted_s, t.first_token_s, t.finish_s,
                               static_cast<double>(q < rec.group.size() ? rec.group[q] : -1),
                               static_cast<double>(q < rec.slot.size() ? rec.slot[q] : -1),
                               static_cast<double>(t.preemptions), static_cast<double>(t.preempted_tokens)});
    }
    for (size_t q = 0; q < reqs.size(); ++q)
      for (int k = 0; k < reqs[q].gen_len; ++k) {
        const bool timed = q < rec.times.size() && k < static_cast<int>(rec.times[q].token_s.size());
        mine.push_back(timed ? rec.times[q].token_s[k] : std::numeric_limits<double>::quiet_NaN());
      }
    for (size_t q = 0; q < reqs.size(); ++q)
      for (int k = 0; k < reqs[q].gen_len; ++k) {
        const auto& tk = rec.tokens.at(q);
        mine.push_back(k < static_cast<int>(tk.size()) ? tk[k] : -1);
      }
    double rows = 0;
    for (int r : rec.step_rows) rows += r;
    mine.push_back(static_cast<double>(rec.step_rows.size()));
    mine.push_back(rec.step_rows.empty() ? 0.0 : rows / static_cast<double>(rec.step_rows.size()));
  }
  const std::vector<std::vector<double>> all = ctx.mpi.gatherv_doubles(mine);
  Stage0View v;
  if (!ctx.root) return v;
  const std::vector<double>* from = nullptr;
  for (const auto& a : all)
    if (!a.empty()) from = &a;
  if (!from) throw InternalError("serving: no rank sent stage 0's record");
  const std::vector<double>& d = *from;
  size_t i = 0;
  const size_t N = reqs.size();
  v.times.resize(N);
  v.group.resize(N);
  v.slot.resize(N);
  for (size_t q = 0; q < N; ++q, i += 8) {
    serving::RequestTimes& t = v.times[q];
    t = {d[i], d[i + 1], d[i + 2], d[i + 3], {}, reqs[q].prompt_len, reqs[q].gen_len, static_cast<int>(d[i + 6]),
         static_cast<int>(d[i + 7])};
    v.group[q] = static_cast<int>(d[i + 4]);
    v.slot[q] = static_cast<int>(d[i + 5]);
  }
  for (size_t q = 0; q < N; ++q) v.times[q].token_s.assign(d.begin() + i, d.begin() + i + reqs[q].gen_len), i += reqs[q].gen_len;
  for (size_t q = 0; q < N; ++q)
    for (int k = 0; k < reqs[q].gen_len; ++k) v.tokens.push_back(static_cast<int32_t>(d[i++]));
  v.steps = static_cast<int>(d[i]);
  v.rows_mean = d[i + 1];
  return v;
}

/// Stage 0's fields per step in gather_steps: group, prefill tokens, decode rows, their mean
/// position, prefill rows, prefill keys, decode keys.
constexpr size_t kStepFields = 7;

/// Collective: every stage's steps of `rec` into rank 0's record `pr` (each rank sends its
/// stage, its steps' compute start, s from its own start barrier, and duration, ms; stage 0 also
/// each step's kStepFields).
void gather_steps(const RunContext& ctx, const ServingRecord& rec, const StagePlacement& place, ServingPartitionRecord* pr) {
  // A stage's tensor-parallel rank 0 speaks for it (its peers ran the same steps).
  const size_t n = place.tp_rank == 0 ? rec.step_rows.size() : 0;
  std::vector<double> mine{static_cast<double>(place.stage), static_cast<double>(n)};
  for (size_t i = 0; i < n; ++i) {
    const double a = rec.events[i * kNumEvents + kComputeStart], e = rec.events[i * kNumEvents + kComputeEnd];
    mine.push_back(a - rec.start_monotonic_s);
    mine.push_back((e - a) * 1e3);
  }
  if (place.stage == 0 && place.tp_rank == 0)
    for (const ScheduledStep& st : rec.schedule) {
      double prefill = 0, decode = 0, context = 0, prefill_rows = 0;
      std::vector<int> pos, tokens;  // the rows, for the keys they attend (stepcost::step_work)
      for (const ScheduledRow& row : st.rows) {
        // A prompt or a chunk of one, or a recompute's (positions past the prompt, several tokens,
        // or a chunk before its last: no token); else one decode token (a one-token last chunk of
        // a recompute is that shape too).
        if (row.position < ctx.scenario_requests.at(row.request).prompt_len || row.tokens > 1 || !row.emits)
          prefill += row.tokens, ++prefill_rows;
        else
          decode += 1, context += row.position;
        pos.push_back(row.position), tokens.push_back(row.tokens);
      }
      const stepcost::StepWork w = stepcost::step_work(pos, tokens);  // as serving::step_shape counts them
      mine.insert(mine.end(), {static_cast<double>(st.group), prefill, decode, decode > 0 ? context / decode : 0.0,
                               prefill_rows, w.prefill_keys, w.decode_keys});
    }
  mine.push_back(static_cast<double>(rec.kv_resident_peak_bytes));  // last: every rank's
  const std::vector<std::vector<double>> all = ctx.mpi.gatherv_doubles(mine);
  if (!ctx.root) return;
  const int S = place.num_stages;
  pr->stages = S;
  pr->stage_kv_resident_peak_bytes.assign(S, 0.0);
  for (const std::vector<double>& d : all) {
    double& peak = pr->stage_kv_resident_peak_bytes.at(static_cast<size_t>(d.at(0)));
    peak = std::max(peak, d.back());
  }
  pr->step_compute_start_s.assign(n * S, std::numeric_limits<double>::quiet_NaN());
  pr->step_compute_ms = pr->step_compute_start_s;
  for (const std::vector<double>& d : all) {
    const int k = static_cast<int>(d.at(0));
    const size_t m = std::min(n, static_cast<size_t>(d.at(1)));
    for (size_t i = 0; i < m; ++i) {
      pr->step_compute_start_s[i * S + k] = d[2 + 2 * i];
      pr->step_compute_ms[i * S + k] = d[3 + 2 * i];
    }
    if (k != 0 || d.size() < 2 + 2 * static_cast<size_t>(d[1]) + kStepFields * n) continue;
    pr->step_group.clear(), pr->step_prefill_tokens.clear(), pr->step_decode_rows.clear(), pr->step_decode_context.clear();
    pr->step_prefill_rows.clear(), pr->step_prefill_keys.clear(), pr->step_decode_keys.clear();
    for (size_t i = 0, j = 2 + 2 * static_cast<size_t>(d[1]); i < n; ++i, j += kStepFields) {
      pr->step_group.push_back(static_cast<int>(d[j]));
      pr->step_prefill_tokens.push_back(static_cast<int>(d[j + 1]));
      pr->step_decode_rows.push_back(static_cast<int>(d[j + 2]));
      pr->step_decode_context.push_back(d[j + 3]);
      pr->step_prefill_rows.push_back(static_cast<int>(d[j + 4]));
      pr->step_prefill_keys.push_back(d[j + 5]);
      pr->step_decode_keys.push_back(d[j + 6]);
    }
  }
}

/// A warm-up: one prefill step of the first min(B, N) requests in every group, then one decode.
std::vector<ScheduledStep> warmup_schedule(const std::vector<serving::Request>& reqs, int groups, int slots) {
  std::vector<ScheduledStep> out;
  const int n = std::min<int>(slots, static_cast<int>(reqs.size()));
  for (int g = 0; g < groups; ++g) {
    ScheduledStep pre{g, {}}, dec{g, {}};
    for (int r = 0; r < n; ++r) {
      pre.rows.push_back({r, r, 0, reqs[r].prompt_len});
      if (reqs[r].gen_len > 1) dec.rows.push_back({r, r, reqs[r].prompt_len, 1});
    }
    out.push_back(pre);
    if (!dec.rows.empty()) out.push_back(dec);
  }
  return out;
}

/// Rank 0: the scenario's description (at ctx.scenario_rate) in `r`.
void record_scenario(RunContext& ctx, ServingRunRecord& r) {
  const ScenarioOptions& s = ctx.opt.scenario;
  r.spec = s.spec;
  r.request_rate = ctx.scenario_rate;
  if (s.spec->kind == serving::ArrivalKind::trace && !ctx.scenario_requests.empty() && ctx.scenario_requests.back().arrival_s > 0)
    r.request_rate = static_cast<double>(ctx.scenario_requests.size()) / ctx.scenario_requests.back().arrival_s;
  r.trace = s.drawn.trace;
  r.arrival_s.clear(), r.prompt_len.clear(), r.gen_len.clear();
  for (const serving::Request& q : ctx.scenario_requests) {
    r.arrival_s.push_back(q.arrival_s);
    r.prompt_len.push_back(q.prompt_len);
    r.gen_len.push_back(q.gen_len);
  }
}

/// Rank 0: one round's measurement of a partition into its record `p`.
void record_turn(RunContext& ctx, ServingPartitionRecord& p, const Stage0View& v, int round) {
  const serving::ServingMetrics m = serving::serving_metrics(v.times, ctx.opt.scenario.spec->goodput);
  p.rep_round.push_back(round);
  p.rep_duration_s.push_back(m.duration_s);
  p.rep_output_tokens_per_s.push_back(m.output_tokens_per_s);
  p.rep_request_throughput.push_back(m.request_throughput);
  p.rep_goodput_req_per_s.push_back(m.goodput_req_per_s);
  p.rep_slo_attainment.push_back(m.slo_attainment);
  p.rep_ttft_p50_ms.push_back(m.ttft.p50_ms);
  p.rep_ttft_p99_ms.push_back(m.ttft.p99_ms);
  p.rep_tpot_p50_ms.push_back(m.tpot.p50_ms);
  p.rep_tpot_p99_ms.push_back(m.tpot.p99_ms);
  p.rep_preemptions.push_back(static_cast<double>(m.preemptions));
  p.arrival_s.clear(), p.admitted_s.clear(), p.first_token_s.clear(), p.finish_s.clear(), p.token_s.clear();
  p.prompt_len.clear(), p.gen_len.clear(), p.preemptions.clear(), p.preempted_tokens.clear();
  for (const serving::RequestTimes& t : v.times) {
    p.preemptions.push_back(t.preemptions);
    p.preempted_tokens.push_back(t.preempted_tokens);
    p.arrival_s.push_back(t.arrival_s);
    p.admitted_s.push_back(t.admitted_s);
    p.first_token_s.push_back(t.first_token_s);
    p.finish_s.push_back(t.finish_s);
    p.prompt_len.push_back(t.prompt_len);
    p.gen_len.push_back(t.gen_len);
    p.token_s.insert(p.token_s.end(), t.token_s.begin(), t.token_s.end());
  }
  p.group = v.group;
  p.slot = v.slot;
  p.tokens = v.tokens;
  p.steps = v.steps;
  p.step_rows_mean = v.rows_mean;
}

/// Rank 0: the partition's metrics pooled over its rounds (serving::pooled_metrics: latencies
/// over every round's requests; rates as the rounds' total work over their total time).
void pool_rounds(ServingPartitionRecord& p, const std::vector<std::vector<serving::RequestTimes>>& rounds,
                 const serving::GoodputSpec& slo) {
  const serving::ServingMetrics m = serving::pooled_metrics(rounds, slo);
  p.ttft_mean_ms = m.ttft.mean_ms, p.ttft_p50_ms = m.ttft.p50_ms, p.ttft_p90_ms = m.ttft.p90_ms, p.ttft_p99_ms = m.ttft.p99_ms;
  p.tpot_mean_ms = m.tpot.mean_ms, p.tpot_p50_ms = m.tpot.p50_ms, p.tpot_p90_ms = m.tpot.p90_ms, p.tpot_p99_ms = m.tpot.p99_ms;
  p.itl_p50_ms = m.itl.p50_ms, p.itl_p99_ms = m.itl.p99_ms, p.e2e_p50_ms = m.e2e.p50_ms, p.e2e_p99_ms = m.e2e.p99_ms;
  p.queue_p50_ms = m.queue.p50_ms, p.queue_p99_ms = m.queue.p99_ms;
  p.output_tokens_per_s = m.output_tokens_per_s;
  p.total_tokens_per_s = m.total_tokens_per_s;
  p.request_throughput = m.request_throughput;
  p.goodput_req_per_s = m.goodput_req_per_s;
  p.slo_attainment = m.slo_attainment;
  p.peak_output_tokens_per_s = m.peak_output_tokens_per_s;
  p.peak_concurrency = m.peak_concurrency;
}

std::vector<double> inverse(const std::vector<double>& v) {
  std::vector<double> out;
  for (double x : v) out.push_back(1.0 / x);
  return out;
}

/// compare_paired of `a` against `b`'s values of the same rounds (run::same_rounds).
PairedComparison paired(const std::vector<double>& a, const std::vector<int>& ra, const std::vector<double>& b,
                        const std::vector<int>& rb) {
  auto [x, y] = same_rounds(a, ra, b, rb);
  return compare_paired(x, y);
}

/// Rank 0: every partition against the reference, paired by round: output tokens/s, goodput,
/// 1 / TTFT p99 and 1 / TPOT p99 (> 1 favours the partition).
void compare_serving(ServingRunRecord& s, const std::string& reference) {
  const ServingPartitionRecord* ref = nullptr;
  for (const auto& p : s.partitions)
    if (p.name == reference) ref = &p;
  for (auto& p : s.partitions) {
    if (!ref || &p == ref) continue;
    const std::vector<int>&ra = ref->rep_round, &rb = p.rep_round;
    p.tokens_gain = paired(ref->rep_output_tokens_per_s, ra, p.rep_output_tokens_per_s, rb);
    p.goodput_gain = paired(ref->rep_goodput_req_per_s, ra, p.rep_goodput_req_per_s, rb);
    p.ttft_p99_gain = paired(inverse(ref->rep_ttft_p99_ms), ra, inverse(p.rep_ttft_p99_ms), rb);
    p.tpot_p99_gain = paired(inverse(ref->rep_tpot_p99_ms), ra, inverse(p.rep_tpot_p99_ms), rb);
  }
}

/// Rank 0: every partition's scenario in `s` predicted (balance::predict_serving: from the profile
/// before the rounds; after them also cross-calibrated by the other partitions' steps, and at the
/// level of each one's own steps); what
/// could not be predicted is said, not fatal. `s` is the record's, or a measurement of the rate
/// search's kept beside it (predicted on a copy of the record holding it).
void predict_partitions(RunContext& ctx, const PartitionSet& set, ServingRunRecord& s) {
  std::string why;
  if (&s == &ctx.record().serving) {
    why = balance::predict_serving(ctx.record(), ctx.predictor(), set.splits);
  } else {
    RunRecord copy = ctx.record();
    copy.serving = s;
    why = balance::predict_serving(copy, ctx.predictor(), set.splits);
    s = std::move(copy.serving);
  }
  if (!why.empty()) ctx.progress.say("serving prediction incomplete: " + why);
}

/// Counts the tokens of `got` that differ from `want` (both request after request).
int differing(const std::vector<int32_t>& want, const std::vector<int32_t>& got) {
  int n = 0;
  for (size_t i = 0; i < want.size(); ++i) n += (i >= got.size() || got[i] != want[i]) ? 1 : 0;
  return n;
}

/// Requests that arrive as a scenario of the rounds (run/rounds.h): a turn plays
/// ctx.scenario_requests live through the serving engine (its warm-up: one prefill and one decode
/// step of every group, replayed); a round's turns go to rank 0's `into` (stage 0's request times
/// and tokens, every stage's steps) and, for the record's own measurement, into the file; the
/// gains pair output tokens/s by round; the validation replays the last round's schedule
/// serialized and runs the first requests alone; the finish pools every round's requests.
class ServingRounds final : public RoundScenario {
 public:
  /// `into`: rank 0's record of this measurement (the record's serving, or one kept beside it;
  /// null elsewhere), its partitions named in set order; `validate`: whether it validates.
  /// `into` is the record's own (on rank 0) when `snapshot`: each round rewrites the file.
  ServingRounds(ServingRunRecord* into, bool validate, bool snapshot)
      : into_(into), validate_(validate), snapshot_(snapshot) {}

  void add_bench(size_t j) override { last_.resize(j + 1); }

  void play_turn(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j, bool warm_up) override {
    const ServingConfig sc = serving_config(ctx, p);
    const auto& reqs = ctx.scenario_requests;
    ctx.phase("scenario of partition " + p.solver, [&] {
      if (warm_up)
        (void)replay_serving(*ctx.device, *ctx.transport, *b.stage, b.place, sc, reqs, warmup_schedule(reqs, sc.scheduler.groups, sc.scheduler.slots));
      last_.at(j) = run_serving(*ctx.device, *ctx.transport, *b.stage, b.place, sc, reqs);
    });
  }

  void record_round(RunContext& ctx, const PartitionSet& /*set*/, std::vector<Bench>& benches, int rounds) override {
    for (size_t j = 0; j < benches.size(); ++j) {
      const Bench& b = benches[j];
      Stage0View v;
      ctx.phase("gather of the scenario", [&] {
        v = gather_stage0(ctx, last_[j], b.place.stage == 0 && b.place.tp_rank == 0);
        gather_steps(ctx, last_[j], b.place, ctx.root ? &into_->partitions[b.pi] : nullptr);
      });
      if (!ctx.root) continue;
      ServingPartitionRecord& pr = into_->partitions[b.pi];
      record_turn(ctx, pr, v, b.rounds.back());
      times_[b.pi].push_back(v.times);
      const double preempted = pr.rep_preemptions.empty() ? 0.0 : pr.rep_preemptions.back();
      ctx.progress.say(format_line("round %d, %-10s %d requests in %.1f s: %.1f output tokens/s, TTFT p99 %.0f ms, "
                                   "TPOT p99 %.1f ms%s", rounds, pr.name.c_str(), static_cast<int>(v.times.size()),
                                   pr.rep_duration_s.back(), pr.rep_output_tokens_per_s.back(), pr.rep_ttft_p99_ms.back(),
                                   pr.rep_tpot_p99_ms.back(),
                                   preempted > 0 ? format_line(", %.0f preemptions (KV pool)", preempted).c_str() : ""));
    }
    if (ctx.root) into_->rounds = rounds;
    if (snapshot_) ctx.phase("write after round " + std::to_string(rounds), [&] { ctx.snapshot("benchmark"); });
  }

  std::vector<std::string> figure_labels() const override { return {"output tokens/s"}; }
  std::vector<RoundFigure> figures(const RunContext&, size_t pi) const override {
    const ServingPartitionRecord& pr = into_->partitions.at(pi);
    return {{&pr.rep_output_tokens_per_s, &pr.rep_round}};
  }
  bool validates() const override { return validate_; }
  void validate(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j) override;
  void finish(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) override;

 private:
  ServingRunRecord* into_ = nullptr;
  bool validate_ = false, snapshot_ = false;
  std::vector<ServingRecord> last_;  ///< by bench index: its last turn (stage 0: the schedule its replay plays)
  std::map<size_t, std::vector<std::vector<serving::RequestTimes>>> times_;  ///< rank 0, by partition: every round's
};

void ServingRounds::validate(RunContext& ctx, const balance::Partition& p, Bench& b, size_t j) {
  const auto& reqs = ctx.scenario_requests;
  const int alone_n = std::min<int>(8, static_cast<int>(reqs.size()));
  std::vector<int> alone(alone_n);
  for (int i = 0; i < alone_n; ++i) alone[i] = i;
  const ServingConfig sc = serving_config(ctx, p);
  ServingRecord replay, solo;
  ctx.phase("validation of partition " + p.solver, [&] {
    replay = replay_serving(*ctx.device, *ctx.transport, *b.stage, b.place, sc, reqs, last_.at(j).schedule);
    solo = replay_serving(*ctx.device, *ctx.transport, *b.stage, b.place, sc, reqs, alone_schedule(reqs, alone));
  });
  Stage0View rv, sv;
  ctx.phase("gather of the validation", [&] {
    rv = gather_stage0(ctx, replay, b.place.stage == 0 && b.place.tp_rank == 0);
    sv = gather_stage0(ctx, solo, b.place.stage == 0 && b.place.tp_rank == 0);
  });
  if (!ctx.root) return;
  ServingPartitionRecord& pr = into_->partitions[b.pi];
  pr.validated = true;
  pr.replay_tokens_differing = differing(pr.tokens, rv.tokens);
  size_t n_alone_tokens = 0;
  for (int q = 0; q < alone_n; ++q) n_alone_tokens += static_cast<size_t>(reqs[q].gen_len);
  const std::vector<int32_t> want(pr.tokens.begin(), pr.tokens.begin() + n_alone_tokens);
  const std::vector<int32_t> got(sv.tokens.begin(), sv.tokens.begin() + n_alone_tokens);
  pr.alone_requests = alone_n;
  pr.alone_tokens_differing = differing(want, got);
  ctx.progress.say(format_line("validation of %s: %d of %zu tokens differ from the serialized replay; %d of the %zu "
                               "tokens of the first %d requests differ when each runs alone (batch invariance)",
                               pr.name.c_str(), pr.replay_tokens_differing, pr.tokens.size(), pr.alone_tokens_differing,
                               n_alone_tokens, alone_n));
}

void ServingRounds::finish(RunContext& ctx, const PartitionSet& set, const std::vector<Bench>& benches) {
  if (!ctx.root) return;
  for (const Bench& b : benches) pool_rounds(into_->partitions[b.pi], times_[b.pi], ctx.opt.scenario.spec->goodput);
  // A split equal to another one (balance::same_split_as) was measured once: its twin's record.
  const balance::SplitEquivalence& eq = ctx.cluster.equivalence;
  for (size_t pi = 0; pi < set.size(); ++pi) {
    if (set.measured_alone(pi, eq)) continue;
    const size_t of = static_cast<size_t>(balance::same_split_as(set.splits, pi, eq));
    ServingPartitionRecord twin = into_->partitions[of];
    twin.name = into_->partitions[pi].name;
    into_->partitions[pi] = std::move(twin);
    PartitionRecord& pr = ctx.record().partitions.at(pi);  // /partitions/<name>/same_as, as closed batches say it
    pr.same_as = ctx.record().partitions.at(of).name;
    pr.same_as_reason = balance::compare_splits(set.splits[of], set.splits[pi], eq) == balance::Sameness::identical
                            ? "identical" : "equivalent";
    ctx.progress.say("partition " + set.splits[pi].solver + ": the same split as " + set.splits[of].solver +
                     ", measured once");
  }
  compare_serving(*into_, set.reference);
}

/// The stop rule of a measurement: the run's (--iters, --target-ci, --max-time), or exactly one
/// round (the rate search's pilot).
StopRule stop_rule(const RunContext& ctx, bool one_round) {
  StopRule rule;
  rule.min_rounds = one_round ? 1 : ctx.opt.iters;
  rule.target_ci_pct = one_round ? 0 : ctx.opt.target_ci_pct;
  rule.max_time_s = ctx.opt.max_time_s;
  if (one_round) rule.max_rounds = 1;
  return rule;
}

/// Every partition of `set` at ctx.scenario_requests (the rate ctx.scenario_rate) in the rounds
/// of run_interleaved_rounds (one_round: exactly one, else the run's stop rule), validated when
/// `validate`, predicted before and after: on rank 0, `into` (the record's serving, or a
/// measurement kept beside it) holds the scenario and one fresh record per partition.
void measure_scenario(RunContext& ctx, PartitionSet& set, bool one_round, bool validate, ServingRunRecord* into) {
  if (ctx.root) {
    record_scenario(ctx, *into);
    into->partitions.clear();
    for (const balance::Partition& p : set.splits) {
      ServingPartitionRecord pr;
      pr.name = p.solver;
      pr.groups = partition_groups(ctx, p);
      pr.slots = ctx.opt.scenario.spec->slots;
      const serving::SchedulerConfig sched = serving_sim_config(ctx, p).scheduler;
      pr.step_policy = serving::step_policy_name(sched.policy);
      pr.pp_schedule = serving::pp_schedule_name(sched.pp_schedule);
      pr.kv_blocks = sched.kv_blocks;
      into->partitions.push_back(pr);
    }
    ctx.progress.say(format_line("scenario: %s; M=%d groups in flight", serving_scenario_text(*into).c_str(),
                                 ctx.workload.groups));
    predict_partitions(ctx, set, *into);
  }
  const bool own = !ctx.root || into == &ctx.record().serving;
  ServingRounds scenario(into, validate, ctx.mpi.agree(own ? 0 : 1) == 0);
  const RoundsOutcome out = run_interleaved_rounds(ctx, set, scenario, stop_rule(ctx, one_round));
  if (ctx.root) {
    into->stop_reason = one_round ? "the rate search's pilot: one round" : out.stop_reason;
    predict_partitions(ctx, set, *into);
  }
}

/// Collective: rank 0's `rate` on every rank, and the scenario's requests rescaled to it.
void set_rate(RunContext& ctx, double rate) {
  std::vector<double> r{rate};
  ctx.mpi.bcast_doubles(r);
  ctx.scenario_rate = r[0];
  ctx.scenario_requests = serving::scale_arrivals(ctx.opt.scenario.drawn.requests, r[0]);
}

/// --request-rate search's pilot (run/serving_search.h steps 2): one round of every partition at
/// the profile's predicted rate, the calibrated search, and the rate below R* set.
void rate_search_pilot(RunContext& ctx, PartitionSet& set) {
  set_rate(ctx, ctx.root ? ctx.record().serving.rate_search.pilot_rate : 0.0);
  if (ctx.root)
    ctx.progress.say(format_line("rate search: pilot round at %.3f requests/s (the profile's predicted highest rate, "
                                 "or N / --max-time if higher)", ctx.scenario_rate));
  measure_scenario(ctx, set, true, false, ctx.root ? &ctx.record().serving : nullptr);
  double below = 0.0;
  ctx.phase("rate search", [&] {
    if (!ctx.root) return;
    ServingRunRecord& s = ctx.record().serving;
    plan_rate_confirmation(ctx, set);
    s.rate_search.pilot = std::move(s.partitions);
    s.rate_search.pilot_rounds = s.rounds;
    s.partitions.clear();
    for (const RateSearchPartitionRecord& r : s.rate_search.partitions)
      ctx.progress.say(format_line("rate search: %-10s highest rate meeting the SLO %.3f requests/s from the profile "
                                   "(%.3f..%.3f at the step model's held-out error), %.3f calibrated by the pilot's steps",
                                   r.name.c_str(), r.profile_max_rate, r.profile_max_rate_low, r.profile_max_rate_high,
                                   r.calibrated_max_rate));
    below = s.rate_search.rate_below;
    ctx.progress.say(format_line("rate search: R* = %.3f requests/s (%s); measuring at 0.9 R* = %.3f and 1.1 R* = %.3f",
                                 s.rate_search.max_rate, s.rate_search.searched_partition.c_str(), below,
                                 s.rate_search.rate_above));
  });
  set_rate(ctx, below);
}

/// --request-rate search's rounds at 1.1 R* (step 4), measured beside the record's scenario (which
/// stays whole should they fail) and kept in rate_search.above; the verdict.
void rate_search_above(RunContext& ctx, PartitionSet& set) {
  const double rate = ctx.root ? ctx.record().serving.rate_search.rate_above : 0.0;
  set_rate(ctx, rate);
  ServingRunRecord above;
  measure_scenario(ctx, set, false, false, ctx.root ? &above : nullptr);
  if (!ctx.root) return;
  RateSearchRecord& rs = ctx.record().serving.rate_search;
  rs.above = std::move(above.partitions);
  rs.above_rounds = above.rounds;
  judge_rate_confirmation(ctx.record().serving);
  for (const RateSearchPartitionRecord& r : rs.partitions)
    ctx.progress.say(format_line("rate search: %-10s attainment at 0.9 R* %.3f (predicted %.3f), at 1.1 R* %.3f "
                                 "(predicted %.3f); target %.3f", r.name.c_str(), r.measured_attainment_below,
                                 r.predicted_attainment_below, r.measured_attainment_above, r.predicted_attainment_above,
                                 rs.attainment_target));
}

}  // namespace

void run_serving_benchmark(RunContext& ctx, PartitionSet& set) {
  const bool search = ctx.opt.scenario.spec->rate_search;
  if (search) rate_search_pilot(ctx, set);
  measure_scenario(ctx, set, false, true, ctx.root ? &ctx.record().serving : nullptr);
  if (search) rate_search_above(ctx, set);
}

int finish_serving_run(RunContext& ctx) {
  ctx.phase("write", [&] {
    if (!ctx.root) return;
    RunRecord& run = ctx.record();
    bool failed = false, validated = true;
    for (const ServingPartitionRecord& p : run.serving.partitions) {
      validated = validated && p.validated;
      failed = failed || (p.validated && p.replay_tokens_differing != 0);
    }
    write_complete(ctx, failed ? "failed" : validated ? "ok" : "skipped");
  });
  return ctx.mpi.agree(ctx.root && ctx.record().validation == "failed" ? 1 : 0);
}

}  // namespace ppb::run
