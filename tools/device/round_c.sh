#!/usr/bin/env bash
# One H200 call (under ~9 min): the reliability GPU tests, tools/bench_prefix.py (1B shape:
# shared prefix, arrival under the chunk budget, multi-turn), the sampling profile, and
# tools/bench_spec.py --trained with the policy's realized costs. Logs in $OUT/round_c.tgz.
#   bash .device/bootstrap.sh bash tools/device/round_c.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/round_c; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; END=${DEADLINE_S:-530}; S="$OUT/summary.txt"
pack() { tar czf "$OUT/round_c.tgz" -C /tmp round_c; }
DIR=/tmp/trained; rm -rf "$DIR"
( timeout 200 python tools/train_tiny.py --out "$DIR" --size full --device cuda --models draft,target \
    > "$L/train.log" 2>&1; echo "train rc=$? at $((SECONDS - T0)) s" >> "$L/train.log" ) &
TRAIN=$!
TO=""; python -c "import pytest_timeout" 2>/dev/null && TO=1
lim() { local left=$(( END - (SECONDS - T0) )); [ "$1" -gt "$left" ] && echo "$left" || echo "$1"; }
t=$(lim 170); timeout "$t" python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider ${TO:+--timeout "$t"} \
  tests/engine/test_loader_poison.py "tests/engine/test_engine_gpu.py::test_no_host_sync_inside_a_sampled_block" \
  tests/engine/test_speculative_gpu.py > "$L/rel.log" 2>&1
echo "rel rc=$? at $((SECONDS - T0)) s: $(tail -1 "$L/rel.log")" | tee -a "$S"; grep -E "^(FAILED|ERROR)" "$L/rel.log" | tee -a "$S"; pack
t=$(lim 170); timeout "$t" python tools/bench_prefix.py --make llama-3.2-1b --device cuda --prefix-len 4096 --suffix-len 32 \
  --streams 8 --long-len 4096 --decode-tokens 384 --turns 4 --answer-tokens 48 --repeats 3 \
  --out-dir "$L" --name bench_prefix_h200 > "$L/bench_prefix.log" 2>&1
echo "prefix rc=$? at $((SECONDS - T0)) s" | tee -a "$S"; pack
t=$(lim 70); timeout "$t" python tools/device/profile_sampling.py --batches 1,16 --out "$L/profile_sampling.json" \
  > "$L/profile_sampling.log" 2>&1
echo "profile rc=$? at $((SECONDS - T0)) s" | tee -a "$S"; pack
wait $TRAIN; tail -1 "$L/train.log" | tee -a "$S"
t=$(lim 200)
if [ "$t" -gt 40 ] && [ -d "$DIR/draft" ]; then
  timeout "$t" python tools/bench_spec.py --trained "$DIR" --prompts 8 --out "$L/bench_spec_trained.json" \
    --png "$L/bench_spec_trained.png" 2>&1 | grep -v "Loading weights" > "$L/bench_spec_trained.log"
  echo "bench_spec rc=${PIPESTATUS[0]} at $((SECONDS - T0)) s" | tee -a "$S"
fi
pack
tail -32 "$L/bench_spec_trained.log"; grep -A30 "^#\|TTFT\|p99" "$L/bench_prefix.log" | tail -40
cat "$S"
