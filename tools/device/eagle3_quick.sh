#!/usr/bin/env bash
# One H200 call (~3.5 min): the trained target + an EAGLE-3 head, bench_spec part 2 for none vs eagle3.
#   bash .device/bootstrap.sh bash tools/device/eagle3_quick.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; DIR=/tmp/fam; mkdir -p "$OUT"; export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS
timeout 90 python tools/train_tiny.py --out "$DIR" --models target --time-budget-s target=40 > "$OUT/train_tiny.log" 2>&1; echo "train rc=$? $((SECONDS-T0)) s"
timeout 45 python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s 25 --eval-prompts 0 > "$OUT/train_eagle3.log" 2>&1; echo "eagle3 rc=$? $((SECONDS-T0)) s"
timeout 80 python tools/bench_spec.py --trained "$DIR" --methods none,eagle3 --prompts 6 --out "$OUT/bench_spec_eagle3.json" > "$OUT/bench_spec_eagle3.log" 2>&1; echo "bench rc=$? $((SECONDS-T0)) s"
grep -E "^(none|eagle3) " "$OUT/bench_spec_eagle3.log"
