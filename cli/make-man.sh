#!/usr/bin/env bash
# make-man.sh — a man page per command, made from the commands' own --help by help2man
# (Debian help2man): prl.1, prl-CMD.1 for each command `prl --help` lists, prl-CMD-SUB.1 for
# each subcommand its help names (`prl tasks generate`, `prl role controller`, ...).
# Usage: make-man.sh PRL OUTDIR VERSION. Run by the build (cli/CMakeLists.txt).
set -euo pipefail
prl=$1 out=$2 version=$3
mkdir -p "$out"
page() { # name, summary, command words...
  local name=$1 summary=$2; shift 2
  help2man --no-info --no-discard-stderr --version-string="$version" --name="$summary" \
    --output="$out/$name.1.tmp" "$*"
  # help2man titles every page PRL: give each its own name (PRL-INIT, PRL-TASKS-GENERATE)
  sed -i "s/^\.TH PRL /.TH ${name^^} /" "$out/$name.1.tmp"
  mv "$out/$name.1.tmp" "$out/$name.1"
}
page prl "RL post-training pipeline for mixture-of-experts language models" "$prl"
# "  init       write a randomly ..." under "commands:"
"$prl" --help | sed -n '/^commands:/,/^$/p' | grep -E '^  [a-z]+ ' | while read -r cmd summary; do
  page "prl-$cmd" "$summary" "$prl" "$cmd"
  # subcommands: every lowercase word W that the help names as "prl CMD W" or lists indented
  # under a heading, kept when `prl CMD W --help` is that subcommand's own help
  { "$prl" "$cmd" --help 2>&1 || true; } | { grep -oE "prl $cmd [a-z|]+|^  [a-z]+ " || true; } |
    sed -E "s/^prl $cmd //; s/^  //; s/ \$//" | tr '|' '\n' | sort -u | while read -r sub; do
      [ -n "$sub" ] || continue
      if "$prl" "$cmd" "$sub" --help 2>/dev/null | grep -q "prl $cmd $sub"; then
        page "prl-$cmd-$sub" "$summary: $sub" "$prl" "$cmd" "$sub"
      fi
    done
done
