#!/usr/bin/env bash
# test_ranks.sh — the data-parallel trainer (trainer.ranks, docs/scale-out.md "Trainer ranks"):
# one short sync job run with trainer.ranks = 1, 2 and 4 (mpirun, oversubscribed on this
# machine) must end with byte-identical final policies and identical step metrics. Its
# update has 6 micro-batches, so 4 ranks get unequal shares ([0,1) [1,3) [3,4) [4,6)) and
# the fixed tree is what makes the sum the same. Then a non-zero rank is killed with -9 mid-run
# (mpirun ends the group, the launcher starts the trainer again, the step is handed out
# again), and a run whose rank and every other process are killed is finished with
# `prl run --resume`: both end bitwise equal to the undisturbed run. Also: the launcher is
# srun under SLURM, and a missing launcher program is refused before anything starts, as are
# bad trainer.hosts / trainer.hostfile placements; runs r2 and r4 place their ranks with them.
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (scripts/install-deps.sh installs openmpi-bin)"; exit 1; }
work=$(mktemp -d /tmp/prl-ranks-XXXXXX)
launchers=""
cleanup() {
  for l in $launchers; do
    for c in $(pgrep -P "$l" 2>/dev/null); do pkill -9 -P "$c" 2>/dev/null || true; done
    pkill -9 -P "$l" 2>/dev/null || true; kill -9 "$l" 2>/dev/null || true
  done
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
. "$src/tests/run_lib.sh" # fail, small_model, length_program, expect_refused, steps_done
export PRL_THREADS=1

# ---- a small policy; a reward program that pays by response length, so every group has
# different rewards and every update has a real gradient
$prl tasks demos --domain general --n 300 --seed 1 --out demos.jsonl 2>/dev/null
$prl tokenizer train --data demos.jsonl --vocab 512 --out tok.json >/dev/null 2>&1
small_model small.json 512 64
$prl sft --data demos.jsonl --model small.json --tokenizer tok.json --out base --steps 60 \
  --batch 8 --seq 160 --optimizer adamw --lr 3e-3 --log-every 1000 >/dev/null 2>&1
length_program length.py
cat > job.json <<'EOF2'
{"run": {"name": "r1", "seed": 7},
 "model": {"init": "base"},
 "task": {"domain": "general", "train_problems": 64},
 "rollout": {"batch_prompts": 3, "group_size": 4, "max_new_tokens": 40},
 "reward": {"program": ["python3", "length.py"]},
 "optim": {"lr": 1e-3},
 "trainer": {"micro_rows": 2},
 "controller": {"steps": 6, "heartbeat_seconds": 0.2, "lease_seconds": 3}}
EOF2

# ---- refused before anything starts: srun under SLURM (not installed here), no mpirun
SLURM_JOB_ID=1 expect_refused "srun under SLURM" "trainer.ranks = 2 needs srun on PATH" "check start" \
  --set trainer.ranks=2
mkdir nompi && ln -s "$(command -v grep)" nompi/grep # a PATH without mpirun
PATH=$PWD/nompi expect_refused "no mpirun" "trainer.ranks = 2 needs mpirun on PATH" check \
  --set trainer.ranks=2 --set trainer.launcher='"mpirun"'
# trainer.hosts / trainer.hostfile (mpirun's placement): rank 0's host must be this one, a
# hostfile must exist and name a host, srun places ranks itself, every rank needs a slot
expect_refused "rank 0 elsewhere" "the first host, elsewhere.invalid, is not this host" check \
  --set trainer.ranks=2 --set trainer.hosts='"elsewhere.invalid:1,localhost:1"'
expect_refused "no hostfile" "trainer.hostfile nohosts: No such file" check \
  --set trainer.ranks=2 --set trainer.hostfile='"nohosts"'
printf '# only comments\n\n' > empty.hosts
expect_refused "empty hostfile" "trainer.hostfile empty.hosts names no host" check \
  --set trainer.ranks=2 --set trainer.hostfile='"empty.hosts"'
printf '  # rank 0 first\nelsewhere.invalid slots=2\n' > far.hosts
expect_refused "hostfile, rank 0 elsewhere" "trainer.hostfile: the first host, elsewhere.invalid" check \
  --set trainer.ranks=2 --set trainer.hostfile='"far.hosts"'
mkdir -p slurm && ln -sf "$(type -P true)" slurm/srun # an srun that is never run
PATH=$PWD/slurm:$PATH SLURM_JOB_ID=1 expect_refused "trainer.hosts under srun" \
  "trainer.hosts is mpirun's placement; under srun SLURM places the ranks" check \
  --set trainer.ranks=2 --set trainer.hosts='"localhost:2"'
expect_refused "too few slots" "gives 3 slots for trainer.ranks = 4" "check start" \
  --set trainer.ranks=4 --set trainer.hosts='"localhost:2,localhost:1"'
printf '# this host\nlocalhost slots=2\n' > local.hosts

metrics() { # run: the step metrics that do not depend on timing
  sqlite3 "runs/$1/run.db" "SELECT step, json_extract(metrics, '\$.trainer.loss'),
    json_extract(metrics, '\$.trainer.grad_norm'), json_extract(metrics, '\$.trainer.clipfrac'),
    json_extract(metrics, '\$.trainer.updates') FROM steps ORDER BY step"
}

# ---- 1, 2, 4 ranks: the same bytes
for R in 1 2 4; do
  t0=$(date +%s.%N)
  # the placement keys reach mpirun: 2 ranks from a hostfile, 4 from a --host list
  place=()
  [ $R = 2 ] && place=(--set trainer.hostfile='"local.hosts"')
  [ $R = 4 ] && place=(--set trainer.hosts='"localhost:4"')
  $prl run job.json --set run.name=\"r$R\" --set trainer.ranks=$R "${place[@]}" > r$R.out 2> r$R.err ||
    { cat r$R.err; cat runs/r$R/logs/trainer-0.log; fail "run r$R"; }
  [ "$(steps_done r$R)" = 6 ] || fail "run r$R: $(steps_done r$R) steps"
  echo "ok: run r$R: trainer.ranks = $R, 6 steps in $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-4) s"
done
grep -q "rank 3 of 4: waiting for rank 0's steps" runs/r4/logs/trainer-0.log || fail "run r4 had no rank 3"
[ "$(metrics r1 | awk -F'|' '$3 > 0' | wc -l)" = 6 ] || fail "run r1: a step without a gradient: $(metrics r1)"
for R in 2 4; do
  cmp runs/r1/final/model.safetensors runs/r$R/final/model.safetensors ||
    fail "trainer.ranks = $R: the final policy differs from one rank's"
  [ "$(metrics r1)" = "$(metrics r$R)" ] || fail "trainer.ranks = $R: step metrics differ: $(metrics r$R)"
done
echo "ok: trainer.ranks 1, 2, 4: byte-identical final policies and step metrics ($(sha256sum runs/r1/final/model.safetensors | cut -c1-16))"

rank_pid() { # launcher pid, rank: the pid of that rank of the launcher's mpirun
  local mpirun p
  mpirun=$(pgrep -P "$1" -f -- "^mpirun " | head -n 1 || true)
  [ -n "$mpirun" ] || return 0
  for p in $(pgrep -P "$mpirun" || true); do # a rank may have just ended: no environ then
    if { tr '\0' '\n' < /proc/$p/environ; } 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return 0
    fi
  done
}
wait_steps() { # run, n
  for _ in $(seq 1 600); do [ "$(steps_done "$1")" -ge "$2" ] && return 0; sleep 0.05; done
  fail "run $1 did not reach step $2"
}
kill_rank() { # run, launcher, rank
  local pid=""
  for _ in $(seq 1 100); do pid=$(rank_pid "$2" "$3"); [ -n "$pid" ] && break; sleep 0.05; done
  [ -n "$pid" ] || fail "run $1: no rank $3"
  kill -9 "$pid"
  echo "killed rank $3 of run $1 (pid $pid) after $(steps_done "$1") steps"
}

# ---- kill -9 of rank 1 mid-run: the trainer fails, is started again, the run ends the same
$prl run job.json --set run.name='"k"' --set trainer.ranks=2 > k.out 2> k.err &
launcher=$!
launchers="$launchers $launcher"
wait_steps k 2
kill_rank k "$launcher" 1
wait $launcher || { cat k.err; fail "run k"; }
grep -q "trainer-0 died" k.err || { cat k.err; fail "run k: the trainer's failure was not seen"; }
cmp runs/r1/final/model.safetensors runs/k/final/model.safetensors ||
  fail "run k (rank 1 killed): the final policy differs"
echo "ok: run k: rank 1 killed with -9 mid-run: the trainer was restarted, the final policy is the same"

# ---- rank 1 and then every process killed, then --resume
$prl run job.json --set run.name='"c"' --set trainer.ranks=2 > c.out 2> c.err &
launcher=$!
launchers="$launchers $launcher"
wait_steps c 3
kill_rank c "$launcher" 1
for p in $(pgrep -P "$launcher"); do pkill -9 -P "$p" 2>/dev/null || true; done
pkill -9 -P "$launcher" || true
kill -9 "$launcher" 2>/dev/null || true
wait "$launcher" 2>/dev/null || true
echo "killed every process of run c after $(steps_done c) steps"
$prl run --resume runs/c > c2.out 2> c2.err || { cat c2.err; fail "resume c"; }
[ "$(steps_done c)" = 6 ] || fail "run c: $(steps_done c) steps after --resume"
cmp runs/r1/final/model.safetensors runs/c/final/model.safetensors ||
  fail "run c (killed, resumed): the final policy differs"
echo "ok: run c: rank 1 and every process killed after step 3, --resume ends with the same final policy"
