// Device-order search (--order auto): which device runs which stage. With heterogeneous
// devices the order matters (a slow device is best given the stage with the fewest units that
// still balances, memory-rich devices the stages with the embed or head).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "balance/solver.h"
#include "common/error.h"

namespace ppb::balance {

namespace {

constexpr int kMaxExhaustive = 8;  // 8! = 40320 solves of ~20 us each

/// Whether swapping devices d and e leaves every link the same (always without pair links):
/// d and e see every other device over equal links, both ways, and each other alike both ways.
bool same_links(const BalanceProblem& p, int d, int e) {
  if (p.pair_bandwidth_GBps.empty() && p.pair_latency_us.empty()) return true;
  if (pair_link(p, d, e) != pair_link(p, e, d)) return false;
  for (int f = 0; f < p.devices(); ++f) {
    if (f == d || f == e) continue;
    if (pair_link(p, d, f) != pair_link(p, e, f) || pair_link(p, f, d) != pair_link(p, f, e)) return false;
  }
  return true;
}

/// Class id of every device: equal cost row and stage_fixed_ms (by content), equal memory limit and the same links
/// to every other device (devices of one node, with per-pair links).
std::vector<int> device_classes(const BalanceProblem& p) {
  const int D = p.devices();
  std::vector<int> cls(D, -1);
  int next = 0;
  for (int d = 0; d < D; ++d) {
    if (cls[d] >= 0) continue;
    cls[d] = next;
    const int64_t cap_d = p.device_memory_bytes.empty() ? 0 : std::max<int64_t>(0, p.device_memory_bytes[d]);
    for (int e = d + 1; e < D; ++e) {
      if (cls[e] >= 0) continue;
      const int64_t cap_e = p.device_memory_bytes.empty() ? 0 : std::max<int64_t>(0, p.device_memory_bytes[e]);
      if (cap_d != cap_e) continue;
      if ((p.row_of(d) == p.row_of(e) ||
           (p.cost[p.row_of(d)] == p.cost[p.row_of(e)] && p.fixed_of_row(p.row_of(d)) == p.fixed_of_row(p.row_of(e)))) &&
          same_links(p, d, e))
        cls[e] = next;
    }
    ++next;
  }
  return cls;
}

/// True when (b, s) is better than (best_b, best_s) beyond rounding.
bool better(const Partition& a, const Partition& best) {
  const double tol = 1e-12 * std::max(1.0, std::fabs(best.bottleneck_ms));
  if (a.bottleneck_ms < best.bottleneck_ms - tol) return true;
  if (a.bottleneck_ms > best.bottleneck_ms + tol) return false;
  return a.spread_ms < best.spread_ms - tol;
}

}  // namespace

Partition solve_with_order(const BalanceProblem& problem, int stages, OrderMode mode, SolverKind kind) {
  validate_problem(problem);
  const std::vector<int> identity = rank_order(problem, stages);
  if (mode == OrderMode::rank) return solve(problem, identity, kind);

  const int D = problem.devices();
  const std::vector<int> cls = device_classes(problem);
  const int classes = *std::max_element(cls.begin(), cls.end()) + 1;

  // Candidate device sequences (length D; the first `stages` devices form the pipeline).
  std::vector<std::vector<int>> candidates{[&] {
    std::vector<int> all(D);
    for (int d = 0; d < D; ++d) all[d] = d;
    return all;
  }()};
  // Devices of each class, in index order.
  std::vector<std::vector<int>> members(classes);
  for (int d = 0; d < D; ++d) members[cls[d]].push_back(d);
  auto devices_for = [&](const std::vector<int>& class_seq) {
    std::vector<int> used(classes, 0), seq;
    for (int c : class_seq) seq.push_back(members[c][used[c]++]);
    return seq;
  };
  if (classes > 1 && D <= kMaxExhaustive) {
    // Every distinct permutation of the class multiset (identical devices are interchangeable).
    std::vector<int> class_seq(cls);
    std::sort(class_seq.begin(), class_seq.end());
    do candidates.push_back(devices_for(class_seq));
    while (std::next_permutation(class_seq.begin(), class_seq.end()));
  } else if (classes > 1 && classes <= kMaxExhaustive) {
    // By device class: each class a contiguous block, every order of the blocks.
    std::vector<int> block(classes);
    for (int c = 0; c < classes; ++c) block[c] = c;
    do {
      std::vector<int> class_seq;
      for (int c : block) class_seq.insert(class_seq.end(), members[c].size(), c);
      candidates.push_back(devices_for(class_seq));
    } while (std::next_permutation(block.begin(), block.end()));
  }
  // More than 8 classes beyond 8 devices: rank order only (documented in solver.h).

  std::set<std::vector<int>> seen;
  Partition best;
  bool have = false;
  std::string first_error;
  for (const auto& seq : candidates) {
    std::vector<int> order(seq.begin(), seq.begin() + stages);
    if (!seen.insert(order).second) continue;
    try {
      Partition p = solve(problem, order, kind);
      if (!have || better(p, best)) {
        best = std::move(p);
        have = true;
      }
    } catch (const UserError& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!have)
    throw UserError("no device order admits a feasible split (" + std::to_string(seen.size()) +
                    " orders tried); with rank order: " + first_error);
  return best;
}

}  // namespace ppb::balance
