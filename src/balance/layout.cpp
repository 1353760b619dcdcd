#include "balance/layout.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace ppb::balance {

namespace {

int parse_width(const std::string& item, const std::string& text) {
  int w = 0;
  const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), w);
  if (item.empty() || ec != std::errc() || end != item.data() + item.size() || w < 1)
    throw UserError("--tp '" + text + "': '" + item +
                    "' is not a width >= 1; give one width for every stage (--tp 2) or one per stage (--tp 2,1,1)");
  return w;
}

}  // namespace

std::vector<int> parse_layout(const std::string& text, int ranks) {
  std::vector<std::string> items(1);
  for (char c : text) {
    if (c == ',')
      items.emplace_back();
    else
      items.back() += c;
  }
  std::vector<int> widths;
  for (const std::string& item : items) widths.push_back(parse_width(item, text));
  if (widths.size() == 1) {
    const int w = widths[0];
    if (ranks % w != 0)
      throw UserError("--tp " + text + ": " + std::to_string(ranks) + " ranks do not split into stages of " +
                      std::to_string(w) + " ranks; use a width that divides " + std::to_string(ranks) +
                      " or one width per stage (e.g. --tp 2,1)");
    return std::vector<int>(static_cast<size_t>(ranks / w), w);
  }
  int sum = 0;
  for (int w : widths) sum += w;
  if (sum != ranks)
    throw UserError("--tp " + text + ": the stages' widths sum to " + std::to_string(sum) + " ranks but the run has " +
                    std::to_string(ranks) + "; every rank runs in exactly one stage");
  return widths;
}

std::string layout_label(const std::vector<int>& widths) {
  if (!widths.empty() && std::all_of(widths.begin(), widths.end(), [&](int w) { return w == widths[0]; }))
    return std::to_string(widths[0]);
  std::string s;
  for (int w : widths) s += (s.empty() ? "" : ",") + std::to_string(w);
  return s;
}

std::string layout_suffix(const std::vector<int>& widths) {
  if (std::all_of(widths.begin(), widths.end(), [](int w) { return w == 1; })) return "";
  std::string s = layout_label(widths);
  std::replace(s.begin(), s.end(), ',', '-');
  return "_tp" + s;
}

std::vector<std::pair<int, int>> layout_groups(const std::vector<int>& widths) {
  std::vector<std::pair<int, int>> out;
  int first = 0;
  for (int w : widths) {
    out.emplace_back(first, w);
    first += w;
  }
  return out;
}

BalanceProblem layout_problem(const RunRecord& run, Objective o, const std::vector<int>& widths) {
  const BalanceProblem base = problem_from_run(run, o);
  const int R = base.devices();
  const auto groups = layout_groups(widths);
  if (groups.empty() || groups.back().first + groups.back().second != R)
    throw UserError("layout " + layout_label(widths) + " does not cover the run's " + std::to_string(R) + " ranks");
  const ProfileTable& t = run.profile;
  const size_t U = t.unit_name.size();
  const int S = static_cast<int>(groups.size());
  BalanceProblem p = base;
  p.cost.assign(S, std::vector<double>(U));
  p.device_row.clear();
  p.device_memory_bytes.clear();
  p.pair_bandwidth_GBps.clear();
  p.pair_latency_us.clear();
  for (int k = 0; k < S; ++k) {
    const auto [first, w] = groups[k];
    if (w == 1) {
      p.cost[k] = base.cost[base.row_of(first)];
    } else {
      const auto it = std::find_if(t.tp.begin(), t.tp.end(), [&](const ProfileTable::TpGroupProfile& g) {
        return g.first_rank == first && g.width == w;
      });
      if (it == t.tp.end() || it->latency_ms.size() != 2 * U)
        throw UserError("layout " + layout_label(widths) + ": the ranks " + std::to_string(first) + ".." +
                        std::to_string(first + w - 1) + " were not profiled together at width " + std::to_string(w));
      for (size_t u = 0; u < U; ++u)
        p.cost[k][u] = objective_cost(o, it->latency_ms[2 * u], it->latency_ms[2 * u + 1], run.workload.gen_len);
    }
    if (!base.device_memory_bytes.empty()) {
      int64_t smallest = std::numeric_limits<int64_t>::max();
      for (int r = first; r < first + w; ++r) smallest = std::min(smallest, base.device_memory_bytes[r]);
      p.device_memory_bytes.push_back(smallest * w);
    }
  }
  if (!base.pair_latency_us.empty()) {
    for (int a = 0; a < S; ++a)
      for (int b = 0; b < S; ++b) {
        const size_t pair = static_cast<size_t>(groups[a].first) * R + groups[b].first;
        p.pair_latency_us.push_back(a == b ? std::nan("") : base.pair_latency_us[pair]);
        p.pair_bandwidth_GBps.push_back(a == b ? std::nan("") : base.pair_bandwidth_GBps[pair]);
      }
  }
  validate_problem(p);
  return p;
}

Partition make_layout_split(const BalanceProblem& layout_problem, SplitRequest r, const std::vector<int>& widths) {
  r.order = OrderMode::rank;
  r.stages = static_cast<int>(widths.size());
  Partition p = make_split(layout_problem, r);
  const auto groups = layout_groups(widths);
  for (int k = 0; k < p.num_stages(); ++k) p.device_rank[k] = groups[p.device_rank[k]].first;
  p.tp_width = widths;
  return p;
}

}  // namespace ppb::balance
