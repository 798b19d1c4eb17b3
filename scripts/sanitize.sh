#!/usr/bin/env bash
# sanitize.sh — build everything with AddressSanitizer + UndefinedBehaviorSanitizer
# (PRL_SANITIZE=ON) in build-asan/ and run the Check unit suites (CTest label "unit") under
# them: any report fails the run. Extra arguments go to ctest (e.g. -R test_bus).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DPRL_SANITIZE=ON -DPRL_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build-asan -j "$(nproc)" > build-asan/build.log 2>&1 || { tail -30 build-asan/build.log; exit 1; }
# halt on the first report; UBSan prints where. Leak checks are the fuzzers' (scripts/fuzz.sh,
# on the product's parsers): the suites' fixtures are not freed before a test ends.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd build-asan
ctest -L unit --output-on-failure --timeout 1200 "$@"
