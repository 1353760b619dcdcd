// The profiler: times every unit signature of a model on this rank's device, one unit
// instantiated at a time (so a 70B model profiles on one GPU), for prefill and for decode at
// several KV-cache lengths (DESIGN.md §1 step 3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "common/workload.h"
#include "model/model_spec.h"
#include "stepcost/step_model.h"

namespace ppb {

struct ProfileConfig {
  /// B sequences, P prefill tokens per sequence, G decode steps (decode is timed at contexts in
  /// [P, P+G)), dtype and seed of the profiled units. work.groups is not used: every unit is
  /// built with one request group.
  Workload work{1, 16, 4};
  int num_contexts = 3; ///< decode contexts sampled evenly in [P, P+G-1]
  int warmup = 2;       ///< untimed forwards before each timed series
  int iters = 5;        ///< timed forwards; the median is kept
  bool cuda_graphs = true;  ///< StageConfig::cuda_graphs of the profiled stages (as the pipeline's)
  double expert_skew = 0.0; ///< StageConfig::expert_skew of the profiled stages (as the pipeline's)
  /// Weight bytes the run keeps resident on this device's cache domain (all its ranks' stages);
  /// decides whether units are timed cold (Device::flush_caches). 0 = always warm.
  size_t resident_bytes = 0;
  /// Called before each timed forward, after its cache flush (null: not called). For the
  /// profile's together pass (balance/contention.h), `ppbench run` passes a barrier of all
  /// ranks: every rank then times the same forward at the same moment, as the stages run in the
  /// pipeline, where the ranks of a machine stream their weights at once and share the memory
  /// bandwidth. Every rank must make the same calls (same model and config).
  std::function<void()> align;
  /// Tensor parallelism (issue 14): profile this rank's shard of every unit at width tp_width,
  /// all-reducing through `tp` with the group's other ranks, which must run profile_model with
  /// the same config at the same time (StageConfig::tp_width, tp_rank, tp).
  int tp_width = 1;
  int tp_rank = 0;
  TpGroup* tp = nullptr;
};

/// Timings of one rank. Units with one signature share their values.
struct ProfileResult {
  std::vector<int> decode_contexts;        ///< [C] KV-cache lengths at which decode was timed
  std::vector<double> prefill_ms;          ///< [U] median prefill forward (ms)
  std::vector<double> prefill_min_ms;      ///< [U] fastest timed prefill
  std::vector<double> prefill_max_ms;      ///< [U] slowest timed prefill
  std::vector<double> decode_ms;           ///< [U] mean over contexts of the median decode forward (ms)
  std::vector<double> decode_min_ms;       ///< [U] fastest timed decode over all contexts
  std::vector<double> decode_max_ms;       ///< [U] slowest timed decode over all contexts
  std::vector<double> decode_context_ms;   ///< [U][C] median decode forward at each context (ms)
};

/// The step model's grid timed on one rank (issue 47, stepcost/step_model.h): ms[s * N + n] is
/// the median of the timed ragged forwards of grid step n on one unit of signature s.
struct StepGridResult {
  std::vector<stepcost::GridStep> grid;  ///< [N]
  std::vector<double> ms;                ///< [signatures][N]
};

/// The order the grid's timed pass `pass` (>= 0) takes its N steps in: a permutation of 0..N-1
/// drawn from `seed` and the pass (std::mt19937_64, std::shuffle), the same on every rank of one
/// build, so that the ranks' aligned forwards time the same step. Each pass its own order: in
/// grid order, a run of consecutive steps fell in the same slow stretch pass after pass and their
/// medians kept it (docs/MEASUREMENTS.md § "2026-12-06 slow windows, the rate band and a public
/// trace replayed").
std::vector<std::size_t> grid_pass_order(std::size_t N, uint64_t seed, int pass);

/// The grid the profile times for `cfg`'s workload: B rows, steps up to `max_tokens` tokens
/// (<= B·P: the units' buffers hold B·P tokens), the cache's P + G positions, the decode
/// contexts of the profile (evenly spaced in [P, P+G-1]).
stepcost::GridSpec step_grid_spec(const ProfileConfig& cfg, int max_tokens);

/// One rank's timings of a forward's fixed cost (issue 47, stepcost::FixedCost): a one-unit
/// stage of unit `unit` and a two-unit stage of units unit and unit + 1 (one signature), each
/// timed as the cycles time a unit (cache flush, cfg.align, lane held), in `pairs` pairs whose
/// order alternates (one then two, two then one), after cfg.warmup untimed forwards of each.
/// Kind 0: a prefill of B rows of P tokens; kind 1: a decode of B rows at the middle profiled
/// context (the cycles' shapes, and with CUDA graphs their decode replays a graph, as theirs).
struct FixedCostTiming {
  int unit = -1;                      ///< the pair's first unit; -1: nothing timed (fixed_cost_unit)
  std::vector<double> one_ms, two_ms;  ///< [2][pairs] ms
};

/// The first unit u whose successor has its signature (a decoder layer, where a model has two),
/// -1 where none has.
int fixed_cost_unit(const model::ModelSpec& model);

/// Device memory time_fixed_cost's two stages take (bytes; 0 where fixed_cost_unit is -1).
size_t fixed_cost_bytes(const Device& device, const model::ModelSpec& model, const ProfileConfig& cfg);

/// Two windows' timings as one: per kind, window `a`'s pairs then `b`'s ([2][pairs_a + pairs_b]);
/// nothing (unit -1) unless both timed the same unit and the same number of pairs per kind.
FixedCostTiming join_fixed_windows(const FixedCostTiming& a, const FixedCostTiming& b);

/// Times FixedCostTiming on this rank (both stages built for the call: three units' memory).
/// Every rank that profiles must make the same call (cfg.align). Nothing timed (unit -1) where
/// fixed_cost_unit is -1 or pairs < 1. @throws UserError if the stages do not fit.
FixedCostTiming time_fixed_cost(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg, int pairs);

/// Progress callback: (signatures done, signatures total, what is being timed).
using ProgressFn = std::function<void(int, int, const std::string&)>;

/// Times `iters` forwards of `stage` after `warmup` untimed ones, each bracketed by events on
/// `lane`; returns the elapsed times (ms). The timing harness shared by profile and tests.
/// `align`, when set, runs on this thread before each timed forward, after its cache flush
/// completed (ProfileConfig::align).
std::vector<double> time_forwards(Device& device, Lane& lane, StageExecutor& stage, const void* in,
                                  void* out, int pos, int tokens, int warmup, int iters,
                                  size_t resident_bytes = 0, const std::function<void()>& align = {});

/// Times `iters` ragged forwards of `step` on `stage` (group 0) after `warmup` untimed ones, each
/// bracketed by events on `lane` after its cache flush (cold where resident_bytes exceed the
/// caches, as time_forwards); returns the elapsed times (ms). The grid's timing harness
/// (ResidentProfiler::time_grid) and the stage-against-units benchmark's.
std::vector<double> time_ragged(Device& device, Lane& lane, StageExecutor& stage, const void* in, void* out,
                                const RaggedStep& step, int warmup, int iters, size_t resident_bytes = 0,
                                const std::function<void()>& align = {});

/// Profiles every signature of `model` on `device`. @throws UserError if a unit does not fit.
ProfileResult profile_model(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg,
                            const ProgressFn& progress = {});

/// ResidentProfiler::time_grid building one unit at a time (where one of every signature does
/// not fit at once).
StepGridResult profile_grid(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg,
                            const std::vector<stepcost::GridStep>& grid);

/// One unit of every signature of a model, built once and profiled again and again: the profile
/// cycles ppbench run takes between benchmark rounds (issue 13), where building the units anew
/// each time would cost more than timing them (a small model's embedding and head). Holds
/// bytes() of device memory for its lifetime. Not copyable (it owns stages).
class ResidentProfiler {
 public:
  /// Builds the units for `cfg`'s shapes (batch, P, G, contexts, dtype, seed, tensor parallelism).
  /// @throws UserError if a unit does not fit the device.
  ResidentProfiler(Device& device, const model::ModelSpec& model, const ProfileConfig& cfg);
  /// Device memory the units take (Device::stage_bytes of each), bytes.
  static size_t bytes(const Device& device, const model::ModelSpec& model, const ProfileConfig& cfg);
  /// One profile of every signature, exactly as profile_model times it (warm-up, cfg.iters
  /// timed forwards, cfg.align before each), per unit. cfg must have the constructor's shapes
  /// (@throws InternalError where its decode contexts differ).
  ProfileResult profile(const ProfileConfig& cfg);

  /// This rank's part in one turn of profile_interleaved.
  enum class Turn { wait, alone, together };
  /// One profile cycle in which the passes take turns forward by forward (issue 13). After
  /// cfg.warmup untimed forwards of every (signature, phase, context) on every rank at once, each
  /// of cfg.iters iterations runs `turns` turns, in an order rotated by one per iteration, and in
  /// each turn a rank that times (`enter` says so) times one forward of every signature: its
  /// prefill, then a decode step at each context. `enter(t)` is called on this rank before turn t
  /// of every iteration; it must be a collective of all ranks that profile (e.g. a barrier, then
  /// whose turn t is) and return the same for the same t on every call. In a `together` turn
  /// cfg.align runs before each timed forward, as in profile(). Why: a unit's cost, a rank's
  /// alone cost and its cost with the machine's other ranks computing were each timed in a
  /// window of their own, seconds apart; on the 2-core VMs of issue 13 the machine's speed moves
  /// by ~+-20% over such windows and holds for ~1-2 s, so the ratios the balancer decides on (the
  /// head against a layer, one rank against another, together against alone) carried it. Here
  /// every figure of an iteration is timed within ~1 s of the others.
  /// Returns (alone, together): each as profile() returns it (medians over the iterations, each
  /// context's median, decode the mean over contexts, min/max over all forwards), alone empty
  /// (no decode_contexts) where this rank timed no alone turn, likewise together.
  /// @throws InternalError where cfg's decode contexts differ from the built units' or turns < 1.
  /// Times every step of `grid` on the unit of every signature as a ragged forward (one KV
  /// cache, rows in slots 0..rows-1): cfg.warmup untimed forwards, then cfg.iters timed, each
  /// after its cache flush and cfg.align (the together pass's barrier: every rank must time the
  /// same grid), the median kept. @throws InternalError on a step outside the units' shape.
  StepGridResult time_grid(const ProfileConfig& cfg, const std::vector<stepcost::GridStep>& grid);

  std::pair<ProfileResult, ProfileResult> profile_interleaved(const ProfileConfig& cfg, int turns,
                                                              const std::function<Turn(int)>& enter);

 private:
  struct Unit {
    std::unique_ptr<StageExecutor> stage;
    std::unique_ptr<Buffer> in, out;
  };
  Device& device_;
  const model::ModelSpec& model_;
  std::vector<int> contexts_;
  std::unique_ptr<Lane> lane_;
  std::vector<Unit> units_;
};

}  // namespace ppb
