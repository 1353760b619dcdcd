// `ppbench plan FILE.h5 --devices N` (issue 36, offline part): the deployment planner's search
// (balance/plan.h) on a results file, printed as the Pareto front of tokens/s per device
// against tokens/s per user, the best layout under latency targets and why. No MPI, no device.
// docs/OFFLINE.md.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <system_error>

#include "app/offline_commands.h"
#include "app/offline_io.h"
#include "app/plan_scenario.h"
#include "balance/layout.h"
#include "balance/plan.h"
#include "balance/problem.h"
#include "common/error.h"
#include "results/run_record.h"

namespace ppb {

using namespace offline;

namespace {

/// --batch LIST: whole numbers >= 1, each the file's B (the only batch the file profiled).
void check_batch_list(const std::string& list, int file_batch, const std::string& input) {
  if (list.empty()) return;
  std::string item;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] != ',') {
      item += list[i];
      continue;
    }
    size_t used = 0;
    long b = 0;
    try {
      b = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || b < 1)
      throw UserError("--batch '" + list + "': '" + item + "' is not a batch size >= 1; give a list such as " +
                      std::to_string(file_batch));
    if (b != file_batch)
      throw UserError("--batch " + item + ": " + input + " profiled B=" + std::to_string(file_batch) +
                      " only, and plan has no model of how a step's time scales with B (the step of a B=" + item +
                      " group is not measured): give --batch " + std::to_string(file_batch) +
                      ", or profile at B=" + item + " (`ppbench profile -b " + item + "`) and plan from that file");
    item.clear();
  }
}

/// --replicas as balance::PlanRequest::replicas (balance::parse_replicas).
int replicas_of(const PlanOptions& opt) { return balance::parse_replicas(opt.replicas, opt.devices, "--devices"); }

/// Flags checked before the file is read (exit 2, naming the flag).
void check_plan_flags(const PlanOptions& opt) {
  if (opt.devices < 1)
    throw UserError("--devices N is required: the number of devices like the file's rank 0 to plan for, N >= 1 (got " +
                    std::to_string(opt.devices) + ")");
  if (opt.devices > 65536) throw UserError("--devices " + std::to_string(opt.devices) + ": at most 65536");
  if (!(opt.scenario.slo_ttft_ms >= 0) || !(opt.scenario.slo_tpot_ms >= 0) || opt.scenario.slo_ttft_ms > kMaxMs || opt.scenario.slo_tpot_ms > kMaxMs)
    throw UserError("--slo-ttft and --slo-tpot are targets in ms, >= 0 (0 = none) and <= 1e12");
  if (opt.top < 0) throw UserError("--top K must be >= 0 (0 = every front point), got " + std::to_string(opt.top));
  replicas_of(opt);
}

std::string stage_units(const RunRecord& run, const balance::Partition& p, int k) {
  const auto& names = run.profile.unit_name;
  const int a = p.first_unit[k], z = p.last_unit[k];
  return a == z ? names[a] : names[a] + ".." + names[z];
}

void print_front(const balance::PlanResult& r, int top) {
  int wl = 18, ws = 22;  // the layout and split columns as wide as their longest entry
  for (size_t i : r.front) {
    wl = std::max(wl, static_cast<int>(r.candidates[i].label.size()));
    ws = std::max(ws, static_cast<int>(r.candidates[i].split.counts_string().size()));
  }
  std::printf("%-*s %-*s %11s %11s %12s %12s %11s %s\n", wl, "layout", ws, "split", "tokens/s", "tok/s/dev",
              "TTFT p50 ms", "TPOT p50 ms", "tok/s/user", "busiest stage");
  // --top K: the K front points with the most tokens/s, printed in the front's order.
  std::vector<size_t> rows = r.front;
  if (top > 0 && static_cast<size_t>(top) < rows.size()) {
    std::vector<size_t> by_tps = rows;
    std::stable_sort(by_tps.begin(), by_tps.end(),
                     [&](size_t a, size_t b) { return r.candidates[a].tokens_per_s > r.candidates[b].tokens_per_s; });
    by_tps.resize(top);
    std::vector<size_t> kept;
    for (size_t i : rows)
      if (std::find(by_tps.begin(), by_tps.end(), i) != by_tps.end()) kept.push_back(i);
    rows = kept;
  }
  for (size_t i : rows) {
    const balance::PlanCandidate& c = r.candidates[i];
    std::printf("%-*s %-*s %11s %11s %12s %12s %11s %d\n", wl, c.label.c_str(), ws, c.split.counts_string().c_str(),
                num(c.tokens_per_s, 2).c_str(), num(c.tokens_per_s_per_device, 2).c_str(), num(c.ttft_p50_ms, 2).c_str(),
                num(c.tpot_p50_ms, 2).c_str(), num(c.tokens_per_s_per_user, 2).c_str(), c.bottleneck_stage);
  }
}

/// One line on a candidate: its figures.
std::string figures(const balance::PlanCandidate& c) {
  return c.label + " (split " + c.split.counts_string() + "): " + num(c.tokens_per_s, 2) + " tokens/s, " +
         num(c.tokens_per_s_per_device, 2) + " per device, TTFT p50 " + num(c.ttft_p50_ms, 2) + " ms, TPOT p50 " +
         num(c.tpot_p50_ms, 2) + " ms (" + num(c.tokens_per_s_per_user, 2) + " tokens/s per user)";
}

/// Why `c` gives what it gives: its busiest stage, and whether its pipeline is full.
void print_why(const RunRecord& run, const balance::PlanCandidate& c) {
  const int k = c.bottleneck_stage;
  std::printf("  why: stage %d (%s, %d device%s) is the busiest: prefill %s ms + G x decode %s ms per group", k,
              stage_units(run, c.split, k).c_str(), c.split.width(k), c.split.width(k) == 1 ? "" : "s",
              num(c.phase_ms[2 * k], 2).c_str(), num(c.phase_ms[2 * k + 1], 2).c_str());
  std::printf("%s\n", c.groups < c.split.num_stages() ? "; fewer groups than stages: the pipeline is not full" : "");
}

/// The choice under the targets, why, and what N + 1 devices would give.
/// more_every_r: the N + 1 search took every replica count (--replicas R does not divide N + 1).
void print_choice(const PlanOptions& opt, const RunRecord& run, const balance::PlanResult& r,
                  const std::optional<balance::PlanResult>& more, const balance::SloChoice& ch, bool more_every_r) {
  std::string targets;
  if (opt.scenario.slo_ttft_ms > 0) targets += "TTFT p50 <= " + sig(opt.scenario.slo_ttft_ms) + " ms";
  if (opt.scenario.slo_tpot_ms > 0) targets += (targets.empty() ? "" : ", ") + std::string("TPOT p50 <= ") + sig(opt.scenario.slo_tpot_ms) + " ms";
  if (targets.empty()) targets = "no latency target";
  if (ch.best) {
    std::printf("best under %s: %s\n", targets.c_str(), figures(r.candidates[*ch.best]).c_str());
    print_why(run, r.candidates[*ch.best]);
  } else {
    std::printf("no layout meets %s; the closest (targets relaxed by x%s): %s\n", targets.c_str(), num(ch.relax, 3).c_str(),
                figures(r.candidates[ch.closest]).c_str());
    print_why(run, r.candidates[ch.closest]);
  }
  if (!more) {
    std::printf("one more device: no layout of %d devices (more than the model can use)\n", opt.devices + 1);
    return;
  }
  const balance::SloChoice next = balance::best_under_slo(more->candidates, opt.scenario.slo_ttft_ms, opt.scenario.slo_tpot_ms);
  if (!next.best) {
    std::printf("one more device (%d): still no layout meets %s\n", opt.devices + 1, targets.c_str());
    return;
  }
  const balance::PlanCandidate& n = more->candidates[*next.best];
  std::printf("one more device (%d%s): %s", opt.devices + 1,
              (more_every_r ? ", every replica count: --replicas " + opt.replicas + " does not divide it" : std::string()).c_str(),
              figures(n).c_str());
  if (ch.best)
    std::printf("; x%s tokens/s, x%s per device", num(n.tokens_per_s / r.candidates[*ch.best].tokens_per_s, 3).c_str(),
                num(n.tokens_per_s_per_device / r.candidates[*ch.best].tokens_per_s_per_device, 3).c_str());
  std::printf("\n");
}

void print_csv(const balance::PlanResult& r, double slo_ttft, double slo_tpot) {
  std::vector<char> on_front(r.candidates.size(), 0);
  for (size_t i : r.front) on_front[i] = 1;
  std::printf("layout,stages,tp_widths,groups,batch,split,tokens_per_s,tokens_per_s_per_device,ttft_p50_ms,"
              "tpot_p50_ms,tokens_per_s_per_user,busiest_stage,front,meets_slo,replicas\n");
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const balance::PlanCandidate& c = r.candidates[i];
    std::string w = balance::layout_label(c.widths), split = c.split.counts_string();
    std::replace(w.begin(), w.end(), ',', '-');  // no commas inside a CSV field
    std::replace(split.begin(), split.end(), ',', '-');
    const bool meets = (slo_ttft <= 0 || c.ttft_p50_ms <= slo_ttft) && (slo_tpot <= 0 || c.tpot_p50_ms <= slo_tpot);
    std::printf("%s,%d,%s,%d,%d,%s,%.9g,%.9g,%.9g,%.9g,%.9g,%d,%d,%d,%d\n", c.label.c_str(), c.split.num_stages(),
                w.c_str(), c.groups, c.batch, split.c_str(), c.tokens_per_s, c.tokens_per_s_per_device,
                c.ttft_p50_ms, c.tpot_p50_ms, c.tokens_per_s_per_user, c.bottleneck_stage, on_front[i], meets ? 1 : 0,
                c.replicas);
  }
}

json candidate_json(const balance::PlanCandidate& c) {
  json j = layout_json(c.split, c.widths);
  j.update({{"layout", c.label},
            {"replicas", c.replicas},
            {"groups", c.groups},
            {"batch", c.batch},
            {"predicted_phase_ms", c.phase_ms},
            {"tokens_per_s", c.tokens_per_s},
            {"tokens_per_s_per_device", c.tokens_per_s_per_device},
            {"ttft_p50_ms", c.ttft_p50_ms},
            {"tpot_p50_ms", c.tpot_p50_ms},
            {"tokens_per_s_per_user", c.tokens_per_s_per_user},
            {"busiest_stage", c.bottleneck_stage}});
  return j;
}

json plan_json(const PlanOptions& opt, const balance::PlanResult& r, const std::optional<balance::PlanResult>& more,
               const balance::SloChoice& ch, double seconds) {
  json out;
  out["devices"] = r.devices;
  out["replica_counts"] = r.replica_counts;
  out["mode"] = r.mode;
  out["layouts_possible"] = r.layouts_possible;
  out["layouts_evaluated"] = r.layouts_evaluated;
  out["candidates_pruned"] = r.pruned;
  out["search_seconds"] = seconds;
  out["slo_ttft_ms"] = opt.scenario.slo_ttft_ms;
  out["slo_tpot_ms"] = opt.scenario.slo_tpot_ms;
  out["candidates"] = json::array();
  for (const auto& c : r.candidates) out["candidates"].push_back(candidate_json(c));
  out["front"] = r.front;
  out["best"] = ch.best ? json(*ch.best) : json(nullptr);
  out["closest"] = ch.closest;
  out["closest_relax"] = ch.relax;
  if (more) {
    const balance::SloChoice next = balance::best_under_slo(more->candidates, opt.scenario.slo_ttft_ms, opt.scenario.slo_tpot_ms);
    out["one_more_device"] = next.best ? candidate_json(more->candidates[*next.best]) : json(nullptr);
  } else {
    out["one_more_device"] = nullptr;
  }
  return out;
}

}  // namespace

int plan_command(const PlanOptions& opt) {
  check_plan_flags(opt);
  if (!is_hdf5(opt.input))
    throw UserError("plan reads a results file (.h5) of `ppbench run` or `ppbench profile`; '" + opt.input +
                    "' is not one");
  check_json_out(opt.json_out, opt.input, opt.force);
  const RunRecord run = read_run(opt.input);
  check_batch_list(opt.batch, run.workload.batch, opt.input);
  if (const auto spec = plan_scenario(opt, run)) return plan_scenario_command(opt, run, *spec, replicas_of(opt));
  balance::PlanRequest req;
  req.devices = opt.devices;
  req.replicas = replicas_of(opt);
  req.slo_ttft_ms = opt.scenario.slo_ttft_ms;
  req.slo_tpot_ms = opt.scenario.slo_tpot_ms;
  const auto t0 = std::chrono::steady_clock::now();
  const balance::PlanResult r = balance::plan_layouts(run, req);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::optional<balance::PlanResult> more;
  bool more_every_r = false;  // --replicas R does not divide N + 1: that search took every R
  try {
    req.devices = opt.devices + 1;
    more_every_r = balance::replicas_for(req.devices, req.replicas) != req.replicas;
    req.replicas = balance::replicas_for(req.devices, req.replicas);
    req.need_front = false;  // only its best under the targets is printed
    more = balance::plan_layouts(run, req);
  } catch (const UserError&) {
    more.reset();  // N + 1 devices are more than the model can use, or none fits
  }
  const balance::SloChoice ch = balance::best_under_slo(r.candidates, opt.scenario.slo_ttft_ms, opt.scenario.slo_tpot_ms);
  if (opt.csv) {
    print_csv(r, opt.scenario.slo_ttft_ms, opt.scenario.slo_tpot_ms);
  } else {
    std::string widths = "1";
    for (const auto& g : balance::plan_record(run, opt.devices, 1).profile.tp) {
      widths += ',';
      widths += std::to_string(g.width);
    }
    const WorkloadInfo& w = run.workload;
    std::printf("plan: %s, %d device(s) like rank 0 (%s), B=%d P=%d G=%d, objective %s, widths %s, replicas %s; %s: "
                "%zu of %zu layout(s) solved, %zu candidates (M = 1..2S) simulated, %zu proved irrelevant by their "
                "bounds, in %.2f s\n",
                opt.input.c_str(), opt.devices, run.ranks[0].device_name.c_str(), w.batch, w.prompt_len, w.gen_len,
                w.objective.empty() ? "workload" : w.objective.c_str(), widths.c_str(), balance::replica_counts_text(r).c_str(), r.mode.c_str(),
                r.layouts_evaluated, r.layouts_possible, r.candidates.size(), r.pruned, seconds);
    std::printf("Pareto front (tokens/s per device vs tokens/s per user = 1000 / TPOT p50; %zu of %zu candidates):\n",
                r.front.size(), r.candidates.size());
    print_front(r, opt.top);
    print_choice(opt, run, r, more, ch, more_every_r);
    for (const std::string& wmsg : r.warnings) std::cerr << "ppbench plan: warning: " << wmsg << std::endl;
  }
  std::cout.flush();
  if (!opt.json_out.empty()) write_json_file(opt.json_out, plan_json(opt, r, more, ch, seconds));
  return 0;
}

}  // namespace ppb
