#include "run/memory_checks.h"

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <sstream>

#include "common/check.h"
#include "common/format.h"
#include "pipeline/pipeline.h"
#include "run/plan.h"
#include "run/serving_search.h"

namespace ppb::run {

std::string gib(double bytes) {
  std::ostringstream os;
  os.precision(5);  // enough to tell a need from a limit just below it
  os << bytes / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return os.str();
}

StageConfig stage_config(const RunContext& ctx, int groups, int tp_width, int tp_rank, TpGroup* tp) {
  StageConfig sc;
  sc.tp_width = tp_width;
  sc.tp_rank = tp_rank;
  sc.tp = tp;
  sc.work = ctx.workload;
  sc.work.groups = groups;
  sc.cuda_graphs = ctx.opt.cuda_graphs;
  sc.expert_skew = ctx.opt.expert_skew;
  return sc;
}

StageConfig scenario_stage_config(const RunContext& ctx, const balance::Partition& p, const StagePlacement& place,
                                  const serving::SchedulerConfig& sched, TpGroup* tp) {
  StageConfig sc = stage_config(ctx, partition_groups(ctx, p), place.tp_width, place.tp_rank, tp);
  sc.work.prompt_len = ctx.opt.scenario.spec->max_prompt_len;
  sc.work.gen_len = ctx.opt.scenario.spec->max_gen_len;
  if (sched.pp_schedule == serving::PpSchedule::batch_queue) {  // one KV cache of the groups' slots
    sc.work.groups = 1;
    sc.work.batch = sched.pool_slots();
  }
  // A pool smaller than every slot at the longest request: the store need hold only the pool
  // (demand-paged where the backend can); one at least as large cannot bind: the whole store,
  // touched once at build, without the paged store's page faults.
  const int64_t pool = int64_t(sched.groups) * sched.kv_blocks * sched.kv_block_size;
  if (sched.kv_blocks > 0 && pool < int64_t(sc.work.groups) * sc.work.batch * sc.work.max_context()) sc.kv_pool_tokens = pool;
  return sc;
}

StageConfig partition_stage_config(const RunContext& ctx, const balance::Partition& p, const StagePlacement& place,
                                   TpGroup* tp) {
  if (!ctx.opt.scenario.on()) return stage_config(ctx, partition_groups(ctx, p), place.tp_width, place.tp_rank, tp);
  return scenario_stage_config(ctx, p, place, serving_sim_config(ctx, p).scheduler, tp);
}

int auto_kv_blocks(const RunContext& ctx, const balance::Partition& p, const serving::SchedulerConfig& sched) {
  serving::SchedulerConfig whole = sched;
  whole.kv_blocks = 0;  // the storage of every slot: its bytes do not depend on the pool
  int64_t tokens = std::numeric_limits<int64_t>::max();
  int tight_stage = 0;
  double tight_free = 0;
  for (int r = 0; r < p.replicas; ++r) {
    const std::vector<std::vector<int>> ranks = p.stage_ranks(r);
    for (int k = 0; k < p.num_stages(); ++k)
      for (int rank : ranks[k]) {
        const StageConfig sc = scenario_stage_config(ctx, p, PartitionSet::placement(p, rank), whole);
        const StageBytes b = ctx.device->stage_bytes(ctx.spec, p.first_unit[k], p.last_unit[k], sc);
        // A paged store holds min(every slot, the pool + its page slack): the slack counts only
        // where every slot does not fit.
        double free = ctx.cluster.memory_limits.at(rank) - double(b.weights + b.scratch);
        if (b.kv_paged && free < double(b.kv_cache)) free -= double(b.kv_page_slack);
        const int64_t t = b.kv_token_bytes == 0 ? std::numeric_limits<int64_t>::max()
                                                : static_cast<int64_t>(std::max(0.0, free) / double(b.kv_token_bytes));
        if (t < tokens) tokens = t, tight_stage = k, tight_free = free;
      }
  }
  const int64_t per_pool = int64_t(sched.groups) * sched.kv_block_size;  // M pools of kv_block_size-token blocks
  const int64_t blocks = std::min<int64_t>(tokens / per_pool, std::numeric_limits<int>::max() / 2);
  int longest = 0;
  for (const serving::Request& q : ctx.opt.scenario.drawn.requests)
    longest = std::max(longest, (q.prompt_len + q.gen_len - 1 + sched.kv_block_size - 1) / sched.kv_block_size);
  if (blocks < longest)
    throw UserError("--kv-blocks auto: partition " + p.solver + "'s stage " + std::to_string(tight_stage) + " (units " +
                    ctx.spec.units[p.first_unit[tight_stage]].name + ".." + ctx.spec.units[p.last_unit[tight_stage]].name +
                    ") has " + format_fixed(std::max(0.0, tight_free) / 1048576.0, 3) +
                    " MiB left for its KV cache after weights and scratch (and page slack): " + std::to_string(blocks) +
                    " blocks of " + std::to_string(sched.kv_block_size) + " tokens per group of M=" +
                    std::to_string(sched.groups) + ", fewer than the longest of the scenario's requests needs alone (" +
                    std::to_string(longest) + " blocks: its prompt + output - 1 positions); raise --memory-limit, or use "
                    "fewer --microbatches, more ranks, a smaller -b/--batch (the slots' scratch), shorter prompts or "
                    "outputs (-p/--prompt-len, -g/--gen-len, --prompt-lens, --gen-lens) or a smaller model");
  return static_cast<int>(blocks);
}

StageBytes stage_bytes(const RunContext& ctx, int first, int last, int groups, int tp_width, int tp_rank) {
  return ctx.device->stage_bytes(ctx.spec, first, last, stage_config(ctx, groups, tp_width, tp_rank));
}

std::pair<int64_t, int64_t> unit_bytes(const RunContext& ctx, int u) {
  const StageBytes b = stage_bytes(ctx, u, u, ctx.workload.groups);
  return {static_cast<int64_t>(b.weights), static_cast<int64_t>(b.kv_cache)};
}

namespace {

/// (b) of check_memory_for_profile, on rank 0 (the ranks' limits gathered at start-up).
void check_model_fits_ranks(const RunContext& ctx) {
  const Workload& wl = ctx.workload;
  double need = 0, unit_max = 0, have = 0, have_max = 0;
  std::string unit_name;
  for (int u = 0; u < ctx.spec.num_units(); ++u) {
    const auto [w, kv] = unit_bytes(ctx, u);
    need += double(w + kv);
    if (double(w + kv) > unit_max) {
      unit_max = double(w + kv);
      unit_name = ctx.spec.units[u].name;
    }
  }
  for (double l : ctx.cluster.memory_limits) {
    have += l;
    have_max = std::max(have_max, l);
  }
  if (need > have)
    throw UserError("the model needs " + gib(need) + " of weights + KV cache (M=" + std::to_string(wl.groups) +
                    " groups of B=" + std::to_string(wl.batch) + " sequences, " + std::to_string(wl.max_context()) +
                    " tokens each, " + dtype_name(wl.dtype) + ") but the " + std::to_string(ctx.ranks) + " ranks hold " +
                    gib(have) +
                    " together (--memory-limit, default 90% of the free memory per rank); use more ranks, a "
                    "smaller --batch/--microbatches/--prompt-len/--gen-len, or a smaller model");
  if (unit_max > have_max)
    throw UserError("unit " + unit_name + " alone needs " + gib(unit_max) + " of weights + KV cache but the largest "
                    "rank limit is " + gib(have_max) + " (--memory-limit); use a smaller --batch/--microbatches/"
                    "--prompt-len/--gen-len");
}

}  // namespace

void check_memory_for_profile(RunContext& ctx) {
  const size_t limit = ctx.cluster.memory_limit;
  ctx.phase("memory check of the profile", [&] {
    for (int sig = 0; sig < static_cast<int>(ctx.spec.signatures.size()); ++sig) {
      const int u = ctx.spec.signature_example[sig];
      const StageBytes b = stage_bytes(ctx, u, u, 1);
      const double w = double(b.weights), rest = double(b.kv_cache + b.scratch);
      if (b.total() > limit)
        throw UserError("profiling unit " + ctx.spec.units[u].name + " alone needs " + gib(w + rest) + " (weights " +
                        gib(w) + " + KV cache and scratch " + gib(rest) + " for B=" + std::to_string(ctx.workload.batch) +
                        " sequences of P+G=" + std::to_string(ctx.workload.max_context()) +
                        " tokens) but the limit is " + gib(double(limit)) +
                        " (--memory-limit, default 90% of the free memory per rank); " +
                        (b.weights > limit
                             ? "its weights alone exceed the limit: a larger --memory-limit or a device with more memory"
                             : "use a smaller --batch, --prompt-len or --gen-len"));
    }
    // `ppbench profile` holds one unit at a time: the whole model need not fit these ranks
    // (profile on fewer ranks, balance K > R stages offline).
    if (ctx.root && !ctx.opt.profile_only) check_model_fits_ranks(ctx);
  });
}

void resolve_kv_pools(RunContext& ctx, const PartitionSet& set) {
  if (!ctx.opt.scenario.on() || ctx.opt.scenario.spec->kv_blocks != serving::kKvBlocksAuto) return;
  ctx.phase("KV pools (--kv-blocks auto)", [&] {
    for (const balance::Partition& p : set.splits) serving_sim_config(ctx, p);  // throws where a pool is too small
  });
}

void check_memory_of_partitions(RunContext& ctx, const PartitionSet& set) {
  ctx.phase("memory check", [&] {
    for (const balance::Partition& p : set.splits) {
      const StagePlacement place = set.placement(p, ctx.mpi.rank());
      const int k = place.stage;
      // Exactly what the stage allocates (CUDA or CPU), scratch included: this rank's shard.
      const StageConfig sc = partition_stage_config(ctx, p, place);
      const StageBytes b = ctx.device->stage_bytes(ctx.spec, p.first_unit[k], p.last_unit[k], sc);
      if (b.total() > ctx.cluster.memory_limit) {
        std::ostringstream os;
        os << "partition " << p.solver << ": stage " << k << " (units " << ctx.spec.units[p.first_unit[k]].name << ".."
           << ctx.spec.units[p.last_unit[k]].name << ") needs " << gib(double(b.total())) << " (weights "
           << gib(double(b.weights)) << " + KV cache and scratch " << gib(double(b.kv_cache + b.scratch))
           << ") for " << sc.work.groups << " group(s) of B=" << sc.work.batch << " sequences of up to "
           << sc.work.max_context() << " tokens" << (ctx.opt.scenario.on() ? " (the scenario's longest request)" : "")
           << ", but the limit is " << gib(double(ctx.cluster.memory_limit))
           << " (--memory-limit, default 90% of the free memory per rank); use more ranks, a smaller "
              "--batch/--microbatches/--prompt-len/--gen-len, or a smaller model"
           << (ctx.opt.scenario.on() && ctx.opt.scenario.spec->kv_blocks == 0
                   ? ", or --kv-blocks auto (a KV pool sized from the free memory: requests admitted on free blocks "
                     "and preempted when they run out, as vLLM does)"
                   : "");
        throw UserError(os.str());
      }
    }
  });
}

namespace {

/// Tensor-parallel groups this rank holds at once in the rounds, at most: one per split of each
/// layout that puts it in a stage wider than one (the --tp auto layout is not known yet: it
/// counts as one such layout where it may pick a width above one).
size_t tp_groups_held_at_once(const RunContext& ctx) {
  const int me = ctx.mpi.rank();
  auto width_of = [&](const std::vector<int>& widths) {
    int first = 0;
    for (int w : widths) {
      if (me < first + w) return w;
      first += w;
    }
    return 1;
  };
  size_t layouts = 0;
  for (const auto& widths : ctx.plan.layouts) layouts += width_of(widths) > 1 ? 1 : 0;
  if (ctx.plan.tp_auto && !ctx.plan.auto_widths.empty()) ++layouts;
  // --plan: its K points and its curve (at most 8) may each put this rank in a wide stage.
  if (ctx.plan.plan_points > 0 && !ctx.plan.auto_widths.empty()) layouts += static_cast<size_t>(ctx.plan.plan_points) + 8;
  return layouts * ctx.plan.methods.size();
}

}  // namespace

void share_memory_limits(RunContext& ctx) {
  ctx.cluster.memory_limits = ctx.mpi.gather_doubles({static_cast<double>(ctx.cluster.memory_limit)});
  ctx.mpi.bcast_doubles(ctx.cluster.memory_limits);
}

void reserve_tp_communicators(RunContext& ctx) {
  unsigned long long mine = ctx.cluster.tp_group_bytes, most = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, ctx.mpi.comm()));
  ctx.cluster.tp_group_bytes = static_cast<size_t>(most);
  if (most == 0 || ctx.opt.memory_limit_gib > 0) return;
  const size_t reserve = std::min(ctx.cluster.memory_limit, static_cast<size_t>(most) * tp_groups_held_at_once(ctx));
  ctx.cluster.memory_limit -= reserve;
  share_memory_limits(ctx);
  const auto reserves = ctx.mpi.gather_doubles({static_cast<double>(reserve)});
  if (!ctx.root) return;
  for (int r = 0; r < ctx.ranks; ++r) {
    ctx.record().ranks[r].memory_limit_bytes = static_cast<int64_t>(ctx.cluster.memory_limits[r]);
    ctx.record().ranks[r].tp_reserve_bytes = static_cast<int64_t>(reserves[r]);
  }
  ctx.progress.say("memory: a tensor-parallel group's communicator took up to " + gib(double(most)) +
                   " of device memory; each rank's limit keeps that free per group it holds in the rounds (up to " +
                   gib(*std::max_element(reserves.begin(), reserves.end())) + ")");
}

}  // namespace ppb::run
