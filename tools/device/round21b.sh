#!/usr/bin/env bash
# One H200 call (~8 min warm), after round21a on the same machine (or alone):
#  1. tests/model/test_steps_gpu.py alone (timed: K from a measured step), with the cached-plans test
#     (981e91f: a later runtime takes split-K and K from measured_plans(), measures nothing);
#  2. a model graph cache with plans: graphrt-capture --model (1B shape), then two warm starts through
#     serve's load path: their start-up lines (no "plans" seconds; split-K and K "cached");
#  3. the repeated 4k prefix's trace to its first token (#30's 0.18 -> 0.15 of cold).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round21b.sh      (carry .device)
NAME=round21b; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
timeout $(cap 150) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider tests/model/test_steps_gpu.py \
  > "$L/steps_tests.log" 2>&1; say "steps GPU tests rc=$?: $(grep -E "passed|failed" "$L/steps_tests.log" | tail -1)"; pack
CK=/tmp/ck1b; CACHE=/tmp/gc1b; rm -rf "$CK" "$CACHE"
timeout $(cap 60) python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda \
  > "$L/make_ck.log" 2>&1
cache_and_warm_starts "$CK" "$CACHE"
timeout $(cap 120) python tools/trace_arrival.py --make llama-3.2-1b --workload reuse --streams 0 --long-len 4096 \
  --chunk 2048 --sync --out "$L/trace_reuse.json" > "$L/trace_reuse.log" 2>&1; say "trace reuse rc=$?"; pack
grep -A12 "^## " "$L/trace_reuse.log" | tee -a "$S"
cat "$S"
