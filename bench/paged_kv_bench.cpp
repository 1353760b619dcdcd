// The demand-paged KV store's cost (issue 49: --kv-blocks auto): a stage whose KV store is
// allocated whole and touched once (kv_pool_tokens 0) against the same stage with a demand-paged
// store (cpu_paged_store.h), over what serving does to it: B requests take B slots, prefill P
// tokens each in one ragged step and decode G tokens, then leave (their slots released: the paged
// store gives the pages back, so the next requests fault them in again). Repetitions alternate
// the two stores (which goes first alternates too); per repetition, the ratio paged / whole of the
// prefill step and of the G decode steps; median and min..max printed, with the paged store's
// resident KV at the cycle's end against the whole store's bytes.
//
//   build/ppb_paged_kv_bench [--model M.json] [--layers 14] [--batch 8] [--prompt 128] [--gen 32] [--reps 7]
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
#include "common/clock.h"
#include "common/error.h"
#include "common/stats.h"
#include "model/model_spec.h"

namespace {

struct Options {
  std::string model = PPB_SOURCE_DIR "/inputs/models/qwen3-0.6b.json";
  int layers = 14, batch = 8, prompt = 128, gen = 32, reps = 7;
};

struct Timed {
  double prefill_ms = 0, decode_ms = 0;
};

/// One cycle on `stage`: release every slot, prefill B rows of P tokens, G decode steps.
Timed cycle(ppb::Lane& lane, ppb::StageExecutor& stage, const void* in, void* out, const Options& o) {
  ppb::RaggedStep s;
  for (int b = 0; b < o.batch; ++b) {
    s.slot.push_back(b), s.pos.push_back(0), s.tokens.push_back(o.prompt);
    s.released.push_back(b);
  }
  Timed t;
  double t0 = ppb::monotonic_s();
  stage.enqueue_forward_ragged(lane, in, out, 0, s);
  lane.synchronize();
  t.prefill_ms = (ppb::monotonic_s() - t0) * 1e3;
  s.released.clear();
  std::fill(s.tokens.begin(), s.tokens.end(), 1);
  t0 = ppb::monotonic_s();
  for (int g = 0; g < o.gen; ++g) {
    std::fill(s.pos.begin(), s.pos.end(), o.prompt + g);
    stage.enqueue_forward_ragged(lane, in, out, 0, s);
  }
  lane.synchronize();
  t.decode_ms = (ppb::monotonic_s() - t0) * 1e3;
  return t;
}

int run(const Options& o) {
  const ppb::model::ModelSpec m = ppb::model::load_model_config(o.model);
  if (o.layers < 1 || o.layers > m.num_units() - 2)
    throw ppb::UserError("--layers " + std::to_string(o.layers) + ": a stage of 1.." + std::to_string(m.num_units() - 2) + " decoder layers");
  auto device = ppb::create_cpu_device(1);
  auto lane = device->create_lane("bench");
  ppb::StageConfig whole_cfg;
  whole_cfg.work.batch = o.batch;
  whole_cfg.work.prompt_len = o.prompt;
  whole_cfg.work.gen_len = o.gen;
  ppb::StageConfig paged_cfg = whole_cfg;
  paged_cfg.kv_pool_tokens = int64_t(o.batch) * (o.prompt + o.gen);  // what the B requests hold at the end
  auto whole = device->create_stage(m, 1, o.layers, whole_cfg);
  auto paged = device->create_stage(m, 1, o.layers, paged_cfg);
  const int T = o.batch * o.prompt;
  auto in = device->allocate(whole->ragged_input_bytes(T));
  auto out = device->allocate(whole->ragged_output_bytes(o.batch, T));
  std::vector<float> x(whole->ragged_input_bytes(T) / sizeof(float));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
  in->upload(x.data(), x.size() * sizeof(float));
  cycle(*lane, *whole, in->data(), out->data(), o);  // warm-up: the whole store and scratch touched
  cycle(*lane, *paged, in->data(), out->data(), o);
  std::vector<double> prefill, decode, pw, dw;
  size_t resident = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    Timed w, p;
    if (rep % 2 == 0) {
      w = cycle(*lane, *whole, in->data(), out->data(), o);
      p = cycle(*lane, *paged, in->data(), out->data(), o);
    } else {
      p = cycle(*lane, *paged, in->data(), out->data(), o);
      w = cycle(*lane, *whole, in->data(), out->data(), o);
    }
    resident = paged->kv_resident_bytes();
    prefill.push_back(p.prefill_ms / w.prefill_ms), decode.push_back(p.decode_ms / w.decode_ms);
    pw.push_back(w.prefill_ms), dw.push_back(w.decode_ms);
  }
  std::printf("%s, a stage of %d layers, B=%d requests of P=%d + G=%d tokens, %d alternating reps\n", m.model_type.c_str(),
              o.layers, o.batch, o.prompt, o.gen, o.reps);
  std::printf("  prefill step (whole store %.1f ms): paged / whole %s\n", ppb::median(pw), ppb::bench::median_range(prefill).c_str());
  std::printf("  %d decode steps (whole store %.1f ms): paged / whole %s\n", o.gen, ppb::median(dw), ppb::bench::median_range(decode).c_str());
  std::printf("  KV resident: paged %.1f MiB at the cycle's end; whole store %.1f MiB\n", resident / 1048576.0,
              whole->kv_cache_bytes() / 1048576.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"the demand-paged KV store against the whole one, over serving's request cycles"};
  app.add_option("--model", o.model, "model config.json")->capture_default_str();
  app.add_option("--layers", o.layers, "decoder layers of the stage")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", o.batch, "B requests (slots)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--prompt", o.prompt, "P prompt tokens each")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--gen", o.gen, "G decode steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--reps", o.reps, "alternating repetitions")->check(CLI::PositiveNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const ppb::UserError& e) {
    std::cerr << "ppb_paged_kv_bench: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ppb_paged_kv_bench: internal error: " << e.what() << "\n";
    return 3;
  }
}
