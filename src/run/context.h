// What the phases of one `ppbench run` share (DESIGN.md §5, "src/run"): the MPI context, the
// typed options, the model, the resolved workload, this rank's backend, device and transport,
// the cluster facts start-up established, the output path, the progress lines and the phase
// runner. Rank 0 alone owns the run's record (RunRecord: what the results file holds); the
// other ranks hand their measurements to it through the gathers of each phase.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "balance/partition.h"
#include "balance/predict.h"
#include "common/workload.h"
#include "model/model_spec.h"
#include "mpi/mpi_context.h"
#include "results/run_record.h"
#include "run/options.h"
#include "run/phase.h"
#include "transport/backend_registry.h"
#include "transport/transport.h"

namespace ppb::run {

/// What to measure, as start-up resolved the options against the ranks and the model.
struct MeasurePlan {
  std::vector<balance::Method> methods;  ///< the --partition splits of every layout (one with a single rank)
  bool adaptive = false;                 ///< --partition adaptive (off with a single rank)
  /// --tp: the layouts, each the widths of its stages (all 1: one rank per stage); tp_auto: the
  /// balancer adds the layout it picks, among widths 1 and auto_widths (the heads allow them).
  std::vector<std::vector<int>> layouts;
  bool tp_auto = false;
  std::vector<int> auto_widths;
  /// --plan K: the planner's K front points are added to the uniform split (run/plan_points.h);
  /// auto_widths are profiled for its layouts.
  int plan_points = 0;
  /// --replicas with --plan as balance::PlanRequest::replicas (0 = every R dividing the ranks).
  int plan_replicas = 0;
};

/// Facts about the ranks, from start-up on.
struct Cluster {
  std::vector<double> clock_offsets_s;  ///< [R] each rank's clock minus rank 0's, s (every rank)
  size_t memory_limit = 0;              ///< this rank's bytes (weights + KV cache + scratch)
  /// This rank's share of the free memory when its device was opened, before the transport
  /// (run/startup.h: the limit is taken after it), bytes.
  size_t free_share_at_open = 0;
  /// The most device memory one tensor-parallel group's communicator took on any rank
  /// (TpGroup::device_bytes, measured while the groups were profiled), bytes; 0 without groups.
  size_t tp_group_bytes = 0;
  std::vector<double> memory_limits;    ///< [R] every rank's, bytes (every rank)
  /// Unit signatures and the ranks' device classes (every rank): splits that are the same up to
  /// swapping identical devices are benchmarked once (balance::compare_splits).
  balance::SplitEquivalence equivalence;
};

class RunContext {
 public:
  RunContext(const MpiContext& mpi, const RunOptions& opt);
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  const MpiContext& mpi;
  const RunOptions& opt;
  const int ranks;  ///< R (= stages of the layout of one rank per stage)
  const bool root;  ///< rank 0: solves, gathers, writes
  Progress progress;

  model::ModelSpec spec;
  Workload workload;  ///< B, P, G, M (resolved), dtype (resolved with the device), seed
  MeasurePlan plan;
  const BackendReg* backend = nullptr;
  std::unique_ptr<Device> device;
  std::unique_ptr<Transport> transport;
  Cluster cluster;
  std::string output;  ///< the results file (every rank knows it)
  /// The serving scenario's requests at the rate being measured (every rank, the same):
  /// opt.scenario.requests, or with --request-rate search those rescaled to the rate of the
  /// search's current measurement (run/serving_rounds.cpp); scenario_rate its requests/s.
  std::vector<serving::Request> scenario_requests;
  double scenario_rate = 0.0;

  /// Rank 0, once the partitions are planned: the run's predictions (balance::Predictor of its
  /// record). @throws ppb::InternalError before make_predictor or on another rank (a bug).
  const balance::Predictor& predictor() const;
  /// Rank 0: builds predictor() from the record (its profile, links, ranks); nothing elsewhere.
  void make_predictor();

  /// Rank 0's record of the run. @throws ppb::InternalError on another rank (a bug).
  RunRecord& record();
  const RunRecord& record() const;

  /// Runs `fn` as phase `name` on every rank (PhaseRunner::run: agreed bad input, aborted
  /// internal error).
  template <typename Fn>
  void phase(const std::string& name, Fn&& fn) {
    phases_.run(name, std::forward<Fn>(fn));
  }
  PhaseRunner& phases() { return phases_; }

  /// Rank 0: the whole results file rewritten with what is measured so far (complete=0,
  /// status "running: <next_phase>"); nothing on other ranks. After a benchmark round,
  /// append_snapshot is the O(new rows) way.
  void snapshot(const std::string& next_phase);
  /// Rank 0: the rows the file lacks appended in place (results/writer.h append_results):
  /// after a benchmark round.
  void append_snapshot();
  /// Rank 0: the failure in the results file (complete=0, status failed), with what was
  /// measured and the ranks' flight records ([size], /failure/flight_record; may be empty).
  void record_failure(const std::string& why, const std::vector<std::string>& flight_records = {});

  /// The tensor-parallel poll of the CPU all-reduces: on the critical path twice per layer, so
  /// the waiting lane spins (MPI_Test and sched_yield) for up to 200 us before it sleeps, and
  /// sleeps at most 50 us.
  MpiPollConfig tp_poll() const;
  /// Collective over the world: this rank's tensor-parallel group for `color` (-1: none, null),
  /// made by the backend (NCCL on GPUs, MPI on CPU ranks).
  std::unique_ptr<TpGroup> make_tp_group(int color, int key);

 private:
  RunRecord record_;    ///< meaningful on rank 0 only
  std::unique_ptr<balance::Predictor> predictor_;  ///< rank 0, from the plan on
  PhaseRunner phases_;  ///< last: its watchdog is destroyed first, before what its callbacks touch
};

}  // namespace ppb::run
