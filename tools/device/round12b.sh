#!/usr/bin/env bash
# One H200 call (~5 min): the GPU tests of the decode attention (bf16 / FP8 pages) and the FP8 KV
# cache, per-layer decode attention at block_n 128 (bench_step_parts --parts decode), the 8B step
# with bf16 and FP8 KV side by side (bench_e2e, FlashInfer and triton-decode attention), and
# bench_prefix's arrival stall at the chunk budget CHUNK (default 256). Every part is bounded by
# DEADLINE (s, default 330). Logs and JSON in $OUT/round12b.tgz.
#   DEADLINE=330 bash .device/bootstrap.sh bash tools/device/round12b.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/round12b; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$OUT/summary.txt"
cap() { local l=$((${DEADLINE:-330} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
pack() { tar czf "$OUT/round12b.tgz" -C /tmp round12b; }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
timeout $(cap 90) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider tests/attention/test_decode_attention_gpu.py \
  tests/attention/test_fp8_kv_gpu.py tests/model/test_fp8_kv.py > "$L/tests.log" 2>&1
say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | tee -a "$S"
timeout $(cap 80) python tools/bench_step_parts.py --parts decode --batches 1,16 --contexts 8192 \
  --decode-kernels triton-decode --decode-splits 3,8 \
  --decode-variants "${VARIANTS:-block_n=128;block_n=128,stages=2;block_n=32,stages=4}" \
  --out "$L/bench_decode_b128.json" > "$L/bench_decode_b128.log" 2>&1; say "bench_step_parts decode rc=$?"; pack
timeout $(cap 80) python tools/bench_e2e.py --models llama-3.1-8b --batches 16 --contexts 8192 \
  --variants graphrt-k4,graphrt-td-k4 --kv bf16,fp8 --weights bf16 --no-prefill --steps 16 \
  --out "$L/bench_e2e_bs16_8k.json" > "$L/bench_e2e.log" 2>&1; say "bench_e2e bs16/8k rc=$?"; pack
timeout $(cap 120) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --prefix-len 4096 --suffix-len 32 \
  --streams 8 --long-len 4096 --decode-tokens 512 --turns 2 --answer-tokens 32 --repeats 2 --chunk ${CHUNK:-256} \
  --prefill-modes graphed --out-dir "$L" --name bench_prefix_chunk${CHUNK:-256}_h200 > "$L/bench_prefix.log" 2>&1
say "bench_prefix rc=$?"; pack
grep -v "Warning\|warn_once" "$L/bench_decode_b128.log" | grep "ctx8192 \|shape\|^[18]b " | tail -40
grep -v "Warning\|^ *$\|^{\|INFO" "$L/bench_e2e.log" | tail -8
cat "$L"/bench_prefix_chunk*_h200.md 2>/dev/null || tail -20 "$L/bench_prefix.log"
cat "$S"
