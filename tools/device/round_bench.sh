#!/usr/bin/env bash
# One H200 call (under ~9.5 min): the reliability GPU tests and the fixed GPU tests, then the
# FP8 KV rows (tools/bench_e2e.py: bf16 / FP8 weights x bf16 / FP8 KV, 8B shape), the FP8 quality
# gates on a trained target (tools/quality_fp8.py) and the sampling cost (tools/bench_sampling.py).
# Everything lands in $OUT/round_bench.tgz (logs/, JSON) plus $OUT/summary.txt.
#   bash .device/bootstrap.sh bash tools/device/round_bench.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/round_bench; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; END=${DEADLINE_S:-560}
S="$OUT/summary.txt"
pack() { tar czf "$OUT/round_bench.tgz" -C /tmp round_bench; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$L/gpu.txt" 2>&1
( timeout 70 python tools/train_tiny.py --out /tmp/fp8kv_family --size full --models target \
    --device cuda --time-budget-s 35 > "$L/train_tiny.log" 2>&1 ) &
TRAIN=$!
TO=""; python -c "import pytest_timeout" 2>/dev/null && TO=1
part() {  # part NAME SECONDS pytest-args...
  local name=$1 lim=$2; shift 2
  local left=$(( END - (SECONDS - T0) )); [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 20 ]; then echo "$name: skipped (out of time)" | tee -a "$S"; return; fi
  timeout "$lim" python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider ${TO:+--timeout "$lim"} "$@" \
    > "$L/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$L/$name.log")" | tee -a "$S"
  grep -E "^(FAILED|ERROR)" "$L/$name.log" | head -5 | tee -a "$S"
}
bench() {  # bench NAME SECONDS cmd...
  local name=$1 lim=$2; shift 2
  local left=$(( END - (SECONDS - T0) )); [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 20 ]; then echo "$name: skipped (out of time)" | tee -a "$S"; return; fi
  timeout "$lim" "$@" > "$L/$name.log" 2> "$L/$name.err"
  echo "$name rc=$? at $((SECONDS - T0)) s" | tee -a "$S"; pack
}
part rel 150 tests/engine/test_loader_poison.py \
  "tests/engine/test_engine_gpu.py::test_no_host_sync_inside_a_sampled_block" tests/engine/test_speculative_gpu.py
part fixed 80 "tests/engine/test_engine_gpu.py::test_seeded_sampling_reproducible_across_k" \
  "tests/engine/test_speculative_eagle3_gpu.py::test_eagle3_block_launch_makes_no_host_sync"
bench e2e_kv_bs16_8k 70 python tools/bench_e2e.py --models llama-3.1-8b --batches 16 --contexts 8192 \
  --variants graphrt-k4 --kv bf16,fp8 --weights bf16,fp8 --no-prefill --steps 16 --out "$L/bench_e2e_kv_bs16_8k.json"
bench e2e_kv_bs1_1k 40 python tools/bench_e2e.py --models llama-3.1-8b --batches 1 --contexts 1024 \
  --variants graphrt-k4 --kv bf16,fp8 --weights bf16,fp8 --no-prefill --steps 16 --out "$L/bench_e2e_kv_bs1_1k.json"
wait $TRAIN; tail -2 "$L/train_tiny.log" | tee -a "$S"
bench quality_fp8 60 python tools/quality_fp8.py /tmp/fp8kv_family/target --device cuda --max-files 64 \
  --window 512 --decode-tokens 128 --prompts 32 --gen-tokens 64 --json "$L/quality_fp8.json"
CK=/tmp/ck8b_l4
python tools/make_checkpoint.py "$CK" --shape llama-3.1-8b --layers 4 > /dev/null 2>&1
bench sampling 150 python tools/bench_sampling.py "$CK" --batches 1,16 --tokens 96 --k 4 --out "$L/bench_sampling.json"
pack
for f in e2e_kv_bs16_8k e2e_kv_bs1_1k quality_fp8 sampling; do echo "== $f"; tail -14 "$L/$f.log"; tail -2 "$L/$f.err"; done
cat "$S"
