#!/usr/bin/env bash
# The shortest call that closes this round's GPU questions (~5 min; machines were scarce):
#  1. untimed, side by side: the tiny target trains (50 s) and FlashInfer's FP8-KV module at head_dim 64
#     compiles, while a 1B-shape LLM() starts twice (this round's start path: FlashInfer prefetched on a
#     thread, one warm-up run per capture; then without the prefetch) and the mixed-chunk GPU tests run;
#  2. quality_fp8 on the trained target (bf16, FP8 weights, FP8 KV, both: ppl, greedy agreement);
#  3. bench_e2e bs 1 / 1k, 8B + 1B, bf16 + FP8 weights, FlashInfer + triton-decode, one process.
#   bash .device/bootstrap.sh bash tools/device/round22e.sh      (carry .device, .whl)
NAME=round22e; DEADLINE=${DEADLINE:-300}; . tools/device/lib.sh   # logs, pack, cap, say
export GRAPHRT_FUSE=off GRAPHRT_GRAPH_WARMUP=1     # every capture of this call with one warm-up run
DIR=/tmp/fam22; CK=/tmp/ck1b; rm -rf "$DIR" "$CK"
( timeout 110 python tools/train_tiny.py --out "$DIR" --size full --models target --device cuda \
    --time-budget-s target=50 > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
( MAX_JOBS=8 timeout 250 nice -n 10 python tools/device/jit_warm.py --head-dims 64 --kv fp8 > "$L/jit_warm.log" 2>&1 ) &
JIT=$!
( timeout 120 python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider tests/engine/test_mixed_prefill_gpu.py \
    > "$L/mixed_gpu.log" 2>&1 ) &
MIXED=$!
timeout 40 python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda > "$L/make_ck.log" 2>&1
for mode in prefetch noprefetch; do
  env GRAPHRT_PREFETCH_IMPORTS=$([ $mode = prefetch ] && echo 1 || echo 0) timeout 90 \
    python tools/device/startup_llm.py "$CK" "$(date +%s.%N)" plain > "$L/llm_$mode.log" 2>&1
  say "LLM() start ($mode, untimed: beside training) rc=$?"
  grep -E "startup: ready|after process start" "$L/llm_$mode.log" | cut -c1-400 | tee -a "$S"
done
wait $MIXED; say "mixed GPU tests: $(grep -E "passed|failed|error" "$L/mixed_gpu.log" | tail -1)"
grep -hE "^(FAILED|ERROR)" "$L/mixed_gpu.log" | cut -c1-300 | tee -a "$S"
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"; grep -E "^target " "$L/train_tiny.log" | tee -a "$S"; pack
say "jit_warm $(kill -0 $JIT 2>/dev/null && echo "still running" || echo done)"
timeout $(cap 130) python tools/quality_fp8.py "$DIR/target" --device cuda --variants bf16,fp8,fp8-kv,fp8+fp8-kv \
  --json "$L/quality_fp8.json" --check > "$L/quality_fp8.log" 2>&1; say "quality_fp8 rc=$?"
grep -A8 "^variant" "$L/quality_fp8.log" | tee -a "$S"; pack
timeout $(cap 100) python tools/bench_e2e.py --models llama-3.1-8b,llama-3.2-1b --weights bf16,fp8-tensor-head --kv bf16 \
  --batches 1 --contexts 1024 --variants graphrt-k4,graphrt-td-k4 --no-prefill --steps 16 --out "$L/e2e_bs1_1k.json" \
  > "$L/e2e_bs1_1k.log" 2>&1; say "e2e bs1 rc=$?"
grep -E "^(copy|llama)" "$L/e2e_bs1_1k.log" | tee -a "$S"; pack
kill $JIT 2>/dev/null; cat "$S"
