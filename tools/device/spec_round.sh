#!/usr/bin/env bash
# One H200 call (~8 min): speculation GPU tests (EAGLE-3, the spec no-host-sync test, the prefill's
# sync count, pinned copies), the trained family + an EAGLE-3 head, bench_spec part 2 (none / ngram / draft / eagle3 through LLM: tokens/s,
# acceptance, x runner, x graphs) and engine_gaps.py on the trained target (device gaps per block).
#   bash .device/bootstrap.sh bash tools/device/spec_round.sh     (EXTRA_K=8: n-gram at k = 8 as well)
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/spec_round; DIR=/tmp/fam; rm -rf "$L" "$DIR"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$OUT/summary.txt"
pack() { tar czf "$OUT/spec_round.tgz" -C /tmp spec_round; }
cap() { local l=$((${DEADLINE:-560} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }   # a part's timeout within the call's deadline
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
( timeout 100 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
if [ ! -f .device/jit-cache.tgz ]; then   # a fresh pack: build FlashInfer's modules once, ahead of the tests
  timeout 300 python tools/device/jit_warm.py --head-dims 64,128 --kv bf16 > "$L/jit_warm.log" 2>&1
  say "jit_warm: $(tr '\n' ';' < "$L/jit_warm.log" | tail -c 300)"
fi
timeout $(cap 150) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider tests/engine/test_speculative_eagle3_gpu.py \
  "tests/engine/test_speculative_gpu.py::test_spec_block_launch_and_admission_make_no_host_sync" \
  tests/speculative/test_spec_gpu.py::test_graph_replay_matches_eager_and_never_syncs \
  tests/attention/test_gpu.py::test_model_capture_twice_returns_the_same_stats tests/kernels/test_transfer.py \
  "tests/engine/test_engine_core_gpu.py::test_prefill_admission_makes_few_host_syncs" > "$L/tests.log" 2>&1
say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; grep -E "^(FAILED|ERROR)|sync sites" "$L/tests.log" | cut -c1-400 | tee -a "$S"
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"
timeout $(cap 80) python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s 35 \
  --eval-prompts 0 > "$L/train_eagle3.log" 2>&1; say "train_eagle3 rc=$?"; pack
timeout $(cap 200) python tools/bench_spec.py --trained "$DIR" --methods none,ngram,draft,eagle3 --prompts 6 \
  --out "$L/bench_spec_trained.json" --png "$L/bench_spec_trained.png" > "$L/bench_spec.log" 2>&1
say "bench_spec rc=$?"; pack
if [ -n "${EXTRA_K:-}" ]; then   # n-gram at another k too (round 16: EXTRA_K=8)
  timeout $(cap 120) python tools/bench_spec.py --trained "$DIR" --methods none,ngram --num-tokens "$EXTRA_K" --prompts 6 \
    --out "$L/bench_spec_trained_k$EXTRA_K.json" > "$L/bench_spec_k$EXTRA_K.log" 2>&1
  say "bench_spec k=$EXTRA_K rc=$?"; grep -E "tok/s/stream|^(none|ngram) " "$L/bench_spec_k$EXTRA_K.log" | tail -8 | tee -a "$S"; pack
fi
timeout $(cap 190) python tools/device/engine_gaps.py --model "$DIR/target" --configs "none:1,ngram:1,draft=$DIR/draft:1,eagle3=$DIR/eagle3:1" --tokens 128 \
  --out "$L/engine_gaps.json" > "$L/engine_gaps.log" 2>&1; say "engine_gaps rc=$?"
rm -f "$L"/trace_*.json; pack
grep -E "tok/s/stream|^(none|ngram|draft|eagle3) " "$L/bench_spec.log" | tail -24
python - "$L/engine_gaps.json" <<'PY' 2>/dev/null
import json, sys
for r in json.load(open(sys.argv[1])):
    t = r["timeline"]
    print(r["spec"], r["bs"], "engine", round(r["engine_us_per_token"]), "step", round(r.get("step_us", 0)),
          r["phases"], {k: v for k, v in t.items() if k.startswith("mid") or k == "busy"})
PY
cat "$S"
