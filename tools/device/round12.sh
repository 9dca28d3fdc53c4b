#!/usr/bin/env bash
# One H200 call (~9 min): FlashInfer's JIT warmed in the background; per-layer decode attention with
# FP8 / bf16 pages and the kernel's tuning variants (bench_step_parts --parts decode); the 8B step with
# bf16 and FP8 KV side by side (bench_e2e, FlashInfer and triton-decode attention); the 8B-shape
# EAGLE-3 head step; LLM() start-up cold / warm (1B shape); bench_prefix with the chunk budget CHUNK.
# Every part is bounded by DEADLINE (s, default 540). Logs and JSON in $OUT/round12.tgz.
#   DEADLINE=540 bash .device/bootstrap.sh bash tools/device/round12.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/round12; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$OUT/summary.txt"
cap() { local l=$((${DEADLINE:-540} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
pack() { tar czf "$OUT/round12.tgz" -C /tmp round12; }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$S"
( timeout 300 python tools/device/jit_warm.py --head-dims 64,128 --kv bf16,fp8 > "$L/jit_warm.log" 2>&1 ) &
JIT=$!
timeout $(cap ${PARTS_S:-150}) python tools/bench_step_parts.py --parts decode --batches 1,16 --contexts 1024,8192 \
  --decode-kernels triton-decode --decode-splits 2,4,8 \
  --decode-variants "${VARIANTS:-fp8_dot=q;block_n=128;block_n=128,stages=3;stages=3;stages=4}" \
  --out "$L/bench_decode.json" > "$L/bench_decode.log" 2>&1; say "bench_step_parts decode rc=$?"; pack
timeout $(cap 150) python tools/bench_e2e.py --models llama-3.1-8b --batches 16 --contexts 8192 \
  --variants graphrt-k4,graphrt-td-k4 --kv bf16,fp8 --weights bf16,fp8 --no-prefill --steps 16 \
  --out "$L/bench_e2e_bs16_8k.json" > "$L/bench_e2e.log" 2>&1; say "bench_e2e bs16/8k rc=$?"
timeout $(cap 90) python tools/bench_e2e.py --models llama-3.1-8b,llama-3.2-1b --batches 1 --contexts 1024 \
  --variants graphrt-td-k4 --kv bf16,fp8 --weights bf16 --no-prefill --steps 16 \
  --out "$L/bench_e2e_bs1_1k.json" >> "$L/bench_e2e.log" 2>&1; say "bench_e2e bs1/1k rc=$?"; pack
timeout $(cap 60) python tools/bench_eagle3_step.py --batch 1,4 --context 1024 --k 4 --json "$L/bench_eagle3_step.json" \
  > "$L/bench_eagle3_step.log" 2>&1; say "bench_eagle3_step rc=$?"; pack
wait $JIT; say "jit_warm rc: $(tail -c 300 "$L/jit_warm.log" | tr '\n' ';')"
timeout $(cap 110) python tools/bench_startup.py --what llm --shapes llama-3.2-1b --llm-modes cold,warm \
  --out "$L/bench_startup.json" > "$L/bench_startup.log" 2>&1; say "bench_startup rc=$?"; pack
timeout $(cap 200) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --prefix-len 4096 --suffix-len 32 \
  --streams 8 --long-len 4096 --decode-tokens 512 --turns 4 --answer-tokens 64 --repeats 3 --chunk ${CHUNK:-512} \
  --prefill-modes graphed --out-dir "$L" --name bench_prefix_chunk${CHUNK:-512}_h200 > "$L/bench_prefix.log" 2>&1
say "bench_prefix rc=$?"; pack
grep -v Warning "$L/bench_decode.log" | tail -120
grep -v "Warning\|^ *$" "$L/bench_e2e.log" | tail -30
tail -25 "$L/bench_eagle3_step.log"; tail -20 "$L/bench_startup.log"
cat "$L"/bench_prefix_chunk*_h200.md 2>/dev/null || tail -20 "$L/bench_prefix.log"
cat "$S"
