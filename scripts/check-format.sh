#!/usr/bin/env bash
# check-format.sh — every tracked C source and header is formatted as .clang-format says
# (clang-format 14, Debian 12's; another major version formats differently, so it is
# refused). Lists the files that are not and exits 1; `--fix` formats them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(clang-format --version 2>/dev/null | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$version" != 14 ]; then
  echo "check-format: needs clang-format 14 (found: ${version:-none}); scripts/install-deps.sh installs it" >&2
  exit 2
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.h')
else
  mapfile -t files < <(find . -path ./build -prune -o \( -name '*.c' -o -name '*.h' \) -print | sort)
fi
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f"
    bad=$((bad + 1))
  fi
done
if [ "$bad" -ne 0 ]; then
  echo "check-format: $bad of ${#files[@]} files differ from .clang-format (scripts/check-format.sh --fix)" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
