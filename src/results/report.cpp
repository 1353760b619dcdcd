#include "results/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <system_error>

#include "common/error.h"
#include "results/reader.h"
#include "results/summary.h"

namespace ppb {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double metric(const PartitionRecord& p, const char* key) { return metric_or_nan(p, key); }

std::string counts_of(const PartitionRecord& p) {
  std::string c;
  for (size_t k = 0; k < p.first_unit.size(); ++k) {
    if (k) c += ',';
    c += std::to_string(p.last_unit[k] - p.first_unit[k] + 1);
  }
  return c;
}

/// "%.<prec>f" of v, or `nan_text` for NaN.
std::string num(double v, int prec, const char* nan_text) {
  if (std::isnan(v)) return nan_text;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", prec, v);
  return buf;
}

/// RFC 4180 quoting: a field with a comma, quote or line break is quoted, quotes doubled.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void print_metadata(std::ostream& os, const std::string& file, const RunRecord& run) {
  os << "file: " << file << "\n"
     << "ppbench " << run.ppbench_version << ", created " << run.created_utc << ", elapsed "
     << num(run.elapsed_s, 1, "?") << " s\n"
     << "command: " << run.command_line << "\n"
     << "MPI: " << run.mpi_version << "; HDF5 " << run.hdf5_version;
  for (const auto& [k, v] : run.library_versions) os << "; " << k << " " << v;
  os << "\n";
  if (!run.slurm_job_id.empty()) {
    os << "slurm: job " << run.slurm_job_id;
    if (!run.slurm_array_task_id.empty()) os << " task " << run.slurm_array_task_id;
    os << " (" << run.slurm_job_name << ") on " << run.slurm_nodelist << "\n";
  }
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const auto& ri = run.ranks[r];
    os << "rank " << r << ": " << ri.hostname << " local rank " << ri.local_rank << ", " << ri.device_name;
    if (!ri.bus_id.empty()) os << " [" << ri.bus_id << "]";
    os << "\n";
  }
}

}  // namespace

std::vector<ReportRow> report_rows(const std::string& file, const RunRecord& run) {
  const PartitionRecord* reference = nullptr;
  for (const auto& p : run.partitions)
    if (p.name == run.reference_partition && p.measured) reference = &p;
  std::vector<ReportRow> rows;
  for (const auto& p : run.partitions) {
    if (!p.measured) continue;
    ReportRow r;
    r.file = file;
    r.model = std::filesystem::path(run.model_source).stem().string();
    r.backend = run.backend + "/" + run.transport;
    r.partition = p.name;
    r.counts = counts_of(p);
    r.layout = p.layout;
    r.expert_skew = run.workload.expert_skew;
    if (const auto it = run.model_attrs_num.find("mtp_modules_run"); it != run.model_attrs_num.end())
      r.mtp_modules = static_cast<int>(it->second);
    r.world_size = run.world_size;
    r.batch = run.workload.batch;
    r.prompt_len = run.workload.prompt_len;
    r.gen_len = run.workload.gen_len;
    r.microbatches = partition_groups(run, p);
    r.tokens_per_s = metric(p, "tokens_per_s");
    r.decode_tokens_per_s = metric(p, "decode_tokens_per_s");
    r.ttft_p50_ms = metric(p, "ttft_p50_ms");
    r.ttft_p99_ms = metric(p, "ttft_p99_ms");
    r.tpot_p50_ms = metric(p, "tpot_p50_ms");
    r.tpot_p99_ms = metric(p, "tpot_p99_ms");
    r.pipeline_efficiency = metric(p, "pipeline_efficiency");
    r.bottleneck_stage = p.bottleneck_stage;
    r.max_bubble = p.bubble_fraction.empty() ? kNaN
                                             : *std::max_element(p.bubble_fraction.begin(), p.bubble_fraction.end());
    r.balance_gain = reference ? r.tokens_per_s / metric(*reference, "tokens_per_s") : kNaN;
    r.balance_gain_ci_low = reference && &p != reference ? p.gain.ci_low : kNaN;
    r.balance_gain_ci_high = reference && &p != reference ? p.gain.ci_high : kNaN;
    r.balance_verdict = reference && &p != reference ? p.gain_verdict : "";
    r.repetitions = static_cast<int>(p.rep_tokens_per_s.size());
    // --no-validate: no serialized run to match; only the tokens across partitions can fail.
    if (!p.validated)
      r.validation = p.tokens_match_first_partition ? "skipped" : "FAILED";
    else
      r.validation = p.tokens_match && p.checksum_match && p.tokens_match_first_partition ? "OK" : "FAILED";
    rows.push_back(std::move(r));
  }
  return rows;
}

void print_report_table(std::ostream& os, const std::vector<ReportRow>& rows) {
  // Files are listed once above the table and referred to by number, so that long paths do
  // not push the numbers off the screen.
  std::vector<std::string> files;
  for (const auto& r : rows)
    if (std::find(files.begin(), files.end(), r.file) == files.end()) files.push_back(r.file);
  for (size_t i = 0; i < files.size(); ++i) os << "[" << i << "] " << files[i] << "\n";
  // Text columns as wide as their longest entry, so that a long model name, partition name or
  // split keeps every row in its columns.
  auto width = [&](const char* header, auto field) {
    size_t w = std::string(header).size();
    for (const auto& r : rows) w = std::max(w, field(r).size());
    return static_cast<int>(w);
  };
  const int w_run = static_cast<int>(std::max<size_t>(3, std::to_string(files.size() - 1).size() + 2));
  // Runs of one model that differ in how it runs are told apart in the model column.
  auto model_label = [](const ReportRow& r) {
    std::string m = r.model;
    if (r.expert_skew > 0) m += " skew " + num(r.expert_skew, 2, "");
    if (r.mtp_modules > 0) m += " +mtp";
    return m;
  };
  const int w_model = width("model", model_label);
  const int w_part = width("partition", [](const ReportRow& r) { return r.partition; });
  const int w_counts = width("units/stage", [](const ReportRow& r) { return r.counts; });
  std::string line;
  auto print = [&](const char* f, auto... args) {
    const int n = std::snprintf(nullptr, 0, f, args...);
    line.resize(static_cast<size_t>(n) + 1);
    std::snprintf(line.data(), line.size(), f, args...);
    line.pop_back();
    os << line;
  };
  print("%-*s %-*s %5s %-*s %-*s %4s %10s %10s %17s %17s %5s %7s %6s %13s %7s %s\n", w_run, "run", w_model, "model",
        "ranks", w_part, "partition", w_counts, "units/stage", "n", "tok/s", "dec tok/s", "TTFT p50/p99 ms",
        "TPOT p50/p99 ms", "bneck", "bubble", "gain", "gain 95% CI", "effic", "valid");
  for (const auto& r : rows) {
    const auto idx = std::find(files.begin(), files.end(), r.file) - files.begin();
    std::string run = std::to_string(idx);
    run.insert(run.begin(), '[');
    run.push_back(']');
    const std::string ttft = num(r.ttft_p50_ms, 1, "-") + "/" + num(r.ttft_p99_ms, 1, "-");
    const std::string tpot = num(r.tpot_p50_ms, 1, "-") + "/" + num(r.tpot_p99_ms, 1, "-");
    const std::string ci = std::isnan(r.balance_gain_ci_low)
                               ? "-"
                               : num(r.balance_gain_ci_low, 3, "-") + ".." + num(r.balance_gain_ci_high, 3, "-");
    print("%-*s %-*s %5d %-*s %-*s %4d %10s %10s %17s %17s %5d %6s%% %5sx %13s %6s%% %s\n", w_run, run.c_str(),
          w_model, model_label(r).c_str(), r.world_size, w_part, r.partition.c_str(), w_counts, r.counts.c_str(),
          r.repetitions, num(r.tokens_per_s, 2, "-").c_str(), num(r.decode_tokens_per_s, 2, "-").c_str(), ttft.c_str(),
          tpot.c_str(), r.bottleneck_stage, num(100.0 * r.max_bubble, 1, "-").c_str(), num(r.balance_gain, 3, "-").c_str(),
          ci.c_str(), num(100.0 * r.pipeline_efficiency, 1, "-").c_str(), r.validation.c_str());
  }
  os << "n: timed repetitions (interleaved rounds); bneck: stage with the largest measured workload; bubble: max\n"
        "over stages; gain: tok/s / tok/s of uniform in the same run, with its 95% CI over the paired rounds;\n"
        "effic: decode tok/s / bottleneck bound (DESIGN.md section 3)\n";
}

void print_report_csv(std::ostream& os, const std::vector<ReportRow>& rows) {
  os << "file,model,backend,world_size,batch,prompt_len,gen_len,microbatches,partition,counts,tokens_per_s,"
        "decode_tokens_per_s,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,pipeline_efficiency,"
        "bottleneck_stage,max_bubble,balance_gain,validation,repetitions,balance_gain_ci_low,balance_gain_ci_high,"
        "balance_verdict,layout,expert_skew,mtp_modules\n";
  for (const auto& r : rows) {
    os << csv_field(r.file) << ',' << csv_field(r.model) << ',' << csv_field(r.backend) << ',' << r.world_size << ','
       << r.batch << ',' << r.prompt_len << ',' << r.gen_len << ',' << r.microbatches << ',' << csv_field(r.partition)
       << ',' << csv_field(r.counts) << ',' << num(r.tokens_per_s, 6, "") << ',' << num(r.decode_tokens_per_s, 6, "")
       << ',' << num(r.ttft_p50_ms, 6, "") << ',' << num(r.ttft_p99_ms, 6, "") << ',' << num(r.tpot_p50_ms, 6, "")
       << ',' << num(r.tpot_p99_ms, 6, "") << ',' << num(r.pipeline_efficiency, 6, "") << ',' << r.bottleneck_stage
       << ',' << num(r.max_bubble, 6, "") << ',' << num(r.balance_gain, 6, "") << ',' << csv_field(r.validation)
       << ',' << r.repetitions << ',' << num(r.balance_gain_ci_low, 6, "") << ',' << num(r.balance_gain_ci_high, 6, "")
       << ',' << csv_field(r.balance_verdict) << ',' << csv_field(r.layout) << ',' << num(r.expert_skew, 6, "") << ','
       << r.mtp_modules << '\n';
  }
}

int run_report(std::ostream& os, const std::vector<std::string>& files, bool csv, std::ostream& err) {
  // One file: refused as a whole when it cannot be read (exit 2 from the caller).
  if (files.size() == 1) {
    const RunRecord run = read_results(files[0]);
    if (!csv) {
      print_metadata(os, files[0], run);
      print_summary(os, run);
    } else {
      print_report_csv(os, report_rows(files[0], run));
    }
    return 0;
  }
  // Several: each file once (a path given twice, or two spellings of one file, is reported once);
  // the complete ones are reported, every other one is listed on `err` with its reason.
  std::vector<std::string> unique, keys;
  for (const auto& f : files) {
    std::error_code ec;
    const auto canon = std::filesystem::weakly_canonical(f, ec);
    const std::string key = ec ? f : canon.string();
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
      err << "ppbench report: note: '" << f << "' given more than once; reported once" << std::endl;
      continue;
    }
    keys.push_back(key);
    unique.push_back(f);
  }
  std::vector<ReportRow> rows;
  std::vector<std::string> skipped;
  std::size_t read = 0;
  for (const auto& f : unique) {
    try {
      const RunRecord run = read_results(f);
      auto r = report_rows(f, run);
      if (r.empty()) err << "ppbench report: note: '" << f << "' has no measured partition (a profile-only run?): no rows" << std::endl;
      rows.insert(rows.end(), r.begin(), r.end());
      ++read;
    } catch (const std::exception& e) {  // UserError (missing, not ppbench, incomplete) or a broken file
      skipped.push_back(e.what());
    }
  }
  if (read == 0) {
    std::string why;
    for (const auto& s : skipped) why += "\n  " + s;
    throw UserError("none of the " + std::to_string(unique.size()) + " files could be reported:" + why);
  }
  if (csv)
    print_report_csv(os, rows);
  else
    print_report_table(os, rows);
  os.flush();
  for (const auto& s : skipped) err << "ppbench report: skipped: " << s << std::endl;
  if (!skipped.empty())
    err << "ppbench report: " << skipped.size() << " of " << unique.size() << " files skipped, " << read
        << " reported" << std::endl;
  return 0;
}

}  // namespace ppb
