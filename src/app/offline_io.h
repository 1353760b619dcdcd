// What the offline commands (`balance`, `simulate`, `describe`) share: reading their inputs (a
// results file, a JSON with every key checked), bounds on numbers, number formatting, and the
// checked --json output. No MPI, no device.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "balance/partition.h"
#include "common/error.h"
#include "results/run_record.h"
#include "serving/scenario.h"

namespace ppb::offline {

using nlohmann::json;

constexpr double kMaxMs = 1e12;                   ///< per unit / stage step / transfer (as validate_problem)
constexpr double kMaxBytes = 1125899906842624.0;  ///< 2^50 bytes (1 PiB) per unit, boundary or device
/// Simulated steps M x (G+1) x S: each takes ~0.5 KB in the simulator (events, lane programme).
constexpr double kMaxSimSteps = 2097152;  ///< 2^21: ~1 GB, ~1 s

/// Whether `path` is an HDF5 file (its signature), else a JSON input.
/// @throws ppb::UserError for a directory or a file that cannot be opened.
bool is_hdf5(const std::string& path);

/// Parses the JSON file `path`, refusing a key given twice in one object (nlohmann keeps the
/// last silently: a second "device_memory_bytes" would drop the first without a word).
/// @throws ppb::UserError naming the file (unreadable, invalid JSON, duplicate key).
json read_json(const std::string& path);

/// Field `key` of `j` as T; UserError naming file and field when it has the wrong type.
template <class T>
T field(const json& j, const std::string& key, const std::string& path, const char* expected) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw UserError("input '" + path + "': field '" + key + "' must be " + expected);
  }
}

/// `v` to 6 significant digits ("30953.6", "4.2", "0.00123457", "2e+11"): times whose scale the
/// input decides (a latency JSON may hold microseconds or hours).
std::string sig(double v);
/// "%.<prec>f" for ordinary values, "%.6g" for huge ones (no 200-digit numbers), "inf"/"nan".
std::string num(double v, int prec);
/// Bytes as GiB with 3 decimals.
std::string gib(int64_t b);

/// Refuses any key of object `j` not in `valid` ("where": "top level" or "stages[2]").
void check_keys(const json& j, std::initializer_list<const char*> valid, const std::string& path,
                const std::string& where);
/// A number of `j` (named `name` in messages) that must be finite and in [0, max].
double bounded(const json& v, const std::string& name, const std::string& path, double max, const char* unit);
/// A whole number of bytes in [0, 2^50].
int64_t bytes_value(const json& v, const std::string& name, const std::string& path, const char* unit = "bytes");
/// Field `key` of `j`: a list of whole byte counts (one per unit).
std::vector<int64_t> bytes_list(const json& j, const std::string& key, const std::string& path,
                                const char* unit = "bytes");
/// A positive integer (>= 1, <= 1e9) field of `j`, or `fallback` where absent.
int positive_int(const json& j, const std::string& key, const std::string& path, int fallback);

/// The run of results file `path` (results/reader: refuses a missing, non-ppbench, newer-format
/// or incomplete file, naming it), checked to hold a profile.
RunRecord read_run(const std::string& path);
/// The objective of `run` (/config/workload attribute objective; "workload" when absent).
std::string run_objective(const RunRecord& run);

/// Checks --json FILE before anything is printed: never the input, an existing file only with
/// --force, not a directory, and in a writable directory. "" = no --json.
void check_json_out(const std::string& out, const std::string& input, bool force);
/// Writes `j` to `path`, indented. @throws ppb::UserError when it cannot be written.
void write_json_file(const std::string& path, const json& j);

/// A layout's split as the --json outputs of `balance --tp auto` and `plan` give it: tp_width
/// (`widths`, [S]), first_unit, last_unit, first_device ([S] each) and predicted_stage_ms ([S],
/// ms in the balancer's objective).
json layout_json(const balance::Partition& split, const std::vector<int>& widths);

/// The scenario of `serve-search` and `plan --scenario` (`command`), parsed from its flags
/// (serving::parse_scenario: the parser `run` shares) against `run`'s workload: lengths default
/// to fixed:P / fixed:G of the file, each clamped to 32768 tokens (a results file does not record
/// the model's context; the step model clamps contexts to the profiled ones), B slots = `slots`
/// (0: the file's B); its requests drawn at 1 request/s (serving::generate_requests).
/// @throws ppb::UserError naming the flag (parse_scenario).
serving::ScenarioSpec offline_scenario(const RunRecord& run, const serving::ScenarioFlags& flags,
                                       serving::ScenarioUse::Command command, int slots = 0);

}  // namespace ppb::offline
