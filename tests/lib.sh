# lib.sh — helpers of the shell tests (sourced): a scratch directory, counted checks and
# expected outcomes of a command. Sourcing sets `work` (a scratch directory, removed on exit)
# and `pass=0 fail=0`; the script ends with `summary`, whose status is the script's.
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

# expect_ok NAME CMD...: CMD exits 0; its stdout and stderr are left in $work/last.out.
expect_ok() {
  local name=$1; shift
  if "$@" >"$work/last.out" 2>&1; then ok "$name"; else bad "$name: $(tail -3 "$work/last.out")"; fi
}

# summary [NAME]: print the counts (after "NAME: "); fail if any check failed.
summary() {
  echo "${1:+$1: }$pass passed, $fail failed"
  [ $fail -eq 0 ]
}
