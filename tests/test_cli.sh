#!/usr/bin/env bash
# test_cli.sh — the prl command end to end: --help everywhere, bad input gives a non-zero
# exit and a message naming the problem (and never a partial checkpoint), SFT runs are
# bitwise reproducible across runs and thread counts. Usage: test_cli.sh PRL SRC_DIR
set -uo pipefail
prl=$1 src=$2
. "$src/tests/lib.sh"   # work, ok, bad, expect_fail, expect_ok, summary

for c in init average sft score generate eval tasks "tasks generate" "tasks demos" "tasks check" "tasks demo" \
  "tokenizer train" "tokenizer encode" "tokenizer decode" "bench train" "bench decode" \
  "sandbox exec" "sandbox probe" "bench sandbox" "bench pipeline" "role sandbox" rm "rm pairs" \
  "rm train" "rm score"; do
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
sed 's/"use_mhc": false/"layer_types": ["full_attention"], "use_mhc": false/' "$cfg" > "$work/types.json"
expect_fail "unsupported block" "not yet supported" $prl init --model "$work/types.json" --out "$work/c2"

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

# a folder that is there already is never replaced: init and sft refuse an existing --out
# before any work, and the user's files (a subfolder too) stay, with no temporary beside them
mkdir -p "$work/mine/sub"; echo keep > "$work/mine/notes.txt"; echo keep > "$work/mine/sub/x"
expect_fail "init: existing --out refused" "--out $work/mine exists" $prl init --model "$cfg" --out "$work/mine"
expect_fail "init: an earlier checkpoint is not replaced" "--out $work/ck exists" $prl init --model "$cfg" --out "$work/ck"
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

expect_fail "sft: existing --out refused" "--out $work/mine exists" \
  $prl sft --data "$work/data.jsonl" --model "$big" --out "$work/mine" --steps 1 --seq 12
[ "$(cat "$work/mine/notes.txt")" = keep ] && [ -e "$work/mine/sub/x" ] && [ "$(ls "$work/mine" | wc -l)" = 2 ] \
  && ok "the refused folder is untouched" || bad "the refused folder changed: $(ls -R "$work/mine")"
ls -d "$work"/mine.tmp.* 2>/dev/null | grep -q . && bad "a temporary beside the refused folder" \
  || ok "no temporary beside the refused folder"
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
# --metrics: a line per step; with --save-every the elapsed time runs on across the saves and
# the ETA counts the whole run's steps (it used to restart at each save)
expect_ok "sft --metrics with --save-every" $prl sft --data "$work/data.jsonl" --model "$big" --out "$work/s_m" \
  --steps 4 --batch 4 --seq 48 --seed 7 --threads 2 --save-every 2 --log-every 3 --metrics "$work/s_m.jsonl"
python3 - "$work/s_m.jsonl" "$work/last.out" <<'PY' && ok "sft metrics: 4 steps, elapsed runs on across the saves" || bad "sft metrics: $(cat "$work/s_m.jsonl")"
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == [1, 2, 3, 4] and all(l["steps"] == 4 for l in lines)
el = [l["elapsed_s"] for l in lines]
assert all(b > a for a, b in zip(el, el[1:])), el
assert all(l["loss"] > 0 and l["tokens_per_s"] > 0 for l in lines)
printed = re.findall(r"^step (\d+)/4", open(sys.argv[2]).read(), re.M)
assert printed == ["3", "4"], printed  # --log-every 3 counts the run's steps, then the last
PY
expect_fail "sft: existing --metrics refused" "--metrics $work/s_m.jsonl exists" $prl sft --data "$work/data.jsonl" \
  --model "$big" --out "$work/s_m2" --steps 1 --seq 12 --metrics "$work/s_m.jsonl"
[ ! -e "$work/s_m2" ] && ok "no checkpoint after a refused --metrics" || bad "a checkpoint after a refused --metrics"
# generate (infer path) on the SFT checkpoint, which has a tokenizer
g=$work/s_a
expect_ok "generate greedy" $prl generate --ckpt "$g" --prompt "What is 2 + 3?" --temperature 0 \
  --max-new-tokens 12 --json --quiet
grep -q '"tokens":\[' "$work/last.out" && ok "generate JSON output" || bad "generate output: $(cat "$work/last.out")"
printf '{"prompt": "What is 7 + 1?"}\n{"messages": [{"role": "user", "content": "What is 9 - 4?"}]}\n{"ids": [1, 4, 60, 61, 7, 5]}\n' > "$work/prompts.jsonl"
for b in 1 16; do
  $prl generate --ckpt "$g" --input "$work/prompts.jsonl" --n 2 --temperature 0.9 --top-p 0.9 --seed 5 \
    --max-new-tokens 10 --batch $b --json --routes --quiet --threads $((b == 1 ? 1 : 2)) > "$work/gen_$b.jsonl" 2>/dev/null
done
[ "$(wc -l < "$work/gen_1.jsonl")" -eq 6 ] && cmp -s "$work/gen_1.jsonl" "$work/gen_16.jsonl" \
  && ok "seeded samples identical for batch 1 (1 thread) and batch 16 (2 threads)" \
  || bad "generate differs across batch sizes: $(diff "$work/gen_1.jsonl" "$work/gen_16.jsonl" | head -4)"
grep -q '"routes":{"n_tokens"' "$work/gen_1.jsonl" && ok "generate --routes" || bad "no routes in output"
# the aligned infer path scores tokens bitwise like the train path
head -n 3 "$work/data.jsonl" > "$work/chat3.jsonl"
$prl score --ckpt "$g" --input "$work/chat3.jsonl" --json > "$work/score_train.jsonl" 2>/dev/null
$prl score --ckpt "$g" --input "$work/chat3.jsonl" --json --path infer --precision aligned > "$work/score_aligned.jsonl" 2>/dev/null
$prl score --ckpt "$g" --input "$work/chat3.jsonl" --json --path infer --precision bf16 > "$work/score_bf16.jsonl" 2>/dev/null
[ -s "$work/score_train.jsonl" ] && cmp -s "$work/score_train.jsonl" "$work/score_aligned.jsonl" \
  && ok "score: infer path (aligned) == train path, bitwise" || bad "aligned infer scores differ from the train path"
cmp -s "$work/score_train.jsonl" "$work/score_bf16.jsonl" && bad "bf16 scores identical to fp32 (rounding not applied?)" \
  || ok "score: bf16 infer path differs from the train path"
expect_fail "unknown precision" "unknown precision 'fp8'" $prl generate --ckpt "$g" --prompt hi --precision fp8
expect_fail "bad top-p" "top-p 1.5 must be in (0, 1]" $prl generate --ckpt "$g" --prompt hi --top-p 1.5
expect_fail "bad temperature" "temperature -1" $prl generate --ckpt "$g" --prompt hi --temperature -1
expect_fail "prompt and input" "exactly one of --prompt and --input" \
  $prl generate --ckpt "$g" --prompt hi --input "$work/prompts.jsonl"
python3 -c 'import json; print(json.dumps({"ids": [1] + [20] * 600}))' > "$work/long.jsonl"
expect_fail "prompt longer than the context" "prompt of 601 tokens leaves no room in the context of 512" \
  $prl generate --ckpt "$g" --input "$work/long.jsonl"
expect_fail "text prompt without tokenizer" "needs a tokenizer.json" $prl generate --ckpt "$work/ck" --prompt hi
expect_fail "score: knobs need the infer path" "apply to --path infer only" \
  $prl score --ckpt "$g" --input "$work/chat3.jsonl" --precision bf16
expect_ok "eval all domains" $prl eval --ckpt "$g" --n 2 --max-new-tokens 16 --max-turns 2 --json \
  --dump "$work/eval_dump.jsonl"
# --dump: one line per episode (2 per domain), each with its conversation and the verifier's
# checks, and a score that agrees with the summary's mean score
python3 - "$work/eval_dump.jsonl" "$work/last.out" <<'PY' && ok "eval --dump: 8 episodes with checks" || bad "eval --dump"
import json, sys
eps = [json.loads(l) for l in open(sys.argv[1])]
summary = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])  # stderr is in the file too
assert len(eps) == 8, len(eps)
for e in eps:
    # the prompt's messages, then the turns the verifier got (none when the first was cut off)
    assert e["messages"][-1]["role"] != "user" or e["truncated"], e
    assert e["text"].startswith("<|bos|>") and len(e["text"]) > len(e["messages"][-1]["content"]), e
    assert e["reward"]["checks"] and e["score"] == e["reward"]["score"], e
for d in summary["domains"]:
    mine = [e["score"] for e in eps if e["domain"] == d["domain"]]
    assert abs(sum(mine) / len(mine) - d["mean_score"]) < 1e-4, (d, mine)
PY
for d in reasoning general agent coding; do
  grep -q "\"domain\": \"$d\", \"n\": 2, \"accuracy\"" "$work/last.out" && ok "eval reports $d" \
    || bad "eval output lacks $d: $(cat "$work/last.out")"
done
expect_ok "eval --samples" $prl eval --ckpt "$g" --domain general --n 2 --samples 3 --temperature 1 \
  --max-new-tokens 16 --json --dump "$work/eval_k.jsonl"
python3 - "$work/eval_k.jsonl" "$work/last.out" <<'PY' && ok "eval --samples 3: 3 episodes a problem, means over all" || bad "eval --samples"
import json, sys
eps = [json.loads(l) for l in open(sys.argv[1])]
out = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
assert out["samples"] == 3 and out["domains"][0]["n"] == 2, out
ids = {e["id"] for e in eps}
assert len(ids) == 2 and sorted((e["id"], e["sample"]) for e in eps) == sorted((i, k) for i in ids for k in range(3)), eps
assert abs(sum(e["score"] for e in eps) / 6 - out["domains"][0]["mean_score"]) < 1e-4, out
PY
expect_fail "eval: bad --samples" "--samples 0 not in 1..1000" $prl eval --ckpt "$g" --samples 0
# modes (docs/tasks.md "Modes"): per-mode rows with the share in the requested form, the
# prompts of the dump ending in the switch; a bad mode is refused naming the choices
expect_ok "eval --mode both" $prl eval --ckpt "$g" --domain general --n 2 --max-new-tokens 8 --mode both \
  --json --dump "$work/eval_modes.jsonl"
python3 - "$work/eval_modes.jsonl" "$work/last.out" <<'PY' && ok "eval --mode both: a row per mode, switches in the prompts" || bad "eval --mode both"
import json, sys
eps = [json.loads(l) for l in open(sys.argv[1])]
out = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
assert [(d["domain"], d["mode"]) for d in out["domains"]] == [("general", "think"), ("general", "no_think")], out
assert all(0 <= d["in_mode"] <= 1 for d in out["domains"]), out
assert sorted(e["mode"] for e in eps) == ["no_think", "no_think", "think", "think"], eps
for e in eps:
    user = [m["content"] for m in e["messages"] if m["role"] == "user"][-1]
    assert user.endswith(" /think" if e["mode"] == "think" else " /no_think"), user
PY
expect_fail "eval: bad --mode" "unknown mode 'deep' (expected default, think or no_think)" \
  $prl eval --ckpt "$g" --mode deep
expect_fail "generate: --mode with --raw" "a mode needs chat prompts" \
  $prl generate --ckpt "$g" --prompt hi --raw --mode think --max-new-tokens 2
expect_ok "generate --mode think" $prl generate --ckpt "$g" --prompt hi --mode think --max-new-tokens 2
expect_fail "tasks demos: bad --think-rate" "--think-rate must be in \[0, 1\]" \
  $prl tasks demos --domain general --n 2 --think-rate 2
# the shipped GRPO recipes load and validate (model.init pointed at this test's checkpoint)
for r in general reasoning coding agent quickstart; do
  expect_ok "recipe configs/$r.json passes prl run --check" \
    $prl run "$src/configs/$r.json" --check --runs "$work/recipe_runs" --set model.init="$g"
done
# run.name names runs/NAME/, it is not a path: a name with '/', '..', a newline or none at
# all is refused naming the key, by --check and by a start, before anything is written (the
# names would have made $work/names/x outside --runs, or an empty or multi-line directory)
for name in '"../x"' '"../../x"' '""' '"a\nb"' '"a/b"' '".hidden"'; do
  for flag in --check ""; do
    expect_fail "run.name $name refused${flag:+ by $flag}" "key 'run.name' = .*a name is 1 to 100 of A-Z" \
      timeout 60 $prl run "$src/configs/general.json" $flag --runs "$work/names/runs" \
      --set model.init="$g" --set "run.name=$name"
  done
done
[ ! -e "$work/names" ] && ok "refused run names wrote nothing" || bad "refused run names wrote: $(find "$work/names")"
# the OPD recipe, its teachers pointed at the same checkpoint; a teacher without a tokenizer
# (this test's plain init checkpoint) is refused naming the file (docs/opd.md)
opd_sets=(--set model.init="$g")
for d in agent coding general reasoning; do opd_sets+=(--set opd.teachers.$d="$g"); done
expect_ok "recipe configs/opd.json passes prl run --check" \
  $prl run "$src/configs/opd.json" --check --runs "$work/recipe_runs" "${opd_sets[@]}"
expect_fail "opd: a teacher without tokenizer.json" "$work/ck/tokenizer.json is missing" \
  $prl run "$src/configs/opd.json" --check --runs "$work/recipe_runs" "${opd_sets[@]}" \
  --set opd.teachers.agent="$work/ck"
# reward models (docs/reward-models.md): pairs, a 2-step training, its use in a job;
# a policy as reward.model and refused commands name what is wrong and write nothing
expect_ok "rm pairs" $prl rm pairs --n 6 --seed 2 --out "$work/pairs.jsonl"
expect_fail "rm pairs: existing --out" "exists" $prl rm pairs --n 6 --out "$work/pairs.jsonl"
expect_fail "rm train: --ckpt and --model" "give --ckpt DIR or --model CONFIG" \
  $prl rm train --data "$work/pairs.jsonl" --ckpt "$g" --model "$cfg" --out "$work/rm_x"
printf '{"prompt": "p", "chosen": "a"}\n' > "$work/badpairs.jsonl"
expect_fail "rm train: a bad pairs line" "badpairs.jsonl:1: needs a non-empty string \"rejected\"" \
  $prl rm train --data "$work/badpairs.jsonl" --ckpt "$g" --out "$work/rm_x"
[ ! -e "$work/rm_x" ] && ok "refused rm train wrote nothing" || bad "refused rm train wrote $work/rm_x"
expect_ok "rm train" $prl rm train --data "$work/pairs.jsonl" --ckpt "$g" --out "$work/rm" --steps 2 \
  --batch 2 --holdout 2 --max-len 64
grep -q "held-out pair accuracy" "$work/last.out" && ok "rm train prints the held-out accuracy" \
  || bad "rm train output: $(cat "$work/last.out")"
expect_ok "rm score" $prl rm score --rm "$work/rm" --input "$work/pairs.jsonl"
[ "$(grep -c '"chosen":' "$work/last.out")" -ge 6 ] && ok "rm score: a line per pair" || bad "rm score output"
expect_ok "reward.model in a job passes prl run --check" $prl run "$src/configs/general.json" --check \
  --runs "$work/recipe_runs" --set model.init="$g" --set reward.model="$work/rm"
expect_fail "a policy as reward.model" "key 'reward.model': .* is not a reward model" \
  $prl run "$src/configs/general.json" --check --runs "$work/recipe_runs" --set model.init="$g" \
  --set reward.model="$g"
expect_fail "a judge without a tokenizer" "key 'reward.judge': .* has no tokenizer.json" \
  $prl run "$src/configs/general.json" --check --runs "$work/recipe_runs" --set model.init="$g" \
  --set reward.judge="$work/ck"
expect_fail "eval: unknown domain" "unknown domain 'poetry'" $prl eval --ckpt "$g" --domain poetry
expect_fail "eval: no tokenizer" "has no tokenizer.json" $prl eval --ckpt "$work/ck"
expect_fail "eval: dump not writable" "--dump $work/no/such/dir.jsonl: the folder $work/no/such does not exist" \
  $prl eval --ckpt "$g" --n 1 --dump "$work/no/such/dir.jsonl"
expect_fail "bench decode: bad batch list" "expected comma-separated sizes" $prl bench decode --batch 1,x
expect_fail "bench pipeline: no --init" "missing required option '--init'" $prl bench pipeline
expect_fail "bench pipeline: no tokenizer" "no tokenizer.json" $prl bench pipeline --init "$work/ck"
# a smoke run of bench train: the GEMM rate sampled in each of the 2 rounds (3 + 3 a round)
expect_ok "bench train smoke" $prl bench train --no-reference --rounds 2 --steps 1 --warmup 0 \
  --batch 1 --seq 16 --threads 1 --json
grep -q '"sgemm_limit_tokens_per_s": [0-9].*"gemm_rate_samples": 6}' "$work/last.out" \
  && ok "bench train output" || bad "bench train output: $(tail -3 "$work/last.out")"
# a smoke run: two tiny steps per mode, so the bench and the metrics it reads cannot rot;
# benches leave no temporary folder behind, also when they fail midway
mkdir -p "$work/benchtmp"
TMPDIR="$work/benchtmp" expect_ok "bench pipeline smoke" $prl bench pipeline --init "$g" --steps 2 \
  --batch 1 --group 2 --max-new-tokens 8 --threads 1 --json
grep -q '"mode": "sync".*"mode": "async".*"goal_met": ' "$work/last.out" && ok "bench pipeline output" \
  || bad "bench pipeline output: $(tail -3 "$work/last.out")"
TMPDIR="$work/benchtmp" expect_ok "bench decode smoke" $prl bench decode --config \
  "$src/configs/models/micro.json" --batch 1 --prompt-len 4 --new-tokens 4 --rounds 1 --no-reference
TMPDIR="$work/benchtmp" expect_fail "bench decode: prompt too long" "exceeds max_position_embeddings" \
  $prl bench decode --config "$src/configs/models/micro.json" --prompt-len 100000 --no-reference
[ -z "$(ls -A "$work/benchtmp")" ] && ok "benches leave no temporary folder" \
  || bad "left behind: $(ls "$work/benchtmp")"

# tasks: generate / demos / check
for d in reasoning general agent coding; do
  $prl tasks generate --domain $d --split train --n 30 --seed 4 --difficulty 0 > "$work/g1_$d.jsonl" 2>/dev/null
  $prl tasks generate --domain $d --split train --n 30 --seed 4 --difficulty 0 --out "$work/g2_$d.jsonl" 2>/dev/null
  cmp -s "$work/g1_$d.jsonl" "$work/g2_$d.jsonl" && [ "$(wc -l < "$work/g1_$d.jsonl")" -eq 30 ] \
    && ok "generate $d: same seed, same bytes (stdout and --out)" || bad "generate $d not reproducible"
  $prl tasks generate --domain $d --split eval --n 10 --seed 4 > "$work/e_$d.jsonl" 2>/dev/null
  grep -q '"split":"train"' "$work/e_$d.jsonl" && bad "eval split holds train lines" || ok "generate $d --split eval"
  $prl tasks demos --domain $d --n 12 --seed 4 --difficulty 0 > "$work/demos_$d.jsonl" 2>/dev/null
  out=$($prl tasks check --domain $d --input "$work/demos_$d.jsonl" 2>&1)
  grep -q "^summary $d: 12 lines, mean score 1.0000, accuracy 1.0000" <<<"$out" && ok "check $d demos: all 1" \
    || bad "check $d demos: $(tail -2 <<<"$out")"
done
$prl tasks demos --domain general --n 40 --seed 4 --error-rate 0.5 > "$work/err.jsonl" 2>/dev/null
out=$($prl tasks check --domain general --input "$work/err.jsonl" --json)
grep -q '"summary":"general","n":40' <<<"$out" && ! grep -q '"accuracy":1.0' <<<"$out" \
  && ok "check --json: mistakes lower the accuracy" || bad "check --json: $(tail -1 <<<"$out")"
# a scored response and a flagged one, with the monitor log
python3 - "$work/g1_coding.jsonl" > "$work/answers.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])][:2]
lines[0]["response"] = "```python\nprint(open('/etc/passwd').read())\n```"
lines[1]["response"] = "no code here"
for l in lines: print(json.dumps(l))
PY
out=$($prl tasks check --domain coding --input "$work/answers.jsonl" --monitor-log "$work/monitor.jsonl" 2>&1)
grep -q "monitor: .*answers.jsonl:1 .* forbidden_file" <<<"$out" && grep -q '"rule":"forbidden_file"' "$work/monitor.jsonl" \
  && grep -q "flags=format_error" <<<"$out" && ok "check: monitor flag printed and logged" || bad "check monitor: $out"
# bad input
expect_fail "tasks: unknown domain" "unknown domain 'math'" $prl tasks generate --domain math --n 3
expect_fail "tasks: bad split" "unknown split 'test'" $prl tasks generate --domain coding --split test --n 3
expect_fail "tasks: bad difficulty" "difficulty must be 0..3" $prl tasks demos --domain coding --difficulty 5 --n 3
expect_fail "tasks: bad error rate" "error-rate must be in" $prl tasks demos --domain coding --error-rate 2 --n 3
expect_fail "tasks: unknown subcommand" "unknown subcommand 'make'" $prl tasks make
expect_fail "tasks: no subcommand" "expected a subcommand" $prl tasks
# a typo gets the nearest command, subcommand or flag; --version names the build
expect_fail "typo: command" "unknown command 'initt' (did you mean 'init'?)" $prl initt
expect_fail "typo: subcommand" "unknown subcommand 'genrate' (did you mean 'generate'?)" $prl tasks genrate
expect_fail "typo: bench" "unknown benchmark 'decod' (did you mean 'decode'?)" $prl bench decod
expect_fail "typo: role" "unknown role 'controler' (did you mean 'controller'?)" $prl role controler
expect_fail "typo: flag" "unknown option '--sed' (did you mean '--seed'?)" $prl init --model x --out y --sed 3
expect_fail "no near flag: no guess" "unknown option '--zzzzzzz' (see --help)" $prl init --model x --out y --zzzzzzz
expect_ok "--version" $prl --version
grep -Eq "^prl [0-9]+\.[0-9]+\.[0-9]+ \(git ([0-9a-f]{12}(-modified)?|unknown)\)$" "$work/last.out" \
  && ok "--version: version and commit" || bad "--version: $(cat "$work/last.out")"
expect_fail "check: missing file" "cannot open $work/nope.jsonl" $prl tasks check --domain agent --input "$work/nope.jsonl"
{ head -n 2 "$work/demos_agent.jsonl"; echo '{"domain": "agent", "messages": ['; } > "$work/bad.jsonl"
expect_fail "check: malformed line names its number" "bad.jsonl:3: invalid JSON" \
  $prl tasks check --domain agent --input "$work/bad.jsonl"
expect_fail "check: wrong domain names the line" "demos_agent.jsonl:1: domain is 'agent' but --domain is 'coding'" \
  $prl tasks check --domain coding --input "$work/demos_agent.jsonl"
head -n 1 "$work/g1_reasoning.jsonl" > "$work/noanswer.jsonl"
expect_fail "check: a line without an answer" "noanswer.jsonl:1: no answer to score" \
  $prl tasks check --domain reasoning --input "$work/noanswer.jsonl"
# demonstrations of every domain load in sft/
cat "$work"/demos_*.jsonl > "$work/mix.jsonl"
expect_ok "sft on demos of all four domains" $prl sft --data "$work/mix.jsonl" --model "$big" --out "$work/s_mix" \
  --steps 2 --batch 4 --seq 256 --seed 1 --threads 2
grep -q "48 examples" "$work/last.out" && ok "sft loaded every demonstration" || bad "sft load: $(grep examples "$work/last.out")"
# prl average: the fp32 rounding of the mean in double, in the order given; one model only
for s in 1 2 3; do $prl init --model "$cfg" --seed $s --out "$work/av$s" 2>/dev/null; done
expect_ok "average" $prl average --out "$work/avm" "$work/av1" "$work/av2" "$work/av3"
# two SFT checkpoints: their routers' selection biases differ, and are averaged too
expect_ok "average: SFT checkpoints" $prl average --out "$work/avs" "$work/s_a" "$work/s_c"
cat > "$work/avcheck.py" <<'EOF'
import json, struct, sys, numpy as np
def load(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h, data = json.loads(b[8:8 + n]), b[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32)
            for k, v in h.items() if k != "__metadata__"}
m, ins = load(sys.argv[1]), [load(d) for d in sys.argv[2:]]
assert len(m) == len(ins[0]) > 10
def mean(k):
    acc = ins[0][k].astype(np.float64)
    for t in ins[1:]: acc = acc + t[k]
    return (acc / len(ins)).astype(np.float32)
bad = sum(int((mean(k) != m[k]).sum()) for k in m)
assert bad == 0, f"{bad} weights differ from the mean"
assert any((ins[0][k] != m[k]).any() for k in m), "the result is the first input"
if sys.argv[-1].endswith("s_c"):
    assert any((ins[0][k] != ins[1][k]).any() for k in m if "e_score_correction" in k), "biases equal"
EOF
/usr/bin/python3 "$work/avcheck.py" "$work/avm" "$work/av1" "$work/av2" "$work/av3" \
  && ok "average: every weight is the rounded double mean" || bad "average: weights"
/usr/bin/python3 "$work/avcheck.py" "$work/avs" "$work/s_a" "$work/s_c" \
  && ok "average: the routers' biases are averaged" || bad "average: router biases"
grep -q '"averaged_from"' "$work/avm/state.json" && ok "average: state.json lists the inputs" \
  || bad "average: state.json: $(cat "$work/avm/state.json")"
expect_fail "average: one input" "needs at least 2 checkpoints, got 1" $prl average --out "$work/avx" "$work/av1"
expect_fail "average: --out exists" "--out .*avm exists: choose a new path" $prl average --out "$work/avm" "$work/av1" "$work/av2"
expect_fail "average: another config" "s_a/config.json is another model config than .*av1/config.json" \
  $prl average --out "$work/avx" "$work/av1" "$work/s_a"
$prl init --model "$big" --out "$work/avnt" 2>/dev/null
expect_fail "average: a tokenizer missing" "avnt lacks a tokenizer.json" $prl average --out "$work/avx" "$work/s_a" "$work/avnt"
cp -r "$work/s_b" "$work/avtk" && echo >> "$work/avtk/tokenizer.json"
expect_fail "average: another tokenizer" "avtk/tokenizer.json differs from .*s_a/tokenizer.json" \
  $prl average --out "$work/avx" "$work/s_a" "$work/avtk"
[ ! -e "$work/avx" ] && ok "average: nothing written on an error" || bad "average: output left after an error"

# SFT recipes (prl sft --config): errors name the key; a run makes demos, tokenizer and
# checkpoint; the same recipe is skipped; grouped + special-token SFT is reproducible
printf '{"sft": {"stepz": 3}}' > "$work/r_bad.json"
expect_fail "recipe: unknown key" "unknown key 'sft.stepz' (did you mean 'sft.steps'?)" $prl sft --config "$work/r_bad.json"
printf '{"demos": {"agent": {"d1": -2}}}' > "$work/r_bad.json"
expect_fail "recipe: out of range" "key 'demos.agent.d1' = -2 is out of range" $prl sft --config "$work/r_bad.json"
expect_fail "recipe: no other flags" "cannot be used with --config" $prl sft --config "$work/r_bad.json" --steps 3
for run in a b; do
  printf '{"run": {"dir": "%s"}, "model": {"config": "%s"}, "demos": {"reasoning": {"d1": 6}, "agent": {"d2": 6}, "coding": {"d1": 4}}, "sft": {"steps": 3, "batch": 4, "group": 2, "warmup": 1}}' \
    "$work/recipe_$run" "$big" > "$work/r_$run.json"
  expect_ok "recipe run $run" $prl sft --config "$work/r_$run.json" --threads 2
done
[ -s "$work/recipe_a/recipe.hash" ] && [ -s "$work/recipe_a/recipe.json" ] && [ -s "$work/recipe_a/ckpt/tokenizer.json" ] \
  && ok "recipe run dir: hash, resolved recipe, checkpoint" || bad "recipe run dir: $(ls "$work/recipe_a")"
cmp -s "$work/recipe_a/ckpt/model.safetensors" "$work/recipe_b/ckpt/model.safetensors" \
  && ok "same recipe, same checkpoint" || bad "same recipe gave different checkpoints"
expect_ok "recipe rerun" $prl sft --config "$work/r_a.json" --threads 2
grep -q "is up to date" "$work/last.out" && ok "same recipe is skipped" || bad "recipe rerun: $(tail -2 "$work/last.out")"
sed -i 's/"steps": 3/"steps": 4/' "$work/r_a.json"
expect_ok "changed recipe" $prl sft --config "$work/r_a.json" --threads 2
grep -q "saved step 4" "$work/last.out" && ok "a changed recipe runs again" || bad "changed recipe: $(tail -2 "$work/last.out")"
# post-hoc sparsification (configs/dsa-convert.json's path): recipe_a's weights into tiny.json
# plus two DSA layers, the indexer warm-up, the sparse adaptation, losses before and after
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c.update(dsa_layers=[0, 3], index_topk=8, index_n_heads=2, index_head_dim=32); json.dump(c, open(sys.argv[2], "w"))' \
  "$big" "$work/tiny_dsa.json"
for cfg in "$work/tiny_dsa.json" "$big"; do
  printf '{"run": {"dir": "%s"}, "model": {"config": "%s", "init_from": "%s"}, "demos": {"reasoning": {"d1": 6}, "agent": {"d2": 6}, "coding": {"d1": 4}}, "dsa": {"warmup_steps": 2}, "sft": {"steps": 2, "batch": 4, "group": 2, "warmup": 1}}' \
    "$work/recipe_dsa" "$cfg" "$work/recipe_a/ckpt" > "$work/r_dsa_$(basename "$cfg")"
done
expect_ok "dsa convert recipe" $prl sft --config "$work/r_dsa_tiny_dsa.json" --threads 2
grep -q "8 new tensors" "$work/last.out" && grep -q "as loaded, full attention" "$work/last.out" \
  && grep -q "index_kl" "$work/last.out" && grep -q "after the sparse adaptation: loss" "$work/last.out" \
  && ok "dsa convert: indexers new, losses before and after" || bad "dsa convert: $(grep sft: "$work/last.out")"
# the held-out loss: 16 eval-split demos per trained (domain, difficulty), none of them a
# training prompt, measured on the base (as loaded, dense) and on the converted model
held="$work/recipe_dsa/heldout.jsonl"
[ "$(wc -l < "$held")" = 48 ] && grep -q "48 held-out demos" "$work/last.out" \
  && grep -q "held-out eval (48 eval-split demos) as loaded, full attention: loss" "$work/last.out" \
  && grep -q "held-out eval (48 eval-split demos) after the sparse adaptation: loss" "$work/last.out" \
  && grep -Eq "held-out: 48 demos, [0-9.]+ tokens on average; top-8 keeps [0-9.]+% of the causal key pairs" "$work/last.out" \
  && ok "dsa convert: held-out loss on 48 eval-split demos" || bad "dsa held-out: $(grep held "$work/last.out")"
python3 -c 'import json,sys
problem = lambda o: json.dumps([o["messages"], o.get("env")])
train = {problem(json.loads(l)) for l in open(sys.argv[1])}
held = [json.loads(l) for l in open(sys.argv[2])]
ok = held and all(o["split"] == "eval" and problem(o) not in train for o in held)
sys.exit(0 if ok else 1)' "$work/recipe_dsa/demos.jsonl" "$held" \
  && ok "dsa held-out demos: eval split, none a training demo" || bad "dsa held-out demos overlap the training demos"
expect_fail "dsa warm-up needs DSA layers" "has no 'dsa_layers'" $prl sft --config "$work/r_dsa_tiny.json" --threads 2
# a DSA model from scratch: dsa.dense_steps of sft.steps dense, then sparse; the checkpoint says sparse
printf '{"run": {"dir": "%s"}, "model": {"config": "%s"}, "demos": {"reasoning": {"d1": 6}, "coding": {"d1": 4}}, "dsa": {"dense_steps": 1}, "sft": {"steps": 2, "batch": 4, "group": 2, "warmup": 0}}' \
  "$work/recipe_dense" "$work/tiny_dsa.json" > "$work/r_dense.json"
expect_ok "dsa dense-stage recipe" $prl sft --config "$work/r_dense.json" --threads 2
grep -q "after the dense stage, sparse attention: loss" "$work/last.out" && grep -q "at the end, sparse attention: loss" "$work/last.out" \
  && grep -q '"prl_dsa_stage": *"sparse"' "$work/recipe_dense/ckpt/config.json" \
  && ok "dsa dense stage, then sparse" || bad "dsa dense stage: $(grep sft: "$work/last.out")"
sed -i 's/"dense_steps": 1/"dense_steps": 2/' "$work/r_dense.json"
expect_fail "dsa.dense_steps below sft.steps" "key 'dsa.dense_steps' = 2 must be below sft.steps" $prl sft --config "$work/r_dense.json"
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
expect_fail "unknown role" "unknown role 'frob' (known roles: controller, trainer" $prl role frob
expect_fail "role sandbox without --bind" "missing required option '--bind'" $prl role sandbox
expect_fail "role sandbox bad endpoint" "transport must be" $prl role sandbox --bind foo://x
# roles started by hand: the controller makes the run's ckpt/ and logs/; stopped (SIGTERM),
# the controller and the sandbox service leave no ipc socket file behind
mkdir -p "$work/byhand"
printf '{"run": {"name": "byhand"}, "model": {"init": "%s"}, "task": {"domain": "reasoning", "train_problems": 8},
 "rollout": {"batch_prompts": 1, "group_size": 2, "max_new_tokens": 8}, "controller": {"steps": 1}}' "$work/ck" \
  > "$work/byhand/job.json"
timeout -s TERM 3 $prl role controller --run "$work/byhand" > "$work/byhand.out" 2>&1
timeout -s TERM 2 $prl role sandbox --bind "ipc://$work/byhand/sandbox.sock" >> "$work/byhand.out" 2>&1
[ -d "$work/byhand/ckpt" ] && [ -d "$work/byhand/logs" ] && ok "role controller makes ckpt/ and logs/" \
  || bad "role controller: $(ls "$work/byhand"; cat "$work/byhand.out")"
ls "$work/byhand"/*.sock 2>/dev/null | grep -q . && bad "ipc socket files left: $(ls "$work/byhand")" \
  || ok "no ipc socket file left after SIGTERM"
# who may join (docs/protocol.md): the controller made the run's key, its owner's alone
[ "$(stat -c %a "$work/byhand/bus.key" 2>/dev/null)" = 600 ] && ok "role controller makes bus.key 0600" \
  || bad "bus.key: $(ls -l "$work/byhand")"
expect_fail "worker on tcp without --key" "give the run's key with --key" \
  $prl role rollout --connect tcp://127.0.0.1:5 --name r
cp "$work/byhand/bus.key" "$work/open.key" && chmod 644 "$work/open.key"
expect_fail "a key others can read" "can be read by others (mode 0644)" \
  $prl role reward --connect tcp://127.0.0.1:5 --key "$work/open.key"
expect_ok "sandbox probe" $prl sandbox probe
grep -q "pidns" "$work/last.out" && ok "sandbox probe lists layers" || bad "sandbox probe: $(cat "$work/last.out")"
grep -q "^mode: " "$work/last.out" && grep -A1 "^socket families allowed" "$work/last.out" | grep -q "AF_UNIX" \
  && grep -A9 "^system calls refused" "$work/last.out" | grep -q "memfd_secret" \
  && grep -q "^  wall_seconds *10 *3600" "$work/last.out" \
  && ok "sandbox probe prints the policy" || bad "sandbox probe policy: $(cat "$work/last.out")"
$prl sandbox probe --json > "$work/probe.json"
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["policy"]; assert "AF_VSOCK" not in p["socket_families"] and "AF_UNIX" in p["socket_families"] and {"bpf","keyctl","io_uring_setup","userfaultfd","perf_event_open","memfd_secret"} <= set(p["refused_syscalls"]) and p["limits"]["maximum"]["processes"] == 4096' "$work/probe.json" \
  && ok "sandbox probe --json policy" || bad "sandbox probe --json: $(head -c 600 "$work/probe.json")"

summary
