#!/usr/bin/env bash
# The round's last H200 call: the trained family (target + draft) trained in the background while
# the GPU tests of every path changed this round run (TESTS), then an EAGLE-3 head trained on the
# target and tools/bench_spec.py (METHODS) on the family, then tools/device/step_ab.sh (AB items).
# Every part bounded by DEADLINE (s). Logs packed in $OUT/final_round.tgz.
#   DEADLINE=390 TESTS="..." AB="..." bash .device/bootstrap.sh bash tools/device/final_round.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/final_round; DIR=/tmp/fam; rm -rf "$L" "$DIR"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$L/summary.txt"
cap() { local l=$((${DEADLINE:-390} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
pack() { tar czf "$OUT/final_round.tgz" -C /tmp final_round; }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
( timeout 100 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
if [ -n "${TESTS:-}" ]; then
  timeout $(cap ${TEST_S:-180}) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider $TESTS > "$L/tests.log" 2>&1
  say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | tee -a "$S"; pack
fi
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"
timeout $(cap 60) python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s ${E3_S:-35} \
  --eval-prompts 0 > "$L/train_eagle3.log" 2>&1; say "train_eagle3 rc=$?"
timeout $(cap 110) python tools/bench_spec.py --trained "$DIR" --methods ${METHODS:-none,ngram,eagle3} --prompts 6 \
  --out "$L/bench_spec_trained.json" --png "$L/bench_spec_trained.png" > "$L/bench_spec.log" 2>&1
say "bench_spec rc=$?"; pack
[ -n "${AB:-}" ] && OUT=$L AB_S=${AB_S:-35} timeout $(cap 100) bash tools/device/step_ab.sh > "$L/step_ab.log" 2>&1
say "step_ab rc=$?"; pack
grep -E "^(none|ngram|draft|eagle3) " "$L/bench_spec.log" | tail -16
tail -8 "$L/step_ab.log" 2>/dev/null
cat "$S"
