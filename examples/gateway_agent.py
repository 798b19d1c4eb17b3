#!/usr/bin/env python3
"""gateway_agent.py — an agent written outside prl, in Python with the standard library
only, that plays a run's episodes through prl's gateway (docs/gateway.md): math word problems
with a python tool, as examples/gateway_agent.mjs does with the openai npm client.

The model calls the tool as prl's SFT demonstrations do,
    <|tool_call|>python\\nprint(22 - 2)<|/tool_call|>
and this program is the tool: it evaluates the print(...) lines of arithmetic itself (an AST
walk over numbers and + - * / // % **; no other Python runs) and sends the output back as a
`tool` message, until the model answers without a call or the turns run out. Unlike the Node
agent it parses the program with python3's own parser, so a syntax error reads exactly as
prl's sandboxed python tool reports it. Each episode is ended for the job's verifier, or with
--own-reward judged here: reward 1 when the last number of the final answer equals the task's
`answer` (integer answers), else 0 — the harness-posted reward path.

usage: gateway_agent.py ADDR_OR_FILE [--groups N] [--turns T] [--own-reward]
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
import warnings
from concurrent.futures import ThreadPoolExecutor

warnings.simplefilter("ignore", SyntaxWarning)  # the model's programs: errors are reported, not warnings


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


if len(sys.argv) < 2:
    sys.exit("usage: gateway_agent.py ADDR_OR_FILE [--groups N] [--turns T] [--own-reward]")
where = sys.argv[1]
ADDR = where if where.startswith("http") else open(where).read().strip()
GROUPS, TURNS = arg("--groups", 8), arg("--turns", 4)
OWN_REWARD = "--own-reward" in sys.argv


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
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge}


def arithmetic(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = arithmetic(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Name):  # as python3 says it
        raise NameError(f"name '{node.id}' is not defined")
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        a, b = arithmetic(node.left), arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and abs(b) > 64:
            raise ValueError("exponent too large")
        return OPS[type(node.op)](a, b)
    if isinstance(node, ast.Compare) and all(type(op) in COMPARE for op in node.ops):
        left, result = arithmetic(node.left), True
        for op, right in zip(node.ops, map(arithmetic, node.comparators)):
            result, left = result and COMPARE[type(op)](left, right), right
        return result
    raise ValueError("only arithmetic on numbers runs here")


def run_python(body):
    """The observation prl's python tool would give for print(arithmetic) programs: the
    output, or "error: " and the last line python3 writes to stderr."""
    try:
        program = ast.parse(body)  # the interpreter's own parser: its own error messages
    except SyntaxError as e:
        return f"error: SyntaxError: {e.msg}"
    out = []
    for st in program.body:
        call = st.value if isinstance(st, ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "print"
                and not call.keywords):
            return "error: this tool runs print(arithmetic) lines only"
        try:
            out.append(" ".join(str(arithmetic(a)) for a in call.args))
        except (NameError, ValueError, ZeroDivisionError, OverflowError) as e:
            return f"error: {type(e).__name__}: {e}"
    return "\n".join(out).rstrip()[:200]


OPEN, CLOSE = "<|tool_call|>", "<|/tool_call|>"
NAME, VALUE = re.compile(r"[a-z_]*"), re.compile(r"[A-Za-z0-9_+*()-]*")


def call_error(call):
    """The syntax error of a call's text between the markers (prl's tasks.h grammar and its
    error texts, so the model reads what prl's own rollouts show it), or None."""
    name = NAME.match(call).group()
    if len(name) > 15:
        return "tool name longer than 15 characters"
    if not name:
        return "a tool call must start with a tool name [a-z_]"
    p = call[len(name):]
    if p.startswith("\n"):
        return None
    keys = []
    while p:
        if p[0] != " ":
            return f"expected ' ' before argument {len(keys) + 1}"
        p = p[1:]
        if len(keys) == 4:
            return "more than 4 arguments"
        key = NAME.match(p).group()
        if len(key) > 15:
            return "argument name longer than 15 characters"
        if not key:
            return f"argument {len(keys) + 1} has no name (expected key=value)"
        p = p[len(key):]
        if not p.startswith("="):
            return f"argument '{key}' needs '=value'"
        p = p[1:]
        value = VALUE.match(p).group()
        if len(value) > 63:
            return f"value of '{key}' longer than 63 characters"
        if not value:
            return f"argument '{key}' has an empty or invalid value"
        p = p[len(value):]
        if p and p[0] != " ":
            return f"invalid character '{p[0]}' in the value of '{key}'"
        if key in keys:
            return f"argument '{key}' given twice"
        keys.append(key)
    return None


def tool_call(text):
    """The reply's python call: ('ok', body), ('error', observation) or None."""
    i = text.find(OPEN)
    if i < 0:
        return ("error", f"error: {CLOSE} without {OPEN}") if CLOSE in text else None
    j = text.find(CLOSE, i + len(OPEN))
    if j < 0:
        return "error", f"error: no {CLOSE} after {OPEN}"
    after = text[j + len(CLOSE):]
    if OPEN in after:
        return "error", "error: more than one tool call in a turn"
    if after.strip(" \n\t\r"):
        return "error", f"error: text after {CLOSE}"
    inner = text[i + len(OPEN):j]
    why = call_error(inner)
    if why:
        return "error", f"error: {why}"
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
    if OWN_REWARD:
        call("POST", f"/v1/episodes/{episode}/reward", {"reward": reward(group["task"], text)})
    else:
        call("POST", f"/v1/episodes/{episode}/end", {})  # the job's verifier scores it


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
