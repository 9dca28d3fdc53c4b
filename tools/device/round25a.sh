#!/usr/bin/env bash
# One H200 (or H100) call (~4 min): what the block the long prompt joins in costs (#30's arrival p99;
# round 24 on an H100: that block was the slowest in 7 of 8 runs, 6.8-7.3 ms against 6.5-6.9 for
# the other blocks carrying a chunk, and it replays the 16-row mixed graph for the first time).
#  1. the arrival stall at C = 64, each row three times in one process (--arrival-repeats 3: the
#     join gap of a graph's first replay in the process against its later ones), as main is and with
#     a warm replay of every graph at capture (.ab/round25/graphrt/attention/graphs.py);
#  2. the GPU test made deterministic this round (split-K off in both LLMs of the greedy comparison);
#  3. the mixed GPU tests.
#   bash .device/bootstrap.sh bash tools/device/round25a.sh      (carry .device, .whl, .ab)
NAME=round25a; DEADLINE=${DEADLINE:-300}; . tools/device/lib.sh   # logs, pack, cap, say
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
ck_1b
# as it is, then with one warm replay of every graph right after its capture (.ab/round25: the runner
# with that line; its start-up time is in each JSON's startup_s)
tree_with /tmp/warm .ab/round25
for V in main warm; do
  D=$PWD; [ $V = warm ] && D=/tmp/warm
  in_tree "$D" timeout $(cap 80) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival \
    --mixed 64 --arrival-repeats 3 --out-dir "$L" --name arrival_repeats_$V > "$L/arrival_repeats_$V.log" 2>&1
  say "arrival repeats $V rc=$?: startup $(grep -o '"startup_s": [0-9.]*' "$L/arrival_repeats_$V.json")"
  grep -E "^\| mixed" "$L/arrival_repeats_$V.md" | tee -a "$S"; pack
done
timeout $(cap 120) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 100 \
  tests/model/test_prefill_graphs_gpu.py tests/engine/test_mixed_prefill_gpu.py > "$L/gpu_tests.log" 2>&1
say "gpu tests rc=$?: $(grep -E "passed|failed" "$L/gpu_tests.log" | tail -1)"; pack; cat "$S"
