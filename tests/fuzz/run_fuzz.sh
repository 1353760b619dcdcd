#!/usr/bin/env bash
# Builds the config-parser fuzzer (clang, -fsanitize=fuzzer,address,undefined) in build-fuzz/
# and runs it for SECONDS (default 120) on a copy of tests/fuzz/corpus. Exits non-zero on any
# crash, leak, timeout (> 5 s for one input), out-of-memory (> 2 GiB) or non-UserError exception;
# the failing input is left in build-fuzz/artifacts/. Reproduce one with
#   build-fuzz/fuzz_model_config build-fuzz/artifacts/crash-...
# Usage: tests/fuzz/run_fuzz.sh [SECONDS]   (CXX: the clang++ to use, default clang++)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-120}
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "usage: $0 [SECONDS > 0]" >&2; exit 2; }
out=build-fuzz
cxx=${CXX:-clang++}

# Debian's clang + compiler-rt (libFuzzer, ASan, UBSan runtimes), only when missing.
if ! command -v "$cxx" >/dev/null || ! echo 'int main(){}' |
     "$cxx" -x c++ -fsanitize=fuzzer-no-link,address - -o /dev/null 2>/dev/null; then
  missing=(clang libclang-rt-dev)
  echo "[fuzz] apt-get install ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# One direct compile: the parser is pure C++ and needs only common/error.h (nlohmann-json is
# header-only) beside src/model/.
mkdir -p "$out"
sources=(tests/fuzz/fuzz_model_config.cpp src/model/*.cpp)
bin=$out/fuzz_model_config
if [ ! -x "$bin" ] || [ -n "$(find "${sources[@]}" src/model/*.h src/common/error.h -newer "$bin")" ]; then
  echo "[fuzz] building $bin"
  "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
         -fno-sanitize-recover=all -Isrc "${sources[@]}" -o "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi

# Fuzz a copy of the seed corpus, so that the checked-in one only changes by hand.
work=$out/corpus
rm -rf "$work" "$out/artifacts"
mkdir -p "$work" "$out/artifacts"
cp tests/fuzz/corpus/* "$work"/
log=$out/fuzz.log
echo "[fuzz] running $bin for ${seconds}s (log: $log)"
rc=0
# Every failure kind exits 1 (libFuzzer's defaults are 77 and 70; 77 is ctest's "skipped").
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
  "$bin" -max_total_time="$seconds" -max_len=8192 -timeout=5 -rss_limit_mb=2048 \
         -error_exitcode=1 -timeout_exitcode=1 -dict=tests/fuzz/json.dict \
         -artifact_prefix="$out/artifacts/" -print_final_stats=1 "$work" >"$log" 2>&1 || rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
if [ $rc -ne 0 ]; then
  tail -n 60 "$log"
  echo "[fuzz] FAILED (exit status $rc); input(s): $(ls "$out/artifacts" | tr '\n' ' ')" >&2
  exit 1
fi
echo "[fuzz] passed: ${execs:-?} executions in ${seconds}s ($(( ${execs:-0} / seconds ))/s)," \
     "corpus $(ls tests/fuzz/corpus | wc -l) -> $(ls "$work" | wc -l) inputs, no crash/leak/timeout"
