#include "profile/profiler.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "backend/lane_hold.h"
#include "common/error.h"
#include "common/flight_recorder.h"
#include "common/stats.h"

namespace ppb {

namespace {

/// The flight recorder's tag of a profiled forward of `stage` (prefill: from position 0).
flight::Tag profile_tag(const StageExecutor& stage, int tokens, int pos) {
  flight::Tag t;
  t.op = tokens > 1 || pos == 0 ? "profile prefill" : "profile decode";
  t.unit = stage.first_unit();
  return t;
}

/// One timed forward (ms), whatever `enqueue` puts on `stage` via the lane: cache flush (cold where the
/// run's resident weights exceed the caches, Device::flush_caches of `stage`'s memory), `align` where set (after the
/// flush, so that the ranks' timed forwards start together), then the forward bracketed by
/// events on `lane`, held until enqueued where `hold` (backend/lane_hold.h).
double time_enqueued(Device& device, Lane& lane, const StageExecutor& stage, const flight::Tag& tag, bool hold,
                     size_t resident_bytes, const std::function<void()>& align, const std::function<void()>& enqueue) {
  flight::Scope scope(tag);
  auto start = device.create_event();
  auto stop = device.create_event();
  if (align) {
    device.flush_caches(lane, resident_bytes, &stage);
    lane.synchronize();
    align();
  }
  auto forward = [&] {
    if (!align) device.flush_caches(lane, resident_bytes, &stage);
    lane.record(*start);
    enqueue();
    lane.record(*stop);
  };
  if (hold)
    enqueue_held(lane, forward);
  else
    forward();
  lane.synchronize();
  return 1e3 * (stop->time_s() - start->time_s());
}

/// One timed forward of `tokens` tokens per sequence at `pos` (time_enqueued).
double time_one_forward(Device& device, Lane& lane, StageExecutor& stage, const void* in, void* out, int pos,
                        int tokens, bool hold, size_t resident_bytes, const std::function<void()>& align) {
  return time_enqueued(device, lane, stage, profile_tag(stage, tokens, pos), hold, resident_bytes, align,
                       [&] { stage.enqueue_forward(lane, in, out, 0, pos, tokens); });
}

/// Whether a forward of `tokens` tokens is timed with its lane held: only after a warm-up (see
/// enqueue_held), and only for a forward of at most kMaxHeldLaunches launches: a larger one would
/// fill the device's launch queue behind its own hold (a deadlock); it is device-bound, so
/// timing it unheld adds no launch gaps. On the CPU the hold costs nothing timed.
bool held(const StageExecutor& stage, int tokens, int warmup) {
  return warmup > 0 && stage.launches_per_forward(tokens) <= kMaxHeldLaunches;
}

/// One timed ragged forward of `step` (time_enqueued).
double time_one_ragged(Device& device, Lane& lane, StageExecutor& stage, const void* in, void* out,
                       const RaggedStep& step, bool hold, size_t resident_bytes, const std::function<void()>& align) {
  return time_enqueued(device, lane, stage, profile_tag(stage, step.total_tokens(), step.pos.front()), hold, resident_bytes,
                       align, [&] { stage.enqueue_forward_ragged(lane, in, out, 0, step); });
}

/// The grid step as a ragged step in slots 0..rows-1.
RaggedStep ragged_of(const stepcost::GridStep& g) {
  RaggedStep r;
  for (std::size_t i = 0; i < g.pos.size(); ++i) {
    r.slot.push_back(static_cast<int32_t>(i));
    r.pos.push_back(g.pos[i]);
    r.tokens.push_back(g.tokens[i]);
  }
  return r;
}

}  // namespace

std::vector<double> time_ragged(Device& device, Lane& lane, StageExecutor& stage, const void* in, void* out,
                                const RaggedStep& step, int warmup, int iters, size_t resident_bytes,
                                const std::function<void()>& align) {
  {
    flight::Scope scope(profile_tag(stage, step.total_tokens(), step.pos.front()));
    for (int i = 0; i < warmup; ++i) stage.enqueue_forward_ragged(lane, in, out, 0, step);
    lane.synchronize();
  }
  const bool hold = held(stage, step.total_tokens(), warmup);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) t.push_back(time_one_ragged(device, lane, stage, in, out, step, hold, resident_bytes, align));
  return t;
}

std::vector<double> time_forwards(Device& device, Lane& lane, StageExecutor& stage, const void* in,
                                  void* out, int pos, int tokens, int warmup, int iters,
                                  size_t resident_bytes, const std::function<void()>& align) {
  {
    flight::Scope scope(profile_tag(stage, tokens, pos));
    for (int i = 0; i < warmup; ++i) stage.enqueue_forward(lane, in, out, 0, pos, tokens);
    lane.synchronize();
  }
  // One forward at a time: each is timed alone, as the pipeline runs it, with the lane held
  // until the forward is enqueued so that launch gaps are not timed.
  const bool hold = held(stage, tokens, warmup);
  stage.prepare_forward(0, pos, tokens);  // with --profile-warmup 0: a decode graph's capture, untimed
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i)
    ms[i] = time_one_forward(device, lane, stage, in, out, pos, tokens, hold, resident_bytes, align);
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

namespace {

/// Decode contexts: evenly spaced KV-cache lengths in [P, P+G-1] (the positions decode steps
/// write), so the mean over them is the mean decode cost of a generation.
std::vector<int> decode_contexts_of(const ProfileConfig& cfg) {
  std::vector<int> out;
  const int c_count = std::max(1, std::min(cfg.num_contexts, cfg.work.gen_len));
  for (int i = 0; i < c_count; ++i)
    out.push_back(cfg.work.prompt_len + (c_count == 1 ? 0 : (cfg.work.gen_len - 1) * i / (c_count - 1)));
  return out;
}

/// The profiled stages' config.
StageConfig stage_config_of(const ProfileConfig& cfg) {
  StageConfig sc;
  sc.work = cfg.work;
  sc.work.groups = 1;  // one unit at a time, one KV cache of P + G positions
  sc.cuda_graphs = cfg.cuda_graphs;
  sc.expert_skew = cfg.expert_skew;
  sc.tp_width = cfg.tp_width;
  sc.tp_rank = cfg.tp_rank;
  sc.tp = cfg.tp;
  return sc;
}

/// Medians of the grid's steps on one built unit, appended to `ms`. The steps are timed in
/// passes: an untimed pass (cfg.warmup > 0), then cfg.iters passes of one timed forward of every
/// step, each pass in its own order (grid_pass_order), so that a step's samples spread over the
/// whole grid's time, as the profile's cycles spread a unit's, and no step's samples all follow
/// the same steps: on the VMs of issue 13 the machine's speed moves by ~20% from one ~1-2 s
/// window to the next, and consecutive forwards of one step would all fall in one window (one
/// disturbed window made a layer's steps at 8-32 tokens 25-40% off in one grid). A unit whose cost
/// goes by rows (`by_rows`: the head, stepcost/step_model.h) times each row count of the fitted
/// steps once per pass and gives it to every fitted step of that many rows (its held-out steps
/// are timed each: their error must be measured). Every rank makes the same calls for the same
/// grid and model.
void time_grid_of_unit(Device& device, Lane& lane, StageExecutor& stage, Buffer& in, Buffer& out,
                       const ProfileConfig& cfg, const std::vector<stepcost::GridStep>& grid, bool by_rows,
                       std::vector<double>& ms) {
  const std::size_t N = grid.size();
  std::vector<RaggedStep> steps;
  std::vector<std::size_t> timed_as(N);  // the step whose timing step n takes
  std::map<std::size_t, std::size_t> first_of_rows;
  for (std::size_t n = 0; n < N; ++n) {
    steps.push_back(ragged_of(grid[n]));
    check_ragged_step(steps.back(), 0, stage_config_of(cfg).work);
    timed_as[n] = n;
    if (by_rows && grid[n].role != stepcost::Role::held_out)
      timed_as[n] = first_of_rows.emplace(grid[n].pos.size(), n).first->second;
  }
  const int passes = std::max(1, cfg.iters);
  std::vector<std::vector<double>> samples(N);
  for (int pass = -std::min(cfg.warmup, 1); pass < passes; ++pass) {
    std::vector<std::size_t> order(N);
    std::iota(order.begin(), order.end(), std::size_t{0});  // the untimed pass: grid order
    if (pass >= 0) order = grid_pass_order(N, cfg.work.seed, pass);
    for (std::size_t n : order) {
      if (timed_as[n] != n) continue;
      if (pass < 0) {
        stage.enqueue_forward_ragged(lane, in.data(), out.data(), 0, steps[n]);
        lane.synchronize();
        continue;
      }
      const bool hold = held(stage, steps[n].total_tokens(), cfg.warmup);
      samples[n].push_back(
          time_one_ragged(device, lane, stage, in.data(), out.data(), steps[n], hold, cfg.resident_bytes, cfg.align));
    }
  }
  for (std::size_t n = 0; n < N; ++n) ms.push_back(median(samples[timed_as[n]]));
}

/// One signature's timings: prefill median/min/max, decode mean over contexts of the medians,
/// min/max over all contexts, and each context's median.
struct SignatureTimes {
  double prefill = 0, pmin = 0, pmax = 0, decode = 0, dmin = 0, dmax = 0;
  std::vector<double> ctx;
};

/// One signature's timings from its forwards: `prefill` the prefill's, `ctx[c]` the decode
/// steps' at context c (each non-empty).
SignatureTimes summarize(const std::vector<double>& prefill, const std::vector<std::vector<double>>& ctx) {
  SignatureTimes t;
  t.prefill = median(prefill);
  t.pmin = *std::min_element(prefill.begin(), prefill.end());
  t.pmax = *std::max_element(prefill.begin(), prefill.end());
  double dsum = 0.0;
  t.dmin = 1e300;
  for (const auto& d : ctx) {
    const double med = median(d);
    t.ctx.push_back(med);
    dsum += med;
    t.dmin = std::min(t.dmin, *std::min_element(d.begin(), d.end()));
    t.dmax = std::max(t.dmax, *std::max_element(d.begin(), d.end()));
  }
  t.decode = dsum / static_cast<double>(ctx.size());
  return t;
}

/// Times one built unit: its prefill series, then one decode series per context.
SignatureTimes time_signature(Device& device, Lane& lane, StageExecutor& stage, Buffer& in, Buffer& out,
                              const ProfileConfig& cfg, const std::vector<int>& contexts) {
  const auto p = time_forwards(device, lane, stage, in.data(), out.data(), 0, cfg.work.prompt_len, cfg.warmup, cfg.iters,
                               cfg.resident_bytes, cfg.align);
  std::vector<std::vector<double>> d;
  for (int c : contexts)
    d.push_back(time_forwards(device, lane, stage, in.data(), out.data(), c, 1, cfg.warmup, cfg.iters,
                              cfg.resident_bytes, cfg.align));
  return summarize(p, d);
}

/// The per-unit result from the per-signature timings (units of one signature share them).
ProfileResult expand_to_units(const model::ModelSpec& model, const std::vector<int>& contexts,
                              const std::vector<SignatureTimes>& sig) {
  ProfileResult r;
  r.decode_contexts = contexts;
  const int units = model.num_units();
  const size_t C = contexts.size();
  for (int u = 0; u < units; ++u) {
    const SignatureTimes& t = sig[static_cast<size_t>(model.units[u].signature)];
    r.prefill_ms.push_back(t.prefill);
    r.prefill_min_ms.push_back(t.pmin);
    r.prefill_max_ms.push_back(t.pmax);
    r.decode_ms.push_back(t.decode);
    r.decode_min_ms.push_back(t.dmin);
    r.decode_max_ms.push_back(t.dmax);
    for (size_t c = 0; c < C; ++c) r.decode_context_ms.push_back(t.ctx[c]);
  }
  return r;
}

}  // namespace

ProfileResult profile_model(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg,
                            const ProgressFn& progress) {
  const int sigs = static_cast<int>(model.signatures.size());
  const std::vector<int> contexts = decode_contexts_of(cfg);
  const StageConfig sc = stage_config_of(cfg);
  auto lane = device.create_lane("profile");
  std::vector<SignatureTimes> times;
  for (int s = 0; s < sigs; ++s) {
    const int unit = model.signature_example[s];
    if (progress) progress(s, sigs, model.signatures[s] + " (" + model.units[unit].name + ")");
    auto stage = device.create_stage(model, unit, unit, sc);
    const size_t in_bytes = stage->input_bytes(cfg.work.prompt_len);
    auto in = device.allocate(in_bytes);
    auto out = device.allocate(std::max(stage->output_bytes(cfg.work.prompt_len), stage->output_bytes(1)));
    fill_input(*in, model, unit, in_bytes, cfg.work.seed, cfg.work.dtype);
    times.push_back(time_signature(device, *lane, *stage, *in, *out, cfg, contexts));
  }
  if (progress) progress(sigs, sigs, "done");
  return expand_to_units(model, contexts, times);
}

std::vector<std::size_t> grid_pass_order(std::size_t N, uint64_t seed, int pass) {
  std::vector<std::size_t> order(N);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 rng(seed * 7919ULL + static_cast<uint64_t>(pass));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

stepcost::GridSpec step_grid_spec(const ProfileConfig& cfg, int max_tokens) {
  stepcost::GridSpec g;
  g.max_rows = cfg.work.batch;
  g.max_context = cfg.work.max_context();
  g.max_tokens = std::max(1, std::min(max_tokens, cfg.work.batch * cfg.work.prompt_len));
  g.contexts = decode_contexts_of(cfg);
  return g;
}

StepGridResult profile_grid(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg,
                            const std::vector<stepcost::GridStep>& grid) {
  const StageConfig sc = stage_config_of(cfg);
  auto lane = device.create_lane("profile");
  StepGridResult r;
  r.grid = grid;
  for (std::size_t s = 0; s < model.signatures.size(); ++s) {
    const int unit = model.signature_example[s];
    auto stage = device.create_stage(model, unit, unit, sc);
    const size_t in_bytes = stage->input_bytes(cfg.work.prompt_len);
    auto in = device.allocate(in_bytes);
    auto out = device.allocate(std::max(stage->output_bytes(cfg.work.prompt_len), stage->output_bytes(1)));
    fill_input(*in, model, unit, in_bytes, cfg.work.seed, cfg.work.dtype);
    time_grid_of_unit(device, *lane, *stage, *in, *out, cfg, grid, model.units[unit].kind == model::UnitKind::head, r.ms);
  }
  return r;
}

int fixed_cost_unit(const model::ModelSpec& model) {
  for (int u = 0; u + 1 < model.num_units(); ++u)
    if (model.units[u].signature == model.units[u + 1].signature) return u;
  return -1;
}

size_t fixed_cost_bytes(const Device& device, const model::ModelSpec& model, const ProfileConfig& cfg) {
  const int unit = fixed_cost_unit(model);
  if (unit < 0) return 0;
  const StageConfig sc = stage_config_of(cfg);
  return device.stage_bytes(model, unit, unit, sc).total() + device.stage_bytes(model, unit, unit + 1, sc).total();
}

FixedCostTiming join_fixed_windows(const FixedCostTiming& a, const FixedCostTiming& b) {
  FixedCostTiming out;
  const std::size_t K = a.one_ms.size() / 2;
  if (a.unit < 0 || b.unit != a.unit || K == 0 || a.one_ms.size() != 2 * K || b.one_ms.size() != 2 * K ||
      a.two_ms.size() != 2 * K || b.two_ms.size() != 2 * K)
    return out;
  out.unit = a.unit;
  for (std::size_t kind = 0; kind < 2; ++kind)
    for (const FixedCostTiming* w : {&a, &b}) {
      const auto from = static_cast<long>(kind * K), to = static_cast<long>((kind + 1) * K);
      out.one_ms.insert(out.one_ms.end(), w->one_ms.begin() + from, w->one_ms.begin() + to);
      out.two_ms.insert(out.two_ms.end(), w->two_ms.begin() + from, w->two_ms.begin() + to);
    }
  return out;
}

FixedCostTiming time_fixed_cost(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg, int pairs) {
  FixedCostTiming r;
  const int unit = fixed_cost_unit(model);
  if (unit < 0 || pairs < 1) return r;
  r.unit = unit;
  const StageConfig sc = stage_config_of(cfg);
  auto lane = device.create_lane("profile");
  auto one = device.create_stage(model, unit, unit, sc);
  auto two = device.create_stage(model, unit, unit + 1, sc);
  const int P = cfg.work.prompt_len;
  const size_t in_bytes = one->input_bytes(P);
  auto in = device.allocate(in_bytes);
  auto out = device.allocate(std::max({one->output_bytes(P), one->output_bytes(1), two->output_bytes(P), two->output_bytes(1)}));
  fill_input(*in, model, unit, in_bytes, cfg.work.seed, cfg.work.dtype);
  const std::vector<int> contexts = decode_contexts_of(cfg);
  const std::pair<int, int> shapes[2] = {{0, P}, {contexts[contexts.size() / 2], 1}};  // (pos, tokens): prefill, decode
  for (const auto& [pos, tokens] : shapes) {
    for (StageExecutor* st : {one.get(), two.get()}) {
      flight::Scope scope(profile_tag(*st, tokens, pos));
      for (int i = 0; i < cfg.warmup; ++i) st->enqueue_forward(*lane, in->data(), out->data(), 0, pos, tokens);
      lane->synchronize();
      st->prepare_forward(0, pos, tokens);
    }
    for (int i = 0; i < pairs; ++i) {
      double t[2];
      for (int j = 0; j < 2; ++j) {
        const int which = (i + j) % 2;  // pair i: one then two where i is even
        StageExecutor& st = which == 0 ? *one : *two;
        t[which] = time_one_forward(device, *lane, st, in->data(), out->data(), pos, tokens, held(st, tokens, cfg.warmup),
                                    cfg.resident_bytes, cfg.align);
      }
      r.one_ms.push_back(t[0]);
      r.two_ms.push_back(t[1]);
    }
  }
  return r;
}

ResidentProfiler::ResidentProfiler(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg)
    : device_(device), model_(model), contexts_(decode_contexts_of(cfg)), lane_(device.create_lane("profile")) {
  const StageConfig sc = stage_config_of(cfg);
  for (size_t s = 0; s < model.signatures.size(); ++s) {
    const int unit = model.signature_example[s];
    Unit u;
    u.stage = device.create_stage(model, unit, unit, sc);
    const size_t in_bytes = u.stage->input_bytes(cfg.work.prompt_len);
    u.in = device.allocate(in_bytes);
    u.out = device.allocate(std::max(u.stage->output_bytes(cfg.work.prompt_len), u.stage->output_bytes(1)));
    fill_input(*u.in, model, unit, in_bytes, cfg.work.seed, cfg.work.dtype);
    units_.push_back(std::move(u));
  }
}

size_t ResidentProfiler::bytes(const Device& device, const model::ModelSpec& model, const ProfileConfig& cfg) {
  const StageConfig sc = stage_config_of(cfg);
  size_t total = 0;
  for (size_t s = 0; s < model.signatures.size(); ++s) {
    const int unit = model.signature_example[s];
    total += device.stage_bytes(model, unit, unit, sc).total();
  }
  return total;
}

ProfileResult ResidentProfiler::profile(const ProfileConfig& cfg) {
  if (decode_contexts_of(cfg) != contexts_)
    throw InternalError("ResidentProfiler::profile: the config's decode contexts differ from the built units'");
  std::vector<SignatureTimes> times;
  for (Unit& u : units_) times.push_back(time_signature(device_, *lane_, *u.stage, *u.in, *u.out, cfg, contexts_));
  return expand_to_units(model_, contexts_, times);
}

StepGridResult ResidentProfiler::time_grid(const ProfileConfig& cfg, const std::vector<stepcost::GridStep>& grid) {
  StepGridResult r;
  r.grid = grid;
  for (Unit& u : units_)
    time_grid_of_unit(device_, *lane_, *u.stage, *u.in, *u.out, cfg, grid,
                      model_.units[u.stage->first_unit()].kind == model::UnitKind::head, r.ms);
  return r;
}

std::pair<ProfileResult, ProfileResult> ResidentProfiler::profile_interleaved(const ProfileConfig& cfg, int turns,
                                                                              const std::function<Turn(int)>& enter) {
  if (decode_contexts_of(cfg) != contexts_)
    throw InternalError("ResidentProfiler::profile_interleaved: the config's decode contexts differ from the built units'");
  if (turns < 1 || cfg.iters < 1) throw InternalError("ResidentProfiler::profile_interleaved: turns and iters must be >= 1");
  struct Item {
    size_t unit;
    int pos, tokens;
  };
  std::vector<Item> items;  // per signature: its prefill, then a decode step at each context
  for (size_t s = 0; s < units_.size(); ++s) {
    items.push_back({s, 0, cfg.work.prompt_len});
    for (int c : contexts_) items.push_back({s, c, 1});
  }
  for (int w = 0; w < cfg.warmup; ++w)
    for (const Item& it : items) {
      Unit& u = units_[it.unit];
      flight::Scope scope(profile_tag(*u.stage, it.tokens, it.pos));
      u.stage->enqueue_forward(*lane_, u.in->data(), u.out->data(), 0, it.pos, it.tokens);
    }
  lane_->synchronize();
  // samples[k][j]: the forwards of item j in this rank's alone (k = 0) or together (k = 1) turns
  std::vector<std::vector<double>> samples[2];
  for (auto& s : samples) s.resize(items.size());
  for (int i = 0; i < cfg.iters; ++i)
    for (int k = 0; k < turns; ++k) {
      const Turn role = enter((k + i) % turns);
      if (role == Turn::wait) continue;
      const bool together = role == Turn::together;
      for (size_t j = 0; j < items.size(); ++j) {
        const Item& it = items[j];
        Unit& u = units_[it.unit];
        u.stage->prepare_forward(0, it.pos, it.tokens);
        samples[together ? 1 : 0][j].push_back(time_one_forward(
            device_, *lane_, *u.stage, u.in->data(), u.out->data(), it.pos, it.tokens,
            held(*u.stage, it.tokens, cfg.warmup), cfg.resident_bytes, together ? cfg.align : std::function<void()>{}));
      }
    }
  auto result = [&](const std::vector<std::vector<double>>& s) {
    if (s.front().empty()) return ProfileResult{};
    std::vector<SignatureTimes> times;
    const size_t per = 1 + contexts_.size();
    for (size_t u = 0; u < units_.size(); ++u)
      times.push_back(summarize(s[u * per], std::vector<std::vector<double>>(s.begin() + static_cast<std::ptrdiff_t>(u * per + 1),
                                                                             s.begin() + static_cast<std::ptrdiff_t>((u + 1) * per))));
    return expand_to_units(model_, contexts_, times);
  };
  return {result(samples[0]), result(samples[1])};
}

}  // namespace ppb
