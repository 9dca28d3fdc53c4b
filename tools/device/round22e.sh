#!/usr/bin/env bash
# One H100/H200 call (~7.5 min), after round22d.sh on the same machine: the GPU tests of this round's
# changed paths (FlashInfer imported lean, prefetched; one warm-up run per capture; mixed pieces riding
# whatever the budget), two processes beside each other, then step_final.sh's remaining gates
# (bs 16 / 8k with FP8 KV, the verify step, bs 16 / 1k).
#   bash .device/bootstrap.sh bash tools/device/round22e.sh      (carry .device, .whl)
NAME=round22e; DEADLINE=${DEADLINE:-200}; . tools/device/lib.sh   # logs, pack, cap, say
T0=$SECONDS
( export GRAPHRT_PREFETCH_IMPORTS=1 GRAPHRT_GRAPH_WARMUP=1   # the start path the switches would make default
timeout $(cap 190) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 180 \
  tests/engine/test_mixed_prefill_gpu.py tests/model/test_prefill_graphs_gpu.py tests/model/test_fallback_gpu.py \
  > "$L/gpu_a.log" 2>&1 &
A=$!
timeout $(cap 190) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 180 \
  tests/engine/test_engine_gpu.py tests/attention/test_gpu.py > "$L/gpu_b.log" 2>&1
wait $A )
for f in a b; do say "gpu tests $f: $(grep -E "passed|failed|error" "$L/gpu_$f.log" | tail -1)"; done
grep -hE "^(FAILED|ERROR)" "$L"/gpu_*.log | cut -c1-300 | tee -a "$S"; pack
STEPS="${STEPS:-e2e_bs16_8k verify e2e_bs16_1k}" DEADLINE=$((440 - (SECONDS - T0))) bash tools/device/step_final.sh
cat "$S"
