#!/usr/bin/env bash
# GPU checks of the rel-load branch (loaders, config bounds, engine tests, trained-family gate).
# Run on the H200 from the repository root: bash .device/bootstrap.sh bash tools/device/rel-load.sh
# Logs under $OUT (default /tmp/rel-load). About 4 minutes (the family trains in ~2 of them).
set -u
OUT=${OUT:-/tmp/rel-load}
mkdir -p "$OUT"
nvidia-smi > "$OUT/gpu.txt" 2>&1 || true
export PYTHONPATH=$PWD
python -m pytest -q -p no:cacheprovider -m gpu \
    tests/engine/test_loader_poison.py tests/model/test_fp8_gpu.py tests/engine/test_engine_core_gpu.py \
    > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/summary.txt"
GRAPHRT_TRAINED_DIR=${GRAPHRT_TRAINED_DIR:-/tmp/trained} python -m pytest -q -s -p no:cacheprovider -m gpu \
    tests/test_trained_models.py::test_trained_family_quality_gates > "$OUT/trained_gate.log" 2>&1
echo "trained gate rc=$?" | tee -a "$OUT/summary.txt"
grep -h "greedy gate:" "$OUT/trained_gate.log" | tee -a "$OUT/summary.txt"
