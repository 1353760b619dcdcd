#include "balance/layout.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "common/format.h"

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
  for (int w : widths) {  // (appends: GCC 12 warns -Wrestrict on "," + to_string)
    if (!s.empty()) s += ',';
    s += std::to_string(w);
  }
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

std::vector<int> rank_device_classes(const std::vector<RankInfo>& ranks) {
  std::vector<std::string> seen;
  std::vector<int> out;
  for (const RankInfo& r : ranks) {
    const std::string key = r.hostname + '\n' + r.device_name + '\n' +
                            (std::isnan(r.cpu_quota_cores) ? std::string("none") : format_fixed(r.cpu_quota_cores, 3)) +
                            '\n' + std::to_string(r.compute_threads);
    auto it = std::find(seen.begin(), seen.end(), key);
    if (it == seen.end()) it = seen.insert(seen.end(), key);
    out.push_back(static_cast<int>(it - seen.begin()));
  }
  return out;
}

const ProfileTable::TpGroupProfile* group_profile(const RunRecord& run, const std::vector<int>& classes, int first,
                                                  int width) {
  const int R = static_cast<int>(classes.size());
  for (const auto& g : run.profile.tp)
    if (g.first_rank == first && g.width == width) return &g;
  if (first < 0 || width < 1 || first + width > R) return nullptr;
  for (int r = first; r < first + width; ++r)
    if (classes[r] != classes[first]) return nullptr;
  for (const auto& g : run.profile.tp)
    if (g.width == width && g.first_rank >= 0 && g.first_rank < R && classes[g.first_rank] == classes[first]) return &g;
  return nullptr;
}

std::vector<std::pair<int, int>> auto_layout_groups(const std::vector<int>& classes, const std::vector<int>& widths) {
  std::vector<std::pair<int, int>> out;
  const int R = static_cast<int>(classes.size());
  std::vector<int> distinct;
  for (int c : classes)
    if (std::find(distinct.begin(), distinct.end(), c) == distinct.end()) distinct.push_back(c);
  for (int w : widths) {
    if (w < 2 || w > R) continue;
    for (int c : distinct)
      for (int r = 0; r + w <= R; ++r) {
        bool same = true;
        for (int q = r; q < r + w; ++q) same = same && classes[q] == c;
        if (!same) continue;
        out.emplace_back(r, w);
        break;
      }
  }
  return out;
}

namespace {

/// A group profile's [U] cost row in objective `o` (ms).
std::vector<double> group_cost_row(const ProfileTable::TpGroupProfile& g, Objective o, int gen_len) {
  std::vector<double> row(g.latency_ms.size() / 2);
  for (size_t u = 0; u < row.size(); ++u) row[u] = objective_cost(o, g.latency_ms[2 * u], g.latency_ms[2 * u + 1], gen_len);
  return row;
}

}  // namespace

std::vector<GroupCandidate> layout_candidates(const RunRecord& run, const BalanceProblem& p, Objective o,
                                              const std::vector<int>& classes, const std::vector<int>& widths) {
  const int D = static_cast<int>(classes.size());
  std::vector<GroupCandidate> out;
  for (int d = 0; d < D; ++d)
    for (int w : widths) {
      if (d + w > D) continue;
      GroupCandidate g;
      g.first = d;
      g.width = w;
      if (w == 1) {
        g.cost = p.cost[p.row_of(d)];
      } else {
        const ProfileTable::TpGroupProfile* tp = group_profile(run, classes, d, w);
        if (!tp) continue;  // mixes device classes, or no profile at w
        g.cost = group_cost_row(*tp, o, run.workload.gen_len);
      }
      if (!p.device_memory_bytes.empty()) {
        int64_t smallest = std::numeric_limits<int64_t>::max();
        for (int q = d; q < d + w; ++q) smallest = std::min(smallest, p.device_memory_bytes[q]);
        g.memory_bytes = smallest * w;
      }
      out.push_back(std::move(g));
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
  std::vector<int> classes = rank_device_classes(run.ranks);
  if (static_cast<int>(classes.size()) != R) {  // no rank records: only a group's own profile serves it
    classes.resize(R);
    for (int r = 0; r < R; ++r) classes[r] = r;
  }
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
      const ProfileTable::TpGroupProfile* it = group_profile(run, classes, first, w);
      if (it == nullptr || it->latency_ms.size() != 2 * U)
        throw UserError("layout " + layout_label(widths) + ": the ranks " + std::to_string(first) + ".." +
                        std::to_string(first + w - 1) + " were not profiled together at width " + std::to_string(w));
      p.cost[k] = group_cost_row(*it, o, run.workload.gen_len);
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

Partition solve_layout(const BalanceProblem& base, const std::vector<GroupCandidate>& groups, int devices) {
  if (groups.empty()) throw UserError("the layout search has no group of devices to place stages on");
  const int U = static_cast<int>(groups[0].cost.size());
  const int D = devices;
  if (U < 1 || D < 1) throw UserError("the layout search needs units and devices");
  for (const auto& g : groups)
    if (static_cast<int>(g.cost.size()) != U || g.width < 1 || g.first < 0)
      throw InternalError("solve_layout: a group candidate has a malformed cost row or range");
  BalanceProblem xp = base;  // the default link over every boundary
  xp.cost.assign(1, groups[0].cost);
  xp.device_row.clear();
  xp.pair_bandwidth_GBps.clear();
  xp.pair_latency_us.clear();
  const std::vector<double> xfer = U > 1 ? boundary_transfer_ms(xp) : std::vector<double>{};
  auto bytes_of = [&](int u) {
    int64_t b = 0;
    if (static_cast<size_t>(u) < base.weight_bytes.size()) b += base.weight_bytes[u];
    if (static_cast<size_t>(u) < base.kv_bytes.size()) b += base.kv_bytes[u];
    return b;
  };
  // Stage time of group g over units [u, v); NaN when they do not fit its memory.
  auto time = [&](const GroupCandidate& g, int u, int v) {
    double compute = 0;
    int64_t bytes = 0;
    for (int x = u; x < v; ++x) {
      compute += g.cost[x];
      bytes += bytes_of(x);
    }
    if (g.memory_bytes > 0 && bytes > g.memory_bytes) return std::nan("");
    return stage_time(compute, u > 0 ? xfer[u - 1] : 0.0, v < U ? xfer[v - 1] : 0.0, base.overlap);
  };
  std::vector<std::vector<const GroupCandidate*>> at(D);
  for (const auto& g : groups)
    if (g.first + g.width <= D) at[g.first].push_back(&g);
  const double inf = std::numeric_limits<double>::infinity();
  auto grid = [&](double v) { return std::vector<std::vector<double>>(U + 1, std::vector<double>(D + 1, v)); };
  // Pass 1: the smallest bottleneck B*.
  auto f = grid(inf);
  f[0][0] = 0.0;
  for (int d = 0; d < D; ++d)
    for (int u = 0; u < U; ++u) {
      if (f[u][d] == inf) continue;
      for (const GroupCandidate* g : at[d])
        for (int v = u + 1; v <= U; ++v) {
          const double t = time(*g, u, v);
          if (std::isnan(t)) break;  // more units only need more memory
          double& to = f[v][d + g->width];
          to = std::min(to, std::max(f[u][d], t));
        }
    }
  const double best = f[U][D];
  if (best == inf)
    throw UserError("no layout of " + std::to_string(D) + " devices holds the model within the memory limits");
  // Pass 2: among layouts with every stage <= B*, the largest smallest stage time m* (the
  // smallest spread: the bottleneck is B* on all of them).
  auto h = grid(-inf);
  h[0][0] = inf;
  for (int d = 0; d < D; ++d)
    for (int u = 0; u < U; ++u) {
      if (h[u][d] == -inf) continue;
      for (const GroupCandidate* g : at[d])
        for (int v = u + 1; v <= U; ++v) {
          const double t = time(*g, u, v);
          if (std::isnan(t)) break;
          if (t > best) continue;
          double& to = h[v][d + g->width];
          to = std::max(to, std::min(h[u][d], t));
        }
    }
  const double smallest = h[U][D];
  // Pass 3: the fewest stages with every stage time in [m*, B*], and the path.
  const int none = std::numeric_limits<int>::max();
  std::vector<std::vector<int>> c(U + 1, std::vector<int>(D + 1, none));
  struct Step {
    int u = -1, d = -1;
    const GroupCandidate* g = nullptr;
  };
  std::vector<std::vector<Step>> from(U + 1, std::vector<Step>(D + 1));
  c[0][0] = 0;
  for (int d = 0; d < D; ++d)
    for (int u = 0; u < U; ++u) {
      if (c[u][d] == none) continue;
      for (const GroupCandidate* g : at[d])
        for (int v = u + 1; v <= U; ++v) {
          const double t = time(*g, u, v);
          if (std::isnan(t)) break;
          if (t > best || t < smallest) continue;
          if (c[u][d] + 1 < c[v][d + g->width]) {
            c[v][d + g->width] = c[u][d] + 1;
            from[v][d + g->width] = {u, d, g};
          }
        }
    }
  if (c[U][D] == none) throw InternalError("solve_layout: the spread pass lost the optimal layout");
  Partition p;
  p.solver = "balanced";
  p.algorithm = "layout-dp";
  std::vector<Step> path;
  for (int v = U, d = D; v > 0 || d > 0;) {
    const Step st = from[v][d];
    path.push_back(st);
    v = st.u;
    d = st.d;
  }
  std::reverse(path.begin(), path.end());
  for (size_t k = 0; k < path.size(); ++k) {
    const int u = path[k].u, v = k + 1 < path.size() ? path[k + 1].u : U;
    p.first_unit.push_back(u);
    p.last_unit.push_back(v - 1);
    p.device_rank.push_back(path[k].g->first);
    p.tp_width.push_back(path[k].g->width);
    p.predicted_stage_ms.push_back(time(*path[k].g, u, v));
  }
  p.bottleneck_ms = *std::max_element(p.predicted_stage_ms.begin(), p.predicted_stage_ms.end());
  p.spread_ms = p.bottleneck_ms - *std::min_element(p.predicted_stage_ms.begin(), p.predicted_stage_ms.end());
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
