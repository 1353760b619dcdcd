// The serving step model calibrated on the steps a run measured (issue 38): each partition's
// scenario predicted again from the profile scaled per rank by what the *other* partitions'
// steps on that rank measured in the same rounds, as the closed benchmark's cross-calibration
// does for whole stages (balance/contention.h).
//
// Why: the profile's step model (serving_step_model.h) takes prefill as linear in tokens from
// one profiled point (B·P tokens). The steps measured on the CPU backend show a GEMM whose cost
// per token is far from constant at the small token counts continuous batching makes: a mixed
// step of 14 prompt tokens and 3 decode rows (17 token rows) took 247 ms on a stage whose step
// of 12 + 3 took 108 ms and whose profile says 149 ms (Qwen3-0.6B, 2 ranks: the small-M kernel
// takes up to 16 rows, the GEMM library above). A factor per band of a step's tokens, measured
// on the other splits' stages of the same rank, carries that shape without another profile.
//
// The calibration, per rank r: for every measured step of every other partition whose stage k
// runs on r, the ratio measured compute / ProfileStepCosts' compute for the step's shape; the
// median ratio of its decode-only steps (decode_factor), and of its steps with prefill rows per
// band of the step's token rows (prefill tokens + decode rows): [1, 16], [17, 32], [33, 64],
// [65, 128], [129, inf) (prefill_factor; a band without samples takes the nearest band's, and
// a rank without samples factor 1). Where a stage's compute comes from the step model
// (serving_step_model.h, the profile's grid: issue 47), which carries the shape itself, its
// steps pool into two busy-time ratios, sum measured / sum modelled over the decode-only steps and
// over the steps with prefill rows (every band the same): two per-rank scales on the same model
// (by_kind); not their medians, which the rounds' skewed ratios (a few slow steps) leave a few %
// under the busy time a queue serves at (docs/MEASUREMENTS.md § 2026-12-07 issue 47's bars
// again). A tensor-parallel stage's steps
// (its group's model) count for the group's first rank, beside that rank's width-1 stages' and
// applied to both; its peers get none of them. One pooled median (before
// 2026-12-06) scaled the prefills by the decode steps' ratio, which dominates the steps: Qwen3-0.6B,
// 2 ranks, 64-token prompts, its decode steps measured 1.46x / 1.24x the model (rank 0 / 1) where
// its steps with prefill measured 1.13x / 1.12x, and the TTFT cross-calibrated came out +46..+73%
// (docs/MEASUREMENTS.md § 2026-12-06 step policies). Pure C++.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "balance/predict.h"
#include "balance/serving_step_model.h"
#include "results/run_record.h"

namespace ppb::balance {

/// Upper bounds (inclusive) of the token bands of StepCalibration (the last is unbounded).
inline const std::vector<int> kStepTokenBands = {16, 32, 64, 128};

/// One rank's factors: measured / modelled step compute.
struct StepCalibration {
  double decode_factor = 1.0;
  std::vector<double> prefill_factor = std::vector<double>(kStepTokenBands.size() + 1, 1.0);  ///< [bands]
  int decode_samples = 0;
  /// The step model's stages: decode_factor the decode-only steps' busy time over the model's,
  /// every prefill_factor the steps with prefill's (prefill_samples[0] their count); not per band.
  bool by_kind = false;
  std::vector<int> prefill_samples = std::vector<int>(kStepTokenBands.size() + 1, 0);
  /// The factor for a step of shape `s`.
  double factor(const serving::StepShape& s) const;
};

/// The band of a step of `tokens` token rows, in [0, kStepTokenBands.size()].
int step_token_band(long long tokens);

/// Per rank [R], the calibration from the measured steps (ServingPartitionRecord::step_*) of
/// every serving partition of `run` except `exclude` (a name), each against its own
/// ProfileStepCosts; `parts`: the balance::Partition of each of run.serving.partitions, same
/// order. Partitions without steps contribute nothing.
std::vector<StepCalibration> calibrate_steps(const RunRecord& run, const Predictor& pred,
                                             const std::vector<Partition>& parts, const std::string& exclude);

/// Per rank [R], the calibration from the measured steps of partition `name` alone (an in-sample
/// scale: the level its own rounds ran at against the profile's model; ranks it does not use
/// keep factors of 1). Same fit as calibrate_steps.
std::vector<StepCalibration> calibrate_own_steps(const RunRecord& run, const Predictor& pred,
                                                 const std::vector<Partition>& parts, const std::string& name);

/// ProfileStepCosts of `p` with each stage's compute scaled by its rank's calibration.
class CalibratedStepCosts final : public serving::StepCostModel {
 public:
  /// `by_rank` [R]; keeps references to `run`'s and `pred`'s data through ProfileStepCosts.
  CalibratedStepCosts(const RunRecord& run, const Predictor& pred, const Partition& p, std::vector<StepCalibration> by_rank);
  int stages() const override { return base_.stages(); }
  double compute_ms(int k, const serving::StepShape& s) const override;
  double transfer_ms(int k, const serving::StepShape& s) const override { return base_.transfer_ms(k, s); }

 private:
  ProfileStepCosts base_;
  std::vector<int> rank_;  ///< [S] the rank of each stage
  std::vector<StepCalibration> by_rank_;
};

/// ProfileStepCosts of `p` with each step's compute scaled by the measured / modelled ratio of
/// one of partition `sp`'s own measured steps (ServingPartitionRecord::step_*, its last round),
/// taken in the order they ran, per stage and kind of step: the n-th decode-only step the
/// simulator forms on stage k takes the ratio of the n-th decode-only step measured on stage k
/// (steps with prefill rows likewise; cycling where the play forms more; a kind the round did not
/// measure on that stage keeps the model's time). Not a prediction: the
/// simulator replaying the round's own step times, slow windows and all, so that a miss splits
/// into the level between the profile and the rounds (CalibratedStepCosts by calibrate_own_steps),
/// the steps' movement inside the round (this, against that), and the simulator's structure
/// (this, against the measurement). Stateful: one play per instance.
class ReplayedStepCosts final : public serving::StepCostModel {
 public:
  /// @throws ppb::InternalError where sp's stages are not p's.
  ReplayedStepCosts(const RunRecord& run, const Predictor& pred, const Partition& p, const ServingPartitionRecord& sp);
  int stages() const override { return base_.stages(); }
  double compute_ms(int k, const serving::StepShape& s) const override;
  double transfer_ms(int k, const serving::StepShape& s) const override { return base_.transfer_ms(k, s); }

 private:
  ProfileStepCosts base_;
  std::vector<std::array<std::vector<double>, 2>> ratios_;  ///< [S][with prefill, decode-only] in order
  mutable std::vector<std::array<size_t, 2>> next_;          ///< [S][kind] the next ratio's index
};

}  // namespace ppb::balance

namespace ppb::balance {

/// The scenario of run.serving (its requests: arrival_s, prompt_len, gen_len; each partition's
/// M and B; the step policy and --goodput limits as stored) played by the serving simulator on
/// each serving partition (`parts`: its balance::Partition, same order): simulated_* from the
/// profile (ProfileStepCosts), and, where another partition measured steps, cross_* from the
/// profile calibrated by them (calibrate_steps; cross_calibrated_by names them), and, where the
/// partition measured steps itself, self_* and step_level from the profile calibrated by its own
/// steps (calibrate_own_steps: not a prediction, an in-sample check that splits a miss into the
/// level its rounds' steps ran at, step_level, and what the simulator's structure makes of it,
/// self_*) and replayed_* from its own steps' ratios in the order they ran (ReplayedStepCosts). A partition the model cannot predict keeps NaN; its message is returned ("" when
/// every one was predicted).
/// Used by `run --scenario` (rank 0, before and after the rounds) and by `ppbench simulate` on a
/// scenario's file.
std::string predict_serving(RunRecord& run, const Predictor& pred, const std::vector<Partition>& parts);

}  // namespace ppb::balance
