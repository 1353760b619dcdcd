// A stage of n decoder layers against n times one layer timed alone (issue 47: the step-cost
// model sums its units' costs, each timed on a one-unit stage; is there a per-step cost apart
// from the units', or a cost per unit that grows in a longer stage?). For each n, repetitions
// alternate the one-layer stage and the n-layer stage over the same step shapes (ragged
// forwards as the serving engine runs them: B decode rows, B rows of 17 tokens, one prompt of
// P tokens), each repetition's value the median of --iters forwards; the ratio n-layer /
// (n x one layer) is formed per repetition, and its median and min..max over repetitions are
// printed. Weights are timed cold where the model's weights exceed the cache (as the profile
// times them for a run of --ranks ranks).
//
//   build/ppb_stage_units_bench [--model M.json] [--batch 4] [--prompt 64] [--layers 1,2,4,8]
//                               [--reps 5] [--iters 5] [--ranks 2] [--cold-check N]
//
// --cold-check N: one layer's decode step timed after the old cache flush (a write stream) and
// after evicting its own lines (the profile's now), each against a stage of N layers run back to
// back (the pipeline's steady state), per layer: the ratios say which one times what the
// pipeline sees.
//
// Exit status: 0 printed; 2 bad input; CLI11's codes for bad arguments; 3 an internal error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "bench_range.h"
#include "common/error.h"
#include "common/stats.h"
#include "model/model_spec.h"
#include "profile/profiler.h"

namespace {

struct Options {
  std::string model = PPB_SOURCE_DIR "/inputs/models/qwen3-0.6b.json";
  int batch = 4, prompt = 64, reps = 5, iters = 5, ranks = 2;
  std::vector<int> layers = {1, 2, 4, 8};
  int cold_check = 0;  ///< > 0: the flush comparison on a stage of this many layers instead
};

/// A stage of units [first, last] with its input (activations in [-1, 1)) and output buffers.
struct Built {
  std::unique_ptr<ppb::StageExecutor> stage;
  std::unique_ptr<ppb::Buffer> in, out;
};

Built build(ppb::Device& device, const ppb::model::ModelSpec& m, int first, int last, const ppb::StageConfig& sc) {
  Built b;
  b.stage = device.create_stage(m, first, last, sc);
  const int T = sc.work.batch * sc.work.prompt_len;
  b.in = device.allocate(b.stage->ragged_input_bytes(T));
  b.out = device.allocate(b.stage->ragged_output_bytes(sc.work.batch, T));
  std::vector<float> x(b.stage->ragged_input_bytes(T) / sizeof(float));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
  b.in->upload(x.data(), x.size() * sizeof(float));
  return b;
}

ppb::RaggedStep step_of(const std::vector<int>& pos, const std::vector<int>& tokens) {
  ppb::RaggedStep s;
  for (std::size_t i = 0; i < pos.size(); ++i) {
    s.slot.push_back(static_cast<int32_t>(i));
    s.pos.push_back(pos[i]);
    s.tokens.push_back(tokens[i]);
  }
  return s;
}

/// The profile's cold timing against the pipeline's (issue 47): one layer's decode step timed
/// after the old flush (a write stream through 1.5x the last-level cache: Device::flush_caches
/// without a stage) and after evicting the layer's own lines (with the stage, what the profile
/// does now), against a stage of n layers run back to back without any flush (the pipeline's
/// steady state: n layers' weights streamed again each step), per layer. Ratios per repetition.
int cold_check(const Options& o, ppb::Device& device, ppb::Lane& lane, const ppb::model::ModelSpec& m,
               const ppb::StageConfig& sc, size_t resident) {
  const int n = o.cold_check;
  if (n + 1 > m.num_units() - 1) throw ppb::UserError("--cold-check: " + std::to_string(n) + " is more layers than the model has");
  Built one = build(device, m, 1, 1, sc), many = build(device, m, 1, n, sc);
  const ppb::RaggedStep step = step_of(std::vector<int>(o.batch, o.prompt / 2), std::vector<int>(o.batch, 1));
  auto after = [&](const ppb::StageExecutor* evict) {
    std::vector<double> t;
    for (int i = 0; i < o.iters; ++i) {
      device.flush_caches(lane, resident, evict);
      lane.synchronize();
      t.push_back(ppb::time_ragged(device, lane, *one.stage, one.in->data(), one.out->data(), step, 0, 1, 0).at(0));
    }
    return ppb::median(t);
  };
  std::vector<double> stream, lines, pipe, r_stream, r_lines;
  for (int rep = 0; rep < o.reps; ++rep) {
    stream.push_back(after(nullptr));
    lines.push_back(after(one.stage.get()));
    pipe.push_back(ppb::median(ppb::time_ragged(device, lane, *many.stage, many.in->data(), many.out->data(), step, 1, o.iters, 0)) / n);
    r_stream.push_back(stream.back() / pipe.back());
    r_lines.push_back(lines.back() / pipe.back());
  }
  using ppb::bench::median_range;
  std::printf("%s, decode of B=%d rows at %d keys, %d reps x median of %d forwards (ms per layer):\n", m.model_type.c_str(),
              o.batch, o.prompt / 2, o.reps, o.iters);
  std::printf("  one layer after a write stream (the old flush)   %8.3f   / pipeline %s\n", ppb::median(stream), median_range(r_stream).c_str());
  std::printf("  one layer after evicting its own lines (the fix) %8.3f   / pipeline %s\n", ppb::median(lines), median_range(r_lines).c_str());
  std::printf("  a stage of %d layers back to back, per layer    %8.3f   (the pipeline's steady state)\n", n, ppb::median(pipe));
  return 0;
}

int run(const Options& o) {
  const ppb::model::ModelSpec m = ppb::model::load_model_config(o.model);
  auto device = ppb::create_cpu_device(1);
  ppb::StageConfig sc;
  sc.work.batch = o.batch;
  sc.work.prompt_len = o.prompt;
  sc.work.gen_len = o.prompt / 2;
  int64_t weights = 0;
  for (int u = 0; u < m.num_units(); ++u) weights += ppb::model::unit_resident_params(m, u) * 4;
  const size_t resident = static_cast<size_t>(weights / std::max(1, o.ranks));
  const int B = o.batch;
  const std::vector<std::pair<std::string, ppb::RaggedStep>> shapes = {
      {"decode B rows", step_of(std::vector<int>(B, o.prompt / 2), std::vector<int>(B, 1))},
      {"17 tokens in B rows", step_of(std::vector<int>(B, 0), [&] {
         std::vector<int> t(B, 17 / B);
         for (int i = 0; i < 17 % B; ++i) ++t[i];
         return t;
       }())},
      {"one prompt of P", step_of({0}, {o.prompt})}};
  auto lane = device->create_lane("bench");
  if (o.cold_check > 0) return cold_check(o, *device, *lane, m, sc, resident);
  Built one = build(*device, m, 1, 1, sc);
  std::printf("%s, B=%d P=%d, %d reps x median of %d forwards; ratio = n-layer stage / (n x one layer)\n",
              m.model_type.c_str(), B, o.prompt, o.reps, o.iters);
  std::printf("%-22s %6s %12s %12s %24s\n", "shape", "layers", "one ms", "stage ms", "ratio median [min..max]");
  for (int n : o.layers) {
    if (n < 1 || n + 1 > m.num_units() - 1) throw ppb::UserError("--layers: " + std::to_string(n) + " is not in [1, layers]");
    Built many = build(*device, m, 1, n, sc);
    for (const auto& [name, step] : shapes) {
      std::vector<double> ratio, a, b;
      for (int rep = 0; rep < o.reps; ++rep) {
        const double t1 = ppb::median(ppb::time_ragged(*device, *lane, *one.stage, one.in->data(), one.out->data(), step, 1, o.iters, resident));
        const double tn = ppb::median(ppb::time_ragged(*device, *lane, *many.stage, many.in->data(), many.out->data(), step, 1, o.iters, resident));
        a.push_back(t1), b.push_back(tn), ratio.push_back(tn / (n * t1));
      }
      std::printf("%-22s %6d %12.3f %12.3f %10.3f [%.3f..%.3f]\n", name.c_str(), n, ppb::median(a), ppb::median(b),
                  ppb::median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"a stage of n layers against n times one layer (the step-cost model's sum of units)"};
  app.add_option("--model", o.model, "model config.json")->capture_default_str();
  app.add_option("--batch", o.batch, "B rows")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--prompt", o.prompt, "P: the prompt's tokens (the cache holds 1.5 P)")->check(CLI::Range(17, 4096))->capture_default_str();
  app.add_option("--layers", o.layers, "stage lengths n")->delimiter(',')->capture_default_str();
  app.add_option("--reps", o.reps, "alternating repetitions")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--iters", o.iters, "timed forwards per repetition (median kept)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--ranks", o.ranks, "the run's ranks (decides cold or warm timing)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--cold-check", o.cold_check,
                 "N > 0: instead, one layer's decode timed after the old flush and after evicting its lines, against "
                 "a stage of N layers back to back (per layer)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const ppb::UserError& e) {
    std::cerr << "ppb_stage_units_bench: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ppb_stage_units_bench: internal error: " << e.what() << "\n";
    return 3;
  }
}
