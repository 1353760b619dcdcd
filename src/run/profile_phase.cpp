#include "run/profile_phase.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>

#include "balance/layout.h"
#include "balance/problem.h"
#include "common/clock.h"
#include "common/format.h"
#include "common/roofline.h"
#include "common/stats.h"
#include "common/watchdog.h"
#include "run/memory_checks.h"

namespace ppb::run {

namespace {

/// Elementwise min (fastest) or max (slowest) of two equally long tables.
std::vector<double> elementwise(const std::vector<double>& a, const std::vector<double>& b, bool take_min) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = take_min ? std::min(a[i], b[i]) : std::max(a[i], b[i]);
  return out;
}

/// One profile pass of this rank, one unit at a time, with progress lines prefixed by `what`
/// (none with `quiet`: a repeated cycle's signatures were announced in the first).
ProfileResult profile_pass(RunContext& ctx, const ProfileConfig& pc, const std::string& what, bool quiet) {
  const double t_start = monotonic_s();
  return profile_model(*ctx.device, ctx.spec, pc, [&](int done, int all, const std::string& unit) {
    if (done >= all || quiet) return;
    std::string eta;
    if (done > 0) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), " (~%.0f s left)", (monotonic_s() - t_start) / done * (all - done));
      eta = buf;
    }
    ctx.progress.say(what + "signature " + std::to_string(done + 1) + "/" + std::to_string(all) + ": " + unit + eta);
  });
}

/// The profile's two passes interleaved (ResidentProfiler::profile_interleaved): one unit of
/// every signature built on every rank, where they fit beside nothing else (the profile precedes
/// the stages) on every rank; else nullptr (each pass then builds one unit at a time, as
/// profile_model, and the passes are timed one after the other). Collective.
std::unique_ptr<ResidentProfiler> interleaved_profiler(RunContext& ctx) {
  std::unique_ptr<ResidentProfiler> rp;
  const ProfileConfig pc = profile_config(ctx);
  const bool fits = ResidentProfiler::bytes(*ctx.device, ctx.spec, pc) <= ctx.device->free_memory();
  if (ctx.mpi.agree(fits ? 0 : 1) != 0) {
    ctx.progress.say("profile: one unit of every signature does not fit some rank at once: the passes are timed one "
                     "after the other, one unit at a time");
    return rp;
  }
  std::exception_ptr failed;
  ctx.phase("units of the profile", [&] {
    try {
      rp = std::make_unique<ResidentProfiler>(*ctx.device, ctx.spec, pc);
    } catch (...) {
      failed = std::current_exception();
    }
    if (ctx.mpi.agree(failed ? 1 : 0) != 0) {
      if (failed) std::rethrow_exception(failed);
      rp.reset();  // a peer failed: the phase's agreement ends it on every rank
    }
  });
  return rp;
}

/// The cycles so far, per pass (this rank's), one ProfileResult each.
struct Cycles {
  std::vector<ProfileResult> together, alone;  ///< together: the only pass with one pass
};

/// One cycle of the interleaved profile: per iteration, a turn alone for each rank of a
/// machine (the others wait without spinning) and one together (a barrier before every timed
/// forward), rotated by one per iteration; this rank's results appended to `cycles`.
/// Collective. `elapsed_s`: the profile's time so far, for the ETA.
void interleaved_cycle(RunContext& ctx, ResidentProfiler& units, ProfileConfig pc, int cycle, int max_cycles,
                       double elapsed_s, Cycles& cycles) {
  const MpiContext& mpi = ctx.mpi;
  const int alone_turns = mpi.agree(mpi.machine_size());  // the most ranks of any machine
  std::string eta;
  if (cycle > 1) eta = " (~" + format_fixed(elapsed_s / (cycle - 1), 0) + " s per cycle)";
  ctx.progress.say("profile cycle " + std::to_string(cycle) + (max_cycles > 1 ? " of up to " + std::to_string(max_cycles) : "") +
                   ": each rank of a machine alone, then all together, taking turns forward by forward" + eta);
  pc.align = [&mpi] { mpi.barrier(); };
  using Turn = ResidentProfiler::Turn;
  const int me = mpi.machine_rank();
  std::pair<ProfileResult, ProfileResult> r;
  try {
    r = units.profile_interleaved(pc, alone_turns + 1, [&](int t) {
      mpi.quiet_barrier(1e-3, [] { heartbeat(); });
      if (t == alone_turns) return Turn::together;
      return t == me ? Turn::alone : Turn::wait;
    });
  } catch (const std::exception& e) {
    // The units ran these forwards in their warm-up on every rank, so this is not bad input;
    // and the peers are in the turns' barriers, where no agreement can reach them: end the job.
    throw InternalError(std::string("the interleaved profile failed after its units were built: ") + e.what());
  }
  if (!r.first.decode_contexts.empty()) cycles.alone.push_back(std::move(r.first));
  cycles.together.push_back(std::move(r.second));
}

/// One cycle of the passes one after the other, each unit built in turn. A failure is kept
/// until every rank's part of the cycle is over and agreed on: no rank may leave the alone
/// turns early, nor enter the together pass's barriers (or the next cycle) alone. A rank that
/// waits for others' turns (a whole profile each) beats the watchdog's heartbeat. Returns false
/// when a peer failed (the phase's agreement then ends it on every rank).
bool sequential_cycle(RunContext& ctx, ProfileConfig pc, bool two_passes, int cycle, const std::string& of,
                      Cycles& cycles) {
  const MpiContext& mpi = ctx.mpi;
  std::exception_ptr failed;
  if (two_passes) {
    const int turns = mpi.agree(mpi.machine_size());
    for (int turn = 0; turn < turns; ++turn) {
      mpi.quiet_barrier(1e-3, [] { heartbeat(); });
      ctx.progress.say("profile pass 1/2 (alone)" + of + ": rank " + std::to_string(turn) + " of each machine; the others wait");
      if (mpi.machine_rank() == turn && !failed) {
        try {
          cycles.alone.push_back(profile_pass(ctx, pc, "profile alone: ", cycle > 1));
        } catch (...) {
          failed = std::current_exception();
        }
      }
    }
    mpi.quiet_barrier(1e-3, [] { heartbeat(); });
  } else {
    try {
      cycles.together.push_back(profile_pass(ctx, pc, "profile" + of + ": ", cycle > 1));
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (mpi.agree(failed ? 1 : 0) != 0) {
    if (failed) std::rethrow_exception(failed);
    return false;
  }
  if (!two_passes) return true;
  ctx.progress.say("profile pass 2/2 (together)" + of + ": every rank times each unit at the same moment");
  pc.align = [&mpi] { mpi.barrier(); };
  try {
    cycles.together.push_back(profile_pass(ctx, pc, "profile together: ", cycle > 1));
  } catch (const UserError& e) {
    // The alone pass ran the same forwards, so this is not bad input; and the peers are in the
    // pass's barriers, where no agreement can reach them: end the job.
    throw InternalError(std::string("the together profile pass failed after the alone pass succeeded: ") + e.what());
  }
  return true;
}

/// Rank 0: the units' names, signatures, parameters, bytes, FLOPs and floors into the record.
void record_units(RunContext& ctx, const std::vector<int>& decode_contexts) {
  ProfileTable& t = ctx.record().profile;
  const model::ModelSpec& spec = ctx.spec;
  const int U = spec.num_units();
  for (int u = 0; u < U; ++u) {
    t.unit_name.push_back(spec.units[u].name);
    t.unit_signature.push_back(spec.units[u].signature);
    t.unit_params.push_back(model::unit_params(spec, u));
    const auto [w, kv] = unit_bytes(ctx, u);
    t.unit_weight_bytes.push_back(w);
    t.unit_kv_bytes.push_back(kv);
  }
  for (int u = 0; u < U; ++u) {
    const model::UnitWork w = model::unit_work(spec, u, ctx.workload.batch, ctx.workload.prompt_len, decode_contexts,
                                               dtype_bytes(ctx.workload.dtype));
    t.unit_flops.insert(t.unit_flops.end(), {w.prefill_flops, w.decode_flops});
    t.unit_bytes.insert(t.unit_bytes.end(), {w.prefill_bytes, w.decode_bytes});
  }
  const std::vector<RankInfo>& ranks = ctx.record().ranks;
  for (int r = 0; r < ctx.ranks; ++r)
    for (int i = 0; i < 2 * U; ++i)
      t.floor_ms.push_back(
          roofline_floor_ms(t.unit_flops[i], t.unit_bytes[i], ranks[r].read_bandwidth_GBps, ranks[r].peak_gflops));
  t.signature_name = spec.signatures;
}

using stepcost::kGridDisturbedError;
/// How many times a disturbed grid is timed again (each a grid's time: ~6 s for Qwen3-0.6B here).
constexpr int kGridRetries = 2;

/// [signatures] 1 where the signature's step cost goes by rows (the head: stepcost/step_model.h).
std::vector<int> grid_by_rows(const model::ModelSpec& spec) {
  std::vector<int> by_rows;
  for (std::size_t s = 0; s < spec.signatures.size(); ++s)
    by_rows.push_back(spec.units[spec.signature_example[s]].kind == model::UnitKind::head ? 1 : 0);
  return by_rows;
}

/// This rank's held-out error of its grid over the whole model (stepcost::fit_grid of `ms`
/// [signatures][N], each signature counted by its units): the |model / measured - 1| p50.
double local_grid_error(const RunContext& ctx, const std::vector<stepcost::GridStep>& grid, const std::vector<double>& ms) {
  std::vector<int> units(ctx.spec.signatures.size(), 0);
  for (const auto& u : ctx.spec.units) ++units[u.signature];
  return stepcost::fit_grid(grid, grid_by_rows(ctx.spec), ms, units).abs_error_p50;
}

/// The step model's grid (issue 47) as this run times it, on every rank and on every
/// tensor-parallel group: the profile's config for it (--step-grid-iters passes, one untimed)
/// and its steps. Closed batches: steps up to the prefill's B·P tokens. Requests that arrive:
/// the workload's P and G are the scenario's means; its steps reach B prompts of the longest
/// (with a KV pool that preempts, B recomputes of the longest request's positions; a vllm-v1
/// budget, if smaller) at positions up to the longest request's, so units of that shape are
/// built for the grid, one at a time (`resident` false).
struct GridPlan {
  ProfileConfig pc;
  std::vector<stepcost::GridStep> grid;
  bool resident = true;  ///< whether the profile's resident units have the grid's shapes
};
GridPlan grid_plan(const RunContext& ctx) {
  GridPlan g;
  g.pc = profile_config(ctx);
  g.pc.iters = ctx.opt.step_grid_iters;
  g.pc.warmup = std::min(g.pc.warmup, 1);
  int max_tokens = ctx.workload.batch * ctx.workload.prompt_len;
  if (ctx.opt.scenario.on()) {
    const serving::ScenarioSpec& sc = *ctx.opt.scenario.spec;
    g.pc.work.prompt_len = sc.max_prompt_len;
    g.pc.work.gen_len = sc.max_gen_len;
    max_tokens = g.pc.work.batch * (sc.max_prompt_len + (sc.kv_blocks != 0 ? sc.max_gen_len - 1 : 0));
    if (sc.policy == serving::StepPolicy::vllm_v1 && sc.compared_policies.empty())
      max_tokens = std::min(max_tokens, sc.max_batched_tokens);
    g.resident = false;
  }
  g.grid = stepcost::plan_grid(step_grid_spec(g.pc, max_tokens));
  return g;
}

/// The step model's grid (issue 47) timed on every rank (grid_plan): on the resident units
/// where they have its shapes (else one unit at a time), in the together pass's conditions where
/// the profile has two passes (a barrier before every timed forward). A grid whose held-out
/// steps miss the fit by more than kGridDisturbedError (p50) on some rank is timed again, up to
/// kGridRetries times, and each rank keeps its attempt of the lowest held-out error (`attempts`:
/// how many were timed). Empty with --step-grid-iters 0 or where the phase ended on a peer's
/// failure. Collective.
StepGridResult time_step_grid(RunContext& ctx, ResidentProfiler* units, bool two_passes, int& attempts) {
  StepGridResult out;
  attempts = 0;
  if (ctx.opt.step_grid_iters <= 0) return out;
  GridPlan plan = grid_plan(ctx);
  ProfileConfig& pc = plan.pc;
  const std::vector<stepcost::GridStep>& grid = plan.grid;
  if (!plan.resident) units = nullptr;
  const MpiContext& mpi = ctx.mpi;
  if (two_passes) pc.align = [&mpi] { mpi.barrier(); };
  double best = std::numeric_limits<double>::infinity();
  for (attempts = 1; attempts <= 1 + kGridRetries; ++attempts) {
    StepGridResult r;
    ctx.phase("step grid", [&] {
      if (attempts == 1)
        ctx.progress.say("profile: the step model's grid, " + std::to_string(grid.size()) + " step shapes x " +
                         std::to_string(ctx.spec.signatures.size()) + " signatures" +
                         (two_passes ? ", every rank at the same moment" : ""));
      try {
        r = units ? units->time_grid(pc, grid) : profile_grid(*ctx.device, ctx.spec, pc, grid);
      } catch (const std::exception& e) {
        // The profile ran these units already, and with two passes the peers are in the
        // barriers, where no agreement can reach them: end the job.
        if (two_passes) throw InternalError(std::string("the step model's grid failed after the profile: ") + e.what());
        throw;
      }
    });
    const double e = local_grid_error(ctx, grid, r.ms);
    if (e < best) best = e, out = std::move(r);
    // Per mille, rounded up: agree() takes ints; any rank over the limit times it again.
    const int worst = ctx.mpi.agree(static_cast<int>(std::ceil(1000.0 * best)));
    if (worst <= 1000.0 * kGridDisturbedError || attempts == 1 + kGridRetries) break;
    ctx.progress.say(format_line("profile: the step model's grid (its best attempt so far) misses its held-out steps by "
                                 "%.1f%% (p50) on a rank, over %.0f%%: the machine moved under it; timing it again "
                                 "(attempt %d of %d)", worst / 10.0, 100 * kGridDisturbedError, attempts + 1,
                                 1 + kGridRetries));
  }
  return out;
}

/// One window of a forward's fixed cost (issue 47, stepcost::FixedCost): kFixedCostPairs pairs per
/// kind of step on every rank, in the grid's conditions (with two passes every rank's forwards at
/// the same moment), `window` 0 before the grid and 1 after it. Nothing without the grid
/// (--step-grid-iters 0), for a model without two adjacent units of one signature, or where its
/// three units do not fit some rank's free memory (agreed: every rank times or none; said).
/// Collective.
FixedCostTiming time_fixed_costs(RunContext& ctx, bool two_passes, int window) {
  FixedCostTiming out;
  if (ctx.opt.step_grid_iters <= 0 || fixed_cost_unit(ctx.spec) < 0) return out;
  ProfileConfig pc = profile_config(ctx);
  pc.warmup = std::min(pc.warmup, 1);
  const MpiContext& mpi = ctx.mpi;
  if (mpi.agree(fixed_cost_bytes(*ctx.device, ctx.spec, pc) <= ctx.device->free_memory() ? 0 : 1) != 0) {
    ctx.progress.say("profile: a forward's fixed cost not timed: a stage of two units and one do not fit some rank's "
                     "free memory beside the profile's units (each stage then pays it once per unit)");
    return out;
  }
  if (two_passes) pc.align = [&mpi] { mpi.barrier(); };
  ctx.phase("fixed cost", [&] {
    if (window == 0)
      ctx.progress.say(format_line("profile: a forward's fixed cost, a stage of two units against one, %d pairs per kind "
                                   "of step before the grid and %d after", stepcost::kFixedCostPairs, stepcost::kFixedCostPairs));
    try {
      out = time_fixed_cost(*ctx.device, ctx.spec, pc, stepcost::kFixedCostPairs);
    } catch (const std::exception& e) {
      if (two_passes) throw InternalError(std::string("the fixed cost's stages failed after the profile: ") + e.what());
      throw;
    }
  });
  return out;
}

/// Collective: the pooled tables and every cycle of every rank gathered into rank 0's record.
void gather_profile(RunContext& ctx, const Cycles& cycles, bool two_passes, bool interleaved,
                    const StepGridResult& grid, int grid_attempts,
                    const FixedCostTiming& fixed) {
  const MpiContext& mpi = ctx.mpi;
  ProfileResult prof = pool_cycles(cycles.together), alone;
  if (two_passes) {
    alone = pool_cycles(cycles.alone);
    prof.prefill_min_ms = elementwise(prof.prefill_min_ms, alone.prefill_min_ms, true);
    prof.decode_min_ms = elementwise(prof.decode_min_ms, alone.decode_min_ms, true);
    prof.prefill_max_ms = elementwise(prof.prefill_max_ms, alone.prefill_max_ms, false);
    prof.decode_max_ms = elementwise(prof.decode_max_ms, alone.decode_max_ms, false);
  }
  const int U = ctx.spec.num_units();
  std::vector<double> cost_mine(U);
  for (int u = 0; u < U; ++u)
    cost_mine[u] = balance::objective_cost(ctx.opt.objective, prof.prefill_ms[u], prof.decode_ms[u], ctx.workload.gen_len);
  const auto lat = mpi.gather_doubles(pack_phases(prof.prefill_ms, prof.decode_ms));
  const auto lat_min = mpi.gather_doubles(pack_phases(prof.prefill_min_ms, prof.decode_min_ms));
  const auto lat_max = mpi.gather_doubles(pack_phases(prof.prefill_max_ms, prof.decode_max_ms));
  const auto contexts = mpi.gather_doubles(prof.decode_context_ms);
  const auto cost_all = mpi.gather_doubles(cost_mine);
  std::vector<double> lat_alone;
  if (two_passes) lat_alone = mpi.gather_doubles(pack_phases(alone.prefill_ms, alone.decode_ms));
  const std::vector<double> grid_ms = mpi.gather_doubles(grid.ms);  // [R][S][N]
  const std::vector<double> fixed_one = mpi.gather_doubles(fixed.one_ms);  // [R][2][pairs]
  const std::vector<double> fixed_two = mpi.gather_doubles(fixed.two_ms);
  std::vector<double> together_cycles, alone_cycles;  // [K][R][U][2] on rank 0
  for (const ProfileResult& c : cycles.together) {
    const auto all = mpi.gather_doubles(pack_phases(c.prefill_ms, c.decode_ms));
    together_cycles.insert(together_cycles.end(), all.begin(), all.end());
  }
  for (const ProfileResult& c : cycles.alone) {
    const auto all = mpi.gather_doubles(pack_phases(c.prefill_ms, c.decode_ms));
    alone_cycles.insert(alone_cycles.end(), all.begin(), all.end());
  }
  // The profile table goes into the file before the balancer runs: a split that cannot be
  // found (memory) still leaves what was measured.
  if (!ctx.root) return;
  RunRecord& run = ctx.record();
  if (two_passes) {
    run.workload.profile_order = interleaved ? "interleaved" : "one pass after the other";
    run.workload.profile_passes = "alone+together";
  }
  run.workload.profile_repeats = static_cast<int>(cycles.together.size());
  record_units(ctx, prof.decode_contexts);
  ProfileTable& t = run.profile;
  t.latency_ms = lat;
  t.latency_min_ms = lat_min;
  t.latency_max_ms = lat_max;
  t.latency_alone_ms = lat_alone;
  t.latency_cycles_ms = together_cycles;
  t.latency_alone_cycles_ms = alone_cycles;
  t.decode_contexts = prof.decode_contexts;
  t.decode_context_ms = contexts;
  t.cost_ms = cost_all;
  if (!grid.grid.empty()) {
    const stepcost::FlatGrid flat = stepcost::flatten(grid.grid);
    t.step_rows = flat.rows, t.step_pos = flat.pos, t.step_tokens = flat.tokens, t.step_role = flat.role;
    t.step_ms = grid_ms;
    t.step_attempts = grid_attempts;
    t.step_by_rows = grid_by_rows(ctx.spec);
  }
  if (fixed.unit >= 0 && fixed_one.size() == fixed_two.size() && !fixed_one.empty()) {
    t.fixed_unit = fixed.unit;
    t.fixed_one_ms = fixed_one;
    t.fixed_two_ms = fixed_two;
  }
}

/// The groups of ranks the layouts run tensor-parallel stages on, (first rank, width), each
/// once, in layout order; with --tp auto one group per width and device class (identical
/// devices cost the same).
std::vector<std::pair<int, int>> tp_groups_needed(const RunContext& ctx) {
  std::vector<std::pair<int, int>> out;
  for (const auto& widths : ctx.plan.layouts)
    for (const auto& g : balance::layout_groups(widths))
      if (g.second > 1 && std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
  for (const auto& g : balance::auto_layout_groups(ctx.cluster.equivalence.device_class, ctx.plan.auto_widths))
    if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
  return out;
}

/// This rank's part of a tensor-parallel group's profile: its shard of every unit timed with
/// the group, `cycles` times, pooled as the width-1 profile's cycles are (pool_cycles); the
/// group's first rank appends [U][2] latency, min and max to `mine`, then how many times it timed
/// the step model's grid at the group's width (0 with --step-grid-iters 0), then that grid's
/// medians, [signatures][N] (none with --step-grid-iters 0).
void profile_group(RunContext& ctx, TpGroup& tp, int cycles, std::vector<double>& mine) {
  ProfileConfig pc = profile_config(ctx);  // cold or warm as the width-1 profile
  pc.tp_width = tp.width();
  pc.tp_rank = tp.rank();
  pc.tp = &tp;
  // Each rank flushes its caches before a timed forward; without a meeting after the flushes,
  // the first all-reduce of the forward would time a peer's flush.
  pc.align = [group = &tp] { group->barrier(); };
  std::vector<ProfileResult> runs;
  for (int k = 0; k < cycles; ++k) runs.push_back(profile_model(*ctx.device, ctx.spec, pc));
  const ProfileResult prof = pool_cycles(runs);  // as the width-1 profile's cycles
  // The step model's grid at this width (issue 47): the width-1 grid's steps on the group's
  // shards, one unit at a time, every forward after the group's barrier. As the width-1 grid, a
  // grid whose held-out steps miss by more than kGridDisturbedError (p50, the group's first
  // rank: its medians are the group's) is timed again, up to kGridRetries times, the group
  // agreeing through its own all-reduce (the other ranks wait apart), keeping the best attempt.
  std::vector<double> grid_ms;
  int attempts = 0;
  if (ctx.opt.step_grid_iters > 0) {
    GridPlan plan = grid_plan(ctx);
    plan.pc.tp_width = pc.tp_width, plan.pc.tp_rank = pc.tp_rank, plan.pc.tp = pc.tp, plan.pc.align = pc.align;
    double best = std::numeric_limits<double>::infinity();
    for (attempts = 1; attempts <= 1 + kGridRetries; ++attempts) {
      std::vector<double> ms = profile_grid(*ctx.device, ctx.spec, plan.pc, plan.grid).ms;
      double e = 0.0;
      std::exception_ptr failed;  // the first rank's fit: its peers must still meet it below
      if (tp.rank() == 0) try {
          e = local_grid_error(ctx, plan.grid, ms);
        } catch (...) {
          failed = std::current_exception();
        }
      if (e < best || attempts == 1) best = e, grid_ms = std::move(ms);
      // The first rank's verdict on every rank of the group, per mille as the width-1 grid's.
      float again = tp.rank() == 0 && !failed && std::ceil(1000.0 * best) > 1000.0 * kGridDisturbedError ? 1.0f : 0.0f;
      tp.allreduce_sum(&again, 1);
      if (failed) std::rethrow_exception(failed);
      if (again == 0.0f || attempts == 1 + kGridRetries) break;
    }
  }
  if (tp.rank() != 0) return;
  for (const auto& [pre, dec] : {std::pair{&prof.prefill_ms, &prof.decode_ms}, std::pair{&prof.prefill_min_ms, &prof.decode_min_ms},
                                 std::pair{&prof.prefill_max_ms, &prof.decode_max_ms}}) {
    const std::vector<double> rows = pack_phases(*pre, *dec);
    mine.insert(mine.end(), rows.begin(), rows.end());
  }
  mine.push_back(attempts);
  mine.insert(mine.end(), grid_ms.begin(), grid_ms.end());
}

/// Greedy rounds of groups: a group joins the first round none of whose groups shares a rank.
std::vector<std::vector<std::pair<int, int>>> group_rounds(const std::vector<std::pair<int, int>>& groups) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  for (const auto& g : groups) {
    auto overlaps = [&](const std::pair<int, int>& h) { return g.first < h.first + h.second && h.first < g.first + g.second; };
    auto it = std::find_if(rounds.begin(), rounds.end(),
                           [&](const auto& round) { return std::none_of(round.begin(), round.end(), overlaps); });
    if (it == rounds.end()) it = rounds.insert(rounds.end(), std::vector<std::pair<int, int>>{});
    it->push_back(g);
  }
  return rounds;
}

/// One round of groups profiled at once (collective), gathered into rank 0's /profile/tp.
void profile_group_round(RunContext& ctx, const std::vector<std::pair<int, int>>& round, int cycles) {
  const MpiContext& mpi = ctx.mpi;
  const int U = ctx.spec.num_units();
  int color = -1, key = 0;
  for (size_t i = 0; i < round.size(); ++i)
    if (mpi.rank() >= round[i].first && mpi.rank() < round[i].first + round[i].second) {
      color = static_cast<int>(i);
      key = mpi.rank() - round[i].first;
    }
  std::vector<double> mine;  // a group's first rank: latency, min, max [U][2] each, grid attempts [1], its grid [S][N]
  ctx.phase("profile at tensor-parallel widths", [&] {
    std::string what;
    for (const auto& [first, w] : round)
      what += (what.empty() ? "" : ", ") + std::string("ranks ") + std::to_string(first) + ".." +
              std::to_string(first + w - 1) + " at width " + std::to_string(w);
    ctx.progress.say("profile: tensor-parallel groups " + what +
                     (cycles > 1 ? ", " + std::to_string(cycles) + " cycles as the width-1 profile" : std::string()) +
                     (ctx.opt.step_grid_iters > 0 ? ", then the step model's grid at the width" : ""));
    auto tp = ctx.make_tp_group(color, key);
    if (tp) ctx.cluster.tp_group_bytes = std::max(ctx.cluster.tp_group_bytes, tp->device_bytes());
    // Ranks outside the round's groups wait without spinning (a busy wait would take a core from
    // the ranks being timed); a member's failure is rethrown after the meeting, so that every
    // rank reaches the phase's agreement instead of one waiting for the others.
    std::exception_ptr failed;
    if (tp) {
      try {
        profile_group(ctx, *tp, cycles, mine);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    mpi.quiet_barrier(1e-3, [] { heartbeat(); });
    if (failed) std::rethrow_exception(failed);
  });
  ctx.phase("gather of the tensor-parallel profile", [&] {
    const auto all = mpi.gatherv_doubles(mine);
    if (!ctx.root) return;
    for (const auto& [first, w] : round) {
      const auto& row = all[first];
      ProfileTable::TpGroupProfile g;
      g.first_rank = first;
      g.width = w;
      if (row.size() < static_cast<size_t>(6 * U + 1))
        throw InternalError("profile of tensor-parallel group at rank " + std::to_string(first) + " is missing");
      g.latency_ms.assign(row.begin(), row.begin() + 2 * U);
      g.latency_min_ms.assign(row.begin() + 2 * U, row.begin() + 4 * U);
      g.latency_max_ms.assign(row.begin() + 4 * U, row.begin() + 6 * U);
      g.step_attempts = static_cast<int>(row[6 * U]);
      g.step_ms.assign(row.begin() + 6 * U + 1, row.end());  // [signatures][N]; empty without the grid
      ctx.record().profile.tp.push_back(std::move(g));
    }
  });
}

}  // namespace

ProfileConfig profile_config(const RunContext& ctx) {
  ProfileConfig pc;
  pc.work = ctx.workload;
  pc.num_contexts = ctx.opt.profile_contexts;
  pc.warmup = ctx.opt.profile_warmup;
  pc.iters = ctx.opt.profile_iters;
  pc.cuda_graphs = ctx.opt.cuda_graphs;
  pc.expert_skew = ctx.opt.expert_skew;
  int64_t total = 0;
  for (int u = 0; u < ctx.spec.num_units(); ++u)
    total += model::unit_resident_params(ctx.spec, u) * dtype_bytes(ctx.workload.dtype);
  pc.resident_bytes = static_cast<size_t>(total / ctx.ranks * ctx.mpi.machine_size());
  return pc;
}

std::vector<double> pack_phases(const std::vector<double>& prefill, const std::vector<double>& decode) {
  std::vector<double> v;
  for (size_t u = 0; u < prefill.size() && u < decode.size(); ++u) {
    v.push_back(prefill[u]);
    v.push_back(decode[u]);
  }
  return v;
}

ProfileResult pool_cycles(const std::vector<ProfileResult>& runs) {
  ProfileResult out = runs.front();
  auto pool = [&](std::vector<double> ProfileResult::*table) {
    std::vector<double>& o = out.*table;
    for (size_t i = 0; i < o.size(); ++i) {
      std::vector<double> x;
      for (const ProfileResult& r : runs) x.push_back((r.*table)[i]);
      o[i] = median(x);  // with one or two cycles: the value, or the mean of the two
    }
  };
  pool(&ProfileResult::prefill_ms);
  pool(&ProfileResult::decode_ms);
  pool(&ProfileResult::decode_context_ms);
  const size_t C = out.decode_contexts.size();  // decode_ms stays the mean over contexts
  if (C > 0 && out.decode_context_ms.size() == C * out.decode_ms.size())
    for (size_t u = 0; u < out.decode_ms.size(); ++u) {
      double sum = 0.0;
      for (size_t c = 0; c < C; ++c) sum += out.decode_context_ms[u * C + c];
      out.decode_ms[u] = sum / static_cast<double>(C);
    }
  for (size_t c = 1; c < runs.size(); ++c) {
    const ProfileResult& r = runs[c];
    out.prefill_min_ms = elementwise(out.prefill_min_ms, r.prefill_min_ms, true);
    out.decode_min_ms = elementwise(out.decode_min_ms, r.decode_min_ms, true);
    out.prefill_max_ms = elementwise(out.prefill_max_ms, r.prefill_max_ms, false);
    out.decode_max_ms = elementwise(out.decode_max_ms, r.decode_max_ms, false);
  }
  return out;
}

ProfileOutcome profile_units(RunContext& ctx) {
  const MpiContext& mpi = ctx.mpi;
  const RunOptions& opt = ctx.opt;
  Cycles cycles;
  ProfileOutcome outcome;
  outcome.two_passes = opt.contention == Contention::automatic &&
                       mpi.agree(ctx.device->node_ranks_share_memory() && mpi.machine_size() > 1 ? 1 : 0) != 0;
  const bool two_passes = outcome.two_passes;
  const int max_cycles = opt.profile_repeats > 0 ? opt.profile_repeats : two_passes ? kAutoProfileRepeats : 1;
  std::unique_ptr<ResidentProfiler> units = two_passes ? interleaved_profiler(ctx) : nullptr;
  ctx.phase("profile", [&] {
    const ProfileConfig pc = profile_config(ctx);
    const double t_start = monotonic_s();
    for (int cycle = 1;; ++cycle) {
      if (units) {
        interleaved_cycle(ctx, *units, pc, cycle, max_cycles, monotonic_s() - t_start, cycles);
      } else {
        const std::string of = max_cycles > 1 ? " (cycle " + std::to_string(cycle) + ")" : "";
        if (!sequential_cycle(ctx, pc, two_passes, cycle, of, cycles)) return;
      }
      const bool more = cycle < max_cycles && (opt.profile_repeats > 0 || monotonic_s() - t_start < kProfileSpanS ||
                                               (two_passes && cycle < kMinAutoRepeats));
      if (mpi.agree(more ? 0 : 1) != 0) break;  // every rank cycles as long as all of them would
    }
  });
  const bool interleaved = units != nullptr;
  if (cycles.together.empty()) return outcome;  // the phase ended on a peer's failure (it threw there)
  int grid_attempts = 0;
  const FixedCostTiming before = time_fixed_costs(ctx, two_passes, 0);
  const StepGridResult grid = time_step_grid(ctx, units.get(), two_passes, grid_attempts);
  units.reset();  // its units' memory, before the stages are built
  // The second window where the first was timed (every rank alike: `before` is agreed).
  const FixedCostTiming fixed =
      before.unit >= 0 ? join_fixed_windows(before, time_fixed_costs(ctx, two_passes, 1)) : FixedCostTiming{};
  outcome.cycles = static_cast<int>(cycles.together.size());
  gather_profile(ctx, cycles, two_passes, interleaved, grid, grid_attempts, fixed);
  return outcome;
}

void profile_tp_groups(RunContext& ctx, int cycles) {
  const auto groups = tp_groups_needed(ctx);
  if (groups.empty()) return;
  const std::vector<int>& cls = ctx.cluster.equivalence.device_class;
  ctx.phase("layouts", [&] {
    for (const auto& [first, w] : groups)
      for (int r = first; r < first + w; ++r)
        if (cls[r] != cls[first])
          throw UserError("--tp: ranks " + std::to_string(first) + ".." + std::to_string(first + w - 1) +
                          " would form a tensor-parallel stage, but rank " + std::to_string(r) +
                          " is not an identical device of rank " + std::to_string(first) +
                          "'s node (/ranks: hostname, device, CPU quota, threads); a stage's ranks must be "
                          "identical devices of one node");
  });
  for (const auto& round : group_rounds(groups)) profile_group_round(ctx, round, std::max(1, cycles));
}

}  // namespace ppb::run
