#include "app/offline_commands.h"

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

/// Parses the JSON file `path`, refusing a key given twice in one object (nlohmann keeps the
/// last silently: a second "device_memory_bytes" would drop the first without a word).
json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UserError("input '" + path + "' cannot be opened");
  std::vector<std::set<std::string>> seen;  // keys of each open object, innermost last
  std::vector<std::string> where;           // the key path of the open objects, for the message
  std::string pending_key;
  const json::parser_callback_t track = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        where.push_back(pending_key);
        seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!seen.empty()) seen.pop_back();
        if (!where.empty()) {
          pending_key = where.back();  // a sibling object in the same list has the same name
          where.pop_back();
        }
        break;
      case json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        if (!seen.empty() && !seen.back().insert(key).second) {
          std::string in;
          for (const auto& w : where)
            if (!w.empty()) in += (in.empty() ? "" : ".") + w;
          throw UserError("input '" + path + "': duplicate key '" + key + "'" +
                          (in.empty() ? std::string(" at the top level") : " in '" + in + "'") +
                          "; give each key once (JSON parsers disagree on which copy counts)");
        }
        pending_key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(f, track);
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

constexpr double kMaxMs = 1e12;                  ///< per unit / stage step / transfer (as validate_problem)
constexpr double kMaxBytes = 1125899906842624.0;  ///< 2^50 bytes (1 PiB) per unit, boundary or device
/// Simulated steps M x (G+1) x S: each takes ~0.5 KB in the simulator (events, lane programme).
constexpr double kMaxSimSteps = 2097152;         ///< 2^21: ~1 GB, ~1 s

/// "%.<prec>f" for ordinary values, "%.6g" for huge ones (no 200-digit numbers), "inf"/"nan".
/// `v` to 6 significant digits ("30953.6", "4.2", "0.00123457", "2e+11"): times whose scale the
/// input decides (a latency JSON may hold microseconds or hours).
std::string sig(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string num(double v, int prec) {
  char buf[64];
  if (std::isfinite(v) && std::fabs(v) < 1e9) std::snprintf(buf, sizeof(buf), "%.*f", prec, v);
  else std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

/// Refuses any key of object `j` not in `valid` ("where": "top level" or "stages[2]").
void check_keys(const json& j, std::initializer_list<const char*> valid, const std::string& path,
                const std::string& where) {
  for (const auto& [key, value] : j.items()) {
    if (std::any_of(valid.begin(), valid.end(), [&](const char* v) { return key == v; })) continue;
    std::string list;
    for (const char* v : valid) list += (list.empty() ? "" : ", ") + std::string(v);
    throw UserError("input '" + path + "': unknown key '" + key + "' (" + where + "); valid keys: " + list +
                    " (docs/OFFLINE.md)");
  }
}

/// A number of `j` (named `name` in messages) that must be finite and in [0, max].
double bounded(const json& v, const std::string& name, const std::string& path, double max, const char* unit) {
  char range[128];
  if (max == kMaxBytes) std::snprintf(range, sizeof(range), "a number >= 0 and <= 2^50 = 1125899906842624 (%s)", unit);
  else std::snprintf(range, sizeof(range), "a number >= 0 and <= %g (%s)", max, unit);
  const bool ok = v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0 && v.get<double>() <= max;
  if (!ok) throw UserError("input '" + path + "': " + name + " is " + v.dump() + "; must be " + range);
  return v.get<double>();
}

/// A whole number of bytes in [0, 2^50].
int64_t bytes_value(const json& v, const std::string& name, const std::string& path, const char* unit = "bytes") {
  const double x = bounded(v, name, path, kMaxBytes, unit);
  if (x != std::floor(x)) throw UserError("input '" + path + "': " + name + " is " + v.dump() + "; must be a whole number of bytes");
  return static_cast<int64_t>(x);
}

/// Field `key` of `j`: a list of whole byte counts (one per unit).
std::vector<int64_t> bytes_list(const json& j, const std::string& key, const std::string& path,
                                const char* unit = "bytes") {
  const json& v = j.at(key);
  if (!v.is_array()) throw UserError("input '" + path + "': field '" + key + "' must be a list of byte counts (one per unit)");
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(bytes_value(v[i], key + "[" + std::to_string(i) + "]", path, unit));
  return out;
}

/// A positive integer (>= 1) field of the stage JSON of simulate.
int positive_int(const json& j, const std::string& key, const std::string& path, int fallback) {
  if (!j.contains(key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1000000000)
    throw UserError("input '" + path + "': field '" + key + "' is " + v.dump() + "; must be an integer >= 1");
  return static_cast<int>(v.get<long long>());
}



std::string gib(int64_t b) { return num(static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0), 3); }

/// The run of results file `path` (results/reader: refuses a missing, non-ppbench, newer-format
/// or incomplete file, naming it), checked to hold a profile.
RunRecord read_run(const std::string& path) {
  RunRecord run = read_results(path);
  if (run.profile.unit_name.empty() || run.profile.latency_ms.empty())
    throw UserError("results file '" + path + "' has no profile (/profile/latency_ms); is it a complete ppbench run?");
  return run;
}

/// The objective of `run` (/config/workload attribute objective; "workload" when absent).
std::string run_objective(const RunRecord& run) {
  return run.workload.objective.empty() ? std::string("workload") : run.workload.objective;
}

/// Checks --json FILE before anything is printed: never the input, an existing file only with
/// --force, not a directory, and in a writable directory.
void check_json_out(const std::string& out, const std::string& input, bool force) {
  if (out.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(out);
  if (fs::is_directory(p, ec))
    throw UserError("--json '" + out + "' is a directory; give a file path, e.g. " + (p / "out.json").string());
  if (fs::exists(p, ec)) {
    if (fs::exists(input, ec) && fs::equivalent(p, fs::path(input), ec))
      throw UserError("--json '" + out + "' is the input file '" + input + "'; give another file for the JSON output");
    if (!force) throw UserError("--json '" + out + "' exists; give --force to overwrite it, or another file");
    if (::access(out.c_str(), W_OK) != 0)
      throw UserError("--json '" + out + "' cannot be written: " + std::strerror(errno));
    return;
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw UserError("--json '" + out + "': directory '" + dir.string() + "' does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    throw UserError("--json '" + out + "': directory '" + dir.string() + "' is not writable: " + std::strerror(errno));
}

void write_json_file(const std::string& path, const json& j) {
  std::ofstream f(path);
  if (!f) throw UserError("--json '" + path + "' cannot be written: " + std::strerror(errno));
  f << j.dump(2) << "\n";
  if (!f) throw UserError("--json '" + path + "': write failed");
}

}  // namespace

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
             {"units", "latency_ms", "weight_bytes", "kv_bytes", "device_memory_bytes", "activation_bytes",
              "link_bandwidth_GBps", "link_latency_us", "overlap"},
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
      json j;
      j["tp_width"] = part.tp_width;
      j["first_unit"] = part.first_unit;
      j["last_unit"] = part.last_unit;
      j["first_device"] = part.device_rank;
      j["predicted_stage_ms"] = part.predicted_stage_ms;
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
  BalanceProblem p = load_balance_problem(opt.input, results ? objective : "workload");
  // One latency row means identical devices: one device per stage, all of that row.
  const int stages = opt.stages > 0 ? opt.stages : p.devices();
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
  const int U = p.units();
  balance::rank_order(p, stages);  // UserError when stages do not fit the units or the devices

  // --solver: auto | dp | fast (the exact solver, Method::balanced) | uniform | seed.
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
  balance::Partition part = balance::make_split(p, req);
  const auto mem = balance::stage_memory_bytes(p, part);

  auto name = [&](int u) { return u < static_cast<int>(p.unit_names.size()) ? p.unit_names[u] : std::to_string(u); };
  std::cout << "balance: " << U << " units on " << stages << " stages, "
            << (results ? "objective " + objective + (opt.objective.empty() ? " (the run's)" : "") + ", " : std::string())
            << "solver " << part.solver
            << (part.algorithm.empty() ? "" : " (" + part.algorithm + ")") << ", "
            << (p.overlap ? "overlap" : "no overlap") << "\n";
  {
    // The constraints the split was solved under, so a result can be read without the input.
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
    if (results && opt.link_bandwidth_GBps < 0 && opt.link_latency_us < 0 && p.link_bandwidth_GBps == 0 &&
        p.link_latency_us == 0)
      link = "free (none measured: 1-rank run)";
    else if (p.link_bandwidth_GBps > 0 || p.link_latency_us > 0)
      link = g(p.link_latency_us) + " us + bytes / " + (p.link_bandwidth_GBps > 0 ? g(p.link_bandwidth_GBps) + " GB/s" : "inf");
    std::cout << "constraints: memory per device " << memory << "; link " << link << "\n";
  }
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
  // A manual, uniform or seed split is evaluated as given: say when a stage exceeds its device's memory.
  std::vector<int64_t> limit(stages, 0);
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
  std::cout.flush();

  if (!opt.json_out.empty()) {
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
  }
  return 0;
}

namespace {

/// one_decode_step: M x G = 1, so no time lies between a first and a last decode token and decode
/// tokens/s is undefined (null in JSON, "n/a" printed).
json metrics_json(const PartitionMetrics& m, bool one_decode_step) {
  return {{"tokens_per_s", m.tokens_per_s},
          {"decode_tokens_per_s", one_decode_step ? json(nullptr) : json(m.decode_tokens_per_s)},
          {"ttft_p50_ms", m.ttft_p50_ms},     {"ttft_p99_ms", m.ttft_p99_ms},
          {"tpot_p50_ms", m.tpot_p50_ms},     {"tpot_p99_ms", m.tpot_p99_ms},
          {"bubble_fraction", m.bubble_fraction}, {"bottleneck_bound_tok_s", m.bottleneck_bound_tok_s}};
}

void print_metrics(const std::string& label, const PartitionMetrics& m, bool one_decode_step) {
  std::printf("  %-26s tokens/s %10s  decode tokens/s %10s  TTFT p50 %9s ms  TPOT p50 %9s ms  bubble", label.c_str(),
              num(m.tokens_per_s, 2).c_str(),
              one_decode_step ? "n/a (one decode step)" : num(m.decode_tokens_per_s, 2).c_str(), sig(m.ttft_p50_ms).c_str(),
              sig(m.tpot_p50_ms).c_str());
  for (double b : m.bubble_fraction) std::printf(" %.3f", b);
  std::printf("\n");
}

/// Refuses a simulation whose timeline would not fit memory (~0.5 KB per simulated step).
void check_sim_size(const balance::SimConfig& cfg, std::size_t stages) {
  const double steps = static_cast<double>(cfg.groups) * (static_cast<double>(cfg.gen_len) + 1) * static_cast<double>(stages);
  if (steps > kMaxSimSteps)
    throw UserError("-M/--microbatches " + std::to_string(cfg.groups) + " x (-g/--gen-len " + std::to_string(cfg.gen_len) +
                    " + 1) x " + std::to_string(stages) + " stages = " + num(steps, 0) +
                    " simulated steps; at most " + num(kMaxSimSteps, 0) +
                    " (~0.5 KB of memory each): lower -M or -g (the input's microbatches/gen_len when not given)");
}

/// Stage times of the stage JSON: finite, >= 0, <= 1e12 ms; a stage needs prefill_ms and decode_ms.
std::vector<balance::SimStage> read_sim_stages(const json& j, const std::string& path) {
  std::vector<balance::SimStage> st;
  double total = 0;
  for (std::size_t k = 0; k < j["stages"].size(); ++k) {
    const json& s = j["stages"][k];
    const std::string where = "stages[" + std::to_string(k) + "]";
    if (!s.is_object()) throw UserError("input '" + path + "': " + where + " must be an object {\"prefill_ms\", \"decode_ms\", ...}");
    check_keys(s, {"prefill_ms", "decode_ms", "send_prefill_ms", "send_decode_ms"}, path, where);
    for (const char* key : {"prefill_ms", "decode_ms"})
      if (!s.contains(key)) throw UserError("input '" + path + "': " + where + "." + key + " is missing (ms per step; every stage needs prefill_ms and decode_ms)");
    auto ms = [&](const char* key) { return s.contains(key) ? bounded(s[key], where + "." + key, path, kMaxMs, "ms") : 0.0; };
    balance::SimStage x;
    x.prefill_ms = ms("prefill_ms");
    x.decode_ms = ms("decode_ms");
    x.send_prefill_ms = ms("send_prefill_ms");
    x.send_decode_ms = ms("send_decode_ms");
    total += x.decode_ms + x.send_decode_ms;
    st.push_back(x);
  }
  // All-zero decode steps: every token leaves at once, tokens/s would be inf or NaN.
  if (!(total > 0))
    throw UserError("input '" + path + "': every stage has decode_ms = send_decode_ms = 0; at least one decode time must be > 0 "
                    "(a decode step that takes no time gives no meaningful tokens/s)");
  return st;
}

/// `simulate` of a stage JSON (per-stage step and transfer times): prints the prediction and
/// fills `out`. cfg.eager_sends is set; the workload comes from the flags or the JSON.
void simulate_stage_json(const SimulateOptions& opt, balance::SimConfig& cfg, json& out) {
  const json j = read_json(opt.input);
  if (!j.is_object() || !j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
    throw UserError("input '" + opt.input + "': field 'stages' must be a non-empty list of {\"prefill_ms\", \"decode_ms\"[, \"send_prefill_ms\", \"send_decode_ms\"]}");
  check_keys(j, {"stages", "microbatches", "gen_len", "batch", "overlap"}, opt.input, "top level");
  const std::vector<balance::SimStage> st = read_sim_stages(j, opt.input);
  cfg.groups = opt.microbatches > 0 ? opt.microbatches : positive_int(j, "microbatches", opt.input, 1);
  cfg.gen_len = opt.gen_len > 0 ? opt.gen_len : positive_int(j, "gen_len", opt.input, 1);
  cfg.batch = opt.batch > 0 ? opt.batch : positive_int(j, "batch", opt.input, 1);
  const bool overlap = j.contains("overlap") ? field<bool>(j, "overlap", opt.input, "true or false") : true;
  cfg.overlap = !opt.no_overlap && overlap;
  check_sim_size(cfg, st.size());
  const auto r = balance::simulate_pipeline(st, cfg);
  std::printf("simulate: %zu stages, M=%d G=%d B=%d, %s\n", st.size(), cfg.groups, cfg.gen_len, cfg.batch,
              cfg.overlap ? "overlap" : "no overlap");
  const bool one_step = static_cast<long long>(cfg.groups) * cfg.gen_len == 1;
  print_metrics("predicted", r.metrics, one_step);
  out["predicted"] = metrics_json(r.metrics, one_step);
}

/// `simulate` of a results file: per partition (run order, or --partition-name), the prediction
/// from the profile, the replay of the measured steps and the measurement, on the run's link
/// unless --link-* override it; prints them and fills `out`.
void simulate_results_file(const SimulateOptions& opt, balance::SimConfig& cfg, json& out) {
  const RunRecord run = read_run(opt.input);
  const WorkloadInfo& wl = run.workload;  // the run's workload
  const double hidden = run.model_attrs_num.count("hidden_size") ? run.model_attrs_num.at("hidden_size") : 0.0;
  cfg.groups = opt.microbatches > 0 ? opt.microbatches : wl.microbatches;
  cfg.gen_len = opt.gen_len > 0 ? opt.gen_len : wl.gen_len;
  cfg.batch = opt.batch > 0 ? opt.batch : wl.batch;
  cfg.overlap = !opt.no_overlap && wl.overlap;
  // The run's measurements compare only with a simulation of the run's own workload.
  const bool same_workload = cfg.groups == wl.microbatches && cfg.gen_len == wl.gen_len && cfg.batch == wl.batch &&
                             cfg.overlap == wl.overlap;
  char run_workload[96];
  std::snprintf(run_workload, sizeof(run_workload), "M=%d G=%d B=%d%s", wl.microbatches, wl.gen_len, wl.batch,
                wl.overlap ? "" : " no-overlap");
  if (cfg.batch != wl.batch)
    std::cerr << "ppbench simulate: note: -b " << cfg.batch << " differs from the run's B=" << wl.batch
              << ": the simulation uses the step times profiled and measured at B=" << wl.batch
              << " (the step time of a B=" << cfg.batch << " step is not measured); -b scales only the tokens "
              << "per step and the activation bytes" << std::endl;
  if (run.partitions.empty())
    throw UserError("results file '" + opt.input + "' has no partitions (a `ppbench profile` run?): simulate needs a "
                    "run with partitions, or a stage JSON of per-stage step times (docs/OFFLINE.md)");
  std::vector<std::string> names;  // run order (results/reader)
  for (const PartitionRecord& pr : run.partitions) names.push_back(pr.name);
  auto partition = [&](const std::string& name) -> const PartitionRecord& {
    return *std::find_if(run.partitions.begin(), run.partitions.end(),
                         [&](const PartitionRecord& pr) { return pr.name == name; });
  };
  if (!opt.partition_name.empty()) {
    if (std::find(names.begin(), names.end(), opt.partition_name) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw UserError("--partition-name '" + opt.partition_name + "' is not in " + opt.input + " (it has: " + list + ")");
    }
    names = {opt.partition_name};
  }
  // The link: the run's measured one (as its balancer and its stored simulation used) unless
  // --link-bandwidth / --link-latency override it (0 0 = free transfers).
  const double bw_GBps = opt.link_bandwidth_GBps >= 0 ? opt.link_bandwidth_GBps : run.link_bandwidth_Bps / 1e9;
  const double lat_us = opt.link_latency_us >= 0 ? opt.link_latency_us : run.link_latency_s * 1e6;
  // Transfer time of `bytes` over the link.
  auto xfer = [&](double bytes) { return lat_us * 1e-3 + (bw_GBps > 0 ? bytes / (bw_GBps * 1e6) : 0.0); };
  const double act = hidden * balance::dtype_size(wl.dtype) * cfg.batch;
  // Before anything is printed: transfer times and the size of the simulation.
  for (double t : {xfer(act * wl.prompt_len), xfer(4.0 * cfg.batch)})
    if (!(t <= kMaxMs)) {
      char msg[256];
      std::snprintf(msg, sizeof(msg), "--link-bandwidth %g GB/s and --link-latency %g us give a transfer of %g ms; "
                    "at most 1e12 ms: raise the bandwidth or lower the latency", bw_GBps, lat_us, t);
      throw UserError(msg);
    }
  for (const auto& name : names)
    check_sim_size(cfg, partition(name).predicted_phase_ms.size() / 2);
  std::string link = "free";
  if (bw_GBps > 0 || lat_us > 0) {
    char b[96];
    std::snprintf(b, sizeof b, "%.4g us + bytes / ", lat_us);
    link = b;
    if (bw_GBps > 0) {
      std::snprintf(b, sizeof b, "%.4g GB/s", bw_GBps);
      link += b;
    } else {
      link += "inf";
    }
  }
  const bool run_link = opt.link_bandwidth_GBps < 0 && opt.link_latency_us < 0;
  const balance::PairLinks pair_links = balance::node_pair_links(run);
  if (run_link && run.link_bandwidth_Bps == 0 && run.link_latency_s == 0) link += " (none measured: 1-rank run)";
  else if (run_link && !pair_links.latency_s.empty()) link = "each boundary's own (the run's, per pair of nodes)";
  else if (run_link) link += " (the run's)";
  std::printf("simulate: %s, M=%d G=%d B=%d, %s, link %s\n", opt.input.c_str(), cfg.groups, cfg.gen_len, cfg.batch,
              cfg.overlap ? "overlap" : "no overlap", link.c_str());
  if (!same_workload)
    std::printf("  (the run measured %s, not the simulated workload: its measured row is labelled with the run's "
                "workload and not compared with the prediction, which holds only for the run's own M, G, B and "
                "overlap)\n", run_workload);
  for (const auto& name : names) {
    const PartitionRecord& pr = partition(name);
    const std::vector<double>& phase = pr.predicted_phase_ms;
    const int S = static_cast<int>(phase.size() / 2);
    auto stages_from = [&](const std::vector<double>& ph) {
      std::vector<balance::SimStage> st(S);
      for (int s = 0; s < S; ++s) {
        st[s].prefill_ms = ph[2 * s];
        st[s].decode_ms = ph[2 * s + 1];
        const bool last = s == S - 1;
        if (S == 1) continue;  // one stage: no transfer at all (the token stays on its device)
        // The run's own links on several nodes: each boundary's (balance::node_pair_links).
        const auto pair = s < static_cast<int>(pr.device_rank.size()) && run_link
                              ? pair_links.measured(pr.device_rank[s], pr.device_rank[(s + 1) % S], run.ranks.size())
                              : std::nullopt;
        auto send = [&](double bytes) {
          return pair ? balance::link_transfer_ms(pair->first, pair->second, bytes) : xfer(bytes);
        };
        // A sender of a tensor-parallel stage narrower than the next sends one copy per receiver.
        const int copies = s < static_cast<int>(pr.handoff_copies.size()) ? std::max(1, pr.handoff_copies[s]) : 1;
        st[s].send_prefill_ms = copies * (last ? send(4.0 * cfg.batch) : send(act * wl.prompt_len));
        st[s].send_decode_ms = copies * (last ? send(4.0 * cfg.batch) : send(act));
      }
      return st;
    };
    std::printf("partition %s:\n", name.c_str());
    const auto pred = balance::simulate_pipeline(stages_from(phase), cfg);
    const bool one_step = static_cast<long long>(cfg.groups) * cfg.gen_len == 1;
    const bool run_one_step = static_cast<long long>(wl.microbatches) * wl.gen_len == 1;
    print_metrics("predicted (profile)", pred.metrics, one_step);
    json entry{{"predicted", metrics_json(pred.metrics, one_step)}};
    std::optional<PartitionMetrics> cross;
    if (pr.predicted_phase_cross_ms.size() == phase.size()) {
      cross = balance::simulate_pipeline(stages_from(pr.predicted_phase_cross_ms), cfg).metrics;
      print_metrics("cross-calibrated", *cross, one_step);
      entry["cross_calibrated"] = metrics_json(*cross, one_step);
      entry["cross_calibrated_by"] = pr.cross_calibrated_by;
    }
    if (pr.measured && !pr.stage_compute_ms.empty()) {
      // The mean steps where the file has them: a rate follows the mean step, not the median.
      const bool means = pr.stage_compute_mean_ms.size() == pr.stage_compute_ms.size();
      const auto replay = balance::simulate_pipeline(stages_from(means ? pr.stage_compute_mean_ms : pr.stage_compute_ms), cfg);
      print_metrics(means ? "replayed (mean steps)" : "replayed (median steps)", replay.metrics, one_step);
      entry["replayed_steps"] = means ? "mean" : "median";
      auto metric = [&](const char* key) {
        const auto it = pr.metrics.find(key);
        if (it == pr.metrics.end())
          throw UserError("results file '" + opt.input + "': /benchmark/" + name + " lacks attribute " + key);
        return it->second;
      };
      PartitionMetrics meas;
      meas.tokens_per_s = metric("tokens_per_s");
      meas.decode_tokens_per_s = metric("decode_tokens_per_s");
      meas.ttft_p50_ms = metric("ttft_p50_ms");
      meas.tpot_p50_ms = metric("tpot_p50_ms");
      meas.ttft_p99_ms = metric("ttft_p99_ms");
      meas.tpot_p99_ms = metric("tpot_p99_ms");
      meas.bottleneck_bound_tok_s = metric("bottleneck_bound_tok_s");
      meas.bubble_fraction = pr.bubble_fraction;
      entry["replayed"] = metrics_json(replay.metrics, one_step);
      entry["measured"] = metrics_json(meas, run_one_step);
      if (same_workload && one_step) {
        print_metrics("measured", meas, run_one_step);  // no decode tokens/s to compare
      } else if (same_workload) {
        print_metrics("measured", meas, run_one_step);
        const double err = pred.metrics.decode_tokens_per_s / meas.decode_tokens_per_s - 1.0;
        std::printf("  decode tokens/s: predicted / measured - 1 = %+.1f%%  (", 100 * err);
        if (cross) {
          const double cross_err = cross->decode_tokens_per_s / meas.decode_tokens_per_s - 1.0;
          std::printf("cross-calibrated by %s: %+.1f%%; ", pr.cross_calibrated_by.c_str(), 100 * cross_err);
          entry["cross_calibrated_decode_tokens_per_s_error"] = cross_err;
        }
        std::printf("replayed: %+.1f%%)\n", 100 * (replay.metrics.decode_tokens_per_s / meas.decode_tokens_per_s - 1.0));
        entry["decode_tokens_per_s_error"] = err;
      } else {
        print_metrics(std::string("measured (") + run_workload + ")", meas, run_one_step);
      }
    }
    out["partitions"][name] = entry;
  }
  out["link_bandwidth_GBps"] = bw_GBps;
  out["link_latency_us"] = lat_us;
  out["run_workload"] = {{"microbatches", wl.microbatches}, {"gen_len", wl.gen_len}, {"batch", wl.batch},
                         {"overlap", wl.overlap}};
}

}  // namespace

int simulate_command(const SimulateOptions& opt) {
  balance::SimConfig cfg;
  cfg.eager_sends = opt.eager_sends;
  json out;
  const bool results = is_hdf5(opt.input);
  if (!results) {
    // The stage JSON carries the transfer times itself and has no partitions.
    if (opt.link_bandwidth_GBps >= 0 || opt.link_latency_us >= 0)
      throw UserError("--link-bandwidth/--link-latency apply to results files only; a stage JSON gives the transfer "
                      "times itself (stages[].send_prefill_ms, send_decode_ms): drop the flag or edit the JSON");
    if (!opt.partition_name.empty())
      throw UserError("--partition-name applies to results files only; a stage JSON describes one partition: drop it");
  }
  check_json_out(opt.json_out, opt.input, opt.force);
  if (!results) simulate_stage_json(opt, cfg, out);
  else simulate_results_file(opt, cfg, out);
  std::cout.flush();
  out["microbatches"] = cfg.groups;
  out["gen_len"] = cfg.gen_len;
  out["batch"] = cfg.batch;
  out["overlap"] = cfg.overlap;
  if (!opt.json_out.empty()) write_json_file(opt.json_out, out);
  return 0;
}

}  // namespace ppb
