#!/usr/bin/env bash
# One GPU call (~9 min on an H200): the whole GPU suite (pytest -m gpu over tests/, the host-planning fallback
# test included), the tiny family trained in the background, then the trained-family quality gate
# on it. Logs in $OUT/suite.tgz; one line per part in $OUT/summary.txt.
#   bash .device/bootstrap.sh bash tools/device/suite.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/suite; DIR=/tmp/fam; rm -rf "$L" "$DIR"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; END=${DEADLINE_S:-550}; S="$OUT/summary.txt"
pack() { tar czf "$OUT/suite.tgz" -C /tmp suite; }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$L/gpu.txt" 2>&1
[ "${TRAINED:-1}" = 1 ] && ( timeout 100 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!; [ "${TRAINED:-1}" = 1 ] || TRAIN=""
timeout $((END - 10)) python -m pytest -m gpu -q -rfEs --tb=short --durations=40 --timeout 240 -p no:cacheprovider \
  tests --ignore=tests/test_trained_models.py > "$L/pytest_gpu.log" 2>&1
say "gpu suite rc=$?: $(grep -E "passed|failed" "$L/pytest_gpu.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$L/pytest_gpu.log" | head -12 | tee -a "$S"; pack
[ -n "$TRAIN" ] && wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"
left=$(( END - (SECONDS - T0) ))
if [ "${TRAINED:-1}" = 1 ] && [ "$left" -gt 40 ]; then
  GRAPHRT_TRAINED_DIR=$DIR timeout "$left" python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
    --timeout "$left" tests/test_trained_models.py > "$L/trained.log" 2>&1
  say "trained-family tests rc=$?: $(grep -E "passed|failed" "$L/trained.log" | tail -1)"
  grep -E "^(FAILED|ERROR)|greedy|perplexity" "$L/trained.log" | head -12 | tee -a "$S"
else say "trained-family tests: skipped (out of time)"; fi
pack; tail -45 "$L/pytest_gpu.log"; cat "$S"
