#!/usr/bin/env python3
"""gateway_agent.py — an agent written outside prl, in Python with the standard library
only, that plays a run's episodes through prl's gateway (docs/gateway.md): math word problems
with a python tool, as examples/gateway_agent.mjs does with the openai npm client.

The model calls the tool as prl's SFT demonstrations do,
    <|tool_call|>python\\nprint(22 - 2)<|/tool_call|>
and this program is the tool: it evaluates the print(...) lines of arithmetic itself (an AST
walk over numbers and + - * / // % **; no other Python runs) and sends the output back as a
`tool` message, until the model answers without a call or the turns run out. Unlike the Node
agent it judges the episode itself: it posts reward 1 when the last number of the final
answer equals the task's `answer` (integer answers), else 0 — the harness-posted reward path.

usage: gateway_agent.py ADDR_OR_FILE [--groups N] [--turns T]
  ADDR_OR_FILE  http://HOST:PORT or a file holding it (runs/NAME/gateway.addr)
Runs until the gateway goes away (the run is done).
"""
import ast
import json
import operator
import re
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


if len(sys.argv) < 2:
    sys.exit("usage: gateway_agent.py ADDR_OR_FILE [--groups N] [--turns T]")
where = sys.argv[1]
ADDR = where if where.startswith("http") else open(where).read().strip()
GROUPS, TURNS = arg("--groups", 8), arg("--turns", 4)


def call(method, path, body=None):
    """(status, JSON) of one request; ConnectionError when the gateway is gone."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(ADDR + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
    except urllib.error.URLError as e:
        raise ConnectionError(str(e.reason)) from e


# ---- the tool
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
       ast.Pow: operator.pow}


def arithmetic(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = arithmetic(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        a, b = arithmetic(node.left), arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and abs(b) > 64:
            raise ValueError("exponent too large")
        return OPS[type(node.op)](a, b)
    raise ValueError("only arithmetic on numbers runs here")


def run_python(body):
    out = []
    for line in filter(None, (l.strip() for l in body.split("\n"))):
        try:
            tree = ast.parse(line, mode="eval").body
            if not (isinstance(tree, ast.Call) and getattr(tree.func, "id", "") == "print"
                    and len(tree.args) == 1 and not tree.keywords):
                return "error: this tool runs print(arithmetic) lines only"
            out.append(str(arithmetic(tree.args[0])))
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
            return f"error: {type(e).__name__}: {e}"
    return "\n".join(out)[:200]


def tool_call(text):
    """The reply's python call: ('ok', body), ('error', message) or None."""
    i = text.find("<|tool_call|>")
    if i < 0:
        return None
    j = text.find("<|/tool_call|>", i)
    if j < 0:
        return "error", "error: a tool call without <|/tool_call|>"
    inner = text[i + len("<|tool_call|>"):j]
    if not inner.startswith("python\n"):
        return "error", "error: the only tool is python"
    return "ok", inner[len("python\n"):]


def reward(task, answer_text):
    want = task.get("answer")
    nums = re.findall(r"-?\d+(?:\.\d+)?", answer_text.replace(",", ""))
    return 1.0 if isinstance(want, int) and nums and float(nums[-1]) == want else 0.0


# ---- playing
def play_episode(model, group, episode):
    messages = list(group["messages"])
    text = ""
    for turn in range(TURNS):
        st, r = call("POST", "/v1/chat/completions",
                     {"model": model, "messages": messages, "user": episode})
        if st != 200:
            raise RuntimeError(f"{episode}: {r['error']['message']}")
        choice = r["choices"][0]
        text = choice["message"]["content"]
        messages.append({"role": "assistant", "content": text})
        tc = tool_call(text)
        if tc is None or choice["finish_reason"] == "length" or turn + 1 == TURNS:
            break
        messages.append({"role": "tool", "content": tc[1] if tc[0] == "error" else run_python(tc[1])})
    call("POST", f"/v1/episodes/{episode}/reward", {"reward": reward(group["task"], text)})


played = 0
lock = threading.Lock()


def worker(model, pool):
    global played
    while True:
        try:
            st, g = call("POST", "/v1/groups", {"wait": 10})
        except ConnectionError:
            return  # the gateway stopped: the run is over
        if st != 200:
            continue
        try:
            list(pool.map(lambda ep: play_episode(model, g, ep), g["episodes"]))
        except ConnectionError:
            return
        except RuntimeError as e:
            print(f"group {g['id']}: {e}", file=sys.stderr)
        with lock:
            played += len(g["episodes"])


def main():
    st, models = call("GET", "/v1/models")
    model = models["data"][0]["id"]
    print(f"playing '{model}' at {ADDR}, {GROUPS} groups at once", flush=True)
    with ThreadPoolExecutor(GROUPS * 16) as pool:
        ws = [threading.Thread(target=worker, args=(model, pool)) for _ in range(GROUPS)]
        for w in ws:
            w.start()
        for w in ws:
            w.join()
    print(f"done: {played} episodes played")


main()
