#!/usr/bin/env python3
"""check-links.py — every relative link in the tracked Markdown files points at a file that
exists and, with a #fragment, at a heading that file has (GitHub's anchor rules: lower case,
punctuation dropped, spaces to '-', a repeated heading gets -1, -2, ...). Links to URLs and
outside the repository (../shared/...) are not checked. Lists the bad links and exits 1."""
import os
import re
import subprocess
import sys

FENCE = re.compile(r"\s*`{3,}[^`]*$")  # a line that opens or closes a fenced block
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path):
    found, seen, in_code = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                in_code = not in_code
            elif not in_code and line.startswith("#"):
                base = slug(line.lstrip("#"))
                n = seen.get(base, -1) + 1
                seen[base] = n
                found.add(base if n == 0 else f"{base}-{n}")
    return found


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    files = subprocess.check_output(["git", "ls-files", "*.md"], text=True).split()
    anchors = {os.path.normpath(f): anchors_of(f) for f in files}
    bad = 0
    for f in files:
        text = open(f, encoding="utf-8").read()
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else os.path.normpath(f)
            if dest.startswith(".."):
                continue
            line = text.count("\n", 0, m.start()) + 1
            if not os.path.exists(dest):
                print(f"{f}:{line}: no file {path}")
                bad += 1
            elif frag and dest.endswith(".md") and frag not in anchors.get(dest, set()):
                print(f"{f}:{line}: no heading #{frag} in {dest}")
                bad += 1
    if bad:
        print(f"check-links: {bad} bad links", file=sys.stderr)
        return 1
    print(f"check-links: {len(files)} Markdown files, every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
