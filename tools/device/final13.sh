#!/usr/bin/env bash
# The round's last H200 call (~4 min): the engine core GPU tests (the prefill makes no host sync now
# that the K/V-append flags are read with each block; preemption against HF), the host-planning
# fallback already ran this round. Bounded by DEADLINE (s). $OUT/final13.tgz.
NAME=final13; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
timeout $(cap 230) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider -s \
  tests/engine/test_engine_core_gpu.py -k "sync or preempt" > "$L/tests.log" 2>&1
say "engine core gpu rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)|sync sites" "$L/tests.log" | cut -c1-400 | tee -a "$S"; pack
tail -20 "$L/tests.log" | cut -c1-300
cat "$S"
