#!/usr/bin/env bash
# test_pipeline.sh — `prl run` end to end: real processes over real ZeroMQ sockets and a real
# run.db. A small General expert is trained three times with the same seed:
#   a  undisturbed;
#   b  with kill -9 of the rollout, reward and trainer processes mid-run (the launcher
#      restarts them, the controller hands their work out again);
#   c  with kill -9 of every process of the run mid-run, then `prl run --resume`.
# All three must hold the same samples (tokens, log-probs, versions, rewards) and end with a
# bitwise-identical policy, and run.db must hold every sample once. A Coding run (programs in
# the sandbox service) is then repeated with the sandbox killed mid-run (d0 vs d; this small
# model scores 0 on Coding, so there the samples and rewards are what is compared). Also:
# config errors fail before any process starts; an existing run is never restarted.
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
. "$src/tests/run_lib.sh" # run_setup, fail, small_model, start_run, wait_steps, role_pid, ...
run_setup pipeline

# ---- a small policy with some skill (so rewards differ within groups and updates happen)
$prl tasks demos --domain general --n 300 --seed 1 --out demos.jsonl 2>/dev/null
$prl tasks demos --domain coding --n 300 --seed 1 >> demos.jsonl 2>/dev/null
$prl tokenizer train --data demos.jsonl --vocab 512 --out tok.json >/dev/null 2>&1
small_model small.json 512 64
$prl sft --data demos.jsonl --model small.json --tokenizer tok.json --out base --steps 200 \
  --batch 8 --seq 160 --optimizer adamw --lr 3e-3 --log-every 1000 >/dev/null 2>&1
cat > job.json <<'EOF'
{"run": {"name": "a", "seed": 7},
 "model": {"init": "base"},
 "task": {"domain": "general", "train_problems": 64},
 "rollout": {"batch_prompts": 2, "group_size": 8, "max_new_tokens": 48},
 "optim": {"lr": 1e-4},
 "controller": {"steps": 14, "heartbeat_seconds": 0.2, "lease_seconds": 3}}
EOF
STEPS=14 N=$((14 * 2 * 8))

# ---- config errors name the key and start nothing
expect_refused "unknown key" "rollout.grup_size" start --set rollout.grup_size=4
expect_refused "wrong type" "rollout.group_size" start --set 'rollout.group_size="eight"'
expect_refused "B*G = 0" "rollout.group_size" start --set rollout.group_size=0
expect_refused "negative clip" "grpo.clip_low" start --set grpo.clip_low=-0.1
expect_refused "missing init" "model.init" start --set model.init=nowhere

kill_role() { # run, role name (the run's launcher is $launcher)
  local pid
  pid=$(role_pid "$launcher" "--name $2")
  [ -n "$pid" ] || fail "no process for $2 of run $1"
  kill -9 "$pid"
  echo "killed $2 of run $1 (pid $pid) after $(steps_done "$1") steps"
}
same_samples() { # run x, run y: every sample's tokens, log-probs, version and reward are equal
  local q="SELECT step, prompt_id, sample_index, hex(tokens), hex(logprobs), version, reward, reward_detail FROM samples ORDER BY 1, 2, 3"
  [ "$(sqlite3 "runs/$1/run.db" "$q" | sha256sum)" = "$(sqlite3 "runs/$2/run.db" "$q" | sha256sum)" ] ||
    fail "runs $1 and $2 hold different samples"
}
check_db() { # run: every sample once, with version and reward
  local db=runs/$1/run.db
  [ "$(sqlite3 $db 'SELECT count(*) FROM samples')" = "$N" ] || fail "run $1: $(sqlite3 $db 'SELECT count(*) FROM samples') samples, want $N"
  [ "$(sqlite3 $db 'SELECT count(DISTINCT step || prompt_id || sample_index) FROM samples')" = "$N" ] || fail "run $1: duplicate keys"
  [ "$(sqlite3 $db 'SELECT count(*) FROM samples WHERE version = step AND reward BETWEEN 0 AND 1')" = "$N" ] || fail "run $1: a sample's version or reward is off"
  [ "$(sqlite3 $db 'SELECT max(version) FROM versions')" = "$STEPS" ] || fail "run $1: versions"
  [ "$(sqlite3 $db "SELECT status FROM runs")" = "done" ] || fail "run $1: status"
  # metrics.jsonl: every step once, in order, each line run.db's step metrics plus "step"
  sqlite3 $db "SELECT step, metrics FROM steps ORDER BY step" | python3 -c '
import json, sys
db = [(int(s), json.loads(m)) for s, m in (l.split("|", 1) for l in sys.stdin.read().splitlines())]
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l.pop("step") for l in lines] == [s for s, _ in db] == list(range(int(sys.argv[2]))), "steps"
assert lines == [m for _, m in db], "fields"' "runs/$1/metrics.jsonl" "$STEPS" || fail "run $1: metrics.jsonl differs from run.db"
}

# ---- a: undisturbed
$prl run job.json > a.out 2> a.err || { cat a.err; fail "run a"; }
grep -q "v$STEPS/$STEPS" a.out || fail "run a: no progress line for the last step"
check_db a
echo "ok: run a: $N samples, $STEPS versions"

# ---- b: kill -9 of rollout, reward and trainer mid-run
start_run b job.json --set run.name=b
wait_steps b 3; kill_role b rollout-0
wait_steps b 6; kill_role b reward-0
wait_steps b 9; kill_role b trainer-0
wait_steps b 11
pid=$(role_pid "$launcher" "role controller --run runs/b"); kill -9 "$pid"
echo "killed the controller of run b (pid $pid) after $(steps_done b) steps"
wait $launcher || { cat b.err; fail "run b"; }
check_db b
[ "$(grep -c 'died (killed by signal 9)' b.err)" = 4 ] || { cat b.err; fail "run b: restarts not reported"; }
echo "ok: run b: rollout, reward, trainer and controller killed and restarted, $N samples, no duplicates"

# ---- c: everything killed, then --resume
start_run c job.json --set run.name=c
wait_steps c 5
pkill -9 -P "$launcher" || true
kill -9 $launcher 2>/dev/null || true
wait $launcher 2>/dev/null || true
echo "killed every process of run c after $(steps_done c) steps"
$prl run --resume runs/c > c2.out 2> c2.err || { cat c2.err; fail "resume c"; }
check_db c
echo "ok: run c: resumed to the end"
# a refused --resume override changes nothing on disk, and a legal resume still runs after it
cp runs/c/job.json c.job.before
if $prl run --resume runs/c --set optim.lr=1 > c3.out 2>&1; then fail "resume with another lr accepted"; fi
grep -q "started with another config" c3.out || fail "resume with another lr: $(cat c3.out)"
cmp -s runs/c/job.json c.job.before || fail "a refused --resume rewrote runs/c/job.json"
$prl run --resume runs/c --set controller.steps=$STEPS > c4.out 2> c4.err ||
  { cat c4.err; fail "a legal resume after a refused one"; }
echo "ok: a refused --resume override leaves job.json as it was; a legal one still runs"

# ---- d: a Coding run (programs go to the sandbox service) with the sandbox killed mid-run
cat > coding.json <<'EOF'
{"run": {"name": "d0", "seed": 3},
 "model": {"init": "base"},
 "task": {"domain": "coding", "train_problems": 64},
 "rollout": {"batch_prompts": 2, "group_size": 4, "max_new_tokens": 40},
 "optim": {"lr": 1e-4},
 "controller": {"steps": 6, "heartbeat_seconds": 0.2, "lease_seconds": 3}}
EOF
$prl run coding.json > d0.out 2> d0.err || { cat d0.err; fail "run d0"; }
start_run d coding.json --set run.name=d
wait_steps d 2
pid=$(role_pid "$launcher" "role sandbox --bind ipc://runs/d/sandbox.sock"); kill -9 "$pid"
echo "killed the sandbox of run d (pid $pid) after $(steps_done d) steps"
wait $launcher || { cat d.err; fail "run d"; }
grep -q "sandbox died (killed by signal 9)" d.err || fail "run d: sandbox restart not reported"
[ "$(sqlite3 runs/d/run.db 'SELECT count(*) FROM samples')" = 48 ] || fail "run d: samples"
cmp runs/d0/final/model.safetensors runs/d/final/model.safetensors || fail "run d's final policy differs from d0's"
same_samples d0 d
echo "ok: run d: coding with the sandbox killed mid-run: the same samples, rewards and final policy as d0"

# ---- the unsolved retire rule: this model scores 0 on Coding, so after the first epoch (4
# prompts, 2 steps) every prompt is retired, with an event, and the run stops naming why
if $prl run coding.json --set run.name=u --set task.train_problems=4 --set controller.steps=4 \
     --set controller.retire_unsolved_epochs=1 > u.out 2> u.err; then fail "run u: no error"; fi
grep -q "run 'u' failed: step 2: every train prompt is retired" u.err || fail "run u: $(cat u.err)"
grep -q "starting it again" u.err && fail "run u: the controller was restarted"
[ "$(sqlite3 runs/u/run.db "SELECT detail FROM events WHERE kind = 'retire'")" = \
  '{"epoch": 1, "retired": 4, "rule": "unsolved"}' ] || fail "run u: retire event"
[ "$(sqlite3 runs/u/run.db "SELECT count(*) FROM prompts WHERE retired = 1 AND unsolved_bits = 1")" = 4 ] ||
  fail "run u: retired prompts"
echo "ok: run u: unsolved prompts retired after one epoch ($(steps_done u) steps), the run stops naming why"

for r in b c; do
  cmp runs/a/final/model.safetensors runs/$r/final/model.safetensors ||
    fail "run $r's final policy differs from the undisturbed run's"
  same_samples a $r
done
echo "ok: final policies of a, b and c are bitwise identical ($(sha256sum runs/a/final/model.safetensors | cut -c1-16))"

# ---- a finished run cannot be started again by accident
if $prl run job.json 2> again.err; then fail "restarted an existing run"; fi
grep -q -- "--resume runs/a" again.err || fail "existing run: $(cat again.err)"
echo "ok: an existing run directory needs --resume"

# ---- --resume after an upgrade: keys added since the run was recorded, at their defaults,
# do not block it; the same key set to something else does, at once (no restarts)
cp -r runs/a runs/old && sqlite3 runs/old/run.db \
  "UPDATE runs SET config = json_remove(config, '$.replay', '$.grpo.correction')"
$prl run --resume runs/old > old.out 2> old.err || { cat old.err; fail "resume of a run recorded without the new keys"; }
grep -q "run finished" old.out || fail "resume after upgrade: $(cat old.out old.err)"
python3 -c 'import json; j = json.load(open("runs/old/job.json")); j.setdefault("replay", {})["mode"] = "r3"; json.dump(j, open("runs/old/job.json", "w"))'
if $prl run --resume runs/old 2> old2.err; then fail "resumed with a changed config"; fi
grep -q "started with another config" old2.err || fail "changed config: $(cat old2.err)"
grep -q "starting it again" old2.err && fail "changed config: the controller was restarted"
echo "ok: --resume accepts keys added at their defaults, refuses a changed one without restarts"
echo "test_pipeline: all passed"
