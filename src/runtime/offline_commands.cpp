#include "runtime/offline_commands.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "balance/memory_report.h"
#include "balance/partition.h"
#include "balance/simulator.h"
#include "common/error.h"
#include "results/h5.h"

namespace ppb {

namespace {

using nlohmann::json;
using balance::BalanceProblem;

bool is_hdf5(const std::string& path) {
  if (std::filesystem::is_directory(path))
    throw UserError("input '" + path + "' is a directory; give a results .h5 file or a latency JSON");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("input '" + path + "' cannot be opened");
  char sig[8] = {};
  f.read(sig, 8);
  return f.gcount() == 8 && std::string(sig, 8) == std::string("\x89HDF\r\n\x1a\n", 8);
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UserError("input '" + path + "' cannot be opened");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw UserError("input '" + path + "' is not valid JSON: " + e.what());
  }
}

/// Field `key` of `j` as T; UserError naming file and field when it has the wrong type.
template <class T>
T field(const json& j, const std::string& key, const std::string& path, const char* expected) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw UserError("input '" + path + "': field '" + key + "' must be " + expected);
  }
}

int dtype_bytes_of(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "f16" || dtype == "bf16") return 2;
  return 4;
}

/// What a results file holds for the offline commands.
struct ResultsProfile {
  int world = 0, U = 0, batch = 1, prompt_len = 1, gen_len = 1, microbatches = 1;
  bool overlap = true;
  double hidden = 0;
  std::string dtype = "f32";
  std::vector<double> latency;  // [world][U][2]
  std::vector<std::string> unit_name;
  std::vector<int64_t> weight_bytes, kv_bytes;
};

ResultsProfile read_results_profile(const std::string& path) {
  h5::File file = h5::File::open(path);
  h5::Group root = file.root();
  // Like `report`, refuse a snapshot of a run that did not finish (results/README.md).
  if (!root.has_attr("complete") || root.get_attr<int64_t>("complete") != 1)
    throw UserError("results file '" + path + "' is incomplete (complete != 1: the run failed or is still going; "
                    "its status: " + (root.has_attr("status") ? root.get_attr<std::string>("status") : std::string("?")) + ")");
  ResultsProfile r;
  try {
    h5::Group wl = root.open_group("config/workload");
    r.batch = wl.get_attr<int>("batch");
    r.prompt_len = wl.get_attr<int>("prompt_len");
    r.gen_len = wl.get_attr<int>("gen_len");
    r.microbatches = wl.get_attr<int>("microbatches");
    r.overlap = wl.get_attr<bool>("overlap");
    r.dtype = wl.get_attr<std::string>("dtype");
    h5::Group model = root.open_group("config/model");
    r.hidden = model.has_attr("hidden_size") ? model.get_attr<double>("hidden_size") : 0.0;
    h5::Dataset lat = root.open_dataset("profile/latency_ms");
    const auto dims = lat.dims();
    if (dims.size() != 3 || dims[2] != 2) throw UserError("/profile/latency_ms is not [world][U][2]");
    r.world = static_cast<int>(dims[0]);
    r.U = static_cast<int>(dims[1]);
    r.latency = lat.read<double>();
    r.unit_name = root.open_dataset("profile/unit_name").read_strings();
    r.weight_bytes = root.open_dataset("profile/unit_weight_bytes").read<int64_t>();
    r.kv_bytes = root.open_dataset("profile/unit_kv_bytes").read<int64_t>();
  } catch (const InternalError& e) {
    throw UserError("results file '" + path + "' lacks what balance/simulate need (" + e.what() +
                    "); is it a complete ppbench run?");
  }
  return r;
}

std::string gib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

void write_json_file(const std::string& path, const json& j) {
  std::ofstream f(path);
  if (!f) throw UserError("--json '" + path + "' cannot be written");
  f << j.dump(2) << "\n";
  if (!f) throw UserError("--json '" + path + "': write failed");
}

}  // namespace

BalanceProblem load_balance_problem(const std::string& path, const std::string& objective) {
  if (objective != "workload" && objective != "decode" && objective != "prefill")
    throw UserError("--objective '" + objective + "' is unknown; valid: workload, decode, prefill");
  BalanceProblem p;
  if (is_hdf5(path)) {
    const ResultsProfile r = read_results_profile(path);
    for (int d = 0; d < r.world; ++d) {
      std::vector<double> row(r.U);
      for (int u = 0; u < r.U; ++u) {
        const double pre = r.latency[(static_cast<size_t>(d) * r.U + u) * 2], dec = r.latency[(static_cast<size_t>(d) * r.U + u) * 2 + 1];
        row[u] = objective == "workload" ? pre + r.gen_len * dec : objective == "decode" ? dec : pre;
      }
      p.cost.push_back(row);
    }
    p.unit_names = r.unit_name;
    p.weight_bytes = r.weight_bytes;
    p.kv_bytes = r.kv_bytes;
    // Bytes crossing a boundary per workload of one group: B*P hidden states for the prefill and
    // B for each of the G decode steps (the cost unit of the "workload" objective).
    const double tokens = objective == "workload" ? r.prompt_len + r.gen_len : objective == "decode" ? 1 : r.prompt_len;
    if (r.hidden > 0) p.activation_bytes.assign(r.U - 1, r.batch * tokens * r.hidden * dtype_bytes_of(r.dtype));
    p.messages_per_boundary = objective == "workload" ? r.gen_len + 1 : 1;
    p.overlap = r.overlap;
    balance::validate_problem(p);
    return p;
  }
  const json j = read_json(path);
  if (!j.is_object()) throw UserError("input '" + path + "' must be a JSON object with 'latency_ms'");
  if (!j.contains("latency_ms")) throw UserError("input '" + path + "': field 'latency_ms' is missing ([devices][units] ms or one row)");
  const json& lat = j.at("latency_ms");
  if (lat.is_array() && !lat.empty() && lat[0].is_array()) p.cost = field<std::vector<std::vector<double>>>(j, "latency_ms", path, "[devices][units] numbers");
  else p.cost = {field<std::vector<double>>(j, "latency_ms", path, "a list of numbers (ms per unit) or a list of such rows")};
  if (p.cost.empty() || p.cost[0].empty()) throw UserError("input '" + path + "': field 'latency_ms' is empty");
  const size_t U = p.cost[0].size();
  if (j.contains("units")) {
    if (j["units"].is_number_integer()) {
      if (j["units"].get<long long>() != static_cast<long long>(U))
        throw UserError("input '" + path + "': field 'units' is " + j["units"].dump() + " but latency_ms rows have " + std::to_string(U) + " units");
    } else {
      p.unit_names = field<std::vector<std::string>>(j, "units", path, "a list of unit names or a unit count");
    }
  }
  if (j.contains("weight_bytes")) p.weight_bytes = field<std::vector<int64_t>>(j, "weight_bytes", path, "a list of integers (bytes per unit)");
  if (j.contains("kv_bytes")) p.kv_bytes = field<std::vector<int64_t>>(j, "kv_bytes", path, "a list of integers (bytes per unit)");
  if (j.contains("device_memory_bytes")) {
    if (j["device_memory_bytes"].is_number()) p.device_memory_bytes.assign(p.cost.size(), j["device_memory_bytes"].get<int64_t>());
    else p.device_memory_bytes = field<std::vector<int64_t>>(j, "device_memory_bytes", path, "an integer or a list (bytes per device)");
  }
  if (j.contains("activation_bytes")) {
    if (j["activation_bytes"].is_number()) p.activation_bytes.assign(U > 0 ? U - 1 : 0, j["activation_bytes"].get<double>());
    else p.activation_bytes = field<std::vector<double>>(j, "activation_bytes", path, "a number or a list (bytes per unit boundary)");
  }
  if (j.contains("link_bandwidth_GBps")) p.link_bandwidth_GBps = field<double>(j, "link_bandwidth_GBps", path, "a number (GB/s)");
  if (j.contains("link_latency_us")) p.link_latency_us = field<double>(j, "link_latency_us", path, "a number (microseconds)");
  if (j.contains("overlap")) p.overlap = field<bool>(j, "overlap", path, "true or false");
  try {
    balance::validate_problem(p);
  } catch (const UserError& e) {
    throw UserError("input '" + path + "': " + e.what());
  }
  return p;
}

int balance_command(const BalanceOptions& opt) {
  BalanceProblem p = load_balance_problem(opt.input, opt.objective);
  // One latency row means identical devices: one device per stage, all of that row.
  const int stages = opt.stages > 0 ? opt.stages : p.devices();
  if (p.cost.size() == 1 && p.device_row.empty() && stages > 1) {
    p.device_row.assign(stages, 0);
    if (p.device_memory_bytes.size() == 1) p.device_memory_bytes.assign(stages, p.device_memory_bytes[0]);
  }
  if (opt.memory_limit_gib < 0) throw UserError("--memory-limit must be >= 0 GiB");
  if (opt.memory_limit_gib > 0)
    p.device_memory_bytes.assign(p.devices(), static_cast<int64_t>(opt.memory_limit_gib * (1ull << 30)));
  if (opt.link_bandwidth_GBps >= 0) p.link_bandwidth_GBps = opt.link_bandwidth_GBps;
  if (opt.link_latency_us >= 0) p.link_latency_us = opt.link_latency_us;
  if (opt.no_overlap) p.overlap = false;
  const int U = p.units();
  const std::vector<int> rank = balance::rank_order(p, stages);

  balance::Partition part;
  if (!opt.partition.empty()) {
    part = balance::parse_manual(opt.partition, U, stages);
    part.device_rank = rank;
  } else if (opt.solver == "uniform") {
    part = balance::solve_uniform(U, stages, balance::parse_uniform_remainder(opt.uniform_remainder));
  } else if (opt.solver == "seed") {
    part = balance::solve_seed(p.cost[p.row_of(0)], stages);
  } else if (opt.solver == "auto" || opt.solver == "dp" || opt.solver == "fast") {
    if (opt.order != "rank" && opt.order != "auto")
      throw UserError("--order '" + opt.order + "' is unknown; valid: rank, auto");
    const auto kind = opt.solver == "dp" ? balance::SolverKind::dp
                      : opt.solver == "fast" ? balance::SolverKind::fast : balance::SolverKind::automatic;
    part = balance::solve_with_order(p, stages, opt.order == "auto" ? balance::OrderMode::automatic : balance::OrderMode::rank, kind);
  } else {
    throw UserError("--solver '" + opt.solver + "' is unknown; valid: auto, dp, fast (exact), uniform, seed");
  }
  balance::evaluate(p, part);
  const auto mem = balance::stage_memory_bytes(p, part);

  auto name = [&](int u) { return u < static_cast<int>(p.unit_names.size()) ? p.unit_names[u] : std::to_string(u); };
  std::cout << "balance: " << U << " units on " << stages << " stages, solver " << part.solver
            << (part.algorithm.empty() ? "" : " (" + part.algorithm + ")") << ", "
            << (p.overlap ? "overlap" : "no overlap") << "\n";
  std::printf("%-5s %-26s %-6s %6s %13s %11s\n", "stage", "units", "device", "count", "predicted ms", "memory GiB");
  for (int k = 0; k < stages; ++k) {
    const std::string units = std::to_string(part.first_unit[k]) + ".." + std::to_string(part.last_unit[k]) + " (" +
                              name(part.first_unit[k]) + ".." + name(part.last_unit[k]) + ")";
    std::printf("%-5d %-26s %-6d %6d %13.4f %11s\n", k, units.c_str(), part.device_rank[k], part.units_in(k),
                part.predicted_stage_ms[k], gib(mem[k]).c_str());
  }
  std::printf("split %s: bottleneck %.4f ms, spread %.4f ms\n", part.counts_string().c_str(), part.bottleneck_ms,
              part.spread_ms);
  std::cout.flush();

  if (!opt.json_out.empty()) {
    json out;
    out["stages"] = json::array();
    for (int k = 0; k < stages; ++k)
      out["stages"].push_back({{"first_unit", part.first_unit[k]},
                               {"last_unit", part.last_unit[k]},
                               {"device", part.device_rank[k]},
                               {"predicted_ms", part.predicted_stage_ms[k]},
                               {"memory_bytes", mem[k]}});
    out["bottleneck_ms"] = part.bottleneck_ms;
    out["spread_ms"] = part.spread_ms;
    out["solver"] = part.solver;
    out["algorithm"] = part.algorithm;
    out["counts"] = part.counts_string();
    out["overlap"] = p.overlap;
    write_json_file(opt.json_out, out);
  }
  return 0;
}

namespace {

json metrics_json(const PartitionMetrics& m) {
  return {{"tokens_per_s", m.tokens_per_s},   {"decode_tokens_per_s", m.decode_tokens_per_s},
          {"ttft_p50_ms", m.ttft_p50_ms},     {"ttft_p99_ms", m.ttft_p99_ms},
          {"tpot_p50_ms", m.tpot_p50_ms},     {"tpot_p99_ms", m.tpot_p99_ms},
          {"bubble_fraction", m.bubble_fraction}, {"bottleneck_bound_tok_s", m.bottleneck_bound_tok_s}};
}

void print_metrics(const std::string& label, const PartitionMetrics& m) {
  std::printf("  %-26s tokens/s %10.2f  decode tokens/s %10.2f  TTFT p50 %9.3f ms  TPOT p50 %9.3f ms  bubble",
              label.c_str(), m.tokens_per_s, m.decode_tokens_per_s, m.ttft_p50_ms, m.tpot_p50_ms);
  for (double b : m.bubble_fraction) std::printf(" %.3f", b);
  std::printf("\n");
}

}  // namespace

int simulate_command(const SimulateOptions& opt) {
  balance::SimConfig cfg;
  cfg.eager_sends = opt.eager_sends;
  json out;
  if (!is_hdf5(opt.input)) {
    const json j = read_json(opt.input);
    if (!j.is_object() || !j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
      throw UserError("input '" + opt.input + "': field 'stages' must be a non-empty list of {\"prefill_ms\", \"decode_ms\"[, \"send_prefill_ms\", \"send_decode_ms\"]}");
    std::vector<balance::SimStage> st;
    for (const auto& s : j["stages"]) {
      balance::SimStage x;
      x.prefill_ms = field<double>(s, "prefill_ms", opt.input, "a number (ms) in every stage");
      x.decode_ms = field<double>(s, "decode_ms", opt.input, "a number (ms) in every stage");
      if (s.contains("send_prefill_ms")) x.send_prefill_ms = field<double>(s, "send_prefill_ms", opt.input, "a number (ms)");
      if (s.contains("send_decode_ms")) x.send_decode_ms = field<double>(s, "send_decode_ms", opt.input, "a number (ms)");
      st.push_back(x);
    }
    cfg.groups = opt.microbatches > 0 ? opt.microbatches : j.value("microbatches", 1);
    cfg.gen_len = opt.gen_len > 0 ? opt.gen_len : j.value("gen_len", 1);
    cfg.batch = opt.batch > 0 ? opt.batch : j.value("batch", 1);
    cfg.overlap = !opt.no_overlap && j.value("overlap", true);
    const auto r = balance::simulate_pipeline(st, cfg);
    std::printf("simulate: %zu stages, M=%d G=%d B=%d, %s\n", st.size(), cfg.groups, cfg.gen_len, cfg.batch,
                cfg.overlap ? "overlap" : "no overlap");
    print_metrics("predicted", r.metrics);
    out["predicted"] = metrics_json(r.metrics);
  } else {
    const ResultsProfile rp = read_results_profile(opt.input);
    cfg.groups = opt.microbatches > 0 ? opt.microbatches : rp.microbatches;
    cfg.gen_len = opt.gen_len > 0 ? opt.gen_len : rp.gen_len;
    cfg.batch = opt.batch > 0 ? opt.batch : rp.batch;
    cfg.overlap = !opt.no_overlap && rp.overlap;
    h5::File file = h5::File::open(opt.input);
    h5::Group root = file.root();
    if (!root.exists("partitions")) throw UserError("results file '" + opt.input + "' has no /partitions");
    std::vector<std::string> names = root.open_group("partitions").children();
    if (!opt.partition_name.empty()) {
      if (std::find(names.begin(), names.end(), opt.partition_name) == names.end())
        throw UserError("--partition-name '" + opt.partition_name + "' is not in " + opt.input);
      names = {opt.partition_name};
    }
    // Transfer time of `bytes` over the link (0 when no link was given: transfers are free).
    auto xfer = [&](double bytes) {
      return opt.link_latency_us * 1e-3 + (opt.link_bandwidth_GBps > 0 ? bytes / (opt.link_bandwidth_GBps * 1e6) : 0.0);
    };
    const double act = rp.hidden * dtype_bytes_of(rp.dtype) * cfg.batch;
    std::printf("simulate: %s, M=%d G=%d B=%d, %s\n", opt.input.c_str(), cfg.groups, cfg.gen_len, cfg.batch,
                cfg.overlap ? "overlap" : "no overlap");
    for (const auto& name : names) {
      const auto phase = root.open_dataset("partitions/" + name + "/predicted_phase_ms").read<double>();
      const int S = static_cast<int>(phase.size() / 2);
      auto stages_from = [&](const std::vector<double>& ph) {
        std::vector<balance::SimStage> st(S);
        for (int s = 0; s < S; ++s) {
          st[s].prefill_ms = ph[2 * s];
          st[s].decode_ms = ph[2 * s + 1];
          const bool last = s == S - 1;
          st[s].send_prefill_ms = last ? xfer(4.0 * cfg.batch) : xfer(act * rp.prompt_len);
          st[s].send_decode_ms = last ? xfer(4.0 * cfg.batch) : xfer(act);
        }
        return st;
      };
      std::printf("partition %s:\n", name.c_str());
      const auto pred = balance::simulate_pipeline(stages_from(phase), cfg);
      print_metrics("predicted (profile)", pred.metrics);
      json entry{{"predicted", metrics_json(pred.metrics)}};
      const std::string bench = "benchmark/" + name;
      if (root.exists(bench + "/stage_compute_ms")) {
        const auto measured_steps = root.open_dataset(bench + "/stage_compute_ms").read<double>();
        const auto replay = balance::simulate_pipeline(stages_from(measured_steps), cfg);
        print_metrics("replayed (measured steps)", replay.metrics);
        h5::Group b = root.open_group(bench);
        PartitionMetrics meas;
        meas.tokens_per_s = b.get_attr<double>("tokens_per_s");
        meas.decode_tokens_per_s = b.get_attr<double>("decode_tokens_per_s");
        meas.ttft_p50_ms = b.get_attr<double>("ttft_p50_ms");
        meas.tpot_p50_ms = b.get_attr<double>("tpot_p50_ms");
        meas.ttft_p99_ms = b.get_attr<double>("ttft_p99_ms");
        meas.tpot_p99_ms = b.get_attr<double>("tpot_p99_ms");
        meas.bottleneck_bound_tok_s = b.get_attr<double>("bottleneck_bound_tok_s");
        if (root.exists(bench + "/bubble_fraction")) meas.bubble_fraction = root.open_dataset(bench + "/bubble_fraction").read<double>();
        print_metrics("measured", meas);
        const double err = pred.metrics.decode_tokens_per_s / meas.decode_tokens_per_s - 1.0;
        std::printf("  decode tokens/s: predicted / measured - 1 = %+.1f%%  (replayed: %+.1f%%)\n", 100 * err,
                    100 * (replay.metrics.decode_tokens_per_s / meas.decode_tokens_per_s - 1.0));
        entry["replayed"] = metrics_json(replay.metrics);
        entry["measured"] = metrics_json(meas);
        entry["decode_tokens_per_s_error"] = err;
      }
      out["partitions"][name] = entry;
    }
  }
  std::cout.flush();
  out["microbatches"] = cfg.groups;
  out["gen_len"] = cfg.gen_len;
  out["batch"] = cfg.batch;
  out["overlap"] = cfg.overlap;
  if (!opt.json_out.empty()) write_json_file(opt.json_out, out);
  return 0;
}

}  // namespace ppb
