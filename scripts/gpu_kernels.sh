#!/usr/bin/env bash
# Per-kernel times of one ppb_gpu_bench case under Nsight Compute (ncu), for where a layer's
# time goes against its floor (the first H200 run: a Llama-3.1-8B decode layer at B=8, context
# 2,048 took 0.339 ms against a 0.119 ms memory floor). Run on the GPU machine after
# scripts/gpu_check.sh has unpacked or built the binaries:
#   scripts/gpu_kernels.sh BENCH_BIN [CASE] [MODEL]     (CASE default "layer decode")
# Prints one line per kernel launch of the timed forward: name, duration (µs), DRAM bytes
# read and written (MB) and the DRAM throughput as % of peak; clocks left as they are
# (--clock-control none). Exit status: ncu's.
set -u
BENCH_BIN=${1:?usage: gpu_kernels.sh BENCH_BIN [CASE] [MODEL]}
CASE=${2:-layer decode}
MODEL=${3:-inputs/models/llama-3.1-8b.json}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu_kernels: no ncu on this machine"; exit 3; }
# ppb_gpu_bench --only brackets the case's timed forwards (not the ceilings, not the warm-up)
# with cudaProfilerStart/Stop; --iters 1: one forward.
"$NCU" --clock-control none --profile-from-start off --csv --print-units base \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  "$BENCH_BIN" --model "$MODEL" --dtype bf16 --batch 8 --context 2048 --iters 1 --only "$CASE" >"${TMPDIR:-/tmp}/ncu.csv" 2>"${TMPDIR:-/tmp}/ncu.err"
rc=$?
python3 - "${TMPDIR:-/tmp}/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("no kernel rows (see ncu.err)"); sys.exit(0)
head, data = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
per = collections.OrderedDict()
for r in data:
    k = (int(r[ix["ID"]]), r[ix["Kernel Name"]][:70])
    per.setdefault(k, {})[r[ix["Metric Name"]]] = float(r[ix["Metric Value"]].replace(",", ""))
last = list(per.items())  # the one timed forward (profiler range)
tot = sum(m.get("gpu__time_duration.sum", 0) for _, m in last)
print(f"{'kernel':70s} {'us':>8s} {'MB read':>8s} {'MB wr':>7s} {'DRAM%':>6s}")
for (i, name), m in last:
    print(f"{name:70s} {m.get('gpu__time_duration.sum', 0)/1e3:8.1f} {m.get('dram__bytes_read.sum', 0)/1e6:8.1f} "
          f"{m.get('dram__bytes_write.sum', 0)/1e6:7.1f} {m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', 0):6.1f}")
print(f"{'sum of the last forward (' + str(len(last)) + ' launches)':70s} {tot/1e3:8.1f}")
PY
tail -3 "${TMPDIR:-/tmp}/ncu.err"
exit $rc
