// Memory, before anything is allocated (DESIGN.md §1): what a stage of this backend needs
// (weights, KV cache, scratch) for the run's workload, and the checks that make a run that
// cannot fit fail in seconds, not after the profile or another partition's benchmark.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "backend/stage.h"
#include "pipeline/pipeline.h"
#include "run/context.h"
#include "serving/scheduler.h"

namespace ppb::run {

class PartitionSet;

/// "1.2345 GiB".
std::string gib(double bytes);

/// The stage config of this run for `groups` request groups, shard `tp_rank` of `tp_width` (tp:
/// the group, not owned; null for the bytes alone).
StageConfig stage_config(const RunContext& ctx, int groups, int tp_width = 1, int tp_rank = 0, TpGroup* tp = nullptr);

/// The stage this rank builds for partition `p` at `place` (tp: its group, not owned; null for
/// the bytes alone): closed batches, the workload at the partition's M (partition_groups);
/// under --scenario, B slots per group (the batch queue: one group of M x B slots) for the
/// scenario's longest prompt and output (the workload's P and G are its means). The rounds build
/// it, and the memory checks and the memory table count it.
StageConfig partition_stage_config(const RunContext& ctx, const balance::Partition& p, const StagePlacement& place,
                                   TpGroup* tp = nullptr);

/// The stage partition_stage_config gives for the scheduler `sched` (its schedule, its resolved
/// pool): under --scenario the longest request, the batch queue's one group of M x B slots, and
/// with a pool (sched.kv_blocks > 0) smaller than every slot at the longest request
/// StageConfig::kv_pool_tokens = M x kv_blocks x kv_block_size (a paged store then holds only
/// that; a larger pool cannot bind and the store stays whole).
StageConfig scenario_stage_config(const RunContext& ctx, const balance::Partition& p, const StagePlacement& place,
                                  const serving::SchedulerConfig& sched, TpGroup* tp = nullptr);

/// `--kv-blocks auto` for partition `p` under the scheduler `sched` (its kv_blocks unresolved):
/// the blocks of each group's pool that the stages' free memory holds, as vLLM sizes its pool
/// (vllm/v1/worker/gpu_worker.py determine_available_memory: the memory budget less weights and
/// activations, over the KV bytes of one block: vllm/v1/core/kv_cache_utils.py). Per stage and
/// per rank of it (every replica): the rank's limit (ctx.cluster.memory_limits) less the
/// stage's weights, scratch and, on a demand-paged store where every slot at the longest
/// request does not fit, its page slack (StageBytes), in tokens of
/// the stage's KV (StageBytes::kv_token_bytes); the least over the stages, shared by the M
/// groups' pools (or the batch queue's one of M x the result) in blocks of kv_block_size tokens.
/// Every rank computes the same (the limits are every rank's). Where the storage is allocated
/// whole (CUDA, today) the pool cannot bind before the storage does: the memory check refuses
/// a stage whose every slot at the longest request does not fit.
/// @throws ppb::UserError when a pool would not hold the scenario's longest request, naming the
///         stage, its free memory and the flags that help.
int auto_kv_blocks(const RunContext& ctx, const balance::Partition& p, const serving::SchedulerConfig& sched);

/// What a stage of units [first, last] allocates on this backend (weights, KV cache, scratch).
StageBytes stage_bytes(const RunContext& ctx, int first, int last, int groups, int tp_width = 1, int tp_rank = 0);

/// Weights + KV cache of unit `u` alone for the run's M groups (no scratch): the balancer's
/// per-unit memory. A stage's weights + KV cache are at most the sum over its units (a tied
/// embedding shared by embed and head on one stage is counted once there), and its scratch at
/// most the scratch of a stage of every unit: a split within the limits net of that scratch
/// passes check_memory_of_partitions.
std::pair<int64_t, int64_t> unit_bytes(const RunContext& ctx, int u);

/// Before the profile, on every rank: (a) each unit alone (one group) must fit this rank's limit
/// (the profile instantiates it); (b) on rank 0, unless `ppbench profile`, the model's weights +
/// KV cache must fit the ranks' limits together and its largest unit the largest limit.
/// Bad input: PhaseFailed{2} naming the unit and the flags that would help.
void check_memory_for_profile(RunContext& ctx);

/// Collective: every rank's limit (ctx.cluster.memory_limit) into ctx.cluster.memory_limits on
/// every rank (--kv-blocks auto sizes every stage's pool from them).
void share_memory_limits(RunContext& ctx);

/// After the tensor-parallel profile (collective): the default memory limit (90% of the free
/// memory, taken after the transport: run/startup.h) less a reserve for the tensor-parallel
/// groups' communicators, which the rounds make beside the stages (one per benchmarked split
/// whose stage of this rank is wider than one; --tp auto counted as one more layout): that
/// count x the most device memory one group took on any rank while profiled
/// (TpGroup::device_bytes; 0 on CPU ranks, whose groups hold no device memory). Updates
/// ctx.cluster's limits and rank 0's record (/ranks/memory_limit_bytes, tp_reserve_bytes) and
/// says it; nothing with --memory-limit (the user's figure) or without groups.
void reserve_tp_communicators(RunContext& ctx);

/// Collective, under --kv-blocks auto: every split's pool (auto_kv_blocks) on every rank, in its
/// own phase, so that a pool too small for the longest request is refused by every rank at once
/// (exit 2) before anything is described or built. Nothing without a scenario or with a number.
void resolve_kv_pools(RunContext& ctx, const PartitionSet& set);

/// Every rank checks its stage of every partition of `set` (its shard, scratch included, as
/// partition_stage_config sizes it) against its limit before anything is built.
void check_memory_of_partitions(RunContext& ctx, const PartitionSet& set);

}  // namespace ppb::run
