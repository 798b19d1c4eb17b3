#!/usr/bin/env bash
# test_gateway.sh — the gateway end to end (docs/gateway.md): `prl run` with rollout.source =
# gateway on a tiny random policy (real processes, ZeroMQ, run.db), its episodes played by
# outside clients over HTTP:
#   - tests/gateway_bad.py (Python standard library): invalid JSON, 10 MB bodies, an unknown
#     model, slow clients, a client gone mid-stream — errors in OpenAI's shape, no crash, no
#     lost episode;
#   - tests/js/gateway.mjs (the official `openai` npm client): chat completion with logprobs,
#     n > 1, streaming, completions, error cases, each episode's record;
#   - then run.db: every one of the B·G samples stored once, its sampled ids (mask 1) and
#     log-probs exactly what the clients were given, its reward the posted one or the
#     verifier's; the gateway never restarted;
#   - the example agents (Node with `openai`, Python stdlib) each play a one-step run;
#   - `prl bench gateway` for 2 s (its CI smoke).
# Exit 77 (skipped) only when node is missing.
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
js=$src/tests/js
if ! command -v node >/dev/null; then
  echo "SKIP: node is missing (scripts/install-npm.sh installs Debian's nodejs)"
  exit 77
fi
if [ ! -d "$js/node_modules/openai" ]; then
  echo "FAIL: $js/node_modules/openai is not installed: run scripts/install-npm.sh"
  exit 1
fi
. "$src/tests/run_lib.sh" # run_setup, fail, small_model, start_run, wait_steps, role_pid, ...
run_setup gateway

python3 "$src/examples/make_math_prompts.py" --n 40 --seed 5 > prompts.jsonl
$prl tasks demos --domain reasoning --n 60 --seed 1 > demos.jsonl 2>/dev/null
$prl tokenizer train --data demos.jsonl --vocab 300 --out tok.json >/dev/null 2>&1
small_model small.json 300 32
$prl init --model small.json --out base --tokenizer tok.json >/dev/null
B=3 G=2 CLIENT_TIMEOUT=3
cat > job.json <<JOB
{"run": {"name": "gw", "seed": 3},
 "model": {"init": "base"},
 "task": {"source": "file", "path": "prompts.jsonl"},
 "rollout": {"batch_prompts": $B, "group_size": $G, "max_new_tokens": 16, "source": "gateway"},
 "gateway": {"bind": "127.0.0.1:0", "client_timeout": $CLIENT_TIMEOUT, "episode_timeout": 120},
 "controller": {"steps": 1, "heartbeat_seconds": 0.2, "lease_seconds": 5}}
JOB

# ---- a gateway that would serve beyond loopback is refused before any process starts
expect_refused "non-loopback bind" "gateway.allow_remote" "check start" \
  --set gateway.bind=\"0.0.0.0:8000\"
expect_refused "bad bind" "HOST:PORT" "check" --set gateway.bind=\"8000\"

$prl run job.json > run.out 2>&1 &
launcher=$!
for _ in $(seq 1 300); do [ -s runs/gw/gateway.addr ] && break; sleep 0.1; done
[ -s runs/gw/gateway.addr ] || { cat run.out; fail "no runs/gw/gateway.addr"; }
addr=$(cat runs/gw/gateway.addr)
gateway_pid=$(pgrep -P "$launcher" -f "prl role gateway")
echo "gateway at $addr (pid $gateway_pid)"

python3 "$src/tests/gateway_bad.py" "$addr" gw "$CLIENT_TIMEOUT" bad.json || fail "bad requests"
node "$js/gateway.mjs" "$addr" gw client.json || fail "the openai client"

for _ in $(seq 1 600); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
wait "$launcher" || { tail -20 run.out; fail "prl run exited $?"; }
launcher=""
echo "ok: the run finished"
[ "$(pgrep -f "prl role gateway" | grep -c "^$gateway_pid$" || true)" = 0 ] || fail "gateway still running"
grep -q "gateway-0" runs/gw/logs/gateway-0.log || fail "no gateway log"

# ---- run.db: every sample once, exactly as sampled, rewarded as posted or by the verifier
python3 - runs/gw/run.db bad.json client.json $((B * G)) <<'PY'
import json, sqlite3, struct, sys
db = sqlite3.connect(sys.argv[1])
want = {}
for f in sys.argv[2:4]:
    d = json.load(open(f))
    for ep, ids in d["sampled"].items():
        want[ep] = (d["where"][ep], ids, d["harness"][ep])
rows = db.execute("SELECT prompt_id, sample_index, tokens, prompt_len, loss_mask, reward, "
                  "reward_detail, worker, route_tokens, n_tokens FROM samples WHERE step = 0").fetchall()
n = int(sys.argv[4])
assert len(rows) == n and len({(r[0], r[1]) for r in rows}) == n, f"{len(rows)} samples, want {n} distinct"
print(f"ok: {n} samples in run.db, one per key")
by_key = {(r[0], r[1]): r for r in rows}
for ep, (w, ids, posted) in want.items():
    r = by_key[(w["prompt_id"], w["sample"])]
    toks = struct.unpack(f"<{len(r[2]) // 4}i", r[2])
    mask = r[4]
    got = [t for t, m in zip(toks[r[3]:], mask) if m]
    assert got == ids, f"{ep}: run.db sampled {got}, the client got {ids}"
    assert r[7] == "gateway-0" and r[8] == r[9] - 1, f"{ep}: worker {r[7]}, {r[8]} route rows"
    detail = json.loads(r[6])
    if posted is None:
        assert detail.get("source") != "harness", f"{ep}: {detail} should be the verifier's"
    else:
        assert detail.get("source") == "harness" and abs(r[5] - posted) < 1e-9, f"{ep}: {detail}"
    print(f"ok: {ep}: run.db holds the {len(ids)} sampled ids, reward {r[5]} "
          f"({'harness' if posted is not None else 'verifier'})")
rejoins = db.execute("SELECT count(*) FROM events WHERE kind = 'rejoin' AND detail LIKE '%gateway%'").fetchone()[0]
assert rejoins == 0, f"the gateway restarted {rejoins} times"
print("ok: the gateway never restarted")
PY
# ---- the example agents (examples/gateway_agent.mjs and .py) play a one-step run to its end
for agent in mjs py; do
  name=ex-$agent
  $prl run job.json --set run.name=$name --set rollout.batch_prompts=2 > $name.out 2>&1 &
  launcher=$!
  for _ in $(seq 1 300); do [ -s runs/$name/gateway.addr ] && break; sleep 0.1; done
  if [ $agent = mjs ]; then
    PRL_OPENAI=$js/node_modules/openai/index.mjs timeout 120 node "$src/examples/gateway_agent.mjs" \
      runs/$name/gateway.addr --groups 2 > agent-$agent.out 2>&1 || fail "$agent agent: $(tail -3 agent-$agent.out)"
  else
    timeout 120 python3 "$src/examples/gateway_agent.py" runs/$name/gateway.addr --groups 2 \
      --own-reward > agent-$agent.out 2>&1 || fail "$agent agent: $(tail -3 agent-$agent.out)"
  fi
  wait "$launcher" || fail "prl run ($name) exited $?"
  launcher=""
  n=$(sqlite3 runs/$name/run.db "SELECT count(*) FROM samples WHERE worker = 'gateway-0'")
  [ "$n" = $((2 * G)) ] || fail "$agent agent: $n samples in run.db, want $((2 * G))"
  echo "ok: the $agent example agent played $name to its end ($(tail -1 agent-$agent.out))"
done

# ---- the load bench's smoke: 8 clients for 2 s against the checkpoint alone
out=$($prl bench gateway --ckpt base --clients 8 --seconds 2 --max-tokens 8 2>/dev/null) ||
  fail "prl bench gateway: $out"
echo "$out" | grep -q " 0 errors" || fail "prl bench gateway: $out"
echo "ok: prl bench gateway: $(echo "$out" | sed -n 2p)"
echo "PASS: the gateway"
