#!/usr/bin/env bash
# One H100/H200 call (~9 min): what round 23's first suite run left unproven, and #30's 8B TTFT row.
#  1. the server's packages import (fastapi 0.165 needs opentelemetry-api and annotated-doc);
#  2. the floor of a fresh process: python + `import torch` + a CUDA context, twice;
#  3. alone, the GPU tests the parallel suite failed for lack of memory on an H100 (four processes
#     holding 8B models), and the server's GPU tests (skipped there: fastapi did not import);
#  4. 8B TTFT at 8 clients, graphrt vs the host-planned variant (bench_serve, 12 requests a client).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round23a.sh      (carry .device, .whl)
NAME=round23a; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
CK8=/tmp/ck8b
python -c "import fastapi, uvicorn, openai; print('serve packages:', fastapi.__version__, uvicorn.__version__, openai.__version__)" \
  2>&1 | tail -1 | tee -a "$S"
( timeout $(cap 120) python tools/make_checkpoint.py "$CK8" --shape llama-3.1-8b --dtype bfloat16 --device cuda \
    > "$L/make_ck8.log" 2>&1; echo "make_ck8 rc=$?" >> "$L/make_ck8.log" ) &
MK=$!
for i in 1 2; do
  python - > "$L/floor_$i.log" 2>&1 <<'PY'
import subprocess, sys, time
t0 = time.time()
out = subprocess.run([sys.executable, "-c", "import time, torch; torch.ones(1, device='cuda').sum().item(); "
                      "print(time.time())"], capture_output=True, text=True).stdout
print(f"python + import torch + CUDA context: {float(out.split()[-1]) - t0:.2f} s from process start")
PY
  tail -1 "$L/floor_$i.log" | tee -a "$S"
done
timeout $(cap 260) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 200 \
  tests/engine/test_mixed_prefill_gpu.py \
  "tests/engine/test_speculative_gpu.py::test_spec_block_launch_and_admission_make_no_host_sync" \
  tests/serve > "$L/gpu_alone.log" 2>&1
say "alone rc=$?: $(grep -E "passed|failed|error" "$L/gpu_alone.log" | tail -1)"
grep -E "^(FAILED|ERROR|SKIPPED)" "$L/gpu_alone.log" | cut -c1-250 | tee -a "$S"; pack
wait $MK; say "$(tail -1 "$L/make_ck8.log")"
timeout $(cap 300) python tools/bench_serve.py --model "$CK8" --device cuda \
  --variants graphrt,graphrt-hostplan --concurrency 8 --requests 12 --no-step-time --out-dir "$L" --name bench_serve_8c \
  > "$L/bench_serve.log" 2>&1; say "bench_serve rc=$?"
grep -E "^\| (graphrt|variant)" "$L/bench_serve.log" | cut -c1-260 | tee -a "$S"; pack
cat "$S"
