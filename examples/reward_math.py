#!/usr/bin/env python3
"""reward_math.py - a reward program for `prl run` (reward.program = ["python3",
"examples/reward_math.py"]): one JSON request per line on stdin, one JSON reply per line on
stdout (docs/rewards.md "Reward programs"). Standard library only.

It pays a completion whose last number equals the prompt line's "answer" (metadata), with a
small bonus for a short completion, and says why in the breakdown:

    request: {"prompt", "messages", "completion", "turns", "prompt_ids", "completion_ids",
              "metadata": {"answer", ...}, "step", "prompt_index", "sample", "truncated"}
    reply:   {"score": 0..1, "breakdown": {"correct": 0|1, "short": 0|1}}

A reply must be a score in [0, 1]; anything else is recorded on the sample as an error.
"""
import json
import re
import sys

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def value(text):
    """The number a text ends with (a fraction as a float), or None."""
    found = NUMBER.findall(str(text))
    if not found:
        return None
    last = found[-1]
    if "/" in last:
        num, den = last.split("/")
        return float(num) / float(den) if float(den) else None
    return float(last)


def score(req):
    want = value(req.get("metadata", {}).get("answer", ""))
    got = value(req.get("completion", ""))
    correct = want is not None and got is not None and abs(got - want) < 1e-9
    short = len(req.get("completion_ids", [])) <= 32
    return {"score": (0.9 if correct else 0.0) + (0.1 if correct and short else 0.0),
            "breakdown": {"correct": int(correct), "short": int(short)}}


def main():
    for line in sys.stdin:  # one request per line; the process lives for the whole run
        try:
            reply = score(json.loads(line))
        except (ValueError, TypeError, AttributeError) as e:
            reply = {"score": 0.0, "breakdown": {"error": 1}, "error": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
