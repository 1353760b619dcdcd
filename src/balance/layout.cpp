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

/// Memory of the group of devices first .. first + width - 1 (bytes): width x the smallest of
/// their limits (`device_memory_bytes`, one per device), the layout search's memory of a group.
int64_t group_memory_bytes(const std::vector<int64_t>& device_memory_bytes, int first, int width) {
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (int q = first; q < first + width; ++q) smallest = std::min(smallest, device_memory_bytes[q]);
  return smallest * width;
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
        g.fixed_ms = p.fixed_of_row(p.row_of(d));
      } else {
        const ProfileTable::TpGroupProfile* tp = group_profile(run, classes, d, w);
        if (!tp) continue;  // mixes device classes, or no profile at w
        g.cost = group_cost_row(*tp, o, run.workload.gen_len);
      }
      if (!p.device_memory_bytes.empty()) g.memory_bytes = group_memory_bytes(p.device_memory_bytes, d, w);
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
  p.stage_fixed_ms.assign(S, 0.0);  // a tensor-parallel group's profile times no fixed cost
  p.device_row.clear();
  p.device_memory_bytes.clear();
  p.pair_bandwidth_GBps.clear();
  p.pair_latency_us.clear();
  for (int k = 0; k < S; ++k) {
    const auto [first, w] = groups[k];
    if (w == 1) {
      p.cost[k] = base.cost[base.row_of(first)];
      p.stage_fixed_ms[k] = base.fixed_of_row(base.row_of(first));
    } else {
      const ProfileTable::TpGroupProfile* it = group_profile(run, classes, first, w);
      if (it == nullptr || it->latency_ms.size() != 2 * U)
        throw UserError("layout " + layout_label(widths) + ": the ranks " + std::to_string(first) + ".." +
                        std::to_string(first + w - 1) + " were not profiled together at width " + std::to_string(w));
      p.cost[k] = group_cost_row(*it, o, run.workload.gen_len);
    }
    if (!base.device_memory_bytes.empty()) p.device_memory_bytes.push_back(group_memory_bytes(base.device_memory_bytes, first, w));
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

namespace {

/// The layout search's stage times: a group over a run of units, with the default link's
/// boundary transfers, and the groups by their first device.
class LayoutDp {
 public:
  /// @throws ppb::UserError without groups, units or devices; ppb::InternalError for a group
  ///         with a malformed cost row or range.
  LayoutDp(const BalanceProblem& base, const std::vector<GroupCandidate>& groups, int devices) : base_(base) {
    if (groups.empty()) throw UserError("the layout search has no group of devices to place stages on");
    U = static_cast<int>(groups[0].cost.size());
    D = devices;
    if (U < 1 || D < 1) throw UserError("the layout search needs units and devices");
    for (const auto& g : groups)
      if (static_cast<int>(g.cost.size()) != U || g.width < 1 || g.first < 0)
        throw InternalError("solve_layout: a group candidate has a malformed cost row or range");
    BalanceProblem xp = base;  // the default link over every boundary
    xp.cost.assign(1, groups[0].cost);
    xp.stage_fixed_ms.clear();
    xp.device_row.clear();
    xp.pair_bandwidth_GBps.clear();
    xp.pair_latency_us.clear();
    xfer_ = U > 1 ? boundary_transfer_ms(xp) : std::vector<double>{};
    at.resize(D);
    for (const auto& g : groups)
      if (g.first + g.width <= D) at[g.first].push_back(&g);
  }

  /// Stage time (ms) of group g over units [u, v); NaN when they do not fit its memory.
  double time(const GroupCandidate& g, int u, int v) const {
    double compute = g.fixed_ms;
    int64_t bytes = 0;
    for (int x = u; x < v; ++x) {
      compute += g.cost[x];
      bytes += bytes_of(x);
    }
    if (g.memory_bytes > 0 && bytes > g.memory_bytes) return std::nan("");
    return stage_time(compute, u > 0 ? xfer_[u - 1] : 0.0, v < U ? xfer_[v - 1] : 0.0, base_.overlap);
  }

  /// Calls fn(u, d, g, v, t) for every stage appendable to a state (u units placed on d devices)
  /// for which reached(u, d) holds: group g starting at device d over units [u, v), time t, v
  /// rising until the units stop fitting (more units only need more memory).
  template <class Reached, class Fn>
  void for_each_stage(Reached reached, Fn fn) const {
    for (int d = 0; d < D; ++d)
      for (int u = 0; u < U; ++u) {
        if (!reached(u, d)) continue;
        for (const GroupCandidate* g : at[d])
          for (int v = u + 1; v <= U; ++v) {
            const double t = time(*g, u, v);
            if (std::isnan(t)) break;
            fn(u, d, *g, v, t);
          }
      }
  }

  /// A [U + 1][D + 1] table of `v`.
  template <class T>
  std::vector<std::vector<T>> grid(T v) const {
    return std::vector<std::vector<T>>(U + 1, std::vector<T>(D + 1, v));
  }

  int U = 0, D = 0;
  std::vector<std::vector<const GroupCandidate*>> at;  ///< [D] the groups whose first device is d

 private:
  /// Weights + KV cache bytes of unit u.
  int64_t bytes_of(int u) const {
    int64_t b = 0;
    if (static_cast<size_t>(u) < base_.weight_bytes.size()) b += base_.weight_bytes[u];
    if (static_cast<size_t>(u) < base_.kv_bytes.size()) b += base_.kv_bytes[u];
    return b;
  }

  const BalanceProblem& base_;
  std::vector<double> xfer_;  ///< [U-1] boundary transfer times over the default link, ms
};

/// Pass 1: the smallest bottleneck B* over all layouts (infinity when none fits the memory).
double min_bottleneck(const LayoutDp& dp) {
  const double inf = std::numeric_limits<double>::infinity();
  auto f = dp.grid(inf);
  f[0][0] = 0.0;
  dp.for_each_stage([&](int u, int d) { return f[u][d] != inf; },
                    [&](int u, int d, const GroupCandidate& g, int v, double t) {
                      double& to = f[v][d + g.width];
                      to = std::min(to, std::max(f[u][d], t));
                    });
  return f[dp.U][dp.D];
}

/// Pass 2: among layouts with every stage <= B* (`best`), the largest smallest stage time m*
/// (the smallest spread: the bottleneck is B* on all of them).
double max_smallest_stage(const LayoutDp& dp, double best) {
  const double inf = std::numeric_limits<double>::infinity();
  auto h = dp.grid(-inf);
  h[0][0] = inf;
  dp.for_each_stage([&](int u, int d) { return h[u][d] != -inf; },
                    [&](int u, int d, const GroupCandidate& g, int v, double t) {
                      if (t > best) return;
                      double& to = h[v][d + g.width];
                      to = std::max(to, std::min(h[u][d], t));
                    });
  return h[dp.U][dp.D];
}

/// One stage of a layout: it starts at unit u on device d, on group g.
struct LayoutStep {
  int u = -1, d = -1;
  const GroupCandidate* g = nullptr;
};

/// Pass 3: the fewest stages with every stage time in [m*, B*] (`smallest`, `best`), as the
/// stages in order. @throws ppb::InternalError when no such layout exists (passes 1 and 2 found one).
std::vector<LayoutStep> fewest_stages(const LayoutDp& dp, double best, double smallest) {
  const int none = std::numeric_limits<int>::max();
  auto c = dp.grid(none);
  auto from = dp.grid(LayoutStep{});
  c[0][0] = 0;
  dp.for_each_stage([&](int u, int d) { return c[u][d] != none; },
                    [&](int u, int d, const GroupCandidate& g, int v, double t) {
                      if (t > best || t < smallest) return;
                      if (c[u][d] + 1 < c[v][d + g.width]) {
                        c[v][d + g.width] = c[u][d] + 1;
                        from[v][d + g.width] = {u, d, &g};
                      }
                    });
  if (c[dp.U][dp.D] == none) throw InternalError("solve_layout: the spread pass lost the optimal layout");
  std::vector<LayoutStep> path;
  for (int v = dp.U, d = dp.D; v > 0 || d > 0;) {
    const LayoutStep st = from[v][d];
    path.push_back(st);
    v = st.u;
    d = st.d;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace

Partition solve_layout(const BalanceProblem& base, const std::vector<GroupCandidate>& groups, int devices) {
  const LayoutDp dp(base, groups, devices);
  const double best = min_bottleneck(dp);
  if (best == std::numeric_limits<double>::infinity())
    throw UserError("no layout of " + std::to_string(dp.D) + " devices holds the model within the memory limits");
  const std::vector<LayoutStep> path = fewest_stages(dp, best, max_smallest_stage(dp, best));
  Partition p;
  p.solver = "balanced";
  p.algorithm = "layout-dp";
  for (size_t k = 0; k < path.size(); ++k) {
    const int u = path[k].u, v = k + 1 < path.size() ? path[k + 1].u : dp.U;
    p.first_unit.push_back(u);
    p.last_unit.push_back(v - 1);
    p.device_rank.push_back(path[k].g->first);
    p.tp_width.push_back(path[k].g->width);
    p.predicted_stage_ms.push_back(dp.time(*path[k].g, u, v));
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
