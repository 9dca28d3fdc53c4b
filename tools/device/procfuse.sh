#!/usr/bin/env bash
# Fused logits processing on one GPU (about 3-4 minutes):
#   1. GPU tests: the fused kernels at the 8B vocabulary in a CUDA graph, and the processed
#      decode graphs (bf16, captured) against HF float32
#   2. tools/device/profile_sampling.py: kernels of the processed / plain steps and of the
#      processing alone (fused, filtered, unfused torch reference), bs 1 and 16
#   3. tools/bench_sampling.py on the same 8B-shaped 4-layer checkpoint, bs 1 and 16
# $OUT gets: gpu.txt pytest_procfuse_gpu.log profile_sampling.log profile_sampling.json
#            bench_sampling.log bench_sampling.json
#   bash .device/bootstrap.sh bash tools/device/procfuse.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
t0=$(date +%s); rc=0
timeout 150 python -m pytest -m gpu -q -rs -p no:cacheprovider tests/kernels/test_logits_process.py \
  tests/engine/test_sampling_extras_gpu.py 2>&1 | tee "$OUT/pytest_procfuse_gpu.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "gpu tests: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pytest_procfuse_gpu.log"
CK="${GRAPHRT_CK8B:-/tmp/ck8b_l4}"
[ -d "$CK" ] || python tools/make_checkpoint.py "$CK" --shape llama-3.1-8b --layers 4 > /dev/null 2>&1 || rc=1
timeout 120 python tools/device/profile_sampling.py "$CK" --batches 1,16 --out "$OUT/profile_sampling.json" \
  2>&1 | grep -v "Loading\|USDT" > "$OUT/profile_sampling.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
grep "^bs \|kernel time\|total" "$OUT/profile_sampling.log"
timeout 150 python tools/bench_sampling.py "$CK" --batches 1,16 --tokens 96 --k 4 --out "$OUT/bench_sampling.json" \
  2>&1 | grep -v "Loading" | tee "$OUT/bench_sampling.log" | tail -6
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "total: $(( $(date +%s) - t0 )) s rc=$rc" | tee -a "$OUT/bench_sampling.log"
exit $rc
