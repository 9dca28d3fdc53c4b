#!/usr/bin/env bash
# One H100/H200 call (~6 min): the multi-query kernel's piece launch (kernels/multiquery_attention.py
# piece_launch: 128-key blocks and one wave at 64-128 tokens; tiles of padding tokens read no keys).
#  1. the GPU tests of every path that launches it for a prompt piece: mixed blocks, the graphed
#     prefill, the speculative verify;
#  2. profile_step --mixed 64 at 3968 and 0 (the engine's unfused step), after the change;
#  3. the arrival stall (bench_prefix --mixed 64), the tree before (.ab/round24: the three files as
#     they were) and after, one process each on this machine.
#   bash .device/bootstrap.sh bash tools/device/round24a.sh      (carry .device, .whl, .ab)
NAME=round24a; DEADLINE=${DEADLINE:-380}; . tools/device/lib.sh   # logs, pack, cap, say
timeout $(cap 170) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 160 \
  tests/engine/test_mixed_prefill_gpu.py tests/model/test_prefill_graphs_gpu.py tests/speculative/test_spec_gpu.py \
  > "$L/gpu_tests.log" 2>&1
say "gpu tests rc=$?: $(grep -E "passed|failed" "$L/gpu_tests.log" | tail -1)"; pack
for S in 3968 0; do
  timeout $(cap 40) python tools/profile_step.py --model llama-3.2-1b --batch 8 --context 1024 --mixed 64 \
    --chunk-at $S --fuse off --out "$L/mixed_64_at_${S}.json" > "$L/mixed_64_at_${S}.log" 2>&1
  say "mixed C=64 at $S rc=$?: $(grep -E "^with a" "$L/mixed_64_at_${S}.log")"
done; pack
ck_1b
tree_with /tmp/before .ab/round24
for V in before after; do
  D=$PWD; [ $V = before ] && D=/tmp/before
  in_tree "$D" timeout $(cap 100) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival \
    --mixed 64 --out-dir "$L" --name arrival_mixed_64_$V > "$L/arrival_mixed_64_$V.log" 2>&1
  say "arrival mixed 64 $V rc=$?: $(grep -E "^\| mixed" "$L/arrival_mixed_64_$V.md" 2>/dev/null)"; pack
done
pack; cat "$S"
