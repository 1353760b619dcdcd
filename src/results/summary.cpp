#include "results/summary.h"
#include "results/serving_summary.h"

#include <algorithm>
#include <numeric>
#include <iomanip>
#include <map>
#include <sstream>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "common/format.h"
#include "common/stats.h"
#include "common/transfer.h"
#include "results/plan_summary.h"
#include "results/step_model_io.h"
#include "results/conditions.h"

namespace ppb {
namespace {

std::string fmt(const char* f, double v) { return format_printf(f, v); }

/// "1.024x [0.991, 1.058]", or "1.024x (no CI: n = 2 < 5)".
std::string gain_text(double ratio, const PairedComparison& c) {
  const std::string t = ratio_ci_text(ratio, c);
  if (std::isnan(c.ci_low) && c.n > 0) return t + " (no CI: n = " + std::to_string(c.n) + " < " + std::to_string(kMinPairsForCI) + ")";
  return t;
}

/// comparison_verdict's word as a phrase about partition `who`.
std::string verdict_text(const std::string& verdict, const std::string& who) {
  if (verdict == "faster" || verdict == "slower") return who + " " + verdict;
  if (verdict == "same split") return "the same split (measured once)";
  if (verdict == "too few repetitions")
    return "too few rounds for a verdict (--iters " + std::to_string(kMinPairsForCI) + " or more)";
  return verdict;
}

std::string unit_range(const RunRecord& run, int first, int last) {
  const auto& n = run.profile.unit_name;
  if (first == last) return n[first];
  return n[first] + ".." + n[last];
}

/// The ceilings the floors use, per rank (min..max over ranks beyond 4 ranks).
void print_ceilings(std::ostream& os, const RunRecord& run) {
  if (run.ranks.empty() || !(run.ranks[0].peak_gflops > 0)) return;  // older files: not measured
  os << "ceilings (read GB/s alone / all ranks reading, GEMM GFLOP/s):";
  if (run.ranks.size() <= 4) {
    for (size_t r = 0; r < run.ranks.size(); ++r) {
      const RankInfo& i = run.ranks[r];
      os << (r ? ";" : "") << " rank " << r << " " << fmt("%.1f", i.read_bandwidth_GBps) << " / "
         << fmt("%.1f", i.read_bandwidth_shared_GBps) << ", " << fmt("%.0f", i.peak_gflops);
    }
  } else {
    auto range = [&](auto get, const char* f) {
      double lo = 1e300, hi = -1e300;
      for (const auto& i : run.ranks) lo = std::min(lo, get(i)), hi = std::max(hi, get(i));
      return fmt(f, lo) + ".." + fmt(f, hi);
    };
    os << " " << range([](const RankInfo& i) { return i.read_bandwidth_GBps; }, "%.1f") << " / "
       << range([](const RankInfo& i) { return i.read_bandwidth_shared_GBps; }, "%.1f") << ", "
       << range([](const RankInfo& i) { return i.peak_gflops; }, "%.0f") << " over " << run.ranks.size() << " ranks";
  }
  os << "\n";
}

/// With a two-pass profile (latency_alone_ms): each rank's together / alone ratio of its units'
/// summed prefill and decode times, what sharing the machine's memory bandwidth costs a unit.
void print_profile_passes(std::ostream& os, const RunRecord& run) {
  const auto& t = run.profile;
  const size_t U = t.unit_name.size();
  if (t.latency_alone_ms.empty() || U == 0 || t.latency_alone_ms.size() != t.latency_ms.size()) return;
  const size_t R = t.latency_ms.size() / (2 * U);
  os << "profile: alone and together (the machine's ranks at once"
     << (run.workload.profile_order == "interleaved" ? "; the passes taking turns forward by forward"
         : run.workload.profile_order.empty()       ? ""
                                                    : "; " + run.workload.profile_order)
     << "), together/alone prefill, decode:";
  for (size_t r = 0; r < R && r < 4; ++r) {
    double sum[2][2] = {{0, 0}, {0, 0}};  // [together, alone][phase]
    for (size_t u = 0; u < U; ++u)
      for (size_t ph = 0; ph < 2; ++ph) {
        sum[0][ph] += t.latency_ms[(r * U + u) * 2 + ph];
        sum[1][ph] += t.latency_alone_ms[(r * U + u) * 2 + ph];
      }
    auto ratio = [](double a, double b) { return b > 0 ? fmt("x%.2f", a / b) : std::string("-"); };
    os << (r ? ";" : "") << " rank " << r << " " << ratio(sum[0][0], sum[1][0]) << ", " << ratio(sum[0][1], sum[1][1]);
  }
  if (R > 4) os << "; ...";
  os << "\n  predictions: alone + (together - alone) x the share of each stage's compute another stage of its machine\n"
        "  overlaps in the simulated pipeline (balance/contention.h); the balancer solves on the together times\n";
  const size_t n = t.latency_ms.size();
  if (!t.latency_rounds_ms.empty() && t.latency_rounds_ms.size() % n == 0) {
    // Each rank's summed unit times in the cycles between rounds against the profile's together pass.
    const size_t K = t.latency_rounds_ms.size() / n;
    os << "profile between rounds: " << K << " together cycle(s)";
    if (run.round_profile_s > 0) os << " (" << fmt("%.1f", run.round_profile_s) << " s)";
    os << ", after rounds";
    for (size_t k = 0; k < t.latency_rounds_after.size() && k < 6; ++k) os << (k ? "," : " ") << t.latency_rounds_after[k];
    if (t.latency_rounds_after.size() > 6) os << ",...";
    os << "; their mean / the profile's together, prefill, decode:";
    for (size_t r = 0; r < R && r < 4; ++r) {
      double sum[2][2] = {{0, 0}, {0, 0}};  // [rounds, profile][phase]
      for (size_t u = 0; u < U; ++u)
        for (size_t ph = 0; ph < 2; ++ph) {
          for (size_t k = 0; k < K; ++k) sum[0][ph] += t.latency_rounds_ms[k * n + (r * U + u) * 2 + ph] / K;
          sum[1][ph] += t.latency_ms[(r * U + u) * 2 + ph];
        }
      os << (r ? ";" : "") << " rank " << r << " " << fmt("x%.2f", sum[0][0] / sum[1][0]) << ", "
         << fmt("x%.2f", sum[0][1] / sum[1][1]);
    }
    if (R > 4) os << "; ...";
    os << "\n  (the machine's drift between the profile and the rounds; each partition's predictions are made again\n"
          "  from these cycles below, \"from the profile between rounds\")\n";
  }
}

/// One line per node: ranks, compute threads, the CPUs they may use; CPU quotas and governors
/// where set; a warning when a node is oversubscribed or ranks share one CPU quota that they
/// would run past (shared_quotas). Then one line per machine that holds
/// several nodes (machine_loads), with its own warning. Nothing for files before conditions.
void print_conditions(std::ostream& os, const RunRecord& run) {
  if (run.ranks.empty() || run.ranks[0].compute_threads == 0) return;
  for (const HostLoad& h : host_loads(run.ranks)) {
    os << "conditions: node " << h.hostname << ": " << h.ranks << " rank(s), " << h.threads << " compute thread(s) on "
       << (h.cpus > 0 ? std::to_string(h.cpus) + " CPU(s) (" + h.cpu_list + ")" : std::string("unknown CPUs"));
    std::string governors;
    for (size_t r = 0; r < run.ranks.size(); ++r) {
      const RankInfo& i = run.ranks[r];
      if (i.hostname != h.hostname) continue;
      if (i.cpu_quota_cores > 0) {
        os << "; rank " << r << " CPU quota " << fmt("%.2f", i.cpu_quota_cores) << " cores";
        if (i.cpu_quota_period_ms > 0) os << " per " << fmt("%g", i.cpu_quota_period_ms) << " ms";
      }
      if (!i.cpu_governor.empty() && governors.find(i.cpu_governor) == std::string::npos)
        governors += (governors.empty() ? "" : "/") + i.cpu_governor;
    }
    os << "; governor " << (governors.empty() ? std::string("not exposed") : governors) << "\n";
    for (size_t r = 0; r < run.ranks.size(); ++r) {
      if (run.ranks[r].hostname != h.hostname) continue;
      if (const std::string w = quota_period_warning(static_cast<int>(r), run.ranks[r]); !w.empty()) os << "  " << w << "\n";
    }
    if (h.oversubscribed())
      os << "  WARNING: oversubscribed: " << h.threads << " compute threads on " << h.cpus
         << " CPUs; ranks share cores, so stage times include waiting for a core (not timings to publish)\n";
  }
  for (const SharedQuota& q : shared_quotas(run.ranks)) os << "  " << shared_quota_warning(q) << "\n";
  // Nodes that are containers or namespaces of one machine share its CPUs.
  for (const HostLoad& m : machine_loads(run.ranks)) {
    if (m.nodes < 2) continue;
    os << "conditions: machine of nodes " << m.hostname << " (one kernel, /ranks/machine_id): " << m.ranks
       << " rank(s), " << m.threads << " compute thread(s) on "
       << (m.cpus > 0 ? std::to_string(m.cpus) + " CPU(s) (" + m.cpu_list + ")" : std::string("unknown CPUs")) << "\n";
    if (m.oversubscribed())
      os << "  WARNING: oversubscribed: " << m.threads << " compute threads on " << m.cpus
         << " CPUs of one machine; ranks share cores, so stage times include waiting for a core (not timings to "
            "publish)\n";
  }
}

/// A warning per GPU that several ranks share (same machine, same PCI bus id): their kernels
/// take turns on it (time-slicing, no MPS), which neither the per-rank profile nor the
/// simulator models. Seen on the first H200 run (gpu_check, 2 ranks on one GPU): the simulator
/// predicted 83-128% more decode tokens/s than measured.
void print_shared_gpus(std::ostream& os, const RunRecord& run) {
  if (run.backend != "cuda") return;
  std::map<std::string, std::vector<size_t>> by_gpu;
  for (size_t r = 0; r < run.ranks.size(); ++r)
    if (!run.ranks[r].bus_id.empty()) by_gpu[rank_machine(run.ranks[r]) + " " + run.ranks[r].bus_id].push_back(r);
  for (const auto& [gpu, ranks] : by_gpu) {
    if (ranks.size() < 2) continue;
    std::string list;
    for (size_t r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
    os << "  WARNING: ranks " << list << " share one GPU (" << run.ranks[ranks[0]].device_name << ", bus "
       << run.ranks[ranks[0]].bus_id << "): their kernels take turns on it, which the simulator does not model (it "
       << "predicts a GPU per rank); a test set-up, not timings to publish\n";
  }
}

/// What measured the link line's figures, and the other measurement beside them: the transport
/// probe's fit (rank 0 <-> 1, [0][1] of its matrices) against the MPI host ping-pong. "" for
/// files before the probe.
std::string link_source(const RunRecord& run) {
  const size_t R = run.ranks.size();
  if (run.link_measured_by.empty() || R < 2 || run.link_probe_latency_matrix_s.size() != R * R ||
      run.link_probe_max_rel_error.size() != R * R)
    return "";
  const double lat = run.link_probe_latency_matrix_s[1], bw = run.link_probe_bandwidth_matrix_Bps[1];
  const std::string fit = "within " + fmt("%.0f", 100 * run.link_probe_max_rel_error[1]) + "% of every size";
  if (run.link_measured_by == kLinkByTransportProbe)
    return " (the " + run.transport + " transport's probe on " + run.backend + " buffers, " + fit + ")";
  return " (MPI host ping-pong; through the " + run.transport + " transport's lanes " + fmt("%.1f", 1e6 * lat) + " us, " +
         fmt("%.2f", bw / 1e9) + " GB/s, " + fit + ")";
}

/// Whether the file has a measured link matrix for its ranks (issue 16).
bool has_link_matrix(const RunRecord& run) {
  const size_t R = run.ranks.size();
  return R > 1 && run.link_latency_matrix_s.size() == R * R && run.link_bandwidth_matrix_Bps.size() == R * R;
}

/// The measured links within and between nodes, when there is more than the one pair the
/// "link rank 0 <-> 1" line shows: pairs, latency and bandwidth ranges, the slowest pair.
void print_links(std::ostream& os, const RunRecord& run) {
  // Two ranks on one node: the "link rank 0 <-> 1" line already says it all.
  if (!has_link_matrix(run) || (run.ranks.size() == 2 && run.ranks[0].hostname == run.ranks[1].hostname)) return;
  const size_t R = run.ranks.size();
  for (int between = 0; between < 2; ++between) {
    double lat_lo = INFINITY, lat_hi = -INFINITY, bw_lo = INFINITY, bw_hi = -INFINITY;
    size_t pairs = 0, slow_a = 0, slow_b = 0;
    for (size_t a = 0; a < R; ++a)
      for (size_t b = a + 1; b < R; ++b) {
        const double lat = run.link_latency_matrix_s[a * R + b], bw = run.link_bandwidth_matrix_Bps[a * R + b];
        if ((run.ranks[a].hostname != run.ranks[b].hostname) != (between == 1) || !(bw > 0)) continue;
        ++pairs;
        lat_lo = std::min(lat_lo, lat);
        lat_hi = std::max(lat_hi, lat);
        if (bw < bw_lo) {
          bw_lo = bw;
          slow_a = a;
          slow_b = b;
        }
        bw_hi = std::max(bw_hi, bw);
      }
    if (pairs == 0) continue;
    os << "links " << (between ? "between nodes" : "within a node") << ": " << pairs << " pair(s), "
       << fmt("%.1f", 1e6 * lat_lo) << ".." << fmt("%.1f", 1e6 * lat_hi) << " us, " << fmt("%.3f", bw_lo / 1e9) << ".."
       << fmt("%.3f", bw_hi / 1e9) << " GB/s (slowest: ranks " << slow_a << " <-> " << slow_b << ")\n";
  }
}

/// The boundary of partition `p` whose decode-step transfer takes longest over its own measured
/// link (the activations B x hidden x dtype bytes between stages, the B token ids back to stage
/// 0), against the slowest stage's measured decode step. Nothing without a link matrix.
void print_slowest_boundary(std::ostream& os, const RunRecord& run, const PartitionRecord& p) {
  const int S = static_cast<int>(p.device_rank.size());
  const auto hidden = run.model_attrs_num.find("hidden_size");
  if (!has_link_matrix(run) || S < 2 || hidden == run.model_attrs_num.end() || !p.measured ||
      p.stage_compute_ms.size() != 2 * static_cast<size_t>(S))
    return;
  const size_t R = run.ranks.size();
  int dtype_size = 0;
  try {
    dtype_size = dtype_bytes(parse_dtype(run.workload.dtype, "/config/workload dtype"));
  } catch (const UserError&) {
    return;  // a file without a valid dtype: no activation to size
  }
  double worst = -1, slowest_step = 0;
  int worst_k = 0;
  for (int k = 0; k < S; ++k) {
    slowest_step = std::max(slowest_step, p.stage_compute_ms[2 * k + 1]);
    const size_t a = static_cast<size_t>(p.device_rank[k]), b = static_cast<size_t>(p.device_rank[(k + 1) % S]);
    const double bandwidth = run.link_bandwidth_matrix_Bps[a * R + b];
    if (!(bandwidth > 0)) continue;  // a pair not measured
    const double bytes = boundary_message_bytes(k + 1 == S, run.workload.batch, 1, hidden->second, dtype_size);
    const double ms = link_transfer_ms(run.link_latency_matrix_s[a * R + b], bandwidth, bytes);
    if (std::isfinite(ms) && ms > worst) {
      worst = ms;
      worst_k = k;
    }
  }
  if (worst < 0 || !(slowest_step > 0)) return;
  const int a = p.device_rank[worst_k], b = p.device_rank[(worst_k + 1) % S];
  os << "  slowest link: " << (worst_k + 1 < S ? "stage " + std::to_string(worst_k) + " -> " + std::to_string(worst_k + 1)
                                                : std::string("token return ") + std::to_string(worst_k) + " -> 0")
     << " (ranks " << a << " -> " << b << ", "
     << (run.ranks[a].hostname == run.ranks[b].hostname ? "within node " + run.ranks[a].hostname
                                                         : "between nodes " + run.ranks[a].hostname + " and " +
                                                               run.ranks[b].hostname)
     << "): " << fmt("%.3f", worst) << " ms per decode step, " << fmt("%.1f%%", 100.0 * worst / slowest_step)
     << " of the slowest stage's decode step\n";
}

/// How partition `p` differs from the run's first partition (issue 14's "#wrong" count).
std::string first_partition_diff(const PartitionRecord& p) {
  return std::to_string(p.tokens_differing_first_partition) + " of " + std::to_string(p.tokens.size()) +
         " tokens DIFFER from the first partition's, checksum " + fmt("%.2g", p.checksum_rel_diff_first_partition) +
         " relative (at most 1e-4)";
}

/// Issue 14: with several layouts (--tp), the fastest measured split of each side by side:
/// tensor parallelism shortens each token's path (TPOT, TTFT), pipeline stages raise throughput.
void print_layouts(std::ostream& os, const RunRecord& run) {
  std::vector<const PartitionRecord*> best;  // per layout, its partition with the most tokens/s
  for (const auto& p : run.partitions) {
    if (!p.measured || !p.metrics.count("tokens_per_s")) continue;
    auto it = std::find_if(best.begin(), best.end(), [&](const PartitionRecord* b) { return b->layout == p.layout; });
    if (it == best.end())
      best.push_back(&p);
    else if (p.metrics.at("tokens_per_s") > (*it)->metrics.at("tokens_per_s"))
      *it = &p;
  }
  if (best.size() < 2) return;
  auto m = [](const PartitionRecord* p, const char* k) { return p->metrics.count(k) ? p->metrics.at(k) : NAN; };
  os << "\nlayouts side by side (each layout's fastest split; --tp W: stages of W ranks splitting each layer):\n"
     << "  layout    partition               stages  tokens/s   decode tok/s  TTFT p50 ms  TPOT p50 ms  pred bneck ms  meas bneck ms\n";
  for (const PartitionRecord* p : best) {
    char line[256];
    std::snprintf(line, sizeof(line), "  %-9s %-22s %7zu %9.2f %14.2f %12.1f %12.1f %14.2f %14.2f\n", p->layout.c_str(),
                  p->name.c_str(), p->first_unit.size(), m(p, "tokens_per_s"), m(p, "decode_tokens_per_s"),
                  m(p, "ttft_p50_ms"), m(p, "tpot_p50_ms"), p->predicted_bottleneck_ms, m(p, "measured_bottleneck_ms"));
    os << line;
  }
}

}  // namespace

bool outside_profile_spread(const PartitionRecord& p, size_t k) {
  if (!p.measured || k >= p.measured_stage_ms.size() || k >= p.predicted_stage_min_ms.size() ||
      k >= p.predicted_stage_max_ms.size())
    return false;
  const double meas = p.measured_stage_ms[k];
  return meas < p.predicted_stage_min_ms[k] || meas > p.predicted_stage_max_ms[k];
}

/// One line on the MoE layers' routing (/moe/expert_tokens): per layer the busiest expert's
/// share of the layer's routed tokens and the share of experts no token reached; medians and
/// ranges over the MoE layers, beside what a uniform router gives.
void print_expert_load(std::ostream& os, const RunRecord& run) {
  if (run.expert_tokens.empty() || run.expert_cols < 1) return;
  std::vector<double> busiest, idle;
  int cols_used = 0;
  for (int l = 0; l < run.expert_rows; ++l) {
    const int64_t* row = run.expert_tokens.data() + static_cast<size_t>(l) * run.expert_cols;
    int64_t total = 0, mx = 0;
    int n = 0, zero = 0;
    for (int e = 0; e < run.expert_cols; ++e) {
      total += row[e];
      mx = std::max(mx, row[e]);
    }
    if (total == 0) continue;  // a dense layer
    for (int e = 0; e < run.expert_cols; ++e) {
      ++n;
      zero += row[e] == 0;
    }
    cols_used = n;
    busiest.push_back(100.0 * static_cast<double>(mx) / static_cast<double>(total));
    idle.push_back(100.0 * zero / n);
  }
  if (busiest.empty()) return;
  auto med_range = [](const std::vector<double>& v) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    std::ostringstream t;
    t << std::fixed << std::setprecision(1) << median(v) << "% [" << *lo << ", " << *hi << "]";
    return t.str();
  };
  os << "experts (" << busiest.size() << " MoE layers, partition " << run.expert_tokens_partition
     << "'s last repetition, --expert-skew " << run.expert_skew << "): the busiest expert took "
     << med_range(busiest) << " of its layer's routed tokens (uniform: " << fmt("%.1f", 100.0 / cols_used)
     << "%); experts no token reached: " << med_range(idle) << " (/moe/expert_tokens)\n";
}

namespace {

/// The title line: model, ranks, backend, workload, objective.
void print_title(std::ostream& os, const RunRecord& run) {
  const auto& w = run.workload;
  os << "\n== ppbench summary: " << run.model_source << " on " << run.world_size << " rank(s), " << run.backend
     << "/" << run.transport << ", B=" << w.batch << " P=" << w.prompt_len << " G=" << w.gen_len
     << " M=" << w.microbatches << ", " << w.dtype << (w.overlap ? ", overlap" : ", no overlap")
     << (run.backend == "cuda" ? (w.cuda_graphs ? ", decode from CUDA graphs" : ", decode eager (--no-cuda-graphs)") : "")
     << ", objective " << w.objective
     << (w.objective == "decode"    ? " (ms per decode step)"
         : w.objective == "prefill" ? " (ms per prefill step)"
                                    : " (prefill + G x decode ms per group)")
     << " ==\n";
  if (run.link_bandwidth_Bps > 0)
    os << "link rank 0 <-> 1: " << fmt("%.1f", 1e6 * run.link_latency_s) << " us latency, "
       << fmt("%.2f", run.link_bandwidth_Bps / 1e9) << " GB/s" << link_source(run) << "\n";
}

/// A profile-only file (`ppbench profile`): one row per signature, min..max over the ranks.
void print_profile_only(std::ostream& os, const RunRecord& run) {
  if (!run.partitions.empty() || run.profile.unit_name.empty()) return;
  const auto& w = run.workload;
  const auto& t = run.profile;
  const size_t U = t.unit_name.size(), R = t.latency_ms.size() / (2 * std::max<size_t>(U, 1));
  os << "\nprofile (median ms per forward of B=" << w.batch << " sequences; min..max over " << R << " rank(s))\n";
  os << "  signature              units  example        prefill P=" << w.prompt_len << "          decode\n";
  std::vector<bool> seen(t.signature_name.size() + U, false);
  for (size_t u = 0; u < U; ++u) {
    const size_t sig = static_cast<size_t>(t.unit_signature[u]);
    if (sig >= seen.size() || seen[sig]) continue;
    seen[sig] = true;
    int count = 0;
    for (size_t v = 0; v < U; ++v) count += t.unit_signature[v] == t.unit_signature[u];
    double pmin = 1e300, pmax = 0, dmin = 1e300, dmax = 0;
    for (size_t r = 0; r < R; ++r) {
      const double pre = t.latency_ms[(r * U + u) * 2], dec = t.latency_ms[(r * U + u) * 2 + 1];
      pmin = std::min(pmin, pre), pmax = std::max(pmax, pre), dmin = std::min(dmin, dec), dmax = std::max(dmax, dec);
    }
    const std::string name = sig < t.signature_name.size() ? t.signature_name[sig] : std::to_string(sig);
    char line[256];
    std::snprintf(line, sizeof line, "  %-22s %5d  %-12s %9.4g..%-9.4g %9.4g..%.4g\n", name.c_str(), count,
                  t.unit_name[u].c_str(), pmin, pmax, dmin, dmax);
    os << line;
  }
}

/// How many times a tensor-parallel group's grid was timed, where it matters: " (timed N times:
/// one over 3% is timed again)", " (timed N time(s), still over 3%: a disturbed grid)", or, in
/// files before the retries (no step_attempts), " (over 3%: a disturbed grid, timed once ...)".
std::string tp_grid_attempts_text(int attempts, double held_out_p50) {
  const double limit = 100 * stepcost::kGridDisturbedError;
  if (held_out_p50 > stepcost::kGridDisturbedError)
    return attempts > 0 ? format_line(" (timed %d time%s, still over %.0f%%: a disturbed grid)", attempts,
                                      attempts > 1 ? "s" : "", limit)
                        : format_line(" (over %.0f%%: a disturbed grid, timed once in files before 2026-12-07)", limit);
  return attempts > 1 ? format_line(" (timed %d times: one over %.0f%% is timed again)", attempts, limit) : "";
}

/// The step model's grid and its held-out error (issue 47), where the profile timed one.
void print_step_model(std::ostream& os, const RunRecord& run) {
  const ProfileTable& t = run.profile;
  if (t.step_rows.empty() || t.step_by_rows.empty()) return;
  const stepcost::GridFit fit = fit_step_model(t);
  const std::size_t S = t.step_by_rows.size(), ranks = fit.models.size() / S;
  const std::size_t held = fit.held_out.empty() ? 0 : fit.held_out.front().size();
  os << "step model: " << t.step_rows.size() << " step shapes timed on each signature and rank, piecewise linear in a "
     << "step's tokens plus its attention keys (/profile/step_model); " << held << " held-out steps of the whole model on "
     << ranks << " rank(s): |model / measured - 1| p50 " << fmt("%.1f", 100 * fit.abs_error_p50) << "%, max "
     << fmt("%.1f", 100 * fit.abs_error_max) << "%: the serving predictions' interpolation error";
  if (t.step_attempts > 1)
    os << " (the grid was timed " << t.step_attempts << " times: a disturbed one is timed again, each rank keeping "
       << "its attempt of the lowest held-out error)";
  os << "\n";
  const int B = run.workload.batch, P = run.workload.prompt_len;
  const std::vector<stepcost::Level> lv = step_model_levels(t, B, P, fit.models);
  if (!lv.empty()) {
    os << "  the profile's cycles against the grid's model of their shapes (cycles / model, decode and prefill: the "
          "machine's speed in the two windows):";
    for (std::size_t r = 0; r < lv.size(); ++r)
      os << (r ? ";" : "") << " rank " << r << " x" << fmt("%.2f", lv[r].decode) << ", x" << fmt("%.2f", lv[r].prefill);
    os << "; the predictions take the two windows' geometric mean\n";
  }
  const std::string fixed = fixed_cost_line(t);
  if (!fixed.empty()) os << "  " << fixed << "\n";
  for (const auto& g : t.tp) {
    const stepcost::GridFit gf = fit_step_model(t, g);
    if (gf.models.empty()) continue;
    const stepcost::Level l = group_step_level(t, B, P, g, gf.models);
    os << "  tensor-parallel ranks " << g.first_rank << ".." << g.first_rank + g.width - 1 << " at width " << g.width
       << ": the same grid on the group's shards (/profile/tp step_ms), held-out p50 " << fmt("%.1f", 100 * gf.abs_error_p50)
       << "%, max " << fmt("%.1f", 100 * gf.abs_error_max) << "%" << tp_grid_attempts_text(g.step_attempts, gf.abs_error_p50)
       << "; its cycles / its model, decode x" << fmt("%.2f", l.decode) << ", prefill x" << fmt("%.2f", l.prefill) << "\n";
  }
}

/// What the partition tables' columns and figures mean.
void print_column_legend(std::ostream& os, const RunRecord& run) {
  if (run.partitions.empty()) return;
  const auto& w = run.workload;
  const std::string cost = w.objective == "decode"    ? "one decode step"
                           : w.objective == "prefill" ? "one prefill step"
                                                      : "prefill + G decode steps of one group";
  os << "\ncolumns: units, n        the stage's units and their count\n"
        "         pred/meas ms    the stage's cost in the objective ("
     << cost
     << "),\n"
        "                         predicted from the profile / measured in the pipelined run\n"
        "         err             meas/pred - 1\n"
        "         floor ms, eff   the stage's floor in the objective (its units' bytes at the rank's read\n"
        "                         bandwidth with all ranks reading, or FLOPs at its GEMM rate, whichever\n"
        "                         is longer; /ranks) and efficiency = floor / meas (100% = at the floor)\n"
        "         pred/meas dec   ms of one decode step's compute (measured: median)\n"
        "         bubble          share of a repetition's wall time the compute lane was idle (median)\n"
        "         lane CPU s      CPU seconds of the compute / recv / send lanes over the timed repetitions\n"
        "then: tokens/s = M x B x G generated tokens per repetition / wall time, over all timed\n"
        "  repetitions; decode = the decode steady state's tokens/s, likewise; bound = what the slowest\n"
        "  stage's mean decode step allows; efficiency = decode / bound; TTFT = time to a group's first token, TPOT = time per output token\n"
        "  (p50/p99 over groups and repetitions: few samples, so p99 is close to the worst one)\n";
}

/// A metric of partition `p`, NaN where it has none.
/// The partition's title line (name, solver, layout, the split it shares a measurement with)
/// and, for an adaptive split, the calibration it was solved from.
void print_partition_header(std::ostream& os, const RunRecord& run, const PartitionRecord& p) {
  const bool tp = std::any_of(p.tp_width.begin(), p.tp_width.end(), [](int w) { return w > 1; });
  const int M = partition_groups(run, p);
  os << "\npartition " << p.name << " (solver " << p.solver << (tp ? ", layout --tp " + p.layout : std::string())
     << (M != run.workload.microbatches ? ", M=" + std::to_string(M) : std::string())
     << (p.replicas > 1 ? ", " + std::to_string(p.replicas) + " replicas side by side, each on " +
                              std::to_string(std::accumulate(p.tp_width.begin(), p.tp_width.end(), 0)) +
                              " rank(s): the stages below are replica 0's, the rates and latencies all replicas'"
                        : std::string())
     << ")"
     << (p.same_as.empty()                  ? ""
         : p.same_as_reason == "equivalent" ? ": its split " + p.solver_split + " is " + p.same_as +
                                                  "'s with identical devices' stages in another order (the same "
                                                  "stages), measured once as " + p.same_as + " (its figures below)"
                                            : ": the same split as " + p.same_as + ", measured once (its figures below)")
     << "\n";
  if (!p.calibration_factor.empty()) {
    os << "  solved after " << p.solved_after_round << " rounds from the profile calibrated by the measured stages of";
    for (size_t i = 0; i < p.calibrated_from.size(); ++i) os << (i ? ", " : " ") << p.calibrated_from[i];
    os << " (prefill/decode factors:";
    for (size_t r = 0; r + 1 < p.calibration_factor.size(); r += 2)
      os << (r ? "," : "") << " rank " << r / 2 << " x" << fmt("%.2f", p.calibration_factor[r]) << "/x"
         << fmt("%.2f", p.calibration_factor[r + 1]);
    os << "); pred ms below are from that table\n";
  }
}

/// The stage table: each stage's ranks, units, predicted and measured cost, floor, decode
/// step, bubble and lane CPU time (NaN columns where the partition was not measured).
void print_stage_table(std::ostream& os, const RunRecord& run, const PartitionRecord& p) {
  const int S = static_cast<int>(p.first_unit.size());
  os << "  stage  rank  units                      n   pred ms   meas ms    err  floor ms   eff  pred dec  meas dec  bubble  lane CPU s c/r/s\n";
  for (int k = 0; k < S; ++k) {
    char line[512];
    double pred = p.predicted_stage_ms[k];
    double meas = !p.measured ? NAN
                   : p.measured_stage_ms.size() == p.first_unit.size() ? p.measured_stage_ms[k]
                                                                       : p.stage_workload_ms[k];
    double err = p.measured ? meas / pred - 1.0 : NAN;
    const double floor = p.stage_floor_ms.size() == p.first_unit.size() ? p.stage_floor_ms[k] : NAN;
    const int width = k < static_cast<int>(p.tp_width.size()) ? p.tp_width[k] : 1;
    const std::string ranks = width == 1 ? std::to_string(p.device_rank[k])
                                         : std::to_string(p.device_rank[k]) + "-" + std::to_string(p.device_rank[k] + width - 1);
    std::snprintf(line, sizeof(line), "  %5d  %4s  %-24s %3d %9.2f %9.2f %+6.1f%% %9.2f %4.0f%% %9.2f %9.2f %6.1f%%  %.2f/%.2f/%.2f%s\n", k,
                  ranks.c_str(), unit_range(run, p.first_unit[k], p.last_unit[k]).c_str(),
                  p.last_unit[k] - p.first_unit[k] + 1, pred, meas, 100.0 * err, floor, 100.0 * floor / meas,
                  p.predicted_phase_ms[2 * k + 1],
                  p.measured ? p.stage_compute_ms[2 * k + 1] : NAN, p.measured ? 100.0 * p.bubble_fraction[k] : NAN,
                  p.measured ? p.lane_cpu_s[3 * k] : NAN, p.measured ? p.lane_cpu_s[3 * k + 1] : NAN,
                  p.measured ? p.lane_cpu_s[3 * k + 2] : NAN, k == p.bottleneck_stage && p.measured ? "  <- bottleneck" : "");
    os << line;
  }
}

/// A measured partition's stages outside their profile's spread, and the CPU share its
/// communication lanes took of one core.
void print_stage_warnings(std::ostream& os, const PartitionRecord& p) {
  const int S = static_cast<int>(p.first_unit.size());
  for (int k = 0; k < S; ++k) {
    if (!outside_profile_spread(p, static_cast<size_t>(k))) continue;
    os << "  profile did not hold for stage " << k << ": measured " << fmt("%.2f", p.measured_stage_ms[k])
       << " ms, outside the spread " << fmt("%.2f", p.predicted_stage_min_ms[k]) << ".."
       << fmt("%.2f", p.predicted_stage_max_ms[k])
       << " ms of its units' fastest and slowest profiled forwards (compute only)\n";
  }
  if (p.timed_wall_s > 0 && p.lane_cpu_s.size() == 3 * static_cast<size_t>(S)) {
    // Waiting lanes must leave the core to compute: their CPU share of the wall time.
    double worst = 0;
    int worst_stage = 0;
    for (int k = 0; k < S; ++k) {
      double comm = p.lane_cpu_s[3 * k + 1] + p.lane_cpu_s[3 * k + 2];
      if (comm > worst) {
        worst = comm;
        worst_stage = k;
      }
    }
    os << "  communication lanes: at most " << fmt("%.1f%%", 100.0 * worst / p.timed_wall_s)
       << " of one core (stage " << worst_stage << ", recv+send CPU over " << fmt("%.1f", p.timed_wall_s)
       << " s of timed wall)\n";
  }
}

/// A measured partition's rates (tokens/s, decode, bound, efficiency, TTFT, TPOT), its slowest
/// link and the simulator's rates from the profile.
void print_rates(std::ostream& os, const RunRecord& run, const PartitionRecord& p) {
  auto m = [&](const char* k) { return metric_or_nan(p, k); };
  os << "  tokens/s " << fmt("%.2f", m("tokens_per_s")) << " (decode " << fmt("%.2f", m("decode_tokens_per_s"))
     << ", bound " << fmt("%.2f", m("bottleneck_bound_tok_s")) << ", efficiency "
     << fmt("%.1f%%", 100.0 * m("pipeline_efficiency")) << ")  TTFT p50/p99 " << format_digits(m("ttft_p50_ms")) << "/"
     << format_digits(m("ttft_p99_ms")) << " ms  TPOT p50/p99 " << format_digits(m("tpot_p50_ms")) << "/"
     << format_digits(m("tpot_p99_ms")) << " ms\n";
  print_slowest_boundary(os, run, p);
  if (p.metrics.count("simulated_decode_tokens_per_s"))
    os << "  simulator (profile + link model): tokens/s " << fmt("%.2f", m("simulated_tokens_per_s")) << " ("
       << fmt("%+.1f%%", 100.0 * (m("simulated_tokens_per_s") / m("tokens_per_s") - 1.0)) << "), decode "
       << fmt("%.2f", m("simulated_decode_tokens_per_s")) << " (" << fmt("%+.1f%%", 100.0 * m("simulated_decode_error"))
       << ") vs measured\n";
}

/// One prediction made again after the rounds (`label`): its stage costs `pred` against
/// `meas` (`vs` qualifies them), and its simulator's rates (metrics `prefix`...).
void print_prediction_again(std::ostream& os, const PartitionRecord& p, const std::string& label,
                            const std::vector<double>& pred, const std::vector<double>& meas, const std::string& vs,
                            const std::string& prefix) {
  const size_t S = p.first_unit.size();
  if (pred.size() != S || meas.size() != S) return;
  os << "  " << label << ": pred ms";
  for (size_t k = 0; k < S; ++k) os << (k ? ", " : " ") << fmt("%.2f", pred[k]);
  os << " (err";
  for (size_t k = 0; k < S; ++k) os << (k ? ", " : " ") << fmt("%+.1f%%", 100.0 * (meas[k] / pred[k] - 1.0));
  os << vs << ")";
  if (p.metrics.count(prefix + "decode_tokens_per_s"))
    os << "; simulator tokens/s " << fmt("%.2f", metric_or_nan(p, prefix + "tokens_per_s")) << ", decode "
       << fmt("%.2f", metric_or_nan(p, prefix + "decode_tokens_per_s")) << " (decode "
       << fmt("%+.1f%%", 100.0 * metric_or_nan(p, prefix + "decode_error")) << " vs measured)";
  os << "\n";
}

/// The predictions made again after the rounds: from the profile between rounds, and
/// cross-calibrated by the other partitions (with the overlapped shares it rests on).
void print_predictions_again(std::ostream& os, const PartitionRecord& p) {
  const int S = static_cast<int>(p.first_unit.size());
  print_prediction_again(os, p, "from the profile between rounds", p.predicted_stage_rounds_ms, p.measured_stage_ms, "",
                         "simulated_rounds_");
  std::string mean_steps = " vs the mean steps' ms";  // meas ms above is the median steps'
  for (size_t k = 0; k < p.measured_stage_mean_ms.size(); ++k)
    mean_steps += (k ? ", " : " ") + fmt("%.2f", p.measured_stage_mean_ms[k]);
  print_prediction_again(os, p, "cross-calibrated by " + p.cross_calibrated_by + " (the same rounds)",
                         p.predicted_stage_cross_ms, p.measured_stage_mean_ms, mean_steps, "simulated_cross_");
  if (p.stage_overlap.size() == 2 * static_cast<size_t>(S) && p.predicted_overlap_cross.size() == p.stage_overlap.size()) {
    // The contention the cross-calibration predicts rests on these shares (balance/contention.h).
    auto shares = [&](const std::vector<double>& v) {
      std::string t;
      for (int k = 0; k < S; ++k) t += (k ? ", " : " ") + fmt("%.2f", v[2 * k]) + "/" + fmt("%.2f", v[2 * k + 1]);
      return t;
    };
    os << "  overlapped share of each stage's steps (prefill/decode): measured" << shares(p.stage_overlap)
       << "; cross-calibrated prediction" << shares(p.predicted_overlap_cross) << "\n";
  }
}

/// The predicted and measured bottleneck, and the validation of the partition's tokens and
/// checksum (serialized run, and against the first partition).
void print_validation(std::ostream& os, const RunRecord& run, const PartitionRecord& p) {
  os << "  predicted bottleneck " << fmt("%.2f", p.predicted_bottleneck_ms) << " ms, measured "
     << fmt("%.2f", metric_or_nan(p, "measured_bottleneck_ms")) << " ms (stage " << p.bottleneck_stage << ")";
  if (!p.validated) {
    os << "  validation: skipped (--no-validate)"
       << (p.tokens_match_first_partition ? "" : "; " + first_partition_diff(p) + " -> FAILED") << "\n";
  } else {
    os << "  validation: tokens " << (p.tokens_match ? "match" : "MISMATCH") << ", checksum "
       << (p.checksum_match ? "match" : "MISMATCH") << " (serialized run)"
       << (p.tokens_match_first_partition && !run.partitions.empty() && p.layout != run.partitions[0].layout
               ? ", " + std::to_string(p.tokens_differing_first_partition) + " tokens differ from " +
                     run.partitions[0].name + "'s (layout " + run.partitions[0].layout + "), checksum " +
                     fmt("%.2g", p.checksum_rel_diff_first_partition) + " relative"
               : std::string())
       << (p.tokens_match_first_partition ? "" : ", " + first_partition_diff(p)) << " -> "
       << (p.tokens_match && p.checksum_match && p.tokens_match_first_partition ? "OK" : "FAILED") << "\n";
  }
}

/// One partition: its stages predicted against measured, where the profile did not hold, its
/// figures, simulator, gain against the reference partition and validation.
void print_partition(std::ostream& os, const RunRecord& run, const PartitionRecord& p) {
  print_partition_header(os, run, p);
  print_stage_table(os, run, p);
  if (!p.measured) return;
  print_stage_warnings(os, p);
  print_rates(os, run, p);
  print_predictions_again(os, p);
  if (p.gain.n > 0 && p.name != run.reference_partition)
    os << "  vs " << run.reference_partition << " (" << p.gain.n << " paired rounds, 95% CI): tokens/s "
       << gain_text(p.gain.ratio, p.gain) << " " << verdict_text(p.gain_verdict, p.name) << "; decode "
       << gain_text(p.decode_gain.ratio, p.decode_gain) << " " << verdict_text(p.decode_gain_verdict, p.name) << "\n";
  print_validation(os, run, p);
}

/// The balanced split against the reference partition (uniform), with its CIs and verdicts,
/// qualified where a stage of
/// either ran outside its profile's spread.
void print_balance_gain(std::ostream& os, const RunRecord& run) {
  if (run.balance_gain <= 0) return;
  os << "\nbalance gain (balanced / " << run.reference_partition;
  if (run.balance_cmp.n > 0) os << ", " << run.balance_cmp.n << " paired rounds, 95% CI";
  os << "): tokens/s " << gain_text(run.balance_gain, run.balance_cmp) << ", decode tokens/s "
     << gain_text(run.decode_balance_gain, run.decode_balance_cmp) << "\n";
  if (!run.balance_verdict.empty())
    os << "  verdict: tokens/s " << verdict_text(run.balance_verdict, "balanced") << "; decode tokens/s "
       << verdict_text(run.decode_balance_verdict, "balanced") << "\n";
  int wrong = 0;
  for (const auto& p : run.partitions) {
    // A split that shares another's measurement (same_as) has no stages of its own to count.
    if ((p.name != "balanced" && p.name != run.reference_partition) || !p.same_as.empty()) continue;
    for (size_t k = 0; k < p.first_unit.size(); ++k) wrong += outside_profile_spread(p, k) ? 1 : 0;
  }
  // The relative costs the split rests on: each split predicted from the other's measured
  // stages in the same rounds (cross-calibrated), against its mean steps and its decode rate.
  double lo = INFINITY, hi = -INFINITY, slo = INFINITY, shi = -INFINITY;
  int crossed = 0;
  for (const auto& p : run.partitions) {
    // balanced may share seed's measurement (and its cross prediction); not the reference's: no gain then.
    if ((p.name != "balanced" && p.name != run.reference_partition) || p.same_as == run.reference_partition) continue;
    if (p.predicted_stage_cross_ms.size() != p.first_unit.size() || p.measured_stage_mean_ms.size() != p.first_unit.size())
      continue;
    ++crossed;
    for (size_t k = 0; k < p.first_unit.size(); ++k) {
      const double e = p.measured_stage_mean_ms[k] / p.predicted_stage_cross_ms[k] - 1.0;
      lo = std::min(lo, e);
      hi = std::max(hi, e);
    }
    if (p.metrics.count("simulated_cross_decode_error")) {
      slo = std::min(slo, p.metrics.at("simulated_cross_decode_error"));
      shi = std::max(shi, p.metrics.at("simulated_cross_decode_error"));
    }
  }
  constexpr double kHeld = 0.05;  // issue 13's +-5%
  const bool relative = crossed == 2;
  const bool held = relative && std::max(-lo, hi) <= kHeld && (!(slo <= shi) || std::max(-slo, shi) <= kHeld);
  if (relative) {
    os << "  relative costs (each split predicted from the other's stages measured in the same rounds): stage errors "
       << "(measured / predicted - 1) " << fmt("%+.1f", 100 * lo) << ".." << fmt("%+.1f%%", 100 * hi);
    if (slo <= shi)
      os << ", simulator decode (predicted / measured - 1) " << fmt("%+.1f", 100 * slo) << ".." << fmt("%+.1f%%", 100 * shi);
    os << (held ? ": held within +-5%\n" : ": did not hold within +-5%\n");
  }
  if (wrong > 0)
    os << "  qualified: " << wrong << " stage(s) of these splits ran outside the profile's spread (above): "
       << (held ? "the profile's absolute times did not hold in the pipeline, its relative costs did (the machine's "
                  "state moved both splits alike)\n"
                : "the balanced split was solved from numbers that did not hold in the pipeline\n");
  else if (relative && !held)
    os << "  qualified: the profile's relative costs did not hold in the pipeline, so the balanced split may not be "
          "the best one\n";
}

}  // namespace

std::string ratio_ci_text(double ratio, const PairedComparison& c) {
  std::string t = format_printf("%.3fx", ratio);
  if (!std::isnan(c.ci_low)) t += " [" + format_printf("%.3f", c.ci_low) + ", " + format_printf("%.3f", c.ci_high) + "]";
  return t;
}

void print_summary(std::ostream& os, const RunRecord& run) {
  print_title(os, run);
  print_ceilings(os, run);
  print_profile_passes(os, run);
  print_conditions(os, run);
  print_shared_gpus(os, run);
  print_links(os, run);
  print_profile_only(os, run);
  print_step_model(os, run);
  if (run.serving.spec) {
    // A serving scenario: the splits, then its own figures (results/serving_summary.h).
    for (const auto& p : run.partitions) {
      os << "partition " << p.name << ": units";
      for (size_t k = 0; k < p.first_unit.size(); ++k) {
        const int w = k < p.tp_width.size() ? p.tp_width[k] : 1;
        os << (k ? " | " : " ") << p.first_unit[k] << ".." << p.last_unit[k];
        if (w > 1)
          os << " on ranks " << p.device_rank[k] << ".." << p.device_rank[k] + w - 1 << " (tensor-parallel)";
        else
          os << " on rank " << p.device_rank[k];
      }
      os << "\n";
    }
    print_serving_summary(os, run);
    os << "validation: " << (run.validation == "ok" ? "OK" : run.validation == "skipped" ? "skipped (--no-validate)"
                             : run.validation == "pending" ? "pending (incomplete run)" : "FAILED") << "\n";
    return;
  }
  print_column_legend(os, run);
  for (const auto& p : run.partitions) print_partition(os, run, p);
  print_balance_gain(os, run);
  print_layouts(os, run);
  print_plan(os, run);
  for (const auto& p : run.partitions) {
    if (p.name != kControlPartition || (p.gain_verdict != "faster" && p.gain_verdict != "slower")) continue;
    os << "WARNING: the A/A control (the uniform split benchmarked twice) differs significantly from uniform: "
       << gain_text(p.gain.ratio, p.gain)
       << "; differences of this size between two splits may not be the splits' doing (noise that does not "
          "cancel in the rounds, or where each stage's memory landed)\n";
  }
  if (!run.schedule.empty())
    os << "benchmark: " << run.schedule << ", " << run.rounds << " round(s); stopped: " << run.stop_reason << "\n";
  if (!run.adaptive_status.empty()) os << "adaptive: " << run.adaptive_status << "\n";
  if (!run.tp_auto_layout.empty()) os << "--tp auto: the balancer chose the layout --tp " << run.tp_auto_layout << "\n";
  print_expert_load(os, run);
  os << "validation: "
     << (run.validation == "ok"        ? "OK"
         : run.validation == "skipped" ? (run.serving.spec ? "skipped (--no-validate: no serialized replay)"
                                                           : "skipped (--no-validate: no serialized replay; the partitions' "
                                                             "tokens agree with each other)")
         : run.validation == "pending" ? "pending (incomplete run)"
         : run.validation == "n/a"     ? "n/a (profile only)"
                                       : "FAILED")
     << "\n";
}

}  // namespace ppb
