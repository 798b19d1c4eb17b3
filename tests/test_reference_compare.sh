#!/usr/bin/env bash
# test_reference_compare.sh — prl vs the independent PyTorch reference on one batch:
# logits relative error < 1e-5 and every parameter gradient < 1e-4 (the reference's
# `compare` exits non-zero otherwise). Usage: test_reference_compare.sh PRL REF_DUMP SRC_DIR
# [CONFIG] (default configs/models/ref-check.json)
set -euo pipefail
prl=$1 dump=$2 src=$3 config=${4:-$3/configs/models/ref-check.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$prl" init --model "$config" --seed 5 --out "$work/ckpt"
"$dump" "$work/ckpt" "$work/batch.safetensors" "$work/prl.safetensors"
/usr/bin/python3 "$src/reference/pangu_ref.py" compare --ckpt "$work/ckpt" \
  --batch "$work/batch.safetensors" --prl "$work/prl.safetensors"
