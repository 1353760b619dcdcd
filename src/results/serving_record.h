// What a serving scenario (issue 37: `ppbench run --scenario poisson|gamma|trace`) measured, as
// rank 0 holds it for the results file (results/serving_io.h writes and reads it; results/
// README.md, "/scenario" and "/benchmark/<name>/requests").
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/stats.h"
#include "serving/scenario.h"

namespace ppb {

/// One play of a scenario's requests by the serving simulator (a prediction, or an in-sample
/// replay): the figures it gives, as serving::ServingMetrics computes them; NaN where not made.
struct ServingPrediction {
  double output_tokens_per_s = std::numeric_limits<double>::quiet_NaN();
  double ttft_p50_ms = std::numeric_limits<double>::quiet_NaN(), ttft_p99_ms = std::numeric_limits<double>::quiet_NaN();
  double tpot_p50_ms = std::numeric_limits<double>::quiet_NaN(), tpot_p99_ms = std::numeric_limits<double>::quiet_NaN();
  double goodput_req_per_s = std::numeric_limits<double>::quiet_NaN();
  double slo_attainment = std::numeric_limits<double>::quiet_NaN();  ///< fraction in [0, 1]
  double preemptions = std::numeric_limits<double>::quiet_NaN();     ///< in one play of the requests
  /// Whether the play was made (its tokens/s finite).
  bool made() const { return std::isfinite(output_tokens_per_s); }
  /// fn(name, member) for every figure, in the file's order (the attribute name's suffix).
  template <class Self, class Fn>
  static void for_each(Self& p, Fn&& fn) {
    fn("output_tokens_per_s", p.output_tokens_per_s);
    fn("ttft_p50_ms", p.ttft_p50_ms), fn("ttft_p99_ms", p.ttft_p99_ms);
    fn("tpot_p50_ms", p.tpot_p50_ms), fn("tpot_p99_ms", p.tpot_p99_ms);
    fn("goodput_req_per_s", p.goodput_req_per_s), fn("slo_attainment", p.slo_attainment);
    fn("preemptions", p.preemptions);
  }
};

/// One partition's scenario: its requests in the last round, its rounds, its comparison with the
/// reference and its validation.
struct ServingPartitionRecord {
  std::string name;  ///< the partition (/partitions/<name>)
  int groups = 0, slots = 0;  ///< M groups in flight, B slots each
  std::string step_policy;    ///< the policy it ran (the scenario's, or a compared one); "" in older files
  std::string pp_schedule;    ///< the pipeline schedule it ran (groups, batch-queue); "" in older files
  /// Blocks of each group's KV pool it ran (--kv-blocks N, or what auto chose for this split from
  /// its stages' free memory; 0: every slot at the longest request); -1 in older files.
  int kv_blocks = -1;
  // ---- the last round, one entry per request [N], scenario clock (s from its start) ----
  std::vector<double> arrival_s, admitted_s, first_token_s, finish_s;
  std::vector<int> prompt_len, gen_len, group, slot;
  std::vector<int> preemptions;    ///< [N] times each request's KV blocks were taken back (--kv-blocks)
  std::vector<int> preempted_tokens;  ///< [N] the KV positions they discarded (computed again)
  std::vector<double> token_s;     ///< [sum of gen_len] each output token's time, request after request
  std::vector<int32_t> tokens;     ///< [sum of gen_len] the output token ids, same order
  int steps = 0;                   ///< steps the groups ran in the last round
  int stages = 0;                  ///< S: the partition's stages
  /// The last round's steps in the order stage 0 sent them [steps]: the group, the prefill rows'
  /// tokens, the decode rows and their mean position; and per step and stage [steps][S] its
  /// compute start (s from that stage's rank's start barrier) and duration (ms).
  std::vector<int> step_group, step_prefill_tokens, step_decode_rows;
  std::vector<double> step_decode_context, step_compute_start_s, step_compute_ms;
  /// [steps] the step's prefill rows and the KV-cache keys its rows attend (serving::StepShape's
  /// prefill_keys, decode_keys: each row at its own position); empty in older files, where a
  /// step's prefill counts as one prompt of its tokens from position 0.
  std::vector<int> step_prefill_rows;
  std::vector<double> step_prefill_keys, step_decode_keys;
  double step_rows_mean = 0.0;     ///< rows per step, mean over the last round's steps
  /// [S] per stage, the most KV-cache bytes resident in the last round (ServingRecord's samples;
  /// a demand-paged store under --kv-blocks: its pages; else the whole cache); empty in older files.
  std::vector<double> stage_kv_resident_peak_bytes;
  // ---- per round (one entry per round the partition took part in) ----
  std::vector<int> rep_round;
  std::vector<double> rep_duration_s, rep_output_tokens_per_s, rep_request_throughput, rep_goodput_req_per_s;
  std::vector<double> rep_ttft_p50_ms, rep_ttft_p99_ms, rep_tpot_p50_ms, rep_tpot_p99_ms, rep_slo_attainment;
  std::vector<double> rep_preemptions;  ///< preemptions in the round (all requests)
  // ---- pooled over every round's requests (latencies) and mean over rounds (rates) ----
  double output_tokens_per_s = 0, total_tokens_per_s = 0, request_throughput = 0;
  double ttft_mean_ms = 0, ttft_p50_ms = 0, ttft_p90_ms = 0, ttft_p99_ms = 0;
  double tpot_mean_ms = 0, tpot_p50_ms = 0, tpot_p90_ms = 0, tpot_p99_ms = 0;
  double itl_p50_ms = 0, itl_p99_ms = 0, e2e_p50_ms = 0, e2e_p99_ms = 0, queue_p50_ms = 0, queue_p99_ms = 0;
  /// vLLM's peaks (serving::ServingMetrics): output tokens in the busiest second, requests active
  /// in the busiest second; the highest round's.
  double peak_output_tokens_per_s = 0, peak_concurrency = 0;
  double goodput_req_per_s = std::numeric_limits<double>::quiet_NaN();
  double slo_attainment = std::numeric_limits<double>::quiet_NaN();
  // ---- against the reference partition, paired by round (n = 0: none) ----
  /// Gains > 1 favour this partition: tokens/s and goodput this / reference; the p99 latencies
  /// reference / this (compare_paired on 1 / latency).
  PairedComparison tokens_gain, goodput_gain, ttft_p99_gain, tpot_p99_gain;
  // ---- the serving simulator's plays of the same requests and scheduler (ServingPrediction) ----
  /// Predicted before the rounds from the profile (issue 38: serving/pipeline_sim.h with
  /// balance::ProfileStepCosts); file attributes simulated_*.
  ServingPrediction simulated;
  /// [S][2] the share f of each stage's compute overlapped by another stage of its machine in the
  /// prediction's play (with prefill rows, decode-only: the contention fixed point the simulator
  /// played `simulated` at, serving/pipeline_sim.h; 0 for a stage alone on its machine, 1 for one
  /// whose twin replica shares it, NaN for a kind the stage never computed); empty where the
  /// profile has one pass (every alone share 1) and in older files
  std::vector<double> simulated_overlap;
  /// Predicted after the rounds, the same way, from the profile calibrated per rank by the other
  /// partitions' measured steps (balance/serving_calibration.h); NaN where no other partition
  /// measured steps; file attributes simulated_cross_*. cross_calibrated_by: their names,
  /// comma-separated.
  ServingPrediction cross;
  std::string cross_calibrated_by;
  /// After the rounds, from the profile calibrated per rank by this partition's own measured steps
  /// (the last round's; balance::calibrate_own_steps): not a prediction but an in-sample check of
  /// the simulator at the level its rounds' steps ran; NaN without measured steps; file
  /// attributes simulated_self_*.
  ServingPrediction self;
  /// After the rounds, the profile with each step scaled by one of this partition's own measured
  /// steps' ratios in the order they ran (balance::ReplayedStepCosts): the simulator replaying the
  /// round's own step times; NaN without measured steps; file attributes simulated_replay_*.
  ServingPrediction replayed;
  /// [S][2] each stage's measured / modelled step compute over the last round's steps on its rank
  /// (with the step model's grid: their busy time, sum measured / sum modelled; without it: the
  /// median ratio of the band of at most 16 token rows, or the nearest band with steps):
  /// decode-only steps, steps with prefill rows; NaN for a kind without steps. Empty without
  /// measured steps.
  std::vector<double> step_level;
  /// fn(name, member) for every figure of the four plays, named as the file's attributes:
  /// simulated_*, simulated_cross_*, simulated_self_*, simulated_replay_* (ServingPrediction::for_each's suffixes).
  template <class Self, class Fn>
  static void for_each_prediction(Self& p, Fn&& fn) {
    for (auto [prefix, play] : {std::pair{"simulated_", &p.simulated}, std::pair{"simulated_cross_", &p.cross},
                                std::pair{"simulated_self_", &p.self}, std::pair{"simulated_replay_", &p.replayed}})
      ServingPrediction::for_each(*play, [&](const char* k, auto& v) { fn(std::string(prefix) + k, v); });
  }
  // ---- validation ----
  bool validated = false;          ///< the serialized replay ran (off with --no-validate)
  int replay_tokens_differing = -1;  ///< output tokens of the last round that the replay gave otherwise
  int alone_requests = 0;          ///< requests also run alone (batch of one)
  int alone_tokens_differing = -1; ///< their output tokens that differ from the last round's (batch invariance)
};

/// One partition in `run --request-rate search` (issue 38): its predicted highest rate and its
/// predicted curve over rates (the simulator calibrated by the pilot round's steps), and its
/// attainment measured at the rates below and above the searched maximum.
struct RateSearchPartitionRecord {
  std::string name;
  /// The highest rate meeting the SLO (requests/s) the simulator finds from the profile alone,
  /// and calibrated per rank by the pilot's steps (balance/serving_calibration.h, every
  /// partition's); NaN where no rate passes; outcome: found, none or unbounded (calibrated).
  double profile_max_rate = std::numeric_limits<double>::quiet_NaN();
  double calibrated_max_rate = std::numeric_limits<double>::quiet_NaN();
  /// The profile's highest rate with every step x (1 + e) (low) and x (1 - e) (high), e the step
  /// model's held-out error (serving::search_rate_band); NaN where no rate passes there or the
  /// profile timed no grid.
  double profile_max_rate_low = std::numeric_limits<double>::quiet_NaN();
  double profile_max_rate_high = std::numeric_limits<double>::quiet_NaN();
  std::string outcome;
  /// The calibrated simulator's prediction at each rate of the curve [K] (ascending; the rates
  /// below and above included).
  std::vector<double> curve_rate, curve_attainment, curve_goodput_req_per_s, curve_output_tokens_per_s;
  std::vector<double> curve_ttft_p50_ms, curve_ttft_p99_ms, curve_tpot_p50_ms, curve_tpot_p99_ms;
  /// At the rates below and above: predicted (calibrated) and measured (pooled over the rounds).
  double predicted_attainment_below = std::numeric_limits<double>::quiet_NaN();
  double predicted_attainment_above = std::numeric_limits<double>::quiet_NaN();
  double measured_attainment_below = std::numeric_limits<double>::quiet_NaN();
  double measured_attainment_above = std::numeric_limits<double>::quiet_NaN();
};

/// `run --request-rate search`: the search and its confirmation. on = false: a fixed rate.
struct RateSearchRecord {
  bool on = false;
  double attainment_target = 0.9;  ///< --attainment
  double slo_ttft_ms = std::numeric_limits<double>::quiet_NaN(), slo_tpot_ms = std::numeric_limits<double>::quiet_NaN();
  /// The pilot's rate, requests/s: the profile's predicted maximum for the uniform split, or the
  /// rate whose N arrivals span --max-time if that is higher.
  double pilot_rate = std::numeric_limits<double>::quiet_NaN();
  /// The partition with the highest calibrated maximum, that maximum R* and the rates measured
  /// around it (0.9 R*: the scenario of /benchmark; 1.1 R*: /rate_search/above).
  std::string searched_partition;
  double max_rate = std::numeric_limits<double>::quiet_NaN();
  double rate_below = std::numeric_limits<double>::quiet_NaN(), rate_above = std::numeric_limits<double>::quiet_NaN();
  /// 1: the searched partition's measured attainment is >= the target at rate_below and below it
  /// at rate_above; 0: not; -1: not measured.
  int confirmed = -1;
  std::vector<RateSearchPartitionRecord> partitions;
  /// Every partition's measurement at the pilot rate (one round) and at rate_above (rounds as
  /// the main measurement's), each laid out as /benchmark/<name>.
  std::vector<ServingPartitionRecord> pilot, above;
  int pilot_rounds = 0, above_rounds = 0;
};

/// The scenario of a run and every partition's measurement of it. spec empty: a closed-batch run.
struct ServingRunRecord {
  /// The scenario as parsed (serving/scenario.h; /scenario's attributes and its `spec` JSON).
  std::optional<serving::ScenarioSpec> spec;
  /// Requests/s of the arrivals measured: the spec's (with --request-rate search the rate of the
  /// measurement, 0.9 R*), a trace's N / last arrival.
  double request_rate = std::numeric_limits<double>::quiet_NaN();
  serving::TraceCounts trace;      ///< a trace as read: its format and counts
  std::vector<double> arrival_s;   ///< [N] the scenario's arrivals (s)
  std::vector<int> prompt_len, gen_len;  ///< [N]
  /// The balancer's objective for the scenario (run/plan.cpp scenario_objective): the
  /// mean decode rows per decode step at the offered load (simulated on the uniform split), and
  /// the workload objective's G that weighs prefill against decode as the scenario does.
  double objective_decode_rows = std::numeric_limits<double>::quiet_NaN();
  int objective_gen_len = 0;
  /// Steps of the simulated step mix whose step-model costs the balancer solved on (issue 47:
  /// balance::step_mix_costs; the units' costs then replace the G-weighted objective's); 0 where
  /// the profile had no grid (the G-weighted objective) and in older files.
  long long objective_steps = 0;
  std::vector<ServingPartitionRecord> partitions;
  int rounds = 0;
  std::string stop_reason;
  RateSearchRecord rate_search;  ///< --request-rate search
};

}  // namespace ppb
