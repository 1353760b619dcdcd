// A stage's step time for a ragged serving batch (issue 38), from the profile of a results file:
// the cost model the serving simulator (serving/pipeline_sim.h) plays a partition with.
//
// What the profile timed, per unit and rank (results/run_record.h ProfileTable, the workload's
// B rows, P prompt tokens, G decode steps):
//  - prefill: one forward of B sequences of P tokens, B·P tokens (latency_ms, phase 0);
//  - decode: one forward of B sequences of one token each, all at KV-cache context c, for each
//    c of decode_contexts (evenly spaced in [P, P+G-1]; decode_context_ms [R][U][C]).
// Where the profile has two passes (alone, then all ranks of a machine together: latency_alone_ms
// non-empty), both tables are the together pass's, the one the balancer solves on; the contention
// model between the passes (balance/contention.h) is applied by the serving simulator, to which
// ProfileStepCosts gives each stage's alone / together sums per kind of step and its machine
// (serving::StageContention; pipeline_sim.h).
//
// The model, for stage k (units first..last on rank r) and a step of shape s (StepShape):
//   prefill(s) = (s.prefill_tokens / (B·P)) x sum_u latency_ms[r][u][prefill]
//   decode(s)  = s.decode_rows > 0 ? sum_u D_u(clamp(s.decode_context_mean)) : 0
//   step(s)    = prefill(s) + decode(s)
// with D_u(c) the unit's decode step interpolated linearly in c between the profiled contexts,
// c clamped to [first, last] profiled context. Assumptions, each a simplification:
//  1. Prefill cost is linear in tokens: the profiled step's per-token cost at any prompt length
//     and row count (the attention term, quadratic in a prompt's length, and a GEMM's lower
//     efficiency at few tokens are not modelled; the head's once-per-row logits are counted per
//     token). Exact at the profiled point: B prompts of P tokens.
//  2. A decode step costs the same for 1..B rows (memory-bound: each step reads the unit's
//     weights once, whatever the rows); B rows at the profiled contexts are the profiled points.
//     Steps of more than B rows are refused (the serving B may not exceed the profile's).
//  3. A decode step's rows at different contexts cost as all rows at their mean context (exact
//     where the step is linear in context, as KV reads are).
//  4. A mixed step (prefills and decodes in one forward) costs the sum of both parts (no
//     overlap of the two within a forward).
//  5. A tensor-parallel stage has no context table (the group's profile is latency_ms [U][2]):
//     its decode step is the group's mean over contexts times the shape, in context, of its first
//     rank's width-1 curve (D(c) / mean D over the profiled contexts).
//  6. A profile without decode_context_ms (older files) gives a decode step constant in context:
//     the profile's decode phase (the mean over its contexts).
// Where the profile timed the step model's grid (issue 47: /profile/step_model, `ppbench run
// --step-grid-iters`, on by default), a width-1 stage's compute is instead the sum over its
// units of their signature's stepcost::UnitModel on the stage's rank (stepcost/step_model.h:
// piecewise linear in the step's tokens, the head's in its rows, plus the attention keys),
// fitted to steps timed over the shapes above — prefill at many token counts in B rows and one,
// decode at 1..B rows across contexts, a mixed step — and assumptions 1-4 and 6 do not apply.
// A tensor-parallel stage's compute is its group's grid (timed at the group's width on its
// shards: /profile/tp step_ms) fitted the same way; a group without one (older files) keeps the
// two-shape model. A one-rank stage of n units pays a forward's fixed cost once where its rank's profile took one
// (stepcost::FixedCost, /profile/step_model fixed_*: each unit's timings carry it, so the sum less (n - 1) of it),
// in the step model and the two-shape model alike (Predictor::stage_sums); a TP stage's group times none. Not
// modelled: contexts beyond P + G - 1 (the grid's last knot's slope).
//
// Pure C++ (no MPI, device or HDF5): functions of a RunRecord and a Partition.
#pragma once

#include <array>
#include <vector>

#include "balance/partition.h"
#include "balance/predict.h"
#include "results/run_record.h"
#include "serving/pipeline_sim.h"
#include "stepcost/step_model.h"

namespace ppb::balance {

/// One stage's profiled points for the step-time model (ms, tokens).
struct StageStepProfile {
  double prefill_ms = 0.0;             ///< one profiled prefill step of the stage (B·P tokens)
  double prefill_tokens = 1.0;         ///< B·P: the tokens of that step (> 0)
  int decode_rows = 1;                 ///< B: the rows of a profiled decode step
  std::vector<double> contexts;        ///< [C] ascending KV-cache contexts (tokens); empty = constant
  std::vector<double> decode_ms;       ///< [C] the stage's decode step at each (or [1]: constant)
};

/// The stage's decode step (ms) at `context` tokens: linear between the profiled contexts,
/// clamped to their range; decode_ms[0] with fewer than two contexts.
double decode_step_ms(const StageStepProfile& s, double context);

/// The model's step time of a stage (ms) for a step of shape `shape` (file comment).
/// @throws ppb::InternalError when shape.decode_rows exceeds the profiled rows s.decode_rows.
double stage_step_ms(const StageStepProfile& s, const serving::StepShape& shape);

/// The profiled points of every stage of `p` from `run`'s profile (latency_ms and
/// decode_context_ms, the together tables; a tensor-parallel stage from its group's profile,
/// assumption 5), [S].
/// @throws ppb::UserError when a stage's units or rank are outside the profile, a
///         tensor-parallel stage has no group profile, or the workload lacks B or P.
std::vector<StageStepProfile> stage_step_profiles(const RunRecord& run, const Predictor& pred, const Partition& p);

/// The step work of a serving step shape (tokens, rows and attention keys, as stepcost counts).
stepcost::StepWork step_work_of(const serving::StepShape& s);

/// The balancer's costs under a scenario's step mix (issue 47), from one fit of the profile's
/// step model (fit_step_model) at the pooled level of the grid and the cycles
/// (stepcost::pooled_level, step_model_levels):
///  - unit_ms [R][U] ms: unit u on rank r costs `scale` x the sum over `shapes` of its
///    signature's step model on r. With scale = B / N for the N requests those steps served, a
///    unit's busy time per B requests: the workload objective's unit (a group's life), so the
///    transfers the problem adds keep their weight.
///  - stage_fixed_ms [R] ms: `scale` x the sum over `shapes` of rank r's forward fixed cost of the
///    step's kind (a step with prefill rows: the prefill F, else the decode F;
///    results/profile_step_fit.h applied_fixed_ms) at the same level. Each unit's cost carries it
///    once (the grid times one-unit stages), so apply_stage_fixed(problem, this) on those costs
///    charges it once per stage, as ProfileStepCosts does. Empty where the profile took none.
/// Both empty where the profile has no grid or `shapes` is empty (the simulator records them for
/// the workload objective only: with --objective decode or prefill the objective's own costs
/// stand, not a mix of no steps priced 0).
struct StepMixCosts {
  std::vector<double> unit_ms, stage_fixed_ms;
};
StepMixCosts step_mix_costs(const RunRecord& run, const std::vector<serving::StepShape>& shapes, double scale);

/// The serving simulator's cost model of partition `p` of `run`: each stage's step time from
/// the step model where the profile timed its grid (a width-1 stage: its rank's fits; a
/// tensor-parallel stage: its group's, group_profile's group at its width; each scaled per kind
/// of step by stepcost::pooled_level of its rank's or group's level against the cycles), else from
/// stage_step_profiles, each boundary's transfer over its measured link (Predictor::boundary_link:
/// the hidden states of every token of the step, or the rows' token ids from the last stage,
/// times the hand-off copies), as the closed simulator charges its steps. Keeps a reference to
/// `pred` (and through it to `run`): both must outlive it.
class ProfileStepCosts final : public serving::StepCostModel {
 public:
  /// @throws what stage_step_profiles throws.
  ProfileStepCosts(const RunRecord& run, const Predictor& pred, const Partition& p);
  int stages() const override { return static_cast<int>(stages_.size()); }
  double compute_ms(int k, const serving::StepShape& s) const override;
  double transfer_ms(int k, const serving::StepShape& s) const override;
  /// [S] each stage's machine (Predictor::stage_machines), its alone / together sums of the
  /// profile's two passes per kind of step (Predictor::pass_sums: prefill for steps with prefill
  /// rows, decode for decode-only; 1 with one pass, for a tensor-parallel stage and where a sum is
  /// not > 0) and whether a twin replica overlaps it always (Predictor::twin_on_machine).
  std::vector<serving::StageContention> contention() const override { return contention_; }
  const std::vector<StageStepProfile>& profiles() const { return stages_; }
  /// Whether stage k's compute comes from the step model (else the two-shape model).
  bool uses_step_model(int k) const { return !stage_units_.at(static_cast<std::size_t>(k)).empty(); }

 private:
  const Predictor& pred_;
  std::vector<StageStepProfile> stages_;
  std::vector<stepcost::UnitModel> fits_;  ///< [R][signatures], then [signatures] per TP group used; empty: no grid
  std::vector<std::vector<std::pair<int, int>>> stage_units_;  ///< [S] (index into fits_, units of it)
  std::vector<stepcost::Level> levels_;  ///< [S] the stage's rank's (group's) grid level against its cycles
  /// [S] (prefill, decode): stepcost::stage_fixed_correction_ms of the stage's rank's applied
  /// forward fixed cost (0 for a TP stage and where the profile timed none)
  std::vector<std::array<double, 2>> fixed_ms_;
  std::vector<Predictor::BoundaryLink> links_;  ///< [S]
  std::vector<serving::StageContention> contention_;  ///< [S]
};

}  // namespace ppb::balance
