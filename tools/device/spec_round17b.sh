#!/usr/bin/env bash
# One H200 call (~6 min): the engine's speculative GPU tests and the block-timing test, the trained
# family (target 50 s + draft), then bench_spec part 2 with none / ngram / draft / draft-eager (the
# draft prefilled at every admission: the A/B of the draft's waiting prefill) through LLM.
#   DEADLINE=480 bash .device/bootstrap.sh bash tools/device/spec_round17b.sh
NAME=spec_round17b; DEADLINE=${DEADLINE:-480}; . tools/device/lib.sh   # logs, pack, cap, say
DIR=/tmp/fam; rm -rf "$DIR"
( timeout 100 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
timeout $(cap 150) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider tests/engine/test_speculative_gpu.py \
  "tests/engine/test_engine_gpu.py::test_block_timing_measures_each_kind_and_changes_nothing" > "$L/tests.log" 2>&1
say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; grep -E "^(FAILED|ERROR)|block device" "$L/tests.log" | cut -c1-300 | tee -a "$S"
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"; pack
timeout $(cap 260) python tools/bench_spec.py --trained "$DIR" --methods none,draft,draft-eager,ngram --prompts 6 \
  --out "$L/bench_spec_trained.json" --png "$L/bench_spec_trained.png" > "$L/bench_spec.log" 2>&1
say "bench_spec rc=$?"; pack
sed -n '/^part 2/,/^$/p' "$L/bench_spec.log"
grep -E "tok/s/stream" "$L/bench_spec.log" | cut -c1-220
cat "$S"
