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

/// Leave-one-out calibration (issue 13): partition X's step times predicted from the profile,
/// each stage's scaled per phase by its rank's factor (calibration_factors) measured on the
/// *other* partitions' stages only, never on X's own. The partitions of a run are measured in
/// alternating repetitions of the same rounds (ABBA), so the other partitions' stages saw the
/// same moments of the machine as X's: the factors carry the machine's state during the rounds
/// (on a shared VM, a drift of +-20% over seconds that no profile taken at other moments can
/// sample), while the profile still carries what differs between the splits (which units land
/// on which rank). How far X's measurement departs from this prediction is the error of the
/// profile's relative unit costs, the part of it the balancer's choice rests on.
/// @param predicted_phase_ms [S][2] X's prefill and decode step per stage from the profile (ms).
/// @param stage_rank [S] the rank each of X's stages ran on.
/// @param others the stages of the other partitions: their ranks, their predictions from the
///        same profile and their measured mean steps (ms).
/// @param ranks R, the number of ranks.
/// @return [S][2] ms; empty when a stage of X ran on a rank that no stage of `others` ran on, or
///         a sum is not finite and > 0 there (such a stage has no calibration: no prediction is
///         better than an uncalibrated one passed off as calibrated).
/// @throws ppb::InternalError if predicted_phase_ms is not [S][2] of stage_rank's S.
std::vector<double> cross_calibrated_phases(const std::vector<double>& predicted_phase_ms,
                                            const std::vector<int>& stage_rank,
                                            const std::vector<StageMeasurement>& others, int ranks);

}  // namespace ppb::balance
