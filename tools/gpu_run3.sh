#!/usr/bin/env bash
# Final device call: GPU tests of every merged branch (engine core, reliability, defaults,
# speculative, FP8) and the engine host-cost table. Logs tarred under $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/logs3; mkdir -p "$L"
timeout 330 python -m pytest -m gpu -q -rs --timeout 150 --durations=15 -p no:cacheprovider \
  tests/engine tests/speculative tests/model tests/kernels tests/attention 2>&1 | tee "$L/pytest_gpu.log" | tail -30
timeout 60 python tools/bench_engine.py --host-cost --out "$L/host_cost.json" 2>&1 | tee "$L/host_cost.log" | tail -20
tar -czf "$OUT/logs3.tgz" -C /tmp logs3
