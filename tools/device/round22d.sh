#!/usr/bin/env bash
# One H100/H200 call (~6 min) for a session whose machines were scarce: what closes #29 and #30's
# start-up question, in the fewest device seconds.
#  1. in the background: the tiny target trains (50 s) and FlashInfer's FP8-KV module at head_dim 64
#     compiles, while a 1B-shape model graph cache is captured (nothing of these is timed);
#  2. five warm starts through serve's load path (FlashInfer imported lean, prefetched, one warm-up run
#     per capture; lean + one warm-up; lean alone; as before: none of them; all again), then one
#     under cProfile + -X importtime;
#  3. quality_fp8 on the trained target (bf16, FP8 weights, FP8 KV, both: ppl, greedy agreement);
#  4. bench_e2e bs 1 / 1k, 8B + 1B, bf16 + FP8 weights, FlashInfer + triton-decode, one process.
#   bash .device/bootstrap.sh bash tools/device/round22d.sh      (carry .device, .whl)
NAME=round22d; DEADLINE=${DEADLINE:-390}; . tools/device/lib.sh   # logs, pack, cap, say
export GRAPHRT_FUSE=off
DIR=/tmp/fam22; CK=/tmp/ck1b; CACHE=/tmp/gc1b; rm -rf "$DIR" "$CK" "$CACHE"
python -c "import torch, triton, flashinfer; print(torch.__version__, torch.version.cuda, triton.__version__, flashinfer.__version__)" \
  >> "$L/gpu.txt" 2>&1; tee -a "$S" < "$L/gpu.txt"
( timeout 110 python tools/train_tiny.py --out "$DIR" --size full --models target --device cuda \
    --time-budget-s target=50 > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
( MAX_JOBS=8 timeout 300 nice -n 10 python tools/device/jit_warm.py --head-dims 64 --kv fp8 > "$L/jit_warm.log" 2>&1 ) &
JIT=$!
timeout $(cap 40) python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda \
  > "$L/make_ck.log" 2>&1
timeout $(cap 150) python -m capture --model "$CK" --out "$CACHE" --max-num-seqs 16 --max-model-len 8192 \
  > "$L/capture.log" 2>&1; say "capture rc=$?"
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"; grep -E "^target " "$L/train_tiny.log" | tee -a "$S"; pack
start() {  # NAME ENV...: one warm start through serve's load path
  local name=$1; shift
  env "$@" timeout $(cap 40) python tools/device/serve_load.py "$CK" "$CACHE" "$(date +%s.%N)" > "$L/warm_$name.log" 2>&1
  say "warm start $name ($*) rc=$?"; grep -E "startup: ready|after process start" "$L/warm_$name.log" | tee -a "$S"
}
start all_1 GRAPHRT_LEAN_IMPORTS=1 GRAPHRT_PREFETCH_IMPORTS=1 GRAPHRT_GRAPH_WARMUP=1
start lean_warmup1 GRAPHRT_LEAN_IMPORTS=1 GRAPHRT_PREFETCH_IMPORTS=0 GRAPHRT_GRAPH_WARMUP=1
start lean GRAPHRT_LEAN_IMPORTS=1 GRAPHRT_PREFETCH_IMPORTS=0 GRAPHRT_GRAPH_WARMUP=2
start before GRAPHRT_LEAN_IMPORTS=0 GRAPHRT_PREFETCH_IMPORTS=0 GRAPHRT_GRAPH_WARMUP=2
start all_2 GRAPHRT_LEAN_IMPORTS=1 GRAPHRT_PREFETCH_IMPORTS=1 GRAPHRT_GRAPH_WARMUP=1
GRAPHRT_PREFETCH_IMPORTS=1 GRAPHRT_GRAPH_WARMUP=1 timeout $(cap 40) python -X importtime tools/device/startup_profile.py "$CK" "$CACHE" "$(date +%s.%N)" "$L/profile" \
  > "$L/profile.log" 2> "$L/importtime.txt"; say "profiled start rc=$?"
grep -E "after process start" "$L/profile.log" | tee -a "$S"; pack
say "jit_warm $(kill -0 $JIT 2>/dev/null && echo "still running" || echo done)"
timeout $(cap 130) python tools/quality_fp8.py "$DIR/target" --device cuda --variants bf16,fp8,fp8-kv,fp8+fp8-kv \
  --json "$L/quality_fp8.json" --check > "$L/quality_fp8.log" 2>&1; say "quality_fp8 rc=$?"
grep -A8 "^variant" "$L/quality_fp8.log" | tee -a "$S"; pack
timeout $(cap 100) python tools/bench_e2e.py --models llama-3.1-8b,llama-3.2-1b --weights bf16,fp8-tensor-head --kv bf16 \
  --batches 1 --contexts 1024 --variants graphrt-k4,graphrt-td-k4 --no-prefill --steps 16 --out "$L/e2e_bs1_1k.json" \
  > "$L/e2e_bs1_1k.log" 2>&1; say "e2e bs1 rc=$?"
grep -E "^(copy|llama)" "$L/e2e_bs1_1k.log" | tee -a "$S"; pack
kill $JIT 2>/dev/null; cat "$S"
