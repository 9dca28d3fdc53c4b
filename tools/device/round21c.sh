#!/usr/bin/env bash
# One H200 call (~9 min warm): #30's shared-prefix row, then measurements that choose #29 / #30's next changes.
#  1. the multi-query (verify / prefill-chunk) attention per layer at Q = 1 and Q = 5 over split
#     counts, bs 1 / 4 / 16, 1k / 8k (bench_step_parts --parts attention): whether default_splits'
#     choice (3 splits at bs 16) should change for the verify step;
#  2. the arrival stall with prompt chunks carried by decode blocks at C = 32 and 48 (1B shape, 8
#     streams, a 4k prompt): C = 64 measured TPOT p99 1.31-1.35x the steady p50 against #30's 1.3x.
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round21c.sh      (carry .device)
NAME=round21c; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
# 0. the shared 4k prefix, cold and repeated, cache on / off, one process (#30: repeated <= 0.15 of cold)
timeout $(cap 120) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --workloads prefix,chat \
  --out-dir "$L" --name prefix_1b > "$L/prefix_1b.log" 2>&1; say "prefix 1b rc=$?"; pack
grep -E "^\| cache" "$L/prefix_1b.md" 2>/dev/null | tee -a "$S"
timeout $(cap 200) python tools/bench_step_parts.py --parts attention --attn-q 1,5 --batches 1,4,16 \
  --contexts 1024,8192 --attn-splits 1,2,4,8,16,32,64 --out "$L/attention_splits.json" \
  > "$L/attention_splits.log" 2>&1; say "attention splits rc=$?"; pack
for C in 32 48; do
  timeout $(cap 160) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --workloads arrival --mixed $C \
    --out-dir "$L" --name arrival_mixed_$C > "$L/arrival_mixed_$C.log" 2>&1; say "arrival mixed $C rc=$?"; pack
  grep -E "^\| (mixed|paced)" "$L/arrival_mixed_$C.md" 2>/dev/null | tee -a "$S"
done
grep -E "\*:" "$L/attention_splits.log" | head -40 | tee -a "$S"
cat "$S"
