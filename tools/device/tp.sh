#!/usr/bin/env bash
# A host with two GPUs, one call, under ~6 minutes: the tensor-parallel GPU tests
# (odd-vocabulary K-step graphs vs TP 1, the one-shot all-reduce vs NCCL eager and captured, a
# worker SIGKILLed mid-stream on NCCL; the `graphrt serve` variant skips without fastapi/uvicorn),
# the FP8 tensor-parallel CPU tests, then bench_tp.py (8B and 70B shapes, bf16 and FP8, NCCL vs
# one-shot, bs 1 and 8, context 1k). Logs and results under $OUT.
#   bash .device/bootstrap.sh bash tools/device/tp.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on shared hosts (the spawned ranks inherit these)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python -c "import flashinfer, flashinfer.comm as c; print(flashinfer.__version__, hasattr(c, 'allreduce_fusion'), hasattr(c, 'create_allreduce_fusion_workspace'))" > "$OUT/flashinfer_comm.txt" 2>&1
rc=0
timeout 200 python -m pytest -m gpu -q -x -rs --durations=10 -o log_cli=true --log-cli-level=WARNING \
    tests/parallel/test_tp_gpu.py tests/parallel/test_tp_gpu_failures.py 2>&1 | tee "$OUT/pytest_tp_gpu.log" | tail -30
rc=${PIPESTATUS[0]}
timeout 200 python tools/bench_tp.py --out "$OUT" --tp 1,2 --contexts 1024 --reps 10 \
    2> "$OUT/bench_tp.err" | tee "$OUT/bench_tp.log"
brc=${PIPESTATUS[0]}
tail -5 "$OUT/bench_tp.err"
[ "$rc" = 0 ] && rc=$brc
exit $rc
