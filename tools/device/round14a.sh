#!/usr/bin/env bash
# First H200 call of round 14 (~6 min): where the host waits (tools/device/host_block.py: the cold
# 4k prompt with the prefix cache on, a paced 4k arrival, under torch.profiler) and the engine core
# GPU tests (the sync-site bound). Bounded by DEADLINE (s). $OUT/round14a.tgz.
#   bash .device/bootstrap.sh bash tools/device/round14a.sh
NAME=round14a; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
CK=/tmp/ck1b
timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1
timeout $(cap 200) python tools/device/host_block.py $CK "$L/prof" > "$L/host_block.log" 2>&1
say "host_block rc=$?"; pack
timeout $(cap 200) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider tests/engine/test_engine_core_gpu.py \
  > "$L/engine_core.log" 2>&1
say "engine core gpu rc=$?: $(grep -E "passed|failed" "$L/engine_core.log" | tail -1)"
grep -E "^(FAILED|ERROR)|sync" "$L/engine_core.log" | cut -c1-300 | head -20 | tee -a "$S"; pack
grep -E "^(== |cold)" "$L/host_block.log"
grep -E "cudaStreamSync|cudaMemcpy|cudaHostAlloc|cudaEventSync|cudaDeviceSync|aten::item|_local_scalar|cudaGraphLaunch|cudaLaunchKernel|Self CPU time total" "$L/host_block.log" | cut -c1-200
tail -3 "$L/host_block.log"
cat "$S"
