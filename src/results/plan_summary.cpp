#include "results/plan_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/format.h"
#include "results/summary.h"

namespace ppb {

namespace {

std::string fmt(const char* f, double v) { return format_printf(f, v); }

const PartitionRecord* measured(const RunRecord& run, const std::string& name) {
  for (const PartitionRecord& p : run.partitions)
    if (p.name == name && p.measured && p.metrics.count("tokens_per_s")) return &p;
  return nullptr;
}

double metric(const PartitionRecord& p, const char* key) { return metric_or_nan(p, key); }

/// "  123.4 /   120.1   +2.7%": predicted / measured and the error (predicted / measured - 1).
std::string pair_text(const char* f, double pred, double meas) {
  return fmt(f, pred) + " / " + fmt(f, meas) + " " + fmt("%+6.1f%%", 100 * (pred / meas - 1));
}

void print_front(std::ostream& os, const PlanRecord& plan) {
  os << "plan: " << plan.devices << " devices, " << plan.mode << ": " << plan.layouts_evaluated << " layout(s), "
     << plan.candidates.size() << " candidates simulated, " << plan.front.size() << " on the Pareto front "
     << "(tokens/s per device against tokens/s per user), predicted:\n";
  char line[256];
  std::snprintf(line, sizeof(line), "  %-16s %-8s %-12s %10s %10s %10s %10s %10s  %s\n", "layout", "widths", "units",
                "tok/s", "tok/s/dev", "TTFT ms", "TPOT ms", "tok/s/user", "measured as");
  os << line;
  for (const int i : plan.front) {
    const PlanRecord::Candidate& c = plan.candidates[static_cast<size_t>(i)];
    std::snprintf(line, sizeof(line), "  %-16s %-8s %-12s %10.1f %10.1f %10.1f %10.2f %10.1f  %s\n", c.label.c_str(),
                  c.widths.c_str(), c.counts.c_str(), c.tokens_per_s, c.tokens_per_s_per_device, c.ttft_p50_ms,
                  c.tpot_p50_ms, c.tokens_per_s_per_user, c.measured_as.empty() ? "-" : c.measured_as.c_str());
    os << line;
  }
}

void print_measured(std::ostream& os, const RunRecord& run) {
  const PlanRecord& plan = run.plan;
  os << "plan: measured points, predicted (the planner's, before the rounds; then, where there is one, cross-calibrated "
        "from the other points' stages measured in the same rounds) / measured, error = predicted / measured - 1:\n";
  char line[320];
  std::snprintf(line, sizeof(line), "  %-20s %-8s %3s %-26s %-26s %-26s %s\n", "point", "layout", "M", "tokens/s",
                "TTFT p50 ms", "TPOT p50 ms", ("tokens/s vs " + run.reference_partition).c_str());
  os << line;
  for (const PlanRecord::Candidate& c : plan.candidates) {
    if (c.measured_as.empty()) continue;
    const PartitionRecord* p = measured(run, c.measured_as);
    if (!p) continue;
    const std::string gain = std::isnan(p->gain.ratio) ? "-" : ratio_ci_text(p->gain.ratio, p->gain);
    std::snprintf(line, sizeof(line), "  %-20s %-8s %3d %-26s %-26s %-26s %s%s\n", c.measured_as.c_str(), c.layout().c_str(),
                  c.groups, pair_text("%8.1f", c.tokens_per_s, metric(*p, "tokens_per_s")).c_str(),
                  pair_text("%7.1f", c.ttft_p50_ms, metric(*p, "ttft_p50_ms")).c_str(),
                  pair_text("%6.2f", c.tpot_p50_ms, metric(*p, "tpot_p50_ms")).c_str(), gain.c_str(),
                  c.role == "next" ? "  (off the front)" : c.role == "curve" ? "  (curve)" : "");
    os << line;
    if (!p->metrics.count("simulated_cross_ttft_p50_ms")) continue;  // one rank per stage, calibrated by the others
    std::snprintf(line, sizeof(line), "  %-20s %-8s %3s %-26s %-26s %-26s\n", "  cross-calibrated", "", "",
                  pair_text("%8.1f", metric(*p, "simulated_cross_tokens_per_s"), metric(*p, "tokens_per_s")).c_str(),
                  pair_text("%7.1f", metric(*p, "simulated_cross_ttft_p50_ms"), metric(*p, "ttft_p50_ms")).c_str(),
                  pair_text("%6.2f", metric(*p, "simulated_cross_tpot_p50_ms"), metric(*p, "tpot_p50_ms")).c_str());
    os << line;
  }
}

void print_curve(std::ostream& os, const RunRecord& run) {
  const PlanRecord& plan = run.plan;
  std::vector<const PlanRecord::Candidate*> curve;
  for (const PlanRecord::Candidate& c : plan.candidates)
    if (c.layout() == plan.curve_layout && !c.measured_as.empty() && measured(run, c.measured_as)) curve.push_back(&c);
  if (curve.size() < 2) return;
  std::sort(curve.begin(), curve.end(), [](const auto* a, const auto* b) { return a->groups < b->groups; });
  os << "plan: groups in flight (layout " << plan.curve_layout << "), M: tokens/s, TTFT p50, TPOT p50 predicted / measured\n";
  for (const PlanRecord::Candidate* c : curve) {
    const PartitionRecord& p = *measured(run, c->measured_as);
    os << "  M" << c->groups << ": " << fmt("%.1f", c->tokens_per_s) << " / " << fmt("%.1f", metric(p, "tokens_per_s"))
       << " tokens/s, " << fmt("%.1f", c->ttft_p50_ms) << " / " << fmt("%.1f", metric(p, "ttft_p50_ms")) << " ms, "
       << fmt("%.2f", c->tpot_p50_ms) << " / " << fmt("%.2f", metric(p, "tpot_p50_ms")) << " ms\n";
  }
}

}  // namespace

void print_plan(std::ostream& os, const RunRecord& run) {
  const PlanRecord& plan = run.plan;
  if (plan.devices <= 0) return;
  print_front(os, plan);
  print_measured(os, run);
  print_curve(os, run);
  if (plan.predicted_best.empty()) return;
  os << "plan: predicted best " << plan.predicted_best << ", measured best " << plan.measured_best;
  if (plan.predicted_best == plan.measured_best) {
    os << ": the same point\n";
    return;
  }
  const PairedComparison& c = plan.best_cmp;
  os << "; " << plan.predicted_best << " / " << plan.measured_best << " tokens/s " << ratio_ci_text(c.ratio, c);
  os << (plan.best_within_ci == 1   ? ": within the 95% CI (no significant difference)\n"
         : plan.best_within_ci == 0 ? ": the predicted best measured significantly slower\n"
                                    : ": too few rounds for a CI\n");
}

}  // namespace ppb
