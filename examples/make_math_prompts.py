#!/usr/bin/env python3
"""make_math_prompts.py - a JSONL prompt file of arithmetic word problems for `prl run`
(task.source = file, verifier = math), from templates of its own, deterministic in --seed.

    python3 examples/make_math_prompts.py --n 1200 --seed 7 > runs/math-words.jsonl

Each line: {"id", "prompt", "verifier": "math", "answer", "template", "ops"}; "template" and
"ops" are metadata (kept in run.db with the prompt). Answers are written in the forms the
math verifier compares as values: integers, some as strings with units ("42 km"), some as
fractions ("7/2"). Standard library only.
"""
import argparse
import json
import random

NAMES = ["Lia", "Omar", "Kai", "Nora", "Ravi", "Sofia", "Ines", "Theo"]
THINGS = ["marbles", "stickers", "shells", "stamps", "buttons", "candies", "beads", "cards"]


def word_problems(r):
    """(template name, prompt, answer, number of operations) for one draw."""
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a, b, c = r.randint(2, 20), r.randint(2, 12), r.randint(1, 9)
    return [
        ("gain", f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
         a + b, 1),
        ("loss", f"{name} had {a + b} {thing} and gave {b} away. How many {thing} are left?",
         a, 1),
        ("boxes", f"There are {a} boxes with {b} {thing} in each box. How many {thing} are there?",
         a * b, 1),
        ("share", f"{name} shares {a * b} {thing} equally among {b} friends. How many {thing} does "
                  f"each friend get?", a, 1),
        ("speed", f"A train goes {a} km every hour. How far does it go in {b} hours?",
         f"{a * b} km", 1),
        ("packs", f"{name} buys {a} packs of {b} {thing} and finds {c} more. How many {thing} are "
                  f"there in all?", a * b + c, 2),
        ("sum", f"What is {a} + {b} - {c}?", a + b - c, 2),
        ("half", f"{name} has {a} {thing} and gives half of them away. How many are left? Give a "
                 f"fraction if needed.", f"{a}/2" if a % 2 else a // 2, 1),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1200, help="problems (default 1200)")
    ap.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    args = ap.parse_args()
    r = random.Random(args.seed)
    seen = set()
    k = 0
    while k < args.n:
        name, prompt, answer, ops = r.choice(word_problems(r))
        if prompt in seen:  # the split hashes the prompt: a repeat would be one problem twice
            continue
        seen.add(prompt)
        line = {"id": f"words-{args.seed}-{k}", "prompt": prompt, "verifier": "math",
                "answer": answer, "template": name, "ops": ops}
        print(json.dumps(line))
        k += 1


if __name__ == "__main__":
    main()
