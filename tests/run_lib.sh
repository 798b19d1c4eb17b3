# run_lib.sh — helpers of the `prl run` end-to-end scripts (test_pipeline.sh, test_opd_run.sh,
# test_recovery.sh, test_run_file.sh, test_gateway.sh, test_fault_matrix.sh, test_ranks.sh,
# test_multihost.sh), sourced after `prl` and `src` are set. run_setup makes the scratch
# directory the current one; the other helpers work in the directory that holds job.json and
# runs/. A failed check calls fail, which ends the script.
fail() { echo "FAIL: $*" >&2; exit 1; }

# run_setup NAME: a scratch directory /tmp/prl-NAME-XXXXXX as the current directory (kept
# with KEEP=1), PRL_THREADS=1, and on exit every `prl run` of $launchers (and $launcher)
# killed with its roles (kill -9; processes are found only among the children of this script's own
# launchers, never by a pattern that could match somebody else's run). A script may define
# run_cleanup_hook (called first on exit: unmount what it mounted...).
run_setup() {
  work=$(mktemp -d "/tmp/prl-$1-XXXXXX")
  launchers=""
  trap run_cleanup EXIT
  cd "$work"
  export PRL_THREADS=1
}
run_cleanup() {
  local l
  if declare -F run_cleanup_hook >/dev/null; then run_cleanup_hook || true; fi
  for l in $launchers ${launcher:-}; do pkill -9 -P "$l" 2>/dev/null || true; kill -9 "$l" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}

# start_run NAME ARGS...: `prl run ARGS...` in the background, its output in NAME.out and
# NAME.err; $launcher is its pid (added to $launchers).
start_run() {
  local name=$1
  shift
  $prl run "$@" > "$name.out" 2> "$name.err" &
  launcher=$!
  launchers="$launchers $launcher"
}

# role_pid LAUNCHER PATTERN: the launcher's child whose command line has PATTERN.
role_pid() { { pgrep -P "$1" -f -- "$2" || true; } | head -n 1; }

# model_config BASE OUT KEY=VALUE...: the model config BASE with the keys set (JSON values).
model_config() {
  python3 - "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split('=', 1)
    c[k] = json.loads(v)
json.dump(c, open(sys.argv[2], 'w'), indent=1)
PY
}

# small_model OUT VOCAB WIDTH: the tiny config (configs/models/tiny.json) cut to 2 layers of
# hidden size WIDTH (64 or 32) and 4 experts, with VOCAB tokens and 256 positions.
small_model() {
  local h=$3 r=$(($3 / 2)) d=$(($3 / 4))
  [ "$h" = 32 ] && d=8
  model_config "$src/configs/models/tiny.json" "$1" vocab_size="$2" hidden_size="$h" \
    num_hidden_layers=2 num_attention_heads=2 q_lora_rank=$r kv_lora_rank=$r qk_nope_head_dim=$d \
    qk_rope_head_dim=8 v_head_dim=$d intermediate_size=$((2 * h)) n_routed_experts=4 \
    moe_intermediate_size=$r max_position_embeddings=256
}

# length_program OUT: a reward program that pays by response length ((ids mod 5) / 4), so
# every group has different rewards and every update (every rank's share of it) a real gradient.
length_program() {
  cat > "$1" <<'PY'
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"score": (len(r["completion_ids"]) % 5) / 4}), flush=True)
PY
}

# expect_refused NAME WANT MODES ARGS...: for each mode of MODES ("check": `prl run --check`,
# "start": `prl run`), `prl run job.json --runs bad ARGS` fails with WANT in its output and
# makes no run directory.
expect_refused() {
  local name=$1 want=$2 modes=$3 mode flag out
  shift 3
  for mode in $modes; do
    flag=
    [ "$mode" = check ] && flag=--check
    if out=$($prl run job.json --runs bad $flag "$@" 2>&1); then fail "$name ($mode): accepted"; fi
    echo "$out" | grep -q -- "$want" || fail "$name ($mode): error '$out' lacks '$want'"
    [ ! -e bad ] || fail "$name ($mode): created a run directory"
  done
  echo "ok: refused ($modes): $name"
}

# steps_done RUN [RUNS]: the steps recorded in RUNS/RUN/run.db (RUNS: runs; 0 before it exists).
steps_done() { sqlite3 "${2:-runs}/$1/run.db" "SELECT count(*) FROM steps" 2>/dev/null || echo 0; }

# wait_steps RUN N [RUNS] [SECONDS]: wait until N steps are recorded (at most SECONDS, 60).
wait_steps() {
  local i
  for i in $(seq 1 $((${4:-60} * 10))); do
    [ "$(steps_done "$1" "${3:-runs}")" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "run $1 did not reach step $2"
}
