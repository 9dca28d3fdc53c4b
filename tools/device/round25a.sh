#!/usr/bin/env bash
# One H200 (or H100) call (~4 min): what the block the long prompt joins in costs (#30's arrival p99;
# round 24 on an H100: that block was the slowest in 7 of 8 runs, 6.8-7.3 ms against 6.5-6.9 for
# the other blocks carrying a chunk, and it replays the 16-row mixed graph for the first time).
#  1. the arrival stall at C = 64, each row three times in one process (--arrival-repeats 3: the
#     join gap of a graph's first replay in the process against its later ones), then the paced rows;
#  2. the GPU test made deterministic this round (split-K off in both LLMs of the greedy comparison);
#  3. the mixed GPU tests.
#   bash .device/bootstrap.sh bash tools/device/round25a.sh      (carry .device, .whl)
NAME=round25a; DEADLINE=${DEADLINE:-300}; . tools/device/lib.sh   # logs, pack, cap, say
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
CK=/tmp/ck1b
timeout $(cap 60) python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda \
  > "$L/make_ck.log" 2>&1
timeout $(cap 120) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival --mixed 64 \
  --arrival-repeats 3 --out-dir "$L" --name arrival_repeats > "$L/arrival_repeats.log" 2>&1
say "arrival repeats rc=$?"; grep -E "^\| (mixed|paced)" "$L/arrival_repeats.md" | tee -a "$S"; pack
timeout $(cap 120) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 100 \
  tests/model/test_prefill_graphs_gpu.py tests/engine/test_mixed_prefill_gpu.py > "$L/gpu_tests.log" 2>&1
say "gpu tests rc=$?: $(grep -E "passed|failed" "$L/gpu_tests.log" | tail -1)"; pack; cat "$S"
