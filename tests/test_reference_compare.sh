#!/usr/bin/env bash
# test_reference_compare.sh — prl vs the independent PyTorch reference on one batch:
# logits relative error < 1e-5 and every parameter gradient < 1e-4 (the reference's
# `compare` exits non-zero otherwise). Usage: test_reference_compare.sh PRL REF_DUMP SRC_DIR
# [CONFIG [REF_DUMP64]] (default configs/models/ref-check.json).
#
# With REF_DUMP64 (the engine built in double) the double engine must also agree with the
# float64 reference (logits < 1e-12, gradients < 1e-6), and one exception is allowed to the
# float32 check: a single scalar gradient that fails even the reference's float32 floor (a sum
# with heavy cancellation, e.g. mHC branch_alpha_pre) passes when the double engine agrees on
# it — then the gap is float32 rounding, not a wrong formula. The exception is printed.
#
# PRL_REF_PACK=1: the batch is packed (ref_dump --pack: several sequences per row, each
# computed as if alone; docs/model.md "Packed sequences"), in both engines.
set -euo pipefail
prl=$1 dump=$2 src=$3 config=${4:-$3/configs/models/ref-check.json} dump64=${5:-}
pack=${PRL_REF_PACK:+--pack}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3 ref=$src/reference/pangu_ref.py
"$prl" init --model "$config" --seed 5 --out "$work/ckpt"
cp -r "$work/ckpt" "$work/ckpt64" # ref_dump rewrites its checkpoint: the double run starts afresh
"$dump" "$work/ckpt" "$work/batch.safetensors" "$work/prl.safetensors" $pack
status=0
$py "$ref" compare --ckpt "$work/ckpt" --batch "$work/batch.safetensors" \
  --prl "$work/prl.safetensors" || status=$?
[ -z "$dump64" ] && exit $status
[ $status -le 1 ] || exit $status
# the double engine on the same weights (ref_dump64 perturbs the fresh copy as ref_dump did)
"$dump64" "$work/ckpt64" "$work/batch64.safetensors" "$work/prl64.safetensors" $pack
echo "double engine vs float64 reference (logits < 1e-12, gradients < 1e-6):"
$py "$ref" compare --ckpt "$work/ckpt64" --batch "$work/batch64.safetensors" \
  --prl "$work/prl64.safetensors" --logits-tol 1e-12 --grad-tol 1e-6 --json > "$work/rep64.json" || {
  $py "$ref" compare --ckpt "$work/ckpt64" --batch "$work/batch64.safetensors" \
    --prl "$work/prl64.safetensors" --logits-tol 1e-12 --grad-tol 1e-6 | grep -v '^ok'; exit 1; }
[ $status -eq 0 ] && { echo "double engine: PASS"; exit 0; }
# the float32 check failed: allowed only for one scalar gradient over the float32 floor
$py "$ref" compare --ckpt "$work/ckpt" --batch "$work/batch.safetensors" \
  --prl "$work/prl.safetensors" --json > "$work/rep32.json" || true
$py - "$work/rep32.json" "$work/rep64.json" "$work/prl.safetensors" "$src/reference" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[4])
from pangu_ref import read_safetensors
r32, r64 = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
shapes = {k: v.shape for k, v in read_safetensors(sys.argv[3])[0].items()}
bad = [n for n, st in r32["grads"].items() if not st["ok"]]
other = [f for f in r32["failures"] if not any(f.startswith(f"grad.{n}:") for n in bad)]
ok = (len(bad) == 1 and not other and "f32_floor_rel" in r32["grads"][bad[0]]
      and int(__import__("numpy").prod(shapes["grad." + bad[0]])) == 1)
for n in bad:
    st = r32["grads"][n]
    print(f"float32 exception {'ACCEPTED' if ok else 'REFUSED'}: grad.{n} rel {st['rel_err']:.3e} "
          f"(float32 reference's own rel err {st.get('f32_floor_rel', float('nan')):.3e}); "
          f"double engine rel {r64['grads'][n]['rel_err']:.3e}")
if other: print("other failures:", other)
sys.exit(0 if ok else 1)
PY
