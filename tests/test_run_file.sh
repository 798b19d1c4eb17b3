#!/usr/bin/env bash
# test_run_file.sh — `prl run` on a users' prompt file scored by a reward program, end to end
# (real processes, ZeroMQ, run.db; a tiny random policy, under a minute):
#   - a bad prompt line and a bad reward.program fail before any process starts, naming
#     FILE:LINE and the field (prl run and prl run --check);
#   - the example reward program (examples/reward_math.py) scores every sample; killed with
#     kill -9 mid-run it is restarted and nothing is lost or counted twice (run.db: B·G·steps
#     samples, one per key, each scored by the program; the worker's log names the restart);
#   - the in-run evaluations of task.eval_every are in run.db (event `eval`), and the prompts
#     keep their metadata;
#   - a program is sent the sample's ids, prompt, completion and metadata; cut-off samples are
#     never paid;
#   - a line of each built-in verifier (an agent world of the line's own among them) is played
#     and scored in one run.
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
. "$src/tests/run_lib.sh" # run_setup, fail, small_model, start_run, wait_steps, role_pid, ...
run_setup run-file

python3 "$src/examples/make_math_prompts.py" --n 300 --seed 3 > prompts.jsonl
$prl tasks demos --domain reasoning --n 60 --seed 1 > demos.jsonl 2>/dev/null
$prl tokenizer train --data demos.jsonl --vocab 300 --out tok.json >/dev/null 2>&1
small_model small.json 300 32
$prl init --model small.json --out base --tokenizer tok.json >/dev/null
STEPS=6 B=2 G=4
cat > job.json <<EOF
{"run": {"name": "f", "seed": 3},
 "model": {"init": "base"},
 "task": {"source": "file", "path": "prompts.jsonl", "eval_every": 3, "eval_problems": 6,
          "eval_samples": 2},
 "rollout": {"batch_prompts": $B, "group_size": $G, "max_new_tokens": 24, "max_turns": 2},
 "reward": {"program": ["python3", "$src/examples/reward_math.py"], "timeout": 5},
 "controller": {"steps": $STEPS, "heartbeat_seconds": 0.2, "lease_seconds": 3}}
EOF

# ---- bad inputs fail before any process starts, naming FILE:LINE and the field
head -n 4 prompts.jsonl > bad.jsonl
echo '{"prompt": "What is 1 + 1?", "verifier": "math", "answer": ""}' >> bad.jsonl
expect_refused "empty math answer" "bad.jsonl:5: " "check start" --set task.path=bad.jsonl
expect_refused "its field" "answer" "check start" --set task.path=bad.jsonl
echo '{"prompt": "x", "verifier": "code", "tests": [{"stdin": "1"}]}' > bad2.jsonl
expect_refused "code test" "bad2.jsonl:1: field 'tests'" "check start" --set task.path=bad2.jsonl
expect_refused "no prompt file" "task.path" "check start" --set task.path=missing.jsonl
expect_refused "reward program interpreter" "not an executable file under /usr" "check start" \
  --set 'reward.program=["no-such-interpreter", "r.js"]'
expect_refused "reward program script" "missing.py" "check start" \
  --set 'reward.program=["python3", "missing.py"]'

# ---- the run, with the reward program killed mid-run
descendants() { # pid: every process below it
  local c
  for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done
}
$prl run job.json > run.out 2>&1 &
launcher=$!
killed=0
# from step 2 on, with the controller held (SIGSTOP) so that the run cannot end before the
# reward worker finds its program gone: the steps left must still be scored, by a restart
for _ in $(seq 1 3000); do
  if [ "$(steps_done f)" -ge 2 ]; then
    ctl=$(pgrep -P "$launcher" -f "prl role controller" | head -n 1)
    kill -STOP "$ctl"
    reward=$(pgrep -P "$launcher" -f "prl role reward" | head -n 1) # not the python tool's runs
    for p in $(descendants "$reward"); do
      if { tr '\0' ' ' < "/proc/$p/cmdline"; } 2>/dev/null | grep -q "python3 .*main.py"; then
        kill -9 "$p" 2>/dev/null && killed=$((killed + 1))
      fi
    done
    kill -CONT "$ctl"
    [ "$killed" -ge 1 ] && break
  fi
  sleep 0.02
done
[ "$killed" -ge 1 ] || fail "no reward program process found to kill"
wait "$launcher" || { cat run.out; fail "prl run failed"; }
launcher=""
db=runs/f/run.db
n=$(sqlite3 $db "SELECT count(*) FROM samples")
keys=$(sqlite3 $db "SELECT count(DISTINCT step || '/' || prompt_id || '/' || sample_index) FROM samples")
[ "$n" -eq $((STEPS * B * G)) ] || fail "run.db holds $n samples, not $((STEPS * B * G))"
[ "$keys" -eq "$n" ] || fail "$keys distinct sample keys for $n samples"
by_program=$(sqlite3 $db "SELECT count(*) FROM samples, json_each(samples.reward_detail, '\$.checks') c
  WHERE json_extract(c.value, '\$.name') = 'reward_program' AND json_extract(c.value, '\$.passed')")
[ "$by_program" -eq "$n" ] || fail "$by_program of $n samples were scored by the reward program"
failed=$(sqlite3 $db "SELECT count(*) FROM events WHERE kind = 'score_failed'")
[ "$failed" -eq 0 ] || fail "$failed samples could not be scored"
grep -q "reward program stopped" runs/f/logs/reward-0.log || fail "the reward worker's log names no restart"
echo "ok: kill -9 of the reward program: $n samples, $keys keys, $by_program scored by the program"

# ---- in-run evaluations (versions 0, 3, 6) and the prompts' metadata
evals=$(sqlite3 $db "SELECT group_concat(json_extract(detail, '\$.version')) FROM events WHERE kind = 'eval'")
[ "$evals" = "0,3,6" ] || fail "eval events for versions '$evals', not 0,3,6"
pass=$(sqlite3 $db "SELECT count(*) FROM events WHERE kind = 'eval' AND json_extract(detail, '\$.k') = 2
  AND json_type(detail, '\$.pass_k') = 'real' AND json_extract(detail, '\$.by.math.n') = 6")
[ "$pass" -eq 3 ] || fail "eval events lack k, pass_k or the math count"
meta=$(sqlite3 $db "SELECT count(*) FROM prompts WHERE json_extract(task, '\$.template') IS NOT NULL")
total=$(sqlite3 $db "SELECT count(*) FROM prompts")
[ "$meta" -eq "$total" ] || fail "$meta of $total prompts kept their metadata"
split=$(sqlite3 $db "SELECT count(*) FROM prompts WHERE split = 'eval'")
[ "$split" -eq 6 ] || fail "$split eval prompts recorded, not 6"
echo "ok: evaluations of versions $evals in run.db; $total prompts with their metadata"
# a resumed run does not evaluate a version run.db already holds an evaluation of
$prl run --resume runs/f > f2.out 2>&1 || { cat f2.out; fail "resume of a finished run"; }
evals=$(sqlite3 $db "SELECT group_concat(json_extract(detail, '\$.version')) FROM events WHERE kind = 'eval'")
[ "$evals" = "0,3,6" ] || fail "after a resume: eval events for versions '$evals', not 0,3,6"
echo "ok: a resume evaluates no version twice"

# ---- what a reward program is sent: a program that echoes the request's sizes back
cat > echo.py <<'PY'
import json, sys
for line in sys.stdin:
    q = json.loads(line)
    turns_end = q["turns"][-1]["content"] if q["turns"] else ""
    sys.stdout.write(json.dumps({"score": 0.5, "breakdown": {
        "n_prompt_ids": len(q["prompt_ids"]), "n_completion_ids": len(q["completion_ids"]),
        "answer_in_metadata": "answer" in q["metadata"], "prompt_is_user": bool(q["prompt"]),
        "completion_is_last_turn": q["completion"] == turns_end}}) + "\n")
    sys.stdout.flush()
PY
$prl run job.json --set run.name=g --set controller.steps=2 --set task.eval_every=0 \
  --set "reward.program=[\"python3\", \"$work/echo.py\"]" > g.out 2>&1 || { cat g.out; fail "run g failed"; }
db=runs/g/run.db
check_of() { echo "(SELECT json_extract(c.value, '\$.detail') FROM json_each(samples.reward_detail, '\$.checks') c WHERE json_extract(c.value, '\$.name') = '$1')"; }
good=$(sqlite3 $db "SELECT count(*) FROM samples WHERE $(check_of reward_program) = 'score 0.5'
  AND $(check_of n_prompt_ids) = CAST(prompt_len AS TEXT)
  AND $(check_of n_completion_ids) = CAST(n_tokens - prompt_len AS TEXT)
  AND $(check_of answer_in_metadata) = '1' AND $(check_of prompt_is_user) = '1'
  AND $(check_of completion_is_last_turn) = '1'")
cut=$(sqlite3 $db "SELECT count(*) FROM samples WHERE reward_detail LIKE '%\"finished\"%'")
paid=$(sqlite3 $db "SELECT count(*) FROM samples WHERE reward_detail LIKE '%\"finished\"%' AND reward > 0")
[ "$paid" -eq 0 ] || fail "$paid of $cut cut-off samples were paid by the reward program"
n=$(sqlite3 $db "SELECT count(*) FROM samples")
[ "$n" -eq $((2 * B * G)) ] && [ "$good" -eq "$n" ] || fail "$good of $n requests carried the right ids, prompt and metadata"
echo "ok: $n requests carried the sample's prompt and completion ids, prompt text and metadata; $cut cut off, paid 0"

# ---- every built-in verifier in one run: a line of each, trained and scored (no program)
cat > mixed.jsonl <<'JL'
{"id": "m", "prompt": "What is 2 + 3?", "verifier": "math", "answer": "5", "split": "train"}
{"id": "c", "prompt": "Capital of Peru? A) Lima B) Quito", "verifier": "choice", "answer": "A", "split": "train"}
{"id": "k", "prompt": "Define inc(n) returning n + 1.", "verifier": "code", "asserts": ["assert inc(1) == 2"], "tests": [{"stdin": "", "stdout": ""}], "split": "train"}
{"id": "g", "prompt": "Write about rain.", "verifier": "constraints", "constraints": [{"type": "include", "word": "red"}], "split": "train"}
{"id": "a", "verifier": "agent", "env": {"items": [{"name": "pear", "stock": 9, "price": 4}], "goal": "price", "item": "pear"}, "split": "train"}
{"id": "e", "verifier": "agent", "env": {"seed": 5, "difficulty": 2}, "split": "eval"}
JL
$prl run job.json --set run.name=h --set task.path=mixed.jsonl --set controller.steps=2 \
  --set rollout.batch_prompts=5 --set task.eval_every=1 --set 'reward.program=[]' > h.out 2>&1 \
  || { cat h.out; fail "run h failed"; }
db=runs/h/run.db
for pair in m:answer c:answer k:format g:include a:end_state; do # a random policy: no code runs
  id=${pair%%:*} check=${pair#*:}
  got=$(sqlite3 $db "SELECT count(*) FROM samples, json_each(samples.reward_detail, '\$.checks') c
    WHERE prompt_id = '$id' AND json_extract(c.value, '\$.name') = '$check'")
  [ "$got" -eq $((2 * G)) ] || fail "prompt $id: $got samples with the check $check, not $((2 * G))"
done
evals=$(sqlite3 $db "SELECT count(*) FROM events WHERE kind = 'eval' AND json_extract(detail, '\$.by.agent.n') = 1")
[ "$evals" -eq 3 ] || fail "$evals evaluations of the agent eval line, not 3"
echo "ok: math, choice, code, constraints and agent lines scored by their verifiers in one run"
