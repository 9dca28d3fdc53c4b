#!/usr/bin/env bash
# Round 16's last H200 call (~9 min) over the GPU paths the round changed:
# 1. GPU tests: steps_per_graph="auto" (runtime and LLM), the engine core (the prefill's sync sites
#    now 0, pool sizing, preemption), the EAGLE-3 admission's sync sites (its K/V flag deferred).
# 2. tools/bench_serve.py on the 8B shape: the default engine (K auto) vs host-planned, 2 and 8 clients.
# 3. tools/bench_prefix.py on the 1B shape (K auto): arrival with mixed chunks of 64, the shared 4k
#    prefix cold / repeated (the prefix cache's host path), chat turns.
# 4. tools/device/engine_gaps.py over a trained tiny target (none, n-gram): per block, device time
#    vs the capture-time cost, idle between blocks, work outside the graphs.
# Bounded by DEADLINE (s). $OUT/round16c.tgz.
#   DEADLINE=540 bash .device/bootstrap.sh bash tools/device/round16c.sh
NAME=round16c; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
DIR=/tmp/fam; rm -rf "$DIR"
( timeout 100 python tools/train_tiny.py --out "$DIR" --models target --time-budget-s target=50 \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
timeout $(cap 170) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider --timeout 160 \
  tests/model/test_steps_gpu.py tests/engine/test_steps_auto_gpu.py tests/engine/test_engine_core_gpu.py \
  "tests/engine/test_speculative_eagle3_gpu.py::test_eagle3_admission_makes_no_more_host_syncs_than_a_plain_prefill" \
  > "$L/tests.log" 2>&1
say "gpu tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)|sync sites|steps_per_graph|K=|step " "$L/tests.log" | cut -c1-300 | head -16 | tee -a "$S"; pack
timeout $(cap 150) python tools/bench_serve.py --make llama-3.1-8b --make-dir /tmp/ck8b --device cuda \
  --variants graphrt,graphrt-hostplan --concurrency 2,8 --requests 4 --time-budget-s 20 \
  --no-step-time --out-dir "$L" --name bench_serve_auto_h200 > "$L/bench_serve.log" 2>&1
say "bench_serve rc=$?"
grep -E "^\| graphrt" "$L/bench_serve.log" | cut -c1-220 | tee -a "$S"
grep -h -o "decode K=[^;]*" "$L"/bench_serve_auto_h200_graphrt.log | head -2 | tee -a "$S"; pack
timeout $(cap 90) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --workloads arrival,prefix,chat \
  --mixed 64 --out-dir "$L" --name bench_prefix_auto_h200 > "$L/bench_prefix.log" 2>&1
say "bench_prefix rc=$?"
grep -E "^\|" "$L/bench_prefix.log" | grep -v -- "---" | cut -c1-200 | tee -a "$S"; pack
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"
timeout $(cap 170) python tools/device/engine_gaps.py --model "$DIR/target" --tokens 128 --out "$L/engine_gaps.json" \
  --configs "none:1,ngram:1" > "$L/engine_gaps.log" 2>&1
say "engine_gaps rc=$?"; rm -f "$L"/trace_*.json; pack
sed -n '/^per block, steady-state/,$p' "$L/engine_gaps.log" | tee -a "$S"
pack; cat "$S"
