#!/usr/bin/env bash
# Second H200 call: the three GPU tests that failed in final.sh (with tracebacks), then the GPU
# tests final.sh did not reach (its 285 s bound): the tail of attention, speculative, kernels.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 120 python -m pytest -m gpu -q -rf --tb=short --timeout 100 -p no:cacheprovider \
  "tests/engine/test_engine_gpu.py::test_no_host_sync_inside_a_sampled_block" \
  "tests/engine/test_loader_poison.py" \
  "tests/engine/test_speculative_gpu.py" > "$OUT/pytest_failed3.log" 2>&1
echo "failed3 rc=$?"
timeout 200 python -m pytest -m gpu -q -rf --tb=short --timeout 100 -p no:cacheprovider \
  tests/speculative tests/kernels tests/attention/test_gpu.py \
  -k "graph_cache or lazy or model_graph or multi_step or not test_gpu" > "$OUT/pytest_rest.log" 2>&1
echo "rest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_failed3.log" "$OUT/pytest_rest.log" | tail -20
