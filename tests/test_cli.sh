#!/usr/bin/env bash
# test_cli.sh — the prl command end to end: --help everywhere, bad input gives a non-zero
# exit and a message naming the problem (and never a partial checkpoint), SFT runs are
# bitwise reproducible across runs and thread counts. Usage: test_cli.sh PRL SRC_DIR
set -uo pipefail
prl=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok()  { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# expect_fail NAME PATTERN CMD...: CMD exits non-zero and its stderr matches PATTERN.
expect_fail() {
  local name=$1 pattern=$2; shift 2
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$pattern" <<<"$out"; then ok "$name"
  else bad "$name (exit $rc, stderr: $out)"; fi
}
expect_ok() {
  local name=$1; shift
  if "$@" >"$work/last.out" 2>&1; then ok "$name"; else bad "$name: $(tail -3 "$work/last.out")"; fi
}

for c in init sft score tasks "tokenizer train" "tokenizer encode" "tokenizer decode" "bench train" \
         "sandbox exec" "sandbox probe" "bench sandbox"; do
  expect_ok "--help: $c" $prl $c --help
done
expect_fail "unknown command" "unknown command 'frobnicate'" $prl frobnicate
expect_fail "unknown flag" "unknown option '--sed'" $prl init --model x --out y --sed 3
expect_fail "bad number" "must be a non-negative integer" $prl init --model x --out y --seed abc
expect_fail "missing flag" "missing required option '--out'" $prl init --model x

# configs
cfg=$src/configs/models/micro.json
sed 's/"hidden_size"/"hiden_size"/' "$cfg" > "$work/typo.json"
expect_fail "mistyped config key" "unknown config key 'hiden_size' (did you mean 'hidden_size'?)" \
  $prl init --model "$work/typo.json" --out "$work/c1"
[ ! -e "$work/c1" ] && ok "no checkpoint after a config error" || bad "checkpoint left after a config error"
sed 's/"use_mhc": false/"use_mhc": true/' "$cfg" > "$work/mhc.json"
expect_fail "unsupported block" "not yet supported" $prl init --model "$work/mhc.json" --out "$work/c2"

# checkpoints
expect_ok "init" $prl init --model "$cfg" --seed 3 --out "$work/ck"
echo '{"ids": [1, 5, 9, 12]}' > "$work/ids.jsonl"
expect_ok "score" $prl score --ckpt "$work/ck" --input "$work/ids.jsonl" --json
grep -q '"logprobs":\[null,' "$work/last.out" && ok "score output" || bad "score output: $(cat "$work/last.out")"
echo '{"ids": [1, 5, 64, 12]}' > "$work/oob.jsonl"
expect_fail "token id out of range" "oob.jsonl:1: .*token id 64 out of range" \
  $prl score --ckpt "$work/ck" --input "$work/oob.jsonl"
cp -r "$work/ck" "$work/trunc"
truncate -s 5000 "$work/trunc/model.safetensors"
expect_fail "truncated checkpoint" "model.safetensors" $prl score --ckpt "$work/trunc" --input "$work/ids.jsonl"
cp -r "$work/ck" "$work/tamper"
size=$(stat -c %s "$work/tamper/model.safetensors")
printf '\x41' | dd of="$work/tamper/model.safetensors" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
expect_fail "tampered checkpoint" "checksum mismatch" $prl score --ckpt "$work/tamper" --input "$work/ids.jsonl"

# SFT data errors leave no checkpoint behind
big=$src/configs/models/tiny.json
$prl tasks demo --n 40 --seed 2 --out "$work/data.jsonl" 2>/dev/null
{ head -n 2 "$work/data.jsonl"; echo '{"messages": [{"role": "user", "content": "hi"'; } > "$work/broken.jsonl"
expect_fail "malformed JSONL" "broken.jsonl:3: invalid JSON" \
  $prl sft --data "$work/broken.jsonl" --model "$big" --out "$work/s_bad" --steps 2 --seq 12
echo '{"messages": [{"role": "robot", "content": "hi"}]}' > "$work/role.jsonl"
expect_fail "unknown role" "robot" $prl sft --data "$work/role.jsonl" --model "$big" --out "$work/s_bad" --steps 2 --seq 12
[ ! -e "$work/s_bad" ] && ok "no checkpoint after bad data" || bad "checkpoint left after bad data"
ls "$work" | grep -q '\.tmp\.' && bad "temporary files left" || ok "no temporary files left"

# determinism: same seed → identical checkpoint, with 1 and 2 threads
for run in a b; do
  expect_ok "sft run $run" $prl sft --data "$work/data.jsonl" --model "$big" --out "$work/s_$run" \
    --steps 4 --batch 4 --seq 48 --seed 7 --threads 2
done
expect_ok "sft run 1 thread" $prl sft --data "$work/data.jsonl" --model "$big" --out "$work/s_t1" \
  --steps 4 --batch 4 --seq 48 --seed 7 --threads 1
cmp -s "$work/s_a/model.safetensors" "$work/s_b/model.safetensors" && ok "same seed, same checkpoint" \
  || bad "same seed gave different checkpoints"
cmp -s "$work/s_a/model.safetensors" "$work/s_t1/model.safetensors" && ok "1 vs 2 threads, same checkpoint" \
  || bad "1 and 2 threads gave different checkpoints"
cmp -s "$work/s_a/optimizer.safetensors" "$work/s_t1/optimizer.safetensors" && ok "1 vs 2 threads, same optimizer state" \
  || bad "1 and 2 threads gave different optimizer state"
expect_ok "sft other seed" $prl sft --data "$work/data.jsonl" --model "$big" --out "$work/s_c" \
  --steps 4 --batch 4 --seq 48 --seed 8 --threads 2
cmp -s "$work/s_a/model.safetensors" "$work/s_c/model.safetensors" && bad "a different seed gave the same checkpoint" \
  || ok "different seed, different checkpoint"
# resume continues the optimizer state and step count
expect_ok "sft 2 steps" $prl sft --data "$work/data.jsonl" --model "$big" --out "$work/s_r" \
  --steps 2 --batch 4 --seq 48 --seed 7 --threads 2
expect_ok "sft resume 2 steps" $prl sft --data "$work/data.jsonl" --ckpt "$work/s_r" --resume --out "$work/s_r2" \
  --steps 2 --batch 4 --seq 48 --seed 7 --threads 2
grep -q '"step": 4' "$work/s_r2/state.json" && ok "resume continues at step 2" || bad "resume: $(cat "$work/s_r2/state.json")"
# sandbox: a run, its statuses and exit codes, bad input naming the problem
printf 'import sys\nprint(6 * 7, sys.stdin.read().strip())\n' > "$work/ok.py"
echo "from-stdin" > "$work/in.txt"
if out=$($prl sandbox exec --lang python3 --file "$work/ok.py" --stdin "$work/in.txt" 2>"$work/sb.err") \
   && [ "$out" = "42 from-stdin" ] && grep -q "prl sandbox: ok" "$work/sb.err"; then ok "sandbox exec ok"
else bad "sandbox exec ok: '$out' $(cat "$work/sb.err")"; fi
$prl sandbox exec --lang python3 --file "$work/ok.py" --json > "$work/sb.json" 2>/dev/null
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["status"]=="ok" and r["stdout"]=="42 \n" and r["isolation"]["pidns"] in (True, False)' "$work/sb.json" \
  && ok "sandbox exec --json" || bad "sandbox exec --json: $(head -c 400 "$work/sb.json")"
printf 'while True: pass\n' > "$work/loop.py"
$prl sandbox exec --lang python3 --file "$work/loop.py" --wall 1 >/dev/null 2>"$work/sb.err"; rc=$?
[ $rc -eq 1 ] && grep -q "prl sandbox: timeout" "$work/sb.err" && ok "sandbox exec timeout" \
  || bad "sandbox exec timeout (exit $rc): $(cat "$work/sb.err")"
expect_fail "sandbox bad --lang" "unknown --lang 'ruby'" $prl sandbox exec --lang ruby --file "$work/ok.py"
expect_fail "sandbox missing file" "cannot open $work/nope.py" $prl sandbox exec --lang sh --file "$work/nope.py"
expect_fail "sandbox bad limit" "wall_seconds must be >= 0.001" $prl sandbox exec --lang sh --file "$work/ok.py" --wall 0
expect_ok "sandbox probe" $prl sandbox probe
grep -q "pidns" "$work/last.out" && ok "sandbox probe lists layers" || bad "sandbox probe: $(cat "$work/last.out")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
