// Stages that share a machine's memory bandwidth (issue 13): a unit profiled with its machine's
// other ranks idle runs slower in the pipeline whenever another stage of its machine computes at
// the same moment. On this project's 2-core CPU machines a Qwen3-0.6B layer's decode step took
// 2.9 ms alone, 3.5 ms with the other rank timing the same unit at the same moment, and
// 3.8-4.0 ms inside the pipeline: a profile of units timed alone predicted every stage 12-37%
// too fast, and more so for the balanced split, whose stages are busy at the same moments more
// often than the uniform one's.
//
// The model: each unit is profiled twice, alone (the machine's other ranks wait) and together (all
// ranks time the same unit at the same moment). A machine is the ranks under one kernel
// (MpiContext::machine_id): a node's ranks, and also ranks on different MPI nodes that are
// containers or network namespaces of one machine (issue 16's two-node test). A stage's step
// time in a phase is
//     t = t_alone + (t_together - t_alone) * f,
// f = the share of the stage's compute time in that phase during which another stage of its machine
// computes too, read from the pipeline simulator's timeline (balance/simulator.h) of the step
// times themselves: a fixed point, found by damped iteration. Linear in f: the memory traffic of
// a memory-bound step is spread evenly over it, so a step overlapped for a share f of its time
// pays the together rate for that share. With more than two ranks per machine, "together" is all of
// them at once and f counts any other stage's compute: an upper estimate where only some of them
// overlap. GPUs have their own memory each: their profile has one pass and the model is not
// applied (together == alone).
//
// Pure C++: no MPI, CUDA or HDF5 here (DESIGN.md §5).
#pragma once

#include <vector>

#include "balance/simulator.h"

namespace ppb::balance {

struct ContentionResult {
  std::vector<SimStage> stages;        ///< [S] the fixed point's step times (transfers unchanged)
  std::vector<double> overlap_prefill;  ///< [S] f of each stage's prefill steps, in [0, 1]
  std::vector<double> overlap_decode;   ///< [S] f of each stage's decode steps, in [0, 1]
  int iterations = 0;                   ///< simulations run
  bool converged = false;               ///< every step time moved < 1e-4 (relative) in the last one
};

/// Step times of the stages of one partition under the shared-bandwidth model above.
/// alone, together: [S] step times from the profile's two passes (the transfer fields of
/// `alone` are used, those of `together` ignored); node: [S] an id of the machine each stage's
/// ranks are on (stages on different machines do not slow each other); cfg: the pipeline.
/// A stage alone on its machine gets its alone times. Iterates x <- (x + model(sim(x))) / 2 from
/// the together times, at most 60 simulations; the result after the last is returned either way
/// (`converged` says whether it settled).
/// A together time below its alone time (profile noise) is used as measured: the model then
/// speeds the stage up with overlap, as the profile says.
/// always_overlapped: [S] (or empty = none) stages whose machine holds a twin computing whenever
/// they do (a replica's stage k beside another replica's, in lockstep: Predictor::twin_on_machine):
/// f = 1 in both phases, the together times.
/// @throws ppb::UserError if the sizes differ, or a time is negative or NaN (simulate_pipeline's
///         checks).
ContentionResult contended_step_times(const std::vector<SimStage>& alone, const std::vector<SimStage>& together,
                                      const std::vector<int>& node, const SimConfig& cfg,
                                      const std::vector<char>& always_overlapped = {});

/// The share of each stage's compute time, per phase, during which another stage of its node
/// computes, from one simulated (or measured) repetition: events [1][M][G+1][S][6] as
/// SimResult::events. Returns [S] prefill shares and [S] decode shares (0 for a phase without
/// compute time). node: [S] as above.
std::pair<std::vector<double>, std::vector<double>> compute_overlap(const std::vector<double>& events,
                                                                    const EventShape& shape,
                                                                    const std::vector<int>& node);

/// The per-step form of compute_overlap: for every compute step of `events` ([iters][M][G+1][S][6]
/// as SimResult::events, measured or simulated), the share of it during which another stage of
/// its node computes. Returns [iters][M][G+1][S] shares in [0, 1]; NaN where the step did not run
/// (a NaN start or end, or no time between them). node: [S] as above.
/// @throws ppb::InternalError if node does not have one entry per stage.
std::vector<double> step_overlap(const std::vector<double>& events, const EventShape& shape,
                                 const std::vector<int>& node);

/// compute_overlap from step_overlap's shares of the same events (`share`, [iters][M][G+1][S]),
/// for a caller that has them already: each stage's per-phase shares weighted by its steps' times.
std::pair<std::vector<double>, std::vector<double>> overlap_of_steps(const std::vector<double>& events,
                                                                     const EventShape& shape,
                                                                     const std::vector<double>& share);

}  // namespace ppb::balance
