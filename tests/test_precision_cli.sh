#!/usr/bin/env bash
# test_precision_cli.sh — the precision settings at the command line: `prl run --check`
# accepts every train precision (trainer.precision) with every rollout precision
# (rollout.precision) and refuses bad precision or loss-scale values naming the key (only
# validation runs, against a tiny random init checkpoint); `prl sft --precision fp16` trains with
# a loss scaler shown in its progress line, and bad flags are named.
# Usage: test_precision_cli.sh PRL SRC_DIR
set -uo pipefail
prl=$1 src=$2
. "$src/tests/lib.sh"   # work, ok, bad, expect_fail, expect_ok, summary

# --check loads the init checkpoint as the roles will: a tiny random one
$prl tasks demos --domain reasoning --n 8 --seed 1 > "$work/demos.jsonl" 2>/dev/null
$prl tokenizer train --data "$work/demos.jsonl" --vocab 300 --out "$work/tok.json" >/dev/null 2>&1
$prl init --model "$src/configs/models/tiny.json" --out "$work/init" --tokenizer "$work/tok.json" 2>/dev/null
run_check() { $prl run "$src/configs/quickstart.json" --check --runs "$work/runs" --set model.init="$work/init" "$@"; }
for t in fp32 bf16 fp16; do
  for r in fp32 bf16 fp16 aligned aligned-bf16 aligned-fp16; do
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

# SFT on the tiny model: two short fp16 steps with the default torch scaler
n_sft=0   # each run writes a new --out (an existing one is refused)
sft() { n_sft=$((n_sft + 1)); $prl sft --data "$work/demos.jsonl" --model "$src/configs/models/tiny.json" \
  --seq 64 --batch 2 --steps 2 --log-every 1 --threads 1 --out "$work/sft$n_sft" "$@"; }
expect_ok "sft --precision fp16" sft --precision fp16
grep -q "step 2/2 .* scale 65536  skipped 0" "$work/last.out" && ok "sft fp16 progress shows the scale" \
  || bad "sft fp16 progress: $(tail -2 "$work/last.out")"
expect_ok "sft --precision bf16 (no scaler)" sft --precision bf16
grep -q "scale" "$work/last.out" && bad "bf16 sft ran a scaler" || ok "bf16 sft: no scaler by default"
expect_fail "sft: unknown precision" "--precision: unknown precision 'fp8'" sft --precision fp8
expect_fail "sft: unknown scaler" "--loss-scale" sft --precision fp16 --loss-scale apex

summary
