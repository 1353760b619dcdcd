// The serving simulator (the model is described in pipeline_sim.h).
#include "serving/pipeline_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <string>

#include "common/error.h"

namespace ppb::serving {

StepShape step_shape(const Step& step) {
  StepShape s;
  double context_sum = 0.0;
  for (const BatchRow& r : step.rows) {
    ++s.rows;
    if (r.prefill) {
      ++s.prefill_rows;
      s.prefill_tokens += r.tokens;
    } else {
      ++s.decode_rows;
      context_sum += r.position;
    }
    const double t = r.tokens, p = r.position;
    if (r.tokens == 1)
      s.decode_keys += p + 1.0;
    else
      s.prefill_keys += t * p + t * (t + 1.0) / 2.0;
  }
  s.decode_context_mean = s.decode_rows > 0 ? context_sum / s.decode_rows : 0.0;
  s.tokens = s.prefill_tokens + s.decode_rows;
  return s;
}

std::vector<Request> scale_arrivals(const std::vector<Request>& unit_rate, double rate) {
  if (!(rate > 0.0) || !std::isfinite(rate))
    throw InternalError("scale_arrivals: rate " + std::to_string(rate) + " is not finite and > 0");
  std::vector<Request> out = unit_rate;
  for (Request& r : out) r.arrival_s /= rate;
  return out;
}

namespace {

/// An event of the simulation: group g's step is ready at resource `hop` (kind hop), its tokens
/// are out (kind done), or the group forms its next step (kind form), at time t (s).
struct Event {
  enum Kind { form, hop, done };
  double t = 0.0;
  long long seq = 0;  ///< insertion order: equal times are served in the order they became ready
  Kind kind = form;
  int group = 0;
  int hop_index = 0;  ///< resource: 2k = compute of stage k, 2k + 1 = link k (overlap only)
};

struct Later {
  bool operator()(const Event& a, const Event& b) const {
    return a.t != b.t ? a.t > b.t : a.seq > b.seq;
  }
};

/// One step's cost at each resource (s), in the order it crosses them, and the last stage's
/// compute alone (its tokens are out then, before its send where the send holds the same lane).
struct StepCosts {
  std::vector<double> hop_s;
  std::vector<double> compute_s;  ///< [S] each stage's compute alone (without --no-overlap's send)
  double last_compute_s = 0.0;
  int kind = 0;  ///< 0: the step has prefill rows, 1: decode-only (StageContention::alone_share's index)
};

/// `scale` [S][kind] (empty: 1) multiplies each stage's compute: the contention model's factor.
StepCosts step_costs(const StepCostModel& costs, const StepShape& shape, bool overlap,
                     const std::vector<std::array<double, 2>>& scale) {
  const int S = costs.stages();
  StepCosts out;
  out.kind = shape.prefill_rows > 0 ? 0 : 1;
  std::vector<double>& c = out.hop_s;
  c.reserve(2 * static_cast<std::size_t>(S));
  auto checked = [](double ms, const char* what, int k) {
    if (!(ms >= 0.0) || !std::isfinite(ms))
      throw InternalError(std::string("serving simulator: the step's ") + what + " of stage " + std::to_string(k) +
                          " is " + std::to_string(ms) + " ms (must be finite and >= 0)");
    return ms * 1e-3;
  };
  for (int k = 0; k < S; ++k) {
    double compute = checked(costs.compute_ms(k, shape), "compute", k);
    if (!scale.empty()) compute *= scale[static_cast<std::size_t>(k)][static_cast<std::size_t>(out.kind)];
    const double send = S > 1 ? checked(costs.transfer_ms(k, shape), "transfer", k) : 0.0;
    out.compute_s.push_back(compute);
    if (overlap) {
      c.push_back(compute);
      if (S > 1) c.push_back(send);
    } else {
      c.push_back(compute + send);
    }
    out.last_compute_s = compute;
  }
  return out;
}

/// A stage's compute of one step on the simulated clock (s).
struct Busy {
  double start = 0.0, end = 0.0;
  int kind = 0;
};

/// The simulation's state and its event loop.
class ServingSim {
 public:
  /// `scale` [S][kind] or empty: each stage's compute factor (contention); `record_busy`: keep
  /// every stage's compute intervals (busy()).
  ServingSim(const std::vector<Request>& requests, const StepCostModel& costs, const PipelineSimConfig& config,
             std::vector<std::array<double, 2>> scale = {}, bool record_busy = false)
      : sched_(requests, config.scheduler), costs_(costs), overlap_(config.overlap), record_shapes_(config.record_shapes),
        scale_(std::move(scale)), record_busy_(record_busy) {
    const int S = costs.stages();
    if (S < 1) throw InternalError("serving simulator: the cost model has no stage");
    hops_ = overlap_ && S > 1 ? 2 * S : S;
    last_compute_ = overlap_ && S > 1 ? 2 * (S - 1) : S - 1;
    free_at_.assign(static_cast<std::size_t>(hops_), 0.0);
    result_.stage_busy_s.assign(static_cast<std::size_t>(S), 0.0);
    group_costs_.resize(static_cast<std::size_t>(config.scheduler.groups));
    form_at_.assign(static_cast<std::size_t>(config.scheduler.groups), kNever);
    if (record_busy_) busy_.resize(static_cast<std::size_t>(S));
  }

  /// [S] each stage's compute intervals in time order (with record_busy; after run()).
  const std::vector<std::vector<Busy>>& busy() const { return busy_; }

  PipelineSimResult run() {
    for (int g = 0; g < static_cast<int>(group_costs_.size()); ++g) push_form(g, 0.0);
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      if (e.kind == Event::form) form(e.group, e.t);
      else if (e.kind == Event::hop) hop(e);
      else sched_.complete_step(e.group, e.t);
    }
    if (!sched_.finished())
      throw InternalError("serving simulator: the events ran out before every request finished");
    result_.times = sched_.times();
    return std::move(result_);
  }

 private:
  void push(double t, Event::Kind kind, int g, int hop_index) {
    events_.push(Event{t, seq_++, kind, g, hop_index});
  }

  /// Group g forms its next step at t, unless it is to form earlier already (one pending form
  /// per group: form_at_; a later one left in the queue is stale and skipped).
  void push_form(int g, double t) {
    if (t >= form_at_[g]) return;
    form_at_[g] = t;
    push(t, Event::form, g, 0);
  }

  void form(int g, double t) {
    if (t != form_at_[g]) return;  // stale: an earlier form replaced it
    form_at_[g] = kNever;
    if (sched_.in_flight(g)) return;
    const Step& step = sched_.next_step(g, t);
    if (step.rows.empty()) {
      // Idle until the next arrival; one that has arrived already found no slot or block free
      // (the batch queue: all held by steps in flight): the next return offers it one (hop).
      const double next = sched_.next_arrival_s();
      if (std::isfinite(next) && next > t) push_form(g, next);
      return;
    }
    ++result_.steps;
    const StepShape shape = step_shape(step);
    if (shape.decode_rows > 0) {
      ++result_.decode_steps;
      result_.decode_rows += shape.decode_rows;
    }
    if (record_shapes_) result_.shapes.push_back(shape);
    group_costs_[g] = step_costs(costs_, shape, overlap_, scale_);
    push(t, Event::hop, g, 0);
  }

  void hop(const Event& e) {
    const int j = e.hop_index;
    const double cost = group_costs_[e.group].hop_s[j];
    const double start = std::max(e.t, free_at_[j]);
    const double end = start + cost;
    free_at_[j] = end;
    const bool compute = !(overlap_ && hops_ > 1) || j % 2 == 0;
    if (compute) {
      const int k = overlap_ && hops_ > 1 ? j / 2 : j;
      result_.stage_busy_s[static_cast<std::size_t>(k)] += cost;
      // The compute alone: with --no-overlap the send that follows it on the lane moves no weights.
      const double c = group_costs_[e.group].compute_s[static_cast<std::size_t>(k)];
      if (record_busy_ && c > 0.0) busy_[static_cast<std::size_t>(k)].push_back({start, start + c, group_costs_[e.group].kind});
    }
    if (j == last_compute_) {
      const double out = start + group_costs_[e.group].last_compute_s;  // = end with overlap
      push(out, Event::done, e.group, j);
      result_.end_s = std::max(result_.end_s, out);
    }
    if (j + 1 < hops_) {
      push(end, Event::hop, e.group, j + 1);
      return;
    }
    // The token is back at stage 0: the group forms its next step, and, as the engine's stage 0
    // offers every idle group a step after each return, so do the others not in flight (a
    // finished request freed a --max-concurrency permit; with the batch queue, its requests are
    // free for any batch).
    push_form(e.group, end);
    for (int g = 0; g < static_cast<int>(form_at_.size()); ++g)
      if (g != e.group && !sched_.in_flight(g)) push_form(g, end);
  }

  Scheduler sched_;
  const StepCostModel& costs_;
  bool overlap_ = true;
  bool record_shapes_ = false;
  std::vector<std::array<double, 2>> scale_;  ///< [S][kind] or empty
  bool record_busy_ = false;
  std::vector<std::vector<Busy>> busy_;       ///< [S] with record_busy_
  int hops_ = 1, last_compute_ = 0;
  std::vector<double> free_at_;                  ///< [hops] when each resource is free (s)
  std::vector<StepCosts> group_costs_;  ///< [M] the costs of each group's step in flight
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<double> form_at_;         ///< [M] when each group's pending form is (kNever: none)
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  long long seq_ = 0;
  PipelineSimResult result_;
};

/// Per stage and kind, the share of its compute that another stage of its machine overlaps
/// (`machine` [S]), from the play's intervals (each stage's in time order); -1 where the stage
/// computed nothing of that kind.
std::vector<std::array<double, 2>> overlap_shares(const std::vector<std::vector<Busy>>& busy, const std::vector<int>& machine) {
  const std::size_t S = busy.size();
  std::vector<std::array<double, 2>> out(S, {-1.0, -1.0});
  for (std::size_t k = 0; k < S; ++k) {
    // The union of the other stages' compute on k's machine, merged into disjoint intervals.
    std::vector<std::pair<double, double>> others;
    for (std::size_t j = 0; j < S; ++j)
      if (j != k && machine[j] == machine[k])
        for (const Busy& b : busy[j]) others.emplace_back(b.start, b.end);
    std::sort(others.begin(), others.end());
    std::vector<std::pair<double, double>> merged;
    for (const auto& iv : others) {
      if (!merged.empty() && iv.first <= merged.back().second) merged.back().second = std::max(merged.back().second, iv.second);
      else merged.push_back(iv);
    }
    std::array<double, 2> total{0.0, 0.0}, shared{0.0, 0.0};
    std::size_t m = 0;
    for (const Busy& b : busy[k]) {  // k's intervals ascend, as the merged ones do
      while (m < merged.size() && merged[m].second <= b.start) ++m;
      double o = 0.0;
      for (std::size_t i = m; i < merged.size() && merged[i].first < b.end; ++i)
        o += std::min(b.end, merged[i].second) - std::max(b.start, merged[i].first);
      total[static_cast<std::size_t>(b.kind)] += b.end - b.start;
      shared[static_cast<std::size_t>(b.kind)] += o;
    }
    for (std::size_t q = 0; q < 2; ++q)
      if (total[q] > 0.0) out[k][q] = std::clamp(shared[q] / total[q], 0.0, 1.0);
  }
  return out;
}

}  // namespace

PipelineSimResult simulate_serving(const std::vector<Request>& requests, const StepCostModel& costs,
                                   const PipelineSimConfig& config) {
  const std::vector<StageContention> c = costs.contention();
  const std::size_t S = static_cast<std::size_t>(std::max(costs.stages(), 0));
  if (!c.empty() && c.size() != S)
    throw InternalError("serving simulator: the cost model's contention has " + std::to_string(c.size()) + " stages, not " +
                        std::to_string(S));
  bool contended = false;  // some stage with an alone share != 1
  std::vector<int> machine(S, 0);
  for (std::size_t k = 0; k < c.size(); ++k) {
    machine[k] = c[k].machine;
    for (double a : c[k].alone_share)
      if (!(a > 0.0) || !std::isfinite(a))
        throw InternalError("serving simulator: stage " + std::to_string(k) + "'s alone share is " + std::to_string(a) +
                            " (must be finite and > 0)");
  }
  for (const StageContention& s : c) contended = contended || s.alone_share[0] != 1.0 || s.alone_share[1] != 1.0;
  if (!contended) return ServingSim(requests, costs, config).run();

  // balance/contention.h's fixed point on the serving play: f from 1 (the together times), each
  // play's own overlap fed back, damped by half after the first (which takes the together play's
  // overlap whole: most plays' overlap moves little with f, so the fixed point is near it). A
  // stage alone on its machine has f = 0 (its alone times), a twin's f = 1, from the start.
  std::vector<std::array<double, 2>> f(S, {1.0, 1.0});
  std::vector<char> fixed(S, 0);
  for (std::size_t k = 0; k < S; ++k) {
    bool lonely = true;
    for (std::size_t j = 0; j < S; ++j) lonely = lonely && (j == k || machine[j] != machine[k]);
    if (lonely && !c[k].always_overlapped) f[k] = {0.0, 0.0};
    fixed[k] = lonely || c[k].always_overlapped;
  }
  PipelineSimResult out, best;  // the last play, and the one nearest its own overlap
  double best_moved = std::numeric_limits<double>::infinity();
  for (int play = 1;; ++play) {
    std::vector<std::array<double, 2>> scale(S);
    for (std::size_t k = 0; k < S; ++k)
      for (std::size_t q = 0; q < 2; ++q) scale[k][q] = c[k].alone_share[q] + (1.0 - c[k].alone_share[q]) * f[k][q];
    ServingSim sim(requests, costs, config, std::move(scale), true);
    out = sim.run();
    const std::vector<std::array<double, 2>> seen = overlap_shares(sim.busy(), machine);
    double moved = 0.0;
    std::vector<std::array<double, 2>> next = f;
    for (std::size_t k = 0; k < S; ++k)
      for (std::size_t q = 0; q < 2; ++q) {
        if (fixed[k] || seen[k][q] < 0.0) continue;  // f = 0 or 1, or nothing of that kind to see
        moved = std::max(moved, std::abs(seen[k][q] - f[k][q]));
        next[k][q] = play == 1 ? seen[k][q] : 0.5 * (f[k][q] + seen[k][q]);
      }
    out.overlap = f;
    for (std::size_t k = 0; k < S; ++k)  // a kind the stage never computed: no share to report
      for (std::size_t q = 0; q < 2; ++q)
        if (seen[k][q] < 0.0) out.overlap[k][q] = std::numeric_limits<double>::quiet_NaN();
    out.contention_plays = play;
    out.contention_converged = moved < kOverlapTolerance;
    if (out.contention_converged) return out;
    if (moved < best_moved) {
      best_moved = moved;
      best = out;
    }
    if (play >= kMaxContentionPlays) {  // a batching that jumps with f: no settled play
      best.contention_plays = play;
      return best;
    }
    f = std::move(next);
  }
}

}  // namespace ppb::serving
