#!/usr/bin/env bash
# test_opd_run.sh — `prl run` of a short multi-teacher OPD job on a tiny model (docs/opd.md):
# real processes (controller, trainer, rollout, reward, sandbox and a pool of two teacher
# processes) over real ZeroMQ and a real run.db. The student is a random tiny model; the four
# teachers are other draws of the same config with the same tokenizer. Checked: bad teachers
# (a missing checkpoint, another vocabulary, another tokenizer) are refused by `prl run
# --check` and `prl run` before any process starts, naming the file, while a teacher of
# another architecture with the same tokenizer is accepted and distils (one step); the
# run finishes its steps with prompts of all four domains; every step's metrics hold the
# reverse KL, the masked share, per-teacher counts, load times and each teacher process's
# peak RSS; the progress line shows the KL; the teachers' logs show one expert at a time; a
# run with the top-k distillation term (opd.topk) carries the teachers' top-k to the trainer.
# The same run with both teacher processes killed (kill -9) mid-run is restarted by the
# launcher, their items are handed out again, and it ends with a bitwise-identical policy;
# so does the run killed whole (every process, kill -9) and continued with --resume. With
# opd.revisit, half of each step's prompts are drawn again by teacher KL, and a resumed run
# draws the same.
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
. "$src/tests/run_lib.sh" # run_setup, fail, small_model, start_run, wait_steps, role_pid, ...
run_setup opd

# ---- a tiny student and four teachers (same config and tokenizer, other seeds)
for d in reasoning general agent coding; do
  $prl tasks demos --domain $d --n 40 --seed 1 >> demos.jsonl 2>/dev/null
done
$prl tokenizer train --data demos.jsonl --vocab 400 --out tok.json >/dev/null 2>&1
$prl tokenizer train --data demos.jsonl --vocab 380 --out tok2.json >/dev/null 2>&1
small_model small.json 400 32
model_config small.json vocab512.json vocab_size=512
model_config small.json wide.json hidden_size=48
$prl init --model small.json --seed 1 --tokenizer tok.json --out student >/dev/null
seed=2
for d in reasoning general agent coding; do
  $prl init --model small.json --seed $seed --tokenizer tok.json --out "t_$d" >/dev/null
  seed=$((seed + 1))
done
$prl init --model vocab512.json --seed 9 --tokenizer tok.json --out t_vocab >/dev/null
$prl init --model wide.json --seed 9 --tokenizer tok.json --out t_wide >/dev/null
$prl init --model small.json --seed 9 --tokenizer tok2.json --out t_tok >/dev/null
cat > job.json <<'EOF'
{"run": {"name": "opd", "seed": 3},
 "model": {"init": "student"},
 "task": {"domain": "mixed", "train_problems": 16},
 "rollout": {"batch_prompts": 4, "group_size": 2, "max_new_tokens": 16, "max_turns": 2},
 "opd": {"enabled": true, "adv_clip": true, "adv_mask_eps": 0.01,
         "teachers": {"reasoning": "t_reasoning", "general": "t_general", "agent": "t_agent",
                      "coding": "t_coding"}},
 "teacher": {"workers": 2},
 "grpo": {"correction": {"kind": "tis"}},
 "optim": {"lr": 1e-3},
 "controller": {"steps": 8, "heartbeat_seconds": 0.2, "lease_seconds": 5}}
EOF

# ---- bad teachers: refused before any process starts, naming the file
both="check start"
expect_refused "missing teacher" "t_nowhere/config.json" "$both" --set opd.teachers.coding=t_nowhere
expect_refused "other vocabulary" "t_vocab/config.json has vocab_size 512" "$both" \
  --set opd.teachers.agent=t_vocab
expect_refused "other tokenizer" "t_tok/tokenizer.json and the student's (model.init student/tokenizer.json) differ first at token" "$both" \
  --set opd.teachers.reasoning=t_tok
cp -r t_coding t_flipped && python3 - t_flipped/model.safetensors <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[-50] ^= 1; open(sys.argv[1], "wb").write(b)
PY
expect_refused "a changed byte in a teacher" "key 'opd.teachers.coding': t_flipped/model.safetensors: checksum mismatch" \
  "$both" --set opd.teachers.coding=t_flipped
$prl run job.json --check --set opd.teachers.general=t_wide >/dev/null ||
  fail "a teacher of another width with the same tokenizer fails --check"
echo "ok: a teacher of another architecture (hidden_size 48) passes --check"
expect_refused "no teacher for a domain" "opd.teachers.coding" "$both" --set opd.teachers.coding='""'
$prl run job.json --check >/dev/null || fail "the good job fails --check"
echo "ok: the good job passes --check"

# ---- the run
finish() { # name: wait for the launcher, at most 60 s
  for _ in $(seq 1 600); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
  if kill -0 $launcher 2>/dev/null; then cat "$1.err"; fail "OPD run $1 did not finish in 60 s"; fi
  wait $launcher || { cat "$1.err"; tail -n 5 "runs/$1/logs/"*.log; fail "OPD run $1 failed"; }
  launcher=""
}
$prl run job.json > opd.out 2> opd.err &
launcher=$!
finish opd
db=runs/opd/run.db
grep -q "v8/8" opd.out || fail "no progress line for the last step"
grep -q "| KL " opd.out || fail "the progress line shows no KL"
[ "$(sqlite3 $db 'SELECT count(*) FROM steps')" = 8 ] || fail "steps recorded"
[ "$(sqlite3 $db 'SELECT count(DISTINCT domain) FROM prompts')" = 4 ] || fail "prompts of four domains"
for k in opd_teacher_kl opd_masked_frac opd_clipped_frac; do
  n=$(sqlite3 $db "SELECT count(*) FROM steps WHERE json_type(metrics, '\$.trainer.$k') = 'real'")
  [ "$n" = 8 ] || fail "metric trainer.$k in $n of 8 steps"
done
n=$(sqlite3 $db "SELECT count(*) FROM steps WHERE json_extract(metrics, '\$.teachers.peak_rss_kb') > 0")
[ "$n" = 8 ] || fail "teacher peak RSS in $n of 8 steps"
counts=$(sqlite3 $db "SELECT sum(value) FROM steps, json_each(json_extract(metrics, '\$.trainer.opd_teacher_samples'))")
[ "$counts" = 64 ] || fail "per-teacher sample counts add up to $counts, not 8 x 4 x 2"
sqlite3 $db "SELECT step, round(json_extract(metrics, '\$.trainer.opd_teacher_kl'), 4),
  json_extract(metrics, '\$.teachers') FROM steps ORDER BY step"
# one expert at a time: a teacher process never holds two (it frees one before the next)
for l in runs/opd/logs/teacher-*.log; do
  grep -q "holding expert" "$l" || fail "$l: no expert loaded"
done
[ "$(grep -h 'scored' runs/opd/logs/teacher-*.log | wc -l)" -ge 4 ] || fail "fewer than 4 teach items"
echo "ok: OPD run of 8 steps, 4 domains, 2 teacher processes"

# ---- a teacher of another architecture (wider) with the same tokenizer: one step runs
$prl run job.json --set run.name=wide --set controller.steps=1 --set opd.teachers.general=t_wide \
  > wide.out 2> wide.err &
launcher=$!
finish wide
grep -q "v1/1" wide.out || fail "the run with a wider teacher made no step"
echo "ok: one OPD step with a teacher of another width"

# ---- task.mix: the prompt set holds round(train_problems x share) of each domain; a domain
# with none needs no teacher
$prl run job.json --set run.name=mix --set controller.steps=1 --set task.mix.coding=2 \
  --set task.mix.general=0.5 --set task.mix.agent=0 --set opd.teachers.agent='""' > mix.out 2> mix.err &
launcher=$!
finish mix
per_domain=$(sqlite3 runs/mix/run.db "SELECT group_concat(domain || '=' || n, ' ') FROM
  (SELECT domain, count(*) AS n FROM prompts WHERE split = 'train' GROUP BY domain ORDER BY domain)")
[ "$per_domain" = "coding=32 general=8 reasoning=16" ] || fail "task.mix prompt counts: $per_domain"
echo "ok: task.mix: $per_domain"

# ---- the top-k distillation term at rollout temperature 0.7: the teachers send their top-k,
# the controller passes it to the trainer, and every step logs its mass and the top-1 match
$prl run job.json --set run.name=tk --set controller.steps=2 --set opd.topk=4 \
  --set rollout.temperature=0.7 > tk.out 2> tk.err &
launcher=$!
finish tk
n=$(sqlite3 runs/tk/run.db "SELECT count(*) FROM steps WHERE
  json_extract(metrics, '\$.trainer.opd_topk_mass') BETWEEN 0.01 AND 1.000001 AND
  json_type(metrics, '\$.trainer.opd_top1_match') = 'real'")
[ "$n" = 2 ] || fail "opd.topk: top-k mass and top-1 match in $n of 2 steps"
sqlite3 runs/tk/run.db "SELECT step, json_extract(metrics, '\$.trainer.opd_topk_mass'),
  json_extract(metrics, '\$.trainer.opd_top1_match') FROM steps ORDER BY step"
echo "ok: opd.topk 4 at temperature 0.7: 2 steps with the top-k term"

# ---- the same run with the teacher processes killed mid-run
$prl run job.json --set run.name=k > k.out 2> k.err &
launcher=$!
for _ in $(seq 1 600); do
  [ "$(steps_done k)" -ge 2 ] && break
  sleep 0.05
done
for t in teacher-0 teacher-1; do
  pid=$(pgrep -P "$launcher" -f -- "--name $t" | head -n 1)
  [ -n "$pid" ] || fail "no process for $t"
  kill -9 "$pid"
done
echo "killed both teachers after $(steps_done k) steps"
finish k
grep -q "teacher-0 died" k.err || fail "the launcher did not restart teacher-0"
[ "$(sqlite3 runs/k/run.db "SELECT count(*) FROM events WHERE kind = 'rejoin' AND detail LIKE '%teacher%'")" -ge 1 ] ||
  fail "no teacher rejoined"
[ "$(sha256sum < runs/opd/final/model.safetensors)" = "$(sha256sum < runs/k/final/model.safetensors)" ] ||
  fail "the run with killed teachers ends with another policy"
echo "ok: teachers killed mid-run: restarted, same final policy bitwise"

# ---- the whole run killed mid-run and resumed
kill_after_3_steps() { # name, --set args...: start the run, kill -9 every process after 3 steps
  local name=$1; shift
  $prl run job.json --set run.name=$name "$@" > $name.out 2> $name.err &
  launcher=$!
  for _ in $(seq 1 600); do
    [ "$(steps_done "$name")" -ge 3 ] && break
    sleep 0.02
  done
  pkill -9 -P "$launcher" || true
  kill -9 "$launcher"
  wait "$launcher" 2>/dev/null || true
  echo "killed run $name after $(steps_done "$name") steps"
}
kill_after_3_steps rs
$prl run --resume runs/rs --set teacher.threads=1 > rs.out 2> rs.err & # thread counts may change
launcher=$!
finish rs
[ "$(sha256sum < runs/opd/final/model.safetensors)" = "$(sha256sum < runs/rs/final/model.safetensors)" ] ||
  fail "the resumed run ends with another policy"
echo "ok: killed whole and resumed: same final policy bitwise"

# ---- opd.revisit: half of each step's prompts drawn again from the prompts already taught,
# by teacher KL (docs/opd.md "Revisits"); the KLs are recorded in run.db, so the run killed
# whole and resumed draws the same prompts and ends with the same policy bitwise
rv="--set opd.revisit=0.5 --set opd.revisit_power=2 --set controller.dynamic_sampling=false"
$prl run job.json --set run.name=rv $rv > rv.out 2> rv.err &
launcher=$!
finish rv
db=runs/rv/run.db
per_step=$(sqlite3 $db "SELECT group_concat(json_extract(metrics, '\$.revisits'), ' ') FROM
  (SELECT metrics FROM steps ORDER BY step)")
[ "$per_step" = "0 2 2 2 2 2 2 2" ] || fail "opd.revisit 0.5 of 4 prompts: revisits per step '$per_step'"
# step 0 has no KL to draw by; from step 1 every revisit is a prompt seen before, so the
# 8 steps x 4 groups hold 4 + 7 x 2 distinct prompts (the sequence's first epoch)
distinct=$(sqlite3 $db "SELECT count(DISTINCT prompt_id) FROM samples")
[ "$distinct" = 18 ] || fail "opd.revisit: $distinct distinct prompts in 32 groups, not 18"
bad=$(sqlite3 $db "SELECT count(*) FROM prompts WHERE teacher_kl < 0 OR (teacher_kl IS NULL AND
  prompt_id IN (SELECT prompt_id FROM samples))")
[ "$bad" = 0 ] || fail "opd.revisit: $bad taught prompts without a teacher KL >= 0"
sqlite3 $db "SELECT step, json_extract(metrics, '\$.revisits'), round(json_extract(metrics,
  '\$.revisit_kl'), 4), round(json_extract(metrics, '\$.prompts_kl'), 4) FROM steps ORDER BY step"
kill_after_3_steps rk $rv
$prl run --resume runs/rk > rk.out 2> rk.err &
launcher=$!
finish rk
[ "$(sha256sum < runs/rv/final/model.safetensors)" = "$(sha256sum < runs/rk/final/model.safetensors)" ] ||
  fail "opd.revisit: the resumed run ends with another policy"
echo "ok: opd.revisit: 2 of 4 prompts a step drawn again by teacher KL; resumed: same policy bitwise"
