#!/usr/bin/env bash
# First H200 call of round 16 (~8 min): choosing K and the mixed chunk from measurements.
# 1. The 8B shape through `graphrt serve` (tools/bench_serve.py) at 2 and 8 clients: device-planned
#    K = 4 (default), K = 1, K = 4 with mixed chunks of 256, and host-planned K = 1; the K = 1
#    variants prefill unpaced (a token budget, as today's engines).
# 2. The arrival workload of tools/bench_prefix.py on the 1B shape with mixed chunks of 64 at
#    K = 4, 2 and 1 (each beside its paced and unpaced rows), per-delta timelines in the JSON;
#    the shared-prefix and chat workloads once (K = 4).
# 0. First, the mixed path's GPU tests (tests/engine/test_mixed_prefill_gpu.py), never run before.
# Bounded by DEADLINE (s). $OUT/round16a.tgz.
#   DEADLINE=480 bash .device/bootstrap.sh bash tools/device/round16a.sh
NAME=round16a; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
timeout $(cap 200) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
  tests/engine/test_mixed_prefill_gpu.py > "$L/mixed_gpu.log" 2>&1
say "mixed gpu tests rc=$?: $(grep -E "passed|failed" "$L/mixed_gpu.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$L/mixed_gpu.log" | cut -c1-300 | head -12 | tee -a "$S"; pack
timeout $(cap 220) python tools/bench_serve.py --make llama-3.1-8b --make-dir /tmp/ck8b --device cuda \
  --variants graphrt,graphrt-k1,graphrt-mixed,graphrt-hostplan --concurrency 2,8 --requests 3 --time-budget-s 20 \
  --no-step-time --out-dir "$L" --name bench_serve_k_h200 > "$L/bench_serve.log" 2>&1
say "bench_serve rc=$?"
grep -E "^\| graphrt" "$L/bench_serve.log" | cut -c1-220 | tee -a "$S"; pack
for kc in 4:64 1:64 4:128; do
  k=${kc%:*}; c=${kc#*:}
  timeout $(cap 70) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --workloads arrival \
    --steps-per-graph $k --mixed $c --out-dir "$L" --name bench_prefix_k${k}_mixed${c}_h200 > "$L/bench_prefix_k${k}_$c.log" 2>&1
  say "bench_prefix K=$k --mixed $c rc=$?"
  grep -E "^\| (mixed|paced|chunk)" "$L/bench_prefix_k${k}_$c.log" | cut -c1-200 | tee -a "$S"; pack
done
timeout $(cap 90) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --workloads prefix,chat \
  --out-dir "$L" --name bench_prefix_reuse_h200 > "$L/bench_prefix_reuse.log" 2>&1
say "bench_prefix reuse rc=$?"
grep -E "^\|" "$L/bench_prefix_reuse.log" | head -12 | cut -c1-200 | tee -a "$S"
pack; cat "$S"
