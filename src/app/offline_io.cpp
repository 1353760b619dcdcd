#include "app/offline_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "results/reader.h"

namespace ppb::offline {

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
int64_t bytes_value(const json& v, const std::string& name, const std::string& path, const char* unit) {
  const double x = bounded(v, name, path, kMaxBytes, unit);
  if (x != std::floor(x)) throw UserError("input '" + path + "': " + name + " is " + v.dump() + "; must be a whole number of bytes");
  return static_cast<int64_t>(x);
}

/// Field `key` of `j`: a list of whole byte counts (one per unit).
std::vector<int64_t> bytes_list(const json& j, const std::string& key, const std::string& path,
                                const char* unit) {
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


json layout_json(const balance::Partition& split, const std::vector<int>& widths) {
  return {{"tp_width", widths},
          {"first_unit", split.first_unit},
          {"last_unit", split.last_unit},
          {"first_device", split.device_rank},
          {"predicted_stage_ms", split.predicted_stage_ms}};
}

serving::ScenarioSpec offline_scenario(const RunRecord& run, const serving::ScenarioFlags& flags,
                                       serving::ScenarioUse::Command command, int slots) {
  constexpr int kMaxLen = 32768;
  serving::ScenarioUse use;
  use.command = command;
  use.prompt_len = run.workload.prompt_len;
  use.gen_len = run.workload.gen_len;
  use.max_prompt_len = use.max_gen_len = kMaxLen;
  use.slots = slots > 0 ? slots : run.workload.batch;
  std::optional<serving::ScenarioSpec> spec = serving::parse_scenario(flags, use);
  if (!spec) throw InternalError("offline_scenario: closed batches have no scenario");
  return *spec;
}

}  // namespace ppb::offline
