// A partition's predictions from a run's record: its stages' step times from the profile (through
// the shared-bandwidth model of balance/contention.h where the profile has two passes), its
// stage costs in the balancer's objective, the simulator's tokens/s, and the cross-calibration
// of the run's measured splits by each other. One implementation for `ppbench run` (rank 0,
// from its in-memory record) and the offline `ppbench simulate RUN.h5` (from the record read
// back), so that both give the same numbers from the same profile (DESIGN.md §6), and so that
// a split the run never measured is predicted with the same model.
//
// Pure C++ (no MPI, device or HDF5): functions of a RunRecord and a Partition.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "balance/calibrate.h"
#include "balance/metrics.h"
#include "balance/partition.h"
#include "balance/problem.h"
#include "balance/simulator.h"
#include "results/run_record.h"

namespace ppb::balance {

/// The profile sums of a partition's stages, [S][2] (prefill step, decode step; ms) each.
struct StageSums {
  std::vector<double> alone;     ///< timed with the machine's other ranks waiting (= together with one pass)
  std::vector<double> together;  ///< the balancer's table (ProfileTable::latency_ms)
};

/// A partition's compute per stage as predicted (predicted_phases).
struct PhasePrediction {
  std::vector<double> phase_ms;  ///< [S][2] prefill step, decode step, ms
  /// [S][2] the contention model's share of each stage's steps overlapped by another stage of its
  /// machine (two passes only; empty with one pass)
  std::vector<double> overlap;
  /// "" or a warning for the caller to print: the model did not settle (the last iterate is
  /// used), or it failed (the together sums are used, overlap 1)
  std::string warning;
};

/// Which table of a profile.
enum class ProfileStat { median, min, max };

/// The predictions of one run: what they take from its record besides the profile tables
/// (which callers pass: the run's, a calibrated copy, or the profile as the rounds saw it).
/// Built once per record (O(R^2 + R·U)); every method is a pure function of it and its
/// arguments.
class Predictor {
 public:
  /// From `run`'s workload (M, G, B, P, overlap, dtype, objective), model attributes
  /// (hidden_size), ranks (device classes, machines, ceilings) and links (the one link, and
  /// each node pair's: node_pair_links).
  /// @throws ppb::UserError when the record lacks a workload (no groups or decode steps) or
  ///         names an unknown objective or dtype.
  explicit Predictor(const RunRecord& run);

  Objective objective() const { return objective_; }
  /// The simulator's pipeline: the run's M, G, B and overlap.
  const SimConfig& sim_config() const { return sim_; }
  /// The simulator's pipeline for `p`: sim_config() at p's own M where it has one
  /// (Partition::groups > 0; `run --plan` measures one layout at several M).
  SimConfig sim_for(const Partition& p) const {
    SimConfig s = sim_;
    if (p.groups > 0) s.groups = p.groups;
    return s;
  }
  /// Eager sends in every simulation (`simulate --eager`; the run's pipeline is rendezvous).
  void set_eager_sends(bool eager) { sim_.eager_sends = eager; }
  int ranks() const { return static_cast<int>(device_class_.size()); }
  /// [R] device class of each rank (rank_device_classes): equal values are identical devices.
  const std::vector<int>& device_class() const { return device_class_; }

  /// Stage k of `p`'s prefill and decode sums (ms) of `prof`'s table `stat`: its rank's row, less
  /// (n - 1) times the rank's forward fixed cost where the profile took one (a stage of n units
  /// pays it once: stepcost::FixedCost), or, for a tensor-parallel stage, its group's profile at
  /// its width (group_profile; NaN where there is none).
  std::pair<double, double> stage_sums(const ProfileTable& prof, const Partition& p, int k,
                                       ProfileStat stat = ProfileStat::median) const;
  /// `p`'s sums from `prof` per pass (the median's table). A profile of one pass, and a
  /// tensor-parallel stage (its group's profile is timed while the machine's other ranks wait),
  /// has alone = together.
  StageSums pass_sums(const Partition& p, const ProfileTable& prof) const;
  /// [S] for each stage of `p`, the index of the first stage on the same machine (rank_machine:
  /// stages on one machine slow each other, even on different MPI nodes).
  std::vector<int> stage_machines(const Partition& p) const;
  /// [S] 1 where stage k of `p` shares its machine with its twin (stage k of another of its
  /// p.replicas replicas, on rank r x ranks_per_replica() + device_rank[k]); 0 elsewhere and with
  /// one replica. Replicas run in lockstep (run --plan starts every replica's repetition
  /// together; a deployment's replicas are each busy as one is): a twin computes whenever its
  /// stage does, so such a stage's steps are overlapped all the time (contention.h, f = 1).
  std::vector<char> twin_on_machine(const Partition& p) const;
  /// Devices per machine for ranks beyond the record's (the planner's replicas of a record laid
  /// out for one replica: plan_record's machine of device d is d / m); 0 = none beyond.
  void set_devices_per_machine(int m) { devices_per_machine_ = m; }

  /// The link stage k of `p` sends its output over (to stage k + 1; from the last stage the token
  /// return to stage 0): each node pair's measured link on several nodes (node_pair_links), else
  /// the run's one link; `copies` = handoff_copies of the two stages' widths (each copy crosses
  /// the link once).
  struct BoundaryLink {
    double latency_s = 0.0;
    double bandwidth_Bps = 0.0;  ///< <= 0: latency only (link_transfer_ms)
    int copies = 1;
  };
  BoundaryLink boundary_link(const Partition& p, int k) const;
  /// Bytes of one message of stage k's output for `rows` sequences and `tokens` tokens in all
  /// (boundary_message_bytes with the run's hidden size and dtype): the hidden states of every
  /// token ([tokens, hidden]) across a boundary, or, from the last stage, `rows` int32 token ids.
  double message_bytes(bool last_stage, int rows, double tokens) const;

  /// The simulator's stages of `p`: compute step times from `phase_ms` ([S][2] ms) and each
  /// boundary's transfer (boundary_message_bytes, handoff_copies) over its measured link (each
  /// node pair's on several nodes, else the run's one link).
  std::vector<SimStage> sim_stages(const Partition& p, const std::vector<double>& phase_ms) const;

  /// `p`'s compute per stage from its stages' alone and together sums through the contention
  /// model (contended_step_times) with the measured links.
  PhasePrediction contended_phases(const Partition& p, const StageSums& sums) const;
  /// `p`'s predicted compute per stage from profile `prof`: with one pass its sums as they are;
  /// with two (latency_alone_ms) contended_phases of pass_sums.
  PhasePrediction predicted_phases(const Partition& p, const ProfileTable& prof) const;

  /// [S] each stage's cost in the objective from `phase_ms` ([S][2] ms) with its transfers as
  /// the balancer counts them (stage_transfer_ms of the run's problem, with_transfers).
  std::vector<double> stage_costs(const Partition& p, const std::vector<double>& phase_ms) const;
  /// The simulator's metrics of `p` from `phase_ms` ([S][2] ms) on the run's links; with
  /// p.replicas = R > 1, its rates (tokens/s, decode tokens/s, the bound, per repetition) x R:
  /// R pipelines side by side, none slowing another (the planner's model of replicas).
  /// @throws what simulate_pipeline throws.
  PartitionMetrics simulate(const Partition& p, const std::vector<double>& phase_ms) const;

  /// Partition `p`'s record as the run predicts it from profile `prof` (split, layout,
  /// hand-off copies, predicted_phase_ms, predicted_stage_ms, their min/max, floors, predicted
  /// bottleneck); `p.predicted_stage_ms` must hold the solver's evaluation (evaluate() on the
  /// problem of `prof`): with two passes each single-rank stage's cost is recomputed from the
  /// contention model with the solver's transfers, a tensor-parallel stage keeps the solver's.
  /// The stage bytes (device-specific) are left to the caller. `warning`: as PhasePrediction's.
  PartitionRecord describe(const Partition& p, const ProfileTable& prof, std::string* warning = nullptr) const;

  /// Stores `<prefix>tokens_per_s`, `<prefix>decode_tokens_per_s`, `<prefix>ttft_p50_ms`,
  /// `<prefix>tpot_p50_ms` and `<prefix>decode_error`
  /// (against `measured_decode_tok_s`; 0 where that is not > 0) of the simulation of `p` from
  /// `phase_ms` in `metrics`, and returns stage_costs of `phase_ms`.
  /// @throws what simulate_pipeline throws.
  std::vector<double> predict_again(const Partition& p, const std::vector<double>& phase_ms, const std::string& prefix,
                                    double measured_decode_tok_s, std::map<std::string, double>& metrics) const;

 private:
  const RunRecord& run_;
  Objective objective_ = Objective::workload;
  SimConfig sim_;
  int prompt_len_ = 1;
  double hidden_ = 0.0;
  int dtype_bytes_ = 4;
  double link_latency_s_ = 0.0, link_bandwidth_Bps_ = 0.0;
  PairLinks pair_links_;
  std::vector<int> device_class_;
  std::vector<std::string> machine_;
  int devices_per_machine_ = 0;  ///< set_devices_per_machine
  /// Whether ranks a and b are on one machine (machine_, or devices_per_machine_ beyond it).
  bool same_machine(int a, int b) const;
  BalanceProblem problem_;  ///< the run's problem (its links and activation bytes); empty cost without a profile
  bool have_problem_ = false;
};

/// The split of a partition's record (first/last units, device ranks, widths; solver = its name).
Partition partition_of(const PartitionRecord& pr);

/// The profile as the benchmark's rounds saw the units (profile_as_rounds_saw_it of the mean of
/// /profile/latency_rounds_ms); nullopt without such cycles.
std::optional<ProfileTable> rounds_profile(const RunRecord& run);

/// The simulator's predictions of a measured partition stored beside its measurement:
/// simulated_{tokens_per_s, decode_tokens_per_s, ttft_p50_ms, tpot_p50_ms, decode_error} from
/// pr.predicted_phase_ms, and,
/// where the run took profile cycles between rounds (`seen`, rounds_profile) and `p` has one rank
/// per stage, predicted_{phase,stage}_rounds_ms and simulated_rounds_*. A failing prediction
/// costs only itself: its message is appended to `warnings`.
void add_simulated_metrics(const Predictor& pred, const Partition& p, PartitionRecord& pr, double measured_decode_tok_s,
                           const std::optional<ProfileTable>& seen, std::vector<std::string>& warnings);

/// Cross-calibration of a run's measured splits (issue 13): every measured partition of one rank
/// per stage (not sharing another's measurement, with events and mean steps) predicted again
/// from the profile calibrated per rank and phase by contention_calibration on the *other* such
/// partitions' compute steps (which ran in alternating repetitions of the same rounds: the
/// machine's state), each step with the share of it another stage of its machine overlapped
/// (step_overlap), then through the contention model at this split's own overlap. Fills
/// predicted_{phase,stage}_cross_ms, predicted_overlap_cross, cross_level / cross_contention /
/// cross_fit, stage_overlap, cross_calibrated_by and the simulated_cross_* metrics of
/// run.partitions; a partition sharing another's measurement takes that one's. Predictions are
/// from run.profile as measured (an adaptive split's own record is from a calibrated table).
/// Tensor-parallel splits (whose groups' profiles the contention model does not cover): each
/// stage's predicted prefill and decode steps scaled by the measured / predicted mean steps of
/// the same stage (same units on the same group of ranks) in the *other* measured
/// tensor-parallel splits, where every stage has such a twin (e.g. one layout at two M in `run
/// --plan`); no contention fit (cross_level / cross_contention / cross_fit empty).
/// The contention model's warnings (PhasePrediction::warning) are appended to `warnings`.
/// @throws what the model and simulator throw (the caller keeps the run, warned).
void cross_calibrate(const Predictor& pred, RunRecord& run, std::vector<std::string>& warnings);

/// The measured mean compute of each stage of a measured partition against its prediction from
/// `prof` through predicted_phases, for calibration_factors: `events` [reps][M][G+1][S][6] s.
std::vector<StageMeasurement> stage_measurements(const Predictor& pred, const Partition& p, const ProfileTable& prof,
                                                 const std::vector<double>& events);

}  // namespace ppb::balance
