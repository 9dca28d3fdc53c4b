#!/usr/bin/env bash
# The last ~2.5 min of a session's device time: #29's FP8 quality gate (never measured on a GPU) and one
# check of this round's start path (LLM() with FlashInfer prefetched and one warm-up run per capture),
# run beside the training (untimed).
#   DEADLINE=185 bash .device/bootstrap.sh bash tools/device/round22f.sh      (carry .device, .whl)
NAME=round22f; DEADLINE=${DEADLINE:-185}; . tools/device/lib.sh   # logs, pack, cap, say
DIR=/tmp/fam22; CK=/tmp/ck1b; rm -rf "$DIR" "$CK"
( timeout 100 python tools/train_tiny.py --out "$DIR" --size full --models target --device cuda \
    --time-budget-s target=40 > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
( MAX_JOBS=8 timeout 150 nice -n 10 python tools/device/jit_warm.py --head-dims 64 --kv fp8 > "$L/jit_warm.log" 2>&1 ) &
timeout 30 python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda > "$L/make_ck.log" 2>&1
GRAPHRT_PREFETCH_IMPORTS=1 GRAPHRT_GRAPH_WARMUP=1 timeout 70 python tools/device/startup_llm.py "$CK" "$(date +%s.%N)" plain \
  > "$L/llm_prefetch.log" 2>&1; say "LLM() start, prefetch + one warm-up run (untimed: beside training) rc=$?"
grep -E "startup: ready|after process start|Error|error" "$L/llm_prefetch.log" | cut -c1-400 | tail -5 | tee -a "$S"
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"; grep -E "^target " "$L/train_tiny.log" | tee -a "$S"; pack
timeout $(cap 130) python tools/quality_fp8.py "$DIR/target" --device cuda --variants bf16,fp8,fp8-kv,fp8+fp8-kv \
  --max-files 32 --decode-tokens 64 --prompts 16 --gen-tokens 32 --json "$L/quality_fp8.json" --check \
  > "$L/quality_fp8.log" 2>&1; say "quality_fp8 rc=$?"
grep -A8 "^variant" "$L/quality_fp8.log" | tee -a "$S"; tail -5 "$L/quality_fp8.log" >> "$S"; pack
cat "$S"
