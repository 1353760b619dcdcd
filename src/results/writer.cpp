#include "results/writer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "common/error.h"
#include "results/conditions.h"
#include "results/h5.h"
#include "results/links_io.h"
#include "results/plan_io.h"
#include "results/serving_io.h"
#include "results/step_model_io.h"
#include "results/summary.h"

namespace ppb {

std::string hdf5_version() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel);
}

namespace {

using h5::Group;
using hs = hsize_t;

/// `<name>_ci_low`, `<name>_ci_high` (NaN without a CI), `<name>_n` and the verdict as
/// `<verdict name>` ("balance_gain" -> "balance_verdict"): a paired comparison's attributes.
void write_comparison(Group& g, const std::string& name, const PairedComparison& c, const std::string& verdict) {
  g.set_attr(name + "_ci_low", c.ci_low);
  g.set_attr(name + "_ci_high", c.ci_high);
  g.set_attr(name + "_n", static_cast<int64_t>(c.n));
  std::string vname = name;
  vname.replace(vname.find("gain"), 4, "verdict");
  g.set_attr(vname, verdict);
}

// ---- datasets that grow by rows, round by round -------------------------------------------
//
// A snapshot (write_results with complete=false) stores the datasets that gain rows with each
// benchmark round extendible (first axis unlimited, h5::Group::write_extendible), so that
// append_results can add a round's rows in place; the final file (complete=true) stores them
// as every other dataset (compressed when large). Each such dataset is described once, in the
// for_each_*_rows lists below, which both writers walk: an appended file has the datasets,
// shapes, element types and attributes a written one has.

/// Attribute setters of one dataset.
using SetAttrs = std::function<void(h5::Dataset&)>;

SetAttrs units(const char* u) {
  return [u](h5::Dataset& d) { d.set_attr("units", u); };
}

/// The datasets of /benchmark/<name> with one row per repetition (= per round the partition
/// took part in): fn(name, data, row dims, attribute setter), data a std::vector<double> or
/// std::vector<int>. The conditional ones are there when the record holds one value per
/// repetition, as write_benchmark has always stored them.
template <class Fn>
void for_each_benchmark_rows(const RunRecord& run, const PartitionRecord& p, Fn&& fn) {
  const auto& w = run.workload;
  const hs S = p.first_unit.size();
  fn("events", p.events, std::vector<hs>{static_cast<hs>(partition_groups(run, p)), static_cast<hs>(w.gen_len + 1), S, 6},
     SetAttrs([](h5::Dataset& ev) {
       ev.set_attr("units", "s");
       ev.set_attr("clock", "rank 0 CLOCK_MONOTONIC, seconds since the run started (ranks mapped by clock_offset_s)");
       ev.set_attr("dims", std::vector<std::string>{"iter", "group", "step", "stage", "event"});
       ev.set_attr("columns", std::vector<std::string>{"recv_start", "recv_end", "compute_start", "compute_end",
                                                       "send_start", "send_end"});
       ev.set_attr("missing", "NaN: no such operation (stage 0 does not receive the prompt; no send after the last step)");
     }));
  if (p.replicas > 1)
    fn("replica_events", p.replica_events,
       std::vector<hs>{static_cast<hs>(p.replicas), static_cast<hs>(partition_groups(run, p)), static_cast<hs>(w.gen_len + 1), S, 6},
       SetAttrs([](h5::Dataset& ev) {
         ev.set_attr("units", "s");
         ev.set_attr("dims", std::vector<std::string>{"iter", "replica", "group", "step", "stage", "event"});
         ev.set_attr("content", "every replica's events as `events` holds replica 0's (replica r's stage k on rank "
                                "r x ranks per replica + device_rank[k]); the rates and latencies are over all of them");
       }));
  fn("rep_wall_s", p.rep_wall_s, std::vector<hs>{}, units("s"));
  fn("rep_tokens_per_s", p.rep_tokens_per_s, std::vector<hs>{}, units("tokens/s"));
  if (p.rep_decode_tokens_per_s.size() == p.rep_tokens_per_s.size()) {
    fn("rep_decode_tokens_per_s", p.rep_decode_tokens_per_s, std::vector<hs>{}, units("tokens/s"));
    fn("rep_ttft_p50_ms", p.rep_ttft_p50_ms, std::vector<hs>{}, units("ms"));
    fn("rep_tpot_p50_ms", p.rep_tpot_p50_ms, std::vector<hs>{}, units("ms"));
  }
  if (p.rep_round.size() == p.rep_tokens_per_s.size())
    fn("rep_round", p.rep_round, std::vector<hs>{}, SetAttrs([](h5::Dataset& d) {
         d.set_attr("content", "the benchmark round of each repetition (0-based)");
       }));
}

/// The datasets of /profile with one row per profile cycle between rounds (--round-profile),
/// when the record has such cycles: latency_rounds_ms [K, R, U, 2], latency_rounds_after [K].
template <class Fn>
void for_each_profile_rows(const RunRecord& run, Fn&& fn) {
  const auto& p = run.profile;
  const hs R = run.ranks.size(), U = p.unit_name.size();
  if (p.latency_rounds_ms.empty() || R * U == 0 || p.latency_rounds_ms.size() % (R * U * 2) != 0 ||
      p.latency_rounds_after.size() != p.latency_rounds_ms.size() / (R * U * 2))
    return;
  fn("latency_rounds_ms", p.latency_rounds_ms, std::vector<hs>{R, U, 2}, SetAttrs([](h5::Dataset& c) {
       c.set_attr("units", "ms");
       c.set_attr("dims", std::vector<std::string>{"cycle", "rank", "unit", "phase"});
       c.set_attr("content", "profile cycles taken between the benchmark's rounds (--round-profile), every rank timing "
                             "each unit at the same moment (as latency_ms); each cycle's medians");
     }));
  fn("latency_rounds_after", p.latency_rounds_after, std::vector<hs>{}, SetAttrs([](h5::Dataset& d) {
       d.set_attr("content", "the benchmark rounds done before each cycle of latency_rounds_ms");
     }));
}

/// /rounds: one row per finished benchmark round, when the record has any.
template <class Fn>
void for_each_round_rows(const RunRecord& run, Fn&& fn) {
  if (run.round_gap_s.empty()) return;
  fn("gap_s", run.round_gap_s, std::vector<hs>{}, SetAttrs([](h5::Dataset& d) {
       d.set_attr("units", "s");
       d.set_attr("content", "seconds rank 0 spent after each round's last turn before the next round's first turn "
                             "(after the last round: before the rounds ended): gathering the round, the results "
                             "file, the verdict, and the profile cycle between rounds where one was taken");
     }));
}

/// write_results' writer for a for_each_*_rows list: every row at once, into an extendible
/// dataset in a snapshot (`extendible`), an ordinary one in the final file.
struct WriteRows {
  Group& g;
  bool extendible;
  template <h5::DatasetElement T>
  void operator()(const std::string& name, const std::vector<T>& data, const std::vector<hs>& row,
                  const SetAttrs& attrs) const {
    hs row_size = 1;
    for (hs d : row) row_size *= d;
    std::vector<hs> dims{row_size == 0 ? 0 : data.size() / row_size};
    dims.insert(dims.end(), row.begin(), row.end());
    h5::Dataset ds = extendible ? g.write_extendible(name, data, dims) : g.write_dataset(name, data, dims);
    attrs(ds);
  }
};

/// append_results' writer for a for_each_*_rows list: extends each dataset of `g` from the
/// rows the file holds to the rows of the record, writing the new rows alone, or creates it
/// (extendible, every row, its attributes) where the file has none. Reads nothing of a
/// dataset but its shape. `wrote` is set when anything was written.
struct AppendRows {
  Group& g;
  const std::string& path;
  bool& wrote;
  template <h5::DatasetElement T>
  void operator()(const std::string& name, const std::vector<T>& data, const std::vector<hs>& row,
                  const SetAttrs& attrs) const {
    hs row_size = 1;
    for (hs d : row) row_size *= d;
    const std::string where = "'" + path + "' " + g.path() + "/" + name;
    if (row_size == 0 || data.size() % row_size != 0)
      throw InternalError("append_results: " + where + ": the record holds " + std::to_string(data.size()) +
                          " values, not whole rows of " + std::to_string(row_size));
    const hs rows = data.size() / row_size;
    if (!g.exists(name)) {
      std::vector<hs> dims{rows};
      dims.insert(dims.end(), row.begin(), row.end());
      h5::Dataset ds = g.write_extendible(name, data, dims);
      attrs(ds);
      wrote = true;
      return;
    }
    h5::Dataset ds = g.open_dataset(name);
    const std::vector<hs> dims = ds.dims();
    if (dims.empty() || !std::equal(dims.begin() + 1, dims.end(), row.begin(), row.end()))
      throw InternalError("append_results: " + where + " has rows of another shape than the record's: not this "
                          "run's file, or the record changed shape");
    if (dims[0] > rows)
      throw InternalError("append_results: " + where + " holds " + std::to_string(dims[0]) +
                          " rows, the record only " + std::to_string(rows) +
                          ": not this run's file, or the record lost rows");
    if (dims[0] == rows) return;
    if (!ds.extendible())
      throw InternalError("append_results: " + where + " cannot grow: the file was written complete (final) or "
                          "by a ppbench before append_results, not as a snapshot of this run");
    ds.append(data.data() + dims[0] * row_size, (rows - dims[0]) * row_size);
    wrote = true;
  }
};

/// /partitions/<name>'s cross-calibrated predictions (issue 13): predicted_stage_cross_ms,
/// predicted_phase_cross_ms, the factors (cross_level, cross_contention, cross_fit) and
/// predicted_overlap_cross; nothing where the partition has none.
void write_cross_calibration(Group& part, const PartitionRecord& p) {
  const hs S = p.first_unit.size();
  if (p.predicted_stage_cross_ms.size() != S || p.predicted_phase_cross_ms.size() != 2 * S) return;
  const std::string what = "cross-calibrated: each stage's alone time cross_level x the profile's alone sum, its "
                           "together time (cross_level + cross_contention) x that sum (where cross_fit is 1: "
                           "cross_level x the profile's together sum, at least the alone one), per phase with its "
                           "rank's factors fitted on the other partitions' compute steps on that rank, measured in "
                           "the same rounds (never this partition's own measurement), through the contention model";
  auto sc = part.write_dataset("predicted_stage_cross_ms", p.predicted_stage_cross_ms);
  sc.set_attr("units", "ms");
  sc.set_attr("content", "predicted_stage_ms " + what);
  sc.set_attr("calibrated_by", p.cross_calibrated_by);
  auto pc = part.write_dataset("predicted_phase_cross_ms", p.predicted_phase_cross_ms, {S, 2});
  pc.set_attr("units", "ms");
  pc.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
  pc.set_attr("content", "predicted_phase_ms " + what);
  pc.set_attr("calibrated_by", p.cross_calibrated_by);
  const hs R = p.cross_level.size() / 2;
  if (R > 0 && p.cross_contention.size() == 2 * R && p.cross_fit.size() == 2 * R) {
    auto lv = part.write_dataset("cross_level", p.cross_level, {R, 2});
    lv.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    lv.set_attr("content", "per rank and phase: measured step = alone * (level + contention * share overlapped), "
                           "alone the profile's alone sum of the step's stage, least squares over the other "
                           "partitions' steps");
    auto ct = part.write_dataset("cross_contention", p.cross_contention, {R, 2});
    ct.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    ct.set_attr("content", "per rank and phase: the contention factor (see cross_level); NaN where cross_fit is 1 "
                           "(the profile's together - alone excess, clamped at 0, scaled by cross_level instead)");
    auto ft = part.write_dataset("cross_fit", p.cross_fit, {R, 2});
    ft.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    ft.set_attr("content", "2: level and contention fitted; 1: the level alone, on the profile's alone and together "
                           "times alike (the steps' overlap did not vary enough, or the fit was unphysical); 0: no "
                           "steps on that rank");
  }
  if (p.predicted_overlap_cross.size() == 2 * S) {
    auto po = part.write_dataset("predicted_overlap_cross", p.predicted_overlap_cross, {S, 2});
    po.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    po.set_attr("content", "the contention model's share of each stage's steps overlapped by another stage of its "
                           "machine, in the cross-calibrated prediction (vs /benchmark/<name>/stage_overlap)");
  }
}

/// /partitions/<name>'s predictions: from the profile (median, fastest, slowest forwards), from
/// the profile between rounds, cross-calibrated, and per phase.
void write_predictions(Group& part, const RunRecord& run, const PartitionRecord& p) {
  const hs S = p.first_unit.size();
  auto pred = part.write_dataset("predicted_stage_ms", p.predicted_stage_ms);
  pred.set_attr("units", "ms");
  pred.set_attr("solver", p.solver);
  pred.set_attr("objective", run.workload.objective);
  pred.set_attr("bottleneck_ms", p.predicted_bottleneck_ms);
  if (p.predicted_stage_min_ms.size() == S && p.predicted_stage_max_ms.size() == S) {
    auto lo = part.write_dataset("predicted_stage_min_ms", p.predicted_stage_min_ms);
    lo.set_attr("units", "ms");
    lo.set_attr("content", "predicted_stage_ms from each unit's fastest timed forward (/profile/latency_min_ms)");
    auto hi = part.write_dataset("predicted_stage_max_ms", p.predicted_stage_max_ms);
    hi.set_attr("units", "ms");
    hi.set_attr("content", "predicted_stage_ms from each unit's slowest timed forward (/profile/latency_max_ms)");
  }
  if (p.predicted_stage_rounds_ms.size() == S && p.predicted_phase_rounds_ms.size() == 2 * S) {
    const char* what = "from the profile as the benchmark's rounds saw the units (/profile/latency_rounds_ms; "
                       "the alone times scaled by each unit's rounds / together ratio)";
    auto sr = part.write_dataset("predicted_stage_rounds_ms", p.predicted_stage_rounds_ms);
    sr.set_attr("units", "ms");
    sr.set_attr("content", std::string("predicted_stage_ms ") + what);
    auto pr = part.write_dataset("predicted_phase_rounds_ms", p.predicted_phase_rounds_ms, {S, 2});
    pr.set_attr("units", "ms");
    pr.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    pr.set_attr("content", std::string("predicted_phase_ms ") + what);
  }
  write_cross_calibration(part, p);
  auto phase = part.write_dataset("predicted_phase_ms", p.predicted_phase_ms, {S, 2});
  phase.set_attr("units", "ms");
  phase.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
}

/// /benchmark/<name>: what the pipelined run of a measured partition measured, its errors against
/// the predictions and its gains against uniform.
// What append_results says on a /benchmark/<name> group whose rows it appended.
constexpr const char* kAppendedNote =
    "rows appended after each round (events and the rep_* datasets: one row per repetition so far); the summary "
    "attributes and datasets (tokens_per_s, stage_compute_ms, ...) are written at the end of the run, and where "
    "present here describe the first summary_repetitions repetitions only";

void write_benchmark(Group& root, const RunRecord& run, const PartitionRecord& p, bool extendible) {
  const hs S = p.first_unit.size();
  Group bench = root.require_group("benchmark").create_group(p.name);
  for_each_benchmark_rows(run, p, WriteRows{bench, extendible});  // events, rep_*
  if (p.stage_compute_ms.size() != 2 * S) {
    // During the rounds (a snapshot, or a failure recorded then): the rows of the finished
    // rounds, the summary over all of them comes at the end.
    bench.set_attr("summary_repetitions", int64_t{0});
    bench.set_attr("snapshot", kAppendedNote);
    return;
  }
  auto sc = bench.write_dataset("stage_compute_ms", p.stage_compute_ms, {S, 2});
  sc.set_attr("units", "ms");
  sc.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
  sc.set_attr("stat", "median");
  if (p.stage_compute_mean_ms.size() == 2 * S) {
    auto sm = bench.write_dataset("stage_compute_mean_ms", p.stage_compute_mean_ms, {S, 2});
    sm.set_attr("units", "ms");
    sm.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    sm.set_attr("stat", "mean");
  }
  if (p.stage_overlap.size() == 2 * S) {
    auto so = bench.write_dataset("stage_overlap", p.stage_overlap, {S, 2});
    so.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    so.set_attr("content", "the share of each stage's compute time during which another stage of its machine "
                           "computed, from events");
  }
  bench.write_dataset("stage_workload_ms", p.stage_workload_ms).set_attr("units", "ms");
  if (p.measured_stage_ms.size() == S) {
    auto ms = bench.write_dataset("measured_stage_ms", p.measured_stage_ms);
    ms.set_attr("units", "ms");
    ms.set_attr("objective", run.workload.objective);
  }
  bench.write_dataset("prediction_error", [&] {
    std::vector<double> e;
    const auto& meas = p.measured_stage_ms.size() == S ? p.measured_stage_ms : p.stage_workload_ms;
    for (hs k = 0; k < S; ++k) e.push_back(meas[k] / p.predicted_stage_ms[k] - 1.0);
    return e;
  }()).set_attr("units", "1");
  if (p.predicted_stage_rounds_ms.size() == S && p.measured_stage_ms.size() == S) {
    std::vector<double> e;
    for (hs k = 0; k < S; ++k) e.push_back(p.measured_stage_ms[k] / p.predicted_stage_rounds_ms[k] - 1.0);
    bench.write_dataset("prediction_error_rounds", e)
        .set_attr("content", "measured_stage_ms / /partitions/<name>/predicted_stage_rounds_ms - 1");
  }
  if (p.measured_stage_mean_ms.size() == S) {
    auto mm = bench.write_dataset("measured_stage_mean_ms", p.measured_stage_mean_ms);
    mm.set_attr("units", "ms");
    mm.set_attr("objective", run.workload.objective);
    mm.set_attr("content", "measured_stage_ms from the mean steps (stage_compute_mean_ms)");
  }
  if (p.predicted_stage_cross_ms.size() == S && p.measured_stage_mean_ms.size() == S) {
    std::vector<double> e;
    for (hs k = 0; k < S; ++k) e.push_back(p.measured_stage_mean_ms[k] / p.predicted_stage_cross_ms[k] - 1.0);
    auto pe = bench.write_dataset("prediction_error_cross", e);
    pe.set_attr("content", "measured_stage_mean_ms / /partitions/<name>/predicted_stage_cross_ms - 1");
    pe.set_attr("calibrated_by", p.cross_calibrated_by);
  }
  if (p.predicted_stage_min_ms.size() == S && p.measured_stage_ms.size() == S) {
    std::vector<int> outside;
    for (hs k = 0; k < S; ++k) outside.push_back(outside_profile_spread(p, k) ? 1 : 0);
    bench.write_dataset("outside_profile_spread", outside)
        .set_attr("content", "1 where measured_stage_ms lies outside [predicted_stage_min_ms, predicted_stage_max_ms]");
  }
  bench.write_dataset("bubble_fraction", p.bubble_fraction).set_attr("units", "1");
  bench.write_dataset("recv_wait_ms", p.recv_wait_ms).set_attr("units", "ms");
  bench.set_attr("repetitions", static_cast<int64_t>(p.rep_tokens_per_s.size()));
  bench.set_attr("rates_over_repetitions", "harmonic mean (total tokens / total time)");
  auto lane = bench.write_dataset("lane_cpu_s", p.lane_cpu_s, {S, 3});
  lane.set_attr("units", "s");
  lane.set_attr("columns", std::vector<std::string>{"compute", "recv", "send"});
  lane.set_attr("note", "CPU time of each lane's thread over the timed repetitions; compare with timed_wall_s");
  bench.set_attr("timed_wall_s", p.timed_wall_s);
  bench.set_attr("bottleneck_stage", static_cast<int64_t>(p.bottleneck_stage));
  for (const auto& [k, v] : p.metrics) bench.set_attr(k, v);
  auto it = run.partitions.begin();
  for (; it != run.partitions.end() && it->name != run.reference_partition; ++it) {
  }
  if (it != run.partitions.end() && it->measured && it->metrics.count("tokens_per_s") && p.name != run.reference_partition) {
    bench.set_attr("balance_gain", p.metrics.at("tokens_per_s") / it->metrics.at("tokens_per_s"));
    bench.set_attr("decode_balance_gain", p.metrics.at("decode_tokens_per_s") / it->metrics.at("decode_tokens_per_s"));
    write_comparison(bench, "balance_gain", p.gain, p.gain_verdict);
    write_comparison(bench, "decode_balance_gain", p.decode_gain, p.decode_gain_verdict);
  }
}

/// /validation/<name>: the pipelined run's tokens and checksum against the serialized run's.
void write_validation(Group& root, const RunRecord& run, const PartitionRecord& p) {
  const auto& w = run.workload;
  Group val = root.require_group("validation").create_group(p.name);
  val.set_attr("validated", p.validated);
  val.set_attr("tokens_match", p.tokens_match);
  val.set_attr("checksum_match", p.checksum_match);
  val.set_attr("tokens_match_first_partition", p.tokens_match_first_partition);
  val.set_attr("tokens_differing_first_partition", static_cast<int64_t>(p.tokens_differing_first_partition));
  val.set_attr("checksum_rel_diff_first_partition", p.checksum_rel_diff_first_partition);
  if (p.replicas > 1) val.set_attr("replica_tokens_differing", static_cast<int64_t>(p.replica_tokens_differing));
  val.set_attr("checksum", p.checksum);
  val.set_attr("reference_checksum", p.reference_checksum);
  val.set_attr("reference", "serialized run: one lane per stage, a barrier after every item");
  std::vector<hs> tdims{static_cast<hs>(partition_groups(run, p)), static_cast<hs>(w.gen_len + 1), static_cast<hs>(w.batch)};
  if (p.tokens.size() == tdims[0] * tdims[1] * tdims[2]) val.write_dataset("tokens", p.tokens, tdims);
  if (p.reference_tokens.size() == tdims[0] * tdims[1] * tdims[2])
    val.write_dataset("reference_tokens", p.reference_tokens, tdims);
}

/// /validation/<name> of a partition whose rounds append_results is appending: validated,
/// tokens_match and checksum_match 0 (the serialized runs come after the rounds), as
/// write_validation stores them for a partition not validated yet, without the tokens (the
/// last repetition's, which change every round) and the checksums.
void write_pending_validation(Group& root, const PartitionRecord& p) {
  Group val = root.require_group("validation").create_group(p.name);
  val.set_attr("validated", false);
  val.set_attr("tokens_match", false);
  val.set_attr("checksum_match", false);
  val.set_attr("reference", "serialized run: one lane per stage, a barrier after every item");
  val.set_attr("snapshot", "the partition's rounds are running: it is validated after them, when the whole file is "
                           "written");
}

/// /partitions/<name>: the split and its predictions.
void write_split(Group& root, const RunRecord& run, const PartitionRecord& p) {
  const hs S = p.first_unit.size();
  Group part = root.require_group("partitions").create_group(p.name);
  part.set_attr("solver", p.solver);
  part.set_attr("same_as", p.same_as);
  if (!p.same_as_reason.empty()) part.set_attr("same_as_reason", p.same_as_reason);
  if (!p.solver_split.empty()) part.set_attr("solver_split", p.solver_split);
  if (!p.calibration_factor.empty()) {
    auto cf = part.write_dataset("calibration_factor", p.calibration_factor, {p.calibration_factor.size() / 2, 2});
    cf.set_attr("content", "factor by which each rank's profile row was scaled before this split was solved: "
                           "measured / predicted stage compute over the partitions in calibrated_from");
    cf.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    part.set_attr("calibrated_from", p.calibrated_from);
    part.set_attr("solved_after_round", static_cast<int64_t>(p.solved_after_round));
  }
  part.set_attr("objective", run.workload.objective);
  part.set_attr("counts", [&] {
    std::string c;
    for (hs k = 0; k < S; ++k) {  // (not `"," + to_string(...)`: GCC 12 warns -Wrestrict on it)
      if (k) c += ',';
      c += std::to_string(p.last_unit[k] - p.first_unit[k] + 1);
    }
    return c;
  }());
  part.write_dataset("first_unit", p.first_unit);
  part.write_dataset("last_unit", p.last_unit);
  part.write_dataset("device_rank", p.device_rank).set_attr("content", "the first rank of each stage");
  {
    std::vector<int> widths = p.tp_width;
    if (widths.size() != S) widths.assign(S, 1);
    auto tw = part.write_dataset("tp_width", widths);
    tw.set_attr("content", "tensor-parallel width of each stage: stage k runs on ranks device_rank[k] .. "
                           "device_rank[k] + tp_width[k] - 1");
    part.set_attr("layout", p.layout);
    part.set_attr("microbatches", static_cast<int64_t>(partition_groups(run, p)));
    part.set_attr("replicas", static_cast<int64_t>(p.replicas));
    if (p.handoff_copies.size() == S) {
      auto hc = part.write_dataset("handoff_copies", p.handoff_copies);
      hc.set_attr("content", "copies of each item's output one rank of stage k sends to stage k + 1 (the last stage: "
                             "tokens to stage 0): receiver j gets the whole output from sender j % tp_width[k]; each "
                             "link carries one copy of the item's bytes");
    }
  }
  write_predictions(part, run, p);
  part.write_dataset("stage_weight_bytes", p.stage_weight_bytes).set_attr("units", "bytes");
  part.write_dataset("stage_kv_bytes", p.stage_kv_bytes).set_attr("units", "bytes");
  if (p.stage_floor_ms.size() == p.first_unit.size()) {
    auto fl = part.write_dataset("stage_floor_ms", p.stage_floor_ms);
    fl.set_attr("units", "ms");
    fl.set_attr("objective", run.workload.objective);
    fl.set_attr("ceilings", "read_bandwidth_shared_GBps and peak_gflops of the stage's rank (/ranks)");
    fl.set_attr("efficiency", "stage_floor_ms / measured_stage_ms");
    auto fp = part.write_dataset("stage_floor_phase_ms", p.stage_floor_phase_ms, {S, 2});
    fp.set_attr("units", "ms");
    fp.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
  }
}

/// /partitions/<name> and, for a measured partition, /benchmark/<name> and /validation/<name>;
/// the per-round rows extendible in a snapshot.
void write_partition(Group& root, const RunRecord& run, const PartitionRecord& p, bool extendible) {
  write_split(root, run, p);
  if (!p.measured) return;
  write_benchmark(root, run, p, extendible);
  write_validation(root, run, p);
}

/// One field of every rank, in rank order: a /ranks dataset's data.
template <typename T>
std::vector<T> column(const std::vector<RankInfo>& ranks, T RankInfo::*field) {
  std::vector<T> out;
  for (const RankInfo& r : ranks) out.push_back(r.*field);
  return out;
}

/// /ranks: one entry per rank (results/README.md).
void write_ranks(Group& root, const std::vector<RankInfo>& rs) {
  Group ranks = root.create_group("ranks");
  ranks.write_strings("hostname", column(rs, &RankInfo::hostname));
  ranks.write_strings("device_name", column(rs, &RankInfo::device_name));
  ranks.write_strings("bus_id", column(rs, &RankInfo::bus_id));
  ranks.write_dataset("local_rank", column(rs, &RankInfo::local_rank));
  ranks.write_strings("machine_id", column(rs, &RankInfo::machine_id))
      .set_attr("content", "the machine: the kernel's boot id (/proc/sys/kernel/random/boot_id), or "
                           "\"host:<hostname>\" where unreadable; ranks with equal ids share memory bandwidth, "
                           "even on different nodes (containers, namespaces)");
  ranks.write_dataset("clock_offset_s", column(rs, &RankInfo::clock_offset_s)).set_attr("units", "s");
  ranks.write_dataset("memory_limit_bytes", column(rs, &RankInfo::memory_limit_bytes)).set_attr("units", "bytes");
  ranks.write_dataset("stage_scratch_bytes", column(rs, &RankInfo::stage_scratch_bytes)).set_attr("units", "bytes");
  ranks.write_dataset("tp_reserve_bytes", column(rs, &RankInfo::tp_reserve_bytes)).set_attr("units", "bytes");
  auto bw = ranks.write_dataset("read_bandwidth_GBps", column(rs, &RankInfo::read_bandwidth_GBps));
  bw.set_attr("units", "GB/s (1e9 B/s)");
  bw.set_attr("measured", "streaming read with the machine's other ranks idle (Device::measure_read_bandwidth_GBps)");
  auto bws = ranks.write_dataset("read_bandwidth_shared_GBps", column(rs, &RankInfo::read_bandwidth_shared_GBps));
  bws.set_attr("units", "GB/s (1e9 B/s)");
  bws.set_attr("measured", "streaming read with every rank reading at once");
  ranks.write_strings("cpu_affinity", column(rs, &RankInfo::cpu_affinity))
      .set_attr("content", "CPUs the rank may run on (sched_getaffinity), Linux cpulist format; \"\" = not recorded");
  ranks.write_dataset("cpu_quota_cores", column(rs, &RankInfo::cpu_quota_cores))
      .set_attr("content", "CPU quota of the rank's cgroups in cores (cpu.max / cfs_quota); NaN = none");
  auto period = ranks.write_dataset("cpu_quota_period_ms", column(rs, &RankInfo::cpu_quota_period_ms));
  period.set_attr("units", "ms");
  period.set_attr("content", "CFS period over which that quota is enforced (of the binding level); NaN = none");
  ranks.write_strings("cpu_quota_cgroup", column(rs, &RankInfo::cpu_quota_cgroup))
      .set_attr("content", "the cgroup directory whose quota binds, as the rank's mounts show it; \"\" = no quota");
  ranks.write_strings("cpu_quota_cgroup_id", column(rs, &RankInfo::cpu_quota_cgroup_id))
      .set_attr("content",
                "that cgroup's identity on its machine, \"<st_dev>:<st_ino>\" of its directory: ranks of one "
                "machine_id with one identity share one quota; \"\" = no quota");
  std::vector<std::string> levels;
  for (const RankInfo& r : rs) levels.push_back(quota_levels_text(r.cpu_quota_levels));
  ranks.write_strings("cpu_quota_levels", levels)
      .set_attr("content",
                "every level of the rank's cgroups that sets a CPU quota, the binding one first: a JSON array of "
                "{\"cgroup_id\": \"<st_dev>:<st_ino>\", \"cores\": quota / period, \"cgroup\": its directory}; ranks "
                "of one machine_id under one cgroup_id share that quota, each held to its own binding one; \"\" = "
                "no quota");
  ranks.write_strings("cpu_governor", column(rs, &RankInfo::cpu_governor))
      .set_attr("content", "cpufreq scaling governor of the rank's first CPU; \"\" = not exposed");
  ranks.write_dataset("compute_threads", column(rs, &RankInfo::compute_threads))
      .set_attr("content", "BLAS threads (CPU) or 1 (GPU); 0 = not recorded");
  auto pk = ranks.write_dataset("peak_gflops", column(rs, &RankInfo::peak_gflops));
  pk.set_attr("units", "GFLOP/s (1e9 FLOP/s)");
  pk.set_attr("measured", "the stages' GEMM in the run's dtype (Device::measure_gemm_gflops)");
}

/// /profile/latency_ms, latency_min_ms, latency_max_ms [R][U][2]: each unit's median, fastest
/// and slowest timed forward per rank, with how they were taken.
void write_profile_latency(Group& prof, const RunRecord& run) {
  const auto& w = run.workload;
  const auto& p = run.profile;
  const hs R = run.ranks.size(), U = p.unit_name.size();
  for (const char* name : {"latency_ms", "latency_min_ms", "latency_max_ms"}) {
    const auto& data = std::string(name) == "latency_ms" ? p.latency_ms
                       : std::string(name) == "latency_min_ms" ? p.latency_min_ms
                                                                : p.latency_max_ms;
    auto d = prof.write_dataset(name, data, {R, U, 2});
    d.set_attr("units", "ms");
    d.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    d.set_attr("stat", std::string(name) == "latency_ms"
                           ? (w.profile_repeats > 2 ? "median over latency_cycles_ms of each profile cycle's median"
                              : w.profile_repeats > 1 ? "mean over latency_cycles_ms of each profile cycle's median"
                                                      : "median")
                           : (std::string(name) == "latency_min_ms" ? "min" : "max"));
    d.set_attr("warmup", static_cast<int64_t>(w.profile_warmup));
    d.set_attr("iters", static_cast<int64_t>(w.profile_iters));
    d.set_attr("decode", std::string(name) == "latency_ms" ? "mean over decode_contexts of the per-context median"
                         : std::string(name) == "latency_min_ms" ? "fastest timed decode forward over all decode_contexts"
                                                                 : "slowest timed decode forward over all decode_contexts");
  }
}

/// /profile/unit_flops, unit_bytes [U][2] (where counted), and floor_ms with efficiency
/// [R][U][2] (where each rank's ceilings were measured).
void write_profile_floors(Group& prof, const RunRecord& run) {
  const auto& p = run.profile;
  const hs R = run.ranks.size(), U = p.unit_name.size();
  if (p.unit_flops.size() == 2 * U && p.unit_bytes.size() == 2 * U) {
    auto fl = prof.write_dataset("unit_flops", p.unit_flops, {U, 2});
    fl.set_attr("units", "FLOP");
    fl.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    fl.set_attr("decode", "mean over decode_contexts");
    auto by = prof.write_dataset("unit_bytes", p.unit_bytes, {U, 2});
    by.set_attr("units", "bytes");
    by.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    by.set_attr("content", "weights + KV cache read and written + activations in/out (+ logits written)");
  }
  if (p.floor_ms.size() == R * U * 2 && p.latency_ms.size() == p.floor_ms.size()) {
    auto fl = prof.write_dataset("floor_ms", p.floor_ms, {R, U, 2});
    fl.set_attr("units", "ms");
    fl.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    fl.set_attr("formula", "max(unit_bytes / read_bandwidth_GBps, unit_flops / peak_gflops) of rank r (/ranks)");
    // The floors use each rank's ceilings alone: against the alone pass where there are two.
    const bool alone = p.latency_alone_ms.size() == p.floor_ms.size();
    const auto& timed = alone ? p.latency_alone_ms : p.latency_ms;
    std::vector<double> eff(p.floor_ms.size());
    for (size_t i = 0; i < eff.size(); ++i) eff[i] = p.floor_ms[i] / timed[i];
    auto e = prof.write_dataset("efficiency", eff, {R, U, 2});
    e.set_attr("formula", alone ? "floor_ms / latency_alone_ms (1 = at the hardware's floor)"
                                : "floor_ms / latency_ms (1 = at the hardware's floor)");
  }
}

/// /profile/latency_alone_ms [R][U][2] (a two-pass profile's first pass) and the profile
/// cycles' medians latency_cycles_ms, latency_alone_cycles_ms [cycles][R][U][2].
void write_profile_passes(Group& prof, const RunRecord& run) {
  const auto& w = run.workload;
  const auto& p = run.profile;
  const hs R = run.ranks.size(), U = p.unit_name.size();
  if (!p.latency_alone_ms.empty()) {
    auto a = prof.write_dataset("latency_alone_ms", p.latency_alone_ms, {R, U, 2});
    a.set_attr("units", "ms");
    a.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    a.set_attr("stat", w.profile_repeats > 2   ? "median over latency_alone_cycles_ms of each profile cycle's median"
                       : w.profile_repeats > 1 ? "mean over latency_alone_cycles_ms of each profile cycle's median"
                                               : "median");
    a.set_attr("content", "each unit timed with its machine's other ranks waiting (pass 1 of 2); latency_ms is pass 2, "
                          "every rank timing the unit at the same moment; decode: mean over decode_contexts");
  }
  for (const char* name : {"latency_cycles_ms", "latency_alone_cycles_ms"}) {
    const auto& data = std::string(name) == "latency_cycles_ms" ? p.latency_cycles_ms : p.latency_alone_cycles_ms;
    if (data.empty() || data.size() % (R * U * 2) != 0) continue;
    auto c = prof.write_dataset(name, data, {static_cast<hs>(data.size() / (R * U * 2)), R, U, 2});
    c.set_attr("units", "ms");
    c.set_attr("dims", std::vector<std::string>{"cycle", "rank", "unit", "phase"});
    c.set_attr("content", std::string("each profile cycle's medians (/config/workload profile_repeats cycles, in order); ") +
                              (std::string(name) == "latency_cycles_ms" ? "latency_ms" : "latency_alone_ms") +
                              " is their mean");
  }
}

/// /profile/tp: the width axis (issue 14), each group of ranks profiled together; nothing
/// without one.
void write_profile_tp(Group& prof, const RunRecord& run) {
  const auto& p = run.profile;
  const hs U = p.unit_name.size();
  if (!p.tp.empty()) {
    Group tp = prof.create_group("tp");
    tp.set_attr("content", "each group of ranks a --tp layout needs, profiled together at its width (each unit "
                           "split over the group, the all-reduces inside its forward); the group's first rank's timings");
    const hs N = p.tp.size();
    std::vector<int> first, width;
    std::vector<double> lat, lo, hi;
    for (const auto& g : p.tp) {
      first.push_back(g.first_rank);
      width.push_back(g.width);
      lat.insert(lat.end(), g.latency_ms.begin(), g.latency_ms.end());
      lo.insert(lo.end(), g.latency_min_ms.begin(), g.latency_min_ms.end());
      hi.insert(hi.end(), g.latency_max_ms.begin(), g.latency_max_ms.end());
    }
    tp.write_dataset("first_rank", first);
    tp.write_dataset("width", width);
    for (auto [name, data] : {std::pair<const char*, const std::vector<double>*>{"latency_ms", &lat},
                              {"latency_min_ms", &lo}, {"latency_max_ms", &hi}}) {
      auto d = tp.write_dataset(name, *data, {N, U, 2});
      d.set_attr("units", "ms");
      d.set_attr("phases", std::vector<std::string>{"prefill", "decode"});
    }
    write_tp_step_grids(tp, p);
  }
}

/// /profile: what each unit costs on each rank's device (results/README.md).
void write_profile(Group& root, const RunRecord& run, bool extendible) {
  const auto& w = run.workload;
  const auto& p = run.profile;
  const hs R = run.ranks.size(), U = p.unit_name.size(), C = p.decode_contexts.size();
  Group prof = root.create_group("profile");
  prof.write_strings("unit_name", p.unit_name);
  prof.write_dataset("unit_signature", p.unit_signature);
  prof.write_strings("signature_name", p.signature_name);
  prof.write_dataset("unit_params", p.unit_params);
  prof.write_dataset("unit_weight_bytes", p.unit_weight_bytes).set_attr("units", "bytes");
  prof.write_dataset("unit_kv_bytes", p.unit_kv_bytes).set_attr("units", "bytes");
  write_profile_latency(prof, run);
  write_profile_floors(prof, run);
  write_profile_passes(prof, run);
  for_each_profile_rows(run, WriteRows{prof, extendible});  // latency_rounds_ms, latency_rounds_after
  prof.write_dataset("decode_contexts", p.decode_contexts).set_attr("units", "tokens");
  prof.write_dataset("decode_context_ms", p.decode_context_ms, {R, U, C}).set_attr("units", "ms");
  auto cost = prof.write_dataset("cost_ms", p.cost_ms, {R, U});
  cost.set_attr("units", "ms");
  cost.set_attr("objective", w.objective);
  write_profile_tp(prof, run);
  write_step_model(prof, run);
}

/// The root attributes: the run's identity, versions, Slurm job, status, link, validation (none
/// before `complete`), gains, benchmark schedule and partition order; complete = 0 until
/// write_all ends.
void write_root_attrs(Group& root, const RunRecord& run, bool complete) {
  root.set_attr("complete", static_cast<int64_t>(0));
  root.set_attr("format_version", static_cast<int64_t>(kResultsFormatVersion));
  root.set_attr("ppbench_version", run.ppbench_version);
  root.set_attr("created_utc", run.created_utc);
  root.set_attr("command_line", run.command_line);
  root.set_attr("world_size", static_cast<int64_t>(run.world_size));
  root.set_attr("backend", run.backend);
  root.set_attr("transport", run.transport);
  root.set_attr("mpi_version", run.mpi_version);
  root.set_attr("hdf5_version", hdf5_version());
  for (const auto& [k, v] : run.library_versions) root.set_attr(k + "_version", v);
  root.set_attr("slurm_job_id", run.slurm_job_id);
  root.set_attr("slurm_job_name", run.slurm_job_name);
  root.set_attr("slurm_nodelist", run.slurm_nodelist);
  root.set_attr("slurm_array_task_id", run.slurm_array_task_id);
  root.set_attr("elapsed_s", run.elapsed_s);
  root.set_attr("status", run.status);
  root.set_attr("failure", run.failure);
  root.set_attr("link_latency_s", run.link_latency_s);
  root.set_attr("link_bandwidth_Bps", run.link_bandwidth_Bps);
  // An incomplete snapshot has validated nothing yet, whatever the record says so far.
  root.set_attr("validation_ok", complete && run.validation_ok);
  root.set_attr("validation", complete ? run.validation : std::string("pending"));
  root.set_attr("balance_gain", run.balance_gain);
  root.set_attr("decode_balance_gain", run.decode_balance_gain);
  write_comparison(root, "balance_gain", run.balance_cmp, run.balance_verdict);
  write_comparison(root, "decode_balance_gain", run.decode_balance_cmp, run.decode_balance_verdict);
  root.set_attr("benchmark_schedule", run.schedule);
  root.set_attr("reference_partition", run.reference_partition);
  root.set_attr("benchmark_rounds", static_cast<int64_t>(run.rounds));
  root.set_attr("benchmark_stop_reason", run.stop_reason);
  root.set_attr("adaptive_status", run.adaptive_status);
  root.set_attr("round_profile", run.round_profile_status);
  root.set_attr("round_profile_s", run.round_profile_s);
  if (!run.tp_auto_layout.empty()) root.set_attr("tp_auto_layout", run.tp_auto_layout);
  root.set_attr("partition_order", [&] {
    std::vector<std::string> names;  // run order: HDF5 lists groups by name
    for (const auto& part : run.partitions) names.push_back(part.name);
    return names;
  }());
}

/// /config/model (the config's source, attributes and text) and /moe (the experts' routed
/// tokens, when the run counted them).
void write_model(Group& root, const RunRecord& run) {
  Group model = root.create_group("config/model");
  model.set_attr("source", run.model_source);
  for (const auto& [k, v] : run.model_attrs_str) model.set_attr(k, v);
  for (const auto& [k, v] : run.model_attrs_num) model.set_attr(k, v);
  model.write_string("config_json", run.model_config_json);
  if (!run.expert_tokens.empty()) {
    Group moe = root.create_group("moe");
    moe.set_attr("expert_skew", run.expert_skew);
    moe.set_attr("partition", run.expert_tokens_partition);
    moe.write_dataset("expert_tokens", run.expert_tokens,
                      {static_cast<hsize_t>(run.expert_rows), static_cast<hsize_t>(run.expert_cols)})
        .set_attr("content",
                  "tokens routed to each expert of each layer (a token counts once per expert it reaches; rows: "
                  "the model's layers, then its MTP modules when run; dense layers 0) in the partition's last "
                  "timed repetition");
  }
}

/// /config/workload: the run's workload and benchmark settings, and /config/environment.
void write_workload(Group& root, const RunRecord& run) {
  const auto& w = run.workload;
  Group wl = root.create_group("config/workload");
  wl.set_attr("batch", static_cast<int64_t>(w.batch));
  wl.set_attr("prompt_len", static_cast<int64_t>(w.prompt_len));
  wl.set_attr("gen_len", static_cast<int64_t>(w.gen_len));
  wl.set_attr("microbatches", static_cast<int64_t>(w.microbatches));
  wl.set_attr("dtype", w.dtype);
  wl.set_attr("warmup", static_cast<int64_t>(w.warmup));
  wl.set_attr("iters", static_cast<int64_t>(w.iters));
  wl.set_attr("profile_warmup", static_cast<int64_t>(w.profile_warmup));
  wl.set_attr("profile_iters", static_cast<int64_t>(w.profile_iters));
  wl.set_attr("overlap", w.overlap);
  wl.set_attr("seed", static_cast<int64_t>(w.seed));
  wl.set_attr("objective", w.objective);
  wl.set_attr("target_ci_pct", w.target_ci_pct);
  wl.set_attr("max_time_s", w.max_time_s);
  wl.set_attr("cuda_graphs", w.cuda_graphs);
  wl.set_attr("profile_passes", w.profile_passes);
  wl.set_attr("profile_repeats", static_cast<int64_t>(w.profile_repeats));
  wl.set_attr("expert_skew", w.expert_skew);
  if (!w.profile_order.empty()) wl.set_attr("profile_order", w.profile_order);
  Group env = root.create_group("config/environment");
  for (const auto& [k, v] : run.environment) env.set_attr(k, v);
}

/// The whole record into `file`: a snapshot (complete = false, extendible datasets) or the
/// final file (complete = true, the root attribute complete = 1 last).
void write_all(h5::File& file, const RunRecord& run, bool complete) {
  Group root = file.root();
  write_root_attrs(root, run, complete);
  if (!run.flight_records.empty())  // also before the profile: a hang can come at any phase
    root.create_group("failure").write_strings("flight_record", run.flight_records);
  if (run.ranks.empty() || run.profile.unit_name.empty()) {  // a snapshot before the profile
    file.flush();
    return;
  }
  write_model(root, run);
  write_workload(root, run);
  write_ranks(root, run.ranks);
  write_links(root, run);
  write_profile(root, run, !complete);
  write_plan(root, run);
  write_serving(root, run);

  for (const auto& part : run.partitions) write_partition(root, run, part, !complete);
  if (!run.round_gap_s.empty()) {
    Group rounds = root.create_group("rounds");
    for_each_round_rows(run, WriteRows{rounds, !complete});
  }
  file.flush();
  root.set_attr("oversubscribed", static_cast<int64_t>(any_oversubscribed(run.ranks) ? 1 : 0));
  if (complete) root.set_attr("complete", static_cast<int64_t>(1));
}

/// Throws InternalError unless `root` is a snapshot of `run` (write_results with complete=0):
/// the same format_version, ppbench_version, created_utc and command_line, and a profile.
void check_snapshot_of(const Group& root, const RunRecord& run, const std::string& path) {
  const std::string not_ours = "append_results: '" + path + "' is not a snapshot of this run written by write_results";
  for (const char* key : {"complete", "format_version", "ppbench_version", "created_utc", "command_line"})
    if (!root.has_attr(key)) throw InternalError(not_ours + " (no root attribute " + key + ")");
  if (root.get_attr<int64_t>("complete") != 0)
    throw InternalError("append_results: '" + path + "' is complete (complete=1): the final write came already");
  if (root.get_attr<int64_t>("format_version") != kResultsFormatVersion)
    throw InternalError(not_ours + " (format_version " + std::to_string(root.get_attr<int64_t>("format_version")) +
                        ", this build writes " + std::to_string(kResultsFormatVersion) + ")");
  for (auto [key, mine] : {std::pair<const char*, const std::string*>{"ppbench_version", &run.ppbench_version},
                           {"created_utc", &run.created_utc},
                           {"command_line", &run.command_line}}) {
    const std::string theirs = root.get_attr<std::string>(key);
    if (theirs != *mine)
      throw InternalError(not_ours + " (its " + key + " is '" + theirs + "', the run's '" + *mine + "')");
  }
  if (!root.is_group("profile"))
    throw InternalError("append_results: '" + path + "' holds no profile: write_results(..., complete=false) of "
                        "the run's profile and partitions comes before the rounds' rows are appended");
}

/// append_results' work on the open file: everything but the opening, the flush and the close.
void append_all(Group root, const RunRecord& run, const std::string& path) {
  check_snapshot_of(root, run, path);
  bool partition_added = false;
  for (const auto& p : run.partitions)
    if (!root.exists("partitions/" + p.name)) {  // it joined after the last whole write (an adaptive split)
      write_split(root, run, p);
      partition_added = true;
    }
  for (const auto& p : run.partitions) {
    if (!p.measured) continue;
    const bool fresh = !root.is_group("benchmark/" + p.name);
    Group bench = fresh ? root.require_group("benchmark").create_group(p.name) : root.open_group("benchmark/" + p.name);
    bool wrote = false;
    for_each_benchmark_rows(run, p, AppendRows{bench, path, wrote});
    if (wrote) {
      // The summary stays as the last whole write left it (none in a group made here): say so,
      // and how many repetitions it covers. Nothing else of the group is read or rewritten.
      if (!bench.has_attr("summary_repetitions"))
        bench.set_attr("summary_repetitions",
                       fresh || !bench.has_attr("repetitions") ? int64_t{0} : bench.get_attr<int64_t>("repetitions"));
      bench.set_attr("snapshot", kAppendedNote);
    }
    if (!root.is_group("validation/" + p.name)) write_pending_validation(root, p);
  }
  if (partition_added)
    root.set_attr("partition_order", [&] {
      std::vector<std::string> names;
      for (const auto& part : run.partitions) names.push_back(part.name);
      return names;
    }());
  Group prof = root.open_group("profile");
  bool wrote = false;
  for_each_profile_rows(run, AppendRows{prof, path, wrote});
  if (!run.round_gap_s.empty()) {
    Group rounds = root.require_group("rounds");
    for_each_round_rows(run, AppendRows{rounds, path, wrote});
  }
  root.set_attr("status", run.status);  // an unchanged string is not written again (h5.h)
  root.set_attr("elapsed_s", run.elapsed_s);
  root.set_attr("benchmark_rounds", static_cast<int64_t>(run.rounds));
  root.set_attr("round_profile_s", run.round_profile_s);
}

}  // namespace

void append_results(const std::string& path, const RunRecord& run) {
  h5::File file;
  try {
    file = h5::File::open_rw(path);
  } catch (const UserError&) {
    // Missing, or not HDF5: nothing to append to.
    h5::File readable;
    try {
      readable = h5::File::open(path);
    } catch (const UserError& missing) {
      throw InternalError(std::string("append_results: ") + missing.what() +
                          " (write_results(..., complete=false) writes the snapshot that rounds are appended to)");
    }
    // Readable but not writable in place: another process has it open (HDF5 locks an open
    // file; an h5py session watching the run is enough) or it lost its write permission. A
    // whole rewrite (temporary file + rename) needs neither, and is what the run did before.
    check_snapshot_of(readable.root(), run, path);
    readable.close();
    write_results(path, run, /*complete=*/false);
    return;
  }
  append_all(file.root(), run, path);
  file.flush();
  file.close();
}

void write_results(const std::string& path, const RunRecord& run, bool complete) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  try {
    {
      h5::File file = h5::File::create(tmp);
      write_all(file, run, complete);
      file.close();
    }
    std::filesystem::rename(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace ppb
