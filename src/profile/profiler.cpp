#include "profile/profiler.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>

#include "backend/lane_hold.h"
#include "common/error.h"
#include "common/stats.h"

namespace ppb {

std::vector<double> time_forwards(Device& device, Lane& lane, StageExecutor& stage, const void* in,
                                  void* out, int pos, int tokens, int warmup, int iters,
                                  size_t resident_bytes, const std::function<void()>& align) {
  for (int i = 0; i < warmup; ++i) stage.enqueue_forward(lane, in, out, 0, pos, tokens);
  lane.synchronize();
  std::vector<std::unique_ptr<Event>> start(iters), stop(iters);
  std::vector<double> ms(iters);
  // One forward at a time: each is timed alone, as the pipeline runs it, with the lane held
  // until the forward is enqueued (backend/lane_hold.h) so that launch gaps are not timed; on
  // the CPU the hold costs nothing timed (the start event is taken after it). Only after a
  // warm-up (see enqueue_held), and only for a forward of at most kMaxHeldLaunches launches: a
  // larger one would fill the device's launch queue behind its own hold (a deadlock); it is
  // device-bound, so timing it unheld adds no launch gaps.
  const bool hold = warmup > 0 && stage.launches_per_forward(tokens) <= kMaxHeldLaunches;
  stage.prepare_forward(0, pos, tokens);  // with --profile-warmup 0: a decode graph's capture, untimed
  for (int i = 0; i < iters; ++i) {
    start[i] = device.create_event();
    stop[i] = device.create_event();
    if (align) {  // flushed first, so that the ranks' timed forwards start together
      device.flush_caches(lane, resident_bytes);
      lane.synchronize();
      align();
    }
    auto forward = [&] {
      // cold, as inside a big stage (Device::flush_caches)
      if (!align) device.flush_caches(lane, resident_bytes);
      lane.record(*start[i]);
      stage.enqueue_forward(lane, in, out, 0, pos, tokens);
      lane.record(*stop[i]);
    };
    if (hold)
      enqueue_held(lane, forward);
    else
      forward();
    lane.synchronize();
    ms[i] = 1e3 * (stop[i]->time_s() - start[i]->time_s());
  }
  return ms;
}

namespace {

/// IEEE binary16 / bfloat16 bits of v, for |v| < 1 (the activations below): round to nearest
/// even for bf16, truncation for f16 (subnormals flushed to zero); exact enough for timing.
uint16_t half_bits(float v, DType t) {
  uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  if (t == DType::bf16) return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const int e = static_cast<int>((b >> 23) & 0xffu) - 127 + 15;
  if (e <= 0) return sign;  // |v| < 2^-14
  return static_cast<uint16_t>(sign | (e << 10) | ((b >> 13) & 0x3ffu));
}

/// Fills the input of a unit: token ids for the embed, activations in [-1, 1) otherwise, in
/// the stage's dtype (random bits of the right size could hold Inf/NaN in f16/bf16).
void fill_input(Buffer& buf, const model::ModelSpec& m, int unit, size_t bytes, uint64_t seed, DType dtype) {
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(unit));
  if (m.units[unit].kind == model::UnitKind::embed) {
    std::vector<int32_t> tok(bytes / sizeof(int32_t));
    std::uniform_int_distribution<int32_t> dist(0, m.vocab - 1);
    for (auto& t : tok) t = dist(rng);
    buf.upload(tok.data(), tok.size() * sizeof(int32_t));
  } else {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    if (dtype == DType::f32) {
      std::vector<float> x(bytes / sizeof(float));
      for (auto& v : x) v = dist(rng);
      buf.upload(x.data(), x.size() * sizeof(float));
    } else {
      std::vector<uint16_t> x(bytes / sizeof(uint16_t));
      for (auto& v : x) v = half_bits(dist(rng), dtype);
      buf.upload(x.data(), x.size() * sizeof(uint16_t));
    }
  }
}

}  // namespace

ProfileResult profile_model(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg,
                            const ProgressFn& progress) {
  const int units = model.num_units();
  const int sigs = static_cast<int>(model.signatures.size());
  ProfileResult r;
  // Decode contexts: evenly spaced KV-cache lengths in [P, P+G-1] (the positions decode steps
  // write), so the mean over them is the mean decode cost of a generation.
  int c_count = std::max(1, std::min(cfg.num_contexts, cfg.gen_len));
  for (int i = 0; i < c_count; ++i) {
    int c = cfg.prompt_len + (c_count == 1 ? 0 : (cfg.gen_len - 1) * i / (c_count - 1));
    r.decode_contexts.push_back(c);
  }
  const int C = static_cast<int>(r.decode_contexts.size());
  std::vector<double> sig_prefill(sigs), sig_pmin(sigs), sig_pmax(sigs), sig_decode(sigs), sig_dmin(sigs),
      sig_dmax(sigs), sig_ctx(static_cast<size_t>(sigs) * C);

  auto lane = device.create_lane("profile");
  StageConfig sc;
  sc.batch = cfg.batch;
  sc.max_context = cfg.prompt_len + cfg.gen_len;
  sc.groups = 1;
  sc.dtype = cfg.dtype;
  sc.seed = cfg.seed;
  sc.cuda_graphs = cfg.cuda_graphs;
  sc.expert_skew = cfg.expert_skew;
  sc.tp_width = cfg.tp_width;
  sc.tp_rank = cfg.tp_rank;
  sc.tp = cfg.tp;
  for (int s = 0; s < sigs; ++s) {
    int unit = model.signature_example[s];
    if (progress) progress(s, sigs, model.signatures[s] + " (" + model.units[unit].name + ")");
    auto stage = device.create_stage(model, unit, unit, sc);
    size_t in_bytes = stage->input_bytes(cfg.prompt_len);
    auto in = device.allocate(in_bytes);
    auto out = device.allocate(std::max(stage->output_bytes(cfg.prompt_len), stage->output_bytes(1)));
    fill_input(*in, model, unit, in_bytes, cfg.seed, cfg.dtype);

    auto p = time_forwards(device, *lane, *stage, in->data(), out->data(), 0, cfg.prompt_len,
                           cfg.warmup, cfg.iters, cfg.resident_bytes, cfg.align);
    sig_prefill[s] = median(p);
    sig_pmin[s] = *std::min_element(p.begin(), p.end());
    sig_pmax[s] = *std::max_element(p.begin(), p.end());

    double dsum = 0.0, dmin = 1e300, dmax = 0.0;
    for (int c = 0; c < C; ++c) {
      auto d = time_forwards(device, *lane, *stage, in->data(), out->data(), r.decode_contexts[c], 1,
                             cfg.warmup, cfg.iters, cfg.resident_bytes, cfg.align);
      double med = median(d);
      sig_ctx[static_cast<size_t>(s) * C + c] = med;
      dsum += med;
      dmin = std::min(dmin, *std::min_element(d.begin(), d.end()));
      dmax = std::max(dmax, *std::max_element(d.begin(), d.end()));
    }
    sig_decode[s] = dsum / C;
    sig_dmin[s] = dmin;
    sig_dmax[s] = dmax;
  }
  if (progress) progress(sigs, sigs, "done");

  r.prefill_ms.resize(units);
  r.prefill_min_ms.resize(units);
  r.prefill_max_ms.resize(units);
  r.decode_ms.resize(units);
  r.decode_min_ms.resize(units);
  r.decode_max_ms.resize(units);
  r.decode_context_ms.resize(static_cast<size_t>(units) * C);
  for (int u = 0; u < units; ++u) {
    int s = model.units[u].signature;
    r.prefill_ms[u] = sig_prefill[s];
    r.prefill_min_ms[u] = sig_pmin[s];
    r.prefill_max_ms[u] = sig_pmax[s];
    r.decode_ms[u] = sig_decode[s];
    r.decode_min_ms[u] = sig_dmin[s];
    r.decode_max_ms[u] = sig_dmax[s];
    for (int c = 0; c < C; ++c)
      r.decode_context_ms[static_cast<size_t>(u) * C + c] = sig_ctx[static_cast<size_t>(s) * C + c];
  }
  return r;
}


}  // namespace ppb
