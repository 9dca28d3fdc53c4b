#!/usr/bin/env bash
# One H100/H200 call (~9 min), after round22f.sh: the GPU tests of this round's changed paths (mixed
# pieces riding whatever the budget; one warm-up run per capture; FlashInfer prefetched by LLM()),
# in two processes beside each other, then round22b's 8B TTFT row and the arrival rows.
#   bash .device/bootstrap.sh bash tools/device/round22c.sh      (carry .device, .whl)
NAME=round22c; DEADLINE=${DEADLINE:-200}; . tools/device/lib.sh   # logs, pack, cap, say
export GRAPHRT_GRAPH_WARMUP=1   # the default since round 22
T0=$SECONDS
timeout $(cap 190) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 180 \
  tests/engine/test_mixed_prefill_gpu.py tests/model/test_prefill_graphs_gpu.py tests/model/test_fallback_gpu.py \
  > "$L/gpu_a.log" 2>&1 &
A=$!
timeout $(cap 190) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 180 \
  tests/engine/test_engine_gpu.py tests/attention/test_gpu.py > "$L/gpu_b.log" 2>&1
wait $A
for f in a b; do say "gpu tests $f: $(grep -E "passed|failed|error" "$L/gpu_$f.log" | tail -1)"; done
grep -hE "^(FAILED|ERROR)" "$L"/gpu_*.log | cut -c1-300 | tee -a "$S"; pack
PARTS="serve arrival" DEADLINE=$((560 - (SECONDS - T0))) bash tools/device/round22b.sh
cat "$S"
