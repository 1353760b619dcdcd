// The step-cost model of one unit (issue 47): how long a unit takes for a step of any shape the
// run will execute, fitted to forwards the profile timed over a grid of shapes on this rank.
//
// A step, as one unit sees it (StepWork): T token rows through its matrices, R rows (requests),
// and the KV-cache keys its attention reads — a prefill row of t tokens at cached position p
// attends t·p + t(t+1)/2 keys (its tokens' causal windows), a decode row (t = 1) at position p
// attends p + 1. The model:
//
//   ms(step) = g(x) + a_pre · prefill_keys + a_dec · decode_keys,   x = T (R for the head)
//
// - g is piecewise linear between knots x_0 < x_1 < ... (Splitwise's piecewise-linear fit in
//   batch tokens; Vidur interpolates operator profiles over token counts likewise): knots at
//   every count up to 16 (a small-M kernel's cost goes by its register blocks, not linearly:
//   kEveryTokenKnotsUpTo), at the powers of two and one past each from 16 on (a GEMM kernel
//   changes regime at a power of two: the CPU backend's own small-M kernel ends at 16 rows,
//   cpu_gemm.h kSmallM, and OpenBLAS's packing starts at 17), and at the workload's largest
//   step. Below x_0: g(x_0);
//   above the last knot: the last segment's slope (>= 0).
// - The head's x is its rows, and it has no attention terms: it computes logits once per row
//   whatever the row's tokens; g(R) is the mean of every fitted sample of R rows.
// - a_dec (ms per key) is the least-squares slope of steps of one-token rows of equal count at
//   several contexts (the knot step of B such rows at position 0 and the context steps); a_pre
//   the pooled least-squares slope of steps of equal T whose tokens are split into different
//   rows (one row of t tokens against r rows of t/r: the same GEMMs, r times the keys). Both
//   >= 0 (a negative slope is noise).
// - g(x_i) is the mean over the knot samples at x_i of the measured time less the two
//   attention terms (the context and attention samples fit the slopes only).
// Held-out samples (timed, not fitted: steps between the knots, split into other rows, a prompt of
// 3 tokens in one row among the every-count knots, a mixed
// prefill+decode step, a decode of half the rows) measure the model's interpolation error,
// which every prediction from it carries (held_out_errors).
//
// Pure C++: no device, MPI or HDF5. The grid's steps are lists of rows (GridStep); the profiler
// runs them as ragged forwards (backend/stage.h RaggedStep).
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace ppb::stepcost {

/// One step's demand on a unit (see the file comment).
struct StepWork {
  double tokens = 0.0;        ///< T: token rows through the unit's matrices
  double rows = 0.0;          ///< R: requests in the step
  double prefill_keys = 0.0;  ///< keys attended by rows of more than one token
  double decode_keys = 0.0;   ///< keys attended by rows of one token
};

/// The StepWork of a step of rows with `pos[i]` tokens cached and `tokens[i]` >= 1 new ones.
/// A row of one token counts as a decode (its keys in decode_keys).
/// @throws ppb::InternalError where the lists differ in length or a row has tokens < 1 or pos < 0.
StepWork step_work(const std::vector<int>& pos, const std::vector<int>& tokens);

/// The role of a timed step in the fit.
enum class Role { knot, context, attention, held_out };
const char* role_name(Role r);

/// One step of the profile's grid: rows (slots 0..rows-1 of one KV cache), each at pos[i]
/// with tokens[i] new tokens.
struct GridStep {
  std::vector<int> pos, tokens;
  Role role = Role::knot;
  StepWork work() const { return step_work(pos, tokens); }
};

/// What the grid must cover: B rows at most, steps of at most max_tokens tokens, positions
/// below max_context (P + G), and the decode contexts to time B rows at.
struct GridSpec {
  int max_rows = 1;              ///< B (>= 1)
  int max_tokens = 1;            ///< the largest step's tokens (>= 1; at most B · max_context)
  int max_context = 1;           ///< positions per KV-cache row (>= 1)
  std::vector<int> contexts;     ///< decode contexts (each < max_context)
};

/// Every token count up to this is a knot. A small-M kernel runs its rows in register blocks
/// (the CPU backend's: passes of 4, then 2, then 1 rows, cpu_small_m_kernel.inc), so its cost
/// is not linear between powers of two: 3 rows take two passes over the weights and cost more
/// than 4 (Qwen3-0.6B, 2 ranks of an AMD EPYC VM: decode steps of 3 rows measured 1.10x the
/// model interpolated between the knots at 2 and 4, those of 2 and 4 rows 1.02x and 0.92-0.95x;
/// docs/MEASUREMENTS.md § 2026-12-06 every row count a knot). The head goes by rows, so this also
/// samples it at every row count up to B.
inline constexpr int kEveryTokenKnotsUpTo = 16;

/// The knots of g: every count up to kEveryTokenKnotsUpTo, then the powers of two and one past
/// each, B, and max_tokens, all <= max_tokens.
std::vector<int> knot_tokens(const GridSpec& spec);

/// The grid the profiler times for every unit (file comment): a knot step per knot_tokens
/// value (min(B, T) rows at position 0, T split evenly), B decode rows at each context, one
/// row of the largest prompt that fits and one of half of it (attention), and held-out steps.
/// The same grid on every rank for the same spec (the profile's together pass aligns them).
/// @throws ppb::InternalError on a spec outside its documented ranges.
std::vector<GridStep> plan_grid(const GridSpec& spec);

/// One timed step of a unit.
struct Sample {
  StepWork work;
  double ms = 0.0;  ///< the median of its timed forwards
  Role role = Role::knot;
};

/// One unit's fitted model (file comment).
struct UnitModel {
  bool by_rows = false;           ///< x is R (the head) instead of T
  std::vector<double> knots;      ///< [K] ascending x
  std::vector<double> base_ms;    ///< [K] g at each knot
  double prefill_key_ms = 0.0;    ///< a_pre, ms per key
  double decode_key_ms = 0.0;     ///< a_dec, ms per key
  /// The model's time of a step (ms, >= 0). An empty model (no knots) gives 0.
  double ms(const StepWork& w) const;
};

/// Fits a unit's model to its samples (held-out ones ignored).
/// @throws ppb::InternalError where no knot sample is given.
UnitModel fit_unit(const std::vector<Sample>& samples, bool by_rows);

/// model / measured - 1 at every held-out sample, in sample order.
std::vector<double> held_out_errors(const UnitModel& model, const std::vector<Sample>& samples);

/// A fitted model's level against the profile's cycles on the same rank (issue 47): the cycles
/// time B rows of their own shapes many times over the profile's span, the grid its shapes in a
/// few seconds, and on a shared machine the two windows run at different speeds (on this
/// project's VMs the cycles' decode 0.76-1.21x the grid's model of the same shapes,
/// docs/MEASUREMENTS.md § 2026-12-06 the grid's level against the cycles').
struct Level {
  double decode = 1.0;   ///< Σ cycles' decode / Σ model's, over every unit and profiled context
  double prefill = 1.0;  ///< Σ cycles' prefill / Σ model's, over every unit
};
/// The Level of `models` [signatures] (unit u's model models[unit_signature[u]]) against
/// `prefill_ms` [U] (a step of B prompts of P tokens at position 0) and `decode_ms` [U][C] (B
/// rows of one token at contexts[c]). 1 for a kind whose sums are not both positive and finite.
/// @throws ppb::InternalError where the arrays disagree with unit_signature and contexts.
Level level_against(const std::vector<UnitModel>& models, const std::vector<int>& unit_signature, int B, int P,
                    const std::vector<int>& contexts, const std::vector<double>& prefill_ms,
                    const std::vector<double>& decode_ms);

/// The weight of the cycles' level in the level the predictions take (pooled_level): the two
/// windows' levels weigh alike (their geometric mean). Over 26 (run, rank) pairs of 13 serving
/// runs, the rounds' decode level against the grid's model missed by |log| 9.8% on average, against
/// the pooled level 7.6% (docs/MEASUREMENTS.md § 2026-12-06 the grid's level against the cycles').
inline constexpr double kCyclesLevelWeight = 0.5;

/// The factor the predictions scale a model of Level `l` by for a step with (`prefill`) or
/// without prefill rows: l.prefill or l.decode to the power kCyclesLevelWeight.
double pooled_level(const Level& l, bool prefill);

/// A grid is disturbed where its held-out steps miss the fit by more than this (p50, whole model,
/// any rank; the profile times such a grid again, run/profile_phase.cpp): undisturbed grids of
/// Qwen3-0.6B held out 0.4-0.5% here, grids with slow stretches of the machine in them 8-14%
/// (docs/MEASUREMENTS.md § "2026-12-06 slow windows, the rate band and a public trace replayed").
inline constexpr double kGridDisturbedError = 0.03;

/// A forward's fixed cost (issue 47): each unit is profiled as a one-unit stage, so each of its
/// timings carries once what a forward costs whatever its units (the launch of a CUDA graph, the
/// lane's events and hand-offs), and a stage of n units pays it once, not n times. With F that
/// cost, a stage of n units costs the sum of its units' timings less (n - 1)·F
/// (stage_fixed_correction_ms). The profile measures F on each rank as 2·t(one unit) -
/// t(two units of its signature in one stage), both timed at the same shape, in pairs of
/// alternating order, kFixedCostPairs in each of kFixedCostWindows windows (before and after the
/// step model's grid, ~5-10 s apart).
struct FixedCost {
  int pairs = 0;        ///< pairs timed (all windows)
  double ms = 0.0;      ///< the median over the pairs of 2·t1 - t2 (ms); 0 without pairs
  double lo_ms = 0.0;   ///< the smallest pair's 2·t1 - t2
  double hi_ms = 0.0;   ///< the largest pair's
  double one_ms = 0.0;  ///< the median of the pairs' t1 (ms)
  /// Whether the predictions take it: kMinPairs pairs or more (both windows), every one of one
  /// sign, and |ms| at least kMinShare of a one-unit forward. Why both: on the CPU backend a
  /// stage of n layers measures n layers apart within 0.97-1.02x (n = 2 .. 15, one process:
  /// docs/MEASUREMENTS.md § 2026-12-05 step-cost model), yet of 28 (rank, kind) sets of 9 pairs in
  /// 7 profiles of two ranks, 4 came out all of one sign, at 6-18% of a layer (§ 2026-12-07 a
  /// forward's fixed cost): the machine's speed holds for a second or two, so the pairs of one
  /// window are not independent and a sign test on them is not one. Two windows seconds apart
  /// must agree, and (n - 1) times a share under 10% of a unit is not taken. A CUDA graph's
  /// launch, ~10 us against ~25-35 us of a layer's decode (docs/GPU.md), is 25-40% of it.
  bool taken() const {
    return pairs >= kMinPairs && (lo_ms > 0.0 || hi_ms < 0.0) && std::abs(ms) >= kMinShare * one_ms;
  }
  /// The F the predictions take (ms): ms where taken(), else 0.
  double applied_ms() const { return taken() ? ms : 0.0; }
  static constexpr int kMinPairs = 18;
  static constexpr double kMinShare = 0.10;
};
/// Pairs the profile times per window and kind of step (prefill, decode), its windows, and the
/// pairs it stores per rank and kind (the results file's [R][2][kFixedCostSamples]).
inline constexpr int kFixedCostPairs = 9;
inline constexpr int kFixedCostWindows = 2;
inline constexpr int kFixedCostSamples = kFixedCostPairs * kFixedCostWindows;
static_assert(kFixedCostSamples == FixedCost::kMinPairs);

/// The FixedCost of pairs (one_ms[i], two_ms[i]): t1 a one-unit stage's forward, t2 a two-unit
/// stage's at the same shape (ms). @throws ppb::InternalError where the lists differ in length.
FixedCost fixed_cost_of(const std::vector<double>& one_ms, const std::vector<double>& two_ms);

/// What a stage of `units` (>= 1) units adds to the sum of its units' one-unit timings for a
/// forward fixed cost of `f` ms: -(units - 1)·f.
inline double stage_fixed_correction_ms(int units, double f) { return -(units > 1 ? units - 1 : 0) * f; }

/// A grid in flat arrays (the results file's /profile/step_model): rows[n] rows of step n, the
/// rows' positions and tokens of all steps in order, role[n] as an int (Role's order).
struct FlatGrid {
  std::vector<int> rows, pos, tokens, role;
};
FlatGrid flatten(const std::vector<GridStep>& grid);
/// @throws ppb::UserError (naming /profile/step_model) where the arrays disagree in length or a
///         role is unknown.
std::vector<GridStep> unflatten(const FlatGrid& flat);

/// The samples of `grid` timed as ms[0..N-1] (one unit's row of the profile's table).
std::vector<Sample> samples_of(const std::vector<GridStep>& grid, const double* ms);

/// Every (rank, signature) of a profile's grid table fitted, with its held-out errors.
struct GridFit {
  std::vector<UnitModel> models;              ///< [R][S]
  std::vector<std::vector<double>> held_out;  ///< [R][S] held_out_errors of each
  /// The median and the largest |held-out error| of the whole model per rank (each held-out
  /// step's sum over the signatures x their units, modelled against measured): the error a
  /// prediction of a stage carries, where a tiny unit's relative noise (an embedding's few
  /// microseconds) weighs by its time. Without `units` counts: over every (rank, signature).
  /// 0 without held-out steps.
  double abs_error_p50 = 0.0, abs_error_max = 0.0;
};
/// Fits ms [R][S][N] (N = grid.size(), S = by_rows.size()); `units` [S]: units of each
/// signature in the model (empty: the errors per signature).
/// @throws ppb::UserError (naming /profile/step_model) where ms is not a multiple of S·N or
///         units is neither empty nor [S].
GridFit fit_grid(const std::vector<GridStep>& grid, const std::vector<int>& by_rows, const std::vector<double>& ms,
                 const std::vector<int>& units = {});

/// fit_grid of a profile's stored grid (`flat`, unflatten's checks), its errors over the whole
/// model: `unit_signature` [U] each unit's signature (the units counted per signature).
/// @throws what unflatten and fit_grid throw; ppb::UserError on a signature out of range.
GridFit fit_profile_grid(const FlatGrid& flat, const std::vector<int>& by_rows, const std::vector<double>& ms,
                         const std::vector<int>& unit_signature);

}  // namespace ppb::stepcost
