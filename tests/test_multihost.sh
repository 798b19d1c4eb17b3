#!/usr/bin/env bash
# test_multihost.sh — a run over two hosts (docs/scale-out.md "Several hosts"), made of two
# network namespaces joined by a veth link (10.x addresses of their own):
#   host A  `prl run` with bus.bind on A's address: controller, trainer rank 0 (and sandbox);
#   host B  trainer rank 1 (trainer.ranks = 2, trainer.hosts = A:1,B:1: mpirun in A starts it
#           through tests/netns_rsh_agent.sh, Open MPI's TCP pinned to the veth subnet), and
#           rollout and reward workers that join over tcp:// with CURVE keys and fetch every
#           policy version over the bus into a cache of their own. B's processes run in a
#           mount namespace where A's folder is an empty tmpfs: no shared directory.
# Checked: the run ends bitwise identical to the same job run on one host by one trainer
# process (final model.safetensors sha256, every sample of run.db equal); rank 1 ran in B's
# namespaces (its pid's netns, A's folder empty in its mount view, its log line), and a kill -9
# of it ends the trainer, which the launcher starts again on both hosts; a rollout worker
# joins mid-run from B and another is killed -9 (nothing lost: every sample once); a worker
# whose key is not on the allow-list, and one that presents no CURVE key, are refused and
# logged; a capture on the veth holds the weights' bytes but no plaintext header ("type",
# "run", the safetensors header); a corrupted chunk in flight is fetched again.
# Needs root (ip netns, mount) and tcpdump: without them it FAILS, saying why (never a
# silent pass).
set -euo pipefail
prl=$(realpath "$1") src=$(realpath "$2")
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "test_multihost needs root (ip netns, veth, mount namespaces); run it as root"
command -v tcpdump >/dev/null || fail "test_multihost needs tcpdump (scripts/install-deps.sh installs it)"
command -v ip >/dev/null || fail "test_multihost needs ip (iproute2)"
command -v mpirun >/dev/null || fail "test_multihost needs mpirun (scripts/install-deps.sh installs openmpi-bin)"

tag=$$
nsa=prlA$tag nsb=prlB$tag va=pa$tag vb=pb$tag
net=$((tag % 200 + 20))
ipa=10.213.$net.1 ipb=10.213.$net.2 port=5599
work=$(mktemp -d /tmp/prl-multihost-XXXXXX)
A=$work/A B=$work/B
mkdir -p "$A" "$B"
pids=""
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  # what runs in this test's namespaces is this test's (mpirun's orted and ranks included)
  for ns in "$nsa" "$nsb"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  ip netns del "$nsa" 2>/dev/null || true
  ip netns del "$nsb" 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
export PRL_THREADS=1

# ---- the two hosts
ip netns add "$nsa"
ip netns add "$nsb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add "$ipa/24" dev "$va"
ip -n "$nsb" addr add "$ipb/24" dev "$vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up
echo "ok: hosts $nsa ($ipa) and $nsb ($ipb)"

# on_a CMD... / on_b CMD...: on host A; on host B with A's folder hidden (an empty tmpfs
# over it). Every step execs the next, so a background one's $! is the command's own pid.
on_a() { ip netns exec "$nsa" "$@"; }
on_b() {
  ip netns exec "$nsb" unshare -m --propagation private sh -c \
    'mount -t tmpfs none "$0" && cd "$1" && shift && exec "$@"' "$A" "$B" "$@"
}
bg_a() { (exec ip netns exec "$nsa" "$@") & }
bg_b() {
  (exec ip netns exec "$nsb" unshare -m --propagation private sh -c \
    'mount -t tmpfs none "$0" && cd "$1" && shift && exec "$@"' "$A" "$B" "$@") &
}

# ---- host A: a small policy and the job (the same set-up as test_pipeline.sh)
cd "$A"
. "$src/tests/run_lib.sh"
$prl tasks demos --domain general --n 300 --seed 1 --out demos.jsonl 2>/dev/null
$prl tokenizer train --data demos.jsonl --vocab 512 --out tok.json >/dev/null 2>&1
small_model small.json 512 64
$prl sft --data demos.jsonl --model small.json --tokenizer tok.json --out base --steps 200 \
  --batch 8 --seq 160 --optimizer adamw --lr 3e-3 --log-every 1000 >/dev/null 2>&1
# a reward program that pays by response length, so that every group, and so every rank's
# share of each update, has a real gradient; a copy on each host (B's reward worker runs it)
length_program length.py
cp length.py "$B/length.py"
cat > job.json <<'EOF'
{"run": {"name": "one", "seed": 7},
 "model": {"init": "base"},
 "task": {"domain": "general", "train_problems": 64},
 "reward": {"program": ["python3", "length.py"]},
 "rollout": {"batch_prompts": 2, "group_size": 8, "max_new_tokens": 48},
 "optim": {"lr": 1e-4},
 "controller": {"steps": 14, "heartbeat_seconds": 0.2, "lease_seconds": 2}}
EOF
STEPS=14 N=$((14 * 2 * 8))

# ---- the single-host run: the reference, on host A alone. Its rollout worker joins over
# loopback tcp:// (bus.bind without keys: PLAIN with the run's key), captured on lo: the
# control that the capture check below sees plaintext headers when there are some.
bg_a tcpdump -i lo -U -s 0 -w "$work/lo.pcap" tcp port 5598 2> "$work/tcpdump-lo.err"
tdlo=$!
pids="$pids $tdlo"
for _ in $(seq 1 50); do grep -q "listening" "$work/tcpdump-lo.err" 2>/dev/null && break; sleep 0.1; done
bg_a $prl run job.json --set bus.bind=tcp://127.0.0.1:5598 --set rollout.workers=0 \
  > one.out 2> one.err
one=$!
pids="$pids $one"
for _ in $(seq 1 100); do [ -e runs/one/bus.key ] && break; sleep 0.1; done
bg_a $prl role rollout --connect tcp://127.0.0.1:5598 --key runs/one/bus.key --name rollout-0 \
  > one-rollout.log 2>&1
pids="$pids $!"
wait $one || { cat one.err; fail "the single-host run"; }
kill -INT $tdlo; wait $tdlo 2>/dev/null || true
want=$(sha256sum runs/one/final/model.safetensors | cut -d' ' -f1)
grep -qaF '"type"' "$work/lo.pcap" || fail "control: the loopback capture shows no plaintext header"
echo "ok: single-host run: final $want (control: its loopback PLAIN capture shows \"type\")"

# ---- keys: one keypair per host; each side gets the other's public key only
$prl keys generate --out keys >/dev/null 2>&1
(cd "$B" && $prl keys generate --out keys >/dev/null 2>&1 && $prl keys generate --out stranger >/dev/null 2>&1)
cp keys/public.key "$B/controller.pub"
cp "$B/keys/public.key" authorized_keys
[ "$(stat -c %a keys/secret.key)" = 600 ] || fail "secret.key is not 0600"

# ---- the trainer's ranks on both hosts: mpirun (in A) reaches B through an rsh agent that
# runs orted in B's namespaces; Open MPI's out-of-band and byte transfer over the veth only
export OMPI_MCA_plm_rsh_agent=$src/tests/netns_rsh_agent.sh
export OMPI_MCA_oob_tcp_if_include=10.213.$net.0/24 OMPI_MCA_btl_tcp_if_include=10.213.$net.0/24
export OMPI_MCA_btl=self,tcp
export PRL_NETNS_HOSTS="$ipb=$nsb" PRL_NETNS_HIDE=$A PRL_NETNS_LOG=$work/agent.log
RANKS_SET=(--set trainer.ranks=2 --set "trainer.hosts=\"$ipa:1,$ipb:1\"")
# refused before anything starts: rank 0's host must be this one
on_a $prl run job.json --check --set run.name=check --set trainer.ranks=2 --set "trainer.hosts=\"$ipb:1,$ipa:1\"" \
  > "$work/check.out" 2>&1 && fail "trainer.hosts with B first was not refused"
grep -q "the first host, $ipb, is not this host" "$work/check.out" || { cat "$work/check.out"; fail "the refusal of B first"; }
echo "ok: refused: trainer.hosts with B first ($(tail -1 "$work/check.out" | cut -c1-80)...)"

# ---- the two-host run, with a capture on A's end of the link
bg_a tcpdump -i "$va" -U -s 0 -w "$work/veth.pcap" tcp port $port 2> "$work/tcpdump.err"
tdpid=$!
pids="$pids $tdpid"
for _ in $(seq 1 50); do grep -q "listening" "$work/tcpdump.err" 2>/dev/null && break; sleep 0.1; done
PRL_WEIGHTS_FAULT=corrupt:3,truncate:9 bg_a $prl run job.json --set run.name=two --set bus.bind=tcp://$ipa:$port \
  --set bus.allow_remote=true --set bus.keys=keys --set bus.authorized_keys=authorized_keys \
  --set rollout.workers=0 --set reward.workers=0 "${RANKS_SET[@]}" > two.out 2> two.err
launcher=$!
pids="$pids $launcher"
ctl_log=runs/two/logs/controller.log
for _ in $(seq 1 100); do grep -q "also listening" $ctl_log 2>/dev/null && break; sleep 0.1; done
grep -q "also listening at tcp://$ipa:$port (CURVE" $ctl_log || { cat two.err; fail "the controller does not listen at $ipa"; }

# B's workers (their folder B holds keys/, controller.pub and the cache; A's is hidden)
worker() { # role name [extra options]
  local role=$1 name=$2; shift 2
  bg_b $prl role "$role" --connect tcp://$ipa:$port --allow-remote --curve-keys keys \
    --server-key controller.pub --name "$name" "$@" > "$B/$name.log" 2>&1
  pids="$pids $!"
  last=$!
}
# refused, before any worker joins (the run waits; first, as the refusal lines are
# rate-limited): a raw ZMTP greeting with no mechanism (NULL); a key not on the allow-list;
# no CURVE key at all (PLAIN with a made-up secret)
ip netns exec "$nsb" timeout 3 bash -c 'exec 3<>/dev/tcp/$0/$1; printf "\xff\0\0\0\0\0\0\0\x01\x7f\x03\x00NULL" >&3;
  head -c 48 /dev/zero >&3; sleep 1' $ipa $port || true
on_b timeout 3 $prl role rollout --connect tcp://$ipa:$port --allow-remote --curve-keys stranger \
  --server-key controller.pub --name stranger --cache cache-s > "$B/stranger.log" 2>&1 || true
head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n' | head -c 64 > "$B/fake.key"; chmod 600 "$B/fake.key"
on_b timeout 3 $prl role rollout --connect tcp://$ipa:$port --allow-remote --key fake.key \
  --name nokey > "$B/nokey.log" 2>&1 || true
grep -q "is off loopback: it needs CURVE keys" "$B/nokey.log" || { cat "$B/nokey.log"; fail "a PLAIN worker off loopback was not refused by its own side"; }
# a peer with the wrong server key
on_b timeout 3 $prl role reward --connect tcp://$ipa:$port --allow-remote --curve-keys keys \
  --server-key keys/public.key --name wrongserver > "$B/wrongserver.log" 2>&1 || true

worker rollout rollout-b0 --cache cache; r0=$last
worker reward reward-b0

wait_steps() { # n: until the two-host run recorded n steps
  for _ in $(seq 1 900); do [ "$(steps_done two)" -ge "$1" ] && return 0; sleep 0.1; done
  fail "the two-host run did not reach step $1"
}
wait_steps 1
# rank 1 runs in B: its network namespace, and A's folder empty in its view of the files
rank1=""
is_rank() { [ "$(cat /proc/$1/comm 2>/dev/null)" = prl ] && grep -qa -- "--ranks" /proc/$1/cmdline; }
for p in $(ip netns pids "$nsb"); do
  if is_rank "$p"; then rank1="$rank1 $p"; fi
done
rank1=$(echo $rank1)
[ -n "$rank1" ] && [ "$(echo $rank1 | wc -w)" = 1 ] || fail "want one trainer rank in $nsb, found '$rank1'"
[ "$(ip netns identify "$rank1")" = "$nsb" ] || fail "trainer rank pid $rank1 is not in $nsb"
[ -z "$(ls -A "/proc/$rank1/root$A")" ] || fail "trainer rank pid $rank1 sees A's folder"
rank0=""
for p in $(ip netns pids "$nsa"); do
  if is_rank "$p"; then rank0="$rank0 $p"; fi
done
rank0=$(echo $rank0)
[ "$(echo $rank0 | wc -w)" = 1 ] || fail "want one trainer rank in $nsa, found '$rank0'"
echo "ok: trainer rank pid $rank1 runs in $nsb (A's folder empty there), rank 0 pid $rank0 in $nsa"
wait_steps 2
kill -9 "$rank1" # mpirun ends the group; the launcher starts the trainer (both ranks) again
echo "ok: killed trainer rank 1 (pid $rank1) on $nsb after $(steps_done two) steps"
wait_steps 3
worker rollout rollout-b1 --cache cache1 # joins mid-run from B
echo "ok: rollout-b1 joined from $nsb after $(steps_done two) steps"
wait_steps 5
[ "$(cat /proc/$r0/comm)" = prl ] || fail "pid $r0 is not rollout-b0's prl"
kill -9 "$r0"
echo "ok: killed rollout-b0 (pid $r0) on $nsb after $(steps_done two) steps"
wait $launcher || { cat two.err; tail -5 $ctl_log; fail "the two-host run"; }
got=$(sha256sum runs/two/final/model.safetensors | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "the two-host run ends at $got, the single-host run at $want"
echo "ok: two-host run (trainer ranks in $nsa and $nsb): final $got, bitwise the single-host one-rank run's"
grep -q "rank 1 of 2: waiting for rank 0's steps (host .*, pid $rank1)" runs/two/logs/trainer-0.log ||
  { cat runs/two/logs/trainer-0.log; fail "trainer-0.log has no line of rank 1 (pid $rank1)"; }
grep -q "^$ipb -> $nsb: .*orted" "$work/agent.log" || fail "mpirun did not start orted through the agent"
grep -q "trainer-0 died" two.err || { cat two.err; fail "the death of rank 1 was not seen"; }
[ "$(grep -c "rank 1 of 2: waiting for rank 0's steps" runs/two/logs/trainer-0.log)" -ge 2 ] ||
  fail "rank 1 was not started again after its kill -9"
[ "$(grep -c "orted" "$work/agent.log")" -ge 2 ] || fail "mpirun did not reach $nsb again"
echo "ok: rank 1 ran in $nsb (its log line names pid $rank1), was started there again after its kill -9"

# ---- nothing lost, nothing twice; the same samples as on one host
db=runs/two/run.db
[ "$(sqlite3 $db 'SELECT count(*) FROM samples')" = "$N" ] || fail "$(sqlite3 $db 'SELECT count(*) FROM samples') samples, want $N"
[ "$(sqlite3 $db 'SELECT count(DISTINCT step || "/" || prompt_id || "/" || sample_index) FROM samples')" = "$N" ] || fail "duplicate sample keys"
[ "$(sqlite3 $db 'SELECT max(version) FROM versions')" = "$STEPS" ] || fail "versions"
[ "$(sqlite3 $db 'SELECT status FROM runs')" = "done" ] || fail "status"
q="SELECT step, prompt_id, sample_index, hex(tokens), hex(logprobs), version, reward FROM samples ORDER BY 1, 2, 3"
[ "$(sqlite3 runs/one/run.db "$q" | sha256sum)" = "$(sqlite3 $db "$q" | sha256sum)" ] || fail "the runs hold different samples"
[ "$(sqlite3 $db "SELECT count(DISTINCT worker) FROM samples WHERE worker LIKE 'rollout-b%'")" = 2 ] ||
  fail "samples did not come from both rollout workers of B: $(sqlite3 $db 'SELECT DISTINCT worker FROM samples')"
[ "$(sqlite3 $db "SELECT count(*) FROM steps WHERE json_extract(metrics, '\$.trainer.grad_norm') > 0")" = "$STEPS" ] ||
  fail "a step without a gradient: the ranks had nothing to reduce"
echo "ok: run.db: $N samples once each, equal to the single-host run's; from rollout-b0 and rollout-b1"

# ---- weights came over the bus, a corrupted chunk was fetched again
grep -q "fetched policy version" "$B/rollout-b1.log" || fail "rollout-b1 fetched no version"
grep -q "PRL_WEIGHTS_FAULT: corrupted chunk 3" $ctl_log || fail "the fault was not injected"
grep -q "PRL_WEIGHTS_FAULT: truncated chunk 9" $ctl_log || fail "the truncation was not injected"
grep -q "corrupted (checksum): fetching it again" "$B"/rollout-b*.log || fail "the corrupted chunk was not noticed"
grep -q "truncated: fetching it again" "$B"/rollout-b*.log || fail "the truncated chunk was not noticed"
# only the worker killed mid-fetch may have left a temporary version (never a final one)
[ -z "$(find "$B" -name '*.tmp-*' ! -name "*.tmp-$r0")" ] || fail "a temporary version was left in a cache"
echo "ok: weights fetched over the bus into B's caches; the corrupted and the truncated chunk were fetched again"

# ---- refusals, logged by the controller
grep -q "CURVE key .* is not on the allow-list" $ctl_log || fail "the stranger's key was not refused"
grep -q "CURVE handshake failed: it does not hold this server's public key" $ctl_log || fail "a wrong server key was not refused"
grep -q "the peer did not present a key" $ctl_log || fail "a peer with no key was not refused"
stranger=$(cat "$B/stranger/public.key")
grep -qF "CURVE key $stranger is not on the allow-list" $ctl_log || fail "the refusal does not name the stranger's key"
echo "ok: refused and logged: a key not on the allow-list ($(grep -c 'not on the allow-list' $ctl_log) lines)"

# ---- the capture: traffic, all of it encrypted
kill -INT "$tdpid"
wait "$tdpid" 2>/dev/null || true
bytes=$(stat -c %s "$work/veth.pcap")
[ "$bytes" -gt 2000000 ] || fail "the capture holds $bytes bytes: less than the weights sent"
for s in '"type"' '"run"' '"policy_version"' '__metadata__' 'prl_checksum'; do
  ! grep -qaF "$s" "$work/veth.pcap" || fail "the capture holds plaintext: $s"
done
echo "ok: veth capture: $bytes bytes, no plaintext header (\"type\", \"run\", safetensors metadata)"
echo "PASS: test_multihost"
