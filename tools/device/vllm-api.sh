#!/usr/bin/env bash
# One H200 call for the vLLM-shaped API and n > 1: the GPU test of shared prompt pages (bf16,
# CUDA graphs, FlashInfer), then the CPU-shaped API tests on the device's Python. Logs under $OUT.
#   bash .device/bootstrap.sh env PYTHONPATH=$PWD:/tmp/graphrt-site bash tools/device/vllm-api.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"
L="$OUT/logs"; mkdir -p "$L"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$L/gpu.txt"
timeout 150 python -m pytest -m gpu -q -x -p no:cacheprovider tests/engine/test_vllm_api_gpu.py -s \
  2>&1 | tee "$L/pytest_vllm_api_gpu.log" | tail -3
timeout 80 python -m pytest -q -x -p no:cacheprovider tests/engine/test_vllm_api.py \
  2>&1 | tee "$L/pytest_vllm_api.log" | tail -3
