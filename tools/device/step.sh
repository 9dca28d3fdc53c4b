#!/usr/bin/env bash
# One H200 call for the model step (bf16 and FP8 weights): GPU correctness of the step's kernels
# first (fails fast), then tools/profile_step.py per-kernel tables (PDL off / on) and
# tools/bench_e2e.py rows for each weight format side by side. Logs under $OUT (one tarball).
#   bash .device/bootstrap.sh env PYTHONPATH=$PWD:/tmp/graphrt-site bash tools/device/step.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"
L="$OUT/logs"; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$L/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda)" | tee -a "$L/gpu.txt"
T0=$SECONDS
pack() { tar czf "$OUT/step_logs.tgz" -C "$OUT" logs; }
# 1. kernels and the model path on the GPU (PDL on: the default)
timeout 60 python -m pytest -m gpu -q -x -p no:cacheprovider --timeout 50 \
  tests/kernels/test_fp8_act.py tests/model/test_fp8_weights.py 2>&1 | tee "$L/pytest_kernels.log" | tail -2
[ "${PIPESTATUS[0]}" = 0 ] || { echo "KERNEL TESTS FAILED"; pack; exit 1; }
timeout 75 python -m pytest -m gpu -q -p no:cacheprovider --timeout 70 -x -k "compressed" \
  tests/model/test_fp8_gpu.py > "$L/pytest_model.log" 2>&1; grep -h "passed\|failed\|Error:" "$L/pytest_model.log"
echo "tests done at $((SECONDS - T0)) s"
# 2. end to end, weight formats side by side
timeout 60 python tools/bench_e2e.py --models llama-3.1-8b,llama-3.2-1b \
  --weights bf16,fp8,fp8-tensor-head --batches 1,16 --contexts 1024 --variants graphrt --no-prefill --steps 16 \
  --out "$L/bench_e2e_step.json" > "$L/bench_e2e_step.log" 2> "$L/bench_e2e_step.err"
echo "bench done at $((SECONDS - T0)) s"
# 3. per-kernel table of the fastest 8B FP8 format
timeout 35 python tools/profile_step.py --model llama-3.1-8b --weights fp8-tensor-head \
  --out "$L/profile_llama-3.1-8b_fp8-tensor-head_pdl1.json" >> "$L/profile_step.log" 2>&1
echo "profile done at $((SECONDS - T0)) s"
pack
grep -v "^  \|Warning" "$L/profile_step.log"
python - "$L" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/profile_*.json")):
    r = json.load(open(f))
    fam = " ".join(f"{k}={v:.0f}/{r['families_launches'][k]:.0f}" for k, v in
                   sorted(r["families_us"].items(), key=lambda kv: -kv[1]))
    print(f"{r['model'][6:]:<7} {r['weights']:<15} pdl{r['pdl']} {r['device_us_per_step']:6.0f}us {fam}")
PY
tail -3 "$L/bench_e2e_step.err"
cat "$L/bench_e2e_step.log"
