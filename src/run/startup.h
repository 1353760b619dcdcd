// The first phases of `ppbench run` (DESIGN.md §1 steps 1-2): the options checked against the
// ranks and the model, the output path; the backend's device and transport; the run's
// description (metadata, clocks, links, ranks, their conditions and memory limits); the
// hardware's ceilings. Each is collective over every rank and runs its checks as phases.
#pragma once

#include "run/context.h"

namespace ppb::run {

/// Start-up, on every rank: the model (--mtp, --expert-skew), the layouts (--tp) and splits
/// (--partition) resolved against the ranks and the model into ctx.plan, M, the output path
/// (rank 0 checks it can write; every rank learns it). Bad input: PhaseFailed{2} on every rank.
void start_up(RunContext& ctx);

/// The backend and this rank's device (--device auto: the first backend every rank can use,
/// agreed collectively), the workload's dtype, one GEMM library for every CPU rank, and this
/// rank's share of the free memory now (the limit itself is taken in describe_run).
void open_device(RunContext& ctx);

/// The pipeline's transport, made by the backend (--transport).
void open_transport(RunContext& ctx);

/// The run's description into rank 0's record: versions, command line, Slurm and environment,
/// the model, the workload, clock offsets, the links (the MPI host ping-pong, the link probe
/// through the transport, and the link model taken from one of them: RunRecord's
/// link_measured_by), every rank's node, device, local rank, machine, conditions and memory;
/// and, on every rank, ctx.cluster (offsets, the memory limits: --memory-limit, or 90% of each
/// rank's share of the free memory measured after the transport and the probe's links exist,
/// the split equivalence of identical devices).
void describe_run(RunContext& ctx);

/// The ceilings of every rank (read bandwidth alone and all at once, GEMM rate), each rank of a
/// machine alone in turn, gathered into /ranks; a ceiling that cannot be measured is NaN (warned).
void measure_ceilings(RunContext& ctx);

}  // namespace ppb::run
