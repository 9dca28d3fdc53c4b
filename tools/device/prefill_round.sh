#!/usr/bin/env bash
# One H200 call (6-9 min): the graphed prefill. GPU tests of the prefill graphs and of every path that
# shares their kernel or loop (verify step, speculation, FP8 KV; EXTRA_TESTS adds files), the
# trained family in the background, bench_prefill_attention (the prefill graphs' attention vs
# FlashInfer), bench_spec part 2 (none / ngram / draft / eagle3: x runner), engine_gaps on the
# trained target (GAPS=0 skips it) and bench_prefix at the Llama-3.2-1B shape with the prefill
# graphs and the eager prefill side by side (TTFT cold / repeated, the 4k arrival stall with the
# chunk budget CHUNK, default 512). Every part is bounded by DEADLINE (s, default 560).
#   DEADLINE=530 bash .device/bootstrap.sh bash tools/device/prefill_round.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/prefill_round; DIR=/tmp/fam; rm -rf "$L" "$DIR"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$OUT/summary.txt"
cap() { local l=$((${DEADLINE:-560} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
pack() { tar czf "$OUT/prefill_round.tgz" -C /tmp prefill_round; }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
( timeout 100 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
TRAIN=$!
timeout $(cap ${TEST_S:-170}) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider tests/model/test_prefill_graphs_gpu.py \
  "tests/engine/test_engine_core_gpu.py::test_prefill_admission_makes_few_host_syncs" ${EXTRA_TESTS:-} \
  tests/engine/test_speculative_gpu.py tests/engine/test_speculative_eagle3_gpu.py tests/speculative/test_spec_gpu.py \
  tests/attention/test_fp8_kv_gpu.py > "$L/tests.log" 2>&1
say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)|sync sites|relative max|identical" "$L/tests.log" | cut -c1-400 | tee -a "$S"; pack
timeout $(cap 40) python tools/bench_prefill_attention.py --out "$L/bench_prefill_attention_h200.json" \
  > "$L/bench_prefill_attention.log" 2>&1; say "bench_prefill_attention rc=$?"; cat "$L/bench_prefill_attention.log"
wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"
timeout $(cap 80) python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s ${E3_S:-35} \
  --eval-prompts 0 > "$L/train_eagle3.log" 2>&1; say "train_eagle3 rc=$?"
timeout $(cap 120) python tools/bench_spec.py --trained "$DIR" --methods none,ngram,draft,eagle3 --prompts 6 \
  --out "$L/bench_spec_trained.json" --png "$L/bench_spec_trained.png" > "$L/bench_spec.log" 2>&1
say "bench_spec rc=$?"; pack
[ "${GAPS:-1}" = 1 ] && timeout $(cap 80) python tools/device/engine_gaps.py --model "$DIR/target" --configs "none:1,ngram:1" --tokens 128 \
  --out "$L/engine_gaps.json" > "$L/engine_gaps.log" 2>&1; say "engine_gaps rc=$?"
rm -f "$L"/trace_*.json; pack
timeout $(cap 200) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --prefix-len 4096 --suffix-len 32 \
  --streams 8 --long-len 4096 --decode-tokens 512 --turns 4 --answer-tokens 64 --repeats 3 --chunk ${CHUNK:-512} \
  --prefill-modes graphed,eager --out-dir "$L" --name bench_prefix_graphed_h200 > "$L/bench_prefix.log" 2>&1
say "bench_prefix rc=$?"; pack
grep -E "^(none|ngram|draft|eagle3) " "$L/bench_spec.log" | tail -16
cat "$L/bench_prefix_graphed_h200.md" 2>/dev/null
python - "$L/engine_gaps.json" <<'PY' 2>/dev/null
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["spec"], r["bs"], "engine", round(r["engine_us_per_token"]), "step", round(r.get("step_us", 0)),
          {k: v for k, v in r["phases"].items() if "prefill" in k or "_step" in k or "finish" in k})
PY
cat "$S"
