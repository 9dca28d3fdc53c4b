#!/usr/bin/env bash
# First H200 call of round 15 (~8 min): prompt chunks carried by decode blocks (mixed_prefill_tokens,
# model/mixed.py). The GPU tests of the mixed path (8B shape: graphs captured, HF float32 greedy
# tokens with a 600-token prompt riding the blocks, no host sync in a mixed launch), then the arrival
# workload of tools/bench_prefix.py on the 1B shape (8 streams, a 4k prompt arrives) with mixed
# chunks of 128 and of 256 tokens, each run beside the paced and unpaced rows of the same process.
# Bounded by DEADLINE (s). $OUT/round15a.tgz.
#   DEADLINE=480 bash .device/bootstrap.sh bash tools/device/round15a.sh
NAME=round15a; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
timeout $(cap 200) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
  tests/engine/test_mixed_prefill_gpu.py > "$L/mixed_gpu.log" 2>&1
say "mixed gpu tests rc=$?: $(grep -E "passed|failed" "$L/mixed_gpu.log" | tail -1)"
grep -E "^(FAILED|ERROR)|mixed graphs|pieces" "$L/mixed_gpu.log" | cut -c1-300 | head -12 | tee -a "$S"; pack
for c in 128 256; do
  timeout $(cap 150) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --workloads arrival \
    --mixed $c --out-dir "$L" --name bench_prefix_mixed${c}_h200 > "$L/bench_prefix_mixed$c.log" 2>&1
  say "bench_prefix --mixed $c rc=$?"
  grep -E "^\| (mixed|paced|chunk)" "$L/bench_prefix_mixed$c.log" | cut -c1-250 | tee -a "$S"; pack
done
cat "$S"
