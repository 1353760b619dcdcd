#include "results/serving_summary.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/format.h"
#include "results/summary.h"
#include "results/step_model_io.h"

namespace ppb {

std::string serving_scenario_text(const ServingRunRecord& s) {
  if (!s.spec) return "";
  const serving::ScenarioSpec& spec = *s.spec;
  std::string out = serving::describe_scenario(spec);
  if (spec.kind == serving::ArrivalKind::trace) {
    const serving::TraceCounts& t = s.trace;
    out += format_line(" (%s: %zu requests of %d rows, %g req/s", t.format.c_str(), s.arrival_s.size(), t.rows,
                       s.request_rate);
    if (t.dropped > 0) out += format_line("; %d with 0 response tokens dropped", t.dropped);
    if (t.outside_window > 0) out += format_line("; %d outside the window", t.outside_window);
    if (t.clamped > 0) out += format_line("; %d clamped to -p/-g", t.clamped);
    if (t.prefix_blocks > 0)
      out += format_line("; %lld prompt blocks, %.1f%% of them an earlier request's (a prefix cache's reuse, not "
                         "modelled)", t.prefix_blocks, 100.0 * static_cast<double>(t.reused_prefix_blocks) /
                                                             static_cast<double>(t.prefix_blocks));
    out += ")";
  } else if (spec.rate_search) {
    out += format_line("; measured at %g req/s", s.request_rate);
  }
  return out;
}

namespace {

std::string gain_or_dash(const PairedComparison& c) {
  return c.n > 0 && std::isfinite(c.ratio) ? ratio_ci_text(c.ratio, c) : "-";
}

/// The partition column's width: 12, or the longest name (`run --step-policy A,B` appends the policy).
int name_width(const ServingRunRecord& s) {
  std::size_t w = 12;
  for (const ServingPartitionRecord& p : s.partitions) w = std::max(w, p.name.size());
  return static_cast<int>(w);
}

/// A figure (ms, or tokens/s) in 9 columns with the digits a small one needs: a tiny model's TPOT
/// of 0.042 ms printed as 0.042, not 0.0.
std::string cell9(double v) { return format_line("%9s", format_digits(v).c_str()); }

void print_latency_table(std::ostream& os, const ServingRunRecord& s) {
  const int w = name_width(s);
  os << format_line("  %-*s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", w, "partition", "out tok/s", "req/s", "TTFT p50",
                    "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p99", "ITL p99", "E2E p99", "queue p99");
  for (const ServingPartitionRecord& p : s.partitions)
    os << format_line("  %-*s %9.1f %9.3f", w, p.name.c_str(), p.output_tokens_per_s, p.request_throughput) + " " +
              cell9(p.ttft_p50_ms) + " " + cell9(p.ttft_p90_ms) + " " + cell9(p.ttft_p99_ms) + " " + cell9(p.tpot_p50_ms) + " " +
              cell9(p.tpot_p99_ms) + " " + cell9(p.itl_p99_ms) + " " + cell9(p.e2e_p99_ms) + " " + cell9(p.queue_p99_ms) + "\n";
  os << "  (latencies in ms, over every round's requests; rates over the rounds' total time)\n";
  os << "  peaks (vLLM's one-second buckets, the highest round's):";
  for (std::size_t i = 0; i < s.partitions.size(); ++i) {
    const ServingPartitionRecord& p = s.partitions[i];
    os << (i ? "; " : " ")
       << format_line("%s %.0f output tokens/s, %.0f requests in flight", p.name.c_str(), p.peak_output_tokens_per_s,
                      p.peak_concurrency);
  }
  os << "\n";
  if (!s.spec || s.spec->kv_blocks == 0) return;
  if (s.spec->kv_blocks == serving::kKvBlocksAuto) {
    os << format_line("  KV pool (auto, from each split's stages' free memory), blocks of %d tokens per group:", s.spec->kv_block_size);
    for (std::size_t i = 0; i < s.partitions.size(); ++i)
      os << (i ? "; " : " ") << s.partitions[i].name << " " << s.partitions[i].kv_blocks;
    os << "\n  preemptions per round (mean over the rounds; the simulator's in one play):";
  } else {
    os << format_line("  KV pool: %d blocks of %d tokens per group; preemptions per round (mean over the rounds; the simulator's in one play):",
                      s.spec->kv_blocks, s.spec->kv_block_size);
  }
  for (std::size_t i = 0; i < s.partitions.size(); ++i) {
    const ServingPartitionRecord& p = s.partitions[i];
    double sum = 0;
    for (double x : p.rep_preemptions) sum += x;
    const double mean = p.rep_preemptions.empty() ? 0.0 : sum / static_cast<double>(p.rep_preemptions.size());
    os << (i ? ";" : "") << format_line(" %s %.1f", p.name.c_str(), mean);
    if (std::isfinite(p.simulated.preemptions)) os << format_line(" (simulated %.0f)", p.simulated.preemptions);
  }
  os << "\n";
}

/// Under a KV pool: each stage's resident KV peak (a demand-paged store's pages), and in brackets
/// what the memory check counted for it (the pool and its page slack, or the whole store).
void print_kv_resident(std::ostream& os, const RunRecord& run) {
  const ServingRunRecord& s = run.serving;
  if (!s.spec || s.spec->kv_blocks == 0) return;
  bool any = false;
  for (const ServingPartitionRecord& p : s.partitions) any = any || !p.stage_kv_resident_peak_bytes.empty();
  if (!any) return;
  os << "  KV cache resident at most in the last round, per stage (MiB; a demand-paged store: its pages; [the memory "
        "check's count]):";
  bool first = true;
  for (const ServingPartitionRecord& p : s.partitions) {
    const PartitionRecord* counted = nullptr;
    for (const PartitionRecord& q : run.partitions)
      if (q.name == p.name) counted = &q;
    os << (first ? " " : "; ") << p.name;
    first = false;
    for (size_t k = 0; k < p.stage_kv_resident_peak_bytes.size(); ++k) {
      os << format_line("%s%.1f", k == 0 ? " " : " / ", p.stage_kv_resident_peak_bytes[k] / (1024.0 * 1024.0));
      if (counted != nullptr && k < counted->stage_kv_bytes.size())
        os << format_line(" [%.1f]", static_cast<double>(counted->stage_kv_bytes[k]) / (1024.0 * 1024.0));
    }
  }
  os << "\n";
}

std::string vs(double predicted, double measured) {
  if (!std::isfinite(predicted) || !std::isfinite(measured) || measured == 0) return format_line("%9s", "-");
  return cell9(predicted) + format_line(" (%+5.1f%%)", 100.0 * (predicted / measured - 1.0));
}

/// The serving simulator's prediction from the profile against the measurement (issue 38).
/// "; the step model's held-out steps within ..." where the profile timed its grid, else "".
std::string uncertainty_clause(const ProfileTable& t) {
  const std::string u = step_model_uncertainty(t);
  return u.empty() ? u : "; the step model's " + u;
}

/// The rounds' pooled measurement of `p` as the figures a play predicts (ServingPrediction's
/// fields: tokens/s, TTFT and TPOT p50/p99, goodput, attainment).
ServingPrediction pooled_figures(const ServingPartitionRecord& p) {
  ServingPrediction m;
  m.output_tokens_per_s = p.output_tokens_per_s;
  m.ttft_p50_ms = p.ttft_p50_ms, m.ttft_p99_ms = p.ttft_p99_ms;
  m.tpot_p50_ms = p.tpot_p50_ms, m.tpot_p99_ms = p.tpot_p99_ms;
  m.goodput_req_per_s = p.goodput_req_per_s, m.slo_attainment = p.slo_attainment;
  return m;
}

/// The last round's own measurement where the partition ran more than one (its rep_* entries),
/// else the rounds' pooled one: what a play at the last round's step level is compared with.
ServingPrediction last_round_figures(const ServingPartitionRecord& p) {
  ServingPrediction m = pooled_figures(p);
  const std::size_t n = p.rep_ttft_p50_ms.size();
  if (n < 2 || p.rep_output_tokens_per_s.size() != n || p.rep_ttft_p99_ms.size() != n || p.rep_tpot_p50_ms.size() != n ||
      p.rep_tpot_p99_ms.size() != n || p.rep_slo_attainment.size() != n)
    return m;
  m.output_tokens_per_s = p.rep_output_tokens_per_s.back();
  m.ttft_p50_ms = p.rep_ttft_p50_ms.back(), m.ttft_p99_ms = p.rep_ttft_p99_ms.back();
  m.tpot_p50_ms = p.rep_tpot_p50_ms.back(), m.tpot_p99_ms = p.rep_tpot_p99_ms.back();
  m.slo_attainment = p.rep_slo_attainment.back();
  return m;
}

/// One partition's row of a prediction table: its name (width w) and each figure of `play`
/// against the `measured` one (vs): output tokens/s, TTFT p50 and p99, TPOT p50 and p99.
std::string prediction_row(const std::string& name, int w, const ServingPrediction& measured, const ServingPrediction& play) {
  return "  " + format_line("%-*s", w, name.c_str()) + " " + vs(play.output_tokens_per_s, measured.output_tokens_per_s) +
         " " + vs(play.ttft_p50_ms, measured.ttft_p50_ms) + " " + vs(play.ttft_p99_ms, measured.ttft_p99_ms) + " " +
         vs(play.tpot_p50_ms, measured.tpot_p50_ms) + " " + vs(play.tpot_p99_ms, measured.tpot_p99_ms);
}

/// The decode and with-prefill columns of a per-stage [S][2] table, each "a/b/..." of `fmt`;
/// `decode_first`: the table's order (step_level's), else with prefill first (simulated_overlap's).
std::pair<std::string, std::string> stage_columns(const std::vector<double>& v, bool decode_first, const char* fmt) {
  std::string dec, pre;
  for (size_t k = 0; k + 1 < v.size(); k += 2) {
    const std::string sep = k == 0 ? "" : "/";
    dec += sep + format_line(fmt, v[decode_first ? k : k + 1]);
    pre += sep + format_line(fmt, v[decode_first ? k + 1 : k]);
  }
  return {dec, pre};
}

/// Each stage's step level (ServingPartitionRecord::step_level) as "stage 0/1: decode
/// x1.03/x1.09, with prefill x1.04/x1.04".
std::string step_level_text(const std::vector<double>& level) {
  std::string stages;
  for (size_t k = 0; k + 1 < level.size(); k += 2) stages += format_line("%s%zu", k == 0 ? "" : "/", k / 2);
  const auto [dec, pre] = stage_columns(level, true, "x%.2f");
  return "stage " + stages + ": decode " + dec + ", with prefill " + pre;
}

/// The prediction's contention overlap (ServingPartitionRecord::simulated_overlap) as
/// "overlapped: decode 0.73/0.67, with prefill 0.39/0.40"; "" without one.
std::string overlap_text(const std::vector<double>& f) {
  if (f.empty()) return "";
  const auto [dec, pre] = stage_columns(f, false, "%.2f");
  return "  overlapped: decode " + dec + ", with prefill " + pre;
}

/// The simulator again at the level each partition's own rounds ran (an in-sample check).
void print_self_calibrated(std::ostream& os, const ServingRunRecord& s, int w) {
  bool any = false;
  for (const ServingPartitionRecord& p : s.partitions) any = any || p.self.made();
  if (!any) return;
  os << "  in-sample, not a prediction: the simulator with each stage's step model scaled to the level of the last "
        "round's own steps (measured / model per kind, right), against that round's measurement"
     << (s.rounds > 1 ? " (not the rounds' pooled one above)" : "")
     << "; its error is the simulator's own, and the prediction's error less this one is the step level's share:\n";
  for (const ServingPartitionRecord& p : s.partitions)
    os << prediction_row(p.name, w, last_round_figures(p), p.self)
       << (p.step_level.empty() ? "" : "  " + step_level_text(p.step_level)) << "\n";
  bool replayed = false;
  for (const ServingPartitionRecord& p : s.partitions) replayed = replayed || p.replayed.made();
  if (!replayed) return;
  os << "  replayed, not a prediction: the same round's own steps, each step the simulator forms scaled by one measured "
        "step's measured / model in the order they ran (per stage and kind of step): against the in-sample row, what "
        "the steps' movement inside the round did; against the measurement, the simulator's own error:\n";
  for (const ServingPartitionRecord& p : s.partitions)
    if (p.replayed.made()) os << prediction_row(p.name, w, last_round_figures(p), p.replayed) << "\n";
}

void print_predictions(std::ostream& os, const ServingRunRecord& s, const ProfileTable& profile) {
  bool any = false, cross = false;
  for (const ServingPartitionRecord& p : s.partitions) any = any || p.simulated.made();
  for (const ServingPartitionRecord& p : s.partitions) cross = cross || p.cross.made();
  if (!any) return;
  bool overlap = false;
  for (const ServingPartitionRecord& p : s.partitions) overlap = overlap || !p.simulated_overlap.empty();
  os << "  predicted from the profile (the serving simulator, before the rounds; error vs measured"
     << uncertainty_clause(profile)
     << (overlap ? "; stages of one machine between their alone and together times by the share f of their compute the "
                   "other overlapped in the play, right"
                 : "")
     << "):\n";
  const int w = name_width(s);
  os << format_line("  %-*s %18s %18s %18s %18s %18s\n", w, "partition", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                    "TPOT p99");
  for (const ServingPartitionRecord& p : s.partitions)
    os << prediction_row(p.name, w, pooled_figures(p), p.simulated) << overlap_text(p.simulated_overlap) << "\n";
  print_self_calibrated(os, s, w);
  if (!cross) return;
  os << "  cross-calibrated (the profile scaled per rank" << (profile.step_rows.empty() ? " and token band" : " and kind of step, decode or with prefill")
     << " by the other partitions' measured steps):\n";
  for (const ServingPartitionRecord& p : s.partitions)
    os << prediction_row(p.name, w, pooled_figures(p), p.cross)
       << (p.cross_calibrated_by.empty() ? "" : "  by " + p.cross_calibrated_by) << "\n";
}

/// " (predicted from the profile x%; in-sample at the last round's step level y%, its steps
/// replayed z%, that round measured w%)": the plays' attainment beside a partition's measured
/// one, each clause where its play was made ("" without a prediction).
std::string attainment_plays(const ServingPartitionRecord& p) {
  if (!std::isfinite(p.simulated.slo_attainment)) return "";
  std::string out = format_line(" (predicted from the profile %.1f%%", 100.0 * p.simulated.slo_attainment);
  if (std::isfinite(p.self.slo_attainment)) {
    out += format_line("; in-sample at the last round's step level %.1f%%", 100.0 * p.self.slo_attainment);
    if (std::isfinite(p.replayed.slo_attainment))
      out += format_line(", its steps replayed %.1f%%", 100.0 * p.replayed.slo_attainment);
    if (p.rep_slo_attainment.size() > 1)
      out += format_line(", that round measured %.1f%%", 100.0 * p.rep_slo_attainment.back());
  }
  return out + ")";
}

/// --request-rate search: the predicted highest rates and the attainment measured around R*.
void print_rate_search(std::ostream& os, const RateSearchRecord& r) {
  os << format_line("  rate search (TTFT <= %g ms, TPOT <= %g ms for %.1f%% of the requests): pilot at %.3f req/s (the "
                    "profile's highest for the uniform split, or N / --max-time), R* = %.3f req/s (%s, calibrated by the pilot's steps)\n",
                    r.slo_ttft_ms, r.slo_tpot_ms, 100.0 * r.attainment_target, r.pilot_rate, r.max_rate,
                    r.searched_partition.c_str());
  os << format_line("  %-12s %14s %16s %14s %24s %24s\n", "partition", "max (profile)", "its band", "max (calib.)",
                    "attain. 0.9R* meas/pred", "attain. 1.1R* meas/pred");
  for (const RateSearchPartitionRecord& p : r.partitions)
    os << format_line("  %-12s %14.3f %7.3f..%-7.3f %14.3f %15.3f / %-6.3f %15.3f / %-6.3f\n", p.name.c_str(),
                      p.profile_max_rate, p.profile_max_rate_low, p.profile_max_rate_high, p.calibrated_max_rate,
                      p.measured_attainment_below, p.predicted_attainment_below, p.measured_attainment_above,
                      p.predicted_attainment_above);
  os << "  (its band: the profile's highest rate with every step slower .. faster by the step model's held-out "
        "error, p50; nan where none passes or the profile timed no grid)\n";
  os << "  (0.9 R* = " << format_fixed(r.rate_below, 3) << " req/s is the scenario above; 1.1 R* = "
     << format_fixed(r.rate_above, 3) << " req/s in /rate_search/above, " << r.above_rounds << " rounds)\n";
  os << "  rate search verdict: "
     << (r.confirmed == 1   ? "CONFIRMED: " + r.searched_partition + " meets the target at 0.9 R* and misses it at 1.1 R*"
         : r.confirmed == 0 ? "NOT confirmed: " + r.searched_partition + "'s measured attainment does not cross the target "
                              "between 0.9 R* and 1.1 R*"
                            : std::string("not measured"))
     << "\n";
}

}  // namespace

void print_serving_summary(std::ostream& os, const RunRecord& run) {
  const ServingRunRecord& s = run.serving;
  if (!s.spec) return;
  os << "\nserving scenario: " << serving_scenario_text(s) << "; " << s.rounds << (s.rounds == 1 ? " round" : " rounds")
     << ", stopped: " << s.stop_reason << "\n";
  print_latency_table(os, s);
  print_kv_resident(os, run);
  print_predictions(os, s, run.profile);
  if (s.rate_search.on) print_rate_search(os, s.rate_search);
  const std::string goodput = serving::goodput_text(s.spec->goodput);
  if (!goodput.empty()) {
    os << "  goodput (" << goodput << "):\n";
    for (const ServingPartitionRecord& p : s.partitions) {
      os << format_line("  %-12s %.3f req/s, attainment %.1f%%", p.name.c_str(), p.goodput_req_per_s, 100.0 * p.slo_attainment);
      os << attainment_plays(p) << "\n";
    }
  }
  bool header = false;
  for (const ServingPartitionRecord& p : s.partitions) {
    if (p.tokens_gain.n == 0) continue;
    if (!header) os << "  against " << run.reference_partition << " (paired by round, 95% CI; > 1 favours the partition):\n";
    header = true;
    os << "  " << p.name << ": output tokens/s " << gain_or_dash(p.tokens_gain) << ", TTFT p99 " << gain_or_dash(p.ttft_p99_gain)
       << ", TPOT p99 " << gain_or_dash(p.tpot_p99_gain);
    if (!goodput.empty()) os << ", goodput " << gain_or_dash(p.goodput_gain);
    os << "\n";
  }
  for (const ServingPartitionRecord& p : s.partitions) {
    if (!p.validated) {
      os << "  validation of " << p.name << ": skipped\n";
      continue;
    }
    os << format_line("  validation of %s: %d of %zu tokens differ from the serialized replay (%s); %d tokens of the "
                      "first %d requests differ when each runs alone (batch invariance)\n",
                      p.name.c_str(), p.replay_tokens_differing, p.tokens.size(),
                      p.replay_tokens_differing == 0 ? "ok" : "FAILED", p.alone_tokens_differing, p.alone_requests);
  }
}

}  // namespace ppb
