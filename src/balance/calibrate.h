// Calibration of the profile by the pipeline's own measurement, for the adaptive split
// (`ppbench run --partition adaptive`): each rank's profile row is scaled, per phase, by how much
// slower (or faster) its stages ran in the pipeline than the profile predicted, and the split is
// solved again from the scaled table.
//
// Why per rank and phase: what the profile of units timed one at a time misses is mostly a
// property of the rank in the running pipeline (its share of the node's memory bandwidth while
// every stage streams weights, its core's neighbours), and it differs between memory-bound decode
// and compute-bound prefill; the units' relative costs on one rank hold far better than their
// absolute times.
//
// And the cross-calibration of every measured split after the rounds (issue 13,
// contention_calibration): the profile's two passes (alone, together: balance/contention.h)
// calibrated separately per rank and phase on the other splits' measured steps, since the
// contention the pipeline adds depends on how much of a stage's steps another stage overlaps,
// which differs between splits.
#pragma once

#include <vector>

#include "balance/problem.h"
#include "results/run_record.h"

namespace ppb::balance {

/// One stage of a benchmarked partition: the rank it ran on, the profile's prediction of one
/// prefill step and one decode step of its compute (ms; predicted_phase_ms) and what the pipeline
/// measured (the mean compute time of its prefill steps and of its decode steps, ms: the mean,
/// as a stage's throughput is set by its mean step).
struct StageMeasurement {
  int rank = 0;
  double predicted_prefill_ms = 0, predicted_decode_ms = 0;
  double measured_prefill_ms = 0, measured_decode_ms = 0;
};

/// [R][2] factors, row-major: factor[r][phase] = sum of measured / sum of predicted over the
/// stages that ran on rank r (phase 0 prefill, 1 decode); 1 where rank r ran no stage, or a sum
/// is not finite and > 0.
std::vector<double> calibration_factors(const std::vector<StageMeasurement>& stages, int ranks);

/// A copy of profile table `t` (R ranks, U units) with every rank's latency_ms, latency_alone_ms, latency_min_ms,
/// latency_max_ms and decode_context_ms scaled by its factors (`factors` as
/// calibration_factors returns) and cost_ms recomputed for objective `o` with G = `gen_len`.
/// @throws ppb::InternalError if the factors do not have 2 entries per rank of `t`.
ProfileTable calibrated_profile(const ProfileTable& t, const std::vector<double>& factors, Objective o,
                                int gen_len);

/// The profile table as the benchmark's rounds saw the units (issue 13): a copy of `t` whose
/// latency_ms is `rounds` ([R][U][2] ms: the mean of the profile cycles ppbench run takes between
/// rounds, every rank timing each unit at the same moment as in t's together pass) and whose
/// latency_alone_ms, where present, is scaled elementwise by rounds / t.latency_ms (the alone
/// pass is not repeated between rounds; what the machine's drift did to a unit timed together
/// it is taken to do to it timed alone). latency_min_ms / latency_max_ms and decode_context_ms
/// are scaled likewise; cost_ms is recomputed for objective `o` with G = `gen_len`. An entry of t
/// that is not finite and > 0 keeps its alone time unscaled.
/// @throws ppb::InternalError if `rounds` is not shaped as t.latency_ms.
ProfileTable profile_as_rounds_saw_it(const ProfileTable& t, const std::vector<double>& rounds, Objective o,
                                      int gen_len);

/// One compute step of a measured stage, for contention_calibration: the rank it ran on, its
/// phase (0 prefill, 1 decode), the profile's sum of the stage's units for that phase timed
/// alone (ms; balance/contention.h), the share of the step during which another stage of its
/// machine computed (step_overlap, in [0, 1]) and its measured compute time (ms).
struct StepSample {
  int rank = 0, phase = 0;
  double alone_ms = 0, share = 0, measured_ms = 0;
  /// The profile's together - alone sum for the step's stage and phase (ms; 0 with one pass):
  /// the contention the profile saw, used only where the steps cannot tell it (CalibrationFit::level).
  double excess_ms = 0;
};

/// How contention_calibration calibrated a rank and phase.
enum class CalibrationFit : int {
  none = 0,        ///< no steps there: no calibration (level 1: the profile as it is)
  level = 1,       ///< the level alone, on the profile's alone and together times alike
  contention = 2,  ///< level and contention fitted
};

/// Per rank and phase ([R][2] row-major, phase 0 prefill, 1 decode): the factors of the model
///     measured step = alone * (level + contention * share),
/// i.e. the contention model of balance/contention.h with alone time `level * alone` and
/// together time `(level + contention) * alone` (CalibrationFit::contention); or, where the
/// steps cannot tell the contention (CalibrationFit::level, contention NaN), alone time
/// `level * alone` and together time `level * (alone + max(excess, 0))`: the profile's own
/// contention, scaled by the level.
struct ContentionCalibration {
  std::vector<double> level, contention;
  std::vector<CalibrationFit> fit;
};

/// contention_calibration fits the contention only where det(X'X) / (S_aa * S_xx) is at least
/// this (X = [alone, alone * share] per step): with one stage of constant alone time it is
/// var(share) / mean(share^2), and 0.1 asks the share's sd to be a third of its root mean square,
/// which the pipeline's fill and drain steps (share 0) beside its steady steps (share ~1) give.
inline constexpr double kMinShareSpread = 0.1;

/// Calibrates the profile per rank and phase on measured compute steps (issue 13). What a
/// profile taken at other moments misses is the machine's level during the rounds and the
/// contention the pipeline adds, which differs between splits (a stage overlapped for 60% of
/// its decode steps in one split is overlapped 80% in another): one factor per rank carries
/// the level but not the contention. Least squares over the rank and phase's steps of
///     m = level * a + contention * (a * s),  no intercept
/// (a, s, m: StepSample's alone_ms, share, measured_ms); with one stage of constant a it is the
/// line of m / a against s. The contention is taken relative to the alone time, not to the
/// profile's together - alone excess: on the shared 2-core VMs one profile cycle in a few is
/// disturbed (a unit timed 2.7x its other cycle's time), and an excess from such a cycle, even
/// negative, moved a cross-calibrated prediction by up to 13% where the alone time's scale
/// left 4% (issue 13, six runs of the main job).
/// Fitted (CalibrationFit::contention) where the steps' spread in share is at least
/// kMinShareSpread and the fit gives level > 0 and contention >= 0; otherwise (a stage
/// overlapped in all its steps, say, or noise making the overlapped steps look faster) the
/// profile's own contention is kept and scaled by level = sum m / sum (a + max(e, 0) * s)
/// (e: StepSample's excess_ms; CalibrationFit::level, contention NaN): dropping it there left
/// a split overlapped 89% of its decode steps predicted from one overlapped 63% 6% too fast
/// (issue 13). Level 1, contention NaN and CalibrationFit::none where the rank and phase have no
/// steps or their sums are not finite and > 0.
/// @param steps the measured steps (ranks outside 0..ranks-1 and other phases are left out).
/// @param ranks R.
ContentionCalibration contention_calibration(const std::vector<StepSample>& steps, int ranks);

}  // namespace ppb::balance
