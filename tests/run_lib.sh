# run_lib.sh — helpers of the `prl run` end-to-end scripts (test_pipeline.sh, test_opd_run.sh),
# sourced after `prl` is set, in the directory that holds job.json and runs/. A failed check
# calls fail, which ends the script.
fail() { echo "FAIL: $*" >&2; exit 1; }

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

# steps_done RUN: the steps recorded in runs/RUN/run.db (0 before it exists).
steps_done() { sqlite3 "runs/$1/run.db" "SELECT count(*) FROM steps" 2>/dev/null || echo 0; }
