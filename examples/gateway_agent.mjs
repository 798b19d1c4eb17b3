// gateway_agent.mjs — an agent written outside prl, on the official `openai` npm client, that
// plays a run's episodes through prl's gateway (docs/gateway.md): math word problems with a
// python tool. The model calls the tool as prl's SFT demonstrations do,
//   <|tool_call|>python\nprint(22 - 2)<|/tool_call|>
// and this program is the tool: it runs the print(...) lines of arithmetic itself (no other
// Python: anything else is an error observation) and sends the output back as a `tool`
// message, until the model answers without a call or the turns run out. Each episode is then
// ended for the job's verifier (the `math` verifier of the prompt file's lines) to score.
// Groups are claimed and played concurrently, the episodes of a group at once, so the
// gateway batches them.
//
// usage: node examples/gateway_agent.mjs ADDR_OR_FILE [--groups N] [--turns T]
//   ADDR_OR_FILE  http://HOST:PORT or a file holding it (runs/NAME/gateway.addr)
//   --groups N    groups played at once (default 8)
//   --turns T     model turns per episode (default 4)
// The `openai` package must be installed where node finds it (npm install openai), or
// PRL_OPENAI names its entry file. It runs until the gateway goes away (the run is done).
import fs from "node:fs";

const { default: OpenAI } = await import(process.env.PRL_OPENAI ?? "openai");
const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : dflt;
};
const where = args[0];
if (!where) {
  console.error("usage: node gateway_agent.mjs ADDR_OR_FILE [--groups N] [--turns T]");
  process.exit(2);
}
const addr = where.startsWith("http") ? where : fs.readFileSync(where, "utf8").trim();
const GROUPS = opt("--groups", 8), TURNS = opt("--turns", 4);
const client = new OpenAI({ baseURL: `${addr}/v1`, apiKey: "unused", maxRetries: 2 });

// ---- the tool: print(...) lines of integer/float arithmetic, evaluated as Python would
function pyNumber(x, float) {
  if (!Number.isFinite(x)) throw new Error("the result is not a finite number");
  return float ? (Number.isInteger(x) ? `${x}.0` : String(x)) : String(x);
}
function evaluate(src) { // + - * / // % ** and parentheses over numbers
  const toks = src.match(/\*\*|\/\/|\d+\.\d*|\.\d+|\d+|[-+*/%()]|\S/g) ?? [];
  let i = 0;
  const peek = () => toks[i], next = () => toks[i++];
  const num = (v, f) => ({ v, f });
  function atom() {
    const t = next();
    if (t === "(") {
      const v = expr();
      if (next() !== ")") throw new Error("SyntaxError: invalid syntax");
      return v;
    }
    if (t === "-") { const a = power(); return num(-a.v, a.f); }
    if (t === "+") return power();
    if (t !== undefined && /^[\d.]/.test(t)) return num(Number(t), t.includes("."));
    throw new Error("SyntaxError: invalid syntax");
  }
  function power() {
    const a = atom();
    if (peek() === "**") { next(); const b = unary(); return num(a.v ** b.v, a.f || b.f || b.v < 0); }
    return a;
  }
  function unary() { return power(); }
  function term() {
    let a = unary();
    while (["*", "/", "//", "%"].includes(peek())) {
      const op = next(), b = unary();
      if (op !== "*" && b.v === 0) throw new Error("ZeroDivisionError: division by zero");
      if (op === "*") a = num(a.v * b.v, a.f || b.f);
      else if (op === "/") a = num(a.v / b.v, true);
      else if (op === "//") a = num(Math.floor(a.v / b.v), a.f || b.f);
      else a = num(a.v - b.v * Math.floor(a.v / b.v), a.f || b.f);
    }
    return a;
  }
  function expr() {
    let a = term();
    while (peek() === "+" || peek() === "-") {
      const op = next(), b = term();
      a = num(op === "+" ? a.v + b.v : a.v - b.v, a.f || b.f);
    }
    return a;
  }
  const r = expr();
  if (i !== toks.length) throw new Error("SyntaxError: invalid syntax");
  return pyNumber(r.v, r.f);
}
function runPython(body) {
  const out = [];
  for (const line of body.split("\n").map((l) => l.trim()).filter(Boolean)) {
    const m = line.match(/^print\((.*)\)$/);
    if (!m) return "error: this tool runs print(arithmetic) lines only";
    try { out.push(evaluate(m[1])); } catch (e) { return `error: ${e.message}`; }
  }
  return out.join("\n").slice(0, 200);
}
// The turn's tool call, by the grammar of prl's tasks.h (and its error texts, so the model
// reads what prl's own rollouts show it): null for none, {body} for a python program,
// {error} for anything else.
const OPEN = "<|tool_call|>", CLOSE = "<|/tool_call|>";
const NAME = /^[a-z_]*/, VALUE = /^[A-Za-z0-9_+*()-]*/;
function callError(call) { // the syntax error of a call's text between the markers, or null
  const name = call.match(NAME)[0];
  if (name.length > 15) return "tool name longer than 15 characters";
  if (!name) return "a tool call must start with a tool name [a-z_]";
  let p = call.slice(name.length);
  if (p.startsWith("\n")) return null;
  const keys = [];
  while (p) {
    if (p[0] !== " ") return `expected ' ' before argument ${keys.length + 1}`;
    p = p.slice(1);
    if (keys.length === 4) return "more than 4 arguments";
    const key = p.match(NAME)[0];
    if (key.length > 15) return "argument name longer than 15 characters";
    if (!key) return `argument ${keys.length + 1} has no name (expected key=value)`;
    p = p.slice(key.length);
    if (p[0] !== "=") return `argument '${key}' needs '=value'`;
    p = p.slice(1);
    const value = p.match(VALUE)[0];
    if (value.length > 63) return `value of '${key}' longer than 63 characters`;
    if (!value) return `argument '${key}' has an empty or invalid value`;
    p = p.slice(value.length);
    if (p && p[0] !== " ") return `invalid character '${p[0]}' in the value of '${key}'`;
    if (keys.includes(key)) return `argument '${key}' given twice`;
    keys.push(key);
  }
  return null;
}
function toolCall(text) {
  const open = text.indexOf(OPEN);
  if (open < 0) return text.includes(CLOSE) ? { error: `error: ${CLOSE} without ${OPEN}` } : null;
  const close = text.indexOf(CLOSE, open + OPEN.length);
  if (close < 0) return { error: `error: no ${CLOSE} after ${OPEN}` };
  const after = text.slice(close + CLOSE.length);
  if (after.includes(OPEN)) return { error: "error: more than one tool call in a turn" };
  if (after.trim() !== "") return { error: `error: text after ${CLOSE}` };
  const call = text.slice(open + OPEN.length, close), why = callError(call);
  if (why) return { error: `error: ${why}` };
  if (!call.startsWith("python\n")) return { error: "error: the only tool is python" };
  return { body: call.slice(7) };
}

// ---- playing
async function post(path, body) {
  const r = await fetch(`${addr}${path}`, { method: "POST", body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}
async function playEpisode(model, group, episode) {
  const messages = [...group.messages];
  for (let turn = 0; turn < TURNS; turn++) {
    const r = await client.chat.completions.create({ model, messages, user: episode });
    const choice = r.choices[0], text = choice.message.content;
    messages.push({ role: "assistant", content: text });
    const call = toolCall(text);
    if (!call || choice.finish_reason === "length" || turn + 1 === TURNS) break;
    messages.push({ role: "tool", content: call.error ?? runPython(call.body) });
  }
  await post(`/v1/episodes/${episode}/end`, {}); // the job's verifier scores it
}
let played = 0, gone = false;
async function worker(model) {
  while (!gone) {
    let claim;
    try {
      claim = await post("/v1/groups", { wait: 10 });
    } catch {
      gone = true; // the gateway stopped: the run is over
      break;
    }
    if (claim.status !== 200) continue; // nothing to play yet (the step is training)
    const g = claim.body;
    try {
      await Promise.all(g.episodes.map((ep) => playEpisode(model, g, ep)));
      played += g.episodes.length;
    } catch (e) {
      if (e instanceof OpenAI.APIConnectionError) gone = true;
      else console.error(`group ${g.id}: ${e.message}`);
    }
  }
}
const model = (await client.models.list()).data[0].id;
console.log(`playing '${model}' at ${addr}, ${GROUPS} groups at once`);
const timer = setInterval(() => console.log(`${played} episodes played`), 30000);
await Promise.all(Array.from({ length: GROUPS }, () => worker(model)));
clearInterval(timer);
console.log(`done: ${played} episodes played`);
