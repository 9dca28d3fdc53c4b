#!/usr/bin/env bash
# One H200 call (~9 min warm) for what round 20 built without a GPU, in the order that decides issues:
#  1. beside the training (nothing there is timed): the speculative engine's GPU tests. EAGLE-3
#     (#32's last open item: the drafter's warm-up of every chain-step MAX_SPLITS, 94102c5), and
#     prefix caching and chunked prefill under draft / EAGLE-3 (6c1266c: on by default now);
#  2. the trained family (target 50 s + draft) and an EAGLE-3 head; bench_spec none / ngram / draft /
#     eagle3 at bs 1 and 4, held-out and repeat (the H200 rows #32 names);
#  3. bench_prefix on the trained target with its head: a shared prefix and chat turns, cache on / off,
#     TTFT and acceptance (the head's K/V of cached pages is its writer's: acceptance should hold).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round21a.sh      (carry .device)
# The timed GPU tests (tests/model/test_steps_gpu.py: K from a measured step) are round21b's, alone.
NAME=round21a; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
DIR=/tmp/fam; rm -rf "$DIR"
( timeout $(cap 300) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
    tests/speculative/test_eagle3_gpu.py tests/engine/test_speculative_eagle3_gpu.py \
    tests/engine/test_speculative_gpu.py > "$L/tests.log" 2>&1
  echo "tests rc=$?" >> "$L/tests.log" ) &
TPID=$!
train_family "$DIR"
wait $TPID; say "tests: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; pack
timeout $(cap 160) python tools/bench_spec.py --trained "$DIR" --methods none,ngram,draft,eagle3 --prompts 6 \
  --out "$L/bench_spec.json" > "$L/bench_spec.log" 2>&1; say "bench_spec rc=$?"; pack
timeout $(cap 120) python tools/bench_prefix.py --model "$DIR/target" --workloads prefix,chat --max-model-len 256 \
  --prefix-len 160 --suffix-len 16 --repeats 4 --turns 4 --answer-tokens 24 --max-batch 4 --out-dir "$L" \
  --name bench_prefix_eagle3 --speculative "{\"method\": \"eagle3\", \"model\": \"$DIR/eagle3\", \"num_tokens\": 4}" \
  > "$L/bench_prefix_eagle3.log" 2>&1; say "bench_prefix eagle3 rc=$?"; pack
grep -E "passed|failed|FAILED|Error" "$L/tests.log" | tail -8 | tee -a "$S"
sed -n '/^part 2/,/^$/p' "$L/bench_spec.log" | tee -a "$S"
tail -20 "$L/bench_prefix_eagle3.md" 2>/dev/null | tee -a "$S"
cat "$S"
