// gateway.mjs — the client half of tests/test_gateway.sh: the official `openai` npm client
// plays a run's episodes through prl's gateway (docs/gateway.md) and checks what it gets:
//   - GET /v1/models lists the run's model;
//   - a group claimed (POST /v1/groups) and both its episodes played in one chat completion
//     with n = 2 and logprobs (top_logprobs 2): one log-prob entry per sampled id, each <= 0,
//     the sampled one among or below the top two;
//   - a second turn of episode 0 streamed (SSE), naming the episode in X-Episode-Id;
//   - a completions request (the legacy API) in a second group's episodes, the second turn
//     continuing the first's text;
//   - errors in OpenAI's shape, through the client's error classes: an unknown model (404
//     model_not_found), a bad value (400 naming the param), n > 1 on an episode, a history
//     that differs from the record (400 episode_history_mismatch), a turn of an ended
//     episode (409), no episode id (400 missing_episode_id);
//   - each episode's record (GET /v1/episodes/ID) holds exactly the ids the replies gave,
//     mask 1 on them, with their log-probs; rewards are posted for some episodes and left to
//     the verifier for the others.
// The ids every episode sampled are written to OUT.json; the shell compares them with run.db.
//
// usage: node gateway.mjs ADDR MODEL OUT.json
import fs from "node:fs";
import OpenAI from "openai";

const [addr, model, out] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${addr}/v1`, apiKey: "unused", maxRetries: 0 });
let failures = 0;
function check(cond, what) {
  if (cond) console.log(`ok: ${what}`);
  else {
    console.log(`FAIL: ${what}`);
    failures++;
  }
}
async function post(path, body) {
  const r = await fetch(`${addr}${path}`, { method: "POST", body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}
async function claim() {
  for (let i = 0; i < 60; i++) {
    const r = await post("/v1/groups", { wait: 5 });
    if (r.status === 200) return r.body;
  }
  throw new Error("no group to claim within 5 minutes");
}
async function record(id) {
  return (await fetch(`${addr}/v1/episodes/${id}`)).json();
}
async function expectError(what, status, code, param, call) {
  try {
    await call();
    check(false, `${what}: refused`);
  } catch (e) {
    const ok = e instanceof OpenAI.APIError && e.status === status &&
      (code === null || e.code === code) && (param === null || e.param === param) &&
      typeof e.message === "string" && e.error && e.error.type;
    check(ok, `${what}: ${status} ${code ?? ""} ${param ?? ""} (got ${e.status} ${e.code} ${e.param}: ${e.message})`);
  }
}
const sampled = {}; // episode -> the ids its turns sampled, in order
const where = {}; // episode -> {prompt_id, sample}: its row in run.db
function claimed(g) {
  for (const ep of g.episodes) where[ep] = { prompt_id: g.task.id, sample: +ep.split("-").pop() };
}
const logprobs = {};
function took(ep, ids, lps) {
  (sampled[ep] ??= []).push(...ids);
  (logprobs[ep] ??= []).push(...lps);
}
// The record's sampled ids (mask 1) and their log-probs equal what the replies gave.
async function checkRecord(ep) {
  const r = await record(ep);
  const ids = [], lps = [];
  r.mask.forEach((m, i) => {
    if (m) ids.push(r.tokens[r.prompt_len + i]), lps.push(r.logprobs[i]);
  });
  check(JSON.stringify(ids) === JSON.stringify(sampled[ep]),
    `${ep}: the record's sampled ids are the replies' (${ids.length} ids)`);
  check(lps.every((x, i) => Math.abs(x - logprobs[ep][i]) < 1e-6),
    `${ep}: the record's log-probs are the replies'`);
  return r;
}

// ---- the model list
const models = await client.models.list();
check(models.data.some((m) => m.id === model), `GET /v1/models lists '${model}'`);

// ---- group 1: both episodes at once (n = 2), logprobs; then a streamed second turn
const g1 = await claim();
claimed(g1);
check(g1.episodes.length === 2 && Array.isArray(g1.messages), `claimed ${g1.id} of 2 episodes`);
const c1 = await client.chat.completions.create({
  model, messages: g1.messages, n: 2, logprobs: true, top_logprobs: 2, max_tokens: 12, user: g1.id,
});
check(c1.choices.length === 2, "n = 2: two choices");
for (const ch of c1.choices) {
  const lp = ch.logprobs.content;
  check(lp.length === ch.token_ids.length && lp.length > 0,
    `choice ${ch.index}: one log-prob per sampled id (${lp.length})`);
  check(lp.every((t) => t.logprob <= 0 && t.top_logprobs.length === 2 &&
    t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.logprob <= t.top_logprobs[0].logprob + 1e-6),
  `choice ${ch.index}: log-probs <= 0, top 2 in order, none above the best`);
  check(typeof ch.episode_id === "string", `choice ${ch.index} plays episode ${ch.episode_id}`);
  took(ch.episode_id, ch.token_ids, lp.map((t) => t.logprob));
}
const [e0, e1] = c1.choices.map((c) => c.episode_id);
check(e0 !== e1, "the two choices are two episodes");
check(c1.usage.completion_tokens === c1.choices.reduce((s, c) => s + c.token_ids.length, 0),
  "usage counts the sampled ids");

const history = [...g1.messages, { role: "assistant", content: c1.choices[0].message.content },
  { role: "user", content: "Check it once more." }];
const stream = await client.chat.completions.create(
  { model, messages: history, stream: true, logprobs: true, max_tokens: 10,
    stream_options: { include_usage: true } },
  { headers: { "X-Episode-Id": e0 } });
let text = "", ids = [], lps = [], finish = null, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    text += ch.delta?.content ?? "";
    ids.push(...(ch.token_ids ?? []));
    lps.push(...(ch.logprobs?.content ?? []).map((t) => t.logprob));
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
check(chunks >= 2 && finish !== null && ids.length > 0, `stream: ${chunks} chunks, finish_reason ${finish}`);
check(usage && usage.completion_tokens === ids.length, "stream: the usage chunk counts the ids");
check(lps.length === ids.length, "stream: one log-prob per id");
took(e0, ids, lps);
history.push({ role: "assistant", content: text });

// ---- errors, in OpenAI's shape
await expectError("unknown model", 404, "model_not_found", "model", () =>
  client.chat.completions.create({ model: "no-such-model", messages: g1.messages, user: e1 }));
await expectError("temperature out of range", 400, null, "temperature", () =>
  client.chat.completions.create({ model, messages: g1.messages, temperature: 7, user: e1 }));
await expectError("n > 1 on an episode", 400, null, "n", () =>
  client.chat.completions.create({ model, messages: g1.messages, n: 2, user: e1 }));
await expectError("a history that differs from the record", 400, "episode_history_mismatch",
  "messages", () => client.chat.completions.create({
    model, user: e1, messages: [...g1.messages, { role: "assistant", content: "not what it said" },
      { role: "user", content: "?" }] }));
await expectError("no episode id", 400, "missing_episode_id", null, () =>
  client.chat.completions.create({ model, messages: g1.messages }));
await expectError("an unknown episode", 404, "episode_not_found", null, () =>
  client.chat.completions.create({ model, messages: g1.messages, user: "ep-no-such" }));

await checkRecord(e0);
await checkRecord(e1);
const r0 = await post(`/v1/episodes/${e0}/reward`, { reward: 1 });
check(r0.status === 200 && r0.body.reward_from === "harness", `${e0}: reward posted`);
await expectError("a turn of an ended episode", 409, "episode_ended", null, () =>
  client.chat.completions.create({ model, user: e0, messages: [...history, { role: "user", content: "x" }] }));
const bad = await post(`/v1/episodes/${e1}/reward`, { reward: 3 });
check(bad.status === 400 && bad.body.error.param === "reward", "a reward outside [0, 1]: 400");
const r1 = await post(`/v1/episodes/${e1}/end`, {});
check(r1.status === 200 && r1.body.reward_from === "verifier", `${e1}: ended for the verifier`);

// ---- group 2: the completions API, one episode at a time, two turns each
const g2 = await claim();
claimed(g2);
for (const ep of g2.episodes) {
  const prompt = g2.messages.map((m) => m.content).join("\n") + "\nAnswer:";
  const a = await client.completions.create({ model, prompt, max_tokens: 8, logprobs: 1, user: ep });
  check(a.choices[0].logprobs.token_logprobs.length === a.choices[0].token_ids.length,
    `${ep}: completions logprobs, one per id`);
  took(ep, a.choices[0].token_ids, a.choices[0].logprobs.token_logprobs);
  const b = await client.completions.create({
    model, prompt: prompt + a.choices[0].text + "\nSo:", max_tokens: 6, logprobs: 0, user: ep });
  took(ep, b.choices[0].token_ids, b.choices[0].logprobs.token_logprobs);
  await checkRecord(ep);
  await post(`/v1/episodes/${ep}/reward`, { reward: 0.5 });
}

fs.writeFileSync(out, JSON.stringify({ sampled, where, harness: { [e0]: 1, [e1]: null,
  [g2.episodes[0]]: 0.5, [g2.episodes[1]]: 0.5 } }));
console.log(`${failures === 0 ? "PASS" : "FAIL"}: ${failures} failed checks`);
process.exit(failures ? 1 : 0);
