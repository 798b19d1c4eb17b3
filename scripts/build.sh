#!/usr/bin/env bash
# build.sh — configure and build prl into build/ (warnings are errors when PRL_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPRL_WERROR="${PRL_WERROR:-OFF}" >/dev/null
cmake --build build -j "$(nproc)"
