#!/usr/bin/env bash
# test_sft_converge.sh — SFT of the tiny MoE on 200 short generated chats, repeated, drives the
# token-mean training loss below 0.05. Usage: test_sft_converge.sh PRL SRC_DIR
set -euo pipefail
prl=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$prl" tasks demo --n 200 --seed 1 --out "$work/data.jsonl"
"$prl" sft --data "$work/data.jsonl" --model "$src/configs/models/tiny.json" --out "$work/ckpt" \
  --steps 500 --batch 16 --seq 48 --optimizer adamw --lr 3e-3 --warmup 20 --seed 1 \
  --log-every 50 2>&1 | tee "$work/log"
loss=$(grep '^step 500/500' "$work/log" | sed 's/.*loss \([0-9.]*\).*/\1/')
echo "final loss: $loss"
awk -v l="$loss" 'BEGIN { exit !(l != "" && l < 0.05) }' || { echo "FAIL: loss $loss is not below 0.05"; exit 1; }
echo "1 passed, 0 failed"
