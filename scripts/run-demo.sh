#!/usr/bin/env bash
# run-demo.sh — install dependencies, build, and run the main job on its embedded default:
# a short SFT run of the tiny MLA+MoE model on generated arithmetic chats, then scoring.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
prl=build/cli/prl
run=runs/demo
mkdir -p "$run"
$prl tasks demo --n 200 --seed 1 --out "$run/data.jsonl"
$prl sft --data "$run/data.jsonl" --model configs/models/tiny.json --out "$run/ckpt" \
  --steps "${PRL_DEMO_STEPS:-500}" --batch 16 --seq 48 --optimizer adamw --lr 3e-3 --warmup 20 \
  --seed 1 --log-every 25
head -n 3 "$run/data.jsonl" > "$run/score.jsonl"
$prl score --ckpt "$run/ckpt" --input "$run/score.jsonl"
echo "demo: assistant tokens (what SFT trains on) should score near 0; prompt tokens are never"
echo "      trained on, so their log-probs stay low. Checkpoint: $run/ckpt (config.json,"
echo "      model.safetensors, tokenizer.json, optimizer state)"
