// The fast exact balancer: probe-based parametric search on the bottleneck (Pinar & Aykanat,
// "Fast optimal load balancing algorithms for 1D partitioning", JPDC 2004), extended to
// heterogeneous rows, memory limits, boundary transfers and the spread tie-break.
//
// probe(L, cap) computes A[k], the unit positions reachable after stages 0..k-1 when every
// stage time t satisfies L <= t <= cap and every stage fits its device's memory. From a start
// j, stage k may end at any i in [Lo(j), R(j)] (Lo(j) = first i > j with t >= L, R(j) = last i
// with t <= cap and memory ok); both are non-decreasing in j because stage times are prefix-sum
// differences, monotone in both ends. So A[k+1] is a union of runs computed with O(log U)
// galloping searches per run, and A[k] is kept as a sorted list of disjoint intervals (holes
// appear where one unit alone does not fit a device, or, in the spread pass, where no end
// falls inside [L, cap]). A[k] is clipped to positions from which the remaining stages can
// still reach U (a backward greedy) and leave one unit per remaining stage.
//
// Exactness: the probe's outcome depends only on its comparisons of stage times with cap and
// L. Every failing comparison is recorded; an infeasible probe at cap stays infeasible for
// every cap' below the smallest stage time that failed (`next_above_cap`), so B* >= that
// value, and a feasible one yields a split whose bottleneck is an upper bound. Bisection
// between the two meets at B* exactly (a stage time of some split), in ~50 probes.
#include <algorithm>
#include <cmath>
#include <limits>

#include "balance/solver.h"
#include "balance/solver_detail.h"
#include "common/error.h"

namespace ppb::balance {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kBlock = 64;             // first level of the single-unit maxima
constexpr int kSuper = 64 * kBlock;    // second level

struct Interval {
  int lo, hi;  // inclusive positions
};
using IntervalSet = std::vector<Interval>;

/// Block maxima of the single-unit compute time (the unit and the row's fixed cost) of one row and of the single-unit bytes, to
/// find the next unit that alone does not fit a stage in O(kBlock + U / kSuper) steps.
struct UnitMaxima {
  std::vector<double> d, b1, b2;  // [U], [U/kBlock], [U/kSuper]
  void build(const std::vector<double>& prefix, double fixed, int U) {
    d.resize(U);
    for (int j = 0; j < U; ++j) d[j] = (prefix[j + 1] - prefix[j]) + fixed;  // Prepared::compute(k, j, j + 1)
    b1.assign((U + kBlock - 1) / kBlock, 0.0);
    b2.assign((U + kSuper - 1) / kSuper, 0.0);
    for (int j = 0; j < U; ++j) {
      b1[j / kBlock] = std::max(b1[j / kBlock], d[j]);
      b2[j / kSuper] = std::max(b2[j / kSuper], d[j]);
    }
  }
};

class FastSolver {
 public:
  FastSolver(const BalanceProblem& problem, const detail::Prepared& pp) : problem_(problem), pp_(pp) {
    const int U = pp.U;
    row_max_.resize(pp.prefix.size());
    for (std::size_t r = 0; r < pp.prefix.size(); ++r) row_max_[r].build(pp.prefix[r], pp.fixed[r], U);
    for (int k = 0; k < pp.S; ++k)
      stage_max_.push_back(&row_max_[pp.slot_of[k]]);
    m_.resize(U);
    for (int j = 0; j < U; ++j) m_[j] = pp.mem_prefix[j + 1] - pp.mem_prefix[j];
    mb1_.assign((U + kBlock - 1) / kBlock, 0);
    mb2_.assign((U + kSuper - 1) / kSuper, 0);
    for (int j = 0; j < U; ++j) {
      mb1_[j / kBlock] = std::max(mb1_[j / kBlock], m_[j]);
      mb2_[j / kSuper] = std::max(mb2_[j / kSuper], m_[j]);
    }
    x_ = U >= 2 && !pp.xfer_slot_of.empty() ? pp.xfer_rows[pp.xfer_slot_of[0]][0] : 0.0;
    sets_.resize(pp.S + 1);
  }

  Partition solve() {
    const int S = pp_.S;
    // Feasible at all? (memory only)
    std::vector<int> starts;
    if (!probe(-kInf, kInf, &starts)) detail::throw_infeasible(problem_, pp_.order);
    double ub = max_time(starts);
    std::vector<int> best = starts;
    double lb = 0.0;
    // Pass 1: B* in [lb, ub].
    while (lb < ub) {
      double mid = lb + 0.5 * (ub - lb);
      if (!(mid < ub)) mid = lb;
      if (probe(-kInf, mid, &starts)) {
        ub = max_time(starts);
        best = starts;
      } else {
        if (!(next_above_cap_ > mid) || next_above_cap_ == kInf)
          throw InternalError("solve_fast: infeasible probe without a next breakpoint");
        lb = next_above_cap_;
      }
    }
    const double bstar = ub;
    // Pass 2: the largest minimum stage time L* with every stage <= B* + eps.
    const double cap = bstar + pp_.eps;
    double lo = min_time(best), hi = cap;
    while (lo < hi) {
      double mid = lo + 0.5 * (hi - lo);
      if (!(mid > lo)) mid = hi;
      if (probe(mid, cap, &starts)) {
        lo = min_time(starts);
        best = starts;
      } else {
        if (!(prev_below_l_ < mid) || prev_below_l_ == -kInf)
          throw InternalError("solve_fast: infeasible spread probe without a previous breakpoint");
        hi = prev_below_l_;
      }
    }
    (void)S;
    return detail::make_partition(problem_, pp_, best, "fast");
  }

 private:
  // ---- recorded comparisons ---------------------------------------------------------------
  bool le_cap(double t) {
    if (t <= cap_) return true;
    if (t < next_above_cap_) next_above_cap_ = t;
    return false;
  }
  bool ge_l(double t) {
    if (t >= l_) return true;
    if (t > prev_below_l_) prev_below_l_ = t;
    return false;
  }
  /// Stage k may run [j, i): memory first (cap-independent, not recorded), then time <= cap.
  bool fits(int k, int j, int i) { return pp_.mem_ok(k, j, i) && le_cap(pp_.time(k, j, i)); }

  /// Largest i in [a, b] with pred(i) true, pred monotone true..false and pred(a) true;
  /// gallops from `hint` (any value; clamped).
  template <class Pred>
  static int last_true(int a, int b, int hint, Pred pred) {
    int lo = std::clamp(hint, a, b);
    if (!pred(lo)) {  // answer in [a, lo)
      int l = a, h = lo - 1;
      while (l < h) {
        const int m = l + (h - l + 1) / 2;
        if (pred(m)) l = m;
        else h = m - 1;
      }
      return l;
    }
    int step = 1, hi;
    for (;;) {
      if (lo == b) return b;
      const int probe = std::min(b, lo + step);
      if (pred(probe)) {
        lo = probe;
        step *= 2;
      } else {
        hi = probe - 1;
        break;
      }
    }
    while (lo < hi) {
      const int m = lo + (hi - lo + 1) / 2;
      if (pred(m)) lo = m;
      else hi = m - 1;
    }
    return lo;
  }
  /// Smallest i in [a, b] with pred(i) true, pred monotone false..true; b + 1 if none.
  template <class Pred>
  static int first_true(int a, int b, int hint, Pred pred) {
    if (a > b || !pred(b)) return b + 1;
    // last_true of !pred over [a-1, b-1] with a virtual true at a-1.
    const int r = last_true(a - 1, b - 1, hint - 1, [&](int i) { return i < a || !pred(i); });
    return r + 1;
  }

  /// Last position stage k may end at: one unit is left for every later stage.
  int max_end(int k) const { return pp_.U - (pp_.S - 1 - k); }

  /// R(j): last end i in [j+1, max_end(k)] with the stage fitting; j if none.
  int reach(int k, int j) {
    if (j + 1 > max_end(k) || !fits(k, j, j + 1)) return j;
    const int r = last_true(j + 1, max_end(k), r_hint_, [&](int i) { return fits(k, j, i); });
    r_hint_ = r;
    return r;
  }
  /// Lo(j): first end i in [j+1, max_end(k)] with time >= L; max_end(k) + 1 if none.
  int low_end(int k, int j) {
    if (l_ == -kInf) return j + 1;
    const int r = first_true(j + 1, max_end(k), std::max(lo_hint_, j + 1), [&](int i) { return ge_l(pp_.time(k, j, i)); });
    lo_hint_ = r;
    return r;
  }

  /// First j in [p, h] such that unit j alone does not fit stage k; h + 1 if none.
  int next_bad(int k, int p, int h) {
    const UnitMaxima& um = *stage_max_[k];
    const int64_t mcap = pp_.mem_cap[k];
    const double t_in = k > 0 ? x_ : 0.0, t_out = k < pp_.S - 1 ? x_ : 0.0;
    auto bad = [&](double dmax, int64_t mmax) {
      return mmax > mcap || !le_cap(stage_time(dmax, t_in, t_out, pp_.overlap));
    };
    int j = p;
    while (j <= h) {
      if (j % kSuper == 0 && j + kSuper - 1 <= h && !bad(um.b2[j / kSuper], mb2_[j / kSuper])) {
        j += kSuper;
        continue;
      }
      if (j % kBlock == 0 && j + kBlock - 1 <= h && !bad(um.b1[j / kBlock], mb1_[j / kBlock])) {
        j += kBlock;
        continue;
      }
      if (bad(um.d[j], m_[j])) return j;
      ++j;
    }
    return h + 1;
  }

  /// Appends [lo, hi] clipped to [min_pos, max_pos] to `out`, merging with its last interval.
  static void emit(IntervalSet& out, int lo, int hi, int min_pos, int max_pos) {
    lo = std::max(lo, min_pos);
    hi = std::min(hi, max_pos);
    if (lo > hi) return;
    if (!out.empty() && lo <= out.back().hi + 1) out.back().hi = std::max(out.back().hi, hi);
    else out.push_back({lo, hi});
  }

  /// Fills sets_[0..S]; true when U is reachable, with the stage starts in *starts.
  bool probe(double l, double cap, std::vector<int>* starts) {
    const int S = pp_.S, U = pp_.U;
    l_ = l;
    cap_ = cap;
    next_above_cap_ = kInf;
    prev_below_l_ = -kInf;
    // Backward greedy: q[k] is a lower bound of any feasible start of stage k.
    std::vector<int> q(S + 1);
    q[S] = U;
    for (int k = S - 1; k >= 0; --k) {
      const int end = q[k + 1];
      if (end > max_end(k)) return false;
      const int j = first_true(k, end - 1, end - 1, [&](int jj) { return fits(k, jj, end); });
      q[k] = std::min(j, end);
    }
    if (q[0] > 0) return false;
    sets_[0].assign(1, {0, 0});
    for (int k = 0; k < S; ++k) {
      IntervalSet& next = sets_[k + 1];
      next.clear();
      const int min_pos = std::max(k + 1, q[k + 1]), max_pos = U - (S - k - 1);
      r_hint_ = 0;
      lo_hint_ = 0;
      for (const Interval& in : sets_[k]) {
        if (l_ == -kInf) {
          // Every good start j contributes (j, R(j)] with R(j) >= j + 1: runs break only after
          // a unit that alone does not fit.
          int p = in.lo;
          while (p <= in.hi) {
            const int b = next_bad(k, p, in.hi);
            if (b > p) emit(next, p + 1, reach(k, b - 1), min_pos, max_pos);
            p = b + 1;
          }
        } else {
          int j = in.lo;
          while (j <= in.hi) {
            const int lo = low_end(k, j), hi = reach(k, j);
            if (lo > hi) {
              ++j;
              continue;
            }
            int e = hi, js = j;
            for (;;) {
              int nj;
              if (e >= max_end(k)) {
                nj = in.hi;
              } else {
                const int top = std::min(in.hi, e);
                nj = last_true(js, top, js, [&](int jj) { return ge_l(pp_.time(k, jj, e + 1)); });
              }
              if (nj == js) break;
              js = nj;
              const int ne = reach(k, js);
              if (ne <= e) break;
              e = ne;
            }
            emit(next, lo, e, min_pos, max_pos);
            j = js + 1;
          }
        }
      }
      if (next.empty()) return false;
    }
    if (sets_[S].back().hi != U) return false;
    reconstruct(starts);
    return true;
  }

  /// Walks back from U through sets_: stage k starts at the largest reachable j that can end
  /// at the next stage's start.
  void reconstruct(std::vector<int>* starts) {
    const int S = pp_.S;
    starts->assign(S, 0);
    int pos = pp_.U;
    for (int k = S - 1; k >= 0; --k) {
      auto ok_cap = [&](int j) { return pp_.mem_ok(k, j, pos) && pp_.time(k, j, pos) <= cap_; };
      auto ok_l = [&](int j) { return pp_.time(k, j, pos) >= l_; };
      const int jmin = [&] {
        int a = k, b = pos - 1;  // ok_cap false..true over j (stage k starts at >= k)
        while (a < b) {
          const int m = a + (b - a) / 2;
          if (ok_cap(m)) b = m;
          else a = m + 1;
        }
        return a;
      }();
      int jmax = pos - 1;
      if (l_ != -kInf) {  // ok_l true..false over j
        int a = k, b = pos - 1;
        if (!ok_l(k)) throw InternalError("solve_fast: reconstruction found no start");
        while (a < b) {
          const int m = a + (b - a + 1) / 2;
          if (ok_l(m)) a = m;
          else b = m - 1;
        }
        jmax = a;
      }
      // Largest element of sets_[k] in [jmin, jmax].
      int found = -1;
      for (auto it = sets_[k].rbegin(); it != sets_[k].rend(); ++it) {
        if (it->lo > jmax) continue;
        const int c = std::min(it->hi, jmax);
        if (c >= jmin) found = c;
        break;
      }
      if (found < 0) throw InternalError("solve_fast: reconstruction found no start for stage " + std::to_string(k));
      (*starts)[k] = found;
      pos = found;
    }
  }

  double max_time(const std::vector<int>& st) const {
    double m = -kInf;
    for (int k = 0; k < pp_.S; ++k) m = std::max(m, pp_.time(k, st[k], k + 1 < pp_.S ? st[k + 1] : pp_.U));
    return m;
  }
  double min_time(const std::vector<int>& st) const {
    double m = kInf;
    for (int k = 0; k < pp_.S; ++k) m = std::min(m, pp_.time(k, st[k], k + 1 < pp_.S ? st[k + 1] : pp_.U));
    return m;
  }

  const BalanceProblem& problem_;
  const detail::Prepared& pp_;
  std::vector<UnitMaxima> row_max_;
  std::vector<const UnitMaxima*> stage_max_;
  std::vector<int64_t> m_, mb1_, mb2_;
  double x_ = 0.0;
  std::vector<IntervalSet> sets_;
  double l_ = -kInf, cap_ = kInf, next_above_cap_ = kInf, prev_below_l_ = -kInf;
  int r_hint_ = 0, lo_hint_ = 0;
};

}  // namespace

Partition solve_fast(const BalanceProblem& problem, const std::vector<int>& order) {
  validate_problem(problem);
  if (!uniform_transfers(problem))
    throw UserError("the fast solver needs the same transfer time at every unit boundary (equal activation_bytes); "
                    "use the dp solver for per-boundary activation sizes");
  const detail::Prepared pp = detail::prepare(problem, order);
  FastSolver solver(problem, pp);
  return solver.solve();
}

}  // namespace ppb::balance
