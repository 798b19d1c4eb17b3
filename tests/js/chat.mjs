// chat.mjs — the chat half of tests/test_hf_tokenizers.sh. prl recognises chat templates by
// their marker strings and renders them itself; here the real template of
// tokenizer_config.json is rendered by Hugging Face's Jinja engine (@huggingface/jinja) and
// encoded by tokenizers.js, and prl's chat encodings (from hf_tokenize) must match:
//   full      == the conversation (add_generation_prompt false; for a template that always
//                ends with the assistant's header, prl's prompt after all messages)
//   prompt    == the messages before the last with add_generation_prompt true
//   mask      one run of 1s per assistant message, each decoding to that message's content
//             (trimmed where the template trims; after Qwen3's empty thinking block) and its
//             end-of-turn token
//
// usage: node chat.mjs write CHAT.jsonl
//        node chat.mjs check NAME TOKENIZER_DIR CHAT.jsonl PRL_CHAT.jsonl
import fs from "node:fs";
import path from "node:path";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";

let state = 0x2545f491; // mulberry32, as corpus.mjs
function rand() {
  state = (state + 0x6d2b79f5) | 0;
  let t = Math.imul(state ^ (state >>> 15), 1 | state);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];

// contents start and end without whitespace: prl encodes the text between markers piece by
// piece, which equals encoding the rendered string except across such edges
const contents = ["Hi", "What is 17 * 23?", "17 * 23 = 391.", "Write a C loop.",
  "for (int i = 0; i < n; i++) {\n    sum += a[i];\n}", "日本語で答えてください。", "はい、わかりました。",
  "Résumé of the café: naïve but good 👍🏽", "{\"name\": \"lookup\", \"arguments\": {\"id\": 42}}",
  "OK", "Привет! Как дела?", "The answer is 42", "Call the tool.", "x = [1, 2, 3]\nprint(sum(x))",
  "Tool output: 6 items", "Done.", "Why?", "Because 2 + 2 = 4 and 4 > 3."];
const shapes = [
  ["user", "assistant"],
  ["system", "user", "assistant"],
  ["system", "user", "assistant", "user", "assistant"],
  ["user", "assistant", "tool", "assistant"],
  ["user", "assistant", "tool", "tool", "assistant"],
  ["user", "assistant", "tool", "user", "assistant"],
  ["system", "user", "assistant", "tool", "assistant", "user", "assistant"],
];

const [mode, ...args] = process.argv.slice(2);
if (mode === "write") {
  const lines = [];
  for (let i = 0; i < 60; i++) {
    const roles = shapes[i % shapes.length];
    lines.push(JSON.stringify({ messages: roles.map((role) => ({ role, content: pick(contents) })) }));
  }
  fs.writeFileSync(args[0], lines.join("\n") + "\n");
  process.exit(0);
}

const [name, dir, chatFile, prlFile] = args;
const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")), config);
const content = (v) => (v && typeof v === "object" ? v.content : v) ?? "";
const template = new Template(config.chat_template);
const render = (messages, add_generation_prompt) => template.render({
  messages, add_generation_prompt, bos_token: content(config.bos_token),
  eos_token: content(config.eos_token),
});
const ids = (s) => tok.encode(s, { add_special_tokens: false }).ids;
const ends = new Set(["<|im_end|>", "<|eot_id|>", "<｜end▁of▁sentence｜>"]);
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

const convs = fs.readFileSync(chatFile, "utf8").trimEnd().split("\n").map((l) => JSON.parse(l).messages);
const prl = fs.readFileSync(prlFile, "utf8").trimEnd().split("\n").map((l) => JSON.parse(l));
let bad = 0;
const say = (i, what) => { if (bad++ < 6) console.log(`${name}: conversation ${i + 1}: ${what}`); };
for (let i = 0; i < convs.length; i++) {
  const msgs = convs[i], p = prl[i];
  const full = ids(render(msgs, false));
  const alwaysPrompt = render(msgs, false) === render(msgs, true); // e.g. this Llama-3 template
  if (!same(alwaysPrompt ? p.prompt_all : p.full, full))
    say(i, `ids differ: hf ${full.length} [${full.slice(0, 12)}...], prl ${p.full.length} [${p.full.slice(0, 12)}...]`);
  const prompt = ids(render(msgs.slice(0, -1), true));
  if (!same(p.prompt, prompt))
    say(i, `generation prompt differs: hf [${prompt.slice(-8)}], prl [${p.prompt.slice(-8)}]`);
  // the mask: one run per assistant message, content then its end token
  const runs = [];
  for (let k = 0; k < p.mask.length; k++)
    if (p.mask[k] && (k === 0 || !p.mask[k - 1])) runs.push([k]);
    else if (p.mask[k]) runs[runs.length - 1].push(k);
  const assistant = msgs.filter((m) => m.role === "assistant");
  if (runs.length !== assistant.length) say(i, `${runs.length} masked runs for ${assistant.length} assistant turns`);
  runs.forEach((r, j) => {
    const last = tok.decode([p.full[r[r.length - 1]]]);
    const text = tok.decode(r.slice(0, -1).map((k) => p.full[k])).replace(/^<think>\n\n<\/think>\n\n/, "");
    if (!ends.has(last) || text !== assistant[j]?.content.trim())
      say(i, `masked run ${j + 1} is ${JSON.stringify(text)} + ${JSON.stringify(last)}`);
  });
}
console.log(`${name}: ${convs.length} conversations through tokenizer_config.json's chat_template ` +
  `(@huggingface/jinja + tokenizers.js): ${bad ? bad + " DIFFERENCES" : "ids, generation prompts and loss masks agree"}`);
process.exit(bad ? 1 : 0);
