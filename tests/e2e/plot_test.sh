#!/usr/bin/env bash
# End-to-end test of the analysis path on a real run: a short 2-rank CPU run (mpirun) writes a
# results file; `ppbench report` reads it (text, and CSV that pandas loads when pandas is
# installed); tools/ppbench_plot.py draws it, and the PNGs (timelines, stages, roofline) must exist
# and be non-trivial (> 20 KB: axes, labels and bars, not an empty canvas); the tools refuse an
# incomplete file (report of several files skips it and reports the others); --iter out of range
# and the legend cap of the timeline; a `ppbench profile` file gets the roofline only (exit 0);
# files of an older ppbench (no roofline datasets) get the other plots and a note, or, profile
# only, are refused (exit 2).
#
# Usage: tests/e2e/plot_test.sh BUILD_DIR [MODEL_JSON]     (ctest label e2e)
# Exit status: 0 pass, 1 fail, 77 skipped (the interpreter lacks h5py/matplotlib:
#   scripts/install_deps.sh --python installs Debian's python3-h5py/-matplotlib/-pandas).
# The interpreter is Debian's /usr/bin/python3 (the plot script's own first line), or $PYTHON.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:?usage: plot_test.sh BUILD_DIR [MODEL_JSON]}" && pwd)
MODEL=${2:-$REPO/tests/data/tiny-llama.json}
PY=${PYTHON:-/usr/bin/python3}
say() { echo "[plot_test] $*"; }
fail() { say "FAIL: $*"; exit 1; }

if ! "$PY" -c "import h5py, matplotlib, numpy" 2>/dev/null; then
  say "SKIP: $PY lacks h5py/matplotlib/numpy (scripts/install_deps.sh --python)"
  exit 77
fi
TMP=$(mktemp -d /tmp/ppbench-plot.XXXXXX)
trap 'rc=$?; [[ $rc -eq 0 ]] && rm -rf "$TMP" || say "kept $TMP"' EXIT

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
H5="$TMP/run.h5"
say "running ppbench on 2 ranks ($MODEL)"
mpirun --oversubscribe -np 2 "$BUILD/ppbench" run --model "$MODEL" -b 2 -p 8 -g 4 --iters 2 --target-ci 0 --warmup 1 \
  --profile-warmup 1 --profile-iters 2 --quiet -o "$H5" >"$TMP/run.log" 2>&1 ||
  { cat "$TMP/run.log"; fail "ppbench run failed"; }

"$BUILD/ppbench" report "$H5" >"$TMP/report.txt" || fail "ppbench report failed"
grep -q "== ppbench summary" "$TMP/report.txt" || fail "report printed no summary"
cp "$H5" "$TMP/run2.h5"
# Two files (one given twice: reported once, with a note on stderr).
"$BUILD/ppbench" report "$H5" "$TMP/run2.h5" "$H5" --csv >"$TMP/report.csv" 2>"$TMP/report.err" ||
  fail "ppbench report --csv failed"
grep -q "given more than once" "$TMP/report.err" || fail "report did not note the repeated file"
if "$PY" -c "import pandas" 2>/dev/null; then
  "$PY" - "$TMP/report.csv" <<'PYEOF' || fail "pandas cannot load the CSV"
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
assert len(df) == 4, df                      # 2 files x (uniform, balanced)
assert {"tokens_per_s", "ttft_p50_ms", "partition", "validation"} <= set(df.columns), df.columns
assert df["tokens_per_s"].dtype.kind == "f" and (df["tokens_per_s"] > 0).all(), df
print(df[["partition", "counts", "tokens_per_s", "max_bubble", "validation"]].to_string())
PYEOF
fi

# As README writes it: the script runs as it is (executable, /usr/bin/python3), from any directory.
if [[ $PY == /usr/bin/python3 ]]; then
  (cd "$TMP" && "$REPO/tools/ppbench_plot.py" "$H5" >"$TMP/plot.log") || { cat "$TMP/plot.log"; fail "tools/ppbench_plot.py failed"; }
else
  "$PY" "$REPO/tools/ppbench_plot.py" "$H5" >"$TMP/plot.log" || { cat "$TMP/plot.log"; fail "ppbench_plot.py failed"; }
fi
# Without its modules (-S: no site-packages, so no h5py): exit 3 naming what to install, no traceback.
set +e
"$PY" -I -S "$REPO/tools/ppbench_plot.py" "$H5" 2>"$TMP/nomod.err" </dev/null; rcm=$?
set -e
grep -q "apt-get install python3-h5py python3-matplotlib" "$TMP/nomod.err" && ! grep -q Traceback "$TMP/nomod.err" && [[ $rcm -eq 3 ]] ||
  { cat "$TMP/nomod.err"; fail "missing modules: rc $rcm"; }
# --iter out of range: exit 2, the message repeats the value given (not the normalised one).
set +e
"$PY" "$REPO/tools/ppbench_plot.py" "$H5" --iter -7 --outdir "$TMP/bad" 2>"$TMP/iter.err"; rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q -- "--iter -7 out of range" "$TMP/iter.err" || { cat "$TMP/iter.err"; fail "--iter -7: rc $rc"; }
# The timeline legend stays short with many groups (M = 1000: 7 groups + "..." + 3 styles).
PYTHONPATH="$REPO/tools" "$PY" - <<'PYEOF' || fail "legend of M=1000 groups not capped"
import matplotlib.pyplot as plt
import ppbench_plot as pp
labels = [h.get_label() for h in pp.legend_handles(1000, plt.get_cmap("tab20"))]
assert len(labels) == pp.LEGEND_GROUPS + 3, labels
assert labels[pp.LEGEND_GROUPS - 1] == "... groups 7..999 (colours repeat every 20)", labels
assert len(pp.legend_handles(8, plt.get_cmap("tab10"))) == 8 + 3
# Roofline panels: every rank up to 4; beyond, rank 0 and the rank of the lowest peak_gflops.
assert pp.roofline_ranks([5.0, 1.0, 3.0]) == [0, 1, 2]
assert pp.roofline_ranks([5.0, 4.0, 3.0, 6.0, 2.0, 7.0]) == [0, 4]
assert pp.roofline_ranks([1.0, 4.0, 3.0, 6.0, 2.0]) == [0]
PYEOF
# The stages figure draws each partition's cross-calibrated prediction (the hatched bars) at the
# file's values, beside the profile's prediction and the measured stages; none without it. This
# short run may measure one split (the profile finds balanced = uniform: no cross-calibration) or
# two, so two copies are checked: one with a cross-calibration for every partition (each stage's
# prediction x 1.1 where the run has none, as a run of two splits writes it), one without any.
cp "$H5" "$TMP/crossed.h5"
cp "$H5" "$TMP/uncrossed.h5"
"$PY" - "$TMP/crossed.h5" "$TMP/uncrossed.h5" <<'PYEOF' || fail "could not make the copies with and without a cross-calibration"
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for name in f["benchmark"]:
        if "predicted_stage_cross_ms" in f[f"partitions/{name}"]:
            continue
        pred = f[f"partitions/{name}/predicted_stage_ms"][...]
        f[f"partitions/{name}"].create_dataset("predicted_stage_cross_ms", data=1.1 * pred)
        mean = f[f"benchmark/{name}/measured_stage_mean_ms"][...]
        f[f"benchmark/{name}"].create_dataset("prediction_error_cross", data=mean / (1.1 * pred) - 1)
with h5py.File(sys.argv[2], "r+") as f:
    for name in f["benchmark"]:
        for path in (f"partitions/{name}/predicted_stage_cross_ms", f"benchmark/{name}/prediction_error_cross"):
            if path in f:
                del f[path]
PYEOF
PYTHONPATH="$REPO/tools" "$PY" - "$TMP/crossed.h5" "$TMP/uncrossed.h5" "$TMP/stages_check.png" <<'PYEOF' ||
import sys
import numpy as np
import ppbench_plot as pp
kept = []
pp.plt.close = lambda fig=None: kept.append(fig) if hasattr(fig, "axes") else None  # keep the figure
for path, crossed in ((sys.argv[1], True), (sys.argv[2], False)):
    f = pp.open_results(path)
    names = [n for n in pp.partition_names(f) if f"benchmark/{n}" in f]
    kept.clear()
    assert pp.plot_stages(f, names, sys.argv[3])
    axes = kept[0].axes
    for j, name in enumerate(names):
        part, bench = f[f"partitions/{name}"], f[f"benchmark/{name}"]
        hatched = [p.get_height() for p in axes[j].patches if p.get_hatch()]
        plain = sorted(p.get_height() for p in axes[j].patches if not p.get_hatch())
        np.testing.assert_allclose(plain, sorted(np.concatenate([part["predicted_stage_ms"][...],
                                                                 bench["measured_stage_ms"][...]])), rtol=1e-12)
        if crossed:
            np.testing.assert_allclose(hatched, part["predicted_stage_cross_ms"][...], rtol=1e-12)
            texts = [t.get_text() for t in axes[j].texts]
            for e in bench["prediction_error_cross"][...]:
                assert f"{100 * e:+.1f}%" in texts, (f"{100 * e:+.1f}%", texts)
        else:
            assert hatched == [], hatched
print("stages figure: cross-calibrated bars at the file's values, none without them")
PYEOF
  fail "stages figure: cross-calibrated bars wrong"
for png in run_timeline_uniform.png run_timeline_balanced.png run_stages.png run_rounds.png run_roofline.png; do
  [[ -f "$TMP/$png" ]] || fail "missing $png"
  size=$(stat -c %s "$TMP/$png")
  (( size > 20000 )) || fail "$png is only $size bytes"
  say "$png: $size bytes"
done

# An incomplete file (a run that crashed while writing) is refused by both tools, exit 2.
cp "$H5" "$TMP/broken.h5"
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f.attrs['complete']=0; f.close()" "$TMP/broken.h5"
set +e
"$BUILD/ppbench" report "$TMP/broken.h5" 2>"$TMP/err1.txt"; rc1=$?
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/broken.h5" 2>"$TMP/err2.txt"; rc2=$?
# With several files, report skips the incomplete one (listed on stderr) and reports the others.
"$BUILD/ppbench" report "$TMP/broken.h5" "$H5" --csv >"$TMP/mixed.csv" 2>"$TMP/err3.txt"; rc3=$?
"$BUILD/ppbench" report "$TMP/broken.h5" "$TMP/missing.h5" 2>"$TMP/err4.txt"; rc4=$?
set -e
[[ $rc1 -eq 2 ]] && grep -q incomplete "$TMP/err1.txt" || fail "report accepted an incomplete file (rc $rc1)"
[[ $rc3 -eq 0 ]] && grep -q "skipped: .*broken.h5.*incomplete" "$TMP/err3.txt" || fail "mixed report: rc $rc3"
[[ $(wc -l <"$TMP/mixed.csv") -eq 3 ]] || fail "mixed report: expected header + 2 rows"
[[ $rc4 -eq 2 ]] && grep -q "missing.h5" "$TMP/err4.txt" || fail "report of unreadable files only: rc $rc4"
[[ $rc2 -eq 2 ]] && grep -q incomplete "$TMP/err2.txt" || fail "ppbench_plot accepted an incomplete file (rc $rc2)"

# A `ppbench profile` file (no partitions, no /benchmark): the roofline only, exit 0, with a note.
say "running ppbench profile on 2 ranks"
mpirun --oversubscribe -np 2 "$BUILD/ppbench" profile --model "$MODEL" -b 2 -p 8 -g 4 --profile-warmup 1 \
  --profile-iters 2 --quiet -o "$TMP/prof.h5" >"$TMP/prof.log" 2>&1 || { cat "$TMP/prof.log"; fail "ppbench profile failed"; }
mkdir "$TMP/profout" "$TMP/oldprofout" "$TMP/oldout"
# Files of an older ppbench, without the roofline's datasets.
DROP="import h5py,sys; f=h5py.File(sys.argv[1],'r+'); [f.__delitem__(d) for d in ('ranks/read_bandwidth_GBps','ranks/read_bandwidth_shared_GBps','ranks/peak_gflops','profile/unit_flops','profile/unit_bytes','profile/floor_ms','profile/efficiency')]; f.close()"
cp "$TMP/prof.h5" "$TMP/oldprof.h5"
"$PY" -c "$DROP" "$TMP/oldprof.h5"
cp "$H5" "$TMP/old.h5"
"$PY" -c "$DROP" "$TMP/old.h5"
set +e
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/prof.h5" --outdir "$TMP/profout" >"$TMP/out5.txt" 2>"$TMP/err5.txt"; rc5=$?
# An older profile-only file has nothing to plot: says why, exit 2, writes nothing.
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/oldprof.h5" --outdir "$TMP/oldprofout" 2>"$TMP/err9.txt"; rc9=$?
# An older run's file: the timelines and stages, a one-line note instead of the roofline, exit 0.
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/old.h5" --outdir "$TMP/oldout" >"$TMP/out10.txt" 2>"$TMP/err10.txt"; rc10=$?
# --outdir that is not a directory: exit 2 with a message, no traceback.
"$PY" "$REPO/tools/ppbench_plot.py" "$H5" --outdir /dev/null 2>"$TMP/err6.txt"; rc6=$?
# A plain HDF5 file, and a ppbench file of a newer format.
"$PY" -c "import h5py,sys; h5py.File(sys.argv[1],'w').close()" "$TMP/other.h5"
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/other.h5" 2>"$TMP/err7.txt"; rc7=$?
cp "$H5" "$TMP/newer.h5"
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f.attrs['format_version']=99; f.close()" "$TMP/newer.h5"
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/newer.h5" 2>"$TMP/err8.txt"; rc8=$?
set -e
[[ $rc5 -eq 0 ]] && grep -q "prof.h5: no benchmarked partition (a \`ppbench profile\` file): the roofline only" "$TMP/err5.txt" &&
  ! grep -q Traceback "$TMP/err5.txt" || { cat "$TMP/err5.txt"; fail "profile-only file: rc $rc5"; }
[[ $(ls -A "$TMP/profout") == prof_roofline.png ]] || fail "profile-only file wrote '$(ls "$TMP/profout")', not prof_roofline.png alone"
[[ $(cat "$TMP/out5.txt") == "$TMP/profout/prof_roofline.png" ]] || fail "profile-only file: printed '$(cat "$TMP/out5.txt")'"
size=$(stat -c %s "$TMP/profout/prof_roofline.png")
(( size > 20000 )) || fail "prof_roofline.png is only $size bytes"
say "prof_roofline.png: $size bytes"
[[ $rc9 -eq 2 ]] && grep -q "oldprof.h5: no benchmarked partition (a \`ppbench profile\` file) and no roofline data" "$TMP/err9.txt" &&
  ! grep -q Traceback "$TMP/err9.txt" || { cat "$TMP/err9.txt"; fail "older profile-only file: rc $rc9"; }
[[ -z $(ls -A "$TMP/oldprofout") ]] || fail "older profile-only file wrote $(ls "$TMP/oldprofout")"
[[ $rc10 -eq 0 ]] && grep -q "old.h5: no /ranks/read_bandwidth_GBps (written by an older ppbench): no roofline" "$TMP/err10.txt" &&
  [[ $(wc -l <"$TMP/err10.txt") -eq 1 ]] || { cat "$TMP/err10.txt"; fail "older run file: rc $rc10"; }
[[ $(ls "$TMP/oldout" | tr '\n' ' ') == "old_rounds.png old_stages.png old_timeline_balanced.png old_timeline_uniform.png " ]] ||
  fail "older run file wrote $(ls "$TMP/oldout")"
[[ $rc6 -eq 2 ]] && grep -q -- "--outdir /dev/null: exists and is not a directory" "$TMP/err6.txt" &&
  ! grep -q Traceback "$TMP/err6.txt" || { cat "$TMP/err6.txt"; fail "--outdir /dev/null: rc $rc6"; }
[[ $rc7 -eq 2 ]] && grep -q "not a ppbench results file" "$TMP/err7.txt" || { cat "$TMP/err7.txt"; fail "plain HDF5: rc $rc7"; }
[[ $rc8 -eq 2 ]] && grep -q "format_version 99.*use a newer ppbench" "$TMP/err8.txt" || { cat "$TMP/err8.txt"; fail "format 99: rc $rc8"; }
# The planner's front (`ppbench plan --json`): a PNG of the candidates, > 20 KB; a JSON that is
# not a plan: exit 2 naming what it lacks.
"$BUILD/ppbench" plan "$H5" --devices 4 --slo-tpot 1 --json "$TMP/plan.json" >"$TMP/plan.txt" || fail "ppbench plan failed"
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/plan.json" --outdir "$TMP/planout" >"$TMP/plan_plot.txt" || fail "plot of the plan failed"
[[ $(cat "$TMP/plan_plot.txt") == "$TMP/planout/plan_front.png" ]] || fail "plan plot printed '$(cat "$TMP/plan_plot.txt")'"
size=$(stat -c %s "$TMP/planout/plan_front.png")
(( size > 20000 )) || fail "plan_front.png is only $size bytes"
say "plan_front.png: $size bytes"
# A `run --plan` file: its front with the measured points and the groups-in-flight curve.
mpirun --oversubscribe -np 2 "$BUILD/ppbench" run --model "$MODEL" -b 2 -p 8 -g 4 --iters 2 --target-ci 0 --plan 2 \
  -o "$TMP/planrun.h5" >"$TMP/planrun.log" 2>&1 || { cat "$TMP/planrun.log"; fail "ppbench run --plan failed"; }
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/planrun.h5" --outdir "$TMP/planrunout" >"$TMP/planrun_plot.txt" ||
  fail "plot of the --plan run failed"
grep -qx "$TMP/planrunout/planrun_front.png" "$TMP/planrun_plot.txt" || fail "no planrun_front.png: $(cat "$TMP/planrun_plot.txt")"
size=$(stat -c %s "$TMP/planrunout/planrun_front.png")
(( size > 30000 )) || fail "planrun_front.png is only $size bytes"
say "planrun_front.png (measured points, curve): $size bytes"
echo '{"devices": 2}' >"$TMP/notplan.json"
set +e
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/notplan.json" 2>"$TMP/err11.txt"; rc11=$?
set -e
[[ $rc11 -eq 2 ]] && grep -q "not \`ppbench plan --json\` output" "$TMP/err11.txt" && ! grep -q Traceback "$TMP/err11.txt" ||
  { cat "$TMP/err11.txt"; fail "not a plan: rc $rc11"; }
# A serving scenario's file: its CDFs and request timelines (<stem>_serving.png), and `report`.
mpirun --oversubscribe -np 2 "$BUILD/ppbench" run --model "$MODEL" -b 2 -p 12 -g 6 --iters 1 --target-ci 0 \
  --scenario poisson --request-rate 50 --requests 12 --prompt-lens uniform:2,12 --gen-lens uniform:1,6 --goodput ttft:50 \
  -o "$TMP/serve.h5" >"$TMP/serve.log" 2>&1 || { cat "$TMP/serve.log"; fail "ppbench run --scenario failed"; }
# (to a file first: `| grep -q` under pipefail fails when grep exits before report's last write)
"$BUILD/ppbench" report "$TMP/serve.h5" >"$TMP/serve_report.txt" || fail "report of the scenario's file failed"
grep -q "serving scenario: poisson at 50 requests/s, 12 requests" "$TMP/serve_report.txt" || fail "report printed no scenario"
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/serve.h5" --outdir "$TMP/serveout" >"$TMP/serve_plot.txt" || fail "plot of the scenario failed"
grep -qx "$TMP/serveout/serve_serving.png" "$TMP/serve_plot.txt" || fail "no serve_serving.png: $(cat "$TMP/serve_plot.txt")"
size=$(stat -c %s "$TMP/serveout/serve_serving.png")
(( size > 30000 )) || fail "serve_serving.png is only $size bytes"
say "serve_serving.png (CDFs, request timelines): $size bytes"
# --request-rate search: the predicted curves and the measured points (<stem>_rate.png), and `report`.
# TTFT 1 ms: the tiny model's steps take microseconds, and the simulator's TTFT with all 48
# requests at once is 2-5 ms here, so that a 5 ms limit bound only some runs (the search then
# ends "unbounded": no rate to measure); 1 ms binds by a factor of 2-5.
mpirun --oversubscribe -np 2 "$BUILD/ppbench" run --model "$MODEL" -b 2 -p 12 -g 6 --iters 2 --target-ci 0 \
  --scenario poisson --request-rate search --requests 48 --prompt-lens uniform:2,12 --gen-lens uniform:2,6 \
  --goodput ttft:1 tpot:50 -o "$TMP/search.h5" >"$TMP/search.log" 2>&1 ||
  { cat "$TMP/search.log"; fail "ppbench run --request-rate search failed"; }
"$BUILD/ppbench" report "$TMP/search.h5" >"$TMP/search_report.txt" || fail "report of the rate search failed"
grep -q "rate search verdict:" "$TMP/search_report.txt" || fail "report printed no rate search"
"$PY" "$REPO/tools/ppbench_plot.py" "$TMP/search.h5" --outdir "$TMP/searchout" >"$TMP/search_plot.txt" ||
  fail "plot of the rate search failed"
grep -qx "$TMP/searchout/search_rate.png" "$TMP/search_plot.txt" || fail "no search_rate.png: $(cat "$TMP/search_plot.txt")"
size=$(stat -c %s "$TMP/searchout/search_rate.png")
(( size > 30000 )) || fail "search_rate.png is only $size bytes"
say "search_rate.png (predicted curves, measured points): $size bytes"
# The script's newest format is the one this build writes.
grep -q "kResultsFormatVersion = $("$PY" -c "import sys; sys.path.insert(0, '$REPO/tools'); import ppbench_plot as p; print(p.RESULTS_FORMAT_VERSION)");" \
  "$REPO/src/results/writer.h" || fail "RESULTS_FORMAT_VERSION of ppbench_plot.py differs from kResultsFormatVersion"
say "PASS"
