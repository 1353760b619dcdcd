#include "run/plan.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include "balance/layout.h"
#include "balance/plan.h"
#include "balance/memory_report.h"
#include "balance/problem.h"
#include "balance/serving_step_model.h"
#include "serving/pipeline_sim.h"
#include "common/format.h"
#include "run/memory_checks.h"
#include "run/plan_points.h"
#include "run/serving_search.h"

namespace ppb::run {

int PartitionSet::index_of(const std::string& name) const {
  for (size_t i = 0; i < splits.size(); ++i)
    if (splits[i].solver == name) return static_cast<int>(i);
  return -1;
}

StagePlacement PartitionSet::placement(const balance::Partition& p, int rank) {
  const int replica = rank / p.ranks_per_replica();
  StagePlacement place = layout_placement(p.stage_ranks(replica), rank);
  place.replica = replica;
  return place;
}

bool PartitionSet::measured_alone(size_t i, const balance::SplitEquivalence& eq) const {
  return splits[i].solver == kControl || balance::same_split_as(splits, i, eq) < 0;
}

void broadcast_partitions(const MpiContext& mpi, std::vector<balance::Partition>& parts, int units) {
  std::vector<int> flat;
  std::string names;
  if (mpi.is_root())
    for (const balance::Partition& p : parts) {
      const int S = p.num_stages();
      flat.push_back(S);
      flat.insert(flat.end(), p.first_unit.begin(), p.first_unit.end());
      flat.insert(flat.end(), p.device_rank.begin(), p.device_rank.end());
      for (int k = 0; k < S; ++k) flat.push_back(p.width(k));
      flat.push_back(p.groups);
      flat.push_back(p.replicas);
      names += p.solver + "\n";
    }
  mpi.bcast_ints(flat);
  mpi.bcast_string(names);
  if (mpi.is_root()) return;
  parts.clear();
  std::istringstream in(names);
  size_t at = 0;
  for (std::string name; std::getline(in, name);) {
    const int S = flat.at(at++);
    balance::Partition p;
    p.solver = name;
    for (int k = 0; k < S; ++k) {
      p.first_unit.push_back(flat.at(at + k));
      p.last_unit.push_back(k + 1 < S ? flat.at(at + k + 1) - 1 : units - 1);
      p.device_rank.push_back(flat.at(at + S + k));
      p.tp_width.push_back(flat.at(at + 2 * S + k));
    }
    at += 3 * static_cast<size_t>(S);
    p.groups = flat.at(at++);
    p.replicas = flat.at(at++);
    parts.push_back(std::move(p));
  }
}

namespace {

/// Rank 0, --tp auto: the widths of the layout to deploy, recorded in the record's
/// tp_auto_layout. Identical ranks: the most predicted tokens/s at the run's M, fill and drain
/// included (balance::rank_layouts_by_tokens, the planner's ranking; issue 36), saying what the
/// smallest bottleneck would have chosen where that differs. Ranks that differ (the planner
/// lays out devices like rank 0): the smallest bottleneck over every group of consecutive
/// identical ranks (balance::solve_layout: then spread, then fewer stages).
std::vector<int> choose_layout(RunContext& ctx, const balance::BalanceProblem& prob) {
  RunRecord& run = ctx.record();
  const std::vector<int>& classes = ctx.cluster.equivalence.device_class;
  if (std::all_of(classes.begin(), classes.end(), [&](int c) { return c == classes[0]; })) {
    const balance::LayoutRanking r = balance::rank_layouts_by_tokens(run, ctx.ranks);
    run.tp_auto_layout = balance::layout_label(r.best.widths);
    std::string why = "predicted " + format_fixed(r.best.tokens_per_s, 1) + " tokens/s, the most of " +
                      std::to_string(r.evaluated) + " layouts at M=" + std::to_string(run.workload.microbatches);
    if (r.min_bottleneck.widths != r.best.widths)
      why += "; the smallest bottleneck (" + format_fixed(r.min_bottleneck.split.bottleneck_ms, 2) + " ms, widths " +
             balance::layout_label(r.min_bottleneck.widths) + ") predicts " +
             format_fixed(r.min_bottleneck.tokens_per_s, 1) + " tokens/s";
    ctx.progress.say("--tp auto: the balancer chose widths " + run.tp_auto_layout + " (" +
                     r.best.split.counts_string() + " units per stage), " + why);
    return r.best.widths;
  }
  std::vector<int> widths = {1};
  widths.insert(widths.end(), ctx.plan.auto_widths.begin(), ctx.plan.auto_widths.end());
  const balance::Partition best =
      balance::solve_layout(prob, balance::layout_candidates(run, prob, ctx.opt.objective, classes, widths), ctx.ranks);
  run.tp_auto_layout = balance::layout_label(best.tp_width);
  ctx.progress.say("--tp auto: the balancer chose widths " + run.tp_auto_layout + " (" + best.counts_string() +
                   " units per stage), predicted bottleneck " + format_fixed(best.bottleneck_ms, 2) +
                   " ms (ranks differ: ranked by the bottleneck stage)");
  return best.tp_width;
}

/// Rank 0, with a serving scenario (issue 37): the gen_len of the workload objective that weighs
/// prefill against decode as the scenario does at its offered load. Per request a stage does
/// P̄ prefill tokens (the scenario's mean prompt) and Ḡ - 1 decode rows (its mean output less
/// the prefill's token); a decode step serves r̄ rows at once for about the price of one (the
/// decode of up to B rows is memory-bound: serving_step_model.h), so a request costs
/// P̄ x (prefill per token) + (Ḡ - 1) / r̄ decode steps. The objective's terms per group of B
/// sequences, prefill(B x P) + G x decode(B), are B times that with P = P̄ and
/// G = B (Ḡ - 1) / r̄. r̄, the mean decode rows per decode step, depends on the load: the
/// serving simulator plays the scenario's requests on the uniform split from the profile
/// (balance::ProfileStepCosts) and counts them. At saturation r̄ = B and G = Ḡ - 1 (the closed
/// objective); at a light load r̄ -> 1 and decode weighs B times more.
/// Where the profile timed the step model's grid (issue 47), the simulated steps' shapes are
/// kept too, and the balancer solves on balance::step_mix_costs of them instead (scale B / N:
/// each unit's busy time per B requests, the objective's unit): the split that minimises the
/// bottleneck stage's busy time under the scenario's own step mix at that load, not under a
/// closed batch's shapes weighted by G. The mix is the uniform split's (a split changes the
/// steps the scheduler forms only through their timing).
struct ScenarioObjective {
  int gen_len = 1;
  balance::StepMixCosts mix;  ///< unit_ms [R][U] (empty: the G-weighted objective), stage_fixed_ms [R]
};

ScenarioObjective scenario_objective(RunContext& ctx, const balance::BalanceProblem& prob) {
  RunRecord& run = ctx.record();
  const serving::ScenarioSpec& sc = *ctx.opt.scenario.spec;
  const std::vector<serving::Request>& drawn = ctx.opt.scenario.drawn.requests;
  balance::SplitRequest req;
  req.method = balance::Method::uniform;
  req.stages = ctx.ranks;
  balance::Partition uniform = balance::make_split(prob, req);
  uniform.tp_width.assign(uniform.num_stages(), 1);
  uniform.groups = ctx.workload.groups;
  const balance::Predictor pred(run);
  const balance::ProfileStepCosts costs(run, pred, uniform);
  serving::PipelineSimConfig cfg;
  cfg.scheduler = serving_sim_config(ctx, uniform).scheduler;  // --kv-blocks auto: the uniform split's pool
  cfg.record_shapes = ctx.opt.objective == balance::Objective::workload;
  std::vector<serving::Request> requests = ctx.scenario_requests;
  if (sc.rate_search) {  // the pilot's rate (run/serving_search.h): the offered load of the objective
    RateSearchRecord& rs = run.serving.rate_search;
    rs.on = true;
    rs.attainment_target = sc.attainment;
    rs.slo_ttft_ms = sc.goodput.ttft_ms;
    rs.slo_tpot_ms = sc.goodput.tpot_ms;
    // The pilot plays at the profile's rate, or faster where its N arrivals would outlast
    // --max-time (a pessimistic profile must not make the calibration's round hours long).
    const double profile_rate = profile_max_rate(ctx, pred, uniform);
    const double bounded_rate = static_cast<double>(drawn.size()) / ctx.opt.max_time_s;
    rs.pilot_rate = std::max(profile_rate, bounded_rate);
    requests = serving::scale_arrivals(drawn, profile_rate);
    ctx.progress.say(format_line("rate search: on the profile, the uniform split meets the SLO up to %.3f requests/s "
                                 "(serving simulator): the balancer's offered load; the pilot round at %.3f requests/s%s",
                                 profile_rate, rs.pilot_rate,
                                 rs.pilot_rate > profile_rate ? " (its arrivals within --max-time)" : ""));
  }
  const serving::PipelineSimResult sim = serving::simulate_serving(requests, costs, cfg);
  double gen = 0;
  for (const serving::Request& r : requests) gen += r.gen_len - 1;
  gen /= static_cast<double>(requests.size());
  const double rows = sim.decode_steps > 0 ? static_cast<double>(sim.decode_rows) / static_cast<double>(sim.decode_steps) : 1.0;
  const int G = std::max(1, static_cast<int>(std::lround(ctx.workload.batch * gen / rows)));
  run.serving.objective_decode_rows = rows;
  run.serving.objective_gen_len = G;
  ScenarioObjective out;
  out.gen_len = G;
  out.mix = balance::step_mix_costs(run, sim.shapes,
                                    static_cast<double>(ctx.workload.batch) / static_cast<double>(requests.size()));
  if (!out.mix.unit_ms.empty()) {
    run.serving.objective_steps = static_cast<long long>(sim.shapes.size());
    ctx.progress.say(format_line("scenario objective: the units' step-model costs over the %lld steps the serving "
                                 "simulator plays on the uniform split at the offered load (%.2f decode rows per "
                                 "decode step of B=%d), per B requests: the split is balanced on that step mix",
                                 static_cast<long long>(sim.shapes.size()), rows, ctx.workload.batch));
    return out;
  }
  if (ctx.opt.objective != balance::Objective::workload) {
    ctx.progress.say(format_line("scenario objective: --objective %s: the split is balanced on one %s step of B=%d, not "
                                 "on the scenario's mix", balance::objective_name(ctx.opt.objective),
                                 balance::objective_name(ctx.opt.objective), ctx.workload.batch));
    return out;
  }
  ctx.progress.say(format_line("scenario objective: %.2f decode rows per decode step at the offered load (of B=%d; "
                               "simulated on the uniform split), mean output %.1f tokens after the first: the split "
                               "is balanced on prefill(B x P=%d) + %d x decode(B)",
                               rows, ctx.workload.batch, gen, ctx.workload.prompt_len, G));
  return out;
}

/// Rank 0: every split the plan asks for, solved (DESIGN.md §6) on the balancer's problem built
/// from the record exactly as `ppbench balance FILE.h5` rebuilds it from the file; a layout with
/// tensor-parallel stages solves over its stages' groups (balance::layout_problem).
std::vector<balance::Partition> solve_partitions(RunContext& ctx) {
  balance::BalanceProblem prob = balance::problem_from_run(ctx.record(), ctx.opt.objective);
  if (ctx.opt.scenario.on()) {
    RunRecord weighted = ctx.record();
    const ScenarioObjective so = scenario_objective(ctx, prob);
    weighted.workload.gen_len = so.gen_len;
    prob = balance::problem_from_run(weighted, ctx.opt.objective);
    const std::size_t U = static_cast<std::size_t>(prob.units());
    const std::vector<double>& mix = so.mix.unit_ms;
    if (!mix.empty() && mix.size() == prob.cost.size() * U) {
      for (std::size_t r = 0; r < prob.cost.size(); ++r)
        prob.cost[r].assign(mix.begin() + static_cast<std::ptrdiff_t>(r * U), mix.begin() + static_cast<std::ptrdiff_t>((r + 1) * U));
      prob.stage_fixed_ms.clear();  // the workload objective's; the mix's own, where taken:
      if (so.mix.stage_fixed_ms.size() == prob.cost.size()) balance::apply_stage_fixed(prob, so.mix.stage_fixed_ms);
    }
  }
  const RunRecord& run = ctx.record();
  std::vector<std::vector<int>> layouts = ctx.plan.layouts;
  if (ctx.plan.tp_auto) {
    const std::vector<int> widths = choose_layout(ctx, prob);
    if (std::find(layouts.begin(), layouts.end(), widths) == layouts.end()) layouts.push_back(widths);
  }
  std::vector<balance::Partition> parts;
  for (const auto& widths : layouts) {
    const bool pp = std::all_of(widths.begin(), widths.end(), [](int t) { return t == 1; });
    const balance::BalanceProblem lp = pp ? prob : balance::layout_problem(run, ctx.opt.objective, widths);
    for (const balance::Method method : ctx.plan.methods) {
      balance::SplitRequest req;
      req.method = method;
      req.stages = ctx.ranks;
      req.order = ctx.opt.order;
      req.manual = ctx.opt.partition.manual;
      balance::Partition p = pp ? balance::make_split(prob, req) : balance::make_layout_split(lp, req, widths);
      p.solver = balance::method_name(method) + balance::layout_suffix(widths);
      if (p.tp_width.empty()) p.tp_width.assign(p.num_stages(), 1);
      p.groups = ctx.workload.groups;
      parts.push_back(std::move(p));
    }
  }
  if (ctx.plan.plan_points > 0) {
    const std::vector<int>& classes = ctx.cluster.equivalence.device_class;
    if (!std::all_of(classes.begin(), classes.end(), [&](int c) { return c == classes[0]; }))
      ctx.progress.say("--plan: note: the ranks differ; the planner lays out devices like rank 0's");
    std::vector<balance::Partition> more = plan_points(ctx);
    parts.insert(parts.end(), more.begin(), more.end());
  }
  return parts;
}

}  // namespace

PartitionSet plan_partitions(RunContext& ctx) {
  PartitionSet set;
  ctx.phase("balance", [&] {
    if (ctx.root) set.splits = solve_partitions(ctx);
  });
  broadcast_partitions(ctx.mpi, set.splits, ctx.spec.num_units());
  if (ctx.opt.scenario.on()) {
    // run --step-policy A,B: every split again under each further policy (on every rank alike,
    // from the same flags), paired with the first in the same rounds.
    // Likewise --pp-schedule A,B, and every pair of a listed policy and schedule but the firsts.
    const serving::ScenarioSpec& sc = *ctx.opt.scenario.spec;
    std::vector<serving::StepPolicy> policies{sc.policy};
    policies.insert(policies.end(), sc.compared_policies.begin(), sc.compared_policies.end());
    std::vector<serving::PpSchedule> schedules{sc.pp_schedule};
    schedules.insert(schedules.end(), sc.compared_schedules.begin(), sc.compared_schedules.end());
    const std::size_t n = set.splits.size();
    for (std::size_t q = 0; q < schedules.size(); ++q)
      for (std::size_t k = 0; k < policies.size(); ++k) {
        if (q == 0 && k == 0) continue;
        for (std::size_t i = 0; i < n; ++i) {
          balance::Partition v = set.splits[i];
          if (k > 0) v.step_policy = serving::step_policy_name(policies[k]), v.solver += " " + v.step_policy;
          if (q > 0) v.pp_schedule = serving::pp_schedule_name(schedules[q]), v.solver += " " + v.pp_schedule;
          set.splits.push_back(std::move(v));
        }
      }
  }
  const std::string uniform = balance::method_name(balance::Method::uniform);  // the one-rank-per-stage layout's
  if (set.index_of(uniform) >= 0) set.reference = uniform;
  if (ctx.root) ctx.record().reference_partition = set.reference;
  if (ctx.opt.control && !set.reference.empty()) {  // the A/A control: the reference again, benchmarked on its own
    balance::Partition c = set.splits[static_cast<size_t>(set.index_of(set.reference))];
    c.solver = PartitionSet::kControl;
    set.splits.push_back(std::move(c));
  }
  return set;
}

void print_warnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) std::cerr << "ppbench: warning: " << w << std::endl;
}

namespace {

/// Rank 0: how the ranks' memory limits were taken, for the memory table's heading.
std::string limit_origin(RunContext& ctx) {
  if (ctx.opt.memory_limit_gib > 0) return "--memory-limit " + format_fixed(ctx.opt.memory_limit_gib, 2) + " GiB";
  int64_t reserve = 0;
  for (const RankInfo& r : ctx.record().ranks) reserve = std::max(reserve, r.tp_reserve_bytes);
  return "90% of each rank's free memory once the transport was set up" +
         (reserve > 0 ? ", less up to " + gib(double(reserve)) + " kept for tensor-parallel communicators" : std::string());
}

}  // namespace

PartitionRecord describe_partition(RunContext& ctx, const balance::Partition& p, const ProfileTable& prof) {
  std::string warning;
  PartitionRecord pr = ctx.predictor().describe(p, prof, &warning);
  if (!warning.empty()) print_warnings({warning});
  pr.validated = false;  // until its serialized run, after the rounds (gather_final)
  const int S = p.num_stages();
  const std::vector<std::vector<int>> ranks = p.stage_ranks();
  std::vector<StageBytes> bytes;  // what each stage allocates (its group's first shard), as the rounds build it
  StageConfig sc;
  for (int k = 0; k < S; ++k) {
    sc = partition_stage_config(ctx, p, PartitionSet::placement(p, ranks[k][0]));
    bytes.push_back(ctx.device->stage_bytes(ctx.spec, p.first_unit[k], p.last_unit[k], sc));
    pr.stage_weight_bytes.push_back(static_cast<int64_t>(bytes.back().weights));
    pr.stage_kv_bytes.push_back(static_cast<int64_t>(bytes.back().kv_cache));
  }
  if (!ctx.opt.quiet && !p.tensor_parallel()) {
    // Each device's limit net of its stage's activation scratch, so that "free" and "KV tokens
    // left" agree with the memory check (which counts the scratch too).
    std::vector<int64_t> net(ctx.ranks);
    for (int k = 0; k < S; ++k)
      net[p.device_rank[k]] = std::max<int64_t>(
          1, static_cast<int64_t>(ctx.cluster.memory_limits[p.device_rank[k]]) - static_cast<int64_t>(bytes[k].scratch));
    // Per unit, the KV cache of the tokens the stages hold (the profile's unit_kv_bytes are for
    // the workload's M x B x (P + G): linear in the tokens, memory_report's model).
    const int64_t slot_tokens = int64_t(sc.work.groups) * sc.work.batch * sc.work.max_context();
    // A demand-paged store under a pool holds the pool's tokens and its page slack (counted in
    // tokens of the stage it is most of), not every slot.
    const bool paged = sc.kv_pool_tokens > 0 && bytes.front().kv_paged;
    int64_t slack_tokens = 0;
    for (const StageBytes& b : bytes)
      if (b.kv_token_bytes > 0) slack_tokens = std::max<int64_t>(slack_tokens, int64_t((b.kv_page_slack + b.kv_token_bytes - 1) / b.kv_token_bytes));
    const int64_t kv_tokens = paged ? std::min<int64_t>(slot_tokens, sc.kv_pool_tokens + slack_tokens) : slot_tokens;
    const double per_workload_token = 1.0 / (double(partition_groups(ctx, p)) * ctx.workload.batch * ctx.workload.max_context());
    std::vector<int64_t> unit_kv(prof.unit_kv_bytes.size());
    for (size_t u = 0; u < unit_kv.size(); ++u)
      unit_kv[u] = std::llround(double(prof.unit_kv_bytes[u]) * per_workload_token * double(kv_tokens));
    const auto mr = balance::memory_report(p, prof.unit_weight_bytes, unit_kv, kv_tokens, net);
    std::string pool;
    if (ctx.opt.scenario.on() && ctx.opt.scenario.spec->kv_blocks != 0) {
      const serving::SchedulerConfig sched = serving_sim_config(ctx, p).scheduler;
      const int64_t pool_tokens = int64_t(sched.groups) * sched.kv_blocks * sched.kv_block_size;  // M pools, or one of M x
      pool = "\nthe scheduler's KV pool (--kv-blocks" + std::string(ctx.opt.scenario.spec->kv_blocks < 0 ? " auto: " : " ") +
             std::to_string(sched.kv_blocks) + " blocks of " + std::to_string(sched.kv_block_size) + " tokens per group): " +
             std::to_string(pool_tokens) + " tokens over the M=" + std::to_string(sched.groups) + " groups, " +
             format_fixed(100.0 * double(pool_tokens) / double(slot_tokens), 1) + "% of every slot at -p + -g (" +
             std::to_string(slot_tokens) + "); admission and preemption count its blocks; " +
             (paged ? "the KV store is demand-paged: resident only where the pool's blocks are (the table's KV and "
                      "capacity count the pool and its page slack, " +
                          std::to_string(slack_tokens) + " tokens' worth: two pages per slot, layer and K/V)"
              : pool_tokens >= slot_tokens ? "it holds every slot, so it cannot bind: the store stays whole"
                                           : "the storage stays one row per slot (this backend allocates it whole)");
    }
    ctx.progress.say("memory of partition " + p.solver + " (limits: " + limit_origin(ctx) +
                     ", net of each stage's activation scratch" +
                     (paged                   ? "; KV cache of the scheduler's pool and its page slack"
                      : ctx.opt.scenario.on() ? "; KV cache for every slot at the scenario's longest request"
                                              : "") +
                     "):\n" + balance::format_memory_report(mr) + pool);
  }
  ctx.progress.say("partition " + p.solver + ": " + p.counts_string() + " units per stage" +
                   (p.tensor_parallel() ? " (tensor-parallel widths " + pr.layout + ")" : "") + ", predicted bottleneck " +
                   format_fixed(pr.predicted_bottleneck_ms, 2) + " ms (" + ctx.opt.objective_text +
                   (ctx.record().serving.objective_steps > 0 && !p.tensor_parallel()
                        ? "; solved on the scenario's step mix: " + format_fixed(p.bottleneck_ms, 2) +
                              " ms of the bottleneck stage per B requests)"
                    : prof.latency_alone_ms.empty() ? ")"
                                                    : "; solved on the together profile " + format_fixed(p.bottleneck_ms, 2) +
                                                          " ms, shared-bandwidth model)"));
  return pr;
}

void describe_partitions(RunContext& ctx, const PartitionSet& set) {
  if (!ctx.root) return;
  for (const balance::Partition& p : set.splits) ctx.record().partitions.push_back(describe_partition(ctx, p, ctx.record().profile));
}

}  // namespace ppb::run
