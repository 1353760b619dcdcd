#!/usr/bin/python3
"""Plots of a ppbench results file (layout: results/README.md).

    tools/ppbench_plot.py results/RUN.h5 [--iter N] [--outdir DIR]

Writes PNG files next to the results file (or into --outdir):

  <stem>_timeline_<partition>.png  one repetition of the pipelined inference, per partition:
      one row per stage (stage 0 on top), each with three lanes — recv (top, thin),
      compute (middle), send (bottom, thin). Bars are coloured by request group; prefill
      steps are hatched, decode steps plain. The x axis is ms since the repetition's first
      event on rank 0's clock.
  <stem>_stages.png  per partition: predicted vs measured stage time in the balancer's
      objective (prefill + G x decode by default; one decode step or the prefill with
      --objective decode|prefill; ms per group) and the bubble fraction of each stage. Where
      the run cross-calibrated its splits (issue 13), a hatched bar beside the profile's
      prediction gives the prediction from the other splits' stages measured in the same
      rounds, with its error against the mean steps (a black tick on the measured bar).
  <stem>_rounds.png  left: each partition's tokens/s in every timed repetition against its
      round (the partitions take turns in each round, so drift shows on all lines alike);
      right: each partition's gain against uniform (tokens/s and decode tokens/s) with its
      95% confidence interval as an error bar (/benchmark/<name> balance_gain_ci_low/high) and
      the verdict, a line at 1. Drawn when some partition has per-repetition data.
  <stem>_roofline.png  one log-log panel per rank (more than 4 ranks: rank 0 and the rank of
      the lowest peak_gflops): each unit signature's prefill (circle) and decode (triangle)
      forward at its arithmetic intensity (unit_flops / unit_bytes, FLOP/byte) and achieved
      rate (unit_flops / latency_ms, GFLOP/s; latency_alone_ms where the profile had two
      passes, the pass the floors and the efficiency are of), labelled with the signature's name and its
      efficiency (/profile/efficiency: the roofline's floor / the measured time), under the
      rank's roofs: memory (AI x read_bandwidth_GBps, solid; read_bandwidth_shared_GBps,
      dashed) and compute (peak_gflops). Signatures of 0 FLOP (embed) are not drawn. Drawn
      for a `ppbench profile` file too; skipped with a note on stderr for files written
      before these datasets.

  <stem>_serving.png  for a serving scenario's file (`ppbench run --scenario ...`, /scenario),
      instead of the closed-batch plots: the TTFT and TPOT CDFs of every partition's requests
      (the last round; --goodput's limits as red lines), and per partition its request
      timeline: each request's queue (grey), prefill to its first token (orange) and decode
      (blue), on the scenario's clock.
  <stem>_rate.png  with it, for `run --request-rate search` (/rate_search): per partition
      against the request rate, the calibrated simulator's prediction (line) of SLO
      attainment, goodput, p99 TTFT and p99 TPOT, and the measured points (pilot, 0.9 R*,
      1.1 R*; pooled over the rounds, bars: the rounds' 95% t-interval of the mean); the
      target attainment and the SLO limits as red lines, R* as a dotted line.

    tools/ppbench_plot.py PLAN.json [--outdir DIR]

  <stem>_front.png  from `ppbench plan FILE.h5 --devices N --json PLAN.json` (the deployment
      planner): every candidate layout at its predicted tokens/s per user (x: 1000 / TPOT p50)
      and tokens/s per device (y); the Pareto front coloured, joined and labelled (layout and
      M), dominated candidates grey; the TPOT target as a vertical line (candidates left of it
      miss it), candidates missing the TTFT target hollow; the best under the targets starred.
      Also drawn for a results file of `ppbench run --plan K` (from /plan): each measured point
      as a black cross joined to its prediction, and a second panel with the best layout's
      tokens/s against M (strategy 3's groups-in-flight curve), predicted line and measured
      crosses.

Requires h5py, numpy and matplotlib: on Debian/Ubuntu `apt-get install python3-h5py
python3-matplotlib` for /usr/bin/python3 (the interpreter of this script's first line;
`scripts/install_deps.sh --python` does it); elsewhere a virtual environment with
`pip install -r tools/requirements.txt`, running `python tools/ppbench_plot.py ...` from it.
The timeline's legend lists the first 7 groups and "... groups 7..M-1" when M > 8.
A `ppbench profile` file (no benchmarked partition) gets the roofline only.
Exit status: 0 success; 3 a module is missing (the message says what to install); 2 the file is
missing, not a ppbench file, of a newer format, incomplete, or has nothing to plot (a `ppbench
profile` file of an older ppbench, without the roofline's datasets), --outdir is not a directory,
or --iter is out of range (the message repeats the value given).
"""
import argparse
import os
import sys
import textwrap

try:
    import h5py
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
except ImportError as missing:
    print(f"ppbench_plot.py: {sys.executable} has no module '{missing.name}' (needs h5py, numpy, matplotlib).\n"
          "  Debian/Ubuntu: apt-get install python3-h5py python3-matplotlib   (or scripts/install_deps.sh --python),\n"
          "                 then run the script as it is: its interpreter is /usr/bin/python3\n"
          "  elsewhere:     python3 -m venv venv && venv/bin/pip install -r tools/requirements.txt\n"
          "                 venv/bin/python tools/ppbench_plot.py FILE.h5", file=sys.stderr)
    sys.exit(3)

# Columns of /benchmark/<name>/events (its `columns` attribute says the same).
RECV_START, RECV_END, COMPUTE_START, COMPUTE_END, SEND_START, SEND_END = range(6)
# Groups listed in the timeline's legend; more groups are summarised in one entry.
LEGEND_GROUPS = 8
# Panels of the roofline: every rank up to this many; beyond, rank 0 and the rank of the lowest peak.
ROOFLINE_PANELS = 4
# Datasets the roofline needs beyond the profile's latencies (absent in files of older ppbench).
ROOFLINE_DATASETS = ("ranks/read_bandwidth_GBps", "ranks/read_bandwidth_shared_GBps", "ranks/peak_gflops",
                     "profile/unit_flops", "profile/unit_bytes", "profile/efficiency")
# The newest results format this script reads (kResultsFormatVersion in src/results/writer.h).
RESULTS_FORMAT_VERSION = 1



def stage_ranks(part):
    """'rank 3' or, for a tensor-parallel stage (tp_width > 1, issue 14), 'ranks 0-1', per stage."""
    first = part["device_rank"][...]
    width = part["tp_width"][...] if "tp_width" in part else np.ones_like(first)
    return [f"rank {int(r)}" if int(w) == 1 else f"ranks {int(r)}-{int(r) + int(w) - 1}" for r, w in zip(first, width)]

def text(value):
    """An HDF5 string attribute as str (h5py gives str or bytes depending on how it was written)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NotAResultsFile(Exception):
    """The path is missing, not HDF5, not a ppbench results file, or incomplete."""


class BadArgument(Exception):
    """A command-line value the file cannot satisfy (e.g. --iter out of range)."""


def open_results(path):
    """Opens `path` read-only; raises NotAResultsFile (naming the path) unless it is a complete
    ppbench results file."""
    if not os.path.isfile(path):
        raise NotAResultsFile(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise NotAResultsFile(f"{path}: not an HDF5 file ({e})") from None
    if "format_version" not in f.attrs or "ppbench_version" not in f.attrs:
        f.close()
        raise NotAResultsFile(f"{path}: not a ppbench results file (no format_version/ppbench_version)")
    if int(f.attrs["format_version"]) > RESULTS_FORMAT_VERSION:
        version = int(f.attrs["format_version"])
        f.close()
        raise NotAResultsFile(f"{path}: results format_version {version}; this script reads up to "
                              f"{RESULTS_FORMAT_VERSION}: use a newer ppbench")
    if int(f.attrs.get("complete", 0)) != 1:
        how = "".join(f"; {label}{text(f.attrs[key])}" for key, label in
                      (("status", "last status: "), ("failure", "failure: ")) if text(f.attrs.get(key, "")))
        f.close()
        raise NotAResultsFile(f"{path}: incomplete results file (complete != 1): the run failed, crashed or was "
                              f"killed before its final write, or is still running{how}")
    return f


def partition_names(f):
    """Partition names in run order (root attribute partition_order; older files: uniform first)."""
    if "partition_order" in f.attrs:
        return [str(n) for n in f.attrs["partition_order"]]
    names = sorted(f["partitions"].keys()) if "partitions" in f else []
    return sorted(names, key=lambda n: n != "uniform")


def unit_span(f, part):
    """Labels "embed..layer.13" of the units of each stage of partition group `part`."""
    names = f["profile/unit_name"].asstr()[...]
    out = []
    for a, b in zip(part["first_unit"][...], part["last_unit"][...]):
        out.append(names[a] if a == b else f"{names[a]}..{names[b]}")
    return out


def model_name(f):
    """The model's name: its --model file's stem ("qwen3-0.6b")."""
    return os.path.splitext(os.path.basename(text(f["config/model"].attrs.get("source", "?"))))[0]


def run_title(f):
    w = f["config/workload"].attrs
    model = model_name(f)
    return (f"{model}, {int(f.attrs['world_size'])} ranks ({f.attrs['backend']}/{f.attrs['transport']}), "
            f"B={int(w['batch'])} P={int(w['prompt_len'])} G={int(w['gen_len'])} M={int(w['microbatches'])}")


def legend_handles(M, colours):
    """Legend of the timeline: one entry per group up to LEGEND_GROUPS groups (beyond, the first
    LEGEND_GROUPS - 1 and one "... groups k..M-1" entry, so that the legend fits the figure), then
    the bar styles."""
    shown = M if M <= LEGEND_GROUPS else LEGEND_GROUPS - 1
    handles = [Patch(facecolor=colours(g % 20), label=f"group {g}") for g in range(shown)]
    if shown < M:
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"... groups {shown}..{M - 1}"
                             + (" (colours repeat every 20)" if M > 20 else "")))
    handles += [Patch(facecolor="white", edgecolor="black", hatch="///", label="prefill"),
                Patch(facecolor="grey", edgecolor="black", label="decode"),
                Patch(facecolor="none", edgecolor="none", label="thin bars: recv (above), send (below)")]
    return handles


def plot_timeline(f, name, it, out_png):
    """Gantt chart of repetition `it` of partition `name` (see the module docstring)."""
    bench = f[f"benchmark/{name}"]
    ev = bench["events"][...]  # [iters][M][G+1][S][6] seconds, NaN where no such operation
    iters, M, steps, S, _ = ev.shape
    given = it
    if it < 0:
        it += iters
    if not 0 <= it < iters:
        raise BadArgument(f"--iter {given} out of range: the file has {iters} timed repetitions "
                          f"(valid: 0..{iters - 1}, or -1..-{iters} counting from the last)")
    e = ev[it]
    t0 = np.nanmin(e)
    e = (e - t0) * 1e3  # ms since the repetition's first event
    colours = plt.get_cmap("tab10" if M <= 10 else "tab20")
    labels = unit_span(f, f[f"partitions/{name}"])
    bubble = bench["bubble_fraction"][...]

    fig_w = min(24, max(10, 0.5 * steps * M / max(1, S) + 8))
    dpi = 110
    fig, ax = plt.subplots(figsize=(fig_w, 1.3 * S + 1.9))
    x_max = np.nanmax(e) * 1.01
    # Bars narrower than 2 pixels (a short send of a token, a fast decode step) are drawn 2 pixels
    # wide so that they stay visible; the axes take about 70% of the figure's width.
    min_w = 2.0 * x_max / (0.7 * fig_w * dpi)
    # Lanes of stage s, centred on y = s: recv above, compute in the middle, send below
    # (the y axis is inverted so that stage 0 is the top row). Sends are opaque with an edge:
    # they are short, and what a reader looks for is whether they overlap the next compute.
    lanes = [(RECV_START, RECV_END, -0.31, 0.18, 0.5, "none"), (COMPUTE_START, COMPUTE_END, 0.0, 0.40, 1.0, "black"),
             (SEND_START, SEND_END, 0.31, 0.18, 0.9, "dimgrey")]
    for s in range(S):
        for g in range(M):
            for t in range(steps):
                for a, b, dy, h, alpha, edge in lanes:
                    x0, x1 = e[g, t, s, a], e[g, t, s, b]
                    if np.isnan(x0) or np.isnan(x1):
                        continue
                    ax.broken_barh([(x0, max(x1 - x0, min_w))], (s + dy - h / 2, h), facecolors=colours(g % 20),
                                   alpha=alpha, edgecolor=edge, linewidth=0.4, hatch="///" if t == 0 else None)
    ax.set_yticks(range(S))
    ranks = stage_ranks(f[f"partitions/{name}"])
    ax.set_yticklabels([f"stage {s} ({ranks[s]})\n{labels[s]}\nbubble {100 * bubble[s]:.0f}%" for s in range(S)],
                       fontsize=8)
    ax.set_ylim(S - 0.5, -0.5)
    for s in range(S - 1):
        ax.axhline(s + 0.5, color="grey", linewidth=0.5)
    ax.set_xlim(0, x_max)
    ax.set_xlabel("time since the repetition's first event (ms, rank 0's clock)")
    tps = bench.attrs.get("tokens_per_s", float("nan"))
    counts = f[f"partitions/{name}"].attrs.get("counts", "")
    ax.set_title(f"{run_title(f)}\npartition {name} ({counts} units per stage): timed repetition {it + 1}/{iters} (after the warm-up), "
                 f"{tps:.2f} tokens/s (over all timed repetitions)", fontsize=10)
    ax.legend(handles=legend_handles(M, colours), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    fig.tight_layout()
    # Step labels ("g1P", "g0D3") only on compute bars wide enough to hold them, never two that
    # touch: widths measured in pixels of the final layout (7-point text: ~6 pixels a character).
    px_per_ms = ax.get_window_extent().width / x_max
    for s in range(S):
        right = -np.inf  # right edge (ms) of the last label of this row
        spans = sorted((e[g, t, s, COMPUTE_START], e[g, t, s, COMPUTE_END], g, t)
                       for g in range(M) for t in range(steps) if not np.isnan(e[g, t, s, COMPUTE_START]))
        for x0, x1, g, t in spans:
            label = f"g{g}" + ("P" if t == 0 else f"D{t}")
            need_ms = (len(label) * 6.0 + 4.0) / px_per_ms
            if x1 - x0 >= need_ms and (x0 + x1) / 2 - need_ms / 2 > right:
                ax.text((x0 + x1) / 2, s, label, ha="center", va="center", fontsize=7,
                        color="white" if t else "black")
                right = (x0 + x1) / 2 + need_ms / 2
    fig.savefig(out_png, dpi=dpi)
    plt.close(fig)


def plot_stages(f, names, out_png):
    """Per partition: predicted vs measured stage time, and bubble fraction, per stage."""
    names = [n for n in names if f"benchmark/{n}" in f]
    if not names:
        return False
    P = len(names)
    fig, axes = plt.subplots(2, P, figsize=(max(6, 4.5 * P), 7), squeeze=False)
    ymax = 0.0
    for j, name in enumerate(names):
        part, bench = f[f"partitions/{name}"], f[f"benchmark/{name}"]
        pred = part["predicted_stage_ms"][...]
        # Measured stage cost in the balancer's objective (older files: prefill + G x decode).
        meas = bench["measured_stage_ms" if "measured_stage_ms" in bench else "stage_workload_ms"][...]
        bubble = bench["bubble_fraction"][...]
        S = len(pred)
        x = np.arange(S)
        ax = axes[0][j]
        # Cross-calibrated prediction (issue 13): from the profile calibrated on the other splits'
        # stages measured in the same rounds; its error is against the mean steps (the file's
        # prediction_error_cross), the profile's against the median steps drawn here.
        cross = part["predicted_stage_cross_ms"][...] if "predicted_stage_cross_ms" in part else None
        if cross is not None and not np.all(np.isfinite(cross)):
            cross = None
        w = 0.27 if cross is not None else 0.4
        xm = x + (w if cross is not None else 0.2)  # where the measured bars stand
        ax.bar(xm - (2 * w if cross is not None else 0.4), pred, w, label="predicted (profile)", color="#9ecae1",
               edgecolor="black", linewidth=0.5)
        if cross is not None:
            ax.bar(xm - w, cross, w, label="cross-calibrated (from the other splits' stages)", color="#c6dbef",
                   edgecolor="black", linewidth=0.5, hatch="//")
            err_cross = bench["prediction_error_cross"][...]
            for k in range(S):
                ax.text(xm[k] - w, cross[k] / 2, f"{100 * err_cross[k]:+.1f}%", ha="center", va="center", fontsize=7,
                        rotation=90, bbox=dict(facecolor="white", edgecolor="none", pad=1.0))
        ax.bar(xm, meas, w, label="measured (median steps)", color="#3182bd", edgecolor="black", linewidth=0.5)
        if cross is not None and "measured_stage_mean_ms" in bench:
            # What the cross-calibrated errors are against.
            ax.scatter(xm, bench["measured_stage_mean_ms"][...], marker="_", s=600, color="black", zorder=3,
                       label="measured (mean steps)")
        # The measured bottleneck in the objective's terms (the bottleneck_stage attr is the
        # workload's argmax; the two agree for the default objective).
        bn = int(np.nanargmax(meas)) if S else -1
        if 0 <= bn < S:
            ax.annotate("bottleneck", (xm[bn], meas[bn]), xytext=(0, 4), textcoords="offset points",
                        ha="center", fontsize=8)
        for k in range(S):
            err = meas[k] / pred[k] - 1
            ax.text(xm[k], meas[k] / 2, f"{100 * err:+.0f}%", ha="center", va="center", fontsize=7,
                    color="white", rotation=90)
        ymax = max(ymax, float(np.nanmax(np.concatenate([pred, meas] + ([cross] if cross is not None else [])))))
        ax.set_xticks(x)
        ranks = stage_ranks(part)
        ax.set_xticklabels([f"stage {k}\n{ranks[k]}" for k in x], fontsize=8)
        tps = bench.attrs.get("tokens_per_s", float("nan"))
        ax.set_title(f"{name} ({part.attrs.get('counts', '')} units), {tps:.2f} tok/s", fontsize=10)
        if j == 0:
            objective = part["predicted_stage_ms"].attrs.get("objective", part.attrs.get("objective", "workload"))
            if isinstance(objective, bytes):
                objective = objective.decode()
            what = {"decode": "one decode step", "prefill": "prefill"}.get(objective, "prefill + G x decode")
            ax.set_ylabel(f"stage time per group (ms)\n{what} (objective: {objective})")
        if j == 0:
            if cross is None:
                ax.legend(fontsize=8, loc="upper center", ncol=2, frameon=False)
            else:  # four entries: under the title, across the figure
                fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="upper center", ncol=4, frameon=False,
                           bbox_to_anchor=(0.5, 0.955))
        ax2 = axes[1][j]
        ax2.bar(x, 100 * bubble, 0.6, color="#fd8d3c", edgecolor="black", linewidth=0.5)
        for k in range(S):
            ax2.text(k, 100 * bubble[k] + 1, f"{100 * bubble[k]:.0f}%", ha="center", fontsize=8)
        ax2.set_ylim(0, 105)
        ax2.set_xticks(x)
        ax2.set_xticklabels([f"stage {k}" for k in x], fontsize=8)
        if j == 0:
            ax2.set_ylabel("bubble (% of repetition wall time)")
    for j in range(P):
        axes[0][j].set_ylim(0, ymax * 1.3)
    fig.suptitle(run_title(f), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95) if fig.legends else None)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def plot_rounds(f, names, out_png):
    """Tokens/s per round per partition, and each gain against uniform with its 95% CI."""
    names = [n for n in names if f"benchmark/{n}" in f and "rep_tokens_per_s" in f[f"benchmark/{n}"]]
    if not names:
        return False
    fig, (ax, axg) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for name in names:
        rep = f[f"benchmark/{name}/rep_tokens_per_s"][...]
        ax.plot(np.arange(1, len(rep) + 1), rep, marker="o", ms=3, label=name)
    ax.set_xlabel("round (one timed repetition of every partition)")
    ax.set_ylabel("tokens/s of the repetition")
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    gains = []
    for name in names:
        b = f[f"benchmark/{name}"]
        for key, what in (("balance_gain", "tokens/s"), ("decode_balance_gain", "decode")):
            if key in b.attrs and f"{key}_ci_low" in b.attrs:
                gains.append((f"{name}\n{what}", float(b.attrs[key]), float(b.attrs[f"{key}_ci_low"]),
                              float(b.attrs[f"{key}_ci_high"]), text(b.attrs.get(key.replace("gain", "verdict"), ""))))
    if gains:
        y = np.arange(len(gains))
        for i, (_, g, lo, hi, verdict) in enumerate(gains):
            colour = {"faster": "#31a354", "slower": "#de2d26"}.get(verdict, "#636363")
            if np.isfinite(lo) and np.isfinite(hi):
                axg.errorbar([g], [i], xerr=[[g - lo], [hi - g]], fmt="o", color=colour, capsize=4)
            else:
                axg.plot([g], [i], "o", color=colour, mfc="none")
            axg.annotate(verdict or "", (g, i), xytext=(0, 7), textcoords="offset points", ha="center", fontsize=7)
        axg.axvline(1.0, color="black", lw=0.8)
        axg.set_yticks(y)
        axg.set_yticklabels([g[0] for g in gains], fontsize=8)
        axg.set_ylim(-0.7, len(gains) - 0.3)
        axg.set_xlabel("gain against uniform, 95% CI (paired rounds)")
    else:
        axg.text(0.5, 0.5, "no gain against uniform in this run", ha="center", va="center", transform=axg.transAxes)
        axg.set_axis_off()
    fig.suptitle(run_title(f), fontsize=11)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def roofline_ranks(peak):
    """Ranks drawn in the roofline: all up to ROOFLINE_PANELS, beyond rank 0 and the rank of the
    lowest peak_gflops (one panel when that is rank 0)."""
    if len(peak) <= ROOFLINE_PANELS:
        return list(range(len(peak)))
    finite = np.where(np.isfinite(peak), peak, np.inf)
    return sorted({0, int(np.argmin(finite))})


def spread_labels(ax, labels, min_dy=10.0):
    """Moves apart vertically (in pixels of the final layout) the point labels of one side that
    would touch: labels whose anchors are within 90 pixels horizontally and `min_dy` vertically."""
    placed = []  # (x, y) pixel positions of the labels kept so far
    to_px = ax.transData.transform
    for label in sorted(labels, key=lambda t: -to_px(t.xy)[1]):
        x, y = to_px(label.xy)
        dx, dy = label.xyann
        y += dy
        for px, py in placed:
            if abs(px - x) < 90 and py - y < min_dy:
                y = py - min_dy
        label.xyann = (dx, y - to_px(label.xy)[1])
        placed.append((x, y))


def plot_roofline(f, out_png):
    """Roofline of each unit signature's forward on each rank (see the module docstring)."""
    bw = f["ranks/read_bandwidth_GBps"][...]
    bw_shared = f["ranks/read_bandwidth_shared_GBps"][...]
    peak = f["ranks/peak_gflops"][...]
    devices = f["ranks/device_name"].asstr()[...]
    flops, nbytes = f["profile/unit_flops"][...], f["profile/unit_bytes"][...]  # [U, 2]: prefill, decode
    # [R, U, 2]; the alone pass where the profile has two: the floors (ceilings alone) and so the
    # efficiency are of that pass (results/README.md)
    lat = f["profile/latency_alone_ms" if "latency_alone_ms" in f["profile"] else "profile/latency_ms"][...]
    eff = f["profile/efficiency"][...]
    sig_names = f["profile/signature_name"].asstr()[...]
    first = {}  # signature -> its first unit (units of one signature have the same shapes)
    for u, sig in enumerate(f["profile/unit_signature"][...]):
        first.setdefault(int(sig), u)
    phases = (("prefill", "o"), ("decode", "^"))
    # Signatures without FLOPs (embed: a gather) have no place on a roofline.
    no_flops = []
    for sig, u in sorted(first.items()):
        zero = [name for ph, (name, _) in enumerate(phases) if not flops[u, ph] > 0 or not nbytes[u, ph] > 0]
        if zero:
            no_flops.append(sig_names[sig] + ("" if len(zero) == 2 else f" ({zero[0]})"))
    ranks = roofline_ranks(peak)
    rows, cols = (1, len(ranks)) if len(ranks) <= 2 else (2, 2)
    fig, axes = plt.subplots(rows, cols, figsize=(7.2 * cols, 5.8 * rows), squeeze=False)
    for ax in axes.flat[len(ranks):]:
        ax.set_visible(False)
    colours = plt.get_cmap("tab10")
    labels = {}  # axes -> (labels left of their point, labels right of it)
    for ax, r in zip(axes.flat, ranks):
        pts = []  # (AI, GFLOP/s, signature, phase, efficiency)
        for sig, u in sorted(first.items()):
            for ph in range(2):
                F, B, ms = flops[u, ph], nbytes[u, ph], lat[r, u, ph]
                if F > 0 and B > 0 and ms > 0:
                    pts.append((F / B, F / (ms * 1e-3) / 1e9, sig, ph, eff[r, u, ph]))
        roofs = [(b, ls, what) for b, ls, what in
                 ((bw[r], "-", "rank alone"), (bw_shared[r], "--", "every rank of the node reading"))
                 if np.isfinite(b) and b > 0]
        pk = peak[r] if np.isfinite(peak[r]) and peak[r] > 0 else None
        ridges = [pk / b for b, _, _ in roofs] if pk else []
        xs = [p[0] for p in pts] + ridges or [1.0]
        ys = [p[1] for p in pts] + ([pk] if pk else []) or [1.0]
        x_lo, x_hi = min(xs) / 8, max(xs) * 8
        # The top ~30% of the (log) height stays free above the compute roof for the legend.
        y_lo = min(ys) / 8
        y_hi = max(ys) * max(6.0, (max(ys) / y_lo) ** 0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for b, ls, what in roofs:
            x_end = min(x_hi, pk / b) if pk else x_hi
            ax.plot([x_lo, x_end], [x_lo * b, x_end * b], color="black", linestyle=ls, linewidth=1.4,
                    label=f"memory roof, {what}: {b:.4g} GB/s")
        if pk:
            ax.plot([min(ridges, default=x_lo), x_hi], [pk, pk], color="#b2182b", linewidth=1.4,
                    label=f"compute roof (peak GEMM): {pk:.4g} GFLOP/s")
        left, right = [], []
        for x, y, sig, ph, e in pts:
            ax.scatter([x], [y], marker=phases[ph][1], s=55, color=colours(sig % 10), edgecolor="black",
                       linewidth=0.6, zorder=3)
            label = sig_names[sig] + (f" {100 * e:.0f}%" if np.isfinite(e) else "")
            # Prefill (high intensity, right of the plot) labelled on the left of its point, decode
            # on the right: the two phases of a unit whose intensity does not change (the head)
            # sit on one vertical line.
            side = left if ph == 0 else right
            side.append(ax.annotate(label, (x, y), xytext=(-7 if ph == 0 else 7, -3), textcoords="offset points",
                                    ha="right" if ph == 0 else "left", fontsize=7, zorder=4,
                                    bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none",
                                              alpha=0.75)))
        labels[ax] = (left, right)
        ax.set_xlim(x_lo, x_hi)
        ax.set_ylim(y_lo, y_hi)
        ax.set_xlabel("arithmetic intensity (FLOP/byte): unit_flops / unit_bytes")
        ax.set_ylabel("achieved rate (GFLOP/s): unit_flops / latency_ms")
        ax.grid(which="major", linestyle=":", linewidth=0.5)
        device = "\n".join(textwrap.wrap(devices[r], 90))
        ax.set_title(f"{model_name(f)} on rank {r}: {device}", fontsize=9)
        handles = ax.get_legend_handles_labels()[0]
        handles += [Line2D([], [], marker=m, linestyle="none", markerfacecolor="white", markeredgecolor="black",
                           label=f"{name} (median forward)") for name, m in phases]
        handles.append(Line2D([], [], linestyle="none", label="label: signature, efficiency = floor / measured"))
        if no_flops:
            handles.append(Line2D([], [], linestyle="none", label=f"not drawn (0 FLOP): {', '.join(no_flops)}"))
        ax.legend(handles=handles, loc="upper left", fontsize=7, frameon=True, framealpha=0.85)
    shown = "" if len(ranks) == len(peak) else \
        f"; ranks {' and '.join(map(str, ranks))} of {len(peak)} shown (rank 0 and the lowest peak_gflops)"
    fig.suptitle(f"{run_title(f)}\nroofline of one forward of each unit signature (prefill: B x P tokens, "
                 f"decode: B tokens){shown}", fontsize=10)
    fig.tight_layout()
    for ax, sides in labels.items():
        for side in sides:
            spread_labels(ax, side)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


class NotAPlan(Exception):
    """A JSON file that is not `ppbench plan --json` output."""


def read_plan(path):
    """The planner's JSON (`ppbench plan --json`): its candidates, front and targets.

    Raises NotAPlan (the path and what is missing) when it is not one."""
    import json
    try:
        with open(path) as fh:
            plan = json.load(fh)
    except (OSError, ValueError) as e:
        raise NotAPlan(f"{path}: cannot read it as JSON ({e})")
    need = ("candidates", "front", "devices", "slo_ttft_ms", "slo_tpot_ms")
    if not isinstance(plan, dict) or any(k not in plan for k in need):
        raise NotAPlan(f"{path}: not `ppbench plan --json` output (needs {', '.join(need)})")
    if not plan["candidates"]:
        raise NotAPlan(f"{path}: the plan has no candidate")
    return plan


def plan_of_results(f):
    """/plan of a `run --plan` results file as the planner's JSON has it, each measured point's
    measurement added (`measured`: tokens/s per device and per user, TTFT/TPOT p50 and tokens/s
    measured); None without /plan."""
    if "plan" not in f:
        return None
    g = f["plan"]
    n = len(g["label"])
    devices = int(g.attrs["devices"])
    cands = []
    for i in range(n):
        reps = int(g["replicas"][i]) if "replicas" in g else 1  # R pipelines side by side; absent in older files
        widths = text(g["widths"][i])
        c = {"layout": text(g["label"][i]), "widths": f"DP{reps} {widths}" if reps > 1 else widths,
             "groups": int(g["groups"][i]),
             "tokens_per_s": float(g["tokens_per_s"][i]),
             "tokens_per_s_per_device": float(g["tokens_per_s_per_device"][i]),
             "tokens_per_s_per_user": float(g["tokens_per_s_per_user"][i]),
             "ttft_p50_ms": float(g["ttft_p50_ms"][i]), "tpot_p50_ms": float(g["tpot_p50_ms"][i])}
        name = text(g["measured_as"][i])
        if name and f"benchmark/{name}" in f:
            a = f[f"benchmark/{name}"].attrs
            c["measured"] = {"name": name, "tokens_per_s": float(a["tokens_per_s"]),
                             "tokens_per_s_per_device": float(a["tokens_per_s"]) / devices,
                             "tokens_per_s_per_user": 1000.0 / float(a["tpot_p50_ms"]),
                             "ttft_p50_ms": float(a["ttft_p50_ms"]), "tpot_p50_ms": float(a["tpot_p50_ms"])}
        cands.append(c)
    return {"devices": devices, "candidates": cands, "front": [int(i) for i in g["front"][()]],
            "slo_ttft_ms": 0.0, "slo_tpot_ms": 0.0, "mode": text(g.attrs["mode"]),
            "curve_layout": text(g.attrs["curve_layout"]), "predicted_best": text(g.attrs["predicted_best"]),
            "measured_best": text(g.attrs["measured_best"])}


def plot_measured_points(ax, c):
    """Each measured candidate's measurement over its prediction: a black cross joined to it."""
    done = False
    for k in c:
        m = k.get("measured")
        if not m:
            continue
        ax.plot([k["tokens_per_s_per_user"], m["tokens_per_s_per_user"]],
                [k["tokens_per_s_per_device"], m["tokens_per_s_per_device"]], ":", color="k", lw=0.8, zorder=4)
        ax.scatter([m["tokens_per_s_per_user"]], [m["tokens_per_s_per_device"]], marker="x", s=50, color="k",
                   zorder=5, label=None if done else "measured (joined to its prediction)")
        done = True


def plot_curve(ax, plan):
    """The best layout's tokens/s against M: predicted line, measured crosses (strategy 3)."""
    pts = sorted((k for k in plan["candidates"] if k["widths"] == plan["curve_layout"]), key=lambda k: k["groups"])
    ax.plot([k["groups"] for k in pts], [k["tokens_per_s"] for k in pts], "o-", color="tab:blue", label="predicted")
    meas = [k for k in pts if k.get("measured")]
    ax.scatter([k["groups"] for k in meas], [k["measured"]["tokens_per_s"] for k in meas], marker="x", s=60,
               color="k", zorder=4, label="measured")
    ax.set_xlabel("M groups in flight")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"layout {plan['curve_layout']}: groups in flight", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_front(plan, title, out_png):
    """The planner's Pareto front (see the module's docstring: <stem>_front.png); with a results
    file's plan, the measured points over the predicted ones and the groups-in-flight curve."""
    c = plan["candidates"]
    front = [i for i in plan["front"]]
    on_front = set(front)
    ttft_slo, tpot_slo = plan["slo_ttft_ms"], plan["slo_tpot_ms"]
    x = np.array([k["tokens_per_s_per_user"] for k in c])
    y = np.array([k["tokens_per_s_per_device"] for k in c])
    misses_ttft = np.array([ttft_slo > 0 and k["ttft_p50_ms"] > ttft_slo for k in c])
    measured = any(k.get("measured") for k in c)
    if measured:
        fig, (ax, ax_curve) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(9, 6))
    rest = np.array([i not in on_front for i in range(len(c))])
    ax.scatter(x[rest & ~misses_ttft], y[rest & ~misses_ttft], s=18, color="0.7", label="dominated")
    ax.scatter(x[rest & misses_ttft], y[rest & misses_ttft], s=18, facecolors="none", edgecolors="0.7")
    fx, fy = x[front], y[front]
    ax.plot(fx, fy, "-", color="tab:blue", lw=1, zorder=2)
    filled = [i for i in front if not misses_ttft[i]]
    hollow = [i for i in front if misses_ttft[i]]
    ax.scatter(x[filled], y[filled], s=40, color="tab:blue", zorder=3, label="Pareto front")
    if hollow:
        ax.scatter(x[hollow], y[hollow], s=40, facecolors="none", edgecolors="tab:blue", zorder=3,
                   label=f"misses TTFT <= {ttft_slo:g} ms")
    for i in front:
        ax.annotate(c[i]["layout"], (x[i], y[i]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    if tpot_slo > 0:
        ax.axvline(1000.0 / tpot_slo, color="tab:red", ls="--", lw=1, label=f"TPOT <= {tpot_slo:g} ms (right of it)")
    best = plan.get("best")
    if best is not None:
        ax.scatter([x[best]], [y[best]], marker="*", s=220, color="tab:orange", zorder=4,
                   label=f"best under the targets: {c[best]['layout']}")
    if measured:
        plot_measured_points(ax, c)
        plot_curve(ax_curve, plan)
    what = "predicted; crosses: measured" if measured else "predicted"
    ax.set_xlabel(f"tokens/s per user (1000 / TPOT p50, {what})")
    ax.set_ylabel(f"tokens/s per device ({what})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def serving_partitions(f):
    """The partitions of a serving scenario's file (/scenario attribute partitions), in order."""
    return [text(n) for n in f["scenario"].attrs["partitions"]]


def request_times(f, name):
    """(arrival, admitted, first token, finish, token_s split per request) of the last round, s."""
    r = f[f"benchmark/{name}/requests"]
    offset = r["token_offset"][()]
    token_s = r["token_s"][()]
    per = [token_s[offset[q]:offset[q + 1]] for q in range(len(offset) - 1)]
    return r["arrival_s"][()], r["admitted_s"][()], r["first_token_s"][()], r["finish_s"][()], per


def plot_serving(f, out_png):
    """<stem>_serving.png: TTFT and TPOT CDFs per partition (the last round's requests) and each
    partition's request timeline (queue, prefill, decode per request)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    names = serving_partitions(f)
    sc = f["scenario"].attrs
    fig = plt.figure(figsize=(13, 4.2 + 3.2 * len(names)))
    gs = fig.add_gridspec(1 + len(names), 2)
    ax_ttft, ax_tpot = fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1])
    for name in names:
        arrival, admitted, first, finish, per = request_times(f, name)
        ttft = np.sort((first - arrival) * 1e3)
        tpot = np.sort([(t[-1] - t[0]) / (len(t) - 1) * 1e3 for t in per if len(t) > 1])
        for ax, v in ((ax_ttft, ttft), (ax_tpot, tpot)):
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=name)
    for ax, what in ((ax_ttft, "TTFT (ms)"), (ax_tpot, "TPOT (ms)")):
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    for ax, key in ((ax_ttft, "ttft"), (ax_tpot, "tpot")):
        goodput = text(sc.get("goodput", ""))
        for item in goodput.split():
            k, _, ms = item.partition(":")
            if k == key:
                ax.axvline(float(ms), color="red", ls="--", lw=1)
    for i, name in enumerate(names):
        ax = fig.add_subplot(gs[1 + i, :])
        arrival, admitted, first, finish, _ = request_times(f, name)
        y = np.arange(len(arrival))
        ax.barh(y, admitted - arrival, left=arrival, color="0.8", label="queue")
        ax.barh(y, first - admitted, left=admitted, color="tab:orange", label="prefill (to first token)")
        ax.barh(y, finish - first, left=first, color="tab:blue", alpha=0.6, label="decode")
        ax.set_ylabel(f"{name}: request")
        ax.set_xlabel("s since the scenario's start (last round)")
        ax.invert_yaxis()
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{text(sc['kind'])} scenario: {int(sc['requests'])} requests, rate {float(sc['request_rate']):g} req/s")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


# Student's t quantiles (two-sided 95%) by degrees of freedom, for the rounds' intervals.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def round_interval(values):
    """Half-width of the 95% t-interval of the mean of per-round values (0 for fewer than 2)."""
    import numpy as np
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return 0.0
    return T95.get(len(v) - 1, 1.96) * float(np.std(v, ddof=1)) / np.sqrt(len(v))


def rate_search_points(f, name):
    """The measured points of partition `name`: (label, rate, group) for the pilot, the rate below
    R* (/benchmark) and above it (/rate_search/above), where the file has them."""
    rs = f["rate_search"]
    out = []
    for label, rate, path in (("pilot", rs.attrs["pilot_rate"], f"rate_search/pilot/{name}"),
                              ("0.9 R*", rs.attrs["rate_below"], f"benchmark/{name}"),
                              ("1.1 R*", rs.attrs["rate_above"], f"rate_search/above/{name}")):
        if path in f:
            out.append((label, float(rate), f[path]))
    return out


def plot_rate_search(f, out_png):
    """<stem>_rate.png: per partition the predicted curves over rates and the measured points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rs = f["rate_search"]
    a = rs.attrs
    names = [text(n) for n in a["partitions"]]
    panels = (("attainment", "slo_attainment", "rep_slo_attainment", "SLO attainment"),
              ("goodput_req_per_s", "goodput_req_per_s", "rep_goodput_req_per_s", "goodput (req/s)"),
              ("ttft_p99_ms", "ttft_p99_ms", "rep_ttft_p99_ms", "TTFT p99 (ms)"),
              ("tpot_p99_ms", "tpot_p99_ms", "rep_tpot_p99_ms", "TPOT p99 (ms)"))
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, name in enumerate(names):
        c = colours[i % len(colours)]
        pred = rs[f"predicted/{name}"]
        for ax, (curve, pooled, rep, _) in zip(axes.flat, panels):
            ax.plot(pred["rate"][()], pred[curve][()], color=c, label=f"{name} predicted")
            for k, (label, rate, g) in enumerate(rate_search_points(f, name)):
                y, h = float(g.attrs[pooled]), round_interval(g[rep][()])
                # An attainment is a fraction: its interval is clipped to [0, 1].
                lo, hi = (min(h, y), min(h, 1.0 - y)) if curve == "attainment" else (h, h)
                ax.errorbar([rate], [y], yerr=[[max(lo, 0.0)], [max(hi, 0.0)]], fmt="o", color=c,
                            capsize=3, label=f"{name} measured" if k == 0 else None)
    for ax, (_, _, _, what) in zip(axes.flat, panels):
        ax.axvline(float(a["max_rate"]), color="0.4", ls=":", lw=1)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    axes[0, 0].axhline(float(a["attainment_target"]), color="red", ls="--", lw=1)
    axes[1, 0].axhline(float(a["slo_ttft_ms"]), color="red", ls="--", lw=1)
    axes[1, 1].axhline(float(a["slo_tpot_ms"]), color="red", ls="--", lw=1)
    axes[0, 0].legend(fontsize=8, loc="lower left")
    verdict = {1: "confirmed", 0: "NOT confirmed"}.get(int(a["confirmed"]), "not measured")
    fig.suptitle(f"rate search: R* = {float(a['max_rate']):.3g} req/s ({text(a['searched_partition'])}), "
                 f"TTFT <= {float(a['slo_ttft_ms']):g} ms, TPOT <= {float(a['slo_tpot_ms']):g} ms for "
                 f"{100 * float(a['attainment_target']):g}% of requests: {verdict}")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def output_dir(args):
    """The directory the PNG files go to (--outdir, else the input's); None, with the error on
    stderr, when --outdir exists and is not a directory."""
    outdir = args.outdir or os.path.dirname(os.path.abspath(args.file))
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        print(f"ppbench_plot: error: --outdir {args.outdir}: exists and is not a directory; give a directory "
              "(created when missing)", file=sys.stderr)
        return None
    return outdir


def make_output_dir(outdir, args):
    """Creates `outdir` when missing; False, with the error on stderr, when it cannot be."""
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as e:
        print(f"ppbench_plot: error: --outdir {args.outdir}: cannot be created ({e.strerror})", file=sys.stderr)
        return False
    return True


def plan_main(args):
    """tools/ppbench_plot.py PLAN.json: the front's plot; exit status as main's."""
    try:
        plan = read_plan(args.file)
    except NotAPlan as e:
        print(f"ppbench_plot: error: {e}", file=sys.stderr)
        return 2
    outdir = output_dir(args)
    if outdir is None or not make_output_dir(outdir, args):
        return 2
    stem = os.path.splitext(os.path.basename(args.file))[0]
    png = os.path.join(outdir, f"{stem}_front.png")
    title = (f"ppbench plan: {plan['devices']} device(s), {len(plan['candidates'])} candidates, "
             f"{len(plan['front'])} on the front ({plan.get('mode', '')})")
    plot_front(plan, title, png)
    print(png)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="results file written by `ppbench run` (or `ppbench profile`: the roofline only), "
                    "or a plan written by `ppbench plan --json` (the Pareto front)")
    ap.add_argument("--iter", type=int, default=-1, help="timed repetition to draw (0-based; default: the last)")
    ap.add_argument("--outdir", help="directory for the PNG files (default: the results file's)")
    args = ap.parse_args(argv)
    if args.file.endswith(".json"):
        return plan_main(args)
    try:
        f = open_results(args.file)
    except NotAResultsFile as e:
        print(f"ppbench_plot: error: {e}", file=sys.stderr)
        return 2
    outdir = output_dir(args)
    if outdir is None:
        f.close()
        return 2
    with f:
        if "scenario" in f:
            if not make_output_dir(outdir, args):
                return 2
            png = os.path.join(outdir, os.path.splitext(os.path.basename(args.file))[0] + "_serving.png")
            plot_serving(f, png)
            print(png)
            if "rate_search" in f:
                png = os.path.join(outdir, os.path.splitext(os.path.basename(args.file))[0] + "_rate.png")
                plot_rate_search(f, png)
                print(png)
            return 0
        names = partition_names(f)
        benchmarked = any(f"benchmark/{name}" in f for name in names)
        missing = [d for d in ROOFLINE_DATASETS if d not in f]
        if not benchmarked and missing:
            print(f"ppbench_plot: error: {args.file}: no benchmarked partition (a `ppbench profile` file) and no "
                  f"roofline data (no /{missing[0]}: written by an older ppbench): nothing to plot", file=sys.stderr)
            return 2
        if missing:
            print(f"ppbench_plot: note: {args.file}: no /{missing[0]} (written by an older ppbench): no roofline",
                  file=sys.stderr)
        if not benchmarked:
            print(f"ppbench_plot: note: {args.file}: no benchmarked partition (a `ppbench profile` file): "
                  "the roofline only", file=sys.stderr)
        if not make_output_dir(outdir, args):
            return 2
        stem = os.path.splitext(os.path.basename(args.file))[0]
        written = []
        try:
            for name in names:
                if f"benchmark/{name}" not in f:
                    continue
                png = os.path.join(outdir, f"{stem}_timeline_{name}.png")
                plot_timeline(f, name, args.iter, png)
                written.append(png)
        except BadArgument as e:
            print(f"ppbench_plot: error: {e}", file=sys.stderr)
            return 2
        png = os.path.join(outdir, f"{stem}_stages.png")
        if plot_stages(f, names, png):
            written.append(png)
        png = os.path.join(outdir, f"{stem}_rounds.png")
        if plot_rounds(f, names, png):
            written.append(png)
        if not missing:
            png = os.path.join(outdir, f"{stem}_roofline.png")
            plot_roofline(f, png)
            written.append(png)
        plan = plan_of_results(f)
        if plan is not None:
            png = os.path.join(outdir, f"{stem}_front.png")
            plot_front(plan, f"ppbench run --plan: {plan['devices']} device(s), {len(plan['candidates'])} candidates, "
                       f"predicted best {plan['predicted_best']}, measured best {plan['measured_best']}", png)
            written.append(png)
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
