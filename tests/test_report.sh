#!/usr/bin/env bash
# test_report.sh — `prl report` (docs/report.md) on real runs, its page checked in headless
# Chromium (tests/js/report_check.mjs: puppeteer-core driving Debian's chromium):
#   - a short GRPO run (real processes, ZeroMQ, run.db; a tiny random policy, in-run evaluations
#     and a loss scaler on, stopped after 3 steps and resumed to 5) gets runs/NAME/report.html;
#     every plot is drawn with the run's number of steps (the eval plot with its number of
#     evaluations), no console error, no network request, the events table has the run's
#     events (the resume among them) and the sample browser the first sample's response tokens;
#     a screenshot goes to BUILD/report.png;
#   - a short OPD run (four teachers) is reported as one, with its teacher-KL curves
#     (BUILD/report-opd.png);
#   - an SFT run (the metrics.jsonl of prl sft --metrics, no run.db) gets its loss, lr, grad
#     norm, tokens/s and elapsed curves with one point per line (BUILD/report-sft.png);
#   - the checker itself fails on a page whose script throws and on one that lost a curve's
#     metric (so a broken page cannot pass);
#   - refusals change nothing on disk: an existing output (the page stays byte-identical), an
#     output in a missing folder, a folder that is no run, a negative --samples.
# Exit 77 (skipped) only when node is missing.
# usage: test_report.sh PRL SOURCE_DIR BUILD_DIR
set -uo pipefail # lib.sh's checks count failures; setup steps end the script with fail
prl=$(realpath "$1") src=$(realpath "$2") out_dir=$(realpath "$3")
js=$src/tests/js
if ! command -v node >/dev/null; then
  echo "SKIP: node is missing (scripts/install-npm.sh installs Debian's nodejs)"
  exit 77
fi
[ -d "$js/node_modules/puppeteer-core" ] ||
  { echo "FAIL: $js/node_modules lacks puppeteer-core: run scripts/install-npm.sh"; exit 1; }
[ -x /usr/bin/chromium ] || [ -n "${CHROMIUM:-}" ] ||
  { echo "FAIL: /usr/bin/chromium is missing: run scripts/install-deps.sh"; exit 1; }
. "$src/tests/lib.sh" # work, ok, bad, expect_fail, expect_ok, summary
. "$src/tests/run_lib.sh" # model_config (its fail ends the script)
cd "$work"
export PRL_THREADS=1

# ---- a short GRPO run on a tiny model
$prl tasks demos --domain reasoning --n 60 --seed 1 > demos.jsonl 2>/dev/null || fail "tasks demos"
$prl tokenizer train --data demos.jsonl --vocab 300 --out tok.json >/dev/null 2>&1 ||
  fail "tokenizer train"
model_config "$src/configs/models/tiny.json" small.json vocab_size=300 hidden_size=32 \
  num_hidden_layers=2 num_attention_heads=2 q_lora_rank=16 kv_lora_rank=16 qk_nope_head_dim=8 \
  qk_rope_head_dim=8 v_head_dim=8 intermediate_size=64 n_routed_experts=4 \
  moe_intermediate_size=16 max_position_embeddings=256 || fail "model config"
$prl init --model small.json --out base --tokenizer tok.json >/dev/null 2>&1 || fail "init"
cat > job.json <<'EOF'
{"run": {"name": "r", "seed": 3},
 "model": {"init": "base"},
 "task": {"domain": "reasoning", "train_problems": 40, "eval_every": 2, "eval_problems": 4},
 "rollout": {"batch_prompts": 2, "group_size": 4, "max_new_tokens": 16, "max_turns": 1},
 "trainer": {"loss_scale": {"enabled": "on"}},
 "controller": {"steps": 3, "heartbeat_seconds": 0.2, "lease_seconds": 5}}
EOF
$prl run job.json > run.out 2>&1 || { tail -20 run.out; fail "prl run failed"; }
# continued to 5 steps: a resume event in the table
$prl run --resume runs/r --set controller.steps=5 > resume.out 2>&1 ||
  { tail -20 resume.out; fail "prl run --resume failed"; }
[ "$(sqlite3 -readonly runs/r/run.db "SELECT count(*) FROM events WHERE kind = 'resume'")" -ge 1 ] ||
  fail "the resumed run has no resume event"
steps=$(sqlite3 -readonly runs/r/run.db "SELECT count(*) FROM steps")
evals=$(sqlite3 -readonly runs/r/run.db "SELECT count(*) FROM events WHERE kind = 'eval'")
events=$(sqlite3 -readonly runs/r/run.db "SELECT count(*) FROM events")
first_len=$(sqlite3 -readonly runs/r/run.db "SELECT n_tokens - prompt_len FROM samples
  WHERE step = 0 ORDER BY prompt_id, sample_index LIMIT 1")
[ "${steps:-0}" -eq 5 ] && [ "${evals:-0}" -ge 2 ] || fail "the run has $steps steps and $evals evaluations"
echo "run: $steps steps, $evals evaluations, $events events; first sample: $first_len tokens"

expect_ok "prl report runs/r writes runs/r/report.html" $prl report runs/r
[ -s runs/r/report.html ] && ok "report.html is there" || bad "no runs/r/report.html"
grep -q "Leon Sorokin" runs/r/report.html && ok "the page carries uPlot's licence" ||
  bad "uPlot's licence is not in the page"
grep -Eq '<(script|link)[^>]* (src|href)=' runs/r/report.html &&
  bad "the page loads an external resource" || ok "no external script or stylesheet"

# ---- refusals change nothing
sum=$(sha256sum runs/r/report.html)
expect_fail "an existing output is refused" "exists: choose a new path" $prl report runs/r
[ "$(sha256sum runs/r/report.html)" = "$sum" ] && ok "the existing page is unchanged" ||
  bad "the existing page was rewritten"
expect_fail "an output in a missing folder is refused" "the folder nowhere does not exist" \
  $prl report runs/r --out nowhere/r.html
[ ! -e nowhere ] && ok "no folder made" || bad "nowhere/ was made"
mkdir empty
expect_fail "a folder with no run is refused" "neither run.db" $prl report empty
[ -z "$(ls -A empty)" ] && ok "the folder stays empty" || bad "the refused report left $(ls -A empty)"
expect_fail "a negative --samples is refused" "--samples -1 must be >= 0" \
  $prl report runs/r --samples -1 --out r2.html
[ ! -e r2.html ] && ok "no page after a refusal" || bad "r2.html was written"
expect_fail "a missing run directory is refused" "is not a run directory" $prl report runs/none

# ---- the page in headless Chromium
rl_plots=(reward accuracy kl mismatch mismatch_kl pcc masked route_overlap route_entropy loss
          grad_norm loss_scale tokens_per_s stage_time groups)
args=()
for p in "${rl_plots[@]}"; do args+=(--plot "$p=$steps"); done
args+=(--plot "eval=$evals" --no-plot opd_kl --events "$events" --tokens "$first_len")
if node "$js/report_check.mjs" runs/r/report.html "$out_dir/report.png" "${args[@]}" > check.out 2>&1
then ok "GRPO page in Chromium: $(tail -1 check.out)"
else bad "GRPO page in Chromium:"; cat check.out; fi

# ---- the checker fails on a broken page
sed 's/^  build();$/  throw new Error("injected fault"); build();/' runs/r/report.html > throws.html
grep -q "injected fault" throws.html || fail "could not inject the fault"
if node "$js/report_check.mjs" throws.html throws.png --plot "reward=$steps" > throws.out 2>&1
then bad "the checker passed a page whose script throws"
else grep -q "exception: injected fault" throws.out && ok "the checker fails a page that throws" ||
  bad "the checker failed the throwing page for another reason: $(cat throws.out)"; fi
sed 's/"route_entropy":/"route_entropy_gone":/g' runs/r/report.html > lost.html
if node "$js/report_check.mjs" lost.html lost.png --plot "route_entropy=$steps" > lost.out 2>&1
then bad "the checker passed a page that lost the routing entropy"
else grep -q "FAIL plot route_entropy" lost.out && ok "the checker fails a page with a missing plot" ||
  bad "the checker failed the lost page for another reason: $(cat lost.out)"; fi

# ---- an OPD run: the student learns from four teachers (other draws of the tiny model)
seed=2
for d in reasoning general agent coding; do
  $prl init --model small.json --seed $seed --tokenizer tok.json --out "t_$d" >/dev/null 2>&1 ||
    fail "init teacher $d"
  seed=$((seed + 1))
done
cat > opd.json <<'EOF'
{"run": {"name": "o", "seed": 3},
 "model": {"init": "base"},
 "task": {"domain": "mixed", "train_problems": 16},
 "rollout": {"batch_prompts": 4, "group_size": 2, "max_new_tokens": 16, "max_turns": 2},
 "opd": {"enabled": true, "teachers": {"reasoning": "t_reasoning", "general": "t_general",
         "agent": "t_agent", "coding": "t_coding"}},
 "controller": {"steps": 3, "heartbeat_seconds": 0.2, "lease_seconds": 5}}
EOF
$prl run opd.json > opd.out 2>&1 || { tail -20 opd.out; fail "prl run (OPD) failed"; }
osteps=$(sqlite3 -readonly runs/o/run.db "SELECT count(*) FROM steps")
oevents=$(sqlite3 -readonly runs/o/run.db "SELECT count(*) FROM events")
expect_ok "prl report on an OPD run" $prl report runs/o
grep -q "opd run, $osteps steps" "$work/last.out" && ok "reported as an OPD run of $osteps steps" ||
  bad "the OPD run is reported as: $(cat "$work/last.out")"
args=()
for p in reward accuracy opd_kl mismatch pcc route_overlap route_entropy stage_time; do
  args+=(--plot "$p=$osteps")
done
args+=(--no-plot eval --no-plot loss_scale --events "$oevents")
if node "$js/report_check.mjs" runs/o/report.html "$out_dir/report-opd.png" "${args[@]}" > opd-check.out 2>&1
then ok "OPD page in Chromium: $(tail -1 opd-check.out)"
else bad "OPD page in Chromium:"; cat opd-check.out; fi

# ---- an SFT run: metrics.jsonl, no run.db
mkdir sft
$prl sft --data demos.jsonl --ckpt base --out sft/ckpt --steps 6 --batch 4 --seq 96 \
  --metrics sft/metrics.jsonl > sft.out 2>&1 || { tail -5 sft.out; fail "prl sft failed"; }
lines=$(wc -l < sft/metrics.jsonl)
expect_ok "prl report on an SFT run" $prl report sft --out sft.html
args=()
for p in loss lr grad_norm tokens_per_s elapsed; do args+=(--plot "$p=$lines"); done
args+=(--no-plot loss_scale) # fp32: no scaler, loss_scale 0 in every line
if node "$js/report_check.mjs" sft.html "$out_dir/report-sft.png" "${args[@]}" > sft-check.out 2>&1
then ok "SFT page in Chromium: $(tail -1 sft-check.out)"
else bad "SFT page in Chromium:"; cat sft-check.out; fi

summary report
