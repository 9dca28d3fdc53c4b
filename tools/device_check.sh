#!/usr/bin/env bash
# One device call (see docs/DEVELOPING.md): GPU tests + the benchmarks named in $BENCH, logs under $OUT.
#   bash .device/bootstrap.sh bash tools/device_check.sh [pytest -k expr]
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
if [ -d .whl ]; then  # packages the GPU image lacks (fastapi, uvicorn, openai, pydantic, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site"
fi
rc=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python -m pytest -m gpu -q -rs --timeout 400 --durations=25 -p no:cacheprovider ${1:+-k "$1"} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
  rc=${PIPESTATUS[0]}
fi
for b in ${BENCH:-}; do
  case $b in
    gemv) (cd tools && python bench_gemv.py --out "$OUT/bench_gemv.json") 2>"$OUT/bench_gemv.err" | tee "$OUT/bench_gemv.log" ;;
    serve) python tools/bench_serve.py ${SERVE_ARGS:-} --out-dir "$OUT" 2>"$OUT/bench_serve.err" | tee "$OUT/bench_serve.log" ;;
    engine) python tools/bench_engine.py ${ENGINE_ARGS:-} 2>"$OUT/bench_engine.err" | tee "$OUT/bench_engine.log" ;;
    kernels) (cd tools && python bench_kernels.py --out "$OUT/bench_kernels.json") 2>"$OUT/bench_kernels.err" | tee "$OUT/bench_kernels.log" ;;
    profile) (cd tools && for m in llama-3.1-8b llama-3.2-1b; do python profile_step.py --model $m --out "$OUT/profile_$m.json"; done) 2>"$OUT/profile.err" | tee "$OUT/profile.log" ;;
    e2e) (cd tools && python bench_e2e.py --out "$OUT/bench_e2e.json" --png "$OUT/bench_e2e.png" ${E2E_ARGS:-}) 2>"$OUT/bench_e2e.err" | tee "$OUT/bench_e2e.log" ;;
  esac
done
exit $rc
