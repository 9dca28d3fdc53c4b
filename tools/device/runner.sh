#!/usr/bin/env bash
# GPU checks of the one graphed-step runner and speculation in the engine (H200, < 4 min):
# the new engine speculation tests (greedy equal to plain except near-ties, with margins; no host
# sync in a block of R rounds, admissions included), then the existing engine, speculative,
# trusted-decode / slot-state, model-runtime graph and tensor-parallel-driver GPU tests that the
# runner change touches. Logs under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
timeout 100 python -m pytest -m gpu -q -s -rs --timeout 90 --durations=10 -p no:cacheprovider \
  tests/engine/test_speculative_gpu.py 2>&1 | tee "$OUT/runner_spec_gpu.log" | tail -25
timeout 130 python -m pytest -m gpu -q -rs --timeout 90 --durations=10 -p no:cacheprovider \
  tests/engine/test_engine_core_gpu.py tests/engine/test_engine_gpu.py tests/engine/test_trusted_decode.py \
  tests/speculative/test_spec_gpu.py tests/attention/test_gpu.py 2>&1 | tee "$OUT/runner_gpu.log" | tail -25
