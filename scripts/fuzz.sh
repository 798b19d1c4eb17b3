#!/usr/bin/env bash
# fuzz.sh — build the libFuzzer harnesses of tests/fuzz/ (clang, ASan + UBSan) in build-fuzz/
# and run each for SECONDS (default 60) over its seed corpus (tests/fuzz/corpus/NAME; new
# inputs go to build-fuzz/corpus/NAME, the repo's seeds are only read). Exit 1 on any crash,
# leak or sanitizer report, its input kept in build-fuzz/artifacts/. Usage: fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
CC=clang cmake -S . -B build-fuzz -DPRL_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build-fuzz --target fuzzers -j "$(nproc)" > build-fuzz/build.log 2>&1 ||
  { tail -30 build-fuzz/build.log; exit 1; }
mkdir -p build-fuzz/artifacts
status=0
for name in bus safetensors tokenizer job prompts gateway; do
  mkdir -p "build-fuzz/corpus/$name"
  log=build-fuzz/fuzz_$name.log
  if build-fuzz/tests/fuzz/fuzz_$name "build-fuzz/corpus/$name" "tests/fuzz/corpus/$name" \
       -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="build-fuzz/artifacts/${name}-" -print_final_stats=1 > "$log" 2>&1; then
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
    echo "fuzz $name: $runs inputs in ${seconds}s, 0 crashes"
  else
    echo "fuzz $name: FAILED (build-fuzz/artifacts/, $log):"
    grep -E "ERROR|SUMMARY|runtime error" "$log" | head -5
    status=1
  fi
done
exit $status
