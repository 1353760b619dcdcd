#include "app/offline_commands.h"
#include "app/offline_io.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/dtype.h"
#include "balance/layout.h"
#include "balance/memory_report.h"
#include "balance/partition.h"
#include "balance/problem.h"
#include "balance/simulator.h"
#include "common/error.h"
#include "model/model_spec.h"
#include "results/reader.h"
#include "results/run_record.h"

namespace ppb {

using balance::BalanceProblem;
using namespace offline;

BalanceProblem load_balance_problem(const std::string& path, const std::string& objective_in) {
  if (is_hdf5(path)) {
    // The run's own problem, rebuilt by the function the run used (balance/problem.h).
    const RunRecord run = read_run(path);
    return balance::problem_from_run(run, balance::parse_objective(objective_in.empty() ? run_objective(run) : objective_in));
  }
  if (!objective_in.empty()) balance::parse_objective(objective_in);  // UserError on a bad name
  BalanceProblem p;
  const json j = read_json(path);
  if (!j.is_object()) throw UserError("input '" + path + "' must be a JSON object with 'latency_ms'");
  check_keys(j,
             {"units", "latency_ms", "stage_fixed_ms", "weight_bytes", "kv_bytes", "device_memory_bytes",
              "activation_bytes", "link_bandwidth_GBps", "link_latency_us", "overlap"},
             path, "top level");
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
  if (j.contains("stage_fixed_ms")) {  // validate_problem checks the range against each row
    const json& f = j["stage_fixed_ms"];
    if (f.is_number()) p.stage_fixed_ms.assign(p.cost.size(), f.get<double>());
    else if (f.is_array()) p.stage_fixed_ms = field<std::vector<double>>(j, "stage_fixed_ms", path, "ms per device row");
    else throw UserError("input '" + path + "': field 'stage_fixed_ms' must be a number or a list (ms per device row)");
  }
  // Numbers are range-checked as doubles before any conversion to int64 (1e30 is not "negative").
  if (j.contains("weight_bytes")) p.weight_bytes = bytes_list(j, "weight_bytes", path);
  if (j.contains("kv_bytes")) p.kv_bytes = bytes_list(j, "kv_bytes", path);
  if (j.contains("device_memory_bytes")) {
    const json& m = j["device_memory_bytes"];
    if (m.is_number()) p.device_memory_bytes.assign(p.cost.size(), bytes_value(m, "device_memory_bytes", path, "bytes; 0 = unlimited"));
    else if (m.is_array()) p.device_memory_bytes = bytes_list(j, "device_memory_bytes", path, "bytes; 0 = unlimited");
    else throw UserError("input '" + path + "': field 'device_memory_bytes' must be a number or a list (bytes per device; 0 = unlimited)");
  }
  if (j.contains("activation_bytes")) {
    const json& a = j["activation_bytes"];
    if (a.is_number()) {
      p.activation_bytes.assign(U > 0 ? U - 1 : 0, bounded(a, "activation_bytes", path, kMaxBytes, "bytes"));
    } else if (a.is_array()) {
      for (std::size_t i = 0; i < a.size(); ++i)
        p.activation_bytes.push_back(bounded(a[i], "activation_bytes[" + std::to_string(i) + "]", path, kMaxBytes, "bytes"));
    } else {
      throw UserError("input '" + path + "': field 'activation_bytes' must be a number or a list (bytes per unit boundary)");
    }
  }
  if (j.contains("link_bandwidth_GBps"))
    p.link_bandwidth_GBps = bounded(j["link_bandwidth_GBps"], "link_bandwidth_GBps", path, 1e12, "GB/s; 0 = infinite");
  if (j.contains("link_latency_us"))
    p.link_latency_us = bounded(j["link_latency_us"], "link_latency_us", path, kMaxMs, "microseconds");
  if (j.contains("overlap")) p.overlap = field<bool>(j, "overlap", path, "true or false");
  try {
    balance::validate_problem(p);
  } catch (const UserError& e) {
    throw UserError("input '" + path + "': " + e.what());
  }
  return p;
}

namespace {

/// Refuses flags that the chosen mode would silently ignore (--help says which apply where).
void check_balance_flags(const BalanceOptions& opt) {
  if (opt.order != "rank" && opt.order != "auto")
    throw UserError("--order '" + opt.order + "' is unknown; valid: rank, auto");
  if (opt.solver != "auto" && opt.solver != "dp" && opt.solver != "fast" && opt.solver != "uniform" && opt.solver != "seed")
    throw UserError("--solver '" + opt.solver + "' is unknown; valid: auto, dp, fast (exact), uniform, seed");
  if (!opt.partition.empty() && opt.solver != "auto")
    throw UserError("--partition evaluates the given split, so --solver " + opt.solver +
                    " does not apply; give one or the other");
  const bool exact = opt.partition.empty() && (opt.solver == "auto" || opt.solver == "dp" || opt.solver == "fast");
  if (opt.order == "auto" && !exact)
    throw UserError("--order auto searches the device order of the exact solvers (--solver auto, dp, fast); with " +
                    (opt.partition.empty() ? "--solver " + opt.solver : std::string("--partition")) +
                    " stage k runs on device k: drop --order auto");
  if (!opt.uniform_remainder.empty() && (opt.solver != "uniform" || !opt.partition.empty()))
    throw UserError("--uniform-remainder applies to --solver uniform only (got " +
                    (opt.partition.empty() ? "--solver " + opt.solver : std::string("--partition")) + ")");
}

/// --stages K above the R profile rows of a results file: the mean row when the R ranks ran on
/// devices of one name (identical devices), else a UserError saying why and what to do.
void widen_results_rows(BalanceProblem& p, const std::string& path, const std::string& objective, int stages) {
  const RunRecord run = read_run(path);
  std::vector<std::string> device_name;
  for (const RankInfo& k : run.ranks) device_name.push_back(k.device_name);
  const int R = static_cast<int>(p.cost.size());
  const bool identical = !device_name.empty() &&
                         std::all_of(device_name.begin(), device_name.end(),
                                     [&](const std::string& n) { return n == device_name[0]; });
  if (!identical) {
    std::string names;
    for (const auto& n : device_name) names += (names.empty() ? "" : ", ") + n;
    throw UserError("--stages " + std::to_string(stages) + ": results file '" + path + "' has one profile row per rank (" +
                    std::to_string(R) + " ranks" + (names.empty() ? "" : ": " + names) +
                    ") and K stages need K device rows, or ranks on identical devices (one device name; their mean "
                    "row is then used for any K); use --stages <= " + std::to_string(R) + ", run `ppbench run` on " +
                    std::to_string(stages) + " ranks, or write a latency JSON (docs/OFFLINE.md) with one row per device");
  }
  std::vector<double> mean(p.units(), 0.0);
  for (const auto& row : p.cost)
    for (int u = 0; u < p.units(); ++u) mean[u] += row[u] / R;
  p.cost = {mean};
  if (!p.stage_fixed_ms.empty()) {  // the ranks' fixed costs likewise
    double f = 0.0;
    for (double x : p.stage_fixed_ms) f += x / R;
    p.stage_fixed_ms = {f};
  }
  p.device_row.assign(stages, 0);
  // K hypothetical devices have no measured links between them: the one link serves them all.
  p.pair_bandwidth_GBps.clear();
  p.pair_latency_us.clear();
  // Every stage gets the smallest of the ranks' memory limits (the identical devices' share).
  if (!p.device_memory_bytes.empty())
    p.device_memory_bytes.assign(stages, *std::min_element(p.device_memory_bytes.begin(), p.device_memory_bytes.end()));
  std::cerr << "ppbench balance: note: the " << R << " ranks of '" << path << "' ran on identical devices ("
            << device_name[0] << "): " << stages << " stages use the mean of their " << R << " profile rows ("
            << objective << ")" << std::endl;
}

}  // namespace

namespace {

/// The groups a layout of `devices` devices like the file's may use: every run of w consecutive
/// devices for w = 1 and each width the file profiled (/profile/tp), with the cost row of rank
/// 0 (w = 1) or of the first profiled group of that width (w > 1), and w x rank 0's memory.
std::vector<balance::GroupCandidate> offline_groups(const RunRecord& run, const BalanceProblem& p, balance::Objective o,
                                                   int devices) {
  // `devices` copies of rank 0 (one class, its row and memory), with one profile per width.
  BalanceProblem like = p;
  like.device_row.assign(devices, p.row_of(0));
  if (!p.device_memory_bytes.empty()) like.device_memory_bytes.assign(devices, p.device_memory_bytes[0]);
  RunRecord first;  // what layout_candidates reads: the width profiles and G
  first.workload.gen_len = run.workload.gen_len;
  std::vector<int> widths = {1};
  for (const auto& g : run.profile.tp) {
    if (std::find(widths.begin(), widths.end(), g.width) != widths.end()) continue;
    widths.push_back(g.width);
    first.profile.tp.push_back(g);
    first.profile.tp.back().first_rank = 0;
  }
  return balance::layout_candidates(first, like, o, std::vector<int>(devices, 0), widths);
}

std::string layout_text(const balance::Partition& part) {
  std::string s;
  for (int k = 0; k < part.num_stages(); ++k) {
    s += (k ? ", " : "") + std::string("stage ") + std::to_string(k) + ": " + std::to_string(part.units_in(k)) +
         " units on " + std::to_string(part.width(k)) + (part.width(k) == 1 ? " device" : " devices");
  }
  return s;
}

/// `ppbench balance FILE.h5 --tp auto [--devices N]` (issue 14): the best layout (widths and
/// split, balance::solve_layout) on N devices like the file's, the best on the file's R, and
/// what the difference buys: the source article's question "one more device: widen the
/// bottleneck stage, or add a stage?".
int layout_command(const BalanceOptions& opt) {
  if (opt.tp != "auto") throw UserError("--tp '" + opt.tp + "': `ppbench balance` takes --tp auto (choose the widths)");
  if (!is_hdf5(opt.input))
    throw UserError("--tp auto needs a results file with a profile at several widths (/profile/tp: `ppbench run --tp "
                    "1 --tp 2` or --tp auto); " + opt.input + " is not one");
  if (opt.stages > 0 || !opt.partition.empty() || opt.order != "rank" || opt.solver != "auto" ||
      !opt.uniform_remainder.empty())
    throw UserError("--tp auto chooses the stages, widths and split itself: drop --stages, --partition, --order, "
                    "--solver and --uniform-remainder");
  if (opt.memory_limit_gib < 0 || !(opt.memory_limit_gib <= 1048576.0))
    throw UserError("--memory-limit must be >= 0 and <= 1048576 GiB (2^50 bytes); 0 = from the input");
  check_json_out(opt.json_out, opt.input, opt.force);
  const RunRecord run = read_run(opt.input);
  if (run.profile.tp.empty())
    throw UserError(opt.input + " has no profile at a tensor-parallel width (/profile/tp); profile one with "
                    "`ppbench run --tp 1 --tp 2` (or --tp auto)");
  const std::string objective = opt.objective.empty() ? run_objective(run) : opt.objective;
  const balance::Objective o = balance::parse_objective(objective);
  BalanceProblem p = balance::problem_from_run(run, o);
  const std::vector<int> classes = balance::rank_device_classes(run.ranks);
  if (std::any_of(classes.begin(), classes.end(), [&](int c) { return c != classes[0]; }))
    throw UserError("--tp auto --devices N assumes N devices like the profiled ones, but " + opt.input +
                    "'s ranks are different devices (/ranks: hostname, device, CPU quota, threads)");
  if (opt.memory_limit_gib > 0)
    p.device_memory_bytes.assign(p.devices(), static_cast<int64_t>(opt.memory_limit_gib * (1ull << 30)));
  if (opt.link_bandwidth_GBps >= 0) p.link_bandwidth_GBps = opt.link_bandwidth_GBps;
  if (opt.link_latency_us >= 0) p.link_latency_us = opt.link_latency_us;
  if (opt.no_overlap) p.overlap = false;
  const int R = static_cast<int>(run.ranks.size());
  const int N = opt.devices > 0 ? opt.devices : R;
  if (N > p.units() * 64) throw UserError("--devices " + std::to_string(N) + " is more than the model can use");
  const balance::Partition here = balance::solve_layout(p, offline_groups(run, p, o, R), R);
  const balance::Partition there = balance::solve_layout(p, offline_groups(run, p, o, N), N);
  auto describe = [&](const balance::Partition& part, int devices) {
    std::cout << devices << " device(s): --tp " << balance::layout_label(part.tp_width) << ", split "
              << part.counts_string() << " (" << layout_text(part) << "); bottleneck " << sig(part.bottleneck_ms)
              << " ms, spread " << sig(part.spread_ms) << " ms\n";
  };
  std::cout << "balance --tp auto: " << p.units() << " units, objective " << objective << ", widths profiled: 1";
  for (const auto& g : run.profile.tp) std::cout << ", " << g.width;
  std::cout << "; devices like rank 0 of " << opt.input << "\n";
  describe(here, R);
  if (N != R) {
    describe(there, N);
    const double gain = here.bottleneck_ms / there.bottleneck_ms;
    std::string where;
    if (there.bottleneck_ms >= here.bottleneck_ms) {
      where = "nothing: no layout of " + std::to_string(N) + " devices has a smaller bottleneck";
    } else if (there.num_stages() == here.num_stages() && N > R) {
      for (int k = 0; k < there.num_stages(); ++k)
        if (there.width(k) > here.width(k))
          where += (where.empty() ? "" : "; ") + std::string("widen stage ") + std::to_string(k) + " from " +
                   std::to_string(here.width(k)) + " to " + std::to_string(there.width(k)) + " devices";
    } else if (there.num_stages() > here.num_stages()) {
      where = "add " + std::to_string(there.num_stages() - here.num_stages()) + " stage(s)";
    } else {
      where = "re-lay the pipeline as above";
    }
    std::cout << "going from " << R << " to " << N << " devices: predicted gain " << sig(gain) << "x (bottleneck "
              << sig(here.bottleneck_ms) << " -> " << sig(there.bottleneck_ms) << " ms): " << where << "\n";
  }
  if (!opt.json_out.empty()) {
    auto to_json = [](const balance::Partition& part) {
      json j = layout_json(part, part.tp_width);
      j["bottleneck_ms"] = part.bottleneck_ms;
      j["spread_ms"] = part.spread_ms;
      return j;
    };
    json out;
    out["objective"] = objective;
    out["devices"] = N;
    out["layout"] = to_json(there);
    out["file_ranks"] = R;
    out["layout_on_file_ranks"] = to_json(here);
    out["predicted_gain"] = here.bottleneck_ms / there.bottleneck_ms;
    write_json_file(opt.json_out, out);
  }
  return 0;
}

}  // namespace

int describe_command(const DescribeOptions& opt) {
  const DType dtype = parse_dtype(opt.dtype);  // UserError naming --dtype
  if (opt.context < 1 || opt.context > (1 << 24))
    throw UserError("--context must be in [1, 16777216] attended positions, got " + std::to_string(opt.context));
  if (!opt.json_out.empty()) check_json_out(opt.json_out, opt.model, opt.force);
  const model::ModelSpec m = model::load_model_config(opt.model);
  const int bytes = static_cast<int>(dtype_bytes(dtype));
  const int U = m.num_units();
  json units = json::array();
  int64_t weight_total = 0, kv_total = 0;
  std::printf("%s: %s, %d layers, hidden %d, vocab %d; %d units in %zu signatures; dtype %s; FLOPs of one token's "
              "decode step at %d attended positions\n",
              opt.model.c_str(), m.architecture.c_str(), m.n_layers, m.hidden, m.vocab, U, m.signatures.size(),
              dtype_name(dtype).c_str(), opt.context);
  std::printf("%-5s %-12s %-14s %15s %15s %12s %14s %14s\n", "unit", "name", "signature", "params", "active params",
              "weights GiB", "KV B/token", "GFLOP/token");
  for (int u = 0; u < U; ++u) {
    const model::Unit& unit = m.units[u];
    const int64_t params = model::unit_params(m, u);
    const int64_t active = model::unit_active_params(m, u);
    const int64_t weights = model::unit_resident_params(m, u) * bytes;
    const int64_t kv = model::kv_bytes_per_token(m, u, bytes);
    const double flops = model::unit_flops(m, u, model::Phase::decode, 1, 1, opt.context);
    weight_total += weights;
    kv_total += kv;
    std::printf("%-5d %-12s %-14s %15lld %15lld %12s %14lld %14.4f\n", u, unit.name.c_str(),
                m.signatures[unit.signature].c_str(), static_cast<long long>(params), static_cast<long long>(active),
                gib(weights).c_str(), static_cast<long long>(kv), flops / 1e9);
    units.push_back({{"name", unit.name},
                     {"kind", unit.kind == model::UnitKind::embed ? "embed" : unit.kind == model::UnitKind::head ? "head" : "layer"},
                     {"signature", m.signatures[unit.signature]},
                     {"params", params},
                     {"active_params", active},
                     {"weight_bytes", weights},
                     {"kv_bytes_per_token", kv},
                     {"flops_per_token", flops}});
  }
  const int64_t total = model::total_params(m), active = model::active_params(m), mtp = model::mtp_params(m);
  // Layers by kind, e.g. "3 dense + 58 MoE (256 experts, top 8, 1 shared)".
  int n_moe = 0;
  const model::LayerShape* moe_shape = nullptr;
  for (const model::LayerShape& l : m.layers)
    if (l.is_moe()) {
      ++n_moe;
      moe_shape = &l;
    }
  if (moe_shape != nullptr)
    std::printf("layers: %d dense + %d mixture-of-experts (%d routed experts of width %d, top %d, %d shared)%s\n",
                m.n_layers - n_moe, n_moe, moe_shape->moe.n_experts, moe_shape->moe.expert_intermediate,
                moe_shape->moe.top_k, moe_shape->moe.n_shared,
                m.layers.back().is_mla() ? "; multi-head latent attention" : "");
  if (mtp > 0)
    std::printf("multi-token prediction: %d module(s), %lld parameters (counted in the total; the model without "
                "them: %lld); run with the head under --mtp\n",
                m.mtp_modules, static_cast<long long>(mtp), static_cast<long long>(total - mtp));
  std::printf("total: %lld parameters (%.3f B); active per token %lld (%.3f B: what one token's forward multiplies "
              "by, the embedding table aside); weights %s GiB resident over the units (a tied head holds its own "
              "copy on its stage); KV cache %lld bytes per token and sequence\n",
              static_cast<long long>(total), total / 1e9, static_cast<long long>(active), active / 1e9,
              gib(weight_total).c_str(), static_cast<long long>(kv_total));
  if (!opt.json_out.empty()) {
    json out;
    out["model"] = opt.model;
    out["architecture"] = m.architecture;
    out["dtype"] = dtype_name(dtype);
    out["context"] = opt.context;
    out["total_params"] = total;
    out["active_params"] = active;  // per token, without the embedding table (model_spec.h)
    out["mtp_params"] = mtp;
    out["weight_bytes"] = weight_total;
    out["kv_bytes_per_token"] = kv_total;
    out["units"] = units;
    write_json_file(opt.json_out, out);
  }
  return 0;
}

namespace {

/// The problem `balance` solves: the input's, its rows widened to `stages` identical devices
/// where it has one row (or a results file of identical ranks), with --memory-limit, --link-*
/// and --no-overlap applied and checked.
BalanceProblem balance_problem(const BalanceOptions& opt, bool results, const std::string& objective, int& stages) {
  BalanceProblem p = load_balance_problem(opt.input, results ? objective : "workload");
  // One latency row means identical devices: one device per stage, all of that row.
  stages = opt.stages > 0 ? opt.stages : p.devices();
  if (p.cost.size() > 1 && p.device_row.empty() && stages > static_cast<int>(p.cost.size()) && stages <= p.units() &&
      results)
    widen_results_rows(p, opt.input, objective, stages);
  if (p.cost.size() == 1 && p.device_row.empty() && stages > 1) {
    p.device_row.assign(stages, 0);
    if (p.device_memory_bytes.size() == 1) p.device_memory_bytes.assign(stages, p.device_memory_bytes[0]);
  }
  if (opt.memory_limit_gib > 0)
    p.device_memory_bytes.assign(p.devices(), static_cast<int64_t>(opt.memory_limit_gib * (1ull << 30)));
  if (opt.link_bandwidth_GBps >= 0) p.link_bandwidth_GBps = opt.link_bandwidth_GBps;
  if (opt.link_latency_us >= 0) p.link_latency_us = opt.link_latency_us;
  if (opt.link_bandwidth_GBps >= 0 || opt.link_latency_us >= 0) {
    // The override is the link of every boundary, as `simulate` applies it: not the run's pairs.
    p.pair_bandwidth_GBps.clear();
    p.pair_latency_us.clear();
  }
  if (opt.no_overlap) p.overlap = false;
  try {
    balance::validate_problem(p);
  } catch (const UserError& e) {
    throw UserError(std::string(e.what()) + " (with --link-bandwidth/--link-latency/--memory-limit applied)");
  }
  balance::rank_order(p, stages);  // UserError when stages do not fit the units or the devices
  return p;
}

/// --solver: auto | dp | fast (the exact solver, Method::balanced) | uniform | seed, or
/// --partition's manual split, on `stages` stages.
balance::SplitRequest balance_request(const BalanceOptions& opt, int stages) {
  balance::SplitRequest req;
  req.stages = stages;
  req.method = !opt.partition.empty()    ? balance::Method::manual
               : opt.solver == "uniform" ? balance::Method::uniform
               : opt.solver == "seed"    ? balance::Method::seed
                                         : balance::Method::balanced;
  req.manual = opt.partition;
  req.kind = opt.solver == "dp" ? balance::SolverKind::dp
             : opt.solver == "fast" ? balance::SolverKind::fast : balance::SolverKind::automatic;
  req.order = opt.order == "auto" ? balance::OrderMode::automatic : balance::OrderMode::rank;
  req.remainder = balance::parse_uniform_remainder(opt.uniform_remainder.empty() ? "first" : opt.uniform_remainder);
  return req;
}

/// The constraints the split was solved under, so a result can be read without the input.
void print_constraints(const BalanceOptions& opt, const BalanceProblem& p, bool results) {
  auto g = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4g", v);
    return std::string(b);
  };
  auto bytes = [&](int64_t b) { return b < (int64_t(1) << 20) ? std::to_string(b) + " B" : g(b / 1073741824.0) + " GiB"; };
  std::string memory = "unlimited";
  if (!p.device_memory_bytes.empty()) {
    const auto [lo, hi] = std::minmax_element(p.device_memory_bytes.begin(), p.device_memory_bytes.end());
    memory = *lo == *hi ? bytes(*lo) : bytes(*lo) + ".." + bytes(*hi);
    if (*lo == 0) memory = "unlimited (0)";
  }
  std::string link = "free";
  if (results && opt.link_bandwidth_GBps < 0 && opt.link_latency_us < 0 && p.link_bandwidth_GBps == 0 && p.link_latency_us == 0)
    link = "free (none measured: 1-rank run)";
  else if (p.link_bandwidth_GBps > 0 || p.link_latency_us > 0)
    link = g(p.link_latency_us) + " us + bytes / " + (p.link_bandwidth_GBps > 0 ? g(p.link_bandwidth_GBps) + " GB/s" : "inf");
  std::cout << "constraints: memory per device " << memory << "; link " << link << "\n";
}

/// The split's table (stage, units, device, count, predicted ms, memory GiB) and its line.
void print_split(const BalanceProblem& p, const balance::Partition& part, const std::vector<int64_t>& mem) {
  const int stages = part.num_stages();
  auto name = [&](int u) { return u < static_cast<int>(p.unit_names.size()) ? p.unit_names[u] : std::to_string(u); };
  // The units column as wide as its longest entry ("13..24 (layer.12..layer.23)").
  std::vector<std::string> units(stages);
  int w_units = 26;
  for (int k = 0; k < stages; ++k) {
    const int a = part.first_unit[k], z = part.last_unit[k];
    units[k] = a == z ? std::to_string(a) + " (" + name(a) + ")"
                      : std::to_string(a) + ".." + std::to_string(z) + " (" + name(a) + ".." + name(z) + ")";
    w_units = std::max(w_units, static_cast<int>(units[k].size()));
  }
  std::printf("%-5s %-*s %-6s %6s %13s %11s\n", "stage", w_units, "units", "device", "count", "predicted ms", "memory GiB");
  for (int k = 0; k < stages; ++k)
    std::printf("%-5d %-*s %-6d %6d %13s %11s\n", k, w_units, units[k].c_str(), part.device_rank[k], part.units_in(k),
                sig(part.predicted_stage_ms[k]).c_str(), gib(mem[k]).c_str());
  std::printf("split %s: bottleneck %s ms, spread %s ms\n", part.counts_string().c_str(), sig(part.bottleneck_ms).c_str(),
              sig(part.spread_ms).c_str());
}

/// [S] each stage's device memory (0 = unlimited); prints a warning for every stage that does
/// not fit it (a manual, uniform or seed split is evaluated as given). Returns whether all fit.
bool check_split_memory(const BalanceProblem& p, const balance::Partition& part, const std::vector<int64_t>& mem,
                        std::vector<int64_t>& limit) {
  const int stages = part.num_stages();
  limit.assign(stages, 0);
  bool fits = true;
  for (int k = 0; k < stages; ++k) {
    const int d = part.device_rank[k];
    if (d >= 0 && d < static_cast<int>(p.device_memory_bytes.size())) limit[k] = std::max<int64_t>(0, p.device_memory_bytes[d]);
    if (limit[k] > 0 && mem[k] > limit[k]) {
      fits = false;
      auto size = [](int64_t v) {
        char buf[64];
        if (v < (int64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(v));
        else std::snprintf(buf, sizeof buf, "%.4g GiB (%lld bytes)", v / 1073741824.0, static_cast<long long>(v));
        return std::string(buf);
      };
      std::printf("warning: stage %d needs %s of weights + KV cache but device %d holds %s: this split does not fit "
                  "memory\n", k, size(mem[k]).c_str(), d, size(limit[k]).c_str());
    }
  }
  return fits;
}

}  // namespace

int balance_command(const BalanceOptions& opt) {
  if (!opt.tp.empty()) return layout_command(opt);
  if (opt.devices > 0) throw UserError("--devices goes with --tp auto (for --stages K, the stages are the devices)");
  check_balance_flags(opt);
  if (opt.memory_limit_gib < 0 || !(opt.memory_limit_gib <= 1048576.0))
    throw UserError("--memory-limit must be >= 0 and <= 1048576 GiB (2^50 bytes); 0 = from the input");
  const bool results = is_hdf5(opt.input);
  if (!opt.objective.empty() && !results)
    throw UserError("--objective " + opt.objective + " combines the prefill and decode profile of a results file; a "
                    "latency JSON gives one cost per unit already (latency_ms): drop --objective");
  check_json_out(opt.json_out, opt.input, opt.force);
  // Results files: the run's objective unless --objective is given.
  const std::string objective =
      !results ? std::string() : opt.objective.empty() ? run_objective(read_run(opt.input)) : opt.objective;
  int stages = 0;
  const BalanceProblem p = balance_problem(opt, results, objective, stages);
  const balance::Partition part = balance::make_split(p, balance_request(opt, stages));
  const auto mem = balance::stage_memory_bytes(p, part);
  std::cout << "balance: " << p.units() << " units on " << stages << " stages, "
            << (results ? "objective " + objective + (opt.objective.empty() ? " (the run's)" : "") + ", " : std::string())
            << "solver " << part.solver << (part.algorithm.empty() ? "" : " (" + part.algorithm + ")") << ", "
            << (p.overlap ? "overlap" : "no overlap") << "\n";
  print_constraints(opt, p, results);
  print_split(p, part, mem);
  std::vector<int64_t> limit;
  const bool fits = check_split_memory(p, part, mem, limit);
  std::cout.flush();
  if (opt.json_out.empty()) return 0;
  json out;
  out["stages"] = json::array();
  for (int k = 0; k < stages; ++k)
    out["stages"].push_back({{"first_unit", part.first_unit[k]},
                             {"last_unit", part.last_unit[k]},
                             {"device", part.device_rank[k]},
                             {"predicted_ms", part.predicted_stage_ms[k]},
                             {"memory_bytes", mem[k]},
                             {"memory_limit_bytes", limit[k]}});
  out["bottleneck_ms"] = part.bottleneck_ms;
  out["spread_ms"] = part.spread_ms;
  out["solver"] = part.solver;
  out["algorithm"] = part.algorithm;
  out["counts"] = part.counts_string();
  out["overlap"] = p.overlap;
  out["fits_memory"] = fits;
  if (results) out["objective"] = objective;
  write_json_file(opt.json_out, out);
  return 0;
}

}  // namespace ppb