#!/usr/bin/env bash
# run-tests.sh — install dependencies, build with warnings as errors, run every test (CTest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
PRL_WERROR=ON scripts/build.sh
cd build
ctest --output-on-failure --timeout 1200 "$@"
