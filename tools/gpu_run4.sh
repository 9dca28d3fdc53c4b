#!/usr/bin/env bash
# Last device call: the GPU paths left after run 3 (FP8 after the loader fix; the serve GPU
# tests with fastapi/uvicorn/openai carried as wheels in .whl; LLM's default device).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site"
timeout 400 python -m pytest -m gpu -q -rs --timeout 200 --durations=10 -p no:cacheprovider \
  tests/serve tests/model/test_fp8_gpu.py tests/kernels/test_gemv_fp8.py tests/model/test_fp8_kv.py \
  tests/engine/test_llm_defaults.py 2>&1 | tee "$OUT/pytest_gpu_run4.log" | tail -40
