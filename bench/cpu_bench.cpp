// The CPU backend against the hardware's floor and against PyTorch eager, side by side in one
// run (issue 12): for each model, one decoder layer's prefill and decode and the head's decode
// as ppbench's profiler times them (the product's own numbers), the same three operations in
// PyTorch eager (scripts/torch_layer.py --device cpu --serve, a long-lived process), and the
// floor of each: max(bytes / read bandwidth, FLOPs / GEMM rate) with this process's measured
// ceilings (model::unit_work, roofline_floor_ms).
//
// Repetitions alternate (ppbench, then torch, then ppbench ...) so that drift and neighbours
// fall on both; each repetition's value is the median of --iters forwards, and a ratio is
// formed per repetition, then its median and min..max over repetitions are printed.
//
//   build/ppb_cpu_bench [--model M.json]... [--batch 4] [--prompt 128] [--reps 5] [--iters 5]
//                       [--threads 1] [--python /usr/bin/python3] [--no-torch]
//
// Exit status: 0 printed; 2 a bad model or the torch process failed (its stderr is shown;
// --no-torch prints the other columns); CLI11's codes (105-109) for bad arguments; 3 an
// internal error. Runs from any directory (scripts/torch_layer.py is found from the source tree).
#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_memory.h"
#include "backend/device.h"
#include "common/error.h"
#include "common/roofline.h"
#include "model/model_spec.h"
#include "profile/profiler.h"

namespace {

/// A child process with its stdin and stdout on pipes (line protocol), stderr inherited.
class LineProcess {
 public:
  /// Starts argv[0] (searched in PATH). @throws ppb::UserError if a pipe or the fork fails.
  explicit LineProcess(const std::vector<std::string>& argv) {
    std::vector<char*> args;  // built before the fork: the child only calls async-signal-safe code
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
      for (int fd : {in[0], in[1], out[0], out[1]})
        if (fd >= 0) close(fd);
      throw ppb::UserError("cannot create the pipes to the torch process");
    }
    pid_ = fork();
    if (pid_ < 0) {
      for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
      throw ppb::UserError("cannot fork the torch process");
    }
    if (pid_ == 0) {
      dup2(in[0], 0);  // dup2'ed descriptors do not inherit O_CLOEXEC
      dup2(out[1], 1);
      execvp(args[0], args.data());
      _exit(127);  // the parent reads EOF and reports it
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    if (!to_ || !from_) throw ppb::UserError("cannot open the pipes to the torch process");
  }
  ~LineProcess() {
    if (to_) {
      std::fputs("quit\n", to_);
      std::fclose(to_);
    }
    if (from_) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  LineProcess(const LineProcess&) = delete;
  LineProcess& operator=(const LineProcess&) = delete;

  void send(const std::string& line) {
    if (std::fputs((line + "\n").c_str(), to_) < 0 || std::fflush(to_) != 0)
      throw ppb::UserError("the torch process exited (its stderr is above)");
  }
  /// The next line without its newline; throws if the child closed its stdout.
  std::string receive() {
    std::string line;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    if (c == EOF && line.empty())
      throw ppb::UserError("the torch process exited (its stderr is above; exit 127: the interpreter was not found)");
    return line;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

/// "k=v k=v" -> map.
std::map<std::string, double> parse_pairs(const std::string& line) {
  std::map<std::string, double> kv;
  std::istringstream in(line);
  std::string tok;
  while (in >> tok) {
    const auto eq = tok.find('=');
    if (eq == std::string::npos) continue;
    try {
      kv[tok.substr(0, eq)] = std::stod(tok.substr(eq + 1));
    } catch (const std::exception&) {
      throw ppb::UserError("the torch process printed '" + tok + "', not key=number");
    }
  }
  return kv;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string range(const std::vector<double>& v, const char* f) {
  char a[32], b[32];
  std::snprintf(a, sizeof a, f, *std::min_element(v.begin(), v.end()));
  std::snprintf(b, sizeof b, f, *std::max_element(v.begin(), v.end()));
  return std::string(a) + ".." + b;
}

struct Options {
  std::vector<std::string> models{PPB_SOURCE_DIR "/inputs/models/qwen3-0.6b.json",
                                  PPB_SOURCE_DIR "/inputs/models/tinyllama-1.1b-chat-v1.0.json"};
  int batch = 4, prompt = 128, reps = 5, iters = 5, threads = 1;
  std::string python = "/usr/bin/python3";
  bool no_torch = false;
};

const char* const kRows[] = {"layer_prefill", "layer_decode", "head_decode"};

int bench_model(const Options& o, const std::string& path) {
  const ppb::model::ModelSpec m = ppb::model::load_model_config(path);
  auto device = ppb::create_cpu_device(o.threads);
  // Ceilings: measured before every repetition, the best kept (a ceiling is what the hardware
  // did at its best; a busy neighbour only ever lowers one measurement).
  double bw = 0, peak = 0;
  const int layer = 1, head = m.num_units() - 1;

  ppb::ProfileConfig cfg;
  cfg.work.batch = o.batch;
  cfg.work.prompt_len = o.prompt;
  cfg.work.gen_len = 1;  // decode at context P, as torch's --context P
  cfg.num_contexts = 1;
  cfg.warmup = 2;
  cfg.iters = o.iters;
  int64_t weights = 0;
  for (int u = 0; u < m.num_units(); ++u) weights += ppb::model::unit_resident_params(m, u) * 4;
  cfg.resident_bytes = static_cast<size_t>(weights);  // a 1-rank run's: cold when above the cache
  const bool cold = cfg.resident_bytes > ppb::cpu_last_level_cache_bytes() / 2;
  const size_t flush_mb = cold ? std::clamp<size_t>(ppb::cpu_last_level_cache_bytes() * 3 / 2, 64 << 20, size_t(2) << 30) >> 20 : 0;

  std::unique_ptr<LineProcess> torch;
  if (!o.no_torch) {
    torch = std::make_unique<LineProcess>(std::vector<std::string>{
        o.python, PPB_SOURCE_DIR "/scripts/torch_layer.py", "--device", "cpu", "--model", path, "--batch", std::to_string(o.batch),
        "--prompt", std::to_string(o.prompt), "--context", std::to_string(o.prompt), "--threads",
        std::to_string(o.threads), "--iters", std::to_string(o.iters), "--flush-mb", std::to_string(flush_mb), "--serve"});
    const std::string ready = torch->receive();
    if (ready != "ready") throw ppb::UserError("torch process said '" + ready + "' instead of 'ready'");
  }

  std::map<std::string, std::vector<double>> ours, theirs;
  for (int rep = 0; rep < o.reps; ++rep) {
    bw = std::max(bw, device->measure_read_bandwidth_GBps());
    peak = std::max(peak, device->measure_gemm_gflops(ppb::DType::f32));
    const ppb::ProfileResult r = ppb::profile_model(*device, m, cfg);
    ours["layer_prefill"].push_back(r.prefill_ms[layer]);
    ours["layer_decode"].push_back(r.decode_ms[layer]);
    ours["head_decode"].push_back(r.decode_ms[head]);
    if (torch) {
      torch->send("time");
      const auto kv = parse_pairs(torch->receive());
      for (const char* row : kRows) {
        const auto it = kv.find(std::string(row) + "_ms");
        if (it == kv.end()) throw ppb::UserError(std::string("torch process printed no ") + row + "_ms");
        theirs[row].push_back(it->second);
      }
    }
    std::fprintf(stderr, "  %s: repetition %d/%d done\n", m.model_type.c_str(), rep + 1, o.reps);
  }

  const std::vector<int> contexts{o.prompt};
  const ppb::model::UnitWork lw = ppb::model::unit_work(m, layer, o.batch, o.prompt, contexts, 4);
  const ppb::model::UnitWork hw = ppb::model::unit_work(m, head, o.batch, o.prompt, contexts, 4);
  const std::map<std::string, double> floor{
      {"layer_prefill", ppb::roofline_floor_ms(lw.prefill_flops, lw.prefill_bytes, bw, peak)},
      {"layer_decode", ppb::roofline_floor_ms(lw.decode_flops, lw.decode_bytes, bw, peak)},
      {"head_decode", ppb::roofline_floor_ms(hw.decode_flops, hw.decode_bytes, bw, peak)}};
  const std::map<std::string, std::string> bound{
      {"layer_prefill", lw.prefill_flops / peak > lw.prefill_bytes / bw ? "GEMM" : "memory"},
      {"layer_decode", lw.decode_flops / peak > lw.decode_bytes / bw ? "GEMM" : "memory"},
      {"head_decode", hw.decode_flops / peak > hw.decode_bytes / bw ? "GEMM" : "memory"}};

  std::printf("\n%s (%s): B=%d, prefill P=%d, decode at context %d; %d thread(s), %s caches; %d repetitions x "
              "median of %d forwards\n",
              path.c_str(), m.architecture.c_str(), o.batch, o.prompt, o.prompt, o.threads, cold ? "cold" : "warm",
              o.reps, o.iters);
  std::printf("device: %s\nceilings (best over the repetitions): read %.1f GB/s, GEMM %.1f GFLOP/s\n",
              device->name().c_str(), bw, peak);
  std::printf("  %-14s %10s %10s %10s %-7s %18s %18s\n", "", "ppbench ms", "torch ms", "floor ms", "bound",
              "floor/ppbench", "torch/ppbench");
  for (const char* row : kRows) {
    const auto& a = ours[row];
    std::vector<double> eff, speed;
    for (double v : a) eff.push_back(floor.at(row) / v);
    const bool have_torch = theirs.count(row) > 0;
    for (size_t i = 0; have_torch && i < a.size(); ++i) speed.push_back(theirs[row][i] / a[i]);
    char e[64], s[64];
    std::snprintf(e, sizeof e, "%.2f [%s]", median(eff), range(eff, "%.2f").c_str());
    if (have_torch)
      std::snprintf(s, sizeof s, "%.2fx [%s]", median(speed), range(speed, "%.2f").c_str());
    else
      std::snprintf(s, sizeof s, "n/a");
    std::printf("  %-14s %10.3f %10.3f %10.3f %-7s %18s %18s\n", row, median(a),
                have_torch ? median(theirs[row]) : NAN, floor.at(row), bound.at(row).c_str(), e, s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a dead torch process is an error to report, not a signal to die of
  Options o;
  CLI::App app{"ppbench's CPU kernels against the hardware's floor and PyTorch eager (issue 12)"};
  std::vector<std::string> models;
  app.add_option("--model", models, "model config(s) (default: qwen3-0.6b, heavy head; tinyllama-1.1b)");
  app.add_option("--batch", o.batch, "B sequences")->check(CLI::Range(1, 64));
  app.add_option("--prompt", o.prompt, "P prompt tokens per sequence; decode is timed at context P")
      ->check(CLI::Range(1, 65536));
  app.add_option("--reps", o.reps, "alternating repetitions (ppbench, torch)")->check(CLI::Range(1, 100));
  app.add_option("--iters", o.iters, "timed forwards per repetition (median kept)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", o.threads, "threads of both (BLAS / torch.set_num_threads)")->check(CLI::Range(1, 256));
  app.add_option("--python", o.python, "interpreter with torch (Debian's python3-torch)");
  app.add_flag("--no-torch", o.no_torch, "skip PyTorch (floors and ppbench only)");
  CLI11_PARSE(app, argc, argv);
  // Relative model paths are the source tree's (as in README), wherever the binary is run from.
  for (auto& m : models)
    if (!m.empty() && m[0] != '/' && !std::filesystem::exists(m)) m = std::string(PPB_SOURCE_DIR) + "/" + m;
  if (!models.empty()) o.models = models;
  try {
    for (const auto& m : o.models) bench_model(o, m);
  } catch (const ppb::UserError& e) {
    std::cerr << "ppb_cpu_bench: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ppb_cpu_bench: " << e.what() << std::endl;
    return 3;
  }
  return 0;
}
