#!/usr/bin/env bash
# Device call 2: every GPU test (after the package move; speculative, FP8), speculative
# mechanics, FP8 e2e rows. Logs under $OUT, tarred into one file.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$L/gpu.txt" 2>&1
timeout 250 python -m pytest -m gpu -q -rs --timeout 120 --durations=15 -p no:cacheprovider \
  tests/speculative tests/model tests/kernels tests/attention tests/engine 2>&1 | tee "$L/pytest_gpu.log" | tail -25
(cd tools && timeout 110 python bench_spec.py --batches 1,4,16 --out "$L/bench_spec.json" --png "$L/bench_spec.png") 2>&1 | tee "$L/bench_spec.log" | tail -30
(cd tools && timeout 90 python bench_e2e.py --models llama-3.1-8b --batches 1,16 --contexts 1024 --weights bf16,fp8 --variants graphrt --no-prefill --fp8-kernels --out "$L/bench_e2e_fp8.json") 2>&1 | tee "$L/bench_e2e_fp8.log" | tail -30
tar -czf "$OUT/logs2.tgz" -C /tmp logs
