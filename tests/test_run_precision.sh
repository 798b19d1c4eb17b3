#!/usr/bin/env bash
# test_run_precision.sh — `prl run --check` with the precision keys: every train precision
# (trainer.precision) with every rollout precision (rollout.precision) is accepted, and bad
# precision or loss-scale values are refused naming the key. Only validation runs (no
# process starts), against a stand-in init directory. Usage: test_run_precision.sh PRL SRC_DIR
set -uo pipefail
prl=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
. "$src/tests/lib.sh"   # ok, bad, expect_fail, expect_ok

# --check only looks for the init checkpoint's config.json and tokenizer.json
mkdir -p "$work/init" && echo '{}' > "$work/init/config.json" && echo '{}' > "$work/init/tokenizer.json"
run_check() { $prl run "$src/configs/quickstart.json" --check --runs "$work/runs" --set model.init="$work/init" "$@"; }
for t in fp32 bf16 fp16; do
  for r in fp32 bf16 fp16 aligned; do
    expect_ok "train $t with rollout $r passes --check" \
      run_check --set trainer.precision=$t --set rollout.precision=$r
  done
done
expect_ok "fp16 with the megatron scaler and set constants" run_check --set trainer.precision=fp16 \
  --set trainer.loss_scale.preset=verl_megatron --set trainer.loss_scale.hysteresis=3 \
  --set trainer.loss_scale.growth_interval=500
expect_fail "unknown train precision" "trainer.precision" run_check --set trainer.precision=fp8
expect_fail "bad scaler preset" "trainer.loss_scale.preset" run_check --set trainer.loss_scale.preset=apex
expect_fail "bad backoff" "trainer.loss_scale.backoff_factor" run_check --set trainer.loss_scale.backoff_factor=2
expect_fail "min_scale above the initial scale" "min_scale" run_check \
  --set trainer.loss_scale.preset=megatron --set trainer.loss_scale.init=1024 --set trainer.loss_scale.min_scale=4096

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
