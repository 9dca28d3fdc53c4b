#!/usr/bin/env bash
# One H200 call over the GPU tests of every path merged since the last GPU round (under ~9.5 min):
#   background: FlashInfer JIT builds (tools/device/jit_warm.py: FP8 KV and head_dim 64 modules)
#   background: the tiny family's draft + target (tools/train_tiny.py --size full -> /tmp/trained)
#   foreground: GPU tests by area (reliability, sampling / vLLM API, engine + prefix, FP8 KV and
#   W8A8, EAGLE-3), each bounded; then tools/bench_spec.py --trained with the time left.
# Logs under $OUT/logs; a summary line per part in $OUT/logs/summary.txt.
#   bash .device/bootstrap.sh bash tools/device/round_tests.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L="$OUT/logs"; mkdir -p "$L"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; END=${DEADLINE_S:-560}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$L/gpu.txt" 2>&1
python tools/device/jit_warm.py --head-dims 128,64 --kv fp8,bf16 > "$L/jit_warm.log" 2>&1 &
DIR=/tmp/trained; rm -rf "$DIR"
( timeout 200 python tools/train_tiny.py --out "$DIR" --size full --device cuda --models draft,target \
    > "$L/train.log" 2>&1; echo "train rc=$? at $((SECONDS - T0)) s" >> "$L/train.log" ) &
TRAIN=$!
TO=""; python -c "import pytest_timeout" 2>/dev/null && TO=1
part() {  # part NAME SECONDS pytest-args...: bounded by the call's deadline
  local name=$1 lim=$2; shift 2
  local left=$(( END - (SECONDS - T0) )); [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 20 ]; then echo "$name: skipped (out of time)" | tee -a "$L/summary.txt"; return; fi
  timeout "$lim" python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider ${TO:+--timeout "$lim"} "$@" \
    > "$L/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$L/$name.log")" | tee -a "$L/summary.txt"
}
part rel 150 tests/engine/test_loader_poison.py \
  "tests/engine/test_engine_gpu.py::test_no_host_sync_inside_a_sampled_block" tests/engine/test_speculative_gpu.py
part sampling 90 tests/engine/test_sampling_extras_gpu.py tests/engine/test_vllm_api_gpu.py
part engine 100 tests/engine/test_engine_gpu.py tests/engine/test_engine_core_gpu.py tests/model/test_prefill.py
part fp8kv 120 tests/attention/test_fp8_kv_gpu.py tests/model/test_fp8_kv.py tests/model/test_fp8_gpu.py
part eagle3 100 tests/engine/test_speculative_eagle3_gpu.py tests/speculative/test_eagle3_gpu.py
wait $TRAIN; tail -2 "$L/train.log" | tee -a "$L/summary.txt"; cp "$DIR/train.json" "$L/" 2>/dev/null
left=$(( END - (SECONDS - T0) ))
if [ "$left" -gt 40 ] && [ -d "$DIR/draft" ]; then
  timeout "$left" python tools/bench_spec.py --trained "$DIR" --prompts 4 --out "$L/bench_spec_trained.json" \
    --png "$L/bench_spec_trained.png" 2>&1 | grep -v "Loading weights" > "$L/bench_spec_trained.log"
  echo "bench_spec rc=${PIPESTATUS[0]} at $((SECONDS - T0)) s" | tee -a "$L/summary.txt"
else
  echo "bench_spec: skipped ($left s left)" | tee -a "$L/summary.txt"
fi
cat "$L/jit_warm.log" >> "$L/summary.txt"
