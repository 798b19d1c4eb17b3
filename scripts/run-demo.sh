#!/usr/bin/env bash
# run-demo.sh — the README's first command: install dependencies, build, and run the main job
# on its embedded default, the quickstart:
#   1. the SFT base of all four domains (configs/sft-base.json; cached in runs/sft-base/ and
#      skipped when it is up to date),
#   2. a short GRPO run of the Coding expert as separate processes over ZeroMQ
#      (configs/quickstart.json -> runs/quickstart/, programs in the sandbox, every sample in
#      run.db),
#   3. a before/after table of held-out accuracy on all four domains.
# Running it again continues or reuses what is there (nothing is overwritten).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
prl=build/cli/prl
t0=$(date +%s)

echo "== 1/3 SFT base (configs/sft-base.json)"
$prl sft --config configs/sft-base.json

echo "== 2/3 GRPO: the Coding expert, 25 steps (configs/quickstart.json)"
if [ -e runs/quickstart/job.json ]; then
  $prl run --resume runs/quickstart        # finishes at once when the run is done
else
  $prl run configs/quickstart.json
fi

echo "== 3/3 held-out accuracy, SFT base vs quickstart expert"
$prl eval --ckpt runs/sft-base/ckpt --compare runs/quickstart/final --domain all --n 100

echo "quickstart: done in $(( $(date +%s) - t0 )) s. The run: runs/quickstart/ (run.db, ckpt/,"
echo "  logs/); query it with sqlite3 (docs/pipeline.md). Train the four experts with"
echo "  prl run configs/{general,reasoning,coding}.json, then configs/agent.json (docs/recipes.md)."
