#!/usr/bin/env bash
# One H200 call for the FP8 KV cache (at most ~5.5 min, typically under 4.5): GPU tests first (fail fast), then
# tools/bench_e2e.py rows with bf16 and FP8 KV side by side (8B shape, bs 16 / 8k context, and
# bs 1 / 1k), then a quick trained target (tools/train_tiny.py, full size, short budget) and
# tools/quality_fp8.py on it (held-out perplexity and greedy agreement: bf16, FP8 weights, FP8 KV,
# both). Logs under $OUT (one tarball).
#   bash .device/bootstrap.sh env PYTHONPATH=$PWD:/tmp/graphrt-site bash tools/device/fp8kv.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"
L="$OUT/logs"; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$L/gpu.txt"
python -c "import torch, triton, flashinfer; print(torch.__version__, triton.__version__, flashinfer.__version__)" | tee -a "$L/gpu.txt"
T0=$SECONDS
pack() { tar czf "$OUT/fp8kv_logs.tgz" -C "$OUT" logs; }
# 1. GPU tests: FP8 KV attention (decode device/host plan, prefill, verify), the append rounding,
#    the LLM end to end; then the W8A8 greedy test against the mirrored reference
timeout 90 python -m pytest -m gpu -q -p no:cacheprovider -x -s \
  tests/attention/test_fp8_kv_gpu.py tests/model/test_fp8_kv.py 2>&1 | tee "$L/pytest_fp8kv.log" | grep -h "rel. error\|agreement\|passed\|failed\|Error"
[ "${PIPESTATUS[0]}" = 0 ] || echo "FP8 KV GPU TESTS FAILED (continuing: bench and quality still run)"
timeout 50 python -m pytest -m gpu -q -p no:cacheprovider -x -k "compressed" \
  tests/model/test_fp8_gpu.py > "$L/pytest_w8a8.log" 2>&1; grep -h "passed\|failed\|Error:" "$L/pytest_w8a8.log"
echo "tests done at $((SECONDS - T0)) s"
# 2. decode rows, bf16 vs FP8 KV, one run
timeout 60 python tools/bench_e2e.py --models llama-3.1-8b --batches 16 --contexts 8192 \
  --variants graphrt-k4 --kv bf16,fp8 --weights bf16,fp8 --no-prefill --steps 16 \
  --out "$L/bench_e2e_fp8kv_bs16_8k.json" > "$L/bench_e2e_fp8kv.log" 2> "$L/bench_e2e_fp8kv.err"
timeout 30 python tools/bench_e2e.py --models llama-3.1-8b --batches 1 --contexts 1024 \
  --variants graphrt-k4 --kv bf16,fp8 --no-prefill --steps 16 \
  --out "$L/bench_e2e_fp8kv_bs1_1k.json" >> "$L/bench_e2e_fp8kv.log" 2>> "$L/bench_e2e_fp8kv.err"
echo "bench done at $((SECONDS - T0)) s"
# 3. quality on a trained target (short budget: the gates need the full-size target)
timeout 55 python tools/train_tiny.py --out /tmp/fp8kv_family --size full --models target \
  --device cuda --time-budget-s 35 > "$L/train_tiny.log" 2>&1; tail -3 "$L/train_tiny.log"
timeout 50 python tools/quality_fp8.py /tmp/fp8kv_family/target --device cuda --max-files 64 \
  --window 512 --decode-tokens 128 --prompts 32 --gen-tokens 64 --json "$L/quality_fp8.json" \
  > "$L/quality_fp8.log" 2> "$L/quality_fp8.err"; echo "quality rc=$?"
echo "quality done at $((SECONDS - T0)) s"
pack
cat "$L/bench_e2e_fp8kv.log"; tail -3 "$L/bench_e2e_fp8kv.err"
cat "$L/quality_fp8.log"; tail -3 "$L/quality_fp8.err"
