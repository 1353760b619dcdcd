// Contiguous stage partitions: the uniform baseline, the min–max DP solvers (seed and
// balanced share one implementation), evaluation, validation and manual splits.
#include "balance/partition.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "balance/problem.h"
#include "balance/solver.h"
#include "common/error.h"

namespace ppb::balance {

namespace {


/// "34 units (embed + 32 layers + head)" for the usual U = L + 2 model; "2 units" otherwise.
std::string describe_units(int units) {
  std::ostringstream os;
  os << units << " units";
  if (units >= 3) os << " (embed + " << units - 2 << " layers + head)";
  return os.str();
}

void check_stage_count(int units, int stages) {
  if (units < 1)
    throw UserError("cannot partition a model of " + std::to_string(units) +
                    " units: need at least 1 unit");
  if (stages < 1 || stages > units)
    throw UserError("--stages " + std::to_string(stages) + " is invalid for a model of " +
                    describe_units(units) + ": need 1 <= stages <= " +
                    std::to_string(units) + " (every stage needs >= 1 unit)");
}

/// A partition with identity device order and zeroed predictions from per-stage unit counts.
Partition from_counts(const std::string& solver, const std::vector<int>& counts) {
  Partition p;
  p.solver = solver;
  p.algorithm = "counts";
  int next = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    p.first_unit.push_back(next);
    next += counts[k];
    p.last_unit.push_back(next - 1);
    p.device_rank.push_back(static_cast<int>(k));
  }
  p.predicted_stage_ms.assign(counts.size(), 0.0);
  return p;
}

/// The min–max split of `cost` rows over `stages` stages (row k for stage k): minimal
/// bottleneck, then minimal spread. This is the general exact solver of solver.h with no memory
/// limits and free transfers (solve_dp: the source article's DP plus the max–min spread pass),
/// so one DP serves the baseline solvers and the balancer.
Partition solve_rows(const std::string& solver, const std::vector<std::vector<double>>& cost,
                     int stages) {
  BalanceProblem problem;
  problem.cost = cost;
  std::vector<int> order(stages);
  std::iota(order.begin(), order.end(), 0);
  Partition p = solve_dp(problem, order);
  p.solver = solver;
  evaluate(p, cost);
  return p;
}

/// Checks a cost table [rows][U]: equal row lengths, finite non-negative entries.
void check_cost_rows(const std::vector<std::vector<double>>& cost, const char* what) {
  for (std::size_t r = 0; r < cost.size(); ++r) {
    if (cost[r].size() != cost[0].size())
      throw UserError(std::string(what) + ": row " + std::to_string(r) + " has " +
                      std::to_string(cost[r].size()) + " units but row 0 has " +
                      std::to_string(cost[0].size()));
    for (std::size_t u = 0; u < cost[r].size(); ++u)
      if (!std::isfinite(cost[r][u]) || cost[r][u] < 0.0)
        throw UserError(std::string(what) + ": cost of unit " + std::to_string(u) +
                        " on row " + std::to_string(r) + " is " + std::to_string(cost[r][u]) +
                        " ms; costs must be finite and >= 0");
  }
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::string Partition::counts_string() const {
  std::string out;
  for (int k = 0; k < num_stages(); ++k) {
    if (k > 0) out += ',';
    out += std::to_string(units_in(k));
  }
  return out;
}

void evaluate(Partition& p, const std::vector<std::vector<double>>& cost) {
  if (cost.empty()) throw InternalError("evaluate: empty cost table");
  const std::size_t U = cost[0].size();
  for (std::size_t r = 0; r < cost.size(); ++r)
    if (cost[r].size() != U)
      throw InternalError("evaluate: cost row " + std::to_string(r) + " has " +
                          std::to_string(cost[r].size()) + " units, row 0 has " +
                          std::to_string(U));
  check_partition(p, static_cast<int>(U));
  const int S = p.num_stages();
  p.predicted_stage_ms.assign(S, 0.0);
  for (int k = 0; k < S; ++k) {
    const int d = p.device_rank[k];
    if (d >= static_cast<int>(cost.size()))
      throw InternalError("evaluate: stage " + std::to_string(k) + " runs on device " +
                          std::to_string(d) + " but the cost table has " +
                          std::to_string(cost.size()) + " device rows");
    double sum = 0.0;
    for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) sum += cost[d][u];
    p.predicted_stage_ms[k] = sum;
  }
  const auto [lo, hi] =
      std::minmax_element(p.predicted_stage_ms.begin(), p.predicted_stage_ms.end());
  p.bottleneck_ms = *hi;
  p.spread_ms = *hi - *lo;
}

namespace {

/// A stage as compare_splits sees it: its device class, then its unit count per signature.
std::vector<int> stage_key(const Partition& p, int k, const SplitEquivalence& eq, int n_signatures) {
  const int r = p.device_rank[k];
  if (r < 0 || r >= static_cast<int>(eq.device_class.size()))
    throw InternalError("compare_splits: device rank " + std::to_string(r) + " has no device class (" +
                        std::to_string(eq.device_class.size()) + " given)");
  std::vector<int> key(1 + static_cast<size_t>(n_signatures), 0);
  key[0] = eq.device_class[r];
  for (int u = p.first_unit[k]; u <= p.last_unit[k]; ++u) {
    if (u < 0 || u >= static_cast<int>(eq.unit_signature.size()))
      throw InternalError("compare_splits: unit " + std::to_string(u) + " has no signature (" +
                          std::to_string(eq.unit_signature.size()) + " given)");
    ++key[1 + eq.unit_signature[u]];
  }
  return key;
}

}  // namespace

bool Partition::tensor_parallel() const {
  return std::any_of(tp_width.begin(), tp_width.end(), [](int t) { return t > 1; });
}

int Partition::ranks_per_replica() const {
  int n = 0;
  for (int k = 0; k < num_stages(); ++k) n += width(k);
  return n;
}

std::vector<std::vector<int>> Partition::stage_ranks(int replica) const {
  if (replica < 0 || replica >= std::max(1, replicas))
    throw InternalError("Partition::stage_ranks: replica " + std::to_string(replica) + " of " + std::to_string(replicas));
  std::vector<std::vector<int>> out(num_stages());
  for (int k = 0; k < num_stages(); ++k)
    for (int j = 0; j < width(k); ++j) out[k].push_back(first_rank(replica, k) + j);
  return out;
}

Sameness compare_splits(const Partition& a, const Partition& b, const SplitEquivalence& eq) {
  std::vector<int> wa(a.num_stages()), wb(b.num_stages());
  for (int k = 0; k < a.num_stages(); ++k) wa[k] = a.width(k);
  for (int k = 0; k < b.num_stages(); ++k) wb[k] = b.width(k);
  if (a.groups != b.groups || a.replicas != b.replicas || a.step_policy != b.step_policy || a.pp_schedule != b.pp_schedule)
    return Sameness::different;
  if (a.first_unit == b.first_unit && a.last_unit == b.last_unit && a.device_rank == b.device_rank && wa == wb)
    return Sameness::identical;
  if (eq.unit_signature.empty() || eq.device_class.empty() || a.num_stages() != b.num_stages() ||
      a.tensor_parallel() || b.tensor_parallel())
    return Sameness::different;
  int n_signatures = 0;
  for (int s : eq.unit_signature) {
    if (s < 0) throw InternalError("compare_splits: negative unit signature " + std::to_string(s));
    n_signatures = std::max(n_signatures, s + 1);
  }
  std::vector<std::vector<int>> ka, kb;
  for (int k = 0; k < a.num_stages(); ++k) {
    ka.push_back(stage_key(a, k, eq, n_signatures));
    kb.push_back(stage_key(b, k, eq, n_signatures));
  }
  if (!eq.stage_order_matters) {
    std::sort(ka.begin(), ka.end());
    std::sort(kb.begin(), kb.end());
  }
  return ka == kb ? Sameness::equivalent : Sameness::different;
}

int same_split_as(const std::vector<Partition>& parts, size_t i, const SplitEquivalence& eq) {
  for (size_t j = 0; j < i && j < parts.size(); ++j)
    if (compare_splits(parts[j], parts[i], eq) != Sameness::different) return static_cast<int>(j);
  return -1;
}

void check_partition(const Partition& p, int units) {
  const int S = p.num_stages();
  auto fail = [&](const std::string& why) {
    throw InternalError("invalid " + p.solver + " partition [" +
                        (p.last_unit.size() == p.first_unit.size() ? p.counts_string() : "?") +
                        "] of " + std::to_string(units) + " units: " + why);
  };
  if (S < 1) fail("no stages");
  if (p.last_unit.size() != p.first_unit.size() || p.device_rank.size() != p.first_unit.size())
    fail("first_unit, last_unit and device_rank differ in length");
  if (!p.tp_width.empty() && p.tp_width.size() != p.first_unit.size()) fail("tp_width has the wrong length");
  for (int w : p.tp_width)
    if (w < 1) fail("a stage has tensor-parallel width " + std::to_string(w));
  if (!p.predicted_stage_ms.empty() && static_cast<int>(p.predicted_stage_ms.size()) != S)
    fail("predicted_stage_ms has " + std::to_string(p.predicted_stage_ms.size()) +
         " entries for " + std::to_string(S) + " stages");
  if (p.first_unit[0] != 0) fail("stage 0 starts at unit " + std::to_string(p.first_unit[0]));
  for (int k = 0; k < S; ++k) {
    if (p.last_unit[k] < p.first_unit[k]) fail("stage " + std::to_string(k) + " is empty");
    if (k + 1 < S && p.first_unit[k + 1] != p.last_unit[k] + 1)
      fail("stage " + std::to_string(k + 1) + " starts at unit " +
           std::to_string(p.first_unit[k + 1]) + ", not right after unit " +
           std::to_string(p.last_unit[k]) + " (gap or overlap)");
    if (p.device_rank[k] < 0)
      fail("stage " + std::to_string(k) + " has device rank " + std::to_string(p.device_rank[k]));
    for (int m = 0; m < k; ++m)
      if (p.device_rank[m] == p.device_rank[k])
        fail("stages " + std::to_string(m) + " and " + std::to_string(k) +
             " share device rank " + std::to_string(p.device_rank[k]));
  }
  if (p.last_unit[S - 1] != units - 1)
    fail("last stage ends at unit " + std::to_string(p.last_unit[S - 1]) + ", not " +
         std::to_string(units - 1));
}

Partition solve_uniform(int units, int stages, UniformRemainder remainder) {
  check_stage_count(units, stages);
  std::vector<int> counts(stages, 0);
  if (units < 3) {
    // No embed/layers/head structure to respect: spread the units, extras to the first stages.
    for (int k = 0; k < stages; ++k) counts[k] = units / stages + (k < units % stages ? 1 : 0);
    return from_counts(method_name(Method::uniform), counts);  // U < 3: no layers to place by `remainder`
  }
  const int layers = units - 2;
  // S <= L: every stage gets layers. S = L+1: the embed is a stage of its own. S = L+2: the
  // head too. `first` and `last` are the indices of the stages that share layers.
  const bool embed_alone = stages > layers;
  const bool head_alone = stages > layers + 1;
  const int first = embed_alone ? 1 : 0;
  const int layer_stages = stages - first - (head_alone ? 1 : 0);
  const int extra = layers % layer_stages;
  for (int k = 0; k < layer_stages; ++k) {
    int n = layers / layer_stages;
    switch (remainder) {
      case UniformRemainder::first: n += k < extra ? 1 : 0; break;
      case UniformRemainder::last: n += k >= layer_stages - extra ? 1 : 0; break;
      case UniformRemainder::spread:
        n = static_cast<int>((static_cast<long long>(k + 1) * layers) / layer_stages -
                             (static_cast<long long>(k) * layers) / layer_stages);
        break;
    }
    counts[first + k] = n;
  }
  counts[0] += 1;           // embed
  counts[stages - 1] += 1;  // head
  return from_counts(method_name(Method::uniform), counts);
}

UniformRemainder parse_uniform_remainder(const std::string& text) {
  if (text == "first") return UniformRemainder::first;
  if (text == "last") return UniformRemainder::last;
  if (text == "spread") return UniformRemainder::spread;
  throw UserError("--uniform-remainder '" + text + "' is unknown; valid: first, last, spread");
}

Partition solve_seed(const std::vector<double>& lat, int stages) {
  check_stage_count(static_cast<int>(lat.size()), stages);
  // Homogeneous devices: the balanced solver with the same row on every stage.
  const std::vector<std::vector<double>> rows(stages, lat);
  check_cost_rows(rows, "solve_seed");
  return solve_rows("seed", rows, stages);
}

Partition solve_balanced(const std::vector<std::vector<double>>& cost, int stages) {
  if (cost.empty()) throw UserError("solve_balanced: empty cost table (no device rows)");
  check_stage_count(static_cast<int>(cost[0].size()), stages);
  if (static_cast<int>(cost.size()) != stages)
    throw UserError("solve_balanced: cost table has " + std::to_string(cost.size()) +
                    " device rows but the pipeline has " + std::to_string(stages) + " stages");
  check_cost_rows(cost, "solve_balanced");
  return solve_rows("balanced", cost, stages);
}

Partition parse_manual(const std::string& text, int units, int stages) {
  const std::string usage = "; expected unit counts per stage such as 5,6,5,6";
  if (trim(text).empty()) throw UserError("--partition is empty" + usage);
  std::vector<int> counts;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = text.find(',', pos);
    const std::string token =
        trim(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    const int index = static_cast<int>(counts.size());
    if (token.empty())
      throw UserError("--partition '" + text + "': entry " + std::to_string(index + 1) +
                      " is empty" + usage);
    int value = 0;
    const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    if (ec != std::errc() || end != token.data() + token.size())
      throw UserError("--partition '" + text + "': '" + token + "' is not an integer" + usage);
    if (value <= 0)
      throw UserError("--partition '" + text + "': stage " + std::to_string(index) +
                      " would be empty (entry " + std::to_string(index + 1) + " is " + token +
                      "); every stage needs >= 1 unit");
    counts.push_back(value);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (static_cast<int>(counts.size()) != stages)
    throw UserError("--partition has " + std::to_string(counts.size()) +
                    " stages but the run has " + std::to_string(stages) + " ranks/stages");
  long long sum = 0;
  for (int c : counts) sum += c;
  if (sum != units)
    throw UserError("--partition covers " + std::to_string(sum) + " units but the model has " +
                    describe_units(units));
  Partition p = from_counts("manual", counts);
  check_partition(p, units);
  return p;
}

}  // namespace ppb::balance
