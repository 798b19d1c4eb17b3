#!/usr/bin/env python3
"""gateway_bad.py — the bad-request half of tests/test_gateway.sh (Python standard library
only): requests a broken or hostile client sends get OpenAI-shaped errors, the gateway keeps
serving, and an episode whose client hangs up mid-stream keeps its turn.

  - invalid JSON, a non-object body, an unknown field: 400 with the error's four keys;
  - a 10 MB body (declared, and one that only grows past the bound while being sent): 413;
  - an unknown model: 404 model_not_found; an unknown path: 404; GET on completions: 405;
  - 16 slow clients (headers never finished, a body never sent) hold connections while a
    normal request is served; the gateway closes them after gateway.client_timeout;
  - a group claimed here: episode 0 streamed and the client gone after the first bytes, the
    turn is in the episode's record; both episodes then get their rewards.

usage: gateway_bad.py ADDR MODEL CLIENT_TIMEOUT OUT.json   (prints ok/FAIL lines, exits 1 on a FAIL)
"""
import json
import socket
import sys
import time
import urllib.error
import urllib.request

addr, model, client_timeout, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
host, port = addr.split("//")[1].rsplit(":", 1)
port = int(port)
failures = 0


def check(cond, what):
    global failures
    print(("ok: " if cond else "FAIL: ") + what)
    failures += not cond


def call(method, path, body=None, raw=None, headers=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(addr + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def openai_error(status, body, want_status, code=None, param=None):
    e = body.get("error") if isinstance(body, dict) else None
    return (status == want_status and isinstance(e, dict)
            and set(e) == {"message", "type", "param", "code"} and isinstance(e["message"], str)
            and (code is None or e["code"] == code) and (param is None or e["param"] == param))


chat = "/v1/chat/completions"
msgs = [{"role": "user", "content": "What is 1 + 1?"}]
st, b = call("POST", chat, raw=b'{"model": "%s", "messages": [' % model.encode())
check(openai_error(st, b, 400), f"invalid JSON: 400 ({b['error']['message']})")
st, b = call("POST", chat, raw=b"[1, 2]")
check(openai_error(st, b, 400), "a body that is not an object: 400")
st, b = call("POST", chat, {"model": model, "messages": msgs, "frobnicate": 1})
check(openai_error(st, b, 400, param="frobnicate"), "an unknown field: 400 naming it")
st, b = call("POST", chat, {"model": "gpt-4o", "messages": msgs})
check(openai_error(st, b, 404, code="model_not_found"), "an unknown model: 404 model_not_found")
st, b = call("POST", "/v1/embeddings", {"model": model})
check(openai_error(st, b, 404), "an unknown path: 404")
st, b = call("GET", chat)
check(openai_error(st, b, 405), "GET on completions: 405")

# ---- 10 MB bodies: declared (refused on the headers, before the body is sent) and streamed
# past the bound (read to its end and dropped, then refused)
def read_reply(s):
    reply = b""
    s.settimeout(10)
    try:
        while True:
            part = s.recv(65536)
            if not part:
                break
            reply += part
    except OSError:
        pass
    s.close()
    return reply


s = socket.create_connection((host, port))
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (10 << 20))
reply = read_reply(s)
body = reply.split(b"\r\n\r\n", 1)[-1]
check(reply.startswith(b"HTTP/1.1 413") and
      openai_error(413, json.loads(body or b"{}"), 413, code="request_too_large"),
      "a declared 10 MB body: 413 request_too_large before it is sent")
s = socket.create_connection((host, port))
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
try:
    for _ in range(12):  # 1 MiB chunks, no Content-Length: it only grows past the bound
        s.sendall(b"100000\r\n" + b"y" * 0x100000 + b"\r\n")
    s.sendall(b"0\r\n\r\n")
except OSError:
    pass
reply = read_reply(s)
check(reply.startswith(b"HTTP/1.1 413"), "a 12 MB chunked body growing past the bound: 413")

# ---- slow clients: connections that never finish their request
slow = []
for i in range(16):
    c = socket.create_connection((host, port))
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 else
              b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    slow.append(c)
t0 = time.time()
st, b = call("GET", "/v1/models")
check(st == 200 and time.time() - t0 < 5, "served while 16 slow clients hold connections")
time.sleep(client_timeout + 2)
closed = 0
for c in slow:
    c.settimeout(5)
    try:
        closed += c.recv(1) == b""  # the server closed it (nothing was ever answered)
    except OSError:
        closed += 1
    c.close()
check(closed == 16, f"slow clients closed after gateway.client_timeout ({closed} of 16)")

# ---- a client that hangs up mid-stream keeps its episode's turn
for _ in range(60):
    st, grp = call("POST", "/v1/groups", {"wait": 5})
    if st == 200:
        break
check(st == 200, f"claimed {grp.get('id')}")
ep0, ep1 = grp["episodes"]
s = socket.create_connection((host, port))
body = json.dumps({"model": model, "messages": grp["messages"], "stream": True, "user": ep0,
                   "max_tokens": 16}).encode()
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
s.settimeout(30)
first = s.recv(64)
s.close()
check(first.startswith(b"HTTP/1.1 200"), "a stream started")
rec = None
for _ in range(100):  # the turn is recorded when its generation ends
    st, rec = call("GET", f"/v1/episodes/{ep0}")
    if st == 200 and rec["turns_played"] == 1 and not rec.get("busy"):
        break
    time.sleep(0.1)
check(st == 200 and rec["turns_played"] == 1 and sum(rec["mask"]) > 0,
      f"{ep0}: the turn of a client gone mid-stream is recorded ({sum(rec['mask'])} ids)")
st, b = call("POST", f"/v1/episodes/{ep0}/reward", {"reward": 0.25})
check(st == 200, f"{ep0}: reward posted")
st, b = call("POST", chat, {"model": model, "messages": grp["messages"], "user": ep1,
                            "max_tokens": 8})
check(st == 200, f"{ep1}: played")
sampled = {ep0: [t for t, m in zip(rec["tokens"][rec["prompt_len"]:], rec["mask"]) if m],
           ep1: b["choices"][0]["token_ids"]}
st, b = call("POST", f"/v1/episodes/{ep1}/end", {})
check(st == 200, f"{ep1}: ended for the verifier")
st, b = call("GET", "/health")
check(st == 200 and b["status"] == "ok", f"the gateway is healthy: {b}")
where = {ep: {"prompt_id": grp["task"]["id"], "sample": int(ep.rsplit("-", 1)[1])}
         for ep in (ep0, ep1)}
json.dump({"sampled": sampled, "where": where, "harness": {ep0: 0.25, ep1: None}},
          open(out, "w"))
print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failed checks")
sys.exit(1 if failures else 0)
