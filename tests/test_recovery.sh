#!/usr/bin/env bash
# test_recovery.sh — `prl run` faults that must end in progress or a clear failure (issue 28
# findings 3 and 4), on a tiny policy whose rewards vary from the first step (a reward program
# scores the completion's length), each run a few seconds:
#   bad_init   NaN, Inf and truncated model.init refused by `prl run --check` and `prl run`
#              (nothing created), and by `prl generate` / `prl score`;
#   nan_lp     a policy with finite weights whose log-probs are NaN: `prl generate` and `prl
#              score` fail naming the sample and line rather than print them; the run fails after
#              controller.max_rejected rejected results, status failed, the reason in run.db;
#   log_limit  the same policy with the bound out of reach for 5 s: the log lines of rejected
#              results and re-leases are rate-limited, and the "held back" lines account for
#              every re-lease recorded in run.db;
#   job_json   job.json truncated mid-run, then the controller killed: the run fails at once
#              (no restart loop), status failed, the reason naming job.json;
#   lock       a second `prl run --resume` of a running run is refused naming the holder's PID
#              and changes nothing;
#   tidy       a killed save's ckpt/vN.tmp.PID (dead PID) is removed at the next start, a live
#              one and a user's directory kept; a version the keep rule drops is pruned;
#   fallback   a flipped byte in the newest checkpoint: --resume falls back to the previous
#              kept version (event `fallback`) and ends bitwise equal to an undisturbed run.
# SECTIONS="a b" runs only those (to check each against an older prl).
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
. "$src/tests/run_lib.sh" # run_setup, fail, small_model, start_run, wait_steps, role_pid, ...
run_setup recovery
SECTIONS=${SECTIONS:-bad_init nan_lp log_limit job_json lock tidy fallback}

# ---- a tiny policy (20 SFT steps) and a job whose rewards vary: score = len(completion) % 5 / 4
$prl tasks demos --domain general --n 100 --seed 1 --out demos.jsonl 2>/dev/null
$prl tokenizer train --data demos.jsonl --vocab 512 --out tok.json >/dev/null 2>&1
small_model small.json 512 64
$prl sft --data demos.jsonl --model small.json --tokenizer tok.json --out base --steps 20 \
  --batch 8 --seq 160 --optimizer adamw --lr 3e-3 --log-every 1000 >/dev/null 2>&1
cat > reward_len.py <<'EOF'
import json, sys
for line in sys.stdin:
    print(json.dumps({"score": len(json.loads(line)["completion"]) % 5 / 4}), flush=True)
EOF
cat > job.json <<'EOF'
{"run": {"name": "a", "seed": 7},
 "model": {"init": "base"},
 "task": {"domain": "general", "train_problems": 16},
 "rollout": {"batch_prompts": 2, "group_size": 4, "max_new_tokens": 16},
 "reward": {"program": ["python3", "reward_len.py"]},
 "optim": {"lr": 1e-4},
 "controller": {"steps": 6, "heartbeat_seconds": 0.2, "lease_seconds": 3}}
EOF

# set_weights SRC DST TENSOR VALUE [all]: a copy of checkpoint SRC whose TENSOR's first value
# (every value with "all") is VALUE, saved without a prl checksum (as an imported file: the
# loader then checks the values, not the bytes)
set_weights() {
  python3 - "$@" <<'PY'
import json, os, shutil, struct, sys
src, dst, name, val = sys.argv[1:5]
shutil.copytree(src, dst)
p = os.path.join(dst, "model.safetensors")
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
a, e = json.loads(b[8:8 + n])[name]["data_offsets"]
count = (e - a) // 4 if len(sys.argv) > 5 else 1
b[8 + n + a:8 + n + a + 4 * count] = struct.pack("<f", float(val)) * count
b[8:8 + n] = b[8:8 + n].replace(b'"prl_checksum"', b'"prl_checksu_"')
open(p, "wb").write(b)
PY
}
events() { sqlite3 "runs/$1/run.db" "SELECT detail FROM events WHERE kind = '$2'"; }
status() { sqlite3 "runs/$1/run.db" "SELECT status FROM runs"; }
want() { [[ " $SECTIONS " == *" $1 "* ]]; }

# ---- bad_init
if want bad_init; then
  set_weights base nan model.embed_tokens.weight nan
  set_weights base inf model.layers.0.mlp.down_proj.weight inf
  cp -r base trunc && truncate -s -100 trunc/model.safetensors
  expect_refused "NaN in model.init" "model.init: nan/model.safetensors: tensor 'model.embed_tokens.weight' has a NaN" \
    "check start" --set model.init=nan
  expect_refused "Inf in model.init" "has an infinity" "check start" --set model.init=inf
  expect_refused "truncated model.init" "model.init: safetensors trunc/model.safetensors" "check start" \
    --set model.init=trunc
  for cmd in "generate --prompt hi --max-new-tokens 2" "score --input one.jsonl"; do
    if out=$($prl $cmd --ckpt nan 2>&1); then fail "prl $cmd took a NaN checkpoint"; fi
    echo "$out" | grep -q "has a NaN at element 0" || fail "prl $cmd: $out"
  done
  echo "ok: NaN/Inf weights refused by prl generate and prl score"
fi

set_weights base overflow lm_head.weight 3e38 all # finite weights whose logits overflow
echo '{"text": "hello"}' > one.jsonl

# ---- nan_lp: finite weights, NaN log-probs (lm_head at 3e38 overflows the logits)
if want nan_lp; then
  $prl run job.json --check --set model.init=overflow >/dev/null
  for cmd in "generate --prompt hi --max-new-tokens 2" "score --input one.jsonl" "score --input one.jsonl --path infer --json"; do
    if out=$($prl $cmd --ckpt overflow 2>&1); then fail "prl $cmd printed NaN log-probs"; fi
    echo "$out" | grep -q "is NaN: the model's output is not finite" || fail "prl $cmd: $out"
  done
  if timeout 60 $prl run job.json --set run.name=nanlp --set model.init=overflow > nanlp.out 2> nanlp.err; then
    fail "run nanlp: no error"
  fi
  grep -q "10 results rejected (controller.max_rejected = 10), the last: result: response token 0 has log-prob" nanlp.err ||
    fail "run nanlp: $(tail -n 3 nanlp.err)"
  [ "$(status nanlp)" = failed ] || fail "run nanlp: status $(status nanlp)"
  events nanlp failed | grep -q "results rejected" || fail "run nanlp: no failed event"
  requeues=$(sqlite3 runs/nanlp/run.db "SELECT count(*) FROM events WHERE kind = 'requeue'")
  [ "$requeues" -le 10 ] || fail "run nanlp: $requeues re-leases"
  echo "ok: NaN log-probs: prl generate and prl score refuse them; the run fails after $requeues rejected results, status failed with the reason"
fi

# ---- log_limit: the NaN log-probs again, the bound out of reach, stopped after 5 s
if want log_limit; then
  timeout -s INT 5 $prl run job.json --set run.name=flood --set model.init=overflow \
    --set controller.max_rejected=1000000000 > flood.out 2> flood.err || true
  log=runs/flood/logs/controller.log
  requeues=$(sqlite3 runs/flood/run.db "SELECT count(*) FROM events WHERE kind = 'requeue'")
  written=$(grep -c "] lease [0-9]* (rollout, step 0) handed out again" $log || true)
  held=$(grep -o "held back: [0-9]* more 'lease handed out again'" $log | awk '{s += $3} END {print s + 0}')
  rejected=$(grep -c "] rejected message" $log || true)
  [ "$requeues" -gt 100 ] || fail "log_limit: only $requeues re-leases in 5 s"
  [ "$written" -le 30 ] && [ "$rejected" -le 30 ] ||
    fail "log_limit: $written re-lease and $rejected rejection lines for $requeues re-leases"
  [ $((written + held)) = "$requeues" ] ||
    fail "log_limit: $written lines + $held held back, but $requeues re-leases in run.db"
  lines=$(grep -c "\] controller: " runs/flood/logs/rollout-0.log || true)
  [ "$lines" -le 30 ] || fail "log_limit: the rollout worker logged $lines error replies"
  echo "ok: $requeues re-leases in 5 s: $written re-lease and $rejected rejection lines in the log, the rest counted as held back"
fi

# ---- job_json: truncated mid-run, then the controller killed
if want job_json; then
  start_run jj job.json --set run.name=jj --set controller.steps=1000
  wait_steps jj 2
  truncate -s 60 runs/jj/job.json
  kill -9 "$(pgrep -P "$launcher" -f -- "role controller")"
  if timeout 60 tail --pid="$launcher" -f /dev/null; wait "$launcher"; then fail "run jj: no error"; fi
  [ "$(grep -c "starting it again" jj.err)" = 1 ] || fail "run jj: restarted: $(cat jj.err)"
  grep -q "the run failed: .*runs/jj/job.json:.*invalid JSON" jj.err || fail "run jj: $(cat jj.err)"
  [ "$(status jj)" = failed ] || fail "run jj: status $(status jj)"
  events jj failed | grep -q "job.json" || fail "run jj: no failed event naming job.json"
  echo "ok: a truncated job.json fails the run at the controller's restart (status failed, no restart loop)"
fi

# ---- lock: a second --resume of a running run
if want lock; then
  start_run lk job.json --set run.name=lk --set controller.steps=1000
  wait_steps lk 1
  cp runs/lk/job.json lk.job.before
  if out=$($prl run --resume runs/lk --set controller.steps=2000 2>&1); then fail "a second prl run of lk started"; fi
  echo "$out" | grep -q "runs/lk is in use: another prl run (pid $launcher) holds runs/lk/lock" || fail "lock: $out"
  cmp -s runs/lk/job.json lk.job.before || fail "a refused second --resume rewrote job.json"
  kill -INT "$launcher"
  wait "$launcher" || true
  echo "ok: a second prl run of a running run is refused naming the holder's pid"
fi

# ---- tidy: at the next start, a dead save's temporary goes, a live one and a user's stay,
# a version the keep rule drops (as left by a controller killed between commit and prune) goes
if want tidy; then
  $prl run job.json --set run.name=td --set controller.steps=3 > td.out 2> td.err || { cat td.err; fail "run td"; }
  ck=runs/td/ckpt
  sleep 30 & alive=$!
  sh -c 'exit 0' & dead=$!
  wait $dead
  mkdir $ck/v000004.tmp.$dead $ck/v000004.tmp.$alive $ck/v000009.tmp.$dead
  cp $ck/v000003/* $ck/v000004.tmp.$dead/
  cp $ck/v000003/config.json $ck/v000004.tmp.$alive/
  cp $ck/v000003/config.json $ck/v000009.tmp.$dead/ && echo mine > $ck/v000009.tmp.$dead/notes.txt
  cp -r $ck/v000003 $ck/v000001
  $prl run --resume runs/td --set controller.steps=4 > td2.out 2> td2.err || { cat td2.err; fail "resume td"; }
  kill $alive
  [ ! -e $ck/v000004.tmp.$dead ] || fail "tidy: the dead save's temporary is still there"
  [ -e $ck/v000004.tmp.$alive/config.json ] || fail "tidy: a live process's temporary was removed"
  [ -e $ck/v000009.tmp.$dead/notes.txt ] && [ -e $ck/v000009.tmp.$dead/config.json ] ||
    fail "tidy: a directory with a user's file was touched"
  [ ! -e $ck/v000001 ] || fail "tidy: version 1 not pruned"
  [ "$(events td cleaned)" = '{"stale_tmp": 1}' ] || fail "tidy: cleaned event: $(events td cleaned)"
  echo "ok: a dead save's temporary removed, a live one and a user's kept; a dropped version pruned"
fi

# ---- fallback: a flipped byte in the newest checkpoint, then --resume
if want fallback; then
  $prl run job.json --set run.name=u > u.out 2> u.err || { cat u.err; fail "run u"; }
  $prl run job.json --set run.name=fb --set controller.steps=4 > fb.out 2> fb.err || { cat fb.err; fail "run fb"; }
  python3 - runs/fb/ckpt/v000004/model.safetensors <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[-100] ^= 1; open(sys.argv[1], "wb").write(b)
PY
  $prl run --resume runs/fb --set controller.steps=6 > fb2.out 2> fb2.err || { cat fb2.err; fail "resume fb"; }
  grep -q "version 4 cannot be used (.*checksum mismatch.*): falling back to version 3" fb2.out ||
    fail "fallback not said: $(cat fb2.out)"
  events fb fallback | grep -q '"from":4,"to":3' || fail "fallback event: $(events fb fallback)"
  ls runs/fb/ckpt | grep -q '^v000004.corrupt-' || fail "the corrupt version was not kept aside"
  cmp runs/u/final/model.safetensors runs/fb/final/model.safetensors ||
    fail "the fallen-back run's final policy differs from the undisturbed one's"
  q="SELECT step, prompt_id, sample_index, hex(tokens), hex(logprobs), version, reward FROM samples ORDER BY 1, 2, 3"
  [ "$(sqlite3 runs/u/run.db "$q" | sha256sum)" = "$(sqlite3 runs/fb/run.db "$q" | sha256sum)" ] ||
    fail "the fallen-back run holds other samples"
  [ "$(sqlite3 runs/u/run.db "SELECT count(DISTINCT reward) FROM samples WHERE step = 0")" -gt 1 ] ||
    fail "rewards do not vary: the bitwise check would see no update"
  # metrics.jsonl follows run.db back: the steps taken back are not listed twice
  steps=$(python3 -c 'import json, sys; print(",".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' runs/fb/metrics.jsonl)
  [ "$steps" = "0,1,2,3,4,5" ] || fail "metrics.jsonl after the fallback lists steps $steps"
  echo "ok: a corrupt newest checkpoint: --resume falls back to version 3 and ends bitwise equal ($(sha256sum runs/u/final/model.safetensors | cut -c1-16))"
fi
echo "test_recovery: all passed"
