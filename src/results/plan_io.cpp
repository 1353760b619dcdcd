#include "results/plan_io.h"

#include <limits>
#include <string>
#include <vector>

namespace ppb {

namespace {

using h5::Group;

/// Column `get` of every candidate.
template <class T, class Get>
std::vector<T> column(const std::vector<PlanRecord::Candidate>& c, Get get) {
  std::vector<T> out;
  out.reserve(c.size());
  for (const auto& x : c) out.push_back(static_cast<T>(get(x)));
  return out;
}

void write_ms(Group& g, const char* name, const std::vector<double>& v, const char* units, const char* content) {
  auto d = g.write_dataset(name, v);
  d.set_attr("units", units);
  d.set_attr("content", content);
}

}  // namespace

void write_plan(Group& root, const RunRecord& run) {
  const PlanRecord& p = run.plan;
  if (p.devices <= 0) return;
  root.set_attr("plan_predicted_best", p.predicted_best);
  root.set_attr("plan_measured_best", p.measured_best);
  root.set_attr("plan_best_within_ci", static_cast<int64_t>(p.best_within_ci));
  Group g = root.create_group("plan");
  g.set_attr("devices", static_cast<int64_t>(p.devices));
  g.set_attr("points", static_cast<int64_t>(p.points));
  g.set_attr("mode", p.mode);
  g.set_attr("layouts_possible", p.layouts_possible);
  g.set_attr("layouts_evaluated", p.layouts_evaluated);
  g.set_attr("infeasible", p.infeasible);
  g.set_attr("pruned", p.pruned);
  g.set_attr("curve_layout", p.curve_layout);
  g.set_attr("predicted_best", p.predicted_best);
  g.set_attr("measured_best", p.measured_best);
  g.set_attr("best_within_ci", static_cast<int64_t>(p.best_within_ci));
  g.set_attr("best_ratio", p.best_cmp.ratio);
  g.set_attr("best_ratio_ci_low", p.best_cmp.ci_low);
  g.set_attr("best_ratio_ci_high", p.best_cmp.ci_high);
  g.set_attr("best_ratio_n", static_cast<int64_t>(p.best_cmp.n));
  g.set_attr("content", "balance::plan_layouts on this run's profile for its ranks (every layout, M = 1..2S, every "
                        "candidate simulated, fill and drain included); best_ratio: the predicted best's measured "
                        "tokens/s over the measured best's, paired by round, with its 95% CI");
  const auto& c = p.candidates;
  g.write_strings("label", column<std::string>(c, [](const auto& x) { return x.label; }));
  g.write_strings("widths", column<std::string>(c, [](const auto& x) { return x.widths; }));
  g.write_strings("counts", column<std::string>(c, [](const auto& x) { return x.counts; }));
  g.write_strings("measured_as", column<std::string>(c, [](const auto& x) { return x.measured_as; }))
      .set_attr("content", "the partition (/benchmark/<name>) that measured the candidate; empty: not measured");
  g.write_strings("role", column<std::string>(c, [](const auto& x) { return x.role; }))
      .set_attr("content", "why it was measured: front (one of the K), next (off the front, filling the K), curve "
                           "(the best layout at another M); empty: not measured");
  g.write_dataset("groups", column<int>(c, [](const auto& x) { return x.groups; })).set_attr("content", "M groups in flight");
  g.write_dataset("batch", column<int>(c, [](const auto& x) { return x.batch; })).set_attr("content", "B sequences per group");
  g.write_dataset("replicas", column<int>(c, [](const auto& x) { return x.replicas; }))
      .set_attr("content", "R pipelines of the layout side by side (DP); tokens_per_s is all R's");
  g.write_dataset("bottleneck_stage", column<int>(c, [](const auto& x) { return x.bottleneck_stage; }));
  g.write_dataset("on_front", column<int>(c, [](const auto& x) { return x.on_front ? 1 : 0; }));
  write_ms(g, "tokens_per_s", column<double>(c, [](const auto& x) { return x.tokens_per_s; }), "tokens/s", "predicted");
  write_ms(g, "tokens_per_s_per_device", column<double>(c, [](const auto& x) { return x.tokens_per_s_per_device; }),
           "tokens/s", "predicted, per device");
  write_ms(g, "ttft_p50_ms", column<double>(c, [](const auto& x) { return x.ttft_p50_ms; }), "ms", "predicted");
  write_ms(g, "tpot_p50_ms", column<double>(c, [](const auto& x) { return x.tpot_p50_ms; }), "ms", "predicted");
  write_ms(g, "tokens_per_s_per_user", column<double>(c, [](const auto& x) { return x.tokens_per_s_per_user; }),
           "tokens/s", "predicted, 1000 / tpot_p50_ms");
  g.write_dataset("front", p.front).set_attr("content", "indices of the Pareto front, tokens/s per user descending");
}

void read_plan(const Group& root, RunRecord& run) {
  if (!root.exists("plan")) return;
  const Group g = root.open_group("plan");
  PlanRecord& p = run.plan;
  p.devices = static_cast<int>(g.get_attr<int64_t>("devices"));
  p.points = static_cast<int>(g.get_attr<int64_t>("points"));
  p.mode = g.get_attr<std::string>("mode");
  p.layouts_possible = g.get_attr<int64_t>("layouts_possible");
  p.layouts_evaluated = g.get_attr<int64_t>("layouts_evaluated");
  p.infeasible = g.get_attr<int64_t>("infeasible");
  p.pruned = g.get_attr<int64_t>("pruned");
  p.curve_layout = g.get_attr<std::string>("curve_layout");
  p.predicted_best = g.get_attr<std::string>("predicted_best");
  p.measured_best = g.get_attr<std::string>("measured_best");
  p.best_within_ci = static_cast<int>(g.get_attr<int64_t>("best_within_ci"));
  p.best_cmp.ratio = g.get_attr<double>("best_ratio");
  p.best_cmp.ci_low = g.get_attr<double>("best_ratio_ci_low");
  p.best_cmp.ci_high = g.get_attr<double>("best_ratio_ci_high");
  p.best_cmp.n = static_cast<int>(g.get_attr<int64_t>("best_ratio_n"));
  const auto label = g.open_dataset("label").read_strings();
  const auto widths = g.open_dataset("widths").read_strings();
  const auto counts = g.open_dataset("counts").read_strings();
  const auto measured = g.open_dataset("measured_as").read_strings();
  const auto role = g.exists("role") ? g.open_dataset("role").read_strings() : std::vector<std::string>(label.size());
  const auto groups = g.open_dataset("groups").read<int64_t>();
  const auto batch = g.open_dataset("batch").read<int64_t>();
  const auto replicas = g.exists("replicas") ? g.open_dataset("replicas").read<int64_t>() : std::vector<int64_t>(label.size(), 1);
  const auto stage = g.open_dataset("bottleneck_stage").read<int64_t>();
  const auto front = g.open_dataset("on_front").read<int64_t>();
  const auto tps = g.open_dataset("tokens_per_s").read<double>();
  const auto tpd = g.open_dataset("tokens_per_s_per_device").read<double>();
  const auto ttft = g.open_dataset("ttft_p50_ms").read<double>();
  const auto tpot = g.open_dataset("tpot_p50_ms").read<double>();
  const auto tpu = g.open_dataset("tokens_per_s_per_user").read<double>();
  for (size_t i = 0; i < label.size(); ++i) {
    PlanRecord::Candidate c;
    c.label = label[i];
    c.widths = widths.at(i);
    c.counts = counts.at(i);
    c.measured_as = measured.at(i);
    c.role = role.at(i);
    c.groups = static_cast<int>(groups.at(i));
    c.batch = static_cast<int>(batch.at(i));
    c.replicas = static_cast<int>(replicas.at(i));
    c.bottleneck_stage = static_cast<int>(stage.at(i));
    c.on_front = front.at(i) != 0;
    c.tokens_per_s = tps.at(i);
    c.tokens_per_s_per_device = tpd.at(i);
    c.ttft_p50_ms = ttft.at(i);
    c.tpot_p50_ms = tpot.at(i);
    c.tokens_per_s_per_user = tpu.at(i);
    p.candidates.push_back(std::move(c));
  }
  for (const int64_t i : g.open_dataset("front").read<int64_t>()) p.front.push_back(static_cast<int>(i));
}

}  // namespace ppb
