#!/usr/bin/env python3
# perf_regions.py — where a training step's time goes, by region: reads `perf script -F
# comm,ip,sym` of a `perf record --call-graph dwarf` of `prl bench train`, drops the samples of
# the set-up (weight init, the GEMM-rate probe), attributes each other sample to the innermost
# frame that names a region (attention, matmul, expert task, ...) and prints each region's
# share with its top leaf symbols. Frame-pointer call graphs stop at the kernels, hence dwarf.
#
#   perf record --call-graph dwarf,16384 -F 700 -o step.data build/cli/prl bench train \
#       --no-reference --rounds 1 --steps 10
#   perf script -i step.data -F comm,ip,sym | scripts/perf_regions.py
import collections
import sys

REGIONS = ["attention_forward_head", "attention_backward_head", "prl_attention_rows",
           "expert_forward_task", "expert_backward_rows_task", "expert_backward_weights_task",
           "matmul_forward_block", "matmul_dinp_block", "matmul_dw_block", "prl_packed_b_repack",
           "adamw", "model__dlogits_rows", "prl_model_backward"]
SETUP = ("init_weights", "rate_task", "gemm_rate", "prl_sgemm", "cblas", "_dl_")


def samples(lines):
    stack = []
    for line in lines:
        line = line.rstrip()
        if not line:
            if stack:
                yield stack
            stack = []
        elif line[0] in " \t":
            parts = line.split()
            if len(parts) >= 2:
                stack.append(parts[1].split("+")[0])
    if stack:
        yield stack


def main():
    total, pairs = 0, collections.Counter()
    for stack in samples(sys.stdin):
        if any(s in f for f in stack for s in SETUP):
            continue
        total += 1
        region = next((r for f in stack for r in REGIONS if r in f), "other")
        pairs[(region, stack[0])] += 1
    if not total:
        sys.exit("perf_regions: no step samples on stdin")
    by_region = collections.defaultdict(collections.Counter)
    for (r, leaf), n in pairs.items():
        by_region[r][leaf] += n
    print(f"{total} samples of the step")
    for r, leaves in sorted(by_region.items(), key=lambda kv: -sum(kv[1].values())):
        top = ", ".join(f"{k} {v / total * 100:.2f}" for k, v in leaves.most_common(6))
        print(f"{sum(leaves.values()) / total * 100:5.1f}%  {r}: {top}")


if __name__ == "__main__":
    main()
