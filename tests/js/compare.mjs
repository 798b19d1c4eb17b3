// compare.mjs — the Hugging Face side of tests/test_hf_tokenizers.sh: encode every document
// of the corpus with @huggingface/tokenizers (tokenizers.js, pure JS, written by none of us)
// and compare with prl's ids from hf_tokenize, document by document. Also checks prl's
// decode(encode(x)) == x wherever the tokenizer is lossless, and says where it is not and why.
// Exit 1 on any difference.
//
// usage: node compare.mjs NAME TOKENIZER_DIR CORPUS.jsonl PRL_IDS.jsonl
import fs from "node:fs";
import path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";

const [name, dir, corpusFile, prlFile] = process.argv.slice(2);
const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const configFile = path.join(dir, "tokenizer_config.json");
const config = fs.existsSync(configFile) ? JSON.parse(fs.readFileSync(configFile, "utf8")) : {};
const tok = new Tokenizer(json, config);

const docs = fs.readFileSync(corpusFile, "utf8").trimEnd().split("\n").map((l) => JSON.parse(l).text);
const prl = fs.readFileSync(prlFile, "utf8").trimEnd().split("\n").map((l) => JSON.parse(l));
if (docs.length !== prl.length) {
  console.log(`${name}: FAIL: ${docs.length} documents but ${prl.length} prl lines`);
  process.exit(1);
}

// Where decode(encode(x)) cannot give x back:
//  - an NFC/NFKC normalizer changes text that is not already in that form;
//  - a Prepend normalizer (Llama-2's "▁") prefixes every piece between added tokens, and the
//    decoder strips only the text's first space, so text after an added token gains a space;
//  - a Replace normalizer (" " -> "▁") makes a "▁" already in the text decode as a space.
const norms = [];
(function walk(n) {
  if (!n) return;
  if (n.type === "Sequence") n.normalizers.forEach(walk);
  else norms.push(n);
})(json.normalizer);
const forms = norms.filter((n) => /^NF/.test(n.type)).map((n) => n.type);
const prepends = norms.some((n) => n.type === "Prepend");
const addedContents = json.added_tokens.map((t) => t.content);
function lossyReason(x) {
  for (const f of forms) if (x.normalize(f) !== x) return `not ${f}`;
  if (prepends && addedContents.some((c) => x.includes(c))) return "Prepend after an added token";
  for (const n of norms)
    if (n.type === "Replace" && x.includes(n.content)) return `contains ${JSON.stringify(n.content)}`;
  return null;
}

let bad = 0, tokens = 0, rtChecked = 0, rtBad = 0, addChecked = 0;
const lossy = {};
const t0 = Date.now();
for (let i = 0; i < docs.length; i++) {
  const want = tok.encode(docs[i], { add_special_tokens: false }).ids;
  const got = prl[i].ids;
  tokens += want.length;
  let k = 0;
  while (k < want.length && k < got.length && want[k] === got[k]) k++;
  if (k < want.length || k < got.length) {
    if (bad++ < 5) {
      const ctx = (ids) => ids.slice(Math.max(0, k - 3), k + 4).map((id) => `${id}:${JSON.stringify(tok.id_to_token(id))}`).join(" ");
      console.log(`${name}: document ${i + 1}: ids differ at token ${k} (hf ${want.length} tokens, prl ${got.length})`);
      console.log(`  hf : ${ctx(want)}`);
      console.log(`  prl: ${ctx(got)}`);
    }
  }
  if (prl[i].add) { // add_special_tokens: the post-processor's tokens around the same ids
    addChecked++;
    const wantAdd = tok.encode(docs[i], { add_special_tokens: true }).ids;
    if (JSON.stringify(wantAdd) !== JSON.stringify(prl[i].add) && bad++ < 5)
      console.log(`${name}: document ${i + 1}: add_special_tokens ids differ (hf starts ` +
        `${wantAdd.slice(0, 3)}, prl ${prl[i].add.slice(0, 3)})`);
  }
  const why = lossyReason(docs[i]);
  if (why) lossy[why] = (lossy[why] || 0) + 1;
  else {
    rtChecked++;
    if (!prl[i].rt && rtBad++ < 5) console.log(`${name}: document ${i + 1}: prl decode(encode(x)) != x`);
  }
}
const lossyText = Object.entries(lossy).map(([w, n]) => `${n} skipped: ${w}`).join(", ");
console.log(`${name}: ${docs.length} documents, ${tokens} tokens (hf ${(Date.now() - t0) / 1000}s): ` +
  `ids ${bad ? "DIFFER in " + bad : "identical in all"} (add_special_tokens in ${addChecked}); ` +
  `decode(encode(x)) == x in ${rtChecked - rtBad}/${rtChecked}${lossyText ? " (" + lossyText + ")" : ""}`);
process.exit(bad || rtBad ? 1 : 0);
