#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU host, one device call: the GPU TP tests, then bench_tp.py, outputs under $OUT.
#   bash .device/bootstrap.sh bash tools/tp_device_check.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on shared hosts (the spawned ranks inherit these)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
rc=0
timeout 300 python -m pytest -m gpu -q -x --durations=10 tests/parallel/test_tp_gpu.py 2>&1 | tee "$OUT/pytest_tp_gpu.log" | tail -30
rc=${PIPESTATUS[0]}
timeout 300 python tools/bench_tp.py --out "$OUT" 2> "$OUT/bench_tp.err" | tee "$OUT/bench_tp.log"
brc=${PIPESTATUS[0]}
tail -5 "$OUT/bench_tp.err"
[ "$rc" = 0 ] && rc=$brc
exit $rc
