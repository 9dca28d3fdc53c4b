set -uo pipefail
OUT="${OUT:-/tmp/out}"; DIR=/tmp/fam; mkdir -p "$OUT"; export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS
timeout 60 python tools/train_tiny.py --out "$DIR" --models target --time-budget-s target=40 > "$OUT/train_tiny.log" 2>&1; echo "train rc=$? $((SECONDS-T0)) s"
timeout 45 python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s 25 --eval-prompts 0 > "$OUT/train_eagle3.log" 2>&1; echo "eagle3 rc=$? $((SECONDS-T0)) s"
timeout 80 python tools/bench_spec.py --trained "$DIR" --methods none,eagle3 --prompts 6 --out "$OUT/bench_spec_eagle3.json" > "$OUT/bench_spec_eagle3.log" 2>&1; echo "bench rc=$? $((SECONDS-T0)) s"
grep -E "^(none|eagle3) " "$OUT/bench_spec_eagle3.log"
