#include "run/plan_points.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "balance/layout.h"
#include "balance/plan.h"
#include "common/format.h"
#include "run/plan.h"
#include "run/rounds.h"

namespace ppb::run {

std::string plan_point_name(const std::string& label) {
  std::string s = "plan-";
  for (const char c : label) s += c == ' ' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

namespace {

/// Whether candidate a ranks before b: more predicted tokens/s (equal within a relative 1e-9, as
/// balance::rank_layouts_by_tokens: one stage at M = 1 and 2 simulate the same rate), then more
/// tokens/s per user. A candidate as searched (balance::PlanCandidate) or as stored
/// (PlanRecord::Candidate).
template <class Candidate>
bool ranks_before(const Candidate& a, const Candidate& b) {
  const double tol = 1e-9 * std::max(std::fabs(a.tokens_per_s), std::fabs(b.tokens_per_s));
  if (std::fabs(a.tokens_per_s - b.tokens_per_s) > tol) return a.tokens_per_s > b.tokens_per_s;
  return a.tokens_per_s_per_user > b.tokens_per_s_per_user;
}

/// The candidates of the best layout (`best`'s widths and replicas) at every M the search holds, ascending;
/// at most kMaxCurve of them, evenly spaced over the M's, the first, the last and `best` kept.
std::vector<size_t> curve_of(const balance::PlanResult& res, size_t best) {
  constexpr size_t kMaxCurve = 8;
  std::vector<size_t> same;
  for (size_t i = 0; i < res.candidates.size(); ++i)
    if (res.candidates[i].widths == res.candidates[best].widths && res.candidates[i].replicas == res.candidates[best].replicas)
      same.push_back(i);
  std::sort(same.begin(), same.end(),
            [&](size_t a, size_t b) { return res.candidates[a].groups < res.candidates[b].groups; });
  if (same.size() <= kMaxCurve) return same;
  std::vector<size_t> out;
  for (size_t j = 0; j < kMaxCurve; ++j) out.push_back(same[j * (same.size() - 1) / (kMaxCurve - 1)]);
  if (std::find(out.begin(), out.end(), best) == out.end()) out.push_back(best);
  return out;
}

/// The record of the search (PlanRecord: every candidate, the front).
PlanRecord plan_record_of(const balance::PlanResult& res, int points) {
  PlanRecord pr;
  pr.devices = res.devices;
  pr.points = points;
  pr.mode = res.mode;
  pr.layouts_possible = static_cast<int64_t>(std::min<size_t>(res.layouts_possible, INT64_MAX));
  pr.layouts_evaluated = static_cast<int64_t>(res.layouts_evaluated);
  pr.infeasible = static_cast<int64_t>(res.infeasible);
  pr.pruned = static_cast<int64_t>(res.pruned);
  for (const balance::PlanCandidate& c : res.candidates) {
    PlanRecord::Candidate r;
    r.label = c.label;
    r.widths = balance::layout_label(c.widths);
    r.counts = c.split.counts_string();
    r.groups = c.groups;
    r.batch = c.batch;
    r.replicas = c.replicas;
    r.tokens_per_s = c.tokens_per_s;
    r.tokens_per_s_per_device = c.tokens_per_s_per_device;
    r.ttft_p50_ms = c.ttft_p50_ms;
    r.tpot_p50_ms = c.tpot_p50_ms;
    r.tokens_per_s_per_user = c.tokens_per_s_per_user;
    r.bottleneck_stage = c.bottleneck_stage;
    pr.candidates.push_back(std::move(r));
  }
  for (const size_t i : res.front) {
    pr.front.push_back(static_cast<int>(i));
    pr.candidates[i].on_front = true;
  }
  return pr;
}

}  // namespace

std::vector<balance::Partition> plan_points(RunContext& ctx) {
  RunRecord& run = ctx.record();
  balance::PlanRequest req;
  req.devices = ctx.ranks;
  req.replicas = ctx.plan.plan_replicas;
  req.prune = false;  // R devices: every candidate simulated, each one stored
  const balance::PlanResult res = balance::plan_layouts(run, req);
  for (const std::string& w : res.warnings) ctx.progress.say("--plan: note: " + w);
  run.plan = plan_record_of(res, ctx.plan.plan_points);
  const auto& c = res.candidates;
  const auto by_rank = [&](size_t a, size_t b) { return ranks_before(c[a], c[b]); };
  std::vector<size_t> front = res.front;
  std::stable_sort(front.begin(), front.end(), by_rank);
  const size_t K = static_cast<size_t>(ctx.plan.plan_points);
  std::vector<size_t> chosen(front.begin(), front.begin() + std::min(front.size(), K));
  // A front of fewer than K points (one layout dominating: TP2 on two CPU ranks) is filled with
  // the next candidates off it, in the same order, so that K points are measured.
  std::vector<size_t> rest;
  for (size_t i = 0; i < c.size(); ++i)
    if (!run.plan.candidates[i].on_front) rest.push_back(i);
  std::stable_sort(rest.begin(), rest.end(), by_rank);
  for (size_t j = 0; chosen.size() < K && j < rest.size(); ++j) chosen.push_back(rest[j]);
  const size_t best = chosen.front(), k_points = chosen.size();
  run.plan.curve_layout = run.plan.candidates[best].layout();
  for (const size_t i : curve_of(res, best))
    if (std::find(chosen.begin(), chosen.end(), i) == chosen.end()) chosen.push_back(i);
  std::vector<balance::Partition> parts;
  std::string said;
  for (size_t j = 0; j < chosen.size(); ++j) {
    const size_t i = chosen[j];
    balance::Partition p = c[i].split;
    p.solver = plan_point_name(c[i].label);
    p.algorithm = "plan";
    p.groups = c[i].groups;
    p.replicas = c[i].replicas;  // its split is one replica's, on ranks 0 .. N/R - 1
    if (p.tp_width.empty()) p.tp_width.assign(p.num_stages(), 1);
    run.plan.candidates[i].measured_as = p.solver;
    run.plan.candidates[i].role = j >= k_points ? "curve" : run.plan.candidates[i].on_front ? "front" : "next";
    said += "\n  " + c[i].label + ": " + p.counts_string() + " units per stage, predicted " +
            format_fixed(c[i].tokens_per_s, 1) + " tokens/s, TTFT p50 " + format_fixed(c[i].ttft_p50_ms, 1) +
            " ms, TPOT p50 " + format_fixed(c[i].tpot_p50_ms, 2) + " ms" + (i == best ? " (predicted best)" : "") +
            (j >= k_points ? " (curve)" : run.plan.candidates[i].on_front ? "" : " (off the front)");
    parts.push_back(std::move(p));
  }
  ctx.progress.say("--plan " + std::to_string(ctx.plan.plan_points) + ": " + std::to_string(c.size()) +
                   " candidates of " + std::to_string(res.layouts_evaluated) + " layouts simulated, " +
                   std::to_string(res.front.size()) + " on the front; measuring " + std::to_string(parts.size()) +
                   " (the front's most tokens/s, then the next off it up to " + std::to_string(K) + ", then layout " +
                   run.plan.curve_layout + " at every M):" + said);
  return parts;
}

void plan_verdict(RunContext& ctx) {
  if (!ctx.root || ctx.record().plan.devices == 0) return;
  RunRecord& run = ctx.record();
  PlanRecord& plan = run.plan;
  const PlanRecord::Candidate* pb = nullptr;
  const PartitionRecord *pbr = nullptr, *mbr = nullptr;
  for (const PlanRecord::Candidate& c : plan.candidates) {
    if (c.measured_as.empty()) continue;
    auto it = std::find_if(run.partitions.begin(), run.partitions.end(),
                           [&](const PartitionRecord& p) { return p.name == c.measured_as; });
    if (it == run.partitions.end() || !it->measured || !it->metrics.count("tokens_per_s")) continue;
    it->metrics["plan_predicted_tokens_per_s"] = c.tokens_per_s;
    it->metrics["plan_predicted_ttft_p50_ms"] = c.ttft_p50_ms;
    it->metrics["plan_predicted_tpot_p50_ms"] = c.tpot_p50_ms;
    if (!pb || ranks_before(c, *pb)) {
      pb = &c;
      pbr = &*it;
    }
    if (!mbr || it->metrics.at("tokens_per_s") > mbr->metrics.at("tokens_per_s")) mbr = &*it;
  }
  if (!pbr || !mbr) return;
  plan.predicted_best = pbr->name;
  plan.measured_best = mbr->name;
  if (pbr == mbr || pbr->same_as == mbr->name || mbr->same_as == pbr->name) {
    plan.best_cmp = PairedComparison{1.0, 1.0, 1.0, static_cast<int>(pbr->rep_tokens_per_s.size())};
    plan.best_within_ci = 1;
  } else {
    auto [a, b] = same_rounds(mbr->rep_tokens_per_s, mbr->rep_round, pbr->rep_tokens_per_s, pbr->rep_round);
    plan.best_cmp = compare_paired(a, b);  // predicted best / measured best
    plan.best_within_ci = plan.best_cmp.n >= kMinPairsForCI ? (plan.best_cmp.ci_high >= 1.0 ? 1 : 0) : -1;
  }
}

}  // namespace ppb::run
