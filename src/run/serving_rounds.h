// The benchmark phase of a serving scenario (issue 37; `ppbench run --scenario poisson|gamma|
// trace`): every partition plays the same requests (the scenario drawn once from the seed, or
// read from the trace) through the serving engine (pipeline/serving_pipeline.h), as a scenario
// of the one rounds harness (run/rounds.h run_interleaved_rounds: interleaved rounds under the
// same --iters, --target-ci and --max-time as closed batches; its gains pair output tokens/s).
// Then, with validation on, each partition replays its last round's schedule serialized (one
// step in the pipeline at a time: every token must equal the round's, bitwise) and runs its
// first requests alone (the batch-invariance count).
#pragma once

#include "run/context.h"
#include "run/plan.h"

namespace ppb::run {

/// Benchmarks every partition of `set` under ctx.opt.scenario; rank 0 fills record().serving
/// (requests, rounds, pooled metrics, gains against set.reference paired by round, validation)
/// and prints a progress line per turn; a split equal to another is measured once. With --request-rate search (run/serving_search.h) first
/// a pilot round and the calibrated search, the rounds at 0.9 R* as the scenario, then those at
/// 1.1 R* into record().serving.rate_search. Collective. Bad input (a stage that does not fit;
/// an SLO that no rate, or every rate, meets): PhaseFailed{2}; a failed transfer aborts the job
/// (PhaseRunner).
void run_serving_benchmark(RunContext& ctx, PartitionSet& set);

/// The finish of a serving run (rank 0: the complete file and the summary with the latency
/// table). Returns the status every rank agrees on: 1 when a replay's tokens differ, else 0.
int finish_serving_run(RunContext& ctx);

}  // namespace ppb::run
