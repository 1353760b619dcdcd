#include "results/serving_io.h"

#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "serving/scenario.h"

namespace ppb {

namespace {

using h5::Group;

void ds(Group& g, const char* name, const std::vector<double>& v, const char* units, const char* content) {
  auto d = g.write_dataset(name, v);
  d.set_attr("units", units);
  d.set_attr("content", content);
}

void write_gain(Group& g, const std::string& key, const PairedComparison& c) {
  g.set_attr(key, c.ratio);
  g.set_attr(key + "_ci_low", c.ci_low);
  g.set_attr(key + "_ci_high", c.ci_high);
  g.set_attr(key + "_n", static_cast<int64_t>(c.n));
}

PairedComparison read_gain(const Group& g, const std::string& key) {
  PairedComparison c;
  if (!g.has_attr(key)) return c;
  c.ratio = g.get_attr<double>(key);
  c.ci_low = g.get_attr<double>(key + "_ci_low");
  c.ci_high = g.get_attr<double>(key + "_ci_high");
  c.n = static_cast<int>(g.get_attr<int64_t>(key + "_n"));
  return c;
}

/// The scalar attributes of a partition's scenario, name -> member (one list for both ways).
template <class P, class Fn>
void for_each_scalar(P& p, Fn&& fn) {
  fn("output_tokens_per_s", p.output_tokens_per_s);
  fn("total_tokens_per_s", p.total_tokens_per_s);
  fn("request_throughput", p.request_throughput);
  fn("ttft_mean_ms", p.ttft_mean_ms), fn("ttft_p50_ms", p.ttft_p50_ms), fn("ttft_p90_ms", p.ttft_p90_ms), fn("ttft_p99_ms", p.ttft_p99_ms);
  fn("tpot_mean_ms", p.tpot_mean_ms), fn("tpot_p50_ms", p.tpot_p50_ms), fn("tpot_p90_ms", p.tpot_p90_ms), fn("tpot_p99_ms", p.tpot_p99_ms);
  fn("itl_p50_ms", p.itl_p50_ms), fn("itl_p99_ms", p.itl_p99_ms), fn("e2e_p50_ms", p.e2e_p50_ms), fn("e2e_p99_ms", p.e2e_p99_ms);
  fn("queue_p50_ms", p.queue_p50_ms), fn("queue_p99_ms", p.queue_p99_ms);
  fn("peak_output_tokens_per_s", p.peak_output_tokens_per_s), fn("peak_concurrency", p.peak_concurrency);
  fn("goodput_req_per_s", p.goodput_req_per_s), fn("slo_attainment", p.slo_attainment);
  fn("step_rows_mean", p.step_rows_mean);
  ServingPartitionRecord::for_each_prediction(p, [&](const std::string& k, auto& v) { fn(k.c_str(), v); });
}

/// The per-round datasets, name -> member.
template <class P, class Fn>
void for_each_round_series(P& p, Fn&& fn) {
  fn("rep_duration_s", p.rep_duration_s, "s");
  fn("rep_output_tokens_per_s", p.rep_output_tokens_per_s, "tokens/s");
  fn("rep_request_throughput", p.rep_request_throughput, "requests/s");
  fn("rep_goodput_req_per_s", p.rep_goodput_req_per_s, "requests/s");
  fn("rep_slo_attainment", p.rep_slo_attainment, "fraction");
  fn("rep_ttft_p50_ms", p.rep_ttft_p50_ms, "ms"), fn("rep_ttft_p99_ms", p.rep_ttft_p99_ms, "ms");
  fn("rep_tpot_p50_ms", p.rep_tpot_p50_ms, "ms"), fn("rep_tpot_p99_ms", p.rep_tpot_p99_ms, "ms");
  fn("rep_preemptions", p.rep_preemptions, "preemptions");
}

/// Partition p's scenario as the group parent/<name> (/benchmark/<name>, or the rate search's).
void write_partition(Group& parent, const ServingPartitionRecord& p) {
  Group b = parent.create_group(p.name);
  b.set_attr("scenario", "requests that arrive (/scenario); latencies pooled over every round's requests, rates "
                         "over the rounds' total time; requests/ holds the last round");
  b.set_attr("microbatches", static_cast<int64_t>(p.groups));
  b.set_attr("slots", static_cast<int64_t>(p.slots));
  b.set_attr("step_policy", p.step_policy);
  b.set_attr("pp_schedule", p.pp_schedule);
  b.set_attr("kv_blocks", static_cast<int64_t>(p.kv_blocks));
  b.set_attr("steps", static_cast<int64_t>(p.steps));
  for_each_scalar(p, [&](const char* k, double v) { b.set_attr(k, v); });
  write_gain(b, "tokens_gain", p.tokens_gain);
  write_gain(b, "goodput_gain", p.goodput_gain);
  write_gain(b, "ttft_p99_gain", p.ttft_p99_gain);
  write_gain(b, "tpot_p99_gain", p.tpot_p99_gain);
  b.set_attr("cross_calibrated_by", p.cross_calibrated_by);
  b.set_attr("validated", static_cast<int64_t>(p.validated));
  b.set_attr("replay_tokens_differing", static_cast<int64_t>(p.replay_tokens_differing));
  b.set_attr("alone_requests", static_cast<int64_t>(p.alone_requests));
  b.set_attr("alone_tokens_differing", static_cast<int64_t>(p.alone_tokens_differing));
  b.write_dataset("rep_round", p.rep_round).set_attr("content", "the round of each repetition (0-based)");
  for_each_round_series(p, [&](const char* k, const std::vector<double>& v, const char* u) { ds(b, k, v, u, "per round"); });
  if (p.stages > 0 && !p.step_group.empty()) {
    const hsize_t n = p.step_group.size(), S = static_cast<hsize_t>(p.stages);
    Group st = b.create_group("steps");
    st.set_attr("content", "the last round's steps in the order stage 0 sent them (every stage runs them in that order)");
    st.write_dataset("group", p.step_group);
    st.write_dataset("prefill_tokens", p.step_prefill_tokens).set_attr("content", "tokens of the rows prefilled in the step");
    st.write_dataset("decode_rows", p.step_decode_rows);
    ds(st, "decode_context", p.step_decode_context, "tokens", "the decode rows' mean position (0 without decode rows)");
    if (p.step_prefill_rows.size() == n && p.step_prefill_keys.size() == n && p.step_decode_keys.size() == n) {
      st.write_dataset("prefill_rows", p.step_prefill_rows).set_attr("content", "rows prefilled in the step (prompts, chunks, recomputes)");
      ds(st, "prefill_keys", p.step_prefill_keys, "keys", "KV-cache keys its rows of t > 1 tokens at position p attend: sum of t p + t (t + 1) / 2");
      ds(st, "decode_keys", p.step_decode_keys, "keys", "KV-cache keys its rows of one token at position p attend: sum of p + 1");
    }
    auto cs = st.write_dataset("compute_start_s", p.step_compute_start_s, {n, S});
    cs.set_attr("units", "s");
    cs.set_attr("content", "[step][stage] the step's compute start on that stage, from its rank's start barrier");
    auto cm = st.write_dataset("compute_ms", p.step_compute_ms, {n, S});
    cm.set_attr("units", "ms");
    cm.set_attr("content", "[step][stage] the step's compute on that stage");
  }
  if (!p.simulated_overlap.empty()) {
    auto ov = b.write_dataset("simulated_overlap", p.simulated_overlap, {p.simulated_overlap.size() / 2, 2});
    ov.set_attr("content", "[stage][steps with prefill rows, decode-only] the share of the stage's compute another stage "
                           "of its machine overlapped in the play simulated_* was predicted from (the contention fixed "
                           "point: each step at alone + (together - alone) x this share)");
  }
  if (!p.step_level.empty()) {
    auto lv = b.write_dataset("step_level", p.step_level, {p.step_level.size() / 2, 2});
    lv.set_attr("content", "[stage][decode-only steps, steps with prefill rows] the median of measured / modelled compute "
                           "over the last round's steps of each kind on the stage's rank (the level its rounds ran at "
                           "against the profile's model; NaN for a kind without steps; simulated_self_* replays the "
                           "scenario with the step model scaled so)");
  }
  if (!p.stage_kv_resident_peak_bytes.empty())
    ds(b, "stage_kv_resident_peak_bytes", p.stage_kv_resident_peak_bytes, "bytes",
       "[stage] the most KV cache resident in the last round (a demand-paged store under --kv-blocks: its pages, "
       "sampled every 8th step and at the end; else the whole cache)");
  Group r = b.create_group("requests");
  r.set_attr("content", "one row per request of the last round; times in s from the scenario's start (stage 0's clock)");
  ds(r, "arrival_s", p.arrival_s, "s", "arrived");
  ds(r, "admitted_s", p.admitted_s, "s", "got a slot: its prefill step was formed");
  ds(r, "first_token_s", p.first_token_s, "s", "its first output token was back on stage 0");
  ds(r, "finish_s", p.finish_s, "s", "its last output token was back on stage 0");
  r.write_dataset("prompt_len", p.prompt_len);
  r.write_dataset("gen_len", p.gen_len).set_attr("content", "output tokens, the prefill's first included");
  r.write_dataset("group", p.group).set_attr("content", "the group in flight it ran in");
  r.write_dataset("slot", p.slot).set_attr("content", "its KV-cache row in the group (the last it was admitted to)");
  r.write_dataset("preemptions", p.preemptions)
      .set_attr("content", "times its KV blocks were taken back and it was recomputed (--kv-blocks)");
  r.write_dataset("preempted_tokens", p.preempted_tokens)
      .set_attr("content", "the KV positions its preemptions discarded, computed again on readmission");
  std::vector<int64_t> offset{0};
  for (int g : p.gen_len) offset.push_back(offset.back() + g);
  r.write_dataset("token_offset", offset).set_attr("content", "request q's tokens are [token_offset[q], token_offset[q+1])");
  ds(r, "token_s", p.token_s, "s", "when each output token was back on stage 0");
  r.write_dataset("tokens", p.tokens).set_attr("content", "the output token ids (greedy)");
}

/// The group b (/benchmark/<name>, or the rate search's) as partition `name`'s record.
ServingPartitionRecord read_partition(const Group& b, const std::string& name) {
  ServingPartitionRecord p;
  p.name = name;
  p.groups = static_cast<int>(b.get_attr<int64_t>("microbatches"));
  p.slots = static_cast<int>(b.get_attr<int64_t>("slots"));
  p.step_policy = b.has_attr("step_policy") ? b.get_attr<std::string>("step_policy") : "";
  p.pp_schedule = b.has_attr("pp_schedule") ? b.get_attr<std::string>("pp_schedule") : "";
  p.kv_blocks = b.has_attr("kv_blocks") ? static_cast<int>(b.get_attr<int64_t>("kv_blocks")) : -1;
  p.steps = static_cast<int>(b.get_attr<int64_t>("steps"));
  // Attributes a file of an earlier build of the format may lack read as NaN.
  for_each_scalar(p, [&](const char* k, double& v) {
    v = b.has_attr(k) ? b.get_attr<double>(k) : std::numeric_limits<double>::quiet_NaN();
  });
  p.tokens_gain = read_gain(b, "tokens_gain");
  p.goodput_gain = read_gain(b, "goodput_gain");
  p.ttft_p99_gain = read_gain(b, "ttft_p99_gain");
  p.tpot_p99_gain = read_gain(b, "tpot_p99_gain");
  p.cross_calibrated_by = b.has_attr("cross_calibrated_by") ? b.get_attr<std::string>("cross_calibrated_by") : "";
  p.validated = b.get_attr<int64_t>("validated") != 0;
  p.replay_tokens_differing = static_cast<int>(b.get_attr<int64_t>("replay_tokens_differing"));
  p.alone_requests = static_cast<int>(b.get_attr<int64_t>("alone_requests"));
  p.alone_tokens_differing = static_cast<int>(b.get_attr<int64_t>("alone_tokens_differing"));
  p.rep_round = b.open_dataset("rep_round").read<int>();
  // A series a file of an earlier build lacks (rep_preemptions) reads as empty.
  for_each_round_series(p, [&](const char* k, std::vector<double>& v, const char*) {
    if (b.exists(k)) v = b.open_dataset(k).read<double>();
  });
  if (b.exists("steps")) {
    const Group st = b.open_group("steps");
    p.step_group = st.open_dataset("group").read<int>();
    p.step_prefill_tokens = st.open_dataset("prefill_tokens").read<int>();
    p.step_decode_rows = st.open_dataset("decode_rows").read<int>();
    p.step_decode_context = st.open_dataset("decode_context").read<double>();
    if (st.exists("prefill_keys")) {  // older files: none
      p.step_prefill_rows = st.open_dataset("prefill_rows").read<int>();
      p.step_prefill_keys = st.open_dataset("prefill_keys").read<double>();
      p.step_decode_keys = st.open_dataset("decode_keys").read<double>();
    }
    p.step_compute_start_s = st.open_dataset("compute_start_s").read<double>();
    const h5::Dataset cm = st.open_dataset("compute_ms");
    p.step_compute_ms = cm.read<double>();
    p.stages = static_cast<int>(cm.dims().at(1));
  }
  if (b.exists("stage_kv_resident_peak_bytes"))
    p.stage_kv_resident_peak_bytes = b.open_dataset("stage_kv_resident_peak_bytes").read<double>();
  if (b.exists("step_level")) p.step_level = b.open_dataset("step_level").read<double>();
  if (b.exists("simulated_overlap")) p.simulated_overlap = b.open_dataset("simulated_overlap").read<double>();
  const Group r = b.open_group("requests");
  p.arrival_s = r.open_dataset("arrival_s").read<double>();
  p.admitted_s = r.open_dataset("admitted_s").read<double>();
  p.first_token_s = r.open_dataset("first_token_s").read<double>();
  p.finish_s = r.open_dataset("finish_s").read<double>();
  p.prompt_len = r.open_dataset("prompt_len").read<int>();
  p.gen_len = r.open_dataset("gen_len").read<int>();
  p.group = r.open_dataset("group").read<int>();
  p.slot = r.open_dataset("slot").read<int>();
  if (r.exists("preemptions")) p.preemptions = r.open_dataset("preemptions").read<int>();
  if (r.exists("preempted_tokens")) p.preempted_tokens = r.open_dataset("preempted_tokens").read<int>();
  p.token_s = r.open_dataset("token_s").read<double>();
  p.tokens = r.open_dataset("tokens").read<int32_t>();
  return p;
}

/// The rate search's scalar attributes, name -> member (one list for both ways).
template <class R, class Fn>
void for_each_search_scalar(R& r, Fn&& fn) {
  fn("attainment_target", r.attainment_target);
  fn("slo_ttft_ms", r.slo_ttft_ms), fn("slo_tpot_ms", r.slo_tpot_ms);
  fn("pilot_rate", r.pilot_rate), fn("max_rate", r.max_rate);
  fn("rate_below", r.rate_below), fn("rate_above", r.rate_above);
}

template <class R, class Fn>
void for_each_search_partition_scalar(R& r, Fn&& fn) {
  fn("profile_max_rate", r.profile_max_rate), fn("calibrated_max_rate", r.calibrated_max_rate);
  fn("profile_max_rate_low", r.profile_max_rate_low), fn("profile_max_rate_high", r.profile_max_rate_high);
  fn("predicted_attainment_below", r.predicted_attainment_below);
  fn("predicted_attainment_above", r.predicted_attainment_above);
  fn("measured_attainment_below", r.measured_attainment_below);
  fn("measured_attainment_above", r.measured_attainment_above);
}

/// The curve's datasets, name -> member, units.
template <class R, class Fn>
void for_each_curve(R& r, Fn&& fn) {
  fn("rate", r.curve_rate, "requests/s");
  fn("attainment", r.curve_attainment, "fraction");
  fn("goodput_req_per_s", r.curve_goodput_req_per_s, "requests/s");
  fn("output_tokens_per_s", r.curve_output_tokens_per_s, "tokens/s");
  fn("ttft_p50_ms", r.curve_ttft_p50_ms, "ms"), fn("ttft_p99_ms", r.curve_ttft_p99_ms, "ms");
  fn("tpot_p50_ms", r.curve_tpot_p50_ms, "ms"), fn("tpot_p99_ms", r.curve_tpot_p99_ms, "ms");
}

void write_measured(Group& g, const char* name, const std::vector<ServingPartitionRecord>& parts, int rounds,
                    double rate, const char* content) {
  Group m = g.create_group(name);
  m.set_attr("content", content);
  m.set_attr("request_rate", rate);
  m.set_attr("rounds", static_cast<int64_t>(rounds));
  for (const ServingPartitionRecord& p : parts) write_partition(m, p);
}

void write_rate_search(Group& root, const RateSearchRecord& r) {
  Group g = root.create_group("rate_search");
  g.set_attr("content", "--request-rate search: the highest rate meeting the SLO, predicted (serving simulator from the "
                        "profile, then calibrated by the pilot round's steps) and measured at rate_below (the scenario of "
                        "/benchmark) and rate_above (above/)");
  for_each_search_scalar(r, [&](const char* k, double v) { g.set_attr(k, v); });
  g.set_attr("searched_partition", r.searched_partition);
  g.set_attr("confirmed", static_cast<int64_t>(r.confirmed));
  std::vector<std::string> names;
  for (const RateSearchPartitionRecord& p : r.partitions) names.push_back(p.name);
  g.set_attr("partitions", names);
  Group pred = g.create_group("predicted");
  pred.set_attr("content", "per partition: its highest rates (profile, calibrated) and the calibrated simulator's curve over "
                           "rates; the measured attainment at rate_below and rate_above");
  for (const RateSearchPartitionRecord& p : r.partitions) {
    Group q = pred.create_group(p.name);
    for_each_search_partition_scalar(p, [&](const char* k, double v) { q.set_attr(k, v); });
    q.set_attr("outcome", p.outcome);
    for_each_curve(p, [&](const char* k, const std::vector<double>& v, const char* u) {
      ds(q, k, v, u, "the calibrated simulator at each rate of the curve");
    });
  }
  write_measured(g, "pilot", r.pilot, r.pilot_rounds, r.pilot_rate, "every partition at pilot_rate, one round");
  write_measured(g, "above", r.above, r.above_rounds, r.rate_above, "every partition at rate_above, in rounds");
}

void read_rate_search(const Group& g, RateSearchRecord& r) {
  r.on = true;
  for_each_search_scalar(r, [&](const char* k, double& v) { v = g.get_attr<double>(k); });
  r.searched_partition = g.get_attr<std::string>("searched_partition");
  r.confirmed = static_cast<int>(g.get_attr<int64_t>("confirmed"));
  for (const std::string& name : g.get_attr<std::vector<std::string>>("partitions")) {
    const Group q = g.open_group("predicted/" + name);
    RateSearchPartitionRecord p;
    p.name = name;
    // (the band's ends are absent in older files: NaN)
    for_each_search_partition_scalar(p, [&](const char* k, double& v) {
      if (q.has_attr(k)) v = q.get_attr<double>(k);
    });
    p.outcome = q.get_attr<std::string>("outcome");
    for_each_curve(p, [&](const char* k, std::vector<double>& v, const char*) { v = q.open_dataset(k).read<double>(); });
    r.partitions.push_back(std::move(p));
    if (g.exists("pilot/" + name)) r.pilot.push_back(read_partition(g.open_group("pilot/" + name), name));
    if (g.exists("above/" + name)) r.above.push_back(read_partition(g.open_group("above/" + name), name));
  }
  r.pilot_rounds = static_cast<int>(g.open_group("pilot").get_attr<int64_t>("rounds"));
  r.above_rounds = static_cast<int>(g.open_group("above").get_attr<int64_t>("rounds"));
}

}  // namespace

void write_serving(Group& root, const RunRecord& run) {
  const ServingRunRecord& s = run.serving;
  if (!s.spec) return;
  Group g = root.create_group("scenario");
  // The spec whole (read back by read_serving), and each of its values as an attribute of its
  // own for h5py.
  const nlohmann::json spec = serving::scenario_to_json(*s.spec);
  g.set_attr("spec", spec.dump());
  for (const auto& [key, v] : spec.items()) {
    if (v.is_string()) g.set_attr(key, v.get<std::string>());
    else if (v.is_boolean()) g.set_attr(key, v.get<bool>());
    else if (v.is_number_integer()) g.set_attr(key, v.get<int64_t>());
    else if (v.is_number()) g.set_attr(key, v.get<double>());
  }
  g.set_attr("request_rate", s.request_rate);
  g.set_attr("trace_format", s.trace.format);
  if (!s.trace.format.empty()) {
    g.set_attr("trace_rows", static_cast<int64_t>(s.trace.rows));
    g.set_attr("trace_clamped_rows", static_cast<int64_t>(s.trace.clamped));
    g.set_attr("trace_dropped_rows", static_cast<int64_t>(s.trace.dropped));
    g.set_attr("trace_rows_outside_window", static_cast<int64_t>(s.trace.outside_window));
    g.set_attr("trace_prefix_blocks", static_cast<int64_t>(s.trace.prefix_blocks));
    g.set_attr("trace_reused_prefix_blocks", static_cast<int64_t>(s.trace.reused_prefix_blocks));
  }
  g.set_attr("objective_decode_rows", s.objective_decode_rows);
  g.set_attr("objective_gen_len", static_cast<int64_t>(s.objective_gen_len));
  g.set_attr("objective_steps", static_cast<int64_t>(s.objective_steps));
  g.set_attr("rounds", static_cast<int64_t>(s.rounds));
  g.set_attr("stop_reason", s.stop_reason);
  ds(g, "arrival_s", s.arrival_s, "s", "each request's arrival, from the scenario's start");
  g.write_dataset("prompt_len", s.prompt_len);
  g.write_dataset("gen_len", s.gen_len);
  std::vector<std::string> names;
  for (const auto& p : s.partitions) names.push_back(p.name);
  g.set_attr("partitions", names);
  for (const auto& p : s.partitions) {
    Group bench = root.require_group("benchmark");
    write_partition(bench, p);
  }
  if (s.rate_search.on) write_rate_search(root, s.rate_search);
}

namespace {

/// A file written before /scenario held its `spec` (issue 48): the spec from its attributes.
nlohmann::json legacy_spec(const Group& g) {
  nlohmann::json j;
  for (const char* key : {"kind", "prompt_lens", "gen_lens", "trace", "step_policy", "goodput"})
    j[key] = g.get_attr<std::string>(key);
  for (const char* key : {"requests", "seed", "max_prompt_len", "max_gen_len"}) j[key] = g.get_attr<int64_t>(key);
  for (const char* key : {"request_rate", "burstiness"}) j[key] = g.get_attr<double>(key);
  return j;
}

}  // namespace

void read_serving(const Group& root, RunRecord& run) {
  if (!root.exists("scenario")) return;
  const Group g = root.open_group("scenario");
  ServingRunRecord& s = run.serving;
  nlohmann::json spec;
  if (g.has_attr("spec")) {
    spec = nlohmann::json::parse(g.get_attr<std::string>("spec"), nullptr, /*allow_exceptions=*/false);
    if (spec.is_discarded()) throw UserError("/scenario's spec attribute is not JSON");
  } else {
    spec = legacy_spec(g);
  }
  s.spec = serving::scenario_from_json(spec, "/scenario");
  s.request_rate = g.get_attr<double>("request_rate");
  s.trace.format = g.get_attr<std::string>("trace_format");
  if (g.has_attr("trace_rows")) {
    s.trace.rows = static_cast<int>(g.get_attr<int64_t>("trace_rows"));
    s.trace.clamped = static_cast<int>(g.get_attr<int64_t>("trace_clamped_rows"));
    s.trace.dropped = static_cast<int>(g.get_attr<int64_t>("trace_dropped_rows"));
    s.trace.outside_window = static_cast<int>(g.get_attr<int64_t>("trace_rows_outside_window"));
    s.trace.prefix_blocks = g.get_attr<int64_t>("trace_prefix_blocks");
    s.trace.reused_prefix_blocks = g.get_attr<int64_t>("trace_reused_prefix_blocks");
  }
  if (g.has_attr("objective_gen_len")) {
    s.objective_decode_rows = g.get_attr<double>("objective_decode_rows");
    s.objective_gen_len = static_cast<int>(g.get_attr<int64_t>("objective_gen_len"));
  }
  if (g.has_attr("objective_steps")) s.objective_steps = g.get_attr<int64_t>("objective_steps");
  s.rounds = static_cast<int>(g.get_attr<int64_t>("rounds"));
  s.stop_reason = g.get_attr<std::string>("stop_reason");
  s.arrival_s = g.open_dataset("arrival_s").read<double>();
  s.prompt_len = g.open_dataset("prompt_len").read<int>();
  s.gen_len = g.open_dataset("gen_len").read<int>();
  for (const std::string& name : g.get_attr<std::vector<std::string>>("partitions"))
    s.partitions.push_back(read_partition(root.open_group("benchmark/" + name), name));
  if (!g.has_attr("spec") && !s.partitions.empty()) s.spec->slots = s.partitions.front().slots;  // not stored then
  if (root.exists("rate_search")) read_rate_search(root.open_group("rate_search"), s.rate_search);
}

}  // namespace ppb
