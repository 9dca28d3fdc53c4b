#!/usr/bin/env bash
# Prefix caching + chunked prefill on one H200 (about 4 minutes): the engine's GPU tests of the
# prefill path first (fails fast), then tools/bench_prefix.py at the Llama-3.2-1B shape (shared
# 4k prefix cold / repeated, 8 streams + a 4k arrival with and without the chunk budget, a
# multi-turn chat), and the start-up line of a fresh LLM(). Logs and JSON under $OUT.
#   bash .device/bootstrap.sh env PYTHONPATH=$PWD bash tools/device/prefix.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"
L="$OUT/logs"; mkdir -p "$L"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$L/gpu.txt"
T0=$SECONDS
# 1. the engine on the GPU (prefill from an offset goes through FlashInfer's batch prefill here)
timeout 150 python -m pytest -m gpu -q -x -p no:cacheprovider --timeout 140 \
  tests/engine/test_engine_gpu.py tests/engine/test_engine_core_gpu.py 2>&1 | tee "$L/pytest_gpu.log" | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || echo "GPU ENGINE TESTS FAILED (see pytest_gpu.log)"
timeout 120 python -m pytest -q -x -p no:cacheprovider tests/engine/test_prefix_cache.py -k "keys or cached_pages" \
  2>&1 | tail -2 | tee "$L/pytest_host.log"
echo "tests done at $((SECONDS - T0)) s"
# 2. the three workloads (1B shape, random weights, bf16)
timeout 420 python tools/bench_prefix.py --make llama-3.2-1b --device cuda --prefix-len 4096 --suffix-len 32 \
  --streams 8 --long-len 4096 --decode-tokens 768 --turns 6 --answer-tokens 64 --repeats 5 \
  --out-dir "$OUT" --name bench_prefix_h200 2>&1 | grep -v Warning | tee "$L/bench_prefix.log" | tail -25
grep -h "startup:" "$L/bench_prefix.log" | head -2
echo "all done at $((SECONDS - T0)) s"
