#!/usr/bin/env bash
# One H200 call (~7 min): the block-timing GPU test, the trained family with the target trained for
# the preset's full budget (85 s; earlier rounds 50 s) + an EAGLE-3 head, then bench_spec part 2 (none /
# ngram / draft / eagle3 through LLM) with x runner from the engine's own block times.
#   DEADLINE=540 bash .device/bootstrap.sh bash tools/device/spec_round17.sh   (TARGET_S=50: the old budget)
NAME=spec_round17; DEADLINE=${DEADLINE:-540}; . tools/device/lib.sh   # logs, pack, cap, say
DIR=/tmp/fam; rm -rf "$DIR"
( timeout 140 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=${TARGET_S:-85} \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
timeout $(cap 120) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
  "tests/engine/test_engine_gpu.py::test_block_timing_measures_each_kind_and_changes_nothing" > "$L/tests.log" 2>&1
say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; grep -E "^(FAILED|ERROR)|block device" "$L/tests.log" | cut -c1-300 | tee -a "$S"
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"; grep -E "held|loss" "$L/train_tiny.log" | tail -4 | tee -a "$S"
timeout $(cap 80) python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s 35 \
  --eval-prompts 0 > "$L/train_eagle3.log" 2>&1; say "train_eagle3 rc=$?"; pack
timeout $(cap 260) python tools/bench_spec.py --trained "$DIR" --methods none,ngram,draft,eagle3 --prompts 6 \
  --out "$L/bench_spec_trained.json" --png "$L/bench_spec_trained.png" > "$L/bench_spec.log" 2>&1
say "bench_spec rc=$?"; pack
grep -E "tok/s/stream" "$L/bench_spec.log" | tee -a "$S" | cut -c1-10 >/dev/null
sed -n '/^part 2/,$p' "$L/bench_spec.log" | head -40
cat "$S"
