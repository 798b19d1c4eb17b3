#!/usr/bin/env bash
# mismatch-study.sh — the train–rollout mismatch study of docs/mismatch-study.md: the Reasoning
# expert of configs/mismatch-study.json (bf16 rollout, fp32 training) trained once per mismatch
# treatment — no correction, TIS, IcePop, KPop, R2, R3, Masked R3 — with the same seed, then one
# table: held-out accuracy, mean |Δ log-prob|, masked fraction, routing overlap and stability.
#
# Each treatment is `prl run configs/mismatch-study.json --set run.name=ms-VARIANT --set ...`
# into runs/ms-VARIANT/; a finished run is reused, a stopped one resumed. The table is computed
# from each run's run.db (sqlite3 JSON queries, printed with --queries) and `prl eval`.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: scripts/mismatch-study.sh [--only V1,V2,...] [--table-only] [--queries] [--prl PATH]
                                 [--n N] [--set KEY=VALUE ...]

Runs the mismatch study's treatments (configs/mismatch-study.json) one after another, then
prints the results table (markdown) on stdout. Progress goes to stderr.

  --only LIST     treatments to run and tabulate (default: all, in this order)
                  none tis icepop kpop r2 r3 masked_r3 fp16 fp16_bf16
                  (fp16: fp16 training with an fp16 rollout, the FP16 paper's setting;
                  fp16_bf16: fp16 training with the study's bf16 rollout; both without
                  correction; they are not in the default list)
  --table-only    do not run anything; tabulate the runs that exist
  --queries       also print the sqlite3 queries behind each column
  --prl PATH      the prl binary (default build/cli/prl)
  --n N           held-out problems for the accuracy column (default 100, greedy, seed 1)
  --set K=V       extra config override for every treatment (repeatable)
EOF
}

prl=build/cli/prl
only="none tis icepop kpop r2 r3 masked_r3"
table_only=0
queries=0
n_eval=100
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="${2//,/ }"; shift 2 ;;
    --table-only) table_only=1; shift ;;
    --queries) queries=1; shift ;;
    --prl) prl="$2"; shift 2 ;;
    --n) n_eval="$2"; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "mismatch-study.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# The config overrides that make each treatment.
treatment_keys() {
  case "$1" in
    none) ;;
    tis) echo "grpo.correction.kind=tis" ;;
    icepop) echo "grpo.correction.kind=icepop" ;;
    kpop) echo "grpo.correction.kind=kpop" ;;
    r2) echo "replay.mode=r2" ;;
    r3) echo "replay.mode=r3" ;;
    masked_r3) echo "replay.mode=masked_r3" ;;
    fp16) printf '%s\n' "trainer.precision=fp16" "rollout.precision=fp16" ;;
    fp16_bf16) printf '%s\n' "trainer.precision=fp16" ;;
    *) echo "mismatch-study.sh: unknown treatment '$1' (see --help)" >&2; exit 2 ;;
  esac
}

run_treatment() {
  local v=$1 dir=runs/ms-$1 args=()
  local k
  for k in $(treatment_keys "$v"); do args+=(--set "$k"); done
  if [ -e "$dir/final/model.safetensors" ]; then
    echo "== $v: done before, reused ($dir)" >&2
    return
  fi
  local t0; t0=$(date +%s)
  if [ -e "$dir/job.json" ]; then
    echo "== $v: resuming $dir" >&2
    "$prl" run --resume "$dir" >&2
  else
    echo "== $v: prl run configs/mismatch-study.json --set run.name=ms-$v ${args[*]} ${extra[*]}" >&2
    "$prl" run configs/mismatch-study.json --set "run.name=ms-$v" "${args[@]}" "${extra[@]}" >&2
  fi
  echo "== $v: $(( $(date +%s) - t0 )) s" >&2
}

for v in $only; do treatment_keys "$v" >/dev/null; done
if [ "$table_only" = 0 ]; then
  for v in $only; do run_treatment "$v"; done
fi

# Column queries over steps.metrics (JSON). "trainer" is the trainer's own step record.
q_mismatch="select printf('%.4g', avg(json_extract(metrics,'\$.trainer.mismatch'))) from steps"
q_mismatch0="select printf('%.4g', json_extract(metrics,'\$.trainer.mismatch')) from steps where step = 0"
q_masked="select printf('%.4f', avg(json_extract(metrics,'\$.trainer.corr_masked_frac'))) from steps"
q_trunc="select printf('%.4f', avg(json_extract(metrics,'\$.trainer.tis_clipfrac'))) from steps"
q_overlap="select printf('%.4f', avg(j.value)) from steps, json_each(json_extract(metrics,'\$.trainer.route_overlap')) j"
q_used="select printf('%.4f', avg(j.value)) from steps, json_each(json_extract(metrics,'\$.trainer.route_overlap_used')) j"
q_gnorm="select printf('%.3f', max(json_extract(metrics,'\$.trainer.grad_norm_max'))) from steps"
q_reward="select printf('%.3f', avg(json_extract(metrics,'\$.trainer.reward_mean'))) from (select metrics from steps order by step desc limit 10)"

if [ "$queries" = 1 ]; then
  cat <<EOF
Queries (sqlite3 runs/ms-VARIANT/run.db "..."):
- mean |Δ log-prob|: $q_mismatch
- |Δ| at step 0:     $q_mismatch0
- masked fraction:   $q_masked
- TIS truncated:     $q_trunc
- routing overlap:   $q_overlap
- overlap used:      $q_used
- max grad norm:     $q_gnorm
- reward, last 10:   $q_reward
Held-out accuracy: $prl eval --ckpt runs/ms-VARIANT/final --domain reasoning --n $n_eval --json

EOF
fi

echo "| treatment | held-out acc (%) | mean \|Δ log-prob\| | mean \|Δ log-prob\|, step 0 | masked fraction | TIS truncated share | routing overlap (native) | routing overlap (used) | reward, last 10 steps | max grad norm |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for v in $only; do
  db=runs/ms-$v/run.db
  if [ ! -e "$db" ] || [ ! -e "runs/ms-$v/final/model.safetensors" ]; then
    echo "| $v | (not run) | | | | | | | | |"
    continue
  fi
  acc=$("$prl" eval --ckpt "runs/ms-$v/final" --domain reasoning --n "$n_eval" --json 2>/dev/null |
        sed -n 's/.*"accuracy": \([0-9.]*\).*/\1/p')
  acc=$(awk -v a="$acc" 'BEGIN { printf "%.1f", 100 * a }')
  echo "| $v | $acc | $(sqlite3 "$db" "$q_mismatch") | $(sqlite3 "$db" "$q_mismatch0") | $(sqlite3 "$db" "$q_masked") | $(sqlite3 "$db" "$q_trunc") |" \
       "$(sqlite3 "$db" "$q_overlap") | $(sqlite3 "$db" "$q_used") |" \
       "$(sqlite3 "$db" "$q_reward") | $(sqlite3 "$db" "$q_gnorm") |"
done
