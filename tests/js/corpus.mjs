// corpus.mjs — the deterministic mixed-text corpus of tests/test_hf_tokenizers.sh: one JSON
// line {"text": ...} per document, at least MIN_BYTES of UTF-8 in all. Documents: slices of
// prl's own C sources (code), and seeded generated text mixing prose, CJK, emoji (with ZWJ
// sequences and skin tones), numbers, whitespace runs, many scripts, contractions and the
// special-token strings of the tokenizers under test. Same seed, same bytes.
//
// usage: node corpus.mjs REPO_ROOT OUT.jsonl
import fs from "node:fs";
import path from "node:path";

const [root, out] = process.argv.slice(2);
const MIN_BYTES = 1 << 20;

let state = 0x9e3779b9; // mulberry32: small, seeded, the same on every machine
function rand() {
  state = (state + 0x6d2b79f5) | 0;
  let t = Math.imul(state ^ (state >>> 15), 1 | state);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const words = ("the of and to in is was that for it with as his on be at by had are but from " +
  "not have this which she or they you were her all there an one their we can been has " +
  "would when will more if no out so said what up its about into than them only other time " +
  "new some could these two may first then do any like my now over such our man me even " +
  "most made after also did many before must through back years where much your way well " +
  "Tokenizer BPE merges Hugging Face model gradient expert router softmax").split(" ");
const contractions = ["don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", "DON'T",
  "It'S", "o'clock", "rock'n'roll"];
const cjk = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从";
const kana = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソ";
const hangul = "가나다라마바사아자차카타파하한국어세계안녕하세요";
const scripts = ["Привет, как дела? Ёлка и щётка.", "Καλημέρα κόσμε, ούτε ένα.",
  "مرحبا بالعالم، كيف حالك؟", "שלום עולם, מה שלומך?", "नमस्ते दुनिया, आप कैसे हैं?",
  "สวัสดีชาวโลก ภาษาไทย", "Tiếng Việt có dấu: đường phố Hà Nội", "Zażółć gęślą jaźń",
  "Ærøskøbing — Øresund, naïve café, Straße, fiancé", "İstanbul’da ılık bir gün",
  "ქართული ენა", "Հայերեն լեզու", "ᚠᛇᚻ᛫ᛒᛦᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 ∀x∈ℝ: x²≥0 ≠ ∞"];
const emoji = ["😀", "🚀", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🤖", "✨", "🔥", "🧪",
  "1️⃣", "☕", "🦀"];
const specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>",
  "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<｜User｜>", "<｜Assistant｜>",
  "<｜end▁of▁sentence｜>", "<think>", "</think>", "<|reserved_special_token_3|>"];
const spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\t\t", "    ", " \t \n",
  "\u00a0", "\u3000", "\u2003"];
const punct = [".", ",", "!", "?", ";", ":", "...", "—", "-", "(", ")", "[", "]", "{", "}",
  "\"", "'", "«", "»", "„", "“", "”", "@", "#", "$", "%", "&", "*", "/", "\\", "|", "~",
  "`", "^", "+", "=", "<", ">", "<<", ">>=", "->", "=>", "!=", "::"];

function number() {
  switch (int(0, 5)) {
    case 0: return String(int(0, 9));
    case 1: return String(int(10, 99999));
    case 2: return String(int(1, 9)) + String(Math.floor(rand() * 1e12)).padStart(12, "0");
    case 3: return (rand() * 1000).toFixed(int(1, 6));
    case 4: return `${int(1900, 2099)}-${String(int(1, 12)).padStart(2, "0")}-${String(int(1, 28)).padStart(2, "0")}`;
    default: return "٣٤٥ ١٢ ⅻ ½ ²³ ١٠٠"; // non-ASCII digits and numerals
  }
}

// Per document: may it hold special-token strings, and text that NFC/NFKC would change? (Not
// every document, so that the lossless check of normalizing tokenizers covers many.)
let withSpecials = false, withOdd = false;

function piece() {
  const r = rand();
  if (r < 0.40) {
    let w = pick(words);
    if (rand() < 0.1) w = w[0].toUpperCase() + w.slice(1);
    if (rand() < 0.03) w = w.toUpperCase();
    return w;
  }
  if (r < 0.46) return pick(contractions);
  if (r < 0.54) {
    const src = pick([cjk, cjk, kana, hangul]);
    let s = "";
    for (let i = int(1, 12); i > 0; i--) s += [...src][int(0, [...src].length - 1)];
    return s;
  }
  if (r < 0.60) return pick(scripts);
  if (r < 0.65) return pick(emoji) + (rand() < 0.3 ? pick(emoji) : "");
  if (r < 0.74) return number();
  if (r < 0.86) return pick(punct);
  if (r < 0.88 && withSpecials) return pick(specials);
  if (r < 0.89 && withOdd) return "e\u0301 n\u0303 A\u030a"; // decomposed accents (not NFC)
  if (r < 0.90 && withOdd) return "ﬁ ﬂ ① ｆｕｌｌｗｉｄｔｈ ㎏"; // compatibility characters
  return pick(spaces).repeat(rand() < 0.05 ? int(2, 40) : 1);
}

function generated() {
  const n = int(20, 900);
  withSpecials = rand() < 0.4;
  withOdd = rand() < 0.3;
  let s = rand() < 0.2 ? pick(spaces) : "";
  for (let i = 0; i < n; i++) {
    s += piece();
    const r = rand();
    s += r < 0.75 ? " " : r < 0.85 ? "" : pick(spaces);
  }
  return s;
}

// prl's own sources, in a fixed order, cut into documents of 1-8 KiB at line ends
function codeDocs() {
  const docs = [];
  for (const dir of ["engine", "cli", "roles", "tasks"]) {
    const files = fs.readdirSync(path.join(root, dir)).filter((f) => /\.[ch]$/.test(f)).sort();
    for (const f of files) {
      const text = fs.readFileSync(path.join(root, dir, f), "utf8");
      for (let i = 0; i < text.length;) {
        let j = Math.min(text.length, i + int(1024, 8192));
        const nl = text.indexOf("\n", j);
        j = nl < 0 ? text.length : nl + 1;
        docs.push(text.slice(i, j));
        i = j;
      }
    }
  }
  return docs;
}

// a few long runs that stress the regexes' backtracking and the merge loop on long words
function stressDocs() {
  let letters = "", digits = "", mixed = "";
  for (let i = 0; i < 20000; i++) letters += "abcdefghijklmnopqrstuvwxyzéü"[int(0, 27)];
  for (let i = 0; i < 3000; i++) digits += String(int(0, 9));
  for (let i = 0; i < 2000; i++) mixed += pick(emoji) + pick(["", "", " ", "\u200d"]);
  return [letters, " ".repeat(5000) + "x" + "\n".repeat(3000) + "\t \r\n".repeat(500), digits, mixed,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".repeat(50)];
}

const code = codeDocs();
const lines = stressDocs().map((text) => JSON.stringify({ text }));
let bytes = lines.reduce((n, l) => n + Buffer.byteLength(JSON.parse(l).text), 0);
let ci = 0, generatedBytes = 0;
// alternate code and generated text until both halves reach half of the minimum
while (bytes < MIN_BYTES || generatedBytes < MIN_BYTES / 2) {
  let text;
  if (ci < code.length && (generatedBytes >= MIN_BYTES / 2 || rand() < 0.4)) text = code[ci++];
  else {
    text = generated();
    generatedBytes += Buffer.byteLength(text);
  }
  bytes += Buffer.byteLength(text);
  lines.push(JSON.stringify({ text }));
}
fs.writeFileSync(out, lines.join("\n") + "\n");
console.log(`corpus: ${lines.length} documents, ${bytes} bytes (${generatedBytes} generated, ` +
  `${bytes - generatedBytes} of prl's sources)`);
