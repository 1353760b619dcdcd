// The serving simulator (issue 38, offline part): requests that arrive, played through the
// continuous-batching scheduler (scheduler.h) and S pipeline stages, with step costs from a
// model (a profile: balance/serving_step_model.h; fixed costs in the tests). Pure: no MPI, no
// device, no profile format here.
//
// The model (an event-driven simulation; times in seconds on the scenario's clock):
//  - A group forms its next step (Scheduler::next_step) when its previous step's tokens are back
//    at stage 0: at t = 0 for every group, then at the end of the token return of its previous
//    step (one stage: at the end of the step itself), as a vLLM virtual engine schedules its next
//    step when its previous output arrives. A group with nothing to run (no running request,
//    nothing arrived) waits for the next arrival (Scheduler::next_arrival_s) and forms again
//    then; once no request is left to admit, it stops.
//  - Each group has at most one step in flight (the scheduler's rule). A step crosses the
//    resources compute 0, link 0, compute 1, link 1, ..., compute S-1, link S-1 in that order,
//    where link k carries stage k's output to stage k+1 and link S-1 is the token return to
//    stage 0 (with one stage there is no link at all). Each resource serves the items ready at it
//    one at a time, in order of their ready time (FIFO; equal times in the order they became
//    ready): an item starts at max(ready, resource free) and holds it for its cost. This is the
//    closed simulator's lane model (balance/simulator.h) with overlap: a stage's sends run on
//    their own lane beside its compute, one transfer at a time; unlike it, a transfer here does
//    not wait for the receiver's recv to be posted (eager), and there is no double-buffer limit
//    (at most M items are in flight); on a closed batch it gives exactly the closed simulator's
//    token times with eager sends (tested). With overlap = false (--no-overlap) a stage's send holds
//    its compute resource after its compute (compute + send on one lane), and there are no links.
//  - The step's tokens are out at the end of the last stage's compute: Scheduler::complete_step
//    there (first token of a prefilled request, one more of each decoding one).
//  - Costs are asked per step and stage from a StepCostModel, as functions of the step's
//    StepShape (its prefill tokens, decode rows and their contexts).
//  - Stages of one machine share its memory bandwidth (balance/contention.h's model, where the
//    cost model gives StepCostModel::contention): compute_ms is the step's time with the
//    machine's other stages computing all through it (the profile's together pass); a step of
//    stage k overlapped for a share f of its time by another stage of its machine costs
//    compute_ms x (a + (1 - a) f), a = the stage's alone / together time for the step's kind
//    (with prefill rows, decode-only). f per stage and kind is the share of the stage's compute
//    of that kind overlapped in the play itself: a fixed point, f <- (f + f(play(f))) / 2 as the
//    closed simulator's, from f = f(play(1)) (the together play's overlap) rather than 1 (a
//    serving play's load decides how often the stages compute at once: at a light load hardly
//    ever). As there, a stage alone on its machine runs at its alone times (f = 0), a stage whose
//    twin always computes beside it (StageContention::always_overlapped) at its together times.
// Not modelled: chunked prefill and token budgets, preemption, KV-block limits (the scheduler
// has none), jitter.
#pragma once

#include <array>
#include <vector>

#include "serving/arrivals.h"
#include "serving/request_metrics.h"
#include "serving/scheduler.h"

namespace ppb::serving {

/// What a step asks of the stages: a summary of its ragged batch (Step::rows).
struct StepShape {
  int rows = 0;                    ///< requests in the step
  int prefill_rows = 0;            ///< rows prefilled whole in this step
  long long prefill_tokens = 0;    ///< sum of their prompt lengths (tokens)
  int decode_rows = 0;             ///< rows decoding one token
  /// Mean over the decode rows of their position (the KV-cache entries each attends to before
  /// its new token: prompt_len + tokens out - 1); 0 without decode rows.
  double decode_context_mean = 0.0;
  long long tokens = 0;            ///< prefill_tokens + decode_rows: tokens the stages process
  /// KV-cache keys the step's attention reads (stepcost/step_model.h step_work): a row of t > 1
  /// tokens at position p attends t·p + t(t+1)/2 (prefill_keys), a row of one token at p
  /// attends p + 1 (decode_keys; a one-token prompt counts here too).
  double prefill_keys = 0.0, decode_keys = 0.0;
};

/// The shape of `step` (its rows' tokens, kinds and positions).
StepShape step_shape(const Step& step);

/// How a stage shares its machine's memory bandwidth with the machine's other stages (the file
/// comment's contention; balance/contention.h).
struct StageContention {
  int machine = 0;  ///< stages with equal values slow each other
  /// [with prefill rows, decode-only]: the stage's step time with its machine's other stages
  /// waiting over its time with them computing all through it (compute_ms), > 0; 1: no contention
  std::array<double, 2> alone_share{1.0, 1.0};
  bool always_overlapped = false;  ///< a twin (another replica's stage) computes whenever it does: f = 1
};

/// Per-stage costs of a step, in ms. Implementations: balance::ProfileStepCosts (from a
/// results file's profile), fixed costs in tests.
class StepCostModel {
 public:
  virtual ~StepCostModel() = default;
  /// S >= 1.
  virtual int stages() const = 0;
  /// Compute of stage k (0..S-1) for a step of shape `s`, ms >= 0.
  virtual double compute_ms(int k, const StepShape& s) const = 0;
  /// Transfer of stage k's output of that step to stage k + 1 (k = S-1: the token return to
  /// stage 0), ms >= 0; not asked with one stage.
  virtual double transfer_ms(int k, const StepShape& s) const = 0;
  /// [S] how each stage shares its machine (StageContention), or empty (the default): no stage
  /// slows another, compute_ms as it is. A model scaled to measured steps (which ran at their own
  /// overlap) gives none.
  virtual std::vector<StageContention> contention() const { return {}; }
};

struct PipelineSimConfig {
  SchedulerConfig scheduler;  ///< M groups, B slots, the step policy
  bool overlap = true;        ///< false: a stage's send holds its compute lane (--no-overlap)
  bool record_shapes = false; ///< keep every step's shape (PipelineSimResult::shapes)
};

struct PipelineSimResult {
  std::vector<RequestTimes> times;   ///< [N] every request's times (all finished)
  long long steps = 0;               ///< steps run (with rows), all groups
  long long decode_steps = 0;        ///< steps with at least one decode row
  long long decode_rows = 0;         ///< decode rows over all steps (sum of gen_len - 1)
  std::vector<double> stage_busy_s;  ///< [S] seconds each stage's compute resource was held
  double end_s = 0.0;                ///< the last token out
  /// Every step's shape in the order formed, all groups (only with config.record_shapes).
  std::vector<StepShape> shapes;
  /// [S] (with prefill rows, decode-only): the share f of each stage's compute of that kind
  /// overlapped by another stage of its machine, at the contention fixed point the play was made
  /// at (NaN for a kind the stage never computed); empty where the cost model gives no contention
  /// (every alone share 1)
  std::vector<std::array<double, 2>> overlap;
  int contention_plays = 0;     ///< plays of the fixed point (0: no contention model)
  /// Every f within kOverlapTolerance of the play's own overlap. False: none of the
  /// kMaxContentionPlays settled (a step's batching jumps as f moves, so the map has no fixed
  /// point to that tolerance: the plays circle it within about 0.01) and this is the play whose
  /// own overlap came nearest its f.
  bool contention_converged = true;
};

/// The contention fixed point's tolerance on f and its most plays (simulate_serving).
inline constexpr double kOverlapTolerance = 1e-3;
inline constexpr int kMaxContentionPlays = 12;

/// Plays `requests` (arrival order not required; the scheduler sorts FCFS) through the model
/// above. Cost O(steps x (S + B) x log M) time per play, O(N x mean gen_len) memory (each token's
/// time); with contention (an alone share != 1) up to kMaxContentionPlays plays, the settled one
/// returned, or the nearest to settling (contention_converged says which).
/// @throws ppb::UserError from the scheduler (M or B < 1: naming -M/--microbatches, -b/--batch;
///         a request with a length < 1 or a bad arrival); ppb::InternalError when the model has
///         no stage, a cost is negative or not finite, a contention list is not [S] or an alone
///         share not finite and > 0, or a request never finishes (a bug).
PipelineSimResult simulate_serving(const std::vector<Request>& requests, const StepCostModel& costs,
                                   const PipelineSimConfig& config);

/// The requests with every arrival divided by `rate` (> 0, finite): unit-rate arrivals (those of
/// ArrivalSpec{request_rate = 1}) become the arrivals at `rate`. Gamma(K, 1/(R K)) = Gamma(K, 1/K)
/// / R (the scale property), and the rescale to N / R scales alike, so this equals
/// generate_requests at `rate` with the same seed up to rounding (tested); lengths unchanged.
/// @throws ppb::InternalError for a rate that is not finite and > 0.
std::vector<Request> scale_arrivals(const std::vector<Request>& unit_rate, double rate);

}  // namespace ppb::serving
