#!/usr/bin/env bash
# test_diagnose_cli.sh — `prl diagnose` end to end on a tiny checkpoint made with `prl init`:
# --help; bad input named (missing checkpoint, bad JSONL line, token out of the vocabulary,
# sequence longer than the context, unknown precision, conflicting sources, --calibrate misuse);
# w8a8 with SmoothQuant and its per-module-kind sweep rows; aligned mode
# reports zero divergence everywhere; a fault injected with PRL_INFER_FAULT is named first;
# --sweep, --json and --html; and --external against the PyTorch reference's hook dump
# (reference/dump_hooks.py), clean and with a fault injected into the reference.
# Usage: test_diagnose_cli.sh PRL SRC_DIR [external]
# With "external" only the --external part runs; it exits 77 (CTest: skipped) with a message
# saying why when /usr/bin/python3 has no torch, so a missing torch is never a silent pass.
set -uo pipefail
prl=$1 src=$2 part=${3:-main}
py=${PRL_TORCH_PYTHON:-/usr/bin/python3}   # the Python with torch (Debian's)
. "$src/tests/lib.sh"   # work, ok, bad, expect_fail, expect_ok, summary
export PRL_THREADS=1
# check NAME PYTHON-EXPR: evaluate EXPR with d = the JSON in $work/out.json.
check() {
  local name=$1 expr=$2
  if python3 -c "import json,sys; d=json.load(open('$work/out.json')); sys.exit(0 if ($expr) else 1)"
  then ok "$name"; else bad "$name: $expr"; fi
}

if $prl diagnose --help | grep -q -- "--external DIR"; then ok "--help"; else bad "--help"; fi

ck=$work/ck
$prl init --model "$src/configs/models/tiny.json" --out "$ck" --seed 5 >/dev/null 2>&1 || { bad "prl init"; exit 1; }
python3 - "$work/seqs.jsonl" <<'EOF'
import json, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for n, p in ((30, 10), (45, 1), (24, 20)):
        f.write(json.dumps({"ids": [random.randrange(16, 4096) for _ in range(n)], "prompt_len": p}) + "\n")
EOF
seqs=$work/seqs.jsonl

if [ "$part" = main ]; then
# ---------------------------------------------------------------- bad input
expect_fail "missing checkpoint" "$work/nope" $prl diagnose --ckpt "$work/nope" --jsonl "$seqs"
printf '{"ids": [1, 2, 3]}\n{"ids": [1, 2,\n' >"$work/broken.jsonl"
expect_fail "bad JSONL line" "broken.jsonl:2: invalid JSON" $prl diagnose --ckpt "$ck" --jsonl "$work/broken.jsonl"
printf '{"ids": [5, 6, 7]}\n{"ids": [1, 9999, 3]}\n' >"$work/oov.jsonl"
expect_fail "token out of vocabulary" "oov.jsonl:2: token id 9999 at position 1 out of the vocabulary" \
  $prl diagnose --ckpt "$ck" --jsonl "$work/oov.jsonl"
python3 -c "import json; print(json.dumps({'ids': [7] * 600}))" >"$work/long.jsonl"
expect_fail "sequence longer than the context" "long.jsonl:1: 600 tokens exceed the context" \
  $prl diagnose --ckpt "$ck" --jsonl "$work/long.jsonl"
printf '{"ids": [5, 6, 7], "prompt_len": 3}\n' >"$work/noresp.jsonl"
expect_fail "no response token" "prompt length 3 not in" $prl diagnose --ckpt "$ck" --jsonl "$work/noresp.jsonl"
expect_fail "unknown precision" "unknown precision 'fp8'" $prl diagnose --ckpt "$ck" --jsonl "$seqs" --precision fp8
expect_fail "two sources" "exactly one of --run and --jsonl" $prl diagnose --ckpt "$ck" --jsonl "$seqs" --run "$work"
expect_fail "missing run.db" "run.db" $prl diagnose --ckpt "$ck" --run "$work/runs/none"
expect_fail "bad fault" "PRL_INFER_FAULT" env PRL_INFER_FAULT=L1.mlp.out:0.1 $prl diagnose --ckpt "$ck" --jsonl "$seqs"
expect_fail "missing dump" "seq-0.safetensors" $prl diagnose --ckpt "$ck" --jsonl "$seqs" --external "$work/nodump"
expect_fail "calibrate without w8a8" "--calibrate needs --precision w8a8" \
  $prl diagnose --ckpt "$ck" --jsonl "$seqs" --calibrate 1
expect_fail "calibrate with nothing left" "no sequences after the 3 compared" \
  $prl diagnose --ckpt "$ck" --jsonl "$seqs" --n 3 --precision w8a8 --calibrate 2

# ---------------------------------------------------------------- w8a8: per-kind sweep rows, SmoothQuant
if $prl diagnose --ckpt "$ck" --jsonl "$seqs" --n 2 --precision w8a8 --calibrate 1 --sweep --json >"$work/out.json" 2>"$work/err"; then
  check "w8a8: mismatch" "d['logprob']['mean_abs'] > 0"
  check "w8a8: a sweep row per module kind" "sum(r['knob'] == 'w8a8' for r in d['sweep']['rows']) == 5"
  if grep -q "SmoothQuant on 1 calibration sequences" "$work/err"; then ok "w8a8: calibrated"; else bad "w8a8: calibrated: $(cat "$work/err")"; fi
else bad "w8a8 diagnose: $(cat "$work/err")"; fi

# ---------------------------------------------------------------- aligned: zero everywhere
if $prl diagnose --ckpt "$ck" --jsonl "$seqs" --precision aligned --threshold 0 --json >"$work/out.json" 2>"$work/err"; then
  check "aligned: no op diverges" "d['first_divergent'] is None and len(d['ops']) == 30"
  check "aligned: every op equal" "all(o['max_abs'] == 0 and o['elements'] > 0 for o in d['ops'])"
  check "aligned: log-probs equal" "d['logprob']['max_abs'] == 0 and d['logprob']['tokens'] == 20 + 44 + 4"
  check "aligned: routes equal" "all(r['overlap'] == 1 and r['disagree'] == 0 for r in d['routing'])"
else bad "aligned run: $(cat "$work/err")"; fi

# ---------------------------------------------------------------- an injected fault is named first
for op in L0.attn.kv_latent L2.moe.out L4.moe.router_logits final.logits; do
  if PRL_INFER_FAULT=$op:0.001 $prl diagnose --ckpt "$ck" --jsonl "$seqs" --precision aligned --threshold 0 \
       --json >"$work/out.json" 2>"$work/err"; then
    check "fault $op named first (aligned)" "d['fault'] == '$op' and d['first_divergent']['name'] == '$op'"
  else bad "fault $op: $(cat "$work/err")"; fi
done
if PRL_INFER_FAULT=L3.attn.out:0.01 $prl diagnose --ckpt "$ck" --jsonl "$seqs" --threshold 1e-3 >"$work/out.txt" 2>&1 &&
   grep -q "first divergent op (rel L2 > 0.001): L3.attn.out (layer 3, op attn.out)" "$work/out.txt" &&
   grep -q "TEST-ONLY FAULT" "$work/out.txt"; then ok "fault named first (fp32, text)"
else bad "fault named first (fp32, text): $(tail -5 "$work/out.txt")"; fi

# ---------------------------------------------------------------- sweep, JSON, HTML
if $prl diagnose --ckpt "$ck" --jsonl "$seqs" --precision aligned --sweep --json --html "$work/r.html" \
     >"$work/out.json" 2>"$work/err"; then
  check "sweep: the knobs" "[r['knob'] for r in d['sweep']['rows']] == ['baseline', 'precision', 'precision', 'mla', 'matmul', 'matmul', 'batch', 'threads']"
  check "sweep: aligned baseline is the control" "d['sweep']['rows'][0]['mean_abs'] == 0"
  check "sweep: bf16 costs more than fp32's MLA form" "[r for r in d['sweep']['rows'] if r['value'] == 'bf16'][0]['mean_abs'] > [r for r in d['sweep']['rows'] if r['knob'] == 'mla'][0]['mean_abs'] > 0"
  check "sweep: batch and threads change nothing" "all(r['mean_abs'] == 0 for r in d['sweep']['rows'] if r['knob'] in ('batch', 'threads'))"
  if grep -q "<svg" "$work/r.html" && grep -q "Sweep" "$work/r.html" && ! grep -q "<script" "$work/r.html"; then ok "HTML report"
  else bad "HTML report"; fi
else bad "sweep: $(cat "$work/err")"; fi
# the report path is checked before the work: an existing file stays as it was
cp "$work/r.html" "$work/r0.html"
if ! $prl diagnose --ckpt "$ck" --jsonl "$seqs" --html "$work/r.html" >/dev/null 2>"$work/err" &&
   grep -q -- "--html $work/r.html exists" "$work/err" && ! grep -q "^blas:" "$work/err" &&
   cmp -s "$work/r.html" "$work/r0.html"; then ok "--html: an existing file refused before the work"
else bad "--html over an existing file: $(cat "$work/err")"; fi

fi

# ---------------------------------------------------------------- external: the PyTorch reference
if [ "$part" = external ] && ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIP external: $py has no torch, so reference/dump_hooks.py cannot run"
  exit 77
fi
if [ "$part" = external ]; then
  if "$py" "$src/reference/dump_hooks.py" --ckpt "$ck" --jsonl "$seqs" --out "$work/dump" 2>"$work/err" &&
     $prl diagnose --ckpt "$ck" --jsonl "$seqs" --external "$work/dump" --json >"$work/out.json" 2>>"$work/err"; then
    check "external: reference agrees (rel L2 < 1e-5 everywhere)" "d['first_divergent'] is None and all(o['rel_l2'] < 1e-5 for o in d['ops'])"
    check "external: routes and log-probs" "len(d['routing']) == 5 and d['logprob']['tokens'] == 68 and d['logprob']['max_abs'] < 1e-4"
  else bad "external dump: $(cat "$work/err")"; fi
  if "$py" "$src/reference/dump_hooks.py" --ckpt "$ck" --jsonl "$seqs" --out "$work/dumpf" \
       --fault L2.attn.q:0.01 2>"$work/err" &&
     $prl diagnose --ckpt "$ck" --jsonl "$seqs" --external "$work/dumpf" --json >"$work/out.json" 2>>"$work/err"; then
    check "external: a fault in the reference named first" "d['first_divergent']['name'] == 'L2.attn.q'"
  else bad "external fault: $(cat "$work/err")"; fi
  printf '{"ids": [5, 6, 7, 8]}\n' >"$work/other.jsonl"
  expect_fail "external: other tokens" "dump is of other tokens" \
    $prl diagnose --ckpt "$ck" --jsonl "$work/other.jsonl" --external "$work/dump"
fi

summary "test_diagnose_cli ($part)"
