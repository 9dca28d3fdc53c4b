#!/usr/bin/env bash
# GPU check of branch `house` (~4 min on one H200): every GPU test that the plan-layout move, the
# FlashInfer import helper, the shared 8B checkpoint fixture and the moved test helpers touch
# (all GPU tests but the trained-model gates and the two-GPU ones), then the CLI refusals on a
# CUDA host with FlashInfer hidden. Logs under $OUT.
#   bash .device/bootstrap.sh bash tools/device/house.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if [ -d .whl ]; then  # packages the GPU image lacks (fastapi, uvicorn, openai, ...), if carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site"
fi
timeout 330 python -m pytest -m gpu -q -rs --timeout 300 --durations=15 -p no:cacheprovider \
  tests/attention tests/kernels tests/cache tests/model tests/engine tests/speculative tests/serve \
  2>&1 | tee "$OUT/pytest_gpu_house.log" | tail -40
rc=${PIPESTATUS[0]}
# CPU-marked tests that simulate a missing FlashInfer, here on a host that has one and a GPU
timeout 120 python -m pytest -q -p no:cacheprovider tests/attention/test_flashinfer_import.py \
  tests/test_capture_cli.py::test_flashinfer_missing_on_cuda_is_one_line_with_the_install 2>&1 | tail -3 | tee -a "$OUT/pytest_gpu_house.log"
# graphrt serve on CUDA with FlashInfer hidden: one line, exit 2, before any load
python - <<'PY' 2>&1 | tee "$OUT/serve_no_flashinfer.txt"
import sys
sys.modules["flashinfer"] = None
from graphrt.serve.cli import main
try:
    main(["/nonexistent-checkpoint", "--device", "cuda", "--port", "0"])
except SystemExit as e:
    print("exit", e.code)
PY
python -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__)" >> "$OUT/serve_no_flashinfer.txt" 2>&1
exit $rc
