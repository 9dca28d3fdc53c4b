#!/usr/bin/env bash
# Device call A: FlashInfer JIT cache, the host-planning fallback test, the attention + model GPU tests.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
timeout 420 python -m pytest -m gpu -q -rs --timeout 200 --durations=10 -p no:cacheprovider \
  tests/model/test_fallback_gpu.py tests/attention/test_gpu.py tests/model/test_fp8_gpu.py 2>&1 | tee "$OUT/pytest_a.log" | tail -40
