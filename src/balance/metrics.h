// The metrics of DESIGN.md §3, computed from the event timestamps of one partition's benchmark.
// Pure functions: no MPI, no device. Lives in balance/ so that the pipeline simulator
// (balance/simulator.h) scores its simulated timeline with the very same definitions.
#pragma once

#include <cstddef>
#include <vector>

namespace ppb {

/// Shape of an events array: [iters][M][G+1][S][6] seconds on rank 0's clock (NaN = no op).
struct EventShape {
  int iters = 0, groups = 0, steps = 0, stages = 0;
  std::size_t index(int rep, int g, int t, int s, int k) const {
    return ((((static_cast<std::size_t>(rep) * groups + g) * steps + t) * stages + s) * 6) + k;
  }
};

struct PartitionMetrics {
  std::vector<double> rep_wall_s;        ///< [iters] stage 0's first compute start -> last token out
  std::vector<double> rep_tokens_per_s;  ///< [iters] M*B*G / rep_wall_s
  /// [iters] each repetition's decode tokens/s (NaN where a repetition has < 2 decode steps),
  /// and the medians of its TTFTs and TPOTs (ms; TPOT NaN with G = 0)
  std::vector<double> rep_decode_tokens_per_s, rep_ttft_p50_ms, rep_tpot_p50_ms;
  /// harmonic mean of rep_tokens_per_s: M*B*G * iters / the repetitions' total wall time
  double tokens_per_s = 0;
  /// harmonic mean over reps of (M*G - 1)*B / (last - first decode token out): the decode
  /// tokens of every repetition over their total decode time
  double decode_tokens_per_s = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;  ///< stage-0 prefill start -> first token out of the last stage
  double tpot_p50_ms = 0, tpot_p99_ms = 0;  ///< gap between consecutive tokens of one group
  std::vector<double> stage_prefill_ms;  ///< [S] median compute time of a prefill step
  std::vector<double> stage_decode_ms;   ///< [S] median compute time of a decode step
  /// [S] the mean compute time of a prefill step and of a decode step, over the same steps as
  /// the medians: what a stage's throughput follows (the pipeline's rates are total tokens over
  /// total time), and what the simulator reproduces (issue 13: within 0.3% of the measured
  /// decode tokens/s in ten runs of the main job, where the medians gave -8..+10%).
  std::vector<double> stage_prefill_mean_ms, stage_decode_mean_ms;
  std::vector<double> stage_workload_ms; ///< [S] prefill + G * decode: what one group asks of the stage
  std::vector<double> bubble_fraction;   ///< [S] median over reps of 1 - busy compute / rep wall
  std::vector<double> recv_wait_ms;      ///< [S] median time a recv was outstanding (ms)
  double bottleneck_bound_tok_s = 0;     ///< decode steady-state bound (see compute_metrics)
  double pipeline_efficiency = 0;        ///< decode rate / bound over the reps that have both
  int bottleneck_stage = 0;              ///< argmax of stage_workload_ms
};

/// Computes the metrics of one partition.
/// events: [iters][M][G+1][S][6] (recv_start, recv_end, compute_start, compute_end, send_start,
/// send_end) seconds on one clock. batch = B sequences per group, gen_len = G.
/// bottleneck_bound_tok_s = M*B / max(M * max_s d_s, sum_s d_s) per repetition, d_s = stage s's
/// mean decode step in that repetition over the steps decode_tokens_per_s's window spans (all
/// but the stage's first decode step: M*G - 1 intervals between tokens out are M*G - 1
/// services); stored as the harmonic mean over repetitions, as the rates are. The mean, not the
/// median of stage_decode_ms: a stage's throughput is limited by its mean service time. A decode step of a group must
/// cross every stage (sum_s d_s) and each stage serves the M groups one at a time
/// (M * max_s d_s); no schedule beats the larger of the two. It equals B / max_s d_s when
/// M >= S and the stages are balanced (DESIGN.md §3's M*B / stage time per step, with the stage
/// time of a step counted over the M groups). pipeline_efficiency = the harmonic means of the
/// decode rates and of the bounds over the repetitions that have both, divided: the sum of the
/// repetitions' bound times over the sum of their decode times, each repetition against its own
/// bound, so at most 1 up to the timers' resolution (a bound pooled over repetitions, or
/// counting a first step, was measured up to 1.026). tokens_per_s and decode_tokens_per_s are
/// harmonic means over repetitions (common/stats.h harmonic_mean: equal tokens per repetition).
PartitionMetrics compute_metrics(const std::vector<double>& events, const EventShape& shape, int batch,
                                 int gen_len);

}  // namespace ppb
