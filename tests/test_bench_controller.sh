#!/usr/bin/env bash
# test_bench_controller.sh — `prl bench controller` for a few seconds (the docs' figure is the
# 60 s run, --seconds 60): 64 simulated workers get leases of every kind from a real
# controller, none of their answers is refused, and the figures are printed.
set -euo pipefail
prl=$1
out=$("$prl" bench controller --workers 64 --seconds 3 --json)
echo "$out"
python3 - "$out" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["workers"] == 64, r
assert r["work_per_s"] > 0 and r["score_per_s"] > 0 and r["train_per_s"] > 0, "a lease kind never handed out"
assert r["leases_per_s"] > 0 and r["controller_cpu"] > 0, r
assert r["errors"] == 0, "the controller refused simulated answers"
print("ok: %.1f leases/s, controller %.1f %% of a core, %.0f us per lease" %
      (r["leases_per_s"], 100 * r["controller_cpu"], r["controller_cpu_us_per_lease"]))
PY
